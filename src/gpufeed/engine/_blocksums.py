"""Per-block sums of a chunk's stored bytes: what every read is checked against.

Format (sum kind 1, :data:`SUM_KIND`, every chunk written now): the *running*
CRC32C (Castagnoli) of the chunk's stored bytes at the end of every 4 KiB block,
4 bytes little-endian each: ``sums[i] = CRC32C(stored[0:min((i + 1) * 4096, stored)])``
(the last block may be short). A CRC is linear, so the CRC of any run of whole
blocks follows from two stored values: for blocks ``[a, b)`` of ``n`` bytes,
``CRC(run) = sums[b - 1] ^ shift(sums[a - 1], n)`` (``sums[-1]`` taken as 0),
where ``shift(c, n) = combine(c, 0, n)`` is zlib's ``crc32_combine`` with a zero
second CRC (``awscrt.checksums.combine_crc32c``). A read of any length is thus
checked with one native CRC pass over the bytes it landed plus one combine; the
pass runs in awscrt (hardware CRC32C) with the GIL released for large buffers,
so a large read's threads check in parallel, and a 4 KiB read checks 4 KiB, not
a larger block. Ceph BlueStore keeps a CRC32C per 4 KiB block too
(``bluestore_csum_type``); 4 bytes per 4 KiB is 0.1 % of the data.

Sum kind 0 (chunks of catalogs made before kind 1): the xxh3-64 of every 64 KiB
block, 8 bytes each. They are still read and checked (:mod:`._chunkreads`),
never written.

Sources: CRC32C, RFC 3720 §12.1; the combine operation, zlib ``crc32.c``
(``crc32_combine``); awscrt ``checksums.crc32c`` / ``combine_crc32c``.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

from awscrt.checksums import combine_crc32c, crc32c

from ..errors import InvalidArgument

__all__ = ["SUM_KIND", "LEGACY_SUM_KIND", "SUM_BLOCK", "LEGACY_SUM_BLOCK", "BlockSummer", "block_sums", "crc32c",
           "sums_array", "run_expected", "crc_of", "first_bad_block", "check_run", "check_blocks", "sums_bytes"]

#: The sum kind of every chunk written now: running CRC32C per 4 KiB block.
SUM_KIND = 1
#: xxh3-64 per 64 KiB block (read, never written).
LEGACY_SUM_KIND = 0
#: Bytes covered by one sum of :data:`SUM_KIND`.
SUM_BLOCK = 4 << 10
#: Bytes covered by one sum of :data:`LEGACY_SUM_KIND`.
LEGACY_SUM_BLOCK = 64 << 10


class BlockSummer:
    """The sums (:data:`SUM_KIND`) of a stream fed in pieces of any size (pieces
    need not align with blocks), so a raw object's sums are ready when its write
    ends instead of being read back from the file. One native CRC call per block.

    Args:
        block: block size in bytes (a multiple of 4 KiB; :data:`SUM_BLOCK` default).
    """

    __slots__ = ("block", "_sums", "_crc", "_fill", "nbytes")

    def __init__(self, block: int = SUM_BLOCK) -> None:
        self.block = block
        self._sums = array("I")
        self._crc = 0  # running CRC of every byte fed
        self._fill = 0  # bytes of the current block fed so far
        #: Bytes fed so far.
        self.nbytes = 0

    def feed(self, mv: memoryview) -> None:
        """Add the next bytes of the stream (a byte view)."""
        n, b, pos = len(mv), self.block, 0
        crc, out = self._crc, self._sums
        if self._fill:
            take = min(b - self._fill, n)
            crc = crc32c(mv[:take], crc)
            self._fill += take
            pos = take
            if self._fill == b:
                out.append(crc)
                self._fill = 0
        end = pos + (n - pos) // b * b
        for o in range(pos, end, b):
            crc = crc32c(mv[o:o + b], crc)
            out.append(crc)
        if end < n:
            crc = crc32c(mv[end:], crc)
            self._fill = n - end
        self._crc = crc
        self.nbytes += n

    def feed_all(self, views) -> None:
        """:meth:`feed` each view in order."""
        for v in views:
            self.feed(v)

    def finish(self) -> bytes:
        """The sums as stored: little-endian 4 bytes each (the last block may be short)."""
        out = array("I", self._sums)
        if self._fill:
            out.append(self._crc)
        return sums_bytes(out)


def sums_bytes(sums: array) -> bytes:
    """``sums`` (an ``array``) as stored: little-endian."""
    if sys.byteorder != "little":
        sums = array(sums.typecode, sums)
        sums.byteswap()
    return sums.tobytes()


def _check_block(block: int) -> None:
    if not isinstance(block, int) or block < 4096 or block % 4096:
        raise InvalidArgument(f"block size {block!r}: expected a multiple of 4096 bytes")


def block_sums(view: object, block: int = SUM_BLOCK) -> bytes:
    """The sums (:data:`SUM_KIND`) of a chunk's stored bytes.

    Args:
        view: the stored bytes (any C-contiguous buffer).
        block: block size in bytes, a multiple of 4 KiB (4 KiB default).

    Returns:
        ``4 * ceil(len(view) / block)`` bytes: the running CRC32C at the end of
        each block, little-endian uint32, in order.

    Raises:
        InvalidArgument: a bad block size.
    """
    _check_block(block)
    s = BlockSummer(block)
    s.feed(memoryview(view).cast("B"))  # type: ignore[arg-type]
    return s.finish()


def sums_array(blob: bytes, kind: int) -> array:
    """Stored sums as integers: ``array('I')`` for :data:`SUM_KIND`, ``array('Q')`` for the legacy kind."""
    a = array("I" if kind == SUM_KIND else "Q")
    a.frombytes(blob[:len(blob) - len(blob) % a.itemsize])
    if sys.byteorder != "little":
        a.byteswap()
    return a


def run_expected(sums: Sequence[int], first: int, last: int, nbytes: int) -> int:
    """The CRC32C that blocks ``[first, last)`` of a chunk (``nbytes`` bytes in all)
    must have, from the chunk's running sums (``last <= len(sums)``)."""
    before = sums[first - 1] if first else 0
    return sums[last - 1] ^ combine_crc32c(before, 0, nbytes)


def crc_of(pieces: Sequence, crc: int = 0) -> int:
    """CRC32C of the pieces (byte buffers) one after another, continuing ``crc``."""
    for p in pieces:
        crc = crc32c(p, crc)
    return crc


def first_bad_block(pieces: Sequence, sums: Sequence[int], first: int, block: int = SUM_BLOCK) -> int:
    """The chunk-relative index of the first block of a run whose CRC does not
    match, or -1. ``pieces`` (byte buffers) hold the run, which starts at block
    ``first``; the slow path after a run failed its check, to name the block."""
    i = first
    crc = sums[first - 1] if first else 0
    fill = 0
    for p in pieces:
        mv = memoryview(p).cast("B")
        pos = 0
        while pos < len(mv):
            take = min(block - fill, len(mv) - pos)
            crc = crc32c(mv[pos:pos + take], crc)
            pos += take
            fill += take
            if fill == block:
                if i >= len(sums) or sums[i] != crc:
                    return i
                crc, i, fill = sums[i], i + 1, 0  # go on from the good value: one bad block is named once
    if fill and (i >= len(sums) or sums[i] != crc):
        return i
    return -1


def check_run(pieces: Sequence, sums: Sequence[int], first: int, nbytes: int, crc: int | None = None,
              block: int = SUM_BLOCK) -> int:
    """Check a run of ``nbytes`` bytes held by ``pieces`` (byte buffers, in order)
    that starts at block ``first`` of a chunk and ends at a block end or the
    chunk's end, against the chunk's running ``sums``: one CRC pass (skipped when
    the caller passes the run's ``crc``, computed as the bytes landed) and one
    combine; the block-by-block pass only after a mismatch, to name the block.

    Returns:
        The chunk-relative index of the first bad block (or of the first block
        without a sum), or -1.
    """
    last = first + -(-nbytes // block)
    if last == first:
        return -1
    if last <= len(sums) and (crc_of(pieces) if crc is None else crc) == run_expected(sums, first, last, nbytes):
        return -1
    bad = first_bad_block(pieces, sums, first, block)
    return bad if bad >= 0 else first


def check_blocks(views: object, expected_sums: bytes, first_block: int, block: int = SUM_BLOCK) -> int:
    """Verify a run of consecutive blocks of a chunk against its sums (:data:`SUM_KIND`).

    The run may arrive in pieces (a head scratch buffer, the client's buffer, a
    tail scratch buffer): they are checked as one run in one CRC pass, never joined.

    Args:
        views: one buffer, or a list/tuple of buffers that together hold the run.
        expected_sums: the chunk's :func:`block_sums` (all of its blocks).
        first_block: index in the chunk of the run's first block.
        block: the block size the sums were made with, in bytes.

    Returns:
        The chunk-relative index of the first block whose sum differs, or -1.

    Raises:
        ValueError: the run does not fit the sums (past the chunk's last block,
            or ending mid-block anywhere but at the chunk's end).
        InvalidArgument: a bad block size.
    """
    _check_block(block)
    pieces = [memoryview(v).cast("B") for v in (views if isinstance(views, (list, tuple)) else [views])]  # type: ignore[arg-type]
    total = sum(len(p) for p in pieces)
    count = -(-total // block)
    if len(expected_sums) % 4 or first_block < 0 or first_block + count > len(expected_sums) // 4:
        raise ValueError(f"blocks {first_block}..{first_block + count - 1} are not all in "
                         f"{len(expected_sums)} bytes of sums")
    if total % block and first_block + count != len(expected_sums) // 4:
        raise ValueError(f"a run of {total} bytes ends mid-block before the chunk's last block")
    return check_run(pieces, sums_array(expected_sums, SUM_KIND), first_block, total, block=block)
