"""One fast-path connection from the client side, with many requests in flight.

Our own code because it is the fast path. A request is a frame sent under a
send lock; a receiver thread reads reply frames and lands any payload (TCP)
straight in the destination buffers the request registered (``recv_into``;
no intermediate ``bytes``), then completes the request's future.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from concurrent.futures import Future

from ..errors import GpufeedError, InvalidArgument, ProtocolError, TransportError
from ..wire import protocol as p

__all__ = ["Connection", "connect_tcp", "connect_unix"]

log = logging.getLogger("gpufeed.client")

#: Room for the most descriptors one message carries (a MAP_EXTENTS reply's batch).
_ANCILLARY_BYTES = socket.CMSG_SPACE(p.FDS_PER_MESSAGE * 4)


class _Pending:
    __slots__ = ("future", "reply_type", "dests", "alloc")

    def __init__(self, reply_type: type, dests: list[memoryview] | None, alloc: bool) -> None:
        self.future: Future = Future()
        self.reply_type = reply_type
        self.dests = dests
        self.alloc = alloc  # allocate the payload buffer on arrival; result is (reply, buffer)


def connect_tcp(address: tuple[str, int], timeout_s: float) -> socket.socket:
    """A connected TCP socket (``TCP_NODELAY``) to ``(host, port)``.

    Raises:
        TransportError: the connection failed or timed out (``timeout_s`` seconds).
    """
    try:
        sock = socket.create_connection(address, timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        raise TransportError(f"cannot connect to tcp endpoint {address}: {exc}") from exc
    sock.settimeout(None)
    return sock


def connect_unix(path: str, timeout_s: float) -> socket.socket:
    """A connected Unix stream socket to ``path`` (it can carry descriptors).

    Raises:
        TransportError: the connection failed or timed out (``timeout_s`` seconds).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise TransportError(f"cannot connect to shm endpoint {path}: {exc}") from exc
    sock.settimeout(None)
    return sock


class Connection:
    """A multiplexed connection: ``request()`` returns a Future of the reply.

    Args:
        sock: a connected socket.
        passes_fds: the socket carries file descriptors with frames (a Unix
            socket: ``SCM_RIGHTS`` arrive with ALLOC_REGION and MAP replies).
        request_timeout_s: a request fails with TransportError (and the
            connection is closed) when it makes no progress for this long:
            no reply bytes arrive while it waits, or a send cannot proceed.
            ``None`` waits forever.
    """

    def __init__(self, sock: socket.socket, passes_fds: bool,
                 request_timeout_s: float | None = 60.0) -> None:
        self.sock = sock
        self.request_timeout_s = request_timeout_s
        sock.settimeout(request_timeout_s)
        self.passes_fds = passes_fds
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._error: BaseException | None = None
        self._fds_in: list[int] = []  # shm: descriptors that arrived with reply frames
        self._receiver = threading.Thread(target=self._receive_loop, name="gpufeed-recv", daemon=True)
        self._receiver.start()

    @property
    def inflight(self) -> int:
        return len(self._pending)

    @property
    def closed(self) -> bool:
        """Closed by :meth:`close` or by a failure (timeout, lost connection)."""
        return self._closed

    def request(self, op: int, meta_obj, *, dests: list[memoryview] | None = None,
                payload=None, fds: list[int] | None = None, alloc: bool = False) -> Future:
        """Send one request; the Future resolves to the decoded reply struct or
        raises the typed error the server sent (or TransportError).

        Args:
            dests: buffers that receive the reply payload in order (TCP GET/GETV).
            payload: a buffer sent after the metadata (TCP PUT).
            fds: file descriptors passed with the frame (shm REGISTER).
            alloc: allocate a ``bytearray`` for the payload when it arrives; the
                Future then resolves to ``(reply, bytearray)``.
        """
        if self._closed:
            raise TransportError(f"connection closed: {self._error or 'by the client'}")
        rid = next(self._ids)
        pend = _Pending(p.REPLY_TYPES[op], dests, alloc)
        try:
            meta = p.encode(meta_obj)
        except (UnicodeEncodeError, OverflowError, TypeError) as exc:
            raise InvalidArgument(f"cannot encode the request: {exc}") from exc
        plen = 0 if payload is None else len(payload)
        frame = p.pack_header(op, len(meta), rid, plen) + meta
        with self._pending_lock:
            self._pending[rid] = pend
        try:
            with self._send_lock:
                if fds:
                    socket.send_fds(self.sock, [frame], fds)
                else:
                    self.sock.sendall(frame)
                if plen:
                    self.sock.sendall(payload)
        except OSError as exc:
            with self._pending_lock:
                self._pending.pop(rid, None)
            if isinstance(exc, TimeoutError):
                exc = TransportError(f"the server accepted no data for {self.request_timeout_s} s")
            self._fail(exc)
            raise TransportError(f"send failed: {exc}") from exc
        return pend.future

    def call(self, op: int, meta_obj, **kw):
        """``request(...).result()``."""
        return self.request(op, meta_obj, **kw).result()

    # --- receiving -----------------------------------------------------------
    def _recv_exact(self, mv: memoryview) -> None:
        pos, n = 0, len(mv)
        while pos < n:
            try:
                if self.passes_fds:
                    got, anc, _flags, _addr = self.sock.recvmsg_into(
                        [mv[pos:]], _ANCILLARY_BYTES, socket.MSG_CMSG_CLOEXEC)
                    for level, typ, data in anc:
                        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                            self._fds_in.extend(int.from_bytes(data[i:i + 4], "little")
                                                for i in range(0, len(data) - len(data) % 4, 4))
                else:
                    got = self.sock.recv_into(mv[pos:])
            except TimeoutError:
                if self._closed:
                    raise TransportError("the client closed the connection") from None
                if pos == 0 and not self._pending:
                    continue  # idle between replies: nothing is waiting
                raise TransportError(
                    f"no reply from the server for {self.request_timeout_s} s") from None
            if got == 0:
                raise TransportError("the connection was closed"
                                     + (" by the client" if self._closed else " by the server"))
            pos += got

    def _receive_loop(self) -> None:
        hdr = bytearray(p.HEADER_SIZE)
        hmv = memoryview(hdr)
        scratch = None
        pend = None
        meta: bytearray | None = None
        dests: list[memoryview] | None = None
        try:
            while True:
                self._recv_exact(hmv)
                op, meta_len, rid, payload_len = p.unpack_header(hmv)
                meta = bytearray(meta_len)
                self._recv_exact(memoryview(meta))
                with self._pending_lock:
                    pend = self._pending.pop(rid, None)
                if op == p.ERROR_OP:
                    failure = p.error_from_reply(p.decode(p.ErrorReply, memoryview(meta)))
                    if pend is None:  # connection-level error (e.g. bad frame)
                        raise failure
                    pend.future.set_exception(failure)
                    continue
                if pend is None:
                    raise ProtocolError(f"reply for unknown request {rid}")
                try:
                    reply = p.decode(pend.reply_type, memoryview(meta))
                except ProtocolError as bad:
                    pend.future.set_exception(bad)
                    raise
                if isinstance(reply, p.MapExtentsReply):  # descriptors came with it
                    pend.future.set_result((reply, self._recv_fds(reply.files, payload_len)))
                    continue
                if isinstance(reply, (p.AllocRegionReply, p.MapReply)):  # an fd came with it
                    if not self._fds_in:
                        missing = ProtocolError(f"{p.Op(op & ~p.REPLY).name} reply arrived without "
                                                f"a descriptor")
                        pend.future.set_exception(missing)
                        raise missing
                    pend.future.set_result((reply, self._fds_in.pop(0)))
                    continue
                self._close_fds()  # nothing else carries descriptors
                if pend.alloc:
                    buf = bytearray(payload_len)
                    if payload_len:
                        self._recv_exact(memoryview(buf))
                    pend.future.set_result((reply, buf))
                    continue
                if payload_len:
                    sizes = self._payload_sizes(reply, payload_len)
                    dests = pend.dests or []
                    for i, n in enumerate(sizes):
                        if n <= 0:
                            continue
                        if i < len(dests) and len(dests[i]) >= n:
                            self._recv_exact(dests[i][:n])
                        else:  # no destination: drain
                            if scratch is None:
                                scratch = memoryview(bytearray(1 << 20))
                            while n:
                                k = min(n, len(scratch))
                                self._recv_exact(scratch[:k])
                                n -= k
                pend.future.set_result(reply)
                # drop references now: an idle connection must not keep the last
                # request's destination buffers (pooled alloc() memory) alive
                pend = reply = meta = dests = None
        except Exception as exc:  # whatever broke the loop, no waiter may be left hanging
            # The request whose reply was being received is no longer in _pending
            # (its payload may have been cut off by the server's death): fail it here.
            if pend is not None and not pend.future.done():
                pend.future.set_exception(exc if isinstance(exc, GpufeedError)
                                          else TransportError(f"connection lost: {exc}"))
            self._fail(exc)
            if not isinstance(exc, (OSError, GpufeedError)):
                raise

    def _recv_fds(self, files: int, payload_len: int) -> list[int]:
        """The ``files`` descriptors of a MAP_EXTENTS reply: those that came with its
        metadata, then a batch with each of its ``payload_len`` payload bytes.

        Raises:
            ProtocolError: the payload or the descriptors do not match ``files``
                (what arrived is closed).
        """
        batches = max(1, -(-files // p.FDS_PER_MESSAGE))
        if payload_len != batches - 1:
            raise ProtocolError(f"a reply with {files} descriptors came with a payload of "
                                f"{payload_len} bytes")
        one = memoryview(bytearray(1))
        for _ in range(payload_len):
            self._recv_exact(one)
        if len(self._fds_in) != files:
            got = len(self._fds_in)
            self._close_fds()
            raise ProtocolError(f"a reply announced {files} descriptors and {got} arrived")
        fds, self._fds_in = self._fds_in, []
        return fds

    @staticmethod
    def _payload_sizes(reply, payload_len: int) -> list[int]:
        if isinstance(reply, p.GetReply):
            sizes = [reply.n]
        elif isinstance(reply, p.GetVReply):
            sizes = [max(n, 0) for n in reply.n]
        else:
            sizes = [payload_len]
        if sum(sizes) != payload_len:
            raise ProtocolError(f"payload of {payload_len} bytes does not match the reply")
        return sizes

    def _close_fds(self) -> None:
        p.close_fds(self._fds_in)

    def _fail(self, exc: BaseException) -> None:
        self._close_fds()
        if self._error is None:
            self._error = exc
        self._closed = True
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        err = exc if isinstance(exc, TransportError) else TransportError(f"connection lost: {exc}")
        for pend in pending.values():
            if not pend.future.done():
                pend.future.set_exception(err)
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        """Close the socket; in-flight requests fail with TransportError."""
        if not self._closed:
            self._closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._receiver is not threading.current_thread():
            self._receiver.join(timeout=5)
        try:
            self.sock.close()
        except OSError:
            pass
