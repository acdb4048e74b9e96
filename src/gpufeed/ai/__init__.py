"""AI integrations on top of the fast-path client.

* model loading: :func:`load_safetensors`, :func:`load_safetensors_url`
  (safetensors straight into tensor memory; ``keys=``, ``shard=`` for tensor
  parallelism, CUDA through pinned staging), :func:`load_pretrained` (a Hugging
  Face folder into an ``nn.Module``, with :func:`empty_weights`) and
  :func:`iterate_weights` (vLLM-style, shard by shard);
* checkpoints: :func:`save`, :func:`load`, :func:`checkpoints` (content-addressed,
  deduplicated across steps) and ``gpufeed.ai.dcp.Writer`` / ``Reader`` for
  ``torch.distributed.checkpoint``;
* the KV-cache tier: ``gpufeed.ai.kvcache`` (:class:`KVCacheStore`,
  :func:`generate_with_cache`);
* training data: ``gpufeed.ai.data`` (``ObjectDataset``, ``ShardDataset``
  over WebDataset tar shards, ``ResumableLoader``).

Each module here uses :mod:`gpufeed.client`; none reaches into the engine.
"""

import importlib

from ._models import (
    find_safetensors,
    gds_status,
    load_safetensors,
    load_safetensors_url,
    read_headers,
)
from ._safetensors import SafetensorsError, SafetensorsHeader, TensorInfo, parse_header
from ._weights import (
    StateDictMismatch,
    TiedWeightsDiffer,
    empty_weights,
    iterate_weights,
    load_pretrained,
)
from .checkpoint import (
    CheckpointError,
    CheckpointNotFound,
    Checkpoints,
    CorruptCheckpoint,
    MissingChunk,
    SaveResult,
    ScrubReport,
    checkpoints,
    load,
    parse_checkpoint_url,
    save,
)

__all__ = [
    "load_safetensors",
    "load_safetensors_url",
    "find_safetensors",
    "read_headers",
    "load_pretrained",
    "iterate_weights",
    "empty_weights",
    "StateDictMismatch",
    "TiedWeightsDiffer",
    "gds_status",
    "parse_header",
    "SafetensorsError",
    "SafetensorsHeader",
    "TensorInfo",
    "save",
    "load",
    "checkpoints",
    "Checkpoints",
    "SaveResult",
    "ScrubReport",
    "CheckpointError",
    "CheckpointNotFound",
    "CorruptCheckpoint",
    "MissingChunk",
    "parse_checkpoint_url",
    "KVCacheStore",
    "generate_with_cache",
    "dcp",
    "kvcache",
    "data",
]

_LAZY_MODULES = {"dcp", "kvcache", "data"}  # dcp imports torch.distributed; load on first use
_LAZY_NAMES = {"KVCacheStore": "kvcache", "generate_with_cache": "kvcache"}


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
