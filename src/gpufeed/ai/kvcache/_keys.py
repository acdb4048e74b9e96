"""Chunked, chained prefix keys for KV-cache chunks (spec: ``docs/kvcache-format.md``).

A token sequence is cut into chunks of ``chunk_tokens`` tokens. Chunk ``i``'s
digest is a BLAKE2b-128 hash chained over chunk ``i - 1``'s digest and this
chunk's token ids, rooted in a digest of the :class:`KVLayout` (model id, KV
dtype, layer layout, tensor-parallel rank and world size, chunk size). Two
sequences therefore share chunk ``i``'s key only if they share every token up
to the end of chunk ``i`` *and* the layout: KV written by another model, dtype,
head layout or TP shard can never be returned for a colliding prefix.

Hashing uses :mod:`hashlib` only (no salted ``hash()``), so keys are the same
in every process, on every host and after restarts.

Sources: the chained block hash of vLLM's automatic prefix caching
(``hash_block_tokens(parent_hash, token_ids, extra_keys)``,
https://docs.vllm.ai/en/latest/design/prefix_caching.html) and LMCache's
``ChunkedTokenDatabase`` (prefix-hash chain over 256-token chunks with an
optional "unfull" last chunk, https://docs.lmcache.ai).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .._dtypes import DTYPES

__all__ = ["KVLayout", "ChunkKey", "chunk_keys", "DTYPE_CODES", "dtype_name"]

#: KV dtypes a chunk may hold, by name -> (code in the chunk header, bytes per element):
#: the codes of :data:`gpufeed.ai._dtypes.DTYPES` (all but int8).
DTYPE_CODES: dict[str, tuple[int, int]] = {
    name: DTYPES[name] for name in ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "uint8")
}

_ROOT_PERSON = b"gpufeed-kv-root"  # BLAKE2b personalisation (<= 16 bytes)
_CHUNK_PERSON = b"gpufeed-kv-chunk"
_U32 = struct.Struct("<I")


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` / ``numpy.float32`` -> ``"bfloat16"`` / ``"float32"``.

    Raises:
        ValueError: a dtype no chunk may hold (see :data:`DTYPE_CODES`).
    """
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_CODES:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in DTYPE_CODES:
        raise ValueError(f"unsupported KV dtype {dtype!r}; one of {sorted(DTYPE_CODES)}")
    return name


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Everything that makes KV bytes of one token prefix differ; part of every key.

    Args:
        model_id: the model's name and revision (``"meta-llama/Llama-3.1-8B@abc123"``);
            any string, hashed as UTF-8.
        dtype: KV element type name (a key of :data:`DTYPE_CODES`, or a torch/numpy dtype).
        num_layers: attention layers stored per chunk.
        num_kv_heads: KV heads *of this tensor-parallel shard*.
        head_dim: elements per head.
        tp_rank: this shard's tensor-parallel rank, ``0 <= tp_rank < tp_size``.
        tp_size: tensor-parallel world size.
        chunk_tokens: tokens per chunk (default 256).

    Raises:
        ValueError: a non-positive size, a bad rank, an unsupported dtype.
    """

    model_id: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    tp_rank: int = 0
    tp_size: int = 1
    chunk_tokens: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        for name in ("num_layers", "num_kv_heads", "head_dim", "tp_size", "chunk_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, not {v!r}")
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank must be in [0, {self.tp_size}), not {self.tp_rank!r}")
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ValueError("model_id must be a non-empty string")

    @property
    def itemsize(self) -> int:
        """Bytes per KV element."""
        return DTYPE_CODES[self.dtype][1]

    def token_bytes(self) -> int:
        """KV bytes of one token over all layers, K and V: ``2 * L * H * D * itemsize``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.itemsize

    def descriptor(self) -> bytes:
        """The canonical bytes hashed into the root digest: compact JSON, sorted keys, UTF-8."""
        return json.dumps({"gpufeed_kv": 1, **asdict(self)}, sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def root_digest(self) -> bytes:
        """16-byte BLAKE2b of :meth:`descriptor` (personalisation ``gpufeed-kv-root``)."""
        return hashlib.blake2b(self.descriptor(), digest_size=16, person=_ROOT_PERSON).digest()


@dataclass(frozen=True, slots=True)
class ChunkKey:
    """Chunk ``index`` of a sequence: tokens ``[start, end)``, its 16-byte chained
    ``digest`` and object ``key`` (``"<prefix>/<32 hex digits>"``)."""

    index: int
    start: int
    end: int
    digest: bytes
    key: str

    @property
    def tokens(self) -> int:
        return self.end - self.start


def _token_bytes(tokens) -> bytes:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be 1-D, not shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"token ids must be integers, not {arr.dtype}")
    return arr.astype("<i8", copy=False).tobytes()


def chunk_keys(tokens: Sequence[int], layout: KVLayout, *, prefix: str = "kv",
               partial: bool = False) -> list[ChunkKey]:
    """Keys of the chunks of ``tokens``, in order.

    ``digest_0 = BLAKE2b-128(root || u32 n || int64 tokens[0:n])`` and
    ``digest_i = BLAKE2b-128(digest_{i-1} || u32 n || int64 tokens[...])`` with
    personalisation ``gpufeed-kv-chunk``; ``root`` is :meth:`KVLayout.root_digest`,
    ``n`` the chunk's token count, integers little-endian.

    Args:
        tokens: token ids (list, numpy or torch 1-D integer tensor).
        layout: the KV layout (model, dtype, layers, TP shard, chunk size).
        prefix: key prefix inside the bucket.
        partial: also return a key for a last chunk shorter than ``chunk_tokens``.

    Returns:
        One :class:`ChunkKey` per full chunk (plus the partial one if asked).

    Raises:
        ValueError: tokens not a 1-D integer sequence.
    """
    if hasattr(tokens, "detach"):  # torch tensor without importing torch
        tokens = tokens.detach().cpu().numpy()
    raw = _token_bytes(tokens)
    total = len(raw) // 8
    step = layout.chunk_tokens
    out: list[ChunkKey] = []
    prev = layout.root_digest()
    end_full = total - total % step
    stop = total if partial else end_full
    for i, start in enumerate(range(0, stop, step)):
        end = min(start + step, total)
        h = hashlib.blake2b(digest_size=16, person=_CHUNK_PERSON)
        h.update(prev)
        h.update(_U32.pack(end - start))
        h.update(raw[start * 8:end * 8])
        prev = h.digest()
        out.append(ChunkKey(i, start, end, prev, f"{prefix}/{prev.hex()}"))
    return out
