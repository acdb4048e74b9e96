"""Frame I/O on one fast-path connection (spec: ``docs/wire-protocol.md``).

A :class:`FrameIO` owns the socket of one connection: it reads request frames
(the fixed header, the metadata, descriptors passed with ``SCM_RIGHTS`` on the
shm transport, a PUT's raw payload) and writes replies (metadata only, object
bytes by ``sendfile`` straight from the page cache, or a descriptor). The
frame limits (magic, version, largest metadata) are checked by
:func:`gpufeed.wire.protocol.unpack_header`; what the frames mean is the op
handlers' business.
"""

from __future__ import annotations

import array
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence

from ..errors import GpufeedError, InternalError, ProtocolError
from . import protocol as p
from ._readahead import ReadAhead

__all__ = ["FrameIO", "RecvTimeout", "set_send_timeout", "set_recv_timeout", "RECV_CHUNK"]

#: Receive buffer for TCP PUT payloads.
RECV_CHUNK = 4 << 20  # 4 MiB
#: Metadata up to this size is received into one buffer at once; larger metadata
#: grows its buffer as the bytes arrive (at most doubling), never to the size
#: the header merely announced.
META_STEP_BYTES = 64 << 10  # 64 KiB
#: Most buffers one ``sendmsg`` gathers (Linux's ``IOV_MAX``).
_IOV_MAX = 1024
#: Room for the descriptors one ``recvmsg`` may carry (16 ints).
_ANCILLARY_BYTES = socket.CMSG_SPACE(16 * 4)


def set_send_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Make a send on ``sock`` that makes no progress for ``timeout_s`` seconds
    fail (``BlockingIOError``); the socket stays blocking, so receives wait
    forever and ``sendfile`` keeps working. 0 means never.

    Args:
        sock: a connected socket.
        timeout_s: seconds, >= 0.
    """
    _set_timeout(sock, socket.SO_SNDTIMEO, timeout_s)


def set_recv_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Make a receive on ``sock`` that gets no byte for ``timeout_s`` seconds fail
    (``BlockingIOError``), the socket staying blocking. 0 means never.

    Args:
        sock: a connected socket.
        timeout_s: seconds, >= 0.
    """
    _set_timeout(sock, socket.SO_RCVTIMEO, timeout_s)


def _set_timeout(sock: socket.socket, option: int, timeout_s: float) -> None:
    timeout_s = max(0.0, timeout_s)
    whole = int(timeout_s)
    usec = int((timeout_s - whole) * 1_000_000)
    if whole == 0 and usec == 0 and timeout_s > 0:
        usec = 1  # 0 would mean "never"
    sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", whole, usec))


class RecvTimeout(Exception):
    """A receive waited the connection's receive timeout (or a frame's deadline
    passed) without the bytes it needed.

    Attributes:
        mid_frame: part of a frame had arrived (else the wait was between frames).
    """

    def __init__(self, mid_frame: bool) -> None:
        super().__init__("mid-frame" if mid_frame else "between frames")
        self.mid_frame = mid_frame


class FrameIO:
    """Reads request frames from, and writes reply frames to, one socket.

    Args:
        sock: the connected socket (blocking).
        transport: ``"tcp"`` or ``"shm"`` (a Unix socket that also carries
            descriptors).
        recv_timeout_s: seconds a receive may wait for a byte (``SO_RCVTIMEO``);
            0 waits forever.
        frame_timeout_s: seconds a frame's header and metadata may take once its
            first byte arrived; 0: no deadline (each receive still waits at most
            ``recv_timeout_s``).

    Replies may be sent from several threads at once (requests run on a pool);
    each reply frame is written whole under :attr:`send_lock`.
    """

    def __init__(self, sock: socket.socket, transport: str, recv_timeout_s: float = 0.0,
                 frame_timeout_s: float = 0.0) -> None:
        self.sock = sock
        self.transport = transport
        self.recv_timeout_s = recv_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self._armed = False  # SO_RCVTIMEO holds a shorter wait than recv_timeout_s
        if recv_timeout_s > 0:
            set_recv_timeout(sock, recv_timeout_s)
        self.send_lock = threading.Lock()
        #: descriptors received and not yet taken by a REGISTER
        self.fds_in: list[int] = []
        self._hdr = bytearray(p.HEADER_SIZE)
        self._recv_buf: bytearray | None = None
        # TCP: bytes received ahead (:mod:`._readahead`): a request's header and metadata in one receive
        self._ahead = ReadAhead() if transport != "shm" else None

    # --- reading ---------------------------------------------------------------
    def recv_exact(self, mv: memoryview, *, at_boundary: bool = False,
                   deadline: float | None = None) -> bool:
        """Fill ``mv`` from the socket, collecting descriptors on shm.

        Args:
            mv: the destination.
            at_boundary: ``mv`` starts a frame (a clean EOF before its first byte
                is no error).
            deadline: ``time.monotonic()`` by which ``mv`` must be full; at a
                boundary ``None`` sets one ``frame_timeout_s`` after the first
                byte. ``None`` elsewhere: each receive may wait ``recv_timeout_s``.

        Returns:
            False on a clean EOF at a frame boundary (``at_boundary`` and nothing
            read yet), else True.

        Raises:
            ProtocolError: EOF in the middle of a frame.
            RecvTimeout: no byte within the receive timeout, or the deadline passed.
            OSError: the socket failed.
        """
        pos, n = 0, len(mv)
        try:
            while pos < n:
                got = self._recv_once(mv[pos:], deadline, mid_frame=pos > 0 or not at_boundary)
                if got == 0:
                    if at_boundary and pos == 0:
                        return False
                    raise ProtocolError(f"connection closed mid-frame ({pos} of {n} bytes)")
                pos += got
                if pos < n and self.frame_timeout_s > 0:  # a partial frame: its bytes have a deadline
                    if deadline is None:
                        deadline = time.monotonic() + self.frame_timeout_s
                    self._arm(deadline - time.monotonic())
        finally:
            self.disarm()
        return True

    def _recv_once(self, mv: memoryview, deadline: float | None, *, mid_frame: bool) -> int:
        """One receive; a receive timeout before ``deadline`` waits out the rest.

        Raises:
            RecvTimeout: the receive timed out with no (or a passed) deadline.
        """
        while True:
            try:
                if self._ahead is not None:
                    return self._recv_ahead(mv)
                got, anc, _flags, _addr = self.sock.recvmsg_into([mv], _ANCILLARY_BYTES)
                for level, typ, data in anc:
                    if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                        cnt = len(data) // 4
                        self.fds_in.extend(int.from_bytes(data[i * 4:(i + 1) * 4], "little")
                                           for i in range(cnt))
                return got
            except BlockingIOError:  # SO_RCVTIMEO
                left = None if deadline is None else deadline - time.monotonic()
                if left is None or left <= 0.001:
                    raise RecvTimeout(mid_frame) from None
                self._arm(left)

    def _recv_ahead(self, mv: memoryview) -> int:
        """One TCP receive into ``mv`` through the read-ahead buffer (0 at EOF)."""
        assert self._ahead is not None  # TCP only
        return self._ahead.recv_into(self.sock, mv)

    def _arm(self, timeout_s: float) -> None:
        """Shorten the receive timeout to ``timeout_s`` until :meth:`disarm`."""
        set_recv_timeout(self.sock, max(0.001, timeout_s))
        self._armed = True

    def disarm(self) -> None:
        """Restore the connection's receive timeout after :meth:`_arm`."""
        if self._armed:
            self._armed = False
            set_recv_timeout(self.sock, self.recv_timeout_s)

    def recv_header(self) -> memoryview | None:
        """The next frame's header bytes (reused buffer), or ``None`` at a clean EOF.

        Raises:
            RecvTimeout: nothing arrived within the receive timeout (``mid_frame``
                False), or the header did not complete within it after its first byte.
        """
        hdr = memoryview(self._hdr)
        return hdr if self.recv_exact(hdr, at_boundary=True) else None

    def recv_meta(self, meta_len: int, deadline: float | None = None) -> bytearray:
        """The ``meta_len`` metadata bytes that follow a header, by ``deadline``
        (``time.monotonic()``). The buffer grows as the bytes arrive (see
        :data:`META_STEP_BYTES`), so an announced size costs nothing until sent.

        Raises:
            ProtocolError: the connection closed first.
            RecvTimeout: the deadline passed.
        """
        if meta_len <= META_STEP_BYTES:
            meta = bytearray(meta_len)
            self.recv_exact(memoryview(meta), deadline=deadline)
            return meta
        meta = bytearray()
        while len(meta) < meta_len:
            have = len(meta)
            step = min(meta_len - have, max(META_STEP_BYTES, have))
            meta.extend(bytes(step))
            with memoryview(meta) as mv:
                self.recv_exact(mv[have:], deadline=deadline)
        return meta

    def recv_payload(self, n: int) -> Iterator[memoryview]:
        """The ``n`` payload bytes that follow a request's metadata, in chunks of
        up to :data:`RECV_CHUNK` bytes (each valid until the next is asked for).

        Each chunk is filled whole before it is yielded: a socket hands over what
        it has (often ~200 KiB), and many small file writes leave the file in
        small page-cache folios that later reads copy out measurably slower.

        Raises:
            ProtocolError: the connection closed before ``n`` bytes arrived.
            RecvTimeout: no byte arrived within the receive timeout.
        """
        buf = self._payload_buffer()
        remaining = n
        while remaining:
            want = min(remaining, len(buf))
            filled = 0
            while filled < want:
                got = self._recv_payload_once(buf[filled:want])
                if got == 0:
                    raise ProtocolError(f"connection closed after "
                                        f"{n - remaining + filled} of {n} bytes")
                filled += got
            yield buf[:want]
            remaining -= want

    def drain(self, n: int) -> None:
        """Read and drop ``n`` payload bytes, so the stream stays framed.

        Raises:
            ProtocolError: the connection closed first.
            RecvTimeout: no byte arrived within the receive timeout.
        """
        buf = self._payload_buffer()
        while n:
            got = self._recv_payload_once(buf[: min(n, len(buf))])
            if got == 0:
                raise ProtocolError("connection closed mid-payload")
            n -= got

    def _recv_payload_once(self, mv: memoryview) -> int:
        try:
            return self._recv_ahead(mv) if self._ahead is not None else self.sock.recv_into(mv)
        except BlockingIOError:  # SO_RCVTIMEO: the payload stopped coming
            raise RecvTimeout(True) from None

    def _payload_buffer(self) -> memoryview:
        if self._recv_buf is None:
            self._recv_buf = bytearray(RECV_CHUNK)
        return memoryview(self._recv_buf)

    def close_fds_in(self) -> None:
        """Close every received descriptor not taken yet."""
        p.close_fds(self.fds_in)

    # --- writing ---------------------------------------------------------------
    def send_frame(self, op: int, rid: int, meta: bytes, payload_len: int = 0) -> None:
        """Send a header and its metadata (a payload, if any, follows separately)."""
        with self.send_lock:
            self.sock.sendall(p.pack_header(op, len(meta), rid, payload_len) + meta)

    def reply(self, op: int, rid: int, obj) -> None:
        """Send the reply to request ``rid`` of ``op`` with metadata ``obj``."""
        self.send_frame(op | p.REPLY, rid, p.encode(obj))

    def reply_error(self, rid: int, exc: GpufeedError) -> None:
        """Send an error reply; a socket already gone is ignored (nobody to tell).
        An error that met a delete marker (its ``details``) says so, with the
        marker's version id."""
        details = getattr(exc, "details", None) or {}
        marker = details.get("delete_marker") is True
        vid = details.get("version_id") if marker else None
        reply = p.ErrorReply(exc.code, exc.message, marker, vid if isinstance(vid, str) else None)
        try:
            self.send_frame(p.ERROR_OP, rid, p.encode(reply))
        except OSError:
            pass

    def reply_with_fd(self, op: int, rid: int, obj, fd: int) -> None:
        """Send a reply with ``fd`` attached (``SCM_RIGHTS``; shm only). The caller
        keeps its own descriptor."""
        meta = p.encode(obj)
        frame = p.pack_header(op | p.REPLY, len(meta), rid, 0) + meta
        with self.send_lock:
            self._send_with_fds(frame, [fd])

    def reply_with_fds(self, op: int, rid: int, obj, fds: Sequence[int]) -> None:
        """Send a reply carrying ``fds`` (``SCM_RIGHTS``; shm only), in order.

        The first :data:`~.protocol.FDS_PER_MESSAGE` (Linux's ``SCM_MAX_FD``)
        travel with the header and metadata; each further batch of up to as
        many travels with one payload byte (``0``) of its own, so the frame's
        ``payload_len`` is the number of further batches. The receiver reads
        the payload byte by byte: a Unix stream socket never hands two
        descriptor-carrying sends to one ``recvmsg``. The caller keeps its
        descriptors.

        Raises:
            OSError: the socket failed (``BlockingIOError`` after the send timeout).
        """
        step = p.FDS_PER_MESSAGE
        batches = [list(fds[i:i + step]) for i in range(0, len(fds), step)] or [[]]
        meta = p.encode(obj)
        frame = p.pack_header(op | p.REPLY, len(meta), rid, len(batches) - 1) + meta
        with self.send_lock:
            self._send_with_fds(frame, batches[0])
            for batch in batches[1:]:
                self._send_with_fds(b"\0", batch)

    def _send_with_fds(self, data: bytes, fds: list[int]) -> None:
        """Send ``data`` whole, ``fds`` attached to its first byte."""
        if not fds:
            self.sock.sendall(data)
            return
        sent = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                           array.array("i", fds).tobytes())])
        if sent < len(data):  # the rest carries no descriptors
            self.sock.sendall(data[sent:])

    def reply_with_files(self, op: int, rid: int, obj, extents: list) -> None:
        """Send a reply whose payload is file bytes, by ``sendfile`` (no copy),
        and buffers.

        Args:
            op: the request op.
            rid: the request id.
            obj: the reply metadata.
            extents: each piece of the payload, in order: ``(fd, offset, length)``
                of a file (sent by ``sendfile``) or a ``memoryview``.

        Raises:
            InternalError: a file ended before its extent.
            OSError: the socket failed (``BlockingIOError`` after the send timeout).
        """
        if len(extents) == 1 and type(extents[0]) is memoryview:  # a small read: one sendmsg
            meta = p.encode(obj)
            with self.send_lock:
                self._sendmsg_all([memoryview(p.pack_header(op | p.REPLY, len(meta), rid, len(extents[0])) + meta),
                                   extents[0]])
            return
        payload = sum(len(e) if isinstance(e, memoryview) else e[2] for e in extents)
        meta = p.encode(obj)
        head = p.pack_header(op | p.REPLY, len(meta), rid, payload) + meta
        with self.send_lock:
            if all(isinstance(e, memoryview) for e in extents):  # small reads: one sendmsg
                self._sendmsg_all([memoryview(head), *extents])
                return
            self.sock.sendall(head)
            for e in extents:
                if isinstance(e, memoryview):
                    self.sock.sendall(e)
                else:
                    self._sendfile_all(*e)

    def _sendmsg_all(self, bufs: list[memoryview]) -> None:
        """Send ``bufs`` one after another, gathered: ``sendmsg`` of up to
        :data:`_IOV_MAX` buffers at a time, resuming after a partial send."""
        i = 0
        while i < len(bufs):
            batch = bufs[i:i + _IOV_MAX]
            sent = self.sock.sendmsg(batch)
            for b in batch:
                if sent < len(b):
                    bufs[i] = b[sent:]
                    break
                sent -= len(b)
                i += 1

    def _sendfile_all(self, fd: int, offset: int, count: int) -> None:
        out = self.sock.fileno()
        while count > 0:
            sent = os.sendfile(out, fd, offset, count)
            if sent == 0:
                raise InternalError("object file ended early")
            offset += sent
            count -= sent

    def peer_gone(self) -> bool:
        """The client has closed its end (no waiting); also True when this end is
        closed already."""
        try:
            poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLRDHUP)
            events = sum(ev for _fd, ev in poller.poll(0))
        except (OSError, ValueError):  # already closed here
            return True
        return bool(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR))

    def shutdown_politely(self) -> None:
        """End the connection after a last reply: stop sending, drop what the client
        had already sent (closing over unread bytes would reset the connection, and
        the client might lose that reply), without waiting for more."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            for _ in range(64):
                if not self.sock.recv(1 << 16, socket.MSG_DONTWAIT):
                    break
        except OSError:  # nothing more waiting, or the client is gone
            pass

    def abort(self) -> None:
        """Shut the socket down: the reader sees EOF and closes the connection, and
        senders blocked on it fail at once."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
