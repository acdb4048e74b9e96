"""One fast-path connection from the client side, with many requests in flight.

Our own code because it is the fast path. A request is a frame sent under a
send lock. Reply frames are read by whichever thread holds the connection's
read token, which lands any payload (TCP) straight in the destination buffers
the request registered (``recv_into``; no intermediate ``bytes``) and
completes the request's Future:

- **Leader/follower.** A thread that waits for its reply takes the token and
  reads frames itself until its own reply is in, completing the others'
  Futures on the way; on leaving it hands the token to a waiting thread
  whose reply has not come. A lone request thus costs no thread hand-over:
  the kernel wakes the waiting thread itself.
- **Receiver thread.** It reads only when nobody waits: for Futures with
  done-callbacks (it is woken when one is registered) and for replies
  nobody asked for within ``ORPHAN_WAIT_S``.
- **A lone call.** :meth:`Connection.call` on a connection nobody is reading
  sends and reads on the calling thread holding the token from the start: no
  Future, no receiver wake-up.
- **Read-ahead (TCP).** A receive smaller than :data:`~gpufeed.wire._readahead.READ_AHEAD_BYTES` takes
  whatever has arrived into a buffer and serves the following receives from
  it, so a small reply (header, metadata and a 4 KiB payload) takes one system
  call. The shm transport's receives carry descriptors and read exactly what
  they ask for.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future

from ..errors import GpufeedError, InvalidArgument, ProtocolError, TransportError
from ..wire import protocol as p
from ..wire._frames import set_recv_timeout, set_send_timeout
from ..wire._readahead import ReadAhead
from ._types import ReplyFuture

__all__ = ["Connection", "connect_tcp", "connect_unix"]

log = logging.getLogger("gpufeed.client")

#: How long a reply may sit unread, with nobody waiting for it, before the
#: receiver thread reads it (seconds).
ORPHAN_WAIT_S = 0.002
_ORPHAN_WAIT_MS = 2

#: How often a waiting follower looks whether the connection closed (seconds).
_FOLLOWER_CHECK_S = 0.5

#: Most buffers one ``recvmsg_into`` fills (Linux's ``IOV_MAX``).
_IOV_MAX = 1024


#: Room for the most descriptors one message carries (a MAP_EXTENTS reply's batch).
_ANCILLARY_BYTES = socket.CMSG_SPACE(p.FDS_PER_MESSAGE * 4)


class _Pending:
    __slots__ = ("future", "reply_type", "dests", "alloc")

    def __init__(self, future: ReplyFuture | _Reply, reply_type: type, dests: list[memoryview] | None,
                 alloc: bool) -> None:
        self.future = future
        self.reply_type = reply_type
        self.dests = dests
        self.alloc = alloc  # allocate the payload buffer on arrival; result is (reply, buffer)


class _Reply:
    """The outcome of a request whose reply the sending thread reads itself
    (:meth:`Connection.call`), set as a Future's would be."""

    __slots__ = ("_value", "_error", "_done")

    def __init__(self) -> None:
        self._value = None
        self._error: BaseException | None = None
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, value) -> None:
        self._value, self._done = value, True

    def set_exception(self, exc: BaseException) -> None:
        self._error, self._done = exc, True


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
        # the kernel times sends and receives (SO_SNDTIMEO, SO_RCVTIMEO: BlockingIOError):
        # a blocking socket costs one system call per receive or send, where
        # settimeout() would add a poll() before each
        sock.settimeout(None)
        if request_timeout_s:
            set_send_timeout(sock, request_timeout_s)
            set_recv_timeout(sock, request_timeout_s)
        self.passes_fds = passes_fds
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._error: BaseException | None = None
        self._fds_in: list[int] = []  # shm: descriptors that arrived with reply frames
        self._token = threading.Lock()  # held by the one thread reading reply frames
        self._followers: deque[ReplyFuture] = deque()  # waiters for the token
        self._kicked = False
        self._receiver_idle = False  # the receiver thread sleeps with no timeout
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # kicks the receiver
        self._wake_lock = threading.Lock()
        self._scratch: memoryview | None = None  # drains payloads nobody wanted
        # TCP: bytes received ahead (read by the token's holder only)
        self._ahead = None if passes_fds else ReadAhead()
        self._receiving: _Pending | None = None  # whose payload is being read
        self._receiver = threading.Thread(target=self._receive_loop, name="gpufeed-recv", daemon=True)
        self._receiver.start()

    @property
    def inflight(self) -> int:
        return len(self._pending)

    @property
    def error(self) -> BaseException | None:
        """What closed the connection (an error the node sent, a lost socket), or ``None``."""
        return self._error

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
        future = ReplyFuture(self._await, self._kick)
        plen = 0 if payload is None else len(payload)
        rid, frame = self._enqueue(op, meta_obj, _Pending(future, p.REPLY_TYPES[op], dests, alloc), plen)
        if self._receiver_idle:  # it sleeps with no timeout: let it time this request
            self._kick(read=False)
        self._send(rid, frame, payload, plen, fds)
        return future

    def _enqueue(self, op: int, meta_obj, pend: _Pending, plen: int) -> tuple[int, bytes]:
        """Register ``pend`` under a new request id; returns the id and the frame to send.

        Raises:
            TransportError: the connection is closed.
            InvalidArgument: ``meta_obj`` does not encode.
        """
        if self._closed:
            raise TransportError(f"connection closed: {self._error or 'by the client'}")
        rid = next(self._ids)
        try:
            meta = p.encode(meta_obj)
        except (UnicodeEncodeError, OverflowError, TypeError) as exc:
            raise InvalidArgument(f"cannot encode the request: {exc}") from exc
        frame = p.pack_header(op, len(meta), rid, plen) + meta
        with self._pending_lock:
            self._pending[rid] = pend
        return rid, frame

    def _send(self, rid: int, frame: bytes, payload, plen: int, fds: list[int] | None) -> None:
        """Send request ``rid``'s frame (and payload, descriptors); a failure
        fails the connection.

        Raises:
            TransportError: the send failed or made no progress in time.
        """
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
            if isinstance(exc, (TimeoutError, BlockingIOError)):
                exc = TransportError(f"the server accepted no data for {self.request_timeout_s} s")
            self._fail(exc)
            raise TransportError(f"send failed: {exc}") from exc

    def call(self, op: int, meta_obj, *, dests: list[memoryview] | None = None,
             payload=None, fds: list[int] | None = None, alloc: bool = False):
        """``request(...).result()``; when no other thread is reading replies,
        sent and read on this thread with no Future (see the module docstring).

        Raises:
            GpufeedError: the typed error the server sent.
            TransportError: the connection failed or is closed.
        """
        if alloc or payload is not None or not self._token.acquire(blocking=False):
            return self.request(op, meta_obj, dests=dests, payload=payload, fds=fds, alloc=alloc).result()
        reply = _Reply()
        try:
            rid, frame = self._enqueue(op, meta_obj, _Pending(reply, p.REPLY_TYPES[op], dests, False), 0)
            self._send(rid, frame, None, 0, fds)
            self._read_while(lambda: not reply._done)
        finally:
            self._token.release()
            if self._followers:
                self._hand_over()
        if reply._error is not None:
            raise reply._error
        if not reply._done:  # the connection closed first
            raise TransportError(f"connection closed: {self._error or 'by the client'}")
        return reply._value

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
                    got = self._recv_ahead(mv[pos:])
            except (TimeoutError, BlockingIOError):  # SO_RCVTIMEO
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

    def _recv_ahead(self, mv: memoryview) -> int:
        """One TCP receive into ``mv`` through the read-ahead buffer (0 at EOF)."""
        assert self._ahead is not None  # TCP only
        return self._ahead.recv_into(self.sock, mv)

    # --- reading replies: leader/follower ---------------------------------------------
    def _await(self, fut: ReplyFuture) -> None:
        """Block until ``fut`` is done, reading reply frames on this thread whenever
        the read token is free (see the module docstring)."""
        while not fut.done():
            if self._token.acquire(blocking=False):
                try:
                    self._read_while(lambda: not fut.done())
                finally:
                    self._token.release()
                    self._hand_over()
                if not fut.done():  # the connection closed under a request sent meanwhile
                    fut.set_exception(TransportError(
                        f"connection closed: {self._error or 'by the client'}"))
                return
            with self._pending_lock:
                self._followers.append(fut)
            try:
                # the token may have come free before this waiter was in the queue
                if self._token.acquire(blocking=False):
                    self._token.release()
                    continue
                with fut._condition:  # Future's own condition: set_result notifies it
                    while not fut._poked and not fut.done() and not self._closed:
                        fut._condition.wait(_FOLLOWER_CHECK_S)
                    fut._poked = False
            finally:
                with self._pending_lock:
                    try:
                        self._followers.remove(fut)
                    except ValueError:
                        pass

    def _hand_over(self) -> None:
        """After a leader releases the token: wake one waiter whose reply is not in."""
        with self._pending_lock:
            waiter = next((f for f in self._followers if not f.done()), None)
        if waiter is not None:
            with waiter._condition:
                waiter._poked = True
                waiter._condition.notify_all()

    def _kick(self, read: bool = True) -> None:
        """Wake the receiver thread: to read now (a reply may arrive that nobody
        waits for), or (``read=False``) to start timing an outstanding request."""
        if read:
            self._kicked = True
        with self._wake_lock:
            if self._wake_fd >= 0:
                os.eventfd_write(self._wake_fd, 1)

    def _receive_loop(self) -> None:
        """Read what no waiting thread reads: replies of Futures with callbacks
        (on a kick), replies that have arrived while a request was outstanding for
        ``ORPHAN_WAIT_S`` with the token free and no waiter, and the end of the connection while it is idle (the
        socket's hang-up, not its data, wakes this thread)."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLRDHUP)
        poller.register(self._wake_fd, select.POLLIN)
        idle_since = None
        while not self._closed:
            # request() wakes a receiver that sleeps with no timeout (set before
            # looking at _pending: a request registered meanwhile sees it)
            self._receiver_idle = True
            if not self._pending:
                timeout_ms = None
            else:  # a leader reading: look less often
                self._receiver_idle = False
                timeout_ms = _ORPHAN_WAIT_MS * (10 if self._token.locked() else 1)
            events = poller.poll(timeout_ms)
            self._receiver_idle = False
            hangup = False
            for fd, _events in events:
                if fd == self._wake_fd:
                    os.eventfd_read(fd)
                else:
                    hangup = True
            if self._closed:
                break
            orphaned = False
            if self._pending and not self._followers and not self._token.locked():
                now = time.monotonic()
                orphaned = idle_since is not None and now - idle_since >= ORPHAN_WAIT_S
                idle_since = idle_since if idle_since is not None else now
            else:
                idle_since = None
            if hangup:  # replies still buffered, then the end: read to the end
                with self._token:
                    self._read_while(lambda: True)
                break
            if orphaned and not self._kicked and not self._reply_waiting(poller):
                continue  # nothing has arrived: a thread that will wait for it reads it then
            if self._kicked or orphaned:
                self._kicked = False
                idle_since = None
                with self._token:
                    self._read_while(lambda: bool(self._pending))
                self._hand_over()

    def _reply_waiting(self, poller: select.poll) -> bool:
        """Whether reply bytes (or the end) are there to read now."""
        if self._ahead is not None and self._ahead.pending:  # received ahead
            return True
        try:
            fd = self.sock.fileno()
            poller.modify(fd, select.POLLRDHUP | select.POLLIN)
            try:
                return any(f != self._wake_fd for f, _ev in poller.poll(0))
            finally:
                poller.modify(fd, select.POLLRDHUP)
        except (OSError, ValueError):  # closed meanwhile: the read that follows ends the loop
            return True

    def _read_while(self, more) -> None:
        """Read reply frames (holding the token) while ``more()`` is true and the
        connection is open. A failure fails every pending request and closes the
        connection; only a programming error propagates."""
        try:
            while more() and not self._closed:
                self._read_frame()
        except Exception as exc:  # whatever broke the reading, no waiter may be left hanging
            # The request whose reply was being received is no longer in _pending
            # (its payload may have been cut off by the server's death): fail it here.
            pend, self._receiving = self._receiving, None
            if pend is not None and not pend.future.done():
                pend.future.set_exception(exc if isinstance(exc, GpufeedError)
                                          else TransportError(f"connection lost: {exc}"))
            self._fail(exc)
            if not isinstance(exc, (OSError, GpufeedError)):
                raise

    def _read_frame(self) -> None:
        """Read one reply frame and complete its request's Future."""
        hmv = memoryview(bytearray(p.HEADER_SIZE))
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
            return
        if pend is None:
            raise ProtocolError(f"reply for unknown request {rid}")
        self._receiving = pend
        try:
            reply = p.decode(pend.reply_type, memoryview(meta))
        except ProtocolError as bad:
            pend.future.set_exception(bad)
            raise
        if isinstance(reply, p.MapExtentsReply):  # descriptors came with it
            pend.future.set_result((reply, self._recv_fds(reply.files, payload_len)))
        elif isinstance(reply, p.LeaseReply):  # the data file and the commit counter
            pend.future.set_result((reply, self._recv_fds(2, payload_len)))
        elif isinstance(reply, (p.AllocRegionReply, p.MapReply)):  # an fd came with it
            if not self._fds_in:
                missing = ProtocolError(f"{p.Op(op & ~p.REPLY).name} reply arrived without "
                                        f"a descriptor")
                pend.future.set_exception(missing)
                raise missing
            pend.future.set_result((reply, self._fds_in.pop(0)))
        else:
            self._close_fds()  # nothing else carries descriptors
            if pend.alloc:
                buf = bytearray(payload_len)
                if payload_len:
                    self._recv_exact(memoryview(buf))
                pend.future.set_result((reply, buf))
            else:
                if payload_len:
                    self._land_payload(pend, reply, payload_len)
                pend.future.set_result(reply)
        # an idle connection must not keep the last request's destination buffers
        # (pooled alloc() memory) alive
        self._receiving = None

    def _land_payload(self, pend: _Pending, reply, payload_len: int) -> None:
        """Receive a reply's payload into the request's destination buffers
        (draining what has no destination)."""
        dests = pend.dests or []
        bufs: list[memoryview] = []  # received with one recvmsg_into per up to _IOV_MAX
        for i, n in enumerate(self._payload_sizes(reply, payload_len)):
            if n <= 0:
                continue
            if i < len(dests) and len(dests[i]) >= n:
                bufs.append(dests[i][:n])
                continue
            if self._scratch is None:
                self._scratch = memoryview(bytearray(1 << 20))
            while n:
                k = min(n, len(self._scratch))
                bufs.append(self._scratch[:k])
                n -= k
        if len(bufs) == 1 or self.passes_fds:
            for b in bufs:
                self._recv_exact(b)
        else:
            self._recv_gather(bufs)

    def _recv_gather(self, bufs: list[memoryview]) -> None:
        """Fill ``bufs`` in order from the socket (a batch's payloads): one
        ``recvmsg_into`` for up to :data:`_IOV_MAX` of them at a time.

        Raises:
            TransportError: the connection closed, or no bytes came for
                ``request_timeout_s``.
        """
        i = 0
        while i < len(bufs) and self._ahead is not None and self._ahead.pending:  # bytes received ahead first
            b = bufs[i]
            k = self._recv_ahead(b)
            if k < len(b):
                bufs[i] = b[k:]
            else:
                i += 1
        while i < len(bufs):
            batch = bufs[i:i + _IOV_MAX]
            try:
                got = self.sock.recvmsg_into(batch)[0]
            except (TimeoutError, BlockingIOError):  # SO_RCVTIMEO
                raise TransportError(f"no reply from the server for {self.request_timeout_s} s") from None
            if got == 0:
                raise TransportError("the connection was closed"
                                     + (" by the client" if self._closed else " by the server"))
            for b in batch:
                if got < len(b):
                    bufs[i] = b[got:]
                    break
                got -= len(b)
                i += 1

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
        elif isinstance(reply, p.GetRangesReply):
            sizes = [max(n, 0) for n in memoryview(reply.n).cast("q")]
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
        self._kick()  # the receiver thread sees the connection closed and ends
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        except OSError:
            pass
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
        self._fail(TransportError("the client closed the connection"))
        if self._receiver is not threading.current_thread():
            self._receiver.join(timeout=5)
            with self._wake_lock:
                if self._wake_fd >= 0 and not self._receiver.is_alive():
                    os.close(self._wake_fd)
                    self._wake_fd = -1
        try:
            self.sock.close()
        except OSError:
            pass
