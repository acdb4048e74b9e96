"""Training data from gpufeed for PyTorch: datasets, a resumable loader, tar shards.

* :class:`ObjectDataset`: map-style, one object under a prefix = one sample;
  batches read with ``get_many_into``; :class:`ResumableSampler` for
  distributed, epoch-seeded order.
* :class:`ShardDataset`: iterable, over WebDataset tar shards (the
  ``webdataset`` package's format) or raw sample objects; split across ranks
  and DataLoader workers, shard-level shuffle then a sample shuffle buffer,
  bounded read-ahead; with ``dtype=`` it yields raw-tensor batches whose
  samples are read by their place in the shard straight into their rows.
* :class:`ResumableLoader`: a ``DataLoader`` whose ``state_dict()`` resumes
  mid-epoch at the next batch (save it with :func:`gpufeed.ai.save`); with an
  ``ObjectDataset``, exactly the batches not delivered, also with ``in_order=False``.
* :func:`write_shard`, :func:`parse_shard`: the tar shard format.
* :func:`collate`: the ``collate_fn`` for ``ObjectDataset(..., dtype=...)``:
  each batch was read straight into its tensor, handed on without a copy.

The whole guide: ``docs/training-data.md``.

The package, one concern a module, imports in one direction::

    _errors    DataError and its subclasses
    _tar       WebDataset tar shards: strict reader, writer
    _sampling  ranks, workers, epoch-seeded shuffles, the shuffle buffer
    _source    node + bucket + prefix, one client per process, listing, ErrorPolicy
    _fetch     Reader: bounded read-ahead, batched small reads, the error policy
    _common    what both datasets share (decode under the policy, fingerprint)
    _tensors   raw-tensor samples: batches read straight into their tensor, collate
    _epochbatches an ObjectDataset epoch as numbered batches, and which were delivered
    _objects   ObjectDataset, ResumableSampler
    _tarstream one worker's tar sample stream, and its resume from sample counts
    _tarindex  where each sample lies in a tar shard (from its headers by range, or parsed)
    _tarbatches raw-tensor batches of tar shards: placeholders, then GETR into the batch rows
    _shards    ShardDataset
    _loader    ResumableLoader

Errors (all :class:`~gpufeed.errors.GpufeedError`; each names the object)::

    DataError
    ├── SampleMissing (NotFoundError)   listed, then deleted during the epoch
    ├── SampleChanged                   rewritten with another size during the epoch
    ├── CorruptShard                    a tar shard that does not parse
    ├── SampleDecodeError               ``decode`` raised
    └── SampleReadError                 the read failed after the retries (node down)
"""

from __future__ import annotations

from ._errors import CorruptShard, DataError, SampleChanged, SampleDecodeError, SampleMissing, SampleReadError
from ._fetch import ReadLimits
from ._loader import ResumableLoader
from ._objects import ObjectDataset, ResumableSampler
from ._shards import MAX_WORKERS, ShardDataset
from ._source import ErrorPolicy
from ._tar import parse_shard, write_shard
from ._tensors import TensorBatch, collate

__all__ = [
    "ObjectDataset",
    "ShardDataset",
    "ResumableSampler",
    "ResumableLoader",
    "ReadLimits",
    "ErrorPolicy",
    "MAX_WORKERS",
    "write_shard",
    "parse_shard",
    "collate",
    "TensorBatch",
    "DataError",
    "SampleMissing",
    "SampleChanged",
    "CorruptShard",
    "SampleDecodeError",
    "SampleReadError",
]
