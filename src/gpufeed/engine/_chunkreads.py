"""Reading object data from the chunk store, checked on every read.

A version's data is a :class:`Manifest`: its chunks in order. Every read lands
the chunk's stored bytes and checks them against the chunk's block sums from
the catalog (:mod:`._blocksums`) *before* the read counts as done:

* a raw chunk's range is read straight into the caller's buffer in steps of
  256 KiB (one ``preadv`` each), each step's bytes CRC'd right after they
  landed, while they are still in the CPU cache; the bytes of the partly-read
  4 KiB blocks at either end land in scratch buffers in the same ``preadv``, so
  whole blocks are always checked. The run's CRC is compared once, at the end,
  with the value its two bounding sums give (one combine);
* a compressed chunk is read whole, checked, then decompressed.

A block that does not match, a data file that is missing or shorter than its
chunks, or a stream that does not decompress raises :class:`ChunkDamage` here,
which the engine turns into :class:`~gpufeed.errors.DamagedObject` naming the
bucket, key and chunk. Chunks with legacy sums (xxh3-64 per 64 KiB block) are
checked block by block in the same way.

This is the engine's own code (not a library's) because it is the product's
read path: it decides where bytes land and how many times they are touched.
"""

from __future__ import annotations

import bisect
import os
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from ._blobs import pread_full
from ._blocksums import (
    LEGACY_SUM_BLOCK,
    LEGACY_SUM_KIND,
    SUM_BLOCK,
    check_run,
    crc32c,
    first_bad_block,
    run_expected,
    sums_array,
)
from ._codecs import decompress_chunk
from .types import ChunkRecord

__all__ = ["Manifest", "ManifestCache", "ChunkDamage", "ReadStep", "run_step", "STEP_ALIGN", "check_stored",
           "chunk_sums", "whole_blocks", "read_whole_blocks", "SMALL_STEP"]

#: Read steps are cut at multiples of this (whole blocks of every sum kind).
STEP_ALIGN = LEGACY_SUM_BLOCK
#: Bytes read between CRC passes: small enough to be CRC'd from the L2 cache after
#: the copy lands (measured 40 GB/s at 256 KiB, 27 at 512 KiB), a multiple of every sum block.
_CHECK_STEP = 4 * LEGACY_SUM_BLOCK
#: The largest read of whole blocks that takes one ``preadv`` and one CRC
#: (:func:`read_whole_blocks`): one check step.
SMALL_STEP = _CHECK_STEP


class ChunkDamage(Exception):
    """A chunk failed its check. Attributes: ``chunk`` (its record), ``reason`` (words)."""

    def __init__(self, chunk: ChunkRecord, reason: str) -> None:
        super().__init__(reason)
        self.chunk, self.reason = chunk, reason


def chunk_sums(chunk: ChunkRecord) -> array:
    """The block sums of ``chunk`` as integers (``array('I')``, or ``array('Q')``
    for legacy sums: :func:`~._blocksums.sums_array`)."""
    return sums_array(chunk.sums, chunk.sum_kind)


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
    """Manifests by blob id (immutable, so never stale): LRU, thread-safe,
    bounded in count and in the bytes of block sums held (a 1 GiB raw object's
    manifest holds 1 MiB of sums).

    Args:
        capacity: most manifests kept.
        max_bytes: most bytes of block sums kept (a larger manifest is not kept).
    """

    def __init__(self, capacity: int = 8192, max_bytes: int = 256 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Manifest] = OrderedDict()

    def get(self, blob_id: str) -> Manifest | None:
        with self._lock:
            m = self._items.get(blob_id)
            if m is not None:
                self._items.move_to_end(blob_id)
            return m

    def put(self, m: Manifest) -> None:
        cost = _sums_bytes(m)
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(m.blob_id, None)
            if old is not None:
                self._bytes -= _sums_bytes(old)
            self._items[m.blob_id] = m
            self._bytes += cost
            while len(self._items) > self.capacity or self._bytes > self.max_bytes:
                self._bytes -= _sums_bytes(self._items.popitem(last=False)[1])

    def clear(self) -> None:
        """Forget every manifest (a chunk they name was repaired)."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def forget(self, blob_ids) -> None:
        with self._lock:
            for b in blob_ids:
                m = self._items.pop(b, None)
                if m is not None:
                    self._bytes -= _sums_bytes(m)


def _sums_bytes(m: Manifest) -> int:
    return sum(len(a) * a.itemsize for a in m.sums)


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


def _scratch_buf(n: int, which: str = "buf") -> memoryview:
    """This thread's scratch buffer ``which``, at least ``n`` bytes (reused)."""
    buf = getattr(_scratch, which, None)
    if buf is None or len(buf) < n:
        buf = memoryview(bytearray(max(n, 2 * LEGACY_SUM_BLOCK)))
        setattr(_scratch, which, buf)
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
    elif c.sum_kind == LEGACY_SUM_KIND:
        _read_raw_checked_legacy(step)
    else:
        _read_raw_checked(step)
    return len(step.dest)


def _read_compressed(step: ReadStep) -> None:
    c = step.chunk
    stored = memoryview(bytearray(c.stored))
    if pread_full(step.fd, stored, c.file_offset) < c.stored:
        raise ChunkDamage(c, "data file is shorter than the chunk")
    if step.verify:
        bad = check_stored(stored, step.sums, 0, c.sum_kind)
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


def check_stored(view: memoryview, sums: array, first_block: int, kind: int) -> int:
    """Check whole blocks: ``view`` starts at block ``first_block`` of a chunk's
    stored bytes and ends at a block end or the chunk's end; ``sums`` and
    ``kind`` are the chunk's. Returns the index of the first bad block, or -1."""
    if kind == LEGACY_SUM_KIND:
        return _check_legacy(view, sums, first_block)
    return check_run((view,), sums, first_block, len(view))


def _preadv_rest(fd: int, bufs: list[memoryview], offset: int, got: int) -> int:
    """After a ``preadv`` into ``bufs`` at ``offset`` that returned ``got`` bytes
    (short: a signal, or the file ends), read the rest buffer by buffer until
    they are full or the file ends; returns the bytes read in all."""
    done = max(got, 0)
    skip = done
    for buf in bufs:
        if skip >= len(buf):
            skip -= len(buf)
            continue
        k = pread_full(fd, buf[skip:], offset + done)
        done += k
        if k < len(buf) - skip:
            return done
        skip = 0
    return done


def _read_raw_checked(step: ReadStep) -> None:
    """Read a raw chunk's range into ``step.dest`` in L2-sized ``preadv`` steps,
    the partly-wanted 4 KiB blocks at either end into scratch in the same calls,
    CRC'ing each step's bytes as they land; then compare the run's CRC with the
    one its bounding sums give."""
    c, dest, rel = step.chunk, step.dest, step.rel
    n = len(dest)
    if not n:
        return
    if whole_blocks(c, rel, n):
        read_whole_blocks(step.fd, c, step.sums, rel, dest)
        return
    a = rel - rel % SUM_BLOCK
    b = min(rel + n + (-(rel + n)) % SUM_BLOCK, c.stored)
    first, last = a // SUM_BLOCK, -(-b // SUM_BLOCK)
    if last > len(step.sums):
        raise ChunkDamage(c, f"the chunk has sums for {len(step.sums)} blocks, the read needs {last}")
    head = _scratch_buf(rel - a, "head") if rel > a else None
    tail = _scratch_buf(b - rel - n, "tail") if b > rel + n else None
    fd, pos, done, crc = step.fd, c.file_offset + a, 0, 0
    while done < n:
        cut = min(n, done + _CHECK_STEP)
        bufs = [dest[done:cut]]
        if done == 0 and head is not None:
            bufs.insert(0, head)
        if cut == n and tail is not None:
            bufs.append(tail)
        want = (cut - done) + (rel - a if done == 0 else 0) + (b - rel - n if cut == n else 0)
        got = os.preadv(fd, bufs, pos)
        if got != want and _preadv_rest(fd, bufs, pos, got) < want:
            raise ChunkDamage(c, "data file is shorter than the chunk")
        for x in bufs:
            crc = crc32c(x, crc)
        pos += want
        done = cut
    bad = check_run([x for x in (head, dest, tail) if x is not None], step.sums, first, b - a, crc)
    if bad >= 0:
        raise ChunkDamage(c, f"block {bad} does not match its sum")


def whole_blocks(c: ChunkRecord, rel: int, n: int) -> bool:
    """``n`` bytes at ``rel`` of raw chunk ``c`` are whole 4 KiB blocks (or run to
    the chunk's end) and fit one check step: :func:`read_whole_blocks` reads them."""
    return (rel % SUM_BLOCK == 0 and 0 < n <= SMALL_STEP and rel + n <= c.stored
            and (n % SUM_BLOCK == 0 or rel + n == c.stored))


def read_whole_blocks(fd: int, c: ChunkRecord, sums: array, rel: int, dest: memoryview) -> None:
    """The common small read (a 4 KiB sample, a KV block): ``len(dest)`` bytes at
    ``rel`` of raw chunk ``c`` (its data file open as ``fd``, its running CRC32C
    ``sums``), when :func:`whole_blocks` holds: one ``preadv`` into ``dest`` and one
    CRC compared with the run's expected CRC, no scratch buffers.

    Raises:
        ChunkDamage: the bytes do not match their sums, or the file is short.
        OSError: the file could not be read.
    """
    n = len(dest)
    first = rel // SUM_BLOCK
    last = first + -(-n // SUM_BLOCK)
    if last > len(sums):
        raise ChunkDamage(c, f"the chunk has sums for {len(sums)} blocks, the read needs {last}")
    pos = c.file_offset + rel
    got = os.preadv(fd, [dest], pos)
    if got != n and _preadv_rest(fd, [dest], pos, got) < n:
        raise ChunkDamage(c, "data file is shorter than the chunk")
    if crc32c(dest) != run_expected(sums, first, last, n):
        bad = first_bad_block((dest,), sums, first)
        raise ChunkDamage(c, f"block {bad if bad >= 0 else first} does not match its sum")


# Legacy sums: xxh3-64 per 64 KiB block -------------------------------------------

_xxh3 = xxhash.xxh3_64_intdigest


def _check_legacy(view: memoryview, sums: array, first_block: int) -> int:
    got = [_xxh3(view[o:o + LEGACY_SUM_BLOCK]) for o in range(0, len(view), LEGACY_SUM_BLOCK)]
    want = sums[first_block:first_block + len(got)]
    if len(want) == len(got) and want.tolist() == got:
        return -1
    for i, g in enumerate(got):
        if i >= len(want) or want[i] != g:
            return first_block + i
    return first_block + len(got)  # pragma: no cover - unreachable


def _read_raw_checked_legacy(step: ReadStep) -> None:
    """Read a raw chunk with legacy sums into ``step.dest`` in L2-sized steps,
    checking each whole 64 KiB block right after it landed; a block only partly
    in the range (first or last) is read whole into scratch, checked, and its
    part copied."""
    c, dest, rel = step.chunk, step.dest, step.rel
    blk = LEGACY_SUM_BLOCK
    start, end = rel, rel + len(dest)
    if start % blk:
        b = start // blk
        blk_end = min((b + 1) * blk, c.stored)
        hi = min(end, blk_end)
        _check_partial_legacy(step, b, b * blk, start, hi, blk_end)
        start = hi
    whole_end = end if end % blk == 0 or end == c.stored else end - end % blk
    while start < whole_end:
        stop = min(whole_end, start + _CHECK_STEP)
        view = dest[start - rel:stop - rel]
        if pread_full(step.fd, view, c.file_offset + start) < len(view):
            raise ChunkDamage(c, "data file is shorter than the chunk")
        bad = _check_legacy(view, step.sums, start // blk)
        if bad >= 0:
            raise ChunkDamage(c, f"block {bad} does not match its sum")
        start = stop
    if start < end:
        b = start // blk
        _check_partial_legacy(step, b, b * blk, start, end, min((b + 1) * blk, c.stored))


def _check_partial_legacy(step: ReadStep, b: int, blk_start: int, lo: int, hi: int, blk_end: int) -> None:
    """Check legacy block ``b`` (chunk offsets ``[blk_start, blk_end)``) of which
    ``[lo, hi)`` goes to ``step.dest``; the rest is read into scratch."""
    c, base = step.chunk, step.chunk.file_offset
    view = step.dest[lo - step.rel:hi - step.rel]
    pre = _scratch_buf(blk_end - blk_start)
    if pread_full(step.fd, pre, base + blk_start) < len(pre):
        raise ChunkDamage(c, "data file is shorter than the chunk")
    if b >= len(step.sums) or _xxh3(pre) != step.sums[b]:
        raise ChunkDamage(c, f"block {b} does not match its sum")
    view[:] = pre[lo - blk_start:hi - blk_start]
