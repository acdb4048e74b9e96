"""Zero-copy loads (``load_safetensors(..., zero_copy=True)``): tensors that
view shards mapped from the node (:meth:`gpufeed.client.Client.map_object`),
their pages mapped in before they are returned.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._memory import address_of
from ._readplan import _join
from ._safetensors import HEADER_PREFIX_BYTES, SafetensorsHeader, header_length, parse_header

__all__: list[str] = []

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
