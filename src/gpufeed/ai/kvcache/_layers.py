"""Layer-wise reads of the KV cache (:meth:`KVCacheStore.get_layers
<gpufeed.ai.kvcache.KVCacheStore.get_layers>`): :class:`LayerStream` reads
layer after layer of every cached chunk, the next ``depth`` layers in flight,
and raises :class:`ChunkUnavailable` when a chunk vanishes mid-stream."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from ...client import ReadRequest
from ...errors import GpufeedError
from ._format import ChunkHeader, block_checksum
from ._keys import ChunkKey
from ._reads import _u8

if TYPE_CHECKING:
    from ._store import KVCacheStore

__all__ = ["ChunkUnavailable", "LayerStream"]

#: One layer in flight: ``(layer, out [2, tokens, H, D], (future or None, digests, errors))``.
_Inflight = tuple[int, torch.Tensor, tuple[Future[list[int]] | None, list, list]]


class ChunkUnavailable(LookupError):
    """A chunk became unavailable (evicted, corrupt, node down) during a layer-wise read.

    Attributes:
        tokens: leading tokens whose KV is still valid for every layer.
    """

    def __init__(self, msg: str, tokens: int) -> None:
        super().__init__(msg)
        self.tokens = tokens


class LayerStream:
    """Iterator of ``(layer, keys [n, H, D], values [n, H, D])`` from :meth:`KVCacheStore.get_layers`.

    Attributes:
        tokens: ``n``, the leading tokens found (chunk headers present and matching).
    """

    def __init__(self, store: KVCacheStore, tokens, depth: int) -> None:
        self._s = store
        self._depth = max(1, depth)
        cks = store.keys(tokens)
        i = 0
        while i < len(cks) and cks[i].key in store.tier:
            i += 1
        self._tier_cks = cks[:i]
        self._client = store._node() if i < len(cks) else None
        self._node_cks: list[ChunkKey] = []
        self._hdrs: list[ChunkHeader] = []
        if self._client is not None:
            self._node_cks, self._hdrs = self._headers(cks[i:])
        found = self._tier_cks + self._node_cks
        self.tokens = found[-1].end if found else 0

    def _headers(self, cks):
        hdrs = self._s._probe_headers(self._client, cks)
        return cks[:len(hdrs)], hdrs

    def _submit(self, layer: int) -> _Inflight:
        """Fill ``layer`` of the tier chunks into a new ``[2, tokens, H, D]`` buffer
        and start the node reads of the others into it.

        Raises:
            ChunkUnavailable: a tier chunk was evicted since the stream started.
        """
        s, lay = self._s, self._s.layout
        out = torch.empty((2, self.tokens, lay.num_kv_heads, lay.head_dim), dtype=s.torch_dtype)
        for ck in self._tier_cks:
            chunk = s.tier.get(ck.key)
            if chunk is None:
                raise ChunkUnavailable(f"{ck.key} left the CPU tier at layer {layer}", ck.start)
            out[:, ck.start:ck.end].copy_(chunk[:, layer])
        items: list[ReadRequest] = []
        for ck in self._node_cks:
            block = s._block_bytes(ck.tokens)
            for kv in range(2):
                off = s.header_len + (kv * lay.num_layers + layer) * block
                items.append(ReadRequest(s.bucket, ck.key, _u8(out[kv, ck.start:ck.end]), off, block,
                                         block if s.verify else 0))
        sums: list = []
        errs: list = []
        fut = None
        if items:
            assert self._client is not None  # node chunks are only found through a client
            fut = self._client.submit_get_many_into(items, digests_out=sums, errors_out=errs)
        return layer, out, (fut, sums, errs)

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        s, L = self._s, self._s.layout.num_layers
        if self.tokens == 0:
            return
        inflight: list[_Inflight] = []
        nxt = 0
        try:
            while nxt < L or inflight:
                while nxt < L and len(inflight) < self._depth:
                    inflight.append(self._submit(nxt))
                    nxt += 1
                layer, out, (fut, sums, errs) = inflight.pop(0)
                if fut is not None:
                    try:
                        ns = fut.result()
                    except (GpufeedError, OSError) as exc:
                        s._failed(exc)
                        raise ChunkUnavailable(f"layer {layer}: {exc}", self._valid(layer, out)) from exc
                    for j, (ck, h) in enumerate(zip(self._node_cks, self._hdrs)):
                        # chunks before this one are whole in every layer read so far
                        block = s._block_bytes(ck.tokens)
                        if not s._complete(ck, errs[2 * j:2 * j + 2], ns[2 * j:2 * j + 2], [block, block]):
                            raise ChunkUnavailable(f"{ck.key} is gone or short at layer {layer}", ck.start)
                        if not s.verify:
                            continue
                        for kv in range(2):
                            d = s._block_sums(sums, 2 * j + kv, 1)
                            got = d[0] if d else block_checksum(_u8(out[kv, ck.start:ck.end]))
                            if got != h.checksums[kv * L + layer]:
                                s._corrupt(ck, f"checksum mismatch in {ck.key} layer {layer}")
                                raise ChunkUnavailable(
                                    f"checksum mismatch in {ck.key} layer {layer}", ck.start)
                s.metrics.add(bytes_read=out.numel() * out.element_size())
                yield layer, out[0], out[1]
        finally:
            for _l, _o, (f, _s, _e) in inflight:
                if f is not None:
                    try:
                        f.result()
                    except Exception:
                        pass

    def _valid(self, layer: int, out) -> int:
        return self._tier_cks[-1].end if self._tier_cks else 0
