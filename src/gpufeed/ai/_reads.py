"""The reads of :func:`gpufeed.ai.load_safetensors`, after planning
(:mod:`gpufeed.ai._readplan`): ranges cut into pieces of at most ``chunk_bytes``,
grouped in batched requests with a bound on the bytes in flight, either

* straight into client memory (:func:`_read_all`, the CPU path),
* through host staging slots into a tensor on any device
  (:func:`_read_staged`, double buffering on CUDA), or
* as blocks of whole rows gathered into place (:func:`_read_gathers`,
  strided slices),

with an optional progress bar (:class:`_Progress`).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future

import torch

from ..client import Client, ReadRequest
from ._device import _copier_for
from ._readplan import _Gather, _join, _Range
from ._safetensors import SafetensorsError

__all__ = ["MAX_BATCH_ITEMS", "DEFAULT_STAGING_BYTES", "STAGING_SLOTS", "GATHER_SCRATCH_BYTES",
           "GATHER_SLOTS", "PROGRESS_AUTO_BYTES"]

#: Most ranges in one batched request (strided slices make many small ones).
MAX_BATCH_ITEMS = 4096
#: Host staging slot size for loads to a GPU.
DEFAULT_STAGING_BYTES = 64 << 20  # 64 MiB
#: Staging slots: two is double buffering.
STAGING_SLOTS = 2
#: Scratch per whole-row read of a strided slice.
GATHER_SCRATCH_BYTES = 16 << 20  # 16 MiB
#: Scratch buffers for whole-row reads (reads in flight while one is gathered).
GATHER_SLOTS = 4
#: ``progress=None`` shows a bar for loads larger than this (when stderr is a terminal).
PROGRESS_AUTO_BYTES = 10**9  # 1 GB


def _batches(pieces: Sequence[_Range], batch_bytes: int, max_items: int = MAX_BATCH_ITEMS
             ) -> list[list[_Range]]:
    batches: list[list[_Range]] = []
    size = 0
    for piece in pieces:
        if not batches or size + piece.length > batch_bytes or len(batches[-1]) >= max_items:
            batches.append([])
            size = 0
        batches[-1].append(piece)
        size += piece.length
    return batches


def _check_read(bucket: str, batch: Sequence[_Range], got: Sequence[int]) -> None:
    for piece, n in zip(batch, got):
        if n != piece.length:
            raise SafetensorsError(_join(bucket, piece.key),
                                   f"short read at byte {piece.offset}: {n} of {piece.length} "
                                   f"bytes (the object changed during the load?)")


def _drain(futures) -> None:
    """Wait for every future; never leave the server writing into memory we drop."""
    for fut in futures:
        try:
            fut.result()
        except Exception:
            pass


class _Progress:
    """A rich progress bar on stderr counting bytes, or nothing (``enabled`` False)."""

    def __init__(self, enabled: bool, total: int, label: str) -> None:
        self._bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TimeRemainingColumn(),
                             console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task(label, total=total)
        self._bar.start()

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, nbytes)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _want_progress(progress: bool | None, total: int) -> bool:
    if progress is not None:
        return bool(progress)
    return total > PROGRESS_AUTO_BYTES and sys.stderr.isatty()


def _read_all(client: Client, bucket: str, buf: memoryview, pieces: Sequence[_Range], *,
              batch_bytes: int, max_inflight_bytes: int, progress: _Progress | None = None
              ) -> None:
    """Read every piece into ``buf``, batches pipelined; raises on any short read."""
    inflight: deque[tuple[list[_Range], int, Future]] = deque()
    held = 0

    def finish() -> None:
        nonlocal held
        batch, nbytes, fut = inflight.popleft()
        got = fut.result()
        held -= nbytes
        _check_read(bucket, batch, got)
        if progress is not None:
            progress.advance(nbytes)

    try:
        for batch in _batches(pieces, batch_bytes):
            nbytes = sum(p.length for p in batch)
            while inflight and held + nbytes > max_inflight_bytes:
                finish()
            fut = client.submit_get_many_into(
                [ReadRequest(bucket, p.key, buf[p.dest:p.dest + p.length], p.offset) for p in batch])
            inflight.append((batch, nbytes, fut))
            held += nbytes
        while inflight:
            finish()
    finally:
        _drain(f for _b, _n, f in inflight)


def _copy_runs(batch: Sequence[tuple[_Range, int]]) -> list[tuple[int, int, int]]:
    """``[(slot_offset, dest_offset, length)]`` with neighbours merged: pieces that
    are contiguous in the slot and in the destination become one copy."""
    out: list[tuple[int, int, int]] = []
    for piece, at in batch:
        if out and out[-1][0] + out[-1][2] == at and out[-1][1] + out[-1][2] == piece.dest:
            slot, dest, length = out[-1]
            out[-1] = (slot, dest, length + piece.length)
        else:
            out.append((at, piece.dest, piece.length))
    return out


def _read_staged(client: Client, bucket: str, dest: torch.Tensor, pieces: Sequence[_Range], *,
                 slot_bytes: int, nslots: int = STAGING_SLOTS, progress: _Progress | None = None
                 ) -> None:
    """Read every piece through ``nslots`` host staging slots into ``dest``.

    ``dest`` is a flat ``uint8`` tensor on any device. Reads fill one slot
    (``Client.alloc`` memory: on shm the server writes it directly) while the
    previous slot's bytes are copied to ``dest`` (asynchronously on CUDA), so
    reads and copies overlap: double buffering with the default two slots.
    Every piece must be at most ``slot_bytes``.
    """
    batches: list[list[tuple[_Range, int]]] = []
    fill = 0
    for p in pieces:
        if not batches or fill + p.length > slot_bytes or len(batches[-1]) >= MAX_BATCH_ITEMS:
            batches.append([])
            fill = 0
        batches[-1].append((p, fill))
        fill += p.length
    if not batches:
        return
    views = [client.alloc(slot_bytes) for _ in range(min(nslots, len(batches)))]
    slots = [torch.frombuffer(v, dtype=torch.uint8) for v in views]
    copier = _copier_for(dest.device, slots)
    inflight: deque[tuple[list[tuple[_Range, int]], int, Future]] = deque()

    def finish() -> None:
        batch, k, fut = inflight.popleft()
        _check_read(bucket, [p for p, _ in batch], fut.result())
        for at, to, n in _copy_runs(batch):
            copier.copy(slots[k][at:at + n], dest[to:to + n])
        copier.record(k)
        if progress is not None:
            progress.advance(sum(p.length for p, _ in batch))

    try:
        for i, batch in enumerate(batches):
            k = i % len(slots)
            if len(inflight) == len(slots):
                finish()
            copier.wait(k)  # the slot's previous bytes are out
            fut = client.submit_get_many_into(
                [ReadRequest(bucket, p.key, views[k][at:at + p.length], p.offset) for p, at in batch])
            inflight.append((batch, k, fut))
        while inflight:
            finish()
    finally:
        _drain(f for _b, _k, f in inflight)
        copier.close()


def _read_gathers(client: Client, bucket: str, dest: torch.Tensor, gathers: Sequence[_Gather],
                  *, scratch_bytes: int = GATHER_SCRATCH_BYTES,
                  progress: _Progress | None = None) -> None:
    """Read strided slices as blocks of whole rows into a few scratch buffers (the
    next blocks' reads overlap this block's gather) and copy each row's slice
    into ``dest`` (a flat ``uint8`` tensor on any device)."""
    blocks: list[tuple[_Gather, int, int]] = []  # (gather, first row, rows)
    for g in gathers:
        per = max(1, scratch_bytes // g.row)
        blocks.extend((g, i, min(per, g.rows - i)) for i in range(0, g.rows, per))
    if not blocks:
        return
    size = max(n * g.row for g, _i, n in blocks)
    views = [client.alloc(size) for _ in range(min(GATHER_SLOTS, len(blocks)))]
    scratch = [torch.frombuffer(v, dtype=torch.uint8) for v in views]
    inflight: deque[tuple[_Gather, int, int, int, Future]] = deque()

    def finish() -> None:
        g, i, n, k, fut = inflight.popleft()
        _check_read(bucket, [_Range(g.key, g.offset + i * g.row, 0, n * g.row)], [fut.result()])
        src = scratch[k][:n * g.row].view(n, g.row)[:, g.col:g.col + g.seg]
        dest[g.dest + i * g.seg:g.dest + (i + n) * g.seg].view(n, g.seg).copy_(src)
        if progress is not None:
            progress.advance(n * g.seg)

    try:
        for j, (g, i, n) in enumerate(blocks):
            if len(inflight) == len(views):
                finish()
            k = j % len(views)
            inflight.append((g, i, n, k, client.submit_get_into(
                bucket, g.key, views[k][:n * g.row], offset=g.offset + i * g.row)))
        while inflight:
            finish()
    finally:
        _drain(f for *_x, f in inflight)
