"""Block sums computed as data is written: the xxh3-64 of every 64 KiB block of
a stream fed in pieces of any size (pieces need not align with blocks), so a
raw object's sums are ready when its write ends instead of being read back
from the file (see :mod:`._chunks`). One native hash call per block."""

from __future__ import annotations

import sys
from array import array

import xxhash

__all__ = ["BlockSummer"]

_xxh3 = xxhash.xxh3_64_intdigest


class BlockSummer:
    """xxh3-64 of each ``block``-byte block of the bytes fed, in order.

    Args:
        block: block size in bytes (the chunk store's sum block).
    """

    __slots__ = ("block", "_sums", "_partial", "_fill", "nbytes")

    def __init__(self, block: int) -> None:
        self.block = block
        self._sums = array("Q")
        self._partial: xxhash.xxh3_64 | None = None
        self._fill = 0
        #: Bytes fed so far.
        self.nbytes = 0

    def feed(self, mv: memoryview) -> None:
        """Add the next bytes of the stream (a byte view)."""
        n, b, pos = len(mv), self.block, 0
        if self._fill:
            take = min(b - self._fill, n)
            assert self._partial is not None
            self._partial.update(mv[:take])
            self._fill += take
            pos = take
            if self._fill == b:
                self._sums.append(self._partial.intdigest())
                self._partial, self._fill = None, 0
        end = pos + (n - pos) // b * b
        if end > pos:
            self._sums.extend([_xxh3(mv[o:o + b]) for o in range(pos, end, b)])
        if end < n:
            self._partial = xxhash.xxh3_64(mv[end:])
            self._fill = n - end
        self.nbytes += n

    def feed_all(self, views) -> None:
        """:meth:`feed` each view in order."""
        for v in views:
            self.feed(v)

    def finish(self) -> bytes:
        """The sums, little-endian 8 bytes each (the last block may be short)."""
        out = array("Q", self._sums)
        if self._fill:
            assert self._partial is not None
            out.append(self._partial.intdigest())
        if sys.byteorder != "little":
            out.byteswap()
        return out.tobytes()
