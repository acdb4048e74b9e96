"""Reading object data from the chunk store, checked on every read.

A version's data is a :class:`Manifest`: its chunks in order. Every read lands
the chunk's stored bytes and checks each 64 KiB block it touched against the
block's xxh3-64 sum from the catalog *before* the read counts as done: a raw
chunk's bytes are read straight into the caller's buffer in steps of 512 KiB
and each block is hashed right after it landed, while it is still in the CPU
cache (the bytes of a partly-read block outside the caller's range go to a
scratch buffer, so whole blocks are always checked); a compressed chunk is read
whole, checked, then decompressed. A block that does not match, a data file
that is missing or shorter than its chunks, or a stream that does not
decompress raises :class:`ChunkDamage` here, which the engine turns into
:class:`~gpufeed.errors.DamagedObject` naming the bucket, key and chunk.

This is the engine's own code (not a library's) because it is the product's
read path: it decides where bytes land and how many times they are touched.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from ._blobs import pread_full
from ._codecs import decompress_chunk
from .types import ChunkRecord

__all__ = ["Manifest", "ManifestCache", "ChunkDamage", "ReadStep", "run_step", "SUM_BLOCK", "check_stored",
           "chunk_sums"]

#: Bytes covered by one block sum.
SUM_BLOCK = 64 << 10
#: Bytes read between checks (whole blocks; fits a core's L2 cache).
_CHECK_STEP = 8 * SUM_BLOCK


class ChunkDamage(Exception):
    """A chunk failed its check. Attributes: ``chunk`` (its record), ``reason`` (words)."""

    def __init__(self, chunk: ChunkRecord, reason: str) -> None:
        super().__init__(reason)
        self.chunk, self.reason = chunk, reason


def chunk_sums(chunk: ChunkRecord) -> array:
    """The block sums of ``chunk`` as integers (``array('Q')``)."""
    a = array("Q")
    a.frombytes(chunk.sums)
    if sys.byteorder != "little":
        a.byteswap()
    return a


@dataclass(frozen=True, slots=True)
class Manifest:
    """A version's data: ``chunks`` in order, ``starts[i]`` the object offset of
    chunk ``i``, ``size`` the object's length (bytes), ``sums[i]`` chunk i's block sums."""

    blob_id: str
    size: int
    chunks: tuple[ChunkRecord, ...]
    starts: tuple[int, ...]
    sums: tuple[array, ...]

    @classmethod
    def of(cls, blob_id: str, size: int, chunks: list[ChunkRecord]) -> "Manifest":
        starts, pos = [], 0
        for c in chunks:
            starts.append(pos)
            pos += c.size
        return cls(blob_id, size, tuple(chunks), tuple(starts), tuple(chunk_sums(c) for c in chunks))

    @property
    def single_file(self) -> bool:
        """The data is one raw chunk at the start of one file (or empty): the
        file's bytes are the object's bytes, offset for offset."""
        return not self.chunks or (len(self.chunks) == 1 and not self.chunks[0].codec
                                   and self.chunks[0].file_offset == 0)

    @property
    def mappable(self) -> bool:
        """Every chunk is raw and page-aligned (in its file and, but for the last,
        in length): the object can be mapped as files side by side."""
        page = os.sysconf("SC_PAGE_SIZE")
        last = len(self.chunks) - 1
        return all(not c.codec and c.file_offset % page == 0 and (i == last or c.size % page == 0)
                   for i, c in enumerate(self.chunks))

    def locate(self, pos: int) -> int:
        """Index of the chunk holding object offset ``pos`` (``0 <= pos < size``)."""
        return bisect.bisect_right(self.starts, pos) - 1


class ManifestCache:
    """Manifests by blob id (immutable, so never stale): LRU, thread-safe.

    Args:
        capacity: most manifests kept.
    """

    def __init__(self, capacity: int = 8192) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Manifest] = OrderedDict()

    def get(self, blob_id: str) -> Manifest | None:
        with self._lock:
            m = self._items.get(blob_id)
            if m is not None:
                self._items.move_to_end(blob_id)
            return m

    def put(self, m: Manifest) -> None:
        with self._lock:
            self._items[m.blob_id] = m
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget every manifest (a chunk they name was repaired)."""
        with self._lock:
            self._items.clear()

    def forget(self, blob_ids) -> None:
        with self._lock:
            for b in blob_ids:
                self._items.pop(b, None)


@dataclass(slots=True)
class ReadStep:
    """One piece of a read: ``dest`` receives chunk ``chunk``'s data from
    chunk-relative offset ``rel``; ``fd`` is the chunk's data file."""

    fd: int
    chunk: ChunkRecord
    sums: array
    rel: int
    dest: memoryview
    verify: bool


_scratch = threading.local()


def _scratch_buf(n: int) -> memoryview:
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < n:
        buf = _scratch.buf = memoryview(bytearray(max(n, 2 * SUM_BLOCK)))
    return buf[:n]


def run_step(step: ReadStep) -> int:
    """Do one read step: land the bytes in ``step.dest`` and check them.

    Returns:
        ``len(step.dest)``.

    Raises:
        ChunkDamage: a block sum does not match, the file ended early, or a
            compressed chunk does not decompress.
        OSError: the file could not be read.
    """
    c = step.chunk
    if c.codec:
        _read_compressed(step)
    elif not step.verify:
        if pread_full(step.fd, step.dest, c.file_offset + step.rel) < len(step.dest):
            raise ChunkDamage(c, "data file is shorter than the chunk")
    else:
        _read_raw_checked(step)
    return len(step.dest)


def _read_compressed(step: ReadStep) -> None:
    c = step.chunk
    stored = memoryview(bytearray(c.stored))
    if pread_full(step.fd, stored, c.file_offset) < c.stored:
        raise ChunkDamage(c, "data file is shorter than the chunk")
    if step.verify:
        bad = check_stored(stored, step.sums, 0)
        if bad >= 0:
            raise ChunkDamage(c, f"block {bad} does not match its sum")
    n = len(step.dest)
    try:
        if step.rel == 0 and n == c.size:
            decompress_chunk(stored, c.codec, c.size, step.dest)
        else:
            data = decompress_chunk(stored, c.codec, c.size)
            assert data is not None  # without ``out`` the bytes are returned
            step.dest[:] = memoryview(data)[step.rel:step.rel + n]
    except Exception as exc:  # noqa: BLE001 - any failure of the codec is damage
        raise ChunkDamage(c, f"{c.codec} data does not decompress: {exc}") from exc


def check_stored(view: memoryview, sums: array, first_block: int) -> int:
    """Check whole blocks: ``view`` starts at block ``first_block`` of a chunk's
    stored bytes. Returns the index of the first bad block, or -1."""
    got = [_xxh3(view[o:o + SUM_BLOCK]) for o in range(0, len(view), SUM_BLOCK)]
    want = sums[first_block:first_block + len(got)]
    if len(want) == len(got) and want.tolist() == got:
        return -1
    for i, g in enumerate(got):
        if i >= len(want) or want[i] != g:
            return first_block + i
    return first_block + len(got)  # pragma: no cover - unreachable


_xxh3 = xxhash.xxh3_64_intdigest


def _read_raw_checked(step: ReadStep) -> None:
    """Read a raw chunk's range into ``step.dest`` in L2-sized steps, checking each
    whole block right after it landed; a block only partly in the range (first
    or last) is read whole into scratch, checked, and its part copied."""
    c, dest, rel = step.chunk, step.dest, step.rel
    start, end = rel, rel + len(dest)
    if start % SUM_BLOCK:
        b = start // SUM_BLOCK
        blk_end = min((b + 1) * SUM_BLOCK, c.stored)
        hi = min(end, blk_end)
        _check_partial(step, b, b * SUM_BLOCK, start, hi, blk_end)
        start = hi
    whole_end = end if end % SUM_BLOCK == 0 or end == c.stored else end - end % SUM_BLOCK
    while start < whole_end:
        stop = min(whole_end, start + _CHECK_STEP)
        view = dest[start - rel:stop - rel]
        if pread_full(step.fd, view, c.file_offset + start) < len(view):
            raise ChunkDamage(c, "data file is shorter than the chunk")
        bad = check_stored(view, step.sums, start // SUM_BLOCK)
        if bad >= 0:
            raise ChunkDamage(c, f"block {bad} does not match its sum")
        start = stop
    if start < end:
        b = start // SUM_BLOCK
        _check_partial(step, b, b * SUM_BLOCK, start, end, min((b + 1) * SUM_BLOCK, c.stored))


def _check_partial(step: ReadStep, b: int, blk_start: int, lo: int, hi: int, blk_end: int) -> None:
    """Check block ``b`` (chunk offsets ``[blk_start, blk_end)``) of which
    ``[lo, hi)`` goes to ``step.dest``; the rest is read into scratch."""
    c, base = step.chunk, step.chunk.file_offset
    view = step.dest[lo - step.rel:hi - step.rel]
    pre = _scratch_buf(blk_end - blk_start)
    if pread_full(step.fd, pre, base + blk_start) < len(pre):
        raise ChunkDamage(c, "data file is shorter than the chunk")
    if b >= len(step.sums) or xxhash.xxh3_64_intdigest(pre) != step.sums[b]:
        raise ChunkDamage(c, f"block {b} does not match its sum")
    view[:] = pre[lo - blk_start:hi - blk_start]
