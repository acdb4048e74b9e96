"""Open object versions: a version's manifest and the shared descriptors of its
data files, read through the checked steps of :mod:`._chunkreads`.

A data file is immutable and never truncated, so one open descriptor serves
every reader (see :mod:`._openfiles`); a handle holds a reference to each file
it touched until :meth:`ObjectHandle.close`, so its version stays readable
after overwrites and deletes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np
from awscrt.checksums import crc32c

from .. import _native
from ..errors import DamagedObject, GpufeedError, HolderUnavailable, InvalidArgument, InvalidRange, NoSuchKey
from ._blocksums import SUM_BLOCK, SUM_KIND
from ._chunkreads import SMALL_STEP, STEP_ALIGN, ChunkDamage, Manifest, ReadStep, read_whole_blocks, run_step
from ._openfiles import OpenFile, OpenFiles
from ._partial import PartialChunk, fetches_in_windows
from ._remote import fetch_chunk
from .types import ObjectInfo

if TYPE_CHECKING:
    from ._chunks import ChunkStore

__all__ = ["ObjectHandle", "MAX_STEP"]

log = logging.getLogger("gpufeed.engine")

#: Largest read step; large reads are cut into steps of this size (whole blocks)
#: so they can run on several threads.
MAX_STEP = 16 << 20
#: Largest verified piece :meth:`ObjectHandle.extents` checks at once.
_EXTENT_STEP = 8 << 20


_local = threading.local()


def _check_buf(n: int) -> memoryview:
    """This thread's buffer that checked bytes land in when only the check matters."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < n:
        buf = _local.buf = memoryview(bytearray(max(n, 1 << 20)))
    return buf[:n]


class ObjectHandle:
    """An object version opened for reading: its metadata, its manifest and the
    open data files it needs. Reads are checked against the stored block sums
    (unless the bucket opted out) before they count as done.

    Use as a context manager or call :meth:`close`.

    Attributes:
        info: the version's metadata (:class:`~gpufeed.engine.ObjectInfo`).
        manifest: its chunks (:class:`~gpufeed.engine._chunkreads.Manifest`).
        verify: whether reads are checked.
        fd: the one data file's descriptor when the object is one raw chunk at
            the start of one file (file offsets are object offsets), else -1;
            never close it yourself.
    """

    __slots__ = ("info", "manifest", "verify", "fd", "_files", "_held", "_store", "_fds", "_remote", "_partial")

    def __init__(self, info: ObjectInfo, manifest: Manifest, verify: bool, files: OpenFiles,
                 store: "ChunkStore") -> None:
        self.info, self.manifest, self.verify = info, manifest, verify
        self._files, self._store = files, store
        self._held: dict[str, OpenFile] = {}
        self._fds: dict[int, int] = {}  # chunk index -> checked descriptor (read_small)
        self._remote: dict[str, int] = {}  # chunk id -> its bytes fetched from its holder (:mod:`._remote`)
        self._partial: dict[str, PartialChunk] = {}  # chunk id -> fetched in windows (:mod:`._partial`)
        self.fd = -1
        if manifest.chunks and manifest.single_file:  # other chunks' files open as reads need them, so a
            self.fd = self.file_fd(0)  # damaged one fails only the reads (and ranges) in it

    # files ----------------------------------------------------------------------
    def file_fd(self, index: int) -> int:
        """The descriptor of chunk ``index``'s data file (opened on first use; a
        chunk another cluster node holds is fetched from it and checked, :mod:`._remote`,
        as is one whose file here is missing, short or damaged, :meth:`fall_back`).

        Raises:
            DamagedObject: the file is missing or shorter than the chunk, and no
                other node sent good bytes of it, or the bytes a holder sent fail their check.
            HolderUnavailable: the chunk's holder is not live or did not answer in time.
            NoSuchKey: the version was deleted before its file was opened.
        """
        c = self.manifest.chunks[index]
        fd = self._remote.get(c.chunk_id)
        if fd is not None:
            return fd
        f = self._held.get(c.file)
        if f is None and self._store.held_elsewhere(c):
            try:  # a copy of it here (a present data file is always whole and checked)
                f = self._files.acquire(c.file, self._store.file_path(c.file))
            except FileNotFoundError:
                if fetches_in_windows(c):  # a large raw chunk: each read fetches the windows it needs
                    pc = self._partial[c.chunk_id] = PartialChunk(self._store, c, self.info.bucket, self.info.key)
                    fd = self._remote[c.chunk_id] = pc.fd
                else:
                    fd = self._remote[c.chunk_id] = fetch_chunk(self._store, c, self.info.bucket, self.info.key)
                return fd
            self._held[c.file] = f
            f.size = os.fstat(f.fd).st_size
        if f is None:
            try:
                f = self._files.acquire(c.file, self._store.file_path(c.file))
            except FileNotFoundError:
                if self._store.manifest_alive(self.manifest.blob_id):
                    return self._fall_back_or_raise(ChunkDamage(c, "data file is missing"))
                raise NoSuchKey(f"{self.info.bucket}/{self.info.key} was deleted while being read",
                                bucket=self.info.bucket, key=self.info.key) from None
            self._held[c.file] = f
            st = os.fstat(f.fd)  # now, not when the cache opened it: the file may have changed since
            if st.st_nlink == 0 and self._store.manifest_alive(self.manifest.blob_id):
                return self._fall_back_or_raise(ChunkDamage(c, "data file was deleted"))
            f.size = st.st_size
        if c.file_offset + c.stored > f.size:
            return self._fall_back_or_raise(ChunkDamage(c, f"data file has {f.size} bytes, the chunk needs "
                                                           f"{c.file_offset + c.stored}"))
        return f.fd

    def _ensure(self, index: int, rel: int, n: int) -> None:
        """Make sure bytes ``[rel, rel + n)`` of chunk ``index`` are here when it
        is fetched window by window (:mod:`._partial`; raises as its ``ensure``)."""
        pc = self._partial.get(self.manifest.chunks[index].chunk_id)
        if pc is not None:
            pc.ensure(rel, n)

    def fall_back(self, exc: ChunkDamage) -> int | None:
        """After chunk ``exc.chunk`` failed its check in this node's own data file
        (held here, or a copy): fetch it, checked, from another node that holds
        it (:func:`._remote.fetch_chunk`), read it from there from now on, mark
        it damaged (held here; not counted as a refused read) and ask for a
        repair of the file here (:mod:`._repair`), which clears the mark.

        Returns:
            The fetched chunk's descriptor; ``None`` when this node fetches from
            no other node, or none sent good bytes (logged).
        """
        c, store = exc.chunk, self._store
        if store.remote is None or c.chunk_id in self._remote or not c.file:
            return None
        try:
            if not [n for n in store.holders(c) if n and n != store.holder]:
                return None
            fd = self._remote[c.chunk_id] = fetch_chunk(store, c, self.info.bucket, self.info.key)
        except (HolderUnavailable, DamagedObject) as err:
            log.warning("chunk %s is damaged here and no other node sent it: %s", c.chunk_id, err.message)
            return None
        self._fds = {i: d for i, d in self._fds.items() if self.manifest.chunks[i].chunk_id != c.chunk_id}
        log.warning("chunk %s is damaged here (%s); read from another node, repair asked", c.chunk_id, exc.reason)
        if not store.held_elsewhere(c):
            store.report_damage(c.chunk_id, exc.reason, counted=False)
        if store.repair is not None:
            store.repair(c.file)
        return fd

    def _fall_back_or_raise(self, exc: ChunkDamage) -> int:
        """The chunk's descriptor from :meth:`fall_back`, else raise the
        DamagedObject (:meth:`damaged`)."""
        fd = self.fall_back(exc)
        if fd is None:
            raise self.damaged(exc)
        return fd

    # reads ----------------------------------------------------------------------
    def steps(self, dest: memoryview, start: int, max_step: int = MAX_STEP) -> list[ReadStep]:
        """Plan a read of ``len(dest)`` bytes from object offset ``start`` into
        ``dest`` (a byte view; the caller clipped it to the object): one step per
        chunk touched, raw ranges cut at block boundaries into steps of at most
        ``max_step`` bytes.

        Raises:
            DamagedObject: a data file is missing or short.
        """
        m = self.manifest
        out: list[ReadStep] = []
        n = len(dest)
        if n == 0:
            return out
        i = m.locate(start)
        pos = start
        end = start + n
        step_len = max(STEP_ALIGN, max_step - max_step % STEP_ALIGN)
        while pos < end:
            c = m.chunks[i]
            if not self.verify and c.chunk_id in self._store.damaged:  # unchecked reads never serve it
                raise self.damaged(ChunkDamage(c, "the chunk is marked damaged (see gpufeed scrub)"))
            fd = self.file_fd(i)
            rel = pos - m.starts[i]
            stop = min(end, m.starts[i] + c.size)
            if self._partial:
                self._ensure(i, rel, stop - pos)
            while pos < stop:
                cut = stop if c.codec else min(stop, m.starts[i] + (rel // step_len + 1) * step_len)
                out.append(ReadStep(fd, c, m.sums[i], rel, dest[pos - start:cut - start], self.verify))
                rel += cut - pos
                pos = cut
            i += 1
        return out

    def read_small(self, start: int, dest: memoryview) -> bool:
        """Read ``len(dest)`` bytes at object offset ``start`` (clipped to the
        object by the caller) into ``dest`` at once, when they are whole 4 KiB
        blocks of one checked raw chunk (or run to its end), at most one check
        step: one ``preadv`` and one CRC, none of :meth:`steps`' planning. The
        small read of a batch (GETV) or a sample.

        Returns:
            ``True`` when read and checked; ``False`` (nothing read) for any other
            read: plan it with :meth:`steps`.

        Raises:
            ChunkDamage: the bytes do not match their sums, or the file is short
                (the caller reports it through :meth:`damaged`).
            DamagedObject: the data file is missing.
        """
        # One function on purpose: a batch of 4 KiB items runs this once per item,
        # and each Python call saved is ~0.3 µs (whole_blocks and
        # read_whole_blocks, inlined here, are the reference).
        m = self.manifest
        if not self.verify or not m.chunks:
            return False
        i = bisect_right(m.starts, start) - 1
        c = m.chunks[i]
        rel = start - m.starts[i]
        n = len(dest)
        if (c.codec or c.sum_kind != SUM_KIND or rel % SUM_BLOCK or not 0 < n <= SMALL_STEP
                or rel + n > c.stored or (n % SUM_BLOCK and rel + n != c.stored)):
            return False
        fd = self._fds.get(i)  # file_fd's answer, remembered per chunk
        if fd is None:
            fd = self._fds[i] = self.file_fd(i)
        if self._partial:
            self._ensure(i, rel, n)
        sums = m.sums[i]
        first = rel // SUM_BLOCK
        last = first + -(-n // SUM_BLOCK)
        if last > len(sums):
            raise ChunkDamage(c, f"the chunk has sums for {len(sums)} blocks, the read needs {last}")
        if os.preadv(fd, [dest], c.file_offset + rel) != n:
            read_whole_blocks(fd, c, sums, rel, dest)  # short: the careful path says why
            return True
        # the running CRC continued over these bytes from the block before them
        if crc32c(dest, sums[first - 1] if first else 0) != sums[last - 1]:
            read_whole_blocks(fd, c, sums, rel, dest)  # raises ChunkDamage naming the block
        return True

    def read_ranges(self, offsets: Sequence[int], lengths: Sequence[int], dest: memoryview,
                    runner: Callable[[list[ReadStep]], Iterable[int]] | None = None
                    ) -> tuple[list[int], dict[int, GpufeedError]]:
        """Read many ranges of this version, each checked, into ``dest``: range
        ``i`` (``lengths[i]`` bytes at object offset ``offsets[i]``, cut at the
        object's end) lands at ``dest[sum(lengths[:i]):]``, the ranges packed in
        order. The ranges in raw chunks run in one C loop with the interpreter
        lock released once for the batch (per piece of a range in one chunk,
        one ``preadv`` of its whole 4 KiB blocks, the range's bytes landing in
        ``dest``, and one CRC32C continued from the previous block's running
        sum, :mod:`._blocksums`) where :mod:`gpufeed._native` is built; every
        other range, and every range without it, goes through
        :meth:`read_small` or :meth:`steps`. Each range fails alone.

        Args:
            offsets, lengths: bytes offsets (>= 0) and lengths (>= 0), one per range.
            dest: a writable byte view of at least ``sum(lengths)`` bytes.
            runner: as for :meth:`run`, for ranges planned as steps.

        Returns:
            ``(n, errors)``: bytes delivered per range, -1 for a failed one, whose
            typed error is ``errors[i]`` (``InvalidRange``: it starts at or past
            the end (one byte or more; an empty object included); ``DamagedObject``: a chunk failed its
            check and is marked damaged: that range's bytes must not be used).
        """
        out = [0] * len(offsets)
        errors: dict[int, GpufeedError] = {}
        todo: Iterable[int] = range(len(offsets))
        done = self.native_ranges(offsets, lengths, dest)
        if done is not None:
            out = done.tolist()
            todo = [i for i, k in enumerate(out) if k == -2]  # the C loop's leftovers, served below
            if not todo:
                return out, errors
        size = self.info.size
        starts = list(accumulate(lengths, initial=0))
        todo = self._from_whole_chunks(todo, offsets, lengths, dest, starts, out, errors, runner)
        for i in todo:
            start, pos = offsets[i], starts[i]
            want = lengths[i]
            if start < 0 or start > size or (want and start == size):
                errors[i] = InvalidRange(f"offset {start} is outside the object ({size} bytes)")
                out[i] = -1
                continue
            n = min(want, size - start)
            view = dest[pos:pos + n]
            try:
                if not self.read_small_or_fall_back(start, view):
                    self.run(self.steps(view, start), runner)
                out[i] = n
            except GpufeedError as exc:
                errors[i], out[i] = exc, -1
        return out, errors

    def _from_whole_chunks(self, todo: Iterable[int], offsets: Sequence[int], lengths: Sequence[int],
                           dest: memoryview, starts: list[int], out: list[int], errors: dict[int, GpufeedError],
                           runner: Callable[[list[ReadStep]], Iterable[int]] | None) -> list[int]:
        """Serve the ranges of ``todo`` that lie inside one compressed chunk with at
        least one other: each such chunk is read, checked and decompressed once
        (one at a time, so at most one chunk's bytes are held) and its ranges copied
        from it; a chunk that fails fails its ranges. Returns the ranges left."""
        m, size = self.manifest, self.info.size
        groups: dict[int, list[int]] = {}
        left: list[int] = []
        for i in todo:
            start, want = offsets[i], lengths[i]
            if 0 <= start < size and want > 0:
                c = m.locate(start)
                if m.chunks[c].codec and min(start + want, size) <= m.starts[c] + m.chunks[c].size:
                    groups.setdefault(c, []).append(i)
                    continue
            left.append(i)
        for c, ranges in groups.items():
            if len(ranges) == 1:
                left += ranges
                continue
            plain = memoryview(bytearray(m.chunks[c].size))
            try:
                self.run(self.steps(plain, m.starts[c]), runner)
            except GpufeedError as exc:
                for i in ranges:
                    errors[i], out[i] = exc, -1
                continue
            for i in ranges:
                rel, n = offsets[i] - m.starts[c], min(lengths[i], size - offsets[i])
                dest[starts[i]:starts[i] + n] = plain[rel:rel + n]
                out[i] = n
        return sorted(left)

    def native_ranges(self, offsets: Sequence[int], lengths: Sequence[int], dest: memoryview,
                      fd: int = -1, fd_offset: int = 0) -> array | None:
        """:meth:`read_ranges`' C loop (:mod:`gpufeed._native`): ``array('q')`` of bytes
        per range, -2 for one it left to the careful path (a compressed chunk or one
        with legacy sums, a data file that cannot be opened, a failed check, past
        the end); ``None`` when it cannot run here (not built, unchecked reads,
        chunks fetched from another node, negative offsets or lengths past 4 GiB).
        With ``fd`` >= 0 the ranges go to that file, packed from ``fd_offset``, and
        ``dest`` is the staging buffer (a range longer than it is left, -2).

        Raises:
            OSError: a write to ``fd`` failed.
        """
        m = self.manifest
        if (_native.read_ranges is None or not self.verify or self._partial or self._remote or not m.chunks
                or not len(offsets)):
            return None
        try:
            offs, lens = _column("Q", offsets), _column("I", lengths)
        except OverflowError:
            return None
        done = array("q", bytes(8 * len(offs)))
        if len(m.chunks) == 1:  # one chunk (every raw object written whole): its row, its sums as they are
            c = m.chunks[0]
            if not self._raw_with_sums(0):
                return None
            try:
                row = array("q", (0, c.size, self.file_fd(0), c.file_offset, 0))
            except GpufeedError:
                return None  # the careful path raises it for each range
            if self._remote or self._partial:  # fetched from another node: the careful path reads it
                return None
            _native.read_ranges(row, m.sums[0], offs, lens, dest, done, fd, fd_offset)
            return done
        table = np.zeros((len(m.chunks), 5), dtype=np.int64)
        table[:, 0] = m.starts
        table[:, 1] = [c.size for c in m.chunks]
        table[:, 2] = -1
        sums = array("I")
        for i in self._touched(np.frombuffer(offs, dtype=np.uint64), np.frombuffer(lens, dtype=np.uint32)):
            c = m.chunks[i]
            if not self._raw_with_sums(i):
                continue
            try:
                chunk_fd = self.file_fd(i)
            except GpufeedError:
                continue  # the careful path raises it for each range that needs the chunk
            if self._remote or self._partial:  # it was fetched from another node: the careful path reads it
                return None
            table[i, 2:] = (chunk_fd, c.file_offset, len(sums))
            sums.extend(m.sums[i])
        _native.read_ranges(table, sums, offs, lens, dest, done, fd, fd_offset)
        return done

    def _raw_with_sums(self, index: int) -> bool:
        """Whether chunk ``index`` is stored raw with a running CRC32C per 4 KiB block
        (what the C loop reads)."""
        c, sums = self.manifest.chunks[index], self.manifest.sums[index]
        return not c.codec and c.sum_kind == SUM_KIND and c.stored == c.size and len(sums) == -(-c.size // SUM_BLOCK)

    def _touched(self, offsets: np.ndarray, lengths: np.ndarray) -> list[int]:
        """Indices of the chunks that ranges at ``offsets`` of ``lengths`` bytes touch."""
        edges = np.asarray(self.manifest.starts, dtype=np.uint64)
        first = np.searchsorted(edges, offsets, side="right") - 1
        ends = np.minimum(offsets + np.maximum(lengths.astype(np.uint64), 1) - 1, max(self.info.size, 1) - 1)
        last = np.maximum(np.searchsorted(edges, ends, side="right") - 1, first)
        if (last - first <= 1).all():
            return sorted(set(first.tolist()) | set(last.tolist()))
        return sorted({i for a, b in zip(first.tolist(), last.tolist()) for i in range(a, b + 1)})

    def run(self, steps: list[ReadStep], runner: Callable[[list[ReadStep]], Iterable[int]] | None = None) -> int:
        """Run read steps (``runner(steps)`` runs them, e.g. on several threads;
        default: one after another here). A chunk that fails its check in this
        node's own file is read from another node that holds it, when one
        sends good bytes (:meth:`fall_back`), and the steps run again.

        Returns:
            Bytes read.

        Raises:
            DamagedObject: a chunk failed its check (it is marked damaged); the
                destination may hold unchecked bytes and must not be used.
        """
        if self._remote:  # steps planned before a chunk fell back read it from there
            steps = [dataclasses.replace(s, fd=self._remote[s.chunk.chunk_id])
                     if s.chunk.chunk_id in self._remote else s for s in steps]
        while True:  # each round: one more damaged chunk read from another node instead
            try:
                if runner is None:
                    return sum(run_step(s) for s in steps)
                return sum(runner(steps))
            except ChunkDamage as exc:
                fd = self.fall_back(exc)
                if fd is None:
                    raise self.damaged(exc) from None
                bad = exc.chunk.chunk_id
                steps = [dataclasses.replace(s, fd=fd) if s.chunk.chunk_id == bad else s for s in steps]

    def read_small_or_fall_back(self, start: int, dest: memoryview) -> bool:
        """:meth:`read_small`; a chunk that fails its check there is fetched from
        another node (:meth:`fall_back`) and ``False`` returned (read it with
        :meth:`steps` and :meth:`run`, which then read it from there).

        Raises:
            DamagedObject: the bytes failed their check and no other node sent
                good ones, or the data file is missing.
        """
        try:
            return self.read_small(start, dest)
        except ChunkDamage as exc:
            if self.fall_back(exc) is None:
                raise self.damaged(exc) from None
            return False

    def run_again(self, exc: ChunkDamage, steps: list[ReadStep]) -> GpufeedError | None:
        """After ``steps`` failed with ``exc`` outside :meth:`run`: fetch the
        chunk from another node (:meth:`fall_back`) and run them again.

        Returns:
            ``None`` when they then read good bytes, else the error (the
            DamagedObject of :meth:`damaged` when no other node sent good bytes).
        """
        if self.fall_back(exc) is None:
            return self.damaged(exc)
        try:
            self.run(steps)
        except GpufeedError as err:
            return err
        return None

    def read_into(self, dest, start: int = 0) -> int:
        """Read from object offset ``start`` into ``dest`` (a writable buffer), checked.

        Returns:
            Bytes read: ``min(len(dest), size - start)``.

        Raises:
            InvalidArgument: negative ``start``.
            DamagedObject: a chunk failed its check.
        """
        if start < 0:
            raise InvalidArgument("offset must be >= 0")
        mv = memoryview(dest).cast("B")
        n = max(0, min(len(mv), self.info.size - start))
        return self.run(self.steps(mv[:n], start))

    def extents(self, start: int, n: int) -> list:
        """The bytes ``[start, start + n)`` as pieces to send, each checked first:
        ``(fd, file_offset, length)`` for raw data (for ``sendfile``) or a
        ``memoryview`` of decompressed data.

        Raises:
            DamagedObject: a chunk failed its check.
        """
        out: list = []
        m = self.manifest
        pos, end = start, start + n
        while pos < end:
            i = m.locate(pos)
            c = m.chunks[i]
            if not self.verify and c.chunk_id in self._store.damaged:
                raise self.damaged(ChunkDamage(c, "the chunk is marked damaged (see gpufeed scrub)"))
            stop = min(end, m.starts[i] + c.size, pos + _EXTENT_STEP)
            rel = pos - m.starts[i]
            if c.codec:
                buf = memoryview(bytearray(stop - pos))
                self.run([ReadStep(self.file_fd(i), c, m.sums[i], rel, buf, self.verify)])
                out.append(buf)
            else:
                fd = self.file_fd(i)
                if self._partial:
                    self._ensure(i, rel, stop - pos)
                if self.verify:
                    self.run([ReadStep(fd, c, m.sums[i], rel, _check_buf(stop - pos), True)])
                fd = self.file_fd(i)  # after the check: another node's bytes when it fell back
                if out and not isinstance(out[-1], memoryview) and out[-1][0] == fd \
                        and out[-1][1] + out[-1][2] == c.file_offset + rel:
                    out[-1] = (fd, out[-1][1], out[-1][2] + stop - pos)
                else:
                    out.append((fd, c.file_offset + rel, stop - pos))
            pos = stop
        return out

    def copy_to(self, pending, start: int, n: int, hasher=None) -> int:
        """Append bytes ``[start, start + n)`` of this version to a
        :class:`~gpufeed.engine.PendingWrite`, checked first: raw data by kernel
        copy (``copy_file_range``), other data through memory; with ``hasher``
        (``update(buffer)``), every byte also passes through it.

        Returns:
            Bytes appended.

        Raises:
            DamagedObject: a chunk failed its check.
        """
        done = 0
        if hasher is None:
            for piece in self.extents(start, n):
                if isinstance(piece, memoryview):
                    done += pending.write(piece)
                else:
                    done += pending.write_from_fd(*piece)
            return done
        buf = memoryview(bytearray(min(n, _EXTENT_STEP) or 1))
        while done < n:
            k = self.read_into(buf[:min(len(buf), n - done)], start + done)
            if k <= 0:
                break
            hasher.update(buf[:k])
            pending.write(buf[:k])
            done += k
        return done

    def file_extents(self) -> list[tuple[int, int, int]]:
        """The whole object as ``(fd, file_offset, length)`` ranges of its data
        files, in order (contiguous ranges of one file merged), for a zero-copy
        map of raw chunks (:attr:`Manifest.mappable`); not checked here (see
        :meth:`~gpufeed.engine.Engine.open_mappable`).

        Raises:
            DamagedObject: a data file is missing or short.
        """
        out: list[tuple[int, int, int]] = []
        for i, c in enumerate(self.manifest.chunks):
            fd = self.file_fd(i)
            if self._partial:
                self._ensure(i, 0, c.stored)
            if out and out[-1][0] == fd and out[-1][1] + out[-1][2] == c.file_offset:
                out[-1] = (fd, out[-1][1], out[-1][2] + c.size)
            else:
                out.append((fd, c.file_offset, c.size))
        return out

    def damaged(self, exc: ChunkDamage) -> DamagedObject:
        """Record a failed check (the chunk is marked damaged, the node counts it)
        and return the error to raise."""
        info = self.info
        if not self._store.held_elsewhere(exc.chunk):  # its holder judges its own files
            self._store.report_damage(exc.chunk.chunk_id, exc.reason)
        return DamagedObject(f"{info.bucket}/{info.key}: chunk {exc.chunk.chunk_id} is damaged: {exc.reason}",
                             chunk=exc.chunk.chunk_id, bucket=info.bucket, key=info.key)

    # lifetime -------------------------------------------------------------------
    def close(self) -> None:
        """Let go of the data files (idempotent)."""
        held, self._held = self._held, {}
        for f in held.values():
            self._files.release(f)
        fetched, self._remote, self._partial = self._remote, {}, {}
        for fd in fetched.values():
            os.close(fd)

    def __enter__(self) -> "ObjectHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _column(code: str, values) -> array:
    """``values`` as an ``array`` of ``code`` (as it is when it already is one)."""
    return values if isinstance(values, array) and values.typecode == code else array(code, values)
