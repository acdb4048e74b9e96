"""KV-cache tier: attention KV stored and reloaded by token prefix (issue 4).

Formats: ``docs/kvcache-format.md``.
"""

from ._format import ChunkFormatError, ChunkHeader
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
]
