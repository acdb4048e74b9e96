"""Read planning for :func:`gpufeed.ai.load_safetensors`: where each tensor's
bytes are in the objects and where they go in the destination buffer.

Every selected tensor (or, under ``shard=``, this rank's slice of it) gets a
64-byte aligned offset in ONE buffer. Tensors that are adjacent in a shard and
stay aligned form a *run*: one contiguous range of the object. A slice along
dim 0 is one range; a slice along a later dim is one small range per index of
the leading dims, or whole rows gathered in memory (:class:`_Gather`).
Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgument
from ._safetensors import SafetensorsHeader, TensorInfo

__all__ = ["ShardDim", "ALIGN_BYTES", "STRIDED_ROW_BYTES"]

#: Every tensor starts at a multiple of this inside the destination buffer.
ALIGN_BYTES = 64
#: ``strided="auto"`` reads a strided slice as whole rows when a row (the bytes
#: per index of the dims before the sharded one) is smaller than this. Measured
#: on the 2-core VM, 1 GB Llama, dim-1 slices: one range costs ~10 us (client +
#: node) against ~13 GB/s for bytes, so below ~100 KB a row is cheaper to read
#: whole: 0.19 s (whole rows) vs 1.47 s (155k ranges of 2 KB) at world size 2.
STRIDED_ROW_BYTES = 128 << 10  # 128 KiB
#: ``dim`` of ``shard=(rank, world_size, dim)``: one dim for every tensor, None
#: (no slicing), or tensor name -> dim (None: that tensor whole).
ShardDim = int | None | Callable[[str], "int | None"]


@dataclass(frozen=True, slots=True)
class _Range:
    key: str  # object key
    offset: int  # in the object
    dest: int  # in the destination buffer
    length: int


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


def _join(bucket: str, key: str) -> str:
    return f"{bucket}/{key}"


def _folder(key: str) -> str:
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


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
