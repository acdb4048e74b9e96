"""KV-cache tier: attention KV stored and reloaded by token prefix.

Formats: ``docs/kvcache-format.md``. The LMCache remote-storage plugin is
:mod:`gpufeed.ai.kvcache.lmcache` (not imported here: it imports LMCache;
``docs/kvcache-lmcache.md``).
"""

from ._format import ChunkFormatError, ChunkHeader
from ._hf import generate_with_cache, kv_shape_of, store_for_model
from ._keys import ChunkKey, KVLayout, chunk_keys
from ._store import ChunkUnavailable, KVCacheStore, KVMetrics, LayerStream
from ._tier import CpuTier

__all__ = [
    "KVCacheStore",
    "KVLayout",
    "KVMetrics",
    "ChunkKey",
    "ChunkHeader",
    "ChunkFormatError",
    "ChunkUnavailable",
    "CpuTier",
    "LayerStream",
    "chunk_keys",
    "generate_with_cache",
    "store_for_model",
    "kv_shape_of",
]
