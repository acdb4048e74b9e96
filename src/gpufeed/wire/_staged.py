"""Reads into a client's fresh memory through a small reused buffer, written in
by ``pwrite``: what the node does for a region registered ``fresh``
(``Client.alloc_shared``: memory written once, such as a batch tensor).

Mapping fresh memory costs the node more than the copy it saves: every 4 KiB
page is allocated and zeroed by a fault in the node's mapping, entered in its
page tables (once per connection that maps it), and unmapped again when the
region goes. So the node does not map a fresh region: each piece of a read
lands in this thread's :data:`STAGE_BYTES` buffer (in the CPU cache), is
checked against its block sums there by the engine's ordinary read
(:meth:`~gpufeed.engine.ObjectHandle.read_small_or_fall_back`,
:meth:`~gpufeed.engine.ObjectHandle.steps`), and only then is written into the
memfd at its offset with ``os.pwrite``, which fills new pages without zeroing
them first and touches no page table. A piece that fails its check is never
written: the read fails with the engine's ``DamagedObject``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from itertools import accumulate

from ..engine import ChunkDamage, ObjectHandle, run_step
from ..errors import GpufeedError, InternalError, InvalidRange

__all__ = ["STAGE_BYTES", "StagedRead", "Unwritable", "read_to_fd", "read_ranges_to_fd", "run_reads", "split_read"]

#: Bytes read and checked per piece before they are written into the memfd: one
#: engine check step, so each piece is one ``preadv`` and one CRC pass while it
#: is still in the L2 cache.
STAGE_BYTES = 256 << 10  # 256 KiB
#: Bytes of ranges of a large TCP GETR read and checked together before they are sent from the files.
CHECK_BYTES = 4 << 20  # 4 MiB
#: A staged read of at least this many bytes is cut into parts of this size that
#: a :class:`~gpufeed.wire._reads.SplitReader` runs on several threads.
SPLIT_PART_BYTES = 8 << 20  # 8 MiB

_local = threading.local()


class Unwritable(InternalError):
    """The client's memfd refused bytes written into it (no memory left for its pages)."""


def _stage() -> memoryview:
    """This thread's staging buffer (:data:`STAGE_BYTES`, reused)."""
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(bytearray(STAGE_BYTES))
    return buf


def _pwrite_full(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` into ``fd`` at ``offset``.

    Raises:
        Unwritable: the memfd took no bytes, or refused them (no memory left
            for its pages: ``ENOSPC``/``ENOMEM``).
    """
    done = 0
    try:
        while done < len(view):
            k = os.pwrite(fd, view[done:], offset + done)
            if k <= 0:
                raise Unwritable(f"the client's memory took no bytes at offset {offset + done}")
            done += k
    except OSError as exc:
        raise Unwritable(f"cannot write into the client's memory at offset {offset + done}: {exc}") from exc


def read_to_fd(h: ObjectHandle, start: int, n: int, fd: int, offset: int, *, fall_back: bool = True) -> int:
    """Read ``n`` bytes at object offset ``start`` (clipped to the object by the
    caller), checked, into ``fd`` at ``offset``, one :data:`STAGE_BYTES` piece at
    a time (pieces cut at multiples of it in the object, so an aligned read is
    whole blocks each).

    Args:
        fall_back: fetch a chunk that fails its check from another node
            (:meth:`ObjectHandle.fall_back`); ``False`` (reads of one handle
            running on several threads) raises ChunkDamage instead.

    Returns:
        ``n``.

    Raises:
        DamagedObject: a piece failed its check and no other node sent good
            bytes (that piece and the rest were not written).
        ChunkDamage: the same, without ``fall_back``.
        Unwritable: the memfd refused the bytes.
    """
    stage = _stage()
    done = 0
    while done < n:
        pos = start + done
        view = stage[:min(n - done, STAGE_BYTES - pos % STAGE_BYTES)]
        if fall_back:
            if not h.read_small_or_fall_back(pos, view):
                h.run(h.steps(view, pos))
        elif not h.read_small(pos, view):
            for step in h.steps(view, pos):
                run_step(step)
        _pwrite_full(fd, view, offset + done)
        done += len(view)
    return n


#: A staged read: ``(handle, object offset, bytes, memfd, offset in the memfd)``.
StagedRead = tuple[ObjectHandle, int, int, int, int]


def run_reads(reads: list[StagedRead], run_calls: Callable[..., list], *, parallel: bool) -> list[int | GpufeedError]:
    """Run :func:`read_to_fd` reads, on several threads when ``parallel``. There
    each handle's data files are opened first, here, and a read that meets
    damage runs again here, where it may fetch the chunk from another node (a
    handle opens files and falls back on one thread at a time).

    Args:
        reads: the reads.
        run_calls: :meth:`~gpufeed.wire._reads.SplitReader.run_calls`.
        parallel: run them on several threads.

    Returns:
        Each read's bytes, or the GpufeedError it failed with.

    Raises:
        Unwritable: the memfd refused the bytes.
        Exception: any other error than damage.
    """
    if not parallel or len(reads) < 2:
        return [_final(r) for r in reads]
    for h, start, n, _fd, _off in reads:
        _open_files(h, start, n)
    out = run_calls([partial(_caught, r, False) for r in reads], parallel=True)
    return [_final(r) if isinstance(got, ChunkDamage) else got for r, got in zip(reads, out)]


def _final(read: StagedRead) -> int | GpufeedError:
    """:func:`read_to_fd` with fall-back, its failure returned rather than raised."""
    got = _caught(read, True)
    if isinstance(got, ChunkDamage):  # fall-back reads raise DamagedObject; named the same way
        return read[0].damaged(got)
    return got


def _caught(read: StagedRead, fall_back: bool) -> int | GpufeedError | ChunkDamage:
    """:func:`read_to_fd`, its failure returned rather than raised (Unwritable raises)."""
    try:
        return read_to_fd(*read, fall_back=fall_back)
    except Unwritable:
        raise
    except (GpufeedError, ChunkDamage) as exc:
        return exc


def _open_files(h: ObjectHandle, start: int, n: int) -> None:
    """Open the data files of the chunks ``n`` bytes at ``start`` touch (this thread)."""
    if n <= 0:
        return
    m = h.manifest
    for i in range(m.locate(start), m.locate(start + n - 1) + 1):
        h.file_fd(i)


def split_read(h: ObjectHandle, start: int, n: int, fd: int, offset: int, run_calls: Callable[..., list]) -> int:
    """:func:`read_to_fd` of a large read, cut into :data:`SPLIT_PART_BYTES`
    parts run on several threads (:func:`run_reads`).

    Returns:
        ``n``.

    Raises:
        DamagedObject, Unwritable: as :func:`read_to_fd`, for any part.
    """
    parts = [(h, start + pos, min(SPLIT_PART_BYTES, n - pos), fd, offset + pos)
             for pos in range(0, n, SPLIT_PART_BYTES)]
    for got in run_reads(parts, run_calls, parallel=True):
        if isinstance(got, GpufeedError):
            raise got
    return n


def read_ranges_to_fd(h: ObjectHandle, offsets: Sequence[int], lengths: Sequence[int], fd: int,
                      offset: int) -> tuple[list[int], dict[int, GpufeedError]]:
    """:meth:`ObjectHandle.read_ranges` into ``fd`` from ``offset``, ranges packed
    in order: runs of ranges that fit :data:`STAGE_BYTES` are read together into
    the staging buffer and written with one ``pwrite`` (a failed range's bytes are
    not written), in the C loop where it runs (:meth:`ObjectHandle.native_ranges`);
    a longer range, and each range that loop leaves, goes by
    :meth:`ObjectHandle.read_ranges` or :func:`read_to_fd`.

    Returns:
        ``(n, errors)`` as :meth:`ObjectHandle.read_ranges`.

    Raises:
        Unwritable: the memfd refused the bytes.
    """
    starts = list(accumulate(lengths, initial=0))
    try:
        done = h.native_ranges(offsets, lengths, _stage(), fd, offset)
    except OSError as exc:
        raise Unwritable(f"cannot write into the client's memory: {exc}") from exc
    if done is None:
        return _ranges_to_fd(h, offsets, lengths, fd, offset, starts)
    out = done.tolist()
    errors: dict[int, GpufeedError] = {}
    for i in [i for i, k in enumerate(out) if k == -2]:  # the C loop's leftovers, one by one
        got, bad = _ranges_to_fd(h, offsets[i:i + 1], lengths[i:i + 1], fd, offset + starts[i], [0, lengths[i]])
        out[i] = got[0]
        errors.update((i, exc) for exc in bad.values())
    return out, errors


def _ranges_to_fd(h: ObjectHandle, offsets: Sequence[int], lengths: Sequence[int], fd: int, offset: int,
                  starts: list[int]) -> tuple[list[int], dict[int, GpufeedError]]:
    """:func:`read_ranges_to_fd` through :meth:`ObjectHandle.read_ranges` (``starts``:
    each range's place from ``offset``, then their end)."""
    out: list[int] = []
    errors: dict[int, GpufeedError] = {}
    size, count, i = h.info.size, len(lengths), 0
    while i < count:
        j = i
        while j < count and starts[j + 1] - starts[i] <= STAGE_BYTES:
            j += 1
        if j == i:  # one range longer than the buffer
            out.append(_long_range(h, offsets[i], lengths[i], size, fd, offset + starts[i], errors, i))
            i += 1
            continue
        view = _stage()[:starts[j] - starts[i]]
        got, bad = h.read_ranges(offsets[i:j], lengths[i:j], view)
        out += got
        errors.update((i + k, exc) for k, exc in bad.items())
        if got == list(lengths[i:j]):  # all whole: one write
            _pwrite_full(fd, view, offset + starts[i])
        else:  # only what each range delivered (the buffer's other bytes are another read's)
            for k, m in enumerate(got):
                if m > 0:
                    rel = starts[i + k] - starts[i]
                    _pwrite_full(fd, view[rel:rel + m], offset + starts[i + k])
        i = j
    return out, errors


def range_extents(h: ObjectHandle, offsets: Sequence[int], lengths: Sequence[int]
                  ) -> tuple[list[int], dict[int, GpufeedError], list]:
    """A TCP GETR too large to buffer: each range as checked pieces to send
    (:meth:`ObjectHandle.extents`: ``(fd, file offset, length)`` for ``sendfile``).
    On a one-file raw object, runs of ranges up to :data:`CHECK_BYTES` are first
    read and checked together in the C loop (:meth:`ObjectHandle.native_ranges`)
    into a reused buffer, and each range that passed is sent from the file as
    it is; the others go through :meth:`ObjectHandle.extents`, which says what
    is wrong.

    Returns:
        ``(n, errors, pieces)``: bytes per range (-1: failed, its error in ``errors``)
        and the pieces of the ranges that did not fail, in order.
    """
    size = h.info.size
    n, errors, pieces = [0] * len(offsets), {}, []
    checked = _checked_in_c(h, offsets, lengths) if h.fd >= 0 else None
    for i, (start, want) in enumerate(zip(offsets, lengths)):
        try:
            if start > size or (want and start == size):
                raise InvalidRange(f"offset {start} is outside the object ({size} bytes)")
            k = min(want, size - start)
            if checked is not None and checked[i] == k > 0:
                pieces.append((h.fd, start, k))  # a one-file object: file offsets are object offsets
            else:
                pieces += h.extents(start, k)
            n[i] = k
        except GpufeedError as exc:
            n[i], errors[i] = -1, exc
    return n, errors, pieces


def _checked_in_c(h: ObjectHandle, offsets: Sequence[int], lengths: Sequence[int]) -> list[int] | None:
    """The bytes of each range that the C loop read and checked (-2: it did not),
    in runs of up to :data:`CHECK_BYTES` into this thread's check buffer; ``None``
    when the loop cannot run here."""
    buf = getattr(_local, "check", None)
    if buf is None:
        buf = _local.check = memoryview(bytearray(CHECK_BYTES))
    out: list[int] = []
    i, count = 0, len(lengths)
    while i < count:
        j, total = i, 0
        while j < count and total + lengths[j] <= CHECK_BYTES:
            total += lengths[j]
            j += 1
        if j == i:  # one range longer than the buffer: the careful path
            out.append(-2)
            i += 1
            continue
        done = h.native_ranges(offsets[i:j], lengths[i:j], buf)
        if done is None:
            return None
        out += done.tolist()
        i = j
    return out


def _long_range(h: ObjectHandle, start: int, want: int, size: int, fd: int, offset: int,
                errors: dict[int, GpufeedError], index: int) -> int:
    """One range of :func:`read_ranges_to_fd` longer than the staging buffer."""
    if start < 0 or start > size or (want and start == size):
        errors[index] = InvalidRange(f"offset {start} is outside the object ({size} bytes)")
        return -1
    try:
        return read_to_fd(h, start, min(want, size - start), fd, offset)
    except Unwritable:
        raise
    except GpufeedError as exc:
        errors[index] = exc
        return -1
