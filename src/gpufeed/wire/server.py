"""The fast-path server: serves the wire protocol over TCP and over a Unix socket
with shared memory (spec: ``docs/wire-protocol.md``).

Our own code because this is the product's hot path. This module accepts
connections and wires the parts together:

* :mod:`._conn`: one reader thread per connection; small requests are answered
  inline, large ones on a shared worker pool (several in flight per connection);
* :mod:`._frames`: frame I/O, replies by ``sendfile`` or with a descriptor;
* :mod:`._ops`: one thin handler per op over the engine's public API;
* :mod:`._reads`: reads into client memory, split across threads when large;
* :mod:`._cachedgets`: small GETs from each connection's cache of opened
  versions, valid until the node's catalog commits anything;
* :mod:`._lending`, :mod:`._regions`: client memory on the shm transport, and
  the pool that reuses what the server lent.

Connections are capped (``NodeConfig.wire``: per node and per client, a client
being a remote address on TCP and a process on shm); one past a cap gets a
``SlowDown`` error frame (request id 0) and is closed at once. Each connection
authenticates (:mod:`._auth`: AUTH after HELLO) before any other op is served.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._metrics import NodeMetrics
from .._version import __version__
from ..config import NodeConfig
from ..engine import Engine, KeyRing
from ..errors import error_from_code
from ._auth import Authenticator
from ._cachedgets import CachedGets, CommitCount
from ._conn import Connection
from ._frames import FrameIO, set_send_timeout
from ._leases import LeaseBoard
from ._lending import Lending
from ._ops import Ops
from ._reads import SplitReader
from ._regions import peer_process

__all__ = ["WireServer"]

log = logging.getLogger("gpufeed.wire")

#: Seconds between two warnings about refused connections (the rest are counted).
REFUSAL_LOG_INTERVAL_S = 10.0


class WireServer:
    """Serves the fast path over TCP and a Unix socket, beside the S3 endpoint.

    Args:
        engine: the node's engine.
        config: uses ``host``, ``port`` (0 = free port, negative disables TCP),
            ``resolved_socket_path`` (``None`` disables shm), ``io_threads``,
            ``region_pool_bytes``, ``send_timeout_s`` and the limits in ``wire``.
        metrics: where every connection counts its requests; ``None`` counts nothing.
    """

    def __init__(self, engine: Engine, config: NodeConfig, metrics: NodeMetrics | None = None) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(max(2, config.io_threads), thread_name_prefix="gpufeed-io")
        self.reader = SplitReader(max(2, os.cpu_count() or 2))
        self._stopping = threading.Event()
        self.lending = Lending(config.region_pool_bytes, self._stopping,
                               client_bytes=config.wire.client_memory_bytes,
                               node_bytes=config.wire.node_memory_bytes)
        self.ops = Ops(engine, self.reader, self.lending, f"gpufeed/{__version__}")
        if config.wire.lease_s > 0 and config.resolved_socket_path:
            board = LeaseBoard(config.wire.lease_s)
            if engine.watch_commits(board.bump):
                self.ops.leases = board
            else:
                board.close()
        self.commits: CommitCount | None = None  # counts commits for the connections' read caches
        if config.wire.read_cache_entries > 0:
            commits = CommitCount()
            if engine.watch_commits(commits.bump):
                self.commits = commits
            else:
                commits.close()
        self.small_gets = CachedGets(self.ops, engine)
        self.auth = Authenticator(KeyRing(config.access_key, config.secret_key, engine))
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._conns: dict[Connection, tuple] = {}  # -> its client (remote address or process)
        self._per_client: dict[tuple, int] = {}  # client key -> open connections
        self._lock = threading.Lock()
        self._refused = 0  # connections refused since the last warning
        self._refused_total = 0  # connections refused since start
        self._refusal_logged = 0.0
        self.socket_path: str | None = None

    # --- lifecycle ---------------------------------------------------------------
    def start(self) -> int:
        """Bind and start accepting. Returns the TCP port (0 when TCP is disabled).

        Raises:
            OSError: the port or socket path is in use by a live server.
        """
        cfg = self.config
        tcp_port = 0
        if cfg.port >= 0:
            lsock = socket.create_server((cfg.host, cfg.port), reuse_port=False, backlog=128)
            tcp_port = lsock.getsockname()[1]
            self._spawn_acceptor(lsock, "tcp")
        path = cfg.resolved_socket_path
        if path:
            self._remove_stale_socket(path)
            usock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            usock.bind(path)
            os.chmod(path, 0o600)  # owner only, as well as AUTH: a second fence on the same host
            usock.listen(128)
            self.socket_path = path
            self._spawn_acceptor(usock, "shm")
        return tcp_port

    @staticmethod
    def _remove_stale_socket(path: str) -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise FileExistsError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: left over from a crash
            return
        finally:
            probe.close()
        raise OSError(errno.EADDRINUSE, f"another server listens on {path}")

    def _spawn_acceptor(self, lsock: socket.socket, transport: str) -> None:
        self._listeners.append(lsock)
        t = threading.Thread(target=self._accept_loop, args=(lsock, transport),
                             name=f"gpufeed-accept-{transport}", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self, lsock: socket.socket, transport: str) -> None:
        while not self._stopping.is_set():
            try:
                sock, addr = lsock.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)  # e.g. EMFILE: do not spin while descriptors are short
                continue
            # a reply that makes no progress for send_timeout_s fails, so one stuck
            # client cannot hold the worker threads
            set_send_timeout(sock, self.config.send_timeout_s)
            if transport == "tcp":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                key, peer = ("tcp", addr[0]), None
            else:
                peer = peer_process(sock)
                key = ("shm", peer[0] or id(sock))  # pid 0: unknown, a client of its own
            refusal = self._admit(key)
            if refusal:
                if peer is not None and peer[1] is not None:
                    os.close(peer[1])
                self._refuse(sock, transport, refusal)
                continue
            try:
                conn = Connection(sock, transport, handlers=self.ops.handlers,
                                  put_stream=self.ops.put_stream, pool=self.pool,
                                  lending=self.lending, on_close=self._forget,
                                  limits=self.config.wire, peer=peer, authenticator=self.auth,
                                  metrics=self.metrics, small_get=self.small_gets.get,
                                  read_cache=self.commits.cache(self.config.wire.read_cache_entries)
                                  if self.commits is not None else None)
            except BaseException:
                self._release(key)
                sock.close()
                raise
            with self._lock:
                self._conns[conn] = key
            threading.Thread(target=conn.serve, name=f"gpufeed-conn-{transport}",
                             daemon=True).start()

    def _admit(self, key: tuple) -> str | None:
        """Count a new connection of client ``key``; the reason it is refused, if it is."""
        lim = self.config.wire
        with self._lock:
            held = self._per_client.get(key, 0)
            if len(self._conns) >= lim.max_connections:
                return (f"the node serves {len(self._conns)} fast-path connections, its limit "
                        f"(GPUFEED_WIRE_MAX_CONNECTIONS)")
            if held >= lim.max_connections_per_client:
                return (f"this client has {held} fast-path connections open, the limit per "
                        f"client (GPUFEED_WIRE_MAX_CONNECTIONS_PER_CLIENT)")
            self._per_client[key] = held + 1
        return None

    def _refuse(self, sock: socket.socket, transport: str, reason: str) -> None:
        """Answer a connection past a cap with ``SlowDown`` (request id 0) and close it."""
        frames = FrameIO(sock, transport)
        frames.reply_error(0, error_from_code("SlowDown", f"{reason}; try again later"))
        frames.shutdown_politely()
        sock.close()
        now = time.monotonic()
        with self._lock:
            self._refused += 1
            self._refused_total += 1
            if now - self._refusal_logged < REFUSAL_LOG_INTERVAL_S:
                return
            refused, self._refused, self._refusal_logged = self._refused, 0, now
        log.warning("refused %d fast-path connection(s): %s", refused, reason)

    def _forget(self, conn: Connection) -> None:
        with self._lock:
            key = self._conns.pop(conn, None)
        if key is not None:
            self._release(key)

    def _release(self, key: tuple) -> None:
        """A connection of client ``key`` is gone."""
        with self._lock:
            left = self._per_client.get(key, 1) - 1
            if left > 0:
                self._per_client[key] = left
            else:
                self._per_client.pop(key, None)

    def connection_counts(self) -> dict[str, int]:
        """Open fast-path connections: ``{"total": n, "clients": distinct clients}``."""
        with self._lock:
            return {"total": len(self._conns), "clients": len(self._per_client)}

    def stats(self) -> dict[str, int]:
        """What the fast path holds now, for metrics: open connections per transport
        (``tcp``, ``shm``), refused connections since start (``refused``), and
        the shared memory of :meth:`Lending.usage` and of its region pool
        (``pool_*``: :meth:`RegionPool.stats`)."""
        with self._lock:
            keys = list(self._conns.values())
        out = {"tcp": sum(k[0] == "tcp" for k in keys), "shm": sum(k[0] == "shm" for k in keys),
               "refused": self._refused_total}
        out.update(self.lending.usage())
        out.update({f"pool_{k}": v for k, v in self.lending.pool.stats().items()})
        return out

    def stop(self) -> None:
        """Stop accepting, close every connection, release files. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        for lsock in self._listeners:
            try:
                lsock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            lsock.close()
        for t in self._threads:
            t.join(timeout=5)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.abort()
        self.pool.shutdown(wait=True)
        self.reader.shutdown()
        for conn in conns:
            conn.close()
        self.lending.close()
        if self.ops.leases is not None:
            self.ops.leases.close()
        if self.commits is not None:
            self.commits.close()
        if self.socket_path:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
