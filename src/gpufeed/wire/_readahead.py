"""A TCP receive buffer that reads ahead, shared by both ends of the fast path
(the node's :mod:`._frames` and the client's connection).

A small receive (a frame's header, its metadata, a 4 KiB payload) takes
whatever has arrived into the buffer in one ``recv_into`` and serves the
following receives from it, so a small request or reply costs one system call
rather than three. A receive of at least :data:`READ_AHEAD_BYTES` goes straight
into its destination (large payloads land in their final buffer, no copy).
Our own code rather than a library's: it sits on the per-request hot path of
the fast path, which is the product.
"""

from __future__ import annotations

import socket

__all__ = ["ReadAhead", "READ_AHEAD_BYTES"]

#: Bytes one receive may take in beyond those asked for.
READ_AHEAD_BYTES = 64 << 10  # 64 KiB


class ReadAhead:
    """The bytes received ahead on one TCP socket, ``buf[pos:end]``.

    Not thread-safe: only the one thread reading the socket at a time uses it.

    Args:
        size: the buffer's bytes.
    """

    __slots__ = ("buf", "pos", "end")

    def __init__(self, size: int = READ_AHEAD_BYTES) -> None:
        self.buf = memoryview(bytearray(size))
        self.pos = self.end = 0

    @property
    def pending(self) -> int:
        """Bytes received ahead and not served yet."""
        return self.end - self.pos

    def recv_into(self, sock: socket.socket, mv: memoryview) -> int:
        """One receive into ``mv`` (0 at EOF): bytes received ahead first; a
        receive smaller than the buffer goes through it, keeping what arrived
        beyond ``mv`` for the next receive.

        Raises:
            OSError: as ``socket.recv_into`` (timeouts included).
        """
        have = self.end - self.pos
        if have:
            k = min(have, len(mv))
            mv[:k] = self.buf[self.pos:self.pos + k]
            self.pos += k
            return k
        if len(mv) >= len(self.buf):
            return sock.recv_into(mv)
        got = sock.recv_into(self.buf)
        k = min(got, len(mv))
        mv[:k] = self.buf[:k]
        self.pos, self.end = k, got
        return k
