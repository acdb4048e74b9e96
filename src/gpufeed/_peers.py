"""Node-to-node reads in a cluster: a node fetches the chunks another node
holds over the fast path's TCP transport, authenticated with node keys.

Node keys: the cluster's secret (32 random bytes, made once and kept in the
shared catalog, :meth:`~gpufeed.engine._membership.Membership.cluster_key`)
gives each node id a key: access key id ``gfnode:<node id>``, secret
HMAC-SHA256(cluster secret, ``"gpufeed-node-key/1 " + node id``) in hex. A node
that serves the fast path accepts a node key only for a registered member of
its cluster that is up (:meth:`PeerLink.secret_for`, given to the wire's
:class:`~gpufeed.wire._auth.Authenticator`); such a connection may send CHUNK
and nothing else, and no other key may send CHUNK. The handshake is the
fast path's AUTH (both sides prove the secret over fresh nonces), so the
asker also knows it reached a member of its cluster.

Fetches (:meth:`PeerLink.fetch`, installed with
:meth:`~gpufeed.engine.Engine.use_peers`): the holder's address and liveness
come from the membership; a holder that is not live fails at once
(:class:`~gpufeed.errors.HolderUnavailable`, naming its state and last
heartbeat); otherwise one connection per fetch, every wait bounded by
``timeout_s`` (connecting, each read of the answer), at most ``fetches``
fetches at once, and the bytes stream into the reader's file in 1 MiB pieces
(so a fetch holds at most 1 MiB of memory). The engine checks the bytes
(:mod:`gpufeed.engine._remote`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import threading
import time

from .engine._membership import Membership, NodeInfo
from .engine.types import ChunkRecord
from .errors import DamagedObject, GpufeedError, HolderUnavailable, ProtocolError
from .wire import protocol as p
from .wire._auth import PEER_KEY_PREFIX

__all__ = ["PeerLink", "node_secret", "PIECE_BYTES", "MEMBERS_MAX_AGE_S", "call", "request", "read_reply", "recv_exact",
           "recv_to_fd"]

#: Seconds a member list read for LOCATE is answered again before it is read anew.
MEMBERS_MAX_AGE_S = 0.5
#: Bytes read from a holder's socket at a time (and the most a fetch holds in memory).
PIECE_BYTES = 1 << 20  # 1 MiB
_KEY_LABEL = b"gpufeed-node-key/1 "


def node_secret(cluster_key: bytes, node_id: str) -> str:
    """The secret of node ``node_id``'s node key (hex of HMAC-SHA256)."""
    return hmac.new(cluster_key, _KEY_LABEL + node_id.encode(), hashlib.sha256).hexdigest()


class PeerLink:
    """This node's side of node-to-node reads.

    Args:
        membership: the catalog's membership.
        cluster: the cluster's name.
        node_id: this node's id.
        expiry_s: seconds after its last heartbeat at which a holder counts as not live.
        timeout_s: seconds any one wait of a fetch may take (> 0).
        fetches: most fetches at once (>= 1).

    Raises:
        ValueError: ``timeout_s`` <= 0 or ``fetches`` < 1.
    """

    def __init__(self, membership: Membership, *, cluster: str, node_id: str, expiry_s: float,
                 timeout_s: float, fetches: int) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the cluster fetch timeout must be > 0 s, not {timeout_s}")
        if fetches < 1:
            raise ValueError(f"the cluster needs at least 1 fetch at once, not {fetches}")
        self._m, self.cluster, self.node_id = membership, cluster, node_id
        self.expiry_s, self.timeout_s = expiry_s, timeout_s
        self._slots = threading.BoundedSemaphore(fetches)
        self._key: bytes | None = None
        self._members: tuple[float, list[p.Member]] = (-float("inf"), [])
        self._members_lock = threading.Lock()

    def _cluster_key(self) -> bytes:
        if self._key is None:
            self._key = self._m.cluster_key(self.cluster)
        return self._key

    def secret_for(self, access_key: str) -> str | None:
        """The secret of a node key of an up member of this cluster, else ``None``."""
        node = access_key[len(PEER_KEY_PREFIX):]
        if not access_key.startswith(PEER_KEY_PREFIX) or not node:
            return None
        if not any(n.node_id == node and n.state == "up" for n in self._m.nodes(self.cluster)):
            return None
        return node_secret(self._cluster_key(), node)

    def members(self) -> list[p.Member]:
        """The cluster's members as LOCATE answers them (read from the catalog at
        most every :data:`MEMBERS_MAX_AGE_S` seconds; a failed read answers the
        last list, or raises when there is none).

        Raises:
            ServiceUnavailable: the membership cannot be read and none was read before.
        """
        with self._members_lock:
            read_at, members = self._members
            now = time.monotonic()
            if now - read_at < MEMBERS_MAX_AGE_S:
                return members
            try:
                nodes = self._m.nodes(self.cluster)
            except GpufeedError:
                if read_at == -float("inf"):
                    raise
                return members
            members = [p.Member(n.node_id, n.host, n.wire_port, n.live(self.expiry_s)) for n in nodes]
            self._members = (now, members)
            return members

    def _holder(self, node_id: str) -> NodeInfo:
        """The live member ``node_id``.

        Raises:
            HolderUnavailable: it is not a member, or not live.
        """
        try:
            info = next((n for n in self._m.nodes(self.cluster) if n.node_id == node_id), None)
        except GpufeedError as exc:
            raise HolderUnavailable(f"the cluster's membership cannot be read: {exc}") from exc
        if info is None:
            raise HolderUnavailable(f"node {node_id} is not a member of cluster {self.cluster!r}")
        where = f"node {node_id} at {info.host}:{info.wire_port}"
        if info.state == "left":
            raise HolderUnavailable(f"{where} has left the cluster (stopped); the chunk is readable again "
                                    "once that node is back")
        if not info.live(self.expiry_s):
            raise HolderUnavailable(f"{where} has expired (last heartbeat {info.age_s:.1f} s ago, expiry "
                                    f"{self.expiry_s:.1f} s); the chunk is readable again once that node is back")
        if not info.wire_port:
            raise HolderUnavailable(f"{where} serves no fast-path TCP port, which node-to-node reads use")
        return info

    def fetch(self, c: ChunkRecord, nodes: list[str], fd: int, span: tuple[int, int] | None = None) -> None:
        """Write chunk ``c``'s stored bytes (``span``: the ``(offset, length)``
        bytes of them), as a node of ``nodes`` sends them (each asked in turn
        until one answers), at their place (``c.file_offset`` + offset) of
        ``fd`` (unchecked: the engine checks them).

        Raises:
            HolderUnavailable: no node of ``nodes`` is live, or each wait passed
                ``timeout_s``, or each connection failed (the message names each).
            DamagedObject: the nodes that answered report the chunk damaged.
        """
        failures: list[GpufeedError] = []
        for node in nodes:
            try:
                self._fetch_from(node, c, fd, span)
                return
            except (HolderUnavailable, DamagedObject) as exc:
                failures.append(exc)
        if failures and all(isinstance(f, DamagedObject) for f in failures):
            raise DamagedObject("; ".join(f.message for f in failures))
        raise HolderUnavailable("; ".join(f.message for f in failures) or "no node holds it")

    def _fetch_from(self, node: str, c: ChunkRecord, fd: int, span: tuple[int, int] | None) -> None:
        info = self._holder(node)
        if not self._slots.acquire(timeout=self.timeout_s):
            raise HolderUnavailable(f"every one of this node's fetches from other nodes stayed busy for "
                                    f"{self.timeout_s:.1f} s (GPUFEED_CLUSTER_FETCHES)")
        try:
            with socket.create_connection((info.host, info.wire_port), timeout=self.timeout_s) as sock:
                self._fetch_over(sock, c, fd, span)
        except TimeoutError as exc:
            raise HolderUnavailable(f"node {node} at {info.host}:{info.wire_port} did not answer within "
                                    f"{self.timeout_s:.1f} s (GPUFEED_CLUSTER_FETCH_TIMEOUT_S)") from exc
        except (OSError, ProtocolError) as exc:
            raise HolderUnavailable(f"node {node} at {info.host}:{info.wire_port} could not be read from: "
                                    f"{exc}") from exc
        finally:
            self._slots.release()

    def authenticate(self, sock: socket.socket) -> None:
        """HELLO and AUTH with this node's node key on a fresh connection to a member.

        Raises:
            HolderUnavailable: the node refused.
            ProtocolError: its proof is not the cluster's (it is no member).
        """
        hello = call(sock, p.Op.HELLO, p.Hello("gpufeed-peer"), p.HelloReply)
        access_key = PEER_KEY_PREFIX + self.node_id
        key = p.auth_key(node_secret(self._cluster_key(), self.node_id))
        mine = secrets.token_bytes(32)
        proof = p.auth_proof(key, "client", "tcp", access_key, hello.nonce, mine)
        reply = call(sock, p.Op.AUTH, p.Auth(access_key, mine, proof), p.AuthReply)
        if not hmac.compare_digest(reply.proof, p.auth_proof(key, "server", "tcp", access_key, hello.nonce, mine)):
            raise ProtocolError("the node's AUTH proof is not the cluster's: it is not a member of this cluster")

    def _fetch_over(self, sock: socket.socket, c: ChunkRecord, fd: int, span: tuple[int, int] | None) -> None:
        self.authenticate(sock)
        start, want = span if span is not None else (0, c.stored)
        req = p.ChunkReq(c.chunk_id) if span is None else p.ChunkReq(c.chunk_id, start, want)
        got, payload = request(sock, p.Op.CHUNK, req)
        head = p.decode(p.ChunkReply, got)
        if head.stored != want or payload != want:
            raise ProtocolError(f"the node sent {payload} bytes for chunk {c.chunk_id}, where {want} were asked "
                                f"for")
        recv_to_fd(sock, fd, c.file_offset + start, want)


def recv_to_fd(sock: socket.socket, fd: int, offset: int, n: int, hasher=None, *,
               stop: threading.Event | None = None) -> None:
    """Write the next ``n`` bytes from ``sock`` at ``offset`` of ``fd``, in pieces of
    at most :data:`PIECE_BYTES` (the most held in memory), each also through
    ``hasher.update`` when given.

    Args:
        sock: a connected socket (its timeout bounds each read).
        fd: a writable file descriptor.
        offset: where the bytes go in ``fd``.
        n: bytes to read.
        hasher: a ``hashlib`` object (or anything with ``update``), or ``None``.
        stop: checked before each piece: once set, the rest is not read.

    Raises:
        ProtocolError: the connection closed first, or ``stop`` was set.
        OSError: as ``socket.recv_into`` (timeouts included) or ``os.pwrite``.
    """
    buf = memoryview(bytearray(min(PIECE_BYTES, n) or 1))
    done = 0
    while done < n:
        if stop is not None and stop.is_set():
            raise ProtocolError(f"stopped after {done} of {n} bytes")
        k = sock.recv_into(buf, min(len(buf), n - done))
        if k == 0:
            raise ProtocolError(f"the connection closed after {done} of {n} bytes")
        piece = buf[:k]
        if hasher is not None:
            hasher.update(piece)
        while piece:
            w = os.pwrite(fd, piece, offset + done)
            piece, done = piece[w:], done + w


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``.

    Raises:
        ProtocolError: the connection closed first.
        OSError: as ``socket.recv_into`` (timeouts included).
    """
    out = bytearray(n)
    view = memoryview(out)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ProtocolError(f"the connection closed after {got} of {n} bytes")
        got += k
    return bytes(out)


def request(sock: socket.socket, op: int, req) -> tuple[bytes, int]:
    """Send one request; returns the reply's metadata and its payload length
    (the payload is left on the socket).

    Raises:
        HolderUnavailable, DamagedObject: the node answered with an error
            (damage, or any other error, which names the reason).
        ProtocolError: the reply is not a reply to it.
    """
    meta = p.encode(req)
    started = time.monotonic()
    sock.sendall(p.pack_header(op, len(meta), 1) + meta)
    return read_reply(sock, op, started)


def read_reply(sock: socket.socket, op: int, started: float) -> tuple[bytes, int]:
    """The reply to request ``op`` sent at ``started`` (monotonic s): its metadata
    and payload length (the payload is left on the socket).

    Raises:
        HolderUnavailable, DamagedObject: the node answered with an error.
        ProtocolError: the reply is not a reply to it.
    """
    rop, meta_len, _, payload = p.unpack_header(recv_exact(sock, p.HEADER_SIZE), max_meta=64 << 10)
    got = recv_exact(sock, meta_len)
    if rop == p.ERROR_OP:
        err = p.error_from_reply(p.decode(p.ErrorReply, got))
        if isinstance(err, DamagedObject):
            raise DamagedObject(f"its holder reports it damaged: {err.message}")
        raise HolderUnavailable(f"the node refused ({err.code}, after {time.monotonic() - started:.2f} s): "
                                f"{err.message}")
    if rop != op | p.REPLY:
        raise ProtocolError(f"a reply of op {rop} to op {op}")
    return got, payload


def call(sock: socket.socket, op: int, req, reply_type: type):
    got, payload = request(sock, op, req)
    if payload:
        raise ProtocolError(f"a payload of {payload} bytes on a reply to op {op}")
    return p.decode(reply_type, got)
