"""One fast-path connection: its read loop, and where each request runs.

One reader thread per connection parses frames (cheap); small requests are
answered inline on that thread (lowest latency), large ones go to a shared
worker pool so several requests per connection are in flight. Whatever a
handler raises becomes an error reply here, never a traceback to the client
and never a dead server.

Authentication is checked here, before a request is even decoded: until AUTH
succeeds only HELLO and AUTH are served (anything else is ``AccessDenied``
and the connection closes); afterwards each op first asks whether the key is
still valid (a dict lookup), so a revoked key's connections close at their next op.
"""

from __future__ import annotations

import errno
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from .._metrics import NodeMetrics
from ..config import WireLimits
from ..errors import (
    AccessDenied,
    GpufeedError,
    InternalError,
    InvalidAccessKeyId,
    NoSuchKey,
    ProtocolError,
    error_from_code,
)
from . import protocol as p
from ._auth import Authenticator, Principal
from ._cachedgets import ReadCache
from ._frames import RecvTimeout
from ._lending import Lending
from ._metered import MeteredReplies
from ._regions import peer_process

__all__ = ["Connection", "Handler", "StreamHandler", "EndConnection"]

log = logging.getLogger("gpufeed.wire")

#: Requests whose data is at most this many bytes are answered inline.
INLINE_BYTES = 256 << 10  # 256 KiB
#: A GETV of items of at most SMALL_ITEM_BYTES each, SMALL_GETV_BYTES in all, runs
#: inline: on one thread its small reads pay no GIL hand-over to other threads
#: (four batches on four pool threads made each 4 KiB ``preadv`` wait ~40 µs for
#: the GIL; inline, ~2 µs).
SMALL_ITEM_BYTES = 16 << 10  # 16 KiB
SMALL_GETV_BYTES = 1 << 20  # 1 MiB
#: Ops that move object data (and may touch the client's shared memory).
_DATA_OPS = (p.Op.GET, p.Op.GETV, p.Op.PUT, p.Op.CHUNK, p.Op.GETR)
#: Ops served before a connection has authenticated.
_OPEN_OPS = (p.Op.HELLO, p.Op.AUTH)


class EndConnection(Exception):
    """Answer the request with ``error``, then close the connection.

    Args:
        error: what the client is told.
    """

    def __init__(self, error: GpufeedError) -> None:
        super().__init__(error.message)
        self.error = error

#: An op handler: ``(connection, request id, decoded request)``; it sends the reply.
Handler = Callable[["Connection", int, Any], None]
#: The handler of a PUT (or CHUNK_PUT, or PART) whose bytes follow on the socket: ``(connection,
#: request id, request, payload bytes)``; it reads the payload and sends the reply.
StreamHandler = Callable[["Connection", int, "p.Put | p.ChunkPut | p.PartFile", int], None]


class Connection(MeteredReplies):
    """One client connection (TCP or Unix), served by its own reader thread.

    Args:
        sock: the accepted socket.
        transport: ``"tcp"`` or ``"shm"``.
        handlers: op -> handler of every request but a streamed PUT.
        put_stream: the handler of a PUT whose payload follows on the socket.
        pool: runs requests too large to answer inline.
        lending: the server's region lending (shm: this connection's regions).
        on_close: called once when the connection has closed.
        limits: frame size and timeouts (defaults: :class:`WireLimits`'s).
        peer: ``(pid, pidfd)`` of the shm client (:func:`peer_process`), when the
            caller has it already.
        authenticator: checks AUTH and, on each op, the connection's key.
        small_get: the handler of a GET answered on the reader thread (default:
            ``handlers``'); it may use ``read_cache``.
        read_cache: the connection's opened object versions
            (:mod:`._cachedgets`); closed with the connection.

    Attributes:
        server_nonce: the connection's fresh random nonce (HELLO replies carry it).
        principal: who the connection authenticated as (``None`` before AUTH).
        source_ip: the client's address (TCP), ``None`` on the Unix socket.
        metrics: where each request is counted (:class:`MeteredReplies`); ``None`` counts nothing.
    """

    def __init__(self, sock: socket.socket, transport: str, *, handlers: Mapping[int, Handler],
                 put_stream: StreamHandler, pool: Executor, lending: Lending,
                 on_close: Callable[["Connection"], None], limits: WireLimits | None = None,
                 peer: tuple[int, int | None] | None = None,
                 authenticator: Authenticator, metrics: NodeMetrics | None = None,
                 small_get: Handler | None = None, read_cache: ReadCache | None = None) -> None:
        self.limits = limits = limits or WireLimits()
        self._auth = authenticator
        self.server_nonce = secrets.token_bytes(p.NONCE_BYTES)
        self.principal: Principal | None = None
        self.source_ip: str | None = None
        if transport == "tcp":
            try:
                self.source_ip = sock.getpeername()[0]
            except OSError:  # already reset; the read loop ends it
                pass
        waits = [t for t in (limits.header_timeout_s, limits.idle_timeout_s) if t > 0]
        super().__init__(sock, transport, min(waits) if waits else 0.0, limits.header_timeout_s)
        self.metrics = metrics
        self._handlers = handlers
        self._small_get = small_get or handlers[p.Op.GET]
        self.read_cache = read_cache
        self._put_stream = put_stream
        self._pool = pool
        self._lending = lending
        self._on_close = on_close
        # shm: the peer process (to learn when it exits); requests still running
        # are counted, as lent regions are reused only when none can touch them
        if transport == "shm":
            self.memory = lending.attach(*(peer or peer_process(sock)))
        else:
            self.memory = lending.attach()
        self.closed = False
        self._inflight = 0  # requests dispatched and not yet done
        self._inflight_lock = threading.Lock()
        self._frames = 0  # frames received
        self._last_activity = time.monotonic()  # a frame arrived or a request ended

    # --- main loop -------------------------------------------------------------
    def serve(self) -> None:
        """Read and dispatch frames until EOF, a protocol error, a timeout or a
        socket error; then close the connection."""
        header_s = self.limits.header_timeout_s
        try:
            while not self.closed:
                hdr = self._next_header()
                if hdr is None:
                    return
                deadline = time.monotonic() + header_s if header_s > 0 else None
                try:
                    op, meta_len, rid, payload_len = p.unpack_header(
                        hdr, max_meta=self.limits.max_meta_bytes)
                except ProtocolError as exc:
                    self.reply_error(0, exc)
                    return
                meta = self.recv_meta(meta_len, deadline)
                self._frames += 1
                self._last_activity = time.monotonic()
                try:
                    self.dispatch(op, rid, meta, payload_len)
                except ProtocolError as exc:
                    self.reply_error(rid, exc)
                    return
                except EndConnection as end:
                    log.info("closing a %s connection: %s", self.transport, end.error.message)
                    self.reply_error(rid, end.error)
                    self.shutdown_politely()
                    return
        except RecvTimeout as exc:
            self._timed_out(exc)
        except ProtocolError as exc:
            log.info("closing %s connection: %s", self.transport, exc)
        except OSError as exc:
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE, errno.EBADF, None):
                log.info("connection error: %s", exc)
        finally:
            self.close()

    def _next_header(self) -> memoryview | None:
        """The next frame's header, waiting between frames for as long as the
        limits allow: ``header_timeout_s`` for a connection's first frame,
        ``idle_timeout_s`` once nothing is in flight, else forever.

        Raises:
            RecvTimeout: the wait allowed has passed, or a header began and did
                not complete in time.
        """
        lim = self.limits
        while True:
            try:
                return self.recv_header()
            except RecvTimeout as exc:
                if exc.mid_frame:
                    raise
                first = self._frames == 0 and lim.header_timeout_s > 0
                allowed = lim.header_timeout_s if first else lim.idle_timeout_s
                if allowed <= 0 or self._inflight:
                    continue
                quiet = time.monotonic() - self._last_activity
                if quiet >= allowed - 0.001:
                    raise
                self._arm(allowed - quiet)

    def _timed_out(self, exc: RecvTimeout) -> None:
        """Tell the client why its connection closes (``RequestTimeout``, request id 0)."""
        lim = self.limits
        if exc.mid_frame and lim.header_timeout_s > 0:
            why = f"a frame's bytes stopped arriving (limit {lim.header_timeout_s} s)"
        elif self._frames == 0 and lim.header_timeout_s > 0:
            why = f"no request within {lim.header_timeout_s} s of connecting"
        else:
            why = f"the connection was idle for {lim.idle_timeout_s} s"
        log.info("closing a %s connection: %s", self.transport, why)
        self.reply_error(0, error_from_code("RequestTimeout", f"{why}; closing the connection"))
        self.shutdown_politely()

    def close(self) -> None:
        """Close the socket and release what the connection holds. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.close_fds_in()
        if self.read_cache is not None:
            self.read_cache.close()
        self._lending.detach(self.memory)
        try:
            self.sock.close()
        except OSError:
            pass
        self._on_close(self)

    # --- dispatch --------------------------------------------------------------
    def dispatch(self, op: int, rid: int, meta: bytearray, payload_len: int) -> None:
        """Decode one request and run it, inline or on the pool.

        Raises:
            ProtocolError: an unknown op, a bad frame or descriptors where none
                belong (the connection is then closed).
            EndConnection: an op before AUTH, a failed AUTH, or the key was
                revoked (the connection is then closed).
        """
        tp = p.REQUEST_TYPES.get(op)
        if tp is None:
            raise ProtocolError(f"unknown op {op}")
        self._check_principal(op)
        if self.fds_in and op != p.Op.REGISTER:
            self.close_fds_in()
            raise ProtocolError("file descriptors are accepted only with REGISTER")
        req = p.decode(tp, meta)
        self.request_begun(op, rid)
        if (op == p.Op.PUT and req.region == -1) or op in (p.Op.CHUNK_PUT, p.Op.PART):
            self._put_stream(self, rid, req, payload_len)
            return
        if payload_len:
            raise ProtocolError(f"op {op} carries no payload")
        if op == p.Op.AUTH:
            self._authenticate(rid, req)
            return
        inline = op not in _DATA_OPS or _small(op, req)
        handler = self._small_get if op == p.Op.GET and inline else self._handlers[op]
        if inline and self.transport == "tcp":  # nothing to count: this thread reads no frame meanwhile
            try:
                self._run(op, rid, req, handler)
            finally:
                self._last_activity = time.monotonic()
            return
        # every request is counted until it is done (inline ones too): a region lent
        # to this client is reused only when nothing of its process is running, and
        # a connection with a request in flight is not idle
        self._count(+1)
        if not inline:
            try:
                self._pool.submit(self._run_counted, op, rid, req, handler)
            except BaseException:
                self._count(-1)
                raise
        else:
            self._run_counted(op, rid, req, handler)

    def key_still_valid(self) -> bool:
        """Whether the connection's key still acts for its tenant (checked again by
        ops that must not rely on the check made before they were dispatched)."""
        principal = self.principal
        return principal is not None and self._auth.still_valid(principal)

    def _check_principal(self, op: int) -> None:
        """Refuse an op the connection may not send now.

        Raises:
            EndConnection: an op other than HELLO/AUTH before AUTH
                (``AccessDenied``); any op once the key is no longer valid
                (``InvalidAccessKeyId``).
        """
        principal = self.principal
        if principal is None:
            if op not in _OPEN_OPS:
                self.close_fds_in()
                raise EndConnection(AccessDenied(
                    "this connection has not authenticated: send AUTH after HELLO "
                    "(docs/wire-protocol.md, Authentication)"))
            return
        try:
            valid = self._auth.still_valid(principal)
        except GpufeedError as exc:  # the key's stored secret does not open
            raise EndConnection(exc) from exc
        if not valid:
            self.close_fds_in()
            raise EndConnection(InvalidAccessKeyId(
                "The access key Id of this connection is no longer valid (revoked)."))

    def _authenticate(self, rid: int, req: p.Auth) -> None:
        """Serve AUTH: check the proof, remember who the connection is, reply.

        Raises:
            EndConnection: a second AUTH, or the proof fails (bad nonce,
                unknown or revoked key, wrong secret).
        """
        if self.principal is not None:
            raise EndConnection(ProtocolError("this connection has authenticated already"))
        try:
            principal, reply = self._auth.authenticate(self.transport, self.server_nonce, req)
        except GpufeedError as exc:
            raise EndConnection(exc) from exc
        self.principal = principal
        self.reply(p.Op.AUTH, rid, reply)

    def _count(self, delta: int) -> None:
        """A request started (+1) or ended (-1)."""
        with self._inflight_lock:
            self._inflight += delta
        if delta < 0:
            self._last_activity = time.monotonic()
        if self.transport == "shm":
            if delta > 0:
                self._lending.request_started(self.memory)
            else:
                self._lending.request_done(self.memory)

    def _run_counted(self, op: int, rid: int, req, handler: Handler) -> None:
        try:
            self._run(op, rid, req, handler)
        finally:
            self._count(-1)

    def _run(self, op: int, rid: int, req, handler: Handler) -> None:
        """Run one request's handler; its errors become error replies."""
        if self.transport == "shm" and op in _DATA_OPS and self.peer_gone():
            # Its shared memory may already hold something else (the client reused
            # it after giving up): neither write into it nor store from it.
            log.info("skipping op %s of a shm client that has closed its connection", op)
            return
        try:
            handler(self, rid, req)
        except GpufeedError as exc:
            self.reply_error(rid, exc)
        except OSError as exc:
            self._os_error(op, rid, exc)
        except Exception as exc:  # never a traceback to the client, never a dead server
            log.exception("internal error serving op %s", op)
            self.reply_error(rid, InternalError(f"{type(exc).__name__}: {exc}"))

    def _os_error(self, op: int, rid: int, exc: OSError) -> None:
        if isinstance(exc, BlockingIOError):  # SO_SNDTIMEO: the client stopped reading
            log.info("closing a %s connection whose client stopped reading replies",
                     self.transport)
            self.abort()
            return
        if self.closed or isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            return  # the client went away; nobody to tell
        if isinstance(exc, FileNotFoundError):
            self.reply_error(rid, NoSuchKey(str(exc)))
        else:
            log.exception("I/O error serving op %s", op)
            self.reply_error(rid, InternalError(f"I/O error: {exc}"))


def _small(op: int, req) -> bool:
    """A data request small enough to answer on the reader thread."""
    if op == p.Op.GET:
        return 0 <= req.length <= INLINE_BYTES
    if op == p.Op.GETV:
        return all(0 <= it.length <= SMALL_ITEM_BYTES for it in req.items) and \
            sum(it.length for it in req.items) <= SMALL_GETV_BYTES
    if op == p.Op.GETR:  # a malformed one is refused at once, inline
        return len(req.lengths) % 4 != 0 or sum(memoryview(req.lengths).cast("I")) <= SMALL_GETV_BYTES
    return False
