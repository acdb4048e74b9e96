"""Training checkpoints stored in gpufeed as content-addressed chunks.

Layout under ``<bucket>/<prefix>/`` (the full spec: ``docs/checkpoint-format.md``)::

    chunks/<blake3 hex>            bytes of one tensor piece (at most chunk_bytes)
    steps/<step:012d>/manifest     msgpack Manifest: every tensor, its chunks, DCP metadata
    steps/<step:012d>/commit       msgpack Commit, written LAST: the step exists only with it

Each tensor's bytes are cut at tensor boundaries into fixed-size chunks and
stored under their BLAKE3 hash, so a tensor that did not change between two
saves (frozen base weights, embeddings) is neither written nor stored again.
Deleting a step removes only the chunks no remaining step references.

Public surface:

* :func:`save` / :func:`load`: a nested state dict (model + optimizer + plain
  Python values) to a step and back, no process group needed.
* :func:`checkpoints` -> :class:`Checkpoints`: list steps, ``latest()``,
  ``delete(step)``, ``keep_last(n)``, ``gc()``, ``scrub()``.
* :mod:`gpufeed.ai.dcp`: ``Writer`` / ``Reader`` for ``torch.distributed.checkpoint``.

The package, one concern a module, imports in one direction::

    _format    constants, errors, Location, manifest/commit structs, chunk_hash
    _session   one pooled Client per node URL and process
    _chunks    ChunkUploader (hash + put), read_chunks (read + verify)
    _inflight  this process's async saves per location
    _steps     Checkpoints: list, manifest, commit, delete, gc, scrub
    _staging   CPU staging copies for async saves
    _dcp       the DCP Writer / Reader (imports torch.distributed: loaded on first use)
    _api       save / load

Errors (all :class:`~gpufeed.errors.GpufeedError`)::

    CheckpointError
    ├── CheckpointNotFound (NotFoundError)    no committed step / the step asked for
    └── CorruptCheckpoint                     bad manifest, hash or size mismatch
        └── MissingChunk (NotFoundError)      a manifest names a chunk that is gone
"""

from __future__ import annotations

from ._api import SKELETON_KEY, SaveResult, load, read_entries, save
from ._chunks import ChunkUploader, UploadStats, read_chunks
from ._format import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_WORKERS,
    FORMAT,
    FORMAT_VERSION,
    MAX_STEP,
    CheckpointError,
    CheckpointNotFound,
    Chunk,
    Commit,
    CorruptCheckpoint,
    Entry,
    Location,
    Manifest,
    MissingChunk,
    chunk_hash,
    parse_checkpoint_url,
    tensor_bytes,
)
from ._staging import populate_tensors
from ._steps import Checkpoints, ScrubReport, checkpoints

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_WORKERS",
    "MAX_STEP",
    "SKELETON_KEY",
    "CheckpointError",
    "CheckpointNotFound",
    "CorruptCheckpoint",
    "MissingChunk",
    "Location",
    "parse_checkpoint_url",
    "Chunk",
    "Entry",
    "Manifest",
    "Commit",
    "SaveResult",
    "ScrubReport",
    "Checkpoints",
    "checkpoints",
    "save",
    "load",
    "read_entries",
    "chunk_hash",
    "tensor_bytes",
    "ChunkUploader",
    "UploadStats",
    "read_chunks",
    "populate_tensors",
]
