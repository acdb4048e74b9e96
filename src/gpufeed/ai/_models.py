"""Load safetensors models from a gpufeed node straight into tensor memory.

How a load goes (one model, one or many shards):

1. Find the shards: one ``.safetensors`` object, an index
   (``model.safetensors.index.json``), or a folder holding either.
2. Read every shard's header with one batched request (``get_many_into``),
   then validate it strictly (:func:`gpufeed.ai._safetensors.parse_header`).
3. Lay all selected tensors (or, under ``shard=``, this rank's slice of each)
   out in ONE buffer, each at a 64-byte aligned offset. Tensors that are
   adjacent in a shard and stay aligned form a *run*: one contiguous range of
   the object. A slice along dim 0 is one range; a slice along a later dim is
   one small range per index of the leading dims, batched.
4. Read the ranges in pieces of at most ``chunk_bytes``, grouped in batches of
   about ``batch_bytes``, with up to ``max_inflight_bytes`` in flight:
   * CPU: into a ``Client.alloc`` buffer (on the shared-memory transport the
     server writes it directly: file to tensor memory in one copy);
   * CUDA (or ``staging_bytes=``): through two pinned host staging slots
     into one device buffer, the copy of one slot overlapping the read of the
     next.
5. Wrap each tensor as a view of the buffer (no copy), cast to ``dtype`` if
   asked.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from ..client import Client, ReadRequest
from .._memory import address_of
from ..errors import InvalidArgument, NoSuchKey
from ._safetensors import (
    HEADER_PREFIX_BYTES,
    SafetensorsError,
    SafetensorsHeader,
    TensorInfo,
    header_length,
    parse_header,
)

__all__ = ["load_safetensors", "load_safetensors_url", "find_safetensors", "read_headers",
           "gds_status", "ShardDim"]

#: Every tensor starts at a multiple of this inside the destination buffer.
ALIGN_BYTES = 64
#: First read of each shard; most headers fit (a 1 GB Llama shard's is ~10 KiB).
HEAD_PROBE_BYTES = 64 << 10  # 64 KiB
#: Name transformers gives the shard index.
INDEX_NAME = "model.safetensors.index.json"
#: Most ranges in one batched request (strided slices make many small ones).
MAX_BATCH_ITEMS = 4096
#: Host staging slot size for loads to a GPU.
DEFAULT_STAGING_BYTES = 64 << 20  # 64 MiB
#: Staging slots: two is double buffering.
STAGING_SLOTS = 2
#: ``cudaHostRegisterPortable``: pinned for every CUDA context.
CUDA_HOST_REGISTER_PORTABLE = 1
#: ``strided="auto"`` reads a strided slice as whole rows when a row (the bytes
#: per index of the dims before the sharded one) is smaller than this. Measured
#: on the 2-core VM, 1 GB Llama, dim-1 slices: one range costs ~10 us (client +
#: node) against ~13 GB/s for bytes, so below ~100 KB a row is cheaper to read
#: whole: 0.19 s (whole rows) vs 1.47 s (155k ranges of 2 KB) at world size 2.
STRIDED_ROW_BYTES = 128 << 10  # 128 KiB
#: Scratch per whole-row read of a strided slice.
GATHER_SCRATCH_BYTES = 16 << 20  # 16 MiB
#: Scratch buffers for whole-row reads (reads in flight while one is gathered).
GATHER_SLOTS = 4
#: ``progress=None`` shows a bar for loads larger than this (when stderr is a terminal).
PROGRESS_AUTO_BYTES = 10**9  # 1 GB

#: ``dim`` of ``shard=(rank, world_size, dim)``: one dim for every tensor, None
#: (no slicing), or tensor name -> dim (None: that tensor whole).
ShardDim = int | None | Callable[[str], "int | None"]


@dataclass(frozen=True, slots=True)
class _Range:
    key: str  # object key
    offset: int  # in the object
    dest: int  # in the destination buffer
    length: int


def _join(bucket: str, key: str) -> str:
    return f"{bucket}/{key}"


def _folder(key: str) -> str:
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""


def find_safetensors(client: Client, bucket: str, key: str | Sequence[str]
                     ) -> tuple[list[str], dict[str, str] | None]:
    """Resolve what to load into shard keys.

    Args:
        client: a connected :class:`~gpufeed.client.Client`.
        bucket: the bucket.
        key: one of
            * a ``.safetensors`` object key;
            * an index object key (``*.safetensors.index.json``);
            * a folder (``models/llama`` or ``models/llama/``; ``""`` is the
              bucket root) holding an index, or else ``*.safetensors`` objects
              directly (not in subfolders);
            * a sequence of ``.safetensors`` object keys.

    Returns:
        ``(shard_keys, weight_map)``: keys in load order, and the index's
        ``weight_map`` (tensor name -> shard key) or ``None`` without an index.

    Raises:
        NoSuchKey: nothing to load there.
        SafetensorsError: the index is not valid JSON with a ``weight_map``.
        NoSuchBucket, TransportError.
    """
    if not isinstance(key, str):
        keys = list(key)
        if not keys:
            raise InvalidArgument("no object keys given")
        return keys, None
    if key.endswith(".safetensors"):
        return [key], None
    if key.endswith(".json"):
        return _read_index(client, bucket, key)
    folder = key.rstrip("/") + "/" if key.rstrip("/") else ""
    found = [e for e in client.list(bucket, prefix=folder, delimiter="/") if not e.is_prefix]
    indexes = [e.key for e in found if e.key.endswith(".safetensors.index.json")]
    if len(indexes) > 1:
        preferred = folder + INDEX_NAME
        if preferred not in indexes:
            raise InvalidArgument(f"{_join(bucket, folder)} holds several indexes: {indexes}; "
                                  f"name one")
        indexes = [preferred]
    if indexes:
        return _read_index(client, bucket, indexes[0])
    shards = [e.key for e in found if e.key.endswith(".safetensors")]
    if not shards:
        raise NoSuchKey(f"no .safetensors objects or index under {_join(bucket, folder)}")
    return shards, None


def _read_index(client: Client, bucket: str, key: str) -> tuple[list[str], dict[str, str]]:
    name = _join(bucket, key)
    try:
        doc = json.loads(bytes(client.get(bucket, key)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(name, f"the index is not JSON: {exc}") from exc
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise SafetensorsError(name, "the index has no weight_map of tensor name -> file name")
    if not weight_map:
        raise SafetensorsError(name, "the index's weight_map is empty: it names no tensors")
    folder = _folder(key)
    shards = list(dict.fromkeys(folder + f for f in weight_map.values()))
    return shards, {t: folder + f for t, f in weight_map.items()}


def read_headers(client: Client, bucket: str, keys: Sequence[str]) -> list[SafetensorsHeader]:
    """Read and validate the headers of several safetensors objects, batched.

    One ``HEAD`` per object, one batched read of the first 64 KiB of every
    object, and a second batched read only for headers larger than that.

    Args:
        client: a connected client.
        bucket: the bucket.
        keys: object keys.

    Returns:
        One validated header per key, in order.

    Raises:
        SafetensorsError: a malformed header (names the object and tensor).
        NoSuchKey, NoSuchBucket, TransportError.
    """
    sizes = [client.head(bucket, k).size for k in keys]
    probes = [min(HEAD_PROBE_BYTES, s) for s in sizes]
    # Memory from client.alloc: on shm the server writes it directly. A bytearray
    # would go through the client's 64 MiB staging region, whose first use costs
    # ~70 ms to create and map (measured on the 2-core VM).
    area = client.alloc(sum(probes)) if sum(probes) else memoryview(bytearray(0))
    starts = [sum(probes[:i]) for i in range(len(probes))]
    client.get_many_into([ReadRequest(bucket, k, area[o:o + n], 0)
                          for k, o, n in zip(keys, starts, probes) if n])
    heads = [bytes(area[o:o + n]) for o, n in zip(starts, probes)]
    need: list[int] = []
    lengths: list[int] = []
    for i, k in enumerate(keys):
        n = header_length(_join(bucket, k), heads[i], sizes[i])
        lengths.append(n)
        if HEADER_PREFIX_BYTES + n > len(heads[i]):
            need.append(i)
    if need:
        more = [bytearray(HEADER_PREFIX_BYTES + lengths[i] - len(heads[i])) for i in need]
        client.get_many_into([ReadRequest(bucket, keys[i], m, len(heads[i]))
                              for i, m in zip(need, more)])
        for i, m in zip(need, more):
            heads[i] += bytes(m)
    return [parse_header(_join(bucket, k), h, s) for k, h, s in zip(keys, heads, sizes)]


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


# --- tensor-parallel slices ------------------------------------------------------------
def _check_shard(shard: object) -> tuple[int, int, ShardDim]:
    if not isinstance(shard, tuple) or len(shard) != 3:
        raise InvalidArgument(f"shard must be (rank, world_size, dim), not {shard!r}")
    rank, world, dim = shard
    if type(world) is not int or world < 1 or type(rank) is not int or not 0 <= rank < world:
        raise InvalidArgument(f"shard {shard!r}: need 0 <= rank < world_size, both ints")
    if not (callable(dim) or dim is None or type(dim) is int):
        raise InvalidArgument(f"shard {shard!r}: dim must be an int, None or name -> int | None")
    return rank, world, dim


def _slice_of(object_name: str, t: TensorInfo, shard: tuple[int, int, ShardDim] | None
              ) -> tuple[int, int, int] | None:
    """``(dim, start, size)`` of this rank's part of ``t``, or None for all of it.

    vLLM's rule for column- and row-parallel weights (``divide`` in
    ``vllm/distributed/utils.py``, ``narrow(dim, rank * size, size)`` in
    ``ColumnParallelLinear.weight_loader``): equal parts, the dimension must
    divide evenly, and rank ``r`` gets ``[r * n / w, (r + 1) * n / w)``.
    """
    if shard is None:
        return None
    rank, world, spec = shard
    dim = spec(t.name) if callable(spec) else spec
    if dim is None:
        return None
    nd = len(t.shape)
    if type(dim) is not int or not -nd <= dim < nd:
        raise InvalidArgument(f"{object_name}: tensor {t.name!r} of shape {list(t.shape)} has no "
                              f"dim {dim!r} to shard along")
    dim %= nd
    n = t.shape[dim]
    if n % world:
        raise InvalidArgument(
            f"{object_name}: tensor {t.name!r} of shape {list(t.shape)}: dim {dim} ({n}) does "
            f"not divide into {world} equal parts (the vLLM rule: pad the weight, or shard "
            f"this tensor along another dim or not at all)")
    size = n // world
    return dim, rank * size, size


@dataclass(frozen=True, slots=True)
class _Gather:
    """A strided slice read as whole rows, then gathered: ``rows`` rows of
    ``row`` bytes from ``offset``; bytes ``[col, col + seg)`` of each go to
    ``dest + i * seg``."""

    key: str
    offset: int
    rows: int
    row: int
    col: int
    seg: int
    dest: int


@dataclass(frozen=True, slots=True)
class _Placed:
    info: TensorInfo
    shape: tuple[int, ...]  # as loaded (the slice's shape under shard=)
    offset: int  # in the destination buffer; -1: empty
    nbytes: int


def _plan(headers: Sequence[SafetensorsHeader], keys: Sequence[str], wanted: set[str] | None,
          shard: tuple[int, int, ShardDim] | None = None, bucket: str = "",
          strided: str = "auto") -> tuple[int, list[_Range], list[_Gather], list[_Placed]]:
    """Place the wanted tensors (or their slices) in one buffer.

    Returns ``(total_bytes, ranges, gathers, placed)``. A whole tensor, or a
    slice that is one contiguous range of the object (along dim 0, or with
    only unit dims before it), is one range (adjacent ones merge into runs).
    A slice along a later dim is ``prod(shape[:dim])`` segments of
    ``size * inner`` bytes, read either as one range per segment (``ranges``:
    only the slice's bytes) or as whole rows gathered in memory (``rows``);
    ``auto`` picks rows when a row is under :data:`STRIDED_ROW_BYTES`.
    """
    cursor = 0
    ranges: list[_Range] = []
    gathers: list[_Gather] = []
    placed: list[_Placed] = []
    for key, header in zip(keys, headers):
        run: _Range | None = None  # the open run
        for t in header.tensors:
            if wanted is not None and t.name not in wanted:
                continue
            sl = _slice_of(_join(bucket, key), t, shard)
            shape = t.shape
            start = header.data_start + t.begin
            outer, seg, row = 1, t.nbytes, t.nbytes
            if sl is not None:
                dim, first, size = sl
                shape = t.shape[:dim] + (size,) + t.shape[dim + 1:]
                outer = math.prod(t.shape[:dim])
                if outer:
                    row = t.nbytes // outer  # bytes per index of the leading dims
                    inner = row // t.shape[dim] if t.shape[dim] else 0
                    start += first * inner
                    seg = size * inner
                if outer == 1 or seg == row:  # the slice is one contiguous range
                    seg, outer = seg * outer, 1
            nbytes = seg * outer if outer else 0
            if nbytes == 0:
                placed.append(_Placed(t, shape, -1, 0))
                continue
            if outer == 1 and run is not None and start == run.offset + run.length \
                    and (run.dest + run.length) % ALIGN_BYTES == 0:
                run = _Range(key, run.offset, run.dest, run.length + seg)
                ranges[-1] = run
                placed.append(_Placed(t, shape, run.dest + start - run.offset, nbytes))
            elif outer == 1:
                run = _Range(key, start, _align(cursor), seg)
                ranges.append(run)
                placed.append(_Placed(t, shape, run.dest, nbytes))
            else:
                dest = _align(cursor)
                if strided == "rows" or (strided == "auto" and row < STRIDED_ROW_BYTES):
                    col = start - header.data_start - t.begin
                    gathers.append(_Gather(key, start - col, outer, row, col, seg, dest))
                else:
                    ranges.extend(_Range(key, start + i * row, dest + i * seg, seg)
                                  for i in range(outer))
                placed.append(_Placed(t, shape, dest, nbytes))
                run = None
            cursor = placed[-1].offset + nbytes
    return cursor, ranges, gathers, placed


def _pieces(runs: Sequence[_Range], chunk_bytes: int) -> list[_Range]:
    out = []
    for r in runs:
        if r.length <= chunk_bytes:
            out.append(r)
            continue
        for o in range(0, r.length, chunk_bytes):
            out.append(_Range(r.key, r.offset + o, r.dest + o, min(chunk_bytes, r.length - o)))
    return out


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


# --- progress ----------------------------------------------------------------------------
class _Progress:
    """A rich progress bar on stderr counting bytes, or nothing (``enabled`` False)."""

    def __init__(self, enabled: bool, total: int, label: str) -> None:
        self._bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

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


# --- reading into client memory (CPU) ---------------------------------------------------------
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


# --- reading through host staging into device memory ----------------------------------------
class _SyncCopier:
    """Copies staging slices into the destination with ``Tensor.copy_``, blocking.

    The fallback of :class:`_CudaCopier` (CPU, or any device without streams);
    the staged pipeline runs the same way with either, which is how the CUDA
    path's bookkeeping (packing, merging, slot reuse) is tested without a GPU.
    """

    def __init__(self, device: torch.device, slots: Sequence[torch.Tensor]) -> None:
        self.device = device

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        dst.copy_(src)

    def record(self, slot: int) -> None:
        pass

    def wait(self, slot: int) -> None:
        pass

    def close(self) -> None:
        pass


class _CudaCopier:
    """Asynchronous host -> GPU copies on a side stream, one event per staging slot.

    The slots (``Client.alloc`` memory, so on shm the server writes them
    directly) are page-locked with ``cudaHostRegister`` for the load, so
    ``copy_(non_blocking=True)`` is a real DMA that overlaps the next read.
    If registering fails, copies still work (the driver stages pageable
    memory itself), only without the overlap.
    """

    def __init__(self, device: torch.device, slots: Sequence[torch.Tensor]) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.stream.wait_stream(torch.cuda.current_stream(device))  # dest was allocated there
        self.events: list[torch.cuda.Event | None] = [None] * len(slots)
        self.pinned: list[int] = []
        cudart = torch.cuda.cudart()
        for s in slots:
            if int(cudart.cudaHostRegister(s.data_ptr(), s.numel(), CUDA_HOST_REGISTER_PORTABLE)) == 0:
                self.pinned.append(s.data_ptr())

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def record(self, slot: int) -> None:
        event = torch.cuda.Event()
        event.record(self.stream)
        self.events[slot] = event

    def wait(self, slot: int) -> None:
        event = self.events[slot]
        if event is not None:
            event.synchronize()

    def close(self) -> None:
        self.stream.synchronize()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        cudart = torch.cuda.cudart()
        for ptr in self.pinned:
            cudart.cudaHostUnregister(ptr)
        self.pinned.clear()


def _copier_for(device: torch.device, slots: Sequence[torch.Tensor]):
    if device.type == "cuda" and torch.cuda.is_available():
        return _CudaCopier(device, slots)
    return _SyncCopier(device, slots)


def gds_status() -> str:
    """Why GPUDirect Storage (kvikio) is or is not used for a load; for reports.

    Returns ``"unavailable: <reason>"``; GDS reads need the object's file on
    the node, which the fast-path protocol does not expose yet, so every CUDA
    load goes through pinned host staging (see :func:`load_safetensors`).
    """
    try:
        import kvikio  # noqa: F401
    except ImportError:
        return "unavailable: kvikio is not installed"
    if not torch.cuda.is_available():
        return "unavailable: no CUDA device"
    return "unavailable: the node does not expose object files to clients (fast path only)"


def _copy_runs(batch: Sequence[tuple[_Range, int]]) -> list[tuple[int, int, int]]:
    """``[(slot_offset, dest_offset, length)]`` with neighbours merged: pieces that
    are contiguous in the slot and in the destination become one copy."""
    out: list[list[int]] = []
    for piece, at in batch:
        if out and out[-1][0] + out[-1][2] == at and out[-1][1] + out[-1][2] == piece.dest:
            out[-1][2] += piece.length
        else:
            out.append([at, piece.dest, piece.length])
    return [tuple(x) for x in out]


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


# --- the loader ----------------------------------------------------------------------------
def load_safetensors(client: Client, bucket: str, key: str | Sequence[str], *,
                     keys: Collection[str] | None = None, tensors: Collection[str] | None = None,
                     shard: tuple[int, int, ShardDim] | None = None,
                     device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                     progress: bool | None = None, staging_bytes: int | None = None,
                     strided: str = "auto", chunk_bytes: int = 16 << 20, batch_bytes: int = 64 << 20,
                     max_inflight_bytes: int = 256 << 20, zero_copy: bool = False
                     ) -> dict[str, torch.Tensor]:
    """Load safetensors object(s) from a gpufeed node into tensors.

    On the CPU, every selected tensor lands in one buffer from
    :meth:`Client.alloc` (on ``gpufeed+shm://`` the server writes there
    directly: one copy, file to tensor memory; on ``gpufeed+tcp://`` the
    socket receives into it). Each tensor is a view of that buffer at a
    64-byte aligned offset; the buffer goes back to the client's pool once
    every tensor is gone.

    On a CUDA device, the bytes go through two pinned host staging slots of
    ``staging_bytes`` (double buffering: the server fills one while the other
    is copied to the GPU with ``non_blocking`` copies on a side stream) into
    one device buffer that the tensors view. GPUDirect Storage is not used
    (see :func:`gds_status`).

    Args:
        client: a connected :class:`~gpufeed.client.Client`.
        bucket: the bucket.
        key: a ``.safetensors`` key, an index key
            (``*.safetensors.index.json``), a folder holding an index or
            shards, or a list of shard keys (see :func:`find_safetensors`).
        keys: load only these tensor names (default: all); only their bytes
            are read. The issue's name for ``tensors``.
        tensors: the same as ``keys`` (give one or the other).
        shard: ``(rank, world_size, dim)``: load only this rank's part of each
            tensor along ``dim``, reading only its bytes (tensor parallelism).
            ``dim`` is an int (negative counts from the end), ``None`` (every
            tensor whole), or a callable ``name -> int | None`` (``None``:
            that tensor whole, e.g. norms; 0 for column-parallel weights, 1 for
            row-parallel ones, as vLLM does). Parts are equal:
            ``[rank * n / w, (rank + 1) * n / w)``, and a dim that does not
            divide evenly is an error, as in vLLM's ``divide``.
        device: ``"cpu"`` (default) or e.g. ``"cuda:0"``.
        dtype: cast floating-point tensors to this dtype (integer and bool
            tensors keep theirs), as transformers' ``torch_dtype`` does.
        progress: show a progress bar on stderr; default: when loading more
            than 1 GB and stderr is a terminal.
        staging_bytes: size of each host staging slot, bytes (default 64 MiB
            for CUDA). Given with ``device="cpu"``, the CPU load also goes
            through the staged path into ordinary torch memory (one
            ``torch.empty`` buffer) instead of client memory.
        strided: how a slice along a dim after the first is read: ``"ranges"``
            (one range per row: only the slice's bytes), ``"rows"`` (whole
            rows in 16 MiB blocks, the slice gathered in memory), or
            ``"auto"`` (rows when a row is under 128 KiB: a range costs about
            as much as 100 KB of bytes).
        chunk_bytes: largest single read, bytes (default 16 MiB).
        batch_bytes: bytes per batched request (default 64 MiB).
        max_inflight_bytes: bytes requested but not yet read (default 256 MiB).
        zero_copy: ``gpufeed+shm://`` and ``device="cpu"`` only: map each shard
            (:meth:`Client.map_object`) instead of copying it, and return
            tensors that view the mapping, every page mapped in before return.
            Nothing is copied, and processes loading the same model share its
            pages (the node's page cache). Tensors are writable copy-on-write
            (writes never reach the store). They are not anonymous memory:
            under memory pressure the kernel may drop their clean pages and
            read them back from disk later. A tensor whose offset in the file is
            not a multiple of its element size is copied. ``dtype`` casts copy
            as usual; ``shard=`` and ``staging_bytes`` are refused.

    Returns:
        Tensor name -> tensor (shape and dtype from the header, or the
        slice's shape under ``shard``; 0-d tensors for shape ``[]``), in shard
        order, then file order.

    Raises:
        SafetensorsError: a malformed header or index, a tensor missing from
            the shard the index names, a tensor in two shards, or a dtype
            this torch build lacks; the message names the object and tensor.
        InvalidArgument: a name in ``keys`` is in no shard; both ``keys`` and
            ``tensors``; a bad ``shard`` or a dim that does not divide evenly
            (names the tensor); an unusable ``device``; bad sizes.
        NoSuchKey, NoSuchBucket: nothing there.
        TransportError: the node went away.
    """
    if keys is not None and tensors is not None:
        raise InvalidArgument("give keys= or tensors= (the same thing), not both")
    if strided not in ("auto", "ranges", "rows"):
        raise InvalidArgument(f"strided must be 'auto', 'ranges' or 'rows', not {strided!r}")
    if min(chunk_bytes, batch_bytes, max_inflight_bytes) <= 0 or (
            staging_bytes is not None and staging_bytes <= 0):
        raise InvalidArgument("chunk_bytes, batch_bytes, max_inflight_bytes and staging_bytes "
                              "must be > 0")
    dev = _check_device(device)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise InvalidArgument(f"dtype must be a torch.dtype (e.g. torch.bfloat16), not {dtype!r}")
    shard = _check_shard(shard) if shard is not None else None
    if zero_copy:
        if dev.type != "cpu" or shard is not None or staging_bytes is not None:
            raise InvalidArgument("zero_copy=True maps whole tensors into CPU memory: it takes no "
                                  "device other than 'cpu', no shard= and no staging_bytes")
        if not client.supports_map:
            raise InvalidArgument("zero_copy=True needs a client that supports_map "
                                  "(gpufeed+shm:// to a node with MAP)")
    shard_keys, weight_map = find_safetensors(client, bucket, key)
    if zero_copy:
        maps = [client.map_object(bucket, k, populate=False) for k in shard_keys]
        headers = [_mapped_header(bucket, k, m) for k, m in zip(shard_keys, maps)]
    else:
        headers = read_headers(client, bucket, shard_keys)
    _check_names(bucket, shard_keys, headers, weight_map)
    names = keys if keys is not None else tensors
    wanted = None
    if names is not None:
        wanted = {names} if isinstance(names, str) else set(names)
        missing = wanted - {t.name for h in headers for t in h.tensors}
        if missing:
            raise InvalidArgument(f"tensors not in {_join(bucket, str(key))}: {sorted(missing)}")
    if zero_copy:
        return _load_mapped(maps, headers, wanted, dtype)
    return _load_planned(client, bucket, shard_keys, headers, wanted, shard, dev, dtype,
                         progress=progress, staging_bytes=staging_bytes, strided=strided,
                         chunk_bytes=chunk_bytes,
                         batch_bytes=batch_bytes, max_inflight_bytes=max_inflight_bytes)


def _mapped_header(bucket: str, key: str, view: memoryview) -> SafetensorsHeader:
    """The header of a mapped shard, parsed from the mapping (the version mapped)."""
    name = _join(bucket, key)
    n = header_length(name, view[:HEADER_PREFIX_BYTES], len(view))
    return parse_header(name, view[:HEADER_PREFIX_BYTES + n], len(view))


def _load_mapped(maps: Sequence[memoryview], headers: Sequence[SafetensorsHeader],
                 wanted: set[str] | None, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Tensors viewing mapped shards (zero_copy=True), their pages mapped in first."""
    from .._memory import prefetch_range

    out: dict[str, torch.Tensor] = {}
    for view, h in zip(maps, headers):
        chosen = [t for t in h.tensors if wanted is None or t.name in wanted]
        spans: list[list[int]] = []  # byte ranges to map in, adjacent tensors merged
        for t in sorted(chosen, key=lambda t: t.begin):
            lo, hi = h.data_start + t.begin, h.data_start + t.end
            if hi <= lo:
                continue
            if spans and lo <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], hi)
            else:
                spans.append([lo, hi])
        base = address_of(view)[0] if len(view) else 0
        for lo, hi in spans:
            prefetch_range(base + lo, hi - lo)
        for t in chosen:
            if t.nbytes == 0:
                x = torch.empty(t.shape, dtype=t.torch_dtype)
            else:
                raw = torch.frombuffer(view, dtype=torch.uint8, count=t.nbytes,
                                       offset=h.data_start + t.begin)
                if (h.data_start + t.begin) % t.torch_dtype.itemsize:
                    raw = raw.clone()  # misaligned for its dtype: a copy is aligned
                x = raw.view(t.torch_dtype).reshape(t.shape)
            if dtype is not None and x.is_floating_point() and x.dtype != dtype:
                x = x.to(dtype)
            out[t.name] = x
    return out


def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgument(f"device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"device {device!r}: CUDA is not available in this torch build")
    if dev.type == "meta":
        raise InvalidArgument("device 'meta' holds no data: load to a real device")
    return dev


def _load_planned(client: Client, bucket: str, shard_keys: Sequence[str],
                  headers: Sequence[SafetensorsHeader], wanted: set[str] | None,
                  shard: tuple[int, int, ShardDim] | None, dev: torch.device,
                  dtype: torch.dtype | None, *, progress: bool | None,
                  staging_bytes: int | None, strided: str, chunk_bytes: int, batch_bytes: int,
                  max_inflight_bytes: int) -> dict[str, torch.Tensor]:
    """The load after headers are read and checked (shared with iterate_weights)."""
    total, ranges, gathers, placed = _plan(headers, shard_keys, wanted, shard, bucket, strided)
    staged = dev.type != "cpu" or staging_bytes is not None
    bar = _Progress(_want_progress(progress, total), total,
                    f"{_join(bucket, _folder(shard_keys[0]))} -> {dev}")
    try:
        if staged:
            slot_bytes = staging_bytes or DEFAULT_STAGING_BYTES
            base = torch.empty(total, dtype=torch.uint8, device=dev)
            _read_staged(client, bucket, base, _pieces(ranges, min(chunk_bytes, slot_bytes)),
                         slot_bytes=slot_bytes, progress=bar)
            _read_gathers(client, bucket, base, gathers, progress=bar)
        else:
            buf = client.alloc(total) if total else memoryview(bytearray(0))
            # map the pages in while the node fills them (no faults on first use)
            prefault = client.map_ahead(buf) if total else None
            try:
                _read_all(client, bucket, buf, _pieces(ranges, chunk_bytes),
                          batch_bytes=batch_bytes, max_inflight_bytes=max_inflight_bytes,
                          progress=bar)
            finally:
                if prefault is not None:
                    prefault.join()
            if gathers:
                _read_gathers(client, bucket, torch.frombuffer(buf, dtype=torch.uint8), gathers,
                              progress=bar)
    finally:
        bar.close()

    out: dict[str, torch.Tensor] = {}
    for p in placed:
        t = p.info
        if p.offset < 0:
            x = torch.empty(p.shape, dtype=t.torch_dtype, device=dev)
        elif staged:  # views of one device buffer
            x = base[p.offset:p.offset + p.nbytes].view(t.torch_dtype).reshape(p.shape)
        else:  # each its own storage over the client buffer (safetensors' save_file accepts them)
            x = torch.frombuffer(buf, dtype=torch.uint8, count=p.nbytes, offset=p.offset)
            x = x.view(t.torch_dtype).reshape(p.shape)
        if dtype is not None and x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
        out[t.name] = x
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return out


def _check_names(bucket: str, keys: Sequence[str], headers: Sequence[SafetensorsHeader],
                 weight_map: dict[str, str] | None) -> None:
    where: dict[str, str] = {}
    for k, h in zip(keys, headers):
        for t in h.tensors:
            if t.name in where:
                raise SafetensorsError(_join(bucket, k), f"also in {_join(bucket, where[t.name])}",
                                       tensor=t.name)
            where[t.name] = k
    for name, k in (weight_map or {}).items():
        if where.get(name) != k:
            raise SafetensorsError(_join(bucket, k), "listed in the index but not in this shard",
                                   tensor=name)


def load_safetensors_url(url: str, path: str, **kwargs) -> dict[str, torch.Tensor]:
    """:func:`load_safetensors` with its own client: connect, load, close.

    Args:
        url: the node, ``gpufeed+shm:///path/gpufeed.sock`` or
            ``gpufeed+tcp://HOST:PORT``.
        path: ``BUCKET/KEY``, where KEY is as for :func:`load_safetensors`
            (``models/llama`` loads the folder's index or shards).
        **kwargs: passed to :func:`load_safetensors`.

    Returns:
        Tensor name -> tensor; the tensors stay valid after the client closes.

    Raises:
        InvalidArgument: ``path`` has no bucket; plus what
            :func:`load_safetensors` raises.
    """
    bucket, _, key = path.removeprefix("/").partition("/")
    if not bucket:
        raise InvalidArgument(f"{path!r}: expected BUCKET/KEY")
    with Client(url) as client:
        return load_safetensors(client, bucket, key, **kwargs)
