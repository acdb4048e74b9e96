"""Raw-tensor batches of tar shards (``ShardDataset(..., dtype=...)``): samples
are read by their place in the shard straight into their row of the batch
tensor.

A worker's stream runs on placeholders ``(unit, member)``: each shard's
:class:`~gpufeed.ai.data._tarindex.TarIndex` (found with a few small range
reads, see that module) gives its number of samples, the placeholders pass
through the same shuffle buffer as decoded samples do, and every
``batch_size`` of them that come out are one batch. The batch's rows are
grouped by shard (in the order each shard first appears in the batch; within
a shard in buffer order), and each shard's rows are read with one
``get_ranges_into`` (GETR: many ranges of one object in one request, at most
``MAX_RANGES`` a request) into their consecutive rows of the batch memory
(:class:`~gpufeed.ai.data._tensors.BatchMemory`: on shm the node writes each
sample into its row; in a DataLoader worker that memory is handed to the main
process by its descriptor). No sample passes through Python ``bytes``.

Each request also asks for one byte at the shard's listed size: it exists only
when the shard grew since it was listed (a shard that shrank cuts the ranges
short), so a shard rewritten with another size is :class:`SampleChanged`,
never read at the old places. A batch with a failed shard is read again
whole (the extra byte of a grown shard lands on the next row).

A resume replays the placeholders with no reads where the saved state has
the shards' sample counts; a shard whose index then has another count is
:class:`SampleChanged`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...errors import GpufeedError, InvalidArgument
from ...wire.protocol import MAX_RANGES
from ._errors import DataError, SampleChanged, SampleDecodeError
from ._fetch import Reader, _lost
from ._sampling import NOTHING, ShuffleBuffer
from ._source import Listed
from ._tarindex import TarIndex, parsed_index, predicted_index
from ._tensors import BatchMemory, sample_shape

__all__ = ["TensorSpec", "TensorShards"]

Slot = tuple[int, int]  # (unit, member)


@dataclass(frozen=True)
class TensorSpec:
    """What a raw-tensor sample is.

    Attributes:
        dtype: the elements' type (native byte order).
        shape: each sample's shape (``None``: 1-D, any length; a batch's samples
            must then have one size).
        ext: the extension of the file that holds the tensor (``None``: each
            sample has exactly one file).
        batch_size: samples per batch (the last batch of a worker's epoch may be shorter).
    """

    dtype: torch.dtype
    shape: tuple[int, ...] | None
    ext: str | None
    batch_size: int

    @property
    def sample_bytes(self) -> int | None:
        """Bytes per sample when ``shape`` fixes it."""
        if self.shape is None:
            return None
        return math.prod(self.shape) * torch.empty(0, dtype=self.dtype).element_size()


class TensorShards:
    """One process's raw-tensor reads of a dataset's tar shards.

    Args:
        reader: the dataset's reader (its client, error policy and skip count).
        shards: the shard of each unit.
        spec: the samples' dtype, shape, file and batch size.
        indexes: the shards' indexes found so far in this process (by unit), kept across epochs.
    """

    def __init__(self, reader: Reader, shards: Sequence[Listed], spec: TensorSpec,
                 indexes: dict[int, TarIndex]) -> None:
        self.reader, self.shards, self.spec, self.indexes = reader, shards, spec, indexes
        self.source = reader.source
        self._expect: dict[int, int] = {}

    # --- the stream ---------------------------------------------------------------------
    def batches(self, mine: Sequence[int], buf: ShuffleBuffer, skip: int, counts: Callable[[int], int],
                parsed: list[tuple[int, int]]) -> Iterator[tuple[int, torch.Tensor]]:
        """``(position of its last sample, batch)`` for the samples of ``mine``
        after the first ``skip``, ``spec.batch_size`` at a time.

        Args:
            mine: the units this worker reads, in order.
            buf: the shuffle buffer, seeded for this worker and epoch.
            skip: samples already delivered (a resume).
            counts: ``counts(unit)``: its saved number of samples, or -1.
            parsed: ``(unit, samples)`` is appended for each shard as it enters the stream.

        Raises:
            DataError: as :meth:`read` and the indexes (under the error policy).
        """
        pos, slots = 0, []
        for slot in self._slots(mine, buf, skip, counts, parsed):
            pos += 1
            if pos <= skip:
                continue
            slots.append(slot)
            if len(slots) == self.spec.batch_size:
                batch, slots = self.read(slots), []
                if batch is not None:
                    yield pos, batch
        if slots:
            batch = self.read(slots)
            if batch is not None:
                yield pos, batch

    def _slots(self, mine: Sequence[int], buf: ShuffleBuffer, skip: int, counts: Callable[[int], int],
               parsed: list[tuple[int, int]]) -> Iterator[Slot]:
        out = 0
        for u in mine:
            c = counts(u) if out < skip else -1
            if c >= 0 and u not in self.indexes:
                self._expect[u] = c  # checked when a sample of it is read
            else:
                index = self.index(u)
                c = 0 if index is None else len(index)
            parsed.append((u, c))
            if buf.size <= 1:  # no buffer: the shard's samples in order
                out += c
                yield from ((u, j) for j in range(c))
                continue
            for j in range(c):
                item = buf.push((u, j))
                if item is not NOTHING:
                    out += 1
                    yield item  # type: ignore[misc]
        yield from buf.drain()

    # --- indexes --------------------------------------------------------------------------
    def index(self, u: int) -> TarIndex | None:
        """Unit ``u``'s index (found once per process), ``None`` when skipped by the policy.

        Raises:
            CorruptShard, SampleDecodeError, SampleMissing, SampleReadError: under the policy.
            SampleChanged: it holds another number of samples than a resumed state saved.
        """
        found = self.indexes.get(u)
        if found is None:
            found = self._policy(self.shards[u], lambda: self._find_index(self.shards[u]))
            if found is None:
                return None
            self.indexes[u] = found
        want = self._expect.pop(u, None)
        if want is not None and want != len(found):
            shard = self.shards[u]
            raise SampleChanged(f"{self.source.where(shard.key)}: holds {len(found)} samples, {want} when the "
                                f"position was saved", bucket=self.source.bucket, key=shard.key)
        return found

    def _find_index(self, shard: Listed) -> TarIndex | None:
        client, bucket = self.source.client(), self.source.bucket

        def read_ranges(dest, offsets, length):  # a range past the end (the shard shrank) counts -1
            return client.get_ranges_into(bucket, shard.key, dest, offsets, length, errors_out=[])

        index = predicted_index(read_ranges, shard, self.spec.ext)
        if index is not None:
            return index
        data = self.reader.read_one(shard)  # the whole shard, under the policy
        return None if data is None else parsed_index(data, self.source.where(shard.key), self.spec.ext)

    def _policy(self, shard: Listed, fn: Callable[[], TarIndex | None]) -> TarIndex | None:
        """``fn()`` under the error policy: retried, skipped (``None``) or raised, typed."""
        policy = self.reader.policy
        attempts = 1 + (policy.max_retries if policy.on_error == "retry" else 0)
        for attempt in range(attempts):
            if attempt:
                time.sleep(policy.retry_backoff_s * 2 ** (attempt - 1))
            try:
                return fn()
            except (GpufeedError, OSError) as exc:
                err = self._typed(shard, exc)
        if policy.on_error == "skip":
            self.reader.skip(err)
            return None
        raise err

    def _typed(self, shard: Listed, exc: BaseException) -> DataError:
        if isinstance(exc, DataError):
            exc.bucket, exc.key = exc.bucket or self.source.bucket, exc.key or shard.key
            return exc
        if _lost(exc):
            self.source.failed(exc)
        return self.reader.typed(shard, exc)

    # --- one batch ------------------------------------------------------------------------
    def read(self, slots: list[Slot]) -> torch.Tensor | None:
        """The samples of ``slots`` as one batch tensor, rows grouped by shard.

        Returns:
            The batch, or ``None`` when the policy skipped every sample.

        Raises:
            InvalidArgument: samples of different sizes without ``shape``.
            SampleDecodeError: a sample whose size does not fit ``dtype`` / ``shape``.
            SampleChanged, SampleMissing, SampleReadError: a shard changed, gone or unreadable.
        """
        groups = self._groups(slots)
        size = self._sample_size(groups)
        policy, attempt = self.reader.policy, 0
        while groups:
            got = self._read_groups(groups, size)
            if isinstance(got, torch.Tensor):
                return got
            if policy.on_error == "skip":
                for err in got.values():
                    self.reader.skip(err)
                groups = [g for g in groups if g[0] not in got]
                continue
            if policy.on_error == "raise" or attempt >= policy.max_retries:
                raise next(iter(got.values()))
            time.sleep(policy.retry_backoff_s * 2 ** attempt)
            attempt += 1
        return None

    def _groups(self, slots: list[Slot]) -> list[tuple[int, np.ndarray]]:
        """``(unit, members)`` per shard, in order of first appearance; members of
        a wrong size are left out (skip) or raised."""
        members: dict[int, list[int]] = {}
        for u, j in slots:
            members.setdefault(u, []).append(j)
        out = []
        want = self.spec.sample_bytes
        for u, js in members.items():
            index = self.index(u)
            if index is None:
                continue
            sel = np.array(js, dtype=np.int64)
            if want is not None:
                fits = index.sizes[sel] == want
                for j in sel[~fits].tolist():
                    self._wrong_size(u, index, j)
                sel = sel[fits]
            if len(sel):
                out.append((u, sel))
        return out

    def _wrong_size(self, u: int, index: TarIndex, j: int) -> None:
        shard = self.shards[u]
        err = SampleDecodeError(f"{self.source.where(shard.key)}: sample {index.keys[j]!r} (member {j}) has "
                                f"{int(index.sizes[j])} bytes, not a {self.spec.dtype} tensor of shape "
                                f"{list(self.spec.shape or ())} ({self.spec.sample_bytes} bytes)",
                                bucket=self.source.bucket, key=shard.key)
        if self.reader.policy.on_error != "skip":
            raise err
        self.reader.skip(err)

    def _sample_size(self, groups: list[tuple[int, np.ndarray]]) -> int:
        if self.spec.sample_bytes is not None:
            return self.spec.sample_bytes
        sizes: dict[int, tuple[int, int]] = {}
        for u, sel in groups:
            for j, n in zip(sel.tolist(), self.indexes[u].sizes[sel].tolist()):
                sizes.setdefault(n, (u, j))
        if len(sizes) > 1:
            named = ", ".join(f"{self.source.where(self.shards[u].key)} sample "
                              f"{self.indexes[u].keys[j]!r} ({n} bytes)" for n, (u, j) in list(sizes.items())[:8])
            raise InvalidArgument(f"the samples of a batch differ in size, so they make no batch tensor: {named}; "
                                  "pass shape= to the dataset (a sample that does not fit it fails to decode)")
        size = next(iter(sizes), 0)
        try:
            sample_shape(size, self.spec.dtype, None)
        except ValueError as exc:
            u, j = sizes[size]
            raise SampleDecodeError(f"{self.source.where(self.shards[u].key)}: sample {self.indexes[u].keys[j]!r}: "
                                    f"{exc}", bucket=self.source.bucket, key=self.shards[u].key) from None
        return size

    def _read_groups(self, groups: list[tuple[int, np.ndarray]],
                     size: int) -> torch.Tensor | dict[int, DataError]:
        """Read every group into one batch: the batch, or the error of each failed shard."""
        n = sum(len(sel) for _, sel in groups)
        dims = self.spec.shape if self.spec.shape is not None else (size // _itemsize(self.spec.dtype),)
        try:
            client = self.source.client()
            mem = BatchMemory(client, n * size)
        except (GpufeedError, OSError) as exc:
            return {groups[0][0]: self._typed(self.shards[groups[0][0]], exc)}
        failed = self._submit_wait(client, groups, mem.view, size)
        if failed:
            mem.close()
            return failed
        if not size:
            return torch.empty((n, *dims), dtype=self.spec.dtype)
        return mem.tensor().view(self.spec.dtype).view(n, *dims)

    def _submit_wait(self, client, groups: list[tuple[int, np.ndarray]], view: memoryview,
                     size: int) -> dict[int, DataError]:
        bucket, row, step = self.source.bucket, 0, MAX_RANGES - 1
        parts: list = []
        failed: dict[int, DataError] = {}
        for u, sel in groups:
            shard = self.shards[u]
            offs = self.indexes[u].offsets[sel]
            for first in range(0, len(offs), step):
                chunk = offs[first:first + step]
                errors: list = []
                lengths = [size] * len(chunk) + [1]
                dest = view[row * size:(row + len(chunk)) * size + 1]
                try:
                    fut = client.submit_get_ranges_into(bucket, shard.key, dest, np.append(chunk, shard.size),
                                                        lengths, errors_out=errors)
                    parts.append((u, fut, errors))
                except (GpufeedError, OSError) as exc:
                    failed.setdefault(u, self._typed(shard, exc))
                row += len(chunk)
        for u, fut, errors in parts:  # every part is waited for: none may still write when this returns
            try:
                got = fut.result()
            except (GpufeedError, OSError) as exc:
                failed.setdefault(u, self._typed(self.shards[u], exc))
                continue
            err = self._check(u, got, errors, size)
            if err is not None:
                failed.setdefault(u, err)
        return failed

    def _check(self, u: int, got: np.ndarray, errors: list, size: int) -> DataError | None:
        shard = self.shards[u]
        where, kw = self.source.where(shard.key), {"bucket": self.source.bucket, "key": shard.key}
        if got[-1] > 0:
            return SampleChanged(f"{where}: listed with {shard.size} bytes, now more", **kw)
        bad = [e for e in errors[:-1] if e is not None]
        if bad and getattr(bad[0], "code", "") != "InvalidRange":
            return self.reader.typed(shard, bad[0])
        if bad or (got[:-1] != size).any():
            return SampleChanged(f"{where}: listed with {shard.size} bytes, now fewer", **kw)
        return None


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()

