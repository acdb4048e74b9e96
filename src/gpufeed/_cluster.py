"""A node's membership of its cluster: register at start, heartbeat, leave at stop.

:class:`ClusterMember` is what :class:`gpufeed.node.Node` runs when the node
has a cluster name (``--cluster``). :meth:`~ClusterMember.join` registers
the node in the catalog's membership (:mod:`gpufeed.engine._membership`)
before the node reports itself started, so a node id a live member already
holds stops the start (``NodeIdInUse``); then a daemon thread heartbeats
every ``heartbeat_s`` seconds, sending the node's used, capacity and free
bytes (:mod:`gpufeed.engine._room`; the data folder walked every
``bytes_interval_s``). :meth:`~ClusterMember.stop`
marks the node ``"left"``.

The catalog's database may go away mid-run: a failed heartbeat is logged
(the first of an outage as an error, the rest at debug level), the next one
runs on time, and the return of the database is logged with the outage's
length; the node keeps serving whatever its catalog allows. A heartbeat that
finds the row no longer this process's (another process took the id over
after this one expired) registers again, which succeeds once that other
process has expired or left; until then each try is refused and logged.

What ``gpufeed admin cluster status`` shows is
:func:`gpufeed.engine._membership.cluster_report`.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .engine._membership import Membership, NodeClaim, NodeInfo
from .engine._room import NodeRoom, Usage, folder_bytes
from .errors import NodeIdInUse

__all__ = ["ClusterMember", "folder_bytes", "advertised_host"]

log = logging.getLogger("gpufeed.cluster")

_WILDCARDS = ("", "0.0.0.0", "::", "[::]")

def advertised_host(bind_host: str, configured: str = "") -> str:
    """The address a member registers: ``configured`` when given, else the bind
    address, or the machine's host name when that is a wildcard."""
    if configured:
        return configured
    return socket.gethostname() if bind_host in _WILDCARDS else bind_host


class ClusterMember:
    """Registers a node, heartbeats on a daemon thread, leaves on :meth:`stop`.

    Args:
        membership: the catalog's membership.
        cluster: the cluster's name.
        node_id: the data folder's id.
        host: the address to register (:func:`advertised_host`).
        s3_port, wire_port: the node's ports (``wire_port`` 0: no fast-path TCP).
        data_dir: the node's data folder (its files are counted; its path is registered).
        heartbeat_s: seconds between heartbeats (> 0).
        expiry_s: seconds without a heartbeat after which a member is expired (> ``heartbeat_s``).
        bytes_interval_s: seconds between counts of the data folder's bytes.
        count_bytes: how the used bytes are counted when ``room`` is not given
            (default :func:`folder_bytes` of ``data_dir``; capacity and free then unreported).
        room: the node's figures (:class:`~gpufeed.engine._room.NodeRoom`), sent with each heartbeat.

    Raises:
        ValueError: ``heartbeat_s`` <= 0 or ``expiry_s`` <= ``heartbeat_s``.
    """

    def __init__(self, membership: Membership, *, cluster: str, node_id: str, host: str, s3_port: int,
                 wire_port: int, data_dir: str | Path, heartbeat_s: float, expiry_s: float,
                 bytes_interval_s: float = 60.0, count_bytes: Callable[[], int] | None = None,
                 room: NodeRoom | None = None) -> None:
        if not heartbeat_s > 0:
            raise ValueError(f"the cluster heartbeat interval must be > 0 s, not {heartbeat_s}")
        if not expiry_s > heartbeat_s:
            raise ValueError(f"the cluster expiry ({expiry_s} s) must be longer than the heartbeat interval "
                             f"({heartbeat_s} s), or a live node would count as expired between heartbeats")
        self._m = membership
        self.claim = NodeClaim(cluster, node_id, host, s3_port, wire_port, secrets.token_hex(8),
                               socket.gethostname(), str(Path(data_dir).resolve()))
        self.heartbeat_s = heartbeat_s
        self.expiry_s = expiry_s
        self._bytes_interval_s = bytes_interval_s
        self._count = count_bytes or (lambda: folder_bytes(data_dir))
        self.room = room
        self._bytes = 0
        self._counted_at = -float("inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufeed-cluster", daemon=True)
        self._down_since: float | None = None
        self._displaced = False

    def _stored(self) -> Usage:
        """The figures a heartbeat sends (capacity 0 and free -1: not reported)."""
        if self.room is not None:
            return self.room.usage()
        now = time.monotonic()
        if now - self._counted_at >= self._bytes_interval_s:
            self._bytes, self._counted_at = self._count(), now
        return Usage(self._bytes, 0, -1)

    def join(self) -> NodeInfo:
        """Register (once, now) and start heartbeating.

        Raises:
            NodeIdInUse: a live member holds this node's id.
            CatalogUnavailable: the catalog's database cannot be reached.
        """
        u = self._stored()
        info = self._m.register(self.claim, expiry_s=self.expiry_s, bytes_stored=u.used_bytes,
                                room=(u.capacity_bytes, u.free_bytes), moving_bytes=u.moving_bytes)
        log.info("joined cluster %r as node %s (%s:%d)", self.claim.cluster, self.claim.node_id,
                 self.claim.host, self.claim.s3_port)
        self._thread.start()
        return info

    def _beat(self) -> None:
        """One heartbeat; a row taken over is claimed again (refused while its holder is live)."""
        u = self._stored()
        if self._m.heartbeat(self.claim, u.used_bytes, room=(u.capacity_bytes, u.free_bytes),
                             moving_bytes=u.moving_bytes):
            self._displaced = False
            return
        try:
            self._m.register(self.claim, expiry_s=self.expiry_s, bytes_stored=u.used_bytes,
                             room=(u.capacity_bytes, u.free_bytes), moving_bytes=u.moving_bytes)
            log.warning("cluster %r: this node's membership row had been taken over or ended; registered again",
                        self.claim.cluster)
            self._displaced = False
        except NodeIdInUse as exc:
            if not self._displaced:
                log.error("cluster %r: %s; this node keeps trying", self.claim.cluster, exc)
            self._displaced = True

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            began = time.monotonic()
            try:
                self._beat()
            except Exception as exc:
                if self._stop.is_set():
                    return  # the catalog closed under a heartbeat that was ending anyway
                if self._down_since is None:
                    self._down_since = began
                    log.error("cluster %r: heartbeat failed, retrying every %.1f s: %s", self.claim.cluster,
                              self.heartbeat_s, exc)
                else:
                    log.debug("cluster heartbeat failed again: %s", exc)
                continue
            if self._down_since is not None:
                log.warning("cluster %r: heartbeats resumed after %.1f s of failures", self.claim.cluster,
                            time.monotonic() - self._down_since)
                self._down_since = None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop heartbeating and mark the node ``"left"`` (a failure to is logged:
        the row then expires on its own)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        try:
            self._m.leave(self.claim)
            log.info("left cluster %r", self.claim.cluster)
        except Exception as exc:
            log.warning("cluster %r: could not record the leave (the node expires after %.1f s instead): %s",
                        self.claim.cluster, self.expiry_s, exc)
