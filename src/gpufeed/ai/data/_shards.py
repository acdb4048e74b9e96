"""The iterable dataset: WebDataset tar shards (or raw sample objects) read
shard by shard, split across ranks and DataLoader workers, shuffled at the
shard level and then through a sample buffer."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data

from ...errors import InvalidArgument
from ._common import SKIP, DatasetBase, fingerprint
from ._errors import CorruptShard
from ._fetch import ReadLimits
from ._sampling import ShuffleBuffer, epoch_order, resolve_rank, rng, split, worker
from ._source import Listed
from ._tar import parse_shard
from ._tarbatches import TensorShards, TensorSpec
from ._tarindex import TarIndex
from ._tarstream import TarStream
from ._tensors import check_dtype

__all__ = ["ShardDataset", "MAX_WORKERS", "Progress", "stream_positions"]

log = logging.getLogger("gpufeed.ai.data")

#: DataLoader workers a :class:`ShardDataset` can resume (the shared position table's size).
MAX_WORKERS = 256
# slots of the shared table; logical worker w's resume position is at _POSITIONS + w,
# and (tar shards) unit u's sample count, -1 unknown, at _COUNTS + u
_EPOCH, _RESUME, _FIRST, _POSITIONS = 0, 1, 2, 3
_COUNTS = _POSITIONS + MAX_WORKERS


@dataclass
class Progress:
    """Where one worker's stream is: its logical worker id, the raw-stream
    position of the sample it yielded last, and the ``(unit, samples)`` counts
    of the shards it parsed since the loader's collate wrapper last took them
    (plain values only: a module-level table must not keep a reader, and its
    client, alive)."""

    worker: int
    position: int
    parsed: list[tuple[int, int]]

    def take_parsed(self) -> list[tuple[int, int]]:
        """A copy of :attr:`parsed`, which is emptied in place."""
        out = list(self.parsed)
        self.parsed.clear()
        return out


#: The :class:`Progress` of each dataset (by uid) iterating in this process; the
#: loader's collate wrapper reads it (same worker process, right after).
stream_positions: dict[str, Progress] = {}


class ShardDataset(DatasetBase, torch.utils.data.IterableDataset):
    """Iterable dataset over WebDataset tar shards, or over raw sample objects.

    ``format="tar"``: each object under the prefix ending in ``.tar`` is an
    (uncompressed) shard in the ``webdataset`` package's format (other objects
    are left out) (shards written by
    ``webdataset.TarWriter`` or :func:`~gpufeed.ai.data.write_shard`); a
    sample is ``{"__key__", "__url__", ext: bytes, ...}``. Each shard is
    read whole (large reads, several shards in flight within
    ``limits.max_inflight_bytes``). ``format="objects"``: every object is a
    sample file; objects with the same key up to the first dot of their name
    (``0001.jpg``, ``0001.cls``) form one sample, read in groups with
    ``get_many_into``.

    Each epoch: the units (shards, or sample groups) are permuted with seed
    ``(seed, epoch)``, identical on every rank; rank ``r`` of ``w`` takes
    ``units[r::w]``; DataLoader worker ``k`` of ``n`` takes every ``n``-th
    of those; each worker passes its samples through a shuffle buffer of
    ``shuffle_buffer`` samples (tar shards only; raw objects are fully
    permuted already). So the workers of all ranks together read each unit
    exactly once per epoch. Call :meth:`set_epoch` (or the loader's) before
    each epoch; it reaches ``persistent_workers`` too (a small table in
    shared memory).

    Args:
        url: ``gpufeed+tcp://HOST:PORT/BUCKET[/PREFIX]`` or
            ``gpufeed+shm:///path/gpufeed.sock/BUCKET[/PREFIX]``.
        prefix: appended to the URL's key prefix, used as is.
        decode: ``decode(sample_dict) -> sample``; default: the dict itself.
        format: ``"tar"``, ``"objects"`` or ``"auto"`` (tar when every listed
            object ends in ``.tar``).
        shuffle: shuffle units per epoch and samples through the buffer.
        shuffle_buffer: samples in each worker's shuffle buffer (tar shards).
        seed: the shuffle seed (the same on every rank).
        rank, world_size: default: ``torch.distributed`` if initialised, else
            ``$RANK`` / ``$WORLD_SIZE``, else ``0`` / ``1``.
        even: drop the last ``units % world_size`` units of each epoch's
            permutation so every rank reads as many units.
        dtype: tar shards whose samples are raw tensors of this ``torch.dtype``
            (native byte order): the dataset yields whole ``[batch_size, *shape]``
            batch tensors, each sample read by its place in the shard straight
            into its row (no decode, no per-sample ``bytes``); use the
            DataLoader with ``batch_size=None``. See "Raw tensor batches" in
            ``docs/training-data.md``. Not with ``decode``.
        shape: with ``dtype``, each sample's shape (default: 1-D, and a batch's
            samples must have one size).
        ext: with ``dtype``, the extension of the file that holds each
            sample's tensor (default: every sample has exactly one file).
        batch_size: with ``dtype`` (and needed with it), samples per batch; a
            worker's last batch of an epoch may be shorter.
        on_error, max_retries, retry_backoff_s, limits, access_key, secret_key,
            request_timeout_s, connections: as for :class:`ObjectDataset`. A
            corrupt shard is skipped whole under ``"skip"``.

    Attributes:
        units: per unit, the objects it is read from (one shard, or one sample's files).

    Raises:
        InvalidArgument: a malformed URL or argument.
        NoSuchBucket: no such bucket.
        TransportError: the node cannot be reached for the listing.
    """

    def __init__(self, url: str, prefix: str = "", *, decode: Callable[[dict], Any] | None = None,
                 format: str = "auto", shuffle: bool = True, shuffle_buffer: int = 1000, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, even: bool = False,
                 on_error: str = "raise", max_retries: int = 3, retry_backoff_s: float = 0.5,
                 limits: ReadLimits | None = None, access_key: str | None = None,
                 secret_key: str | None = None, request_timeout_s: float = 30.0,
                 connections: int | None = None, dtype: torch.dtype | None = None,
                 shape: Sequence[int] | None = None, ext: str | None = None,
                 batch_size: int | None = None) -> None:
        self.dtype = dtype
        self.spec = _tensor_spec(decode, format, dtype, shape, ext, batch_size)
        self._indexes: dict[int, TarIndex] = {}
        self._setup(url, prefix, on_error=on_error, max_retries=max_retries, retry_backoff_s=retry_backoff_s,
                    limits=limits, access_key=access_key, secret_key=secret_key,
                    request_timeout_s=request_timeout_s, connections=connections)
        if format not in ("tar", "objects", "auto"):
            raise InvalidArgument(f"format must be 'tar', 'objects' or 'auto', not {format!r}")
        if type(shuffle_buffer) is not int or shuffle_buffer < 0:
            raise InvalidArgument(f"shuffle_buffer must be an int >= 0: {shuffle_buffer!r}")
        self.decode, self.shuffle, self.shuffle_buffer = decode, bool(shuffle), shuffle_buffer
        self.seed, self.even = int(seed), bool(even)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        listed = self.source.list()
        if format == "auto":
            format = "tar" if listed and all(it.key.endswith(".tar") for it in listed) else "objects"
        if format != "tar" and self.spec is not None:
            raise InvalidArgument("dtype= reads tar shards: the listed objects are not all .tar shards "
                                  "(for one object per sample, use ObjectDataset(dtype=...))")
        if format == "tar":
            listed = [it for it in listed if it.key.endswith(".tar")]
        self.format = format
        self.units = [[it] for it in listed] if format == "tar" else _sample_groups(listed)
        if listed and not split(range(len(self.units)), self.rank, self.world_size, even=self.even):
            log.warning("%s: %d %s for %d ranks: rank %d gets none each epoch", self.source.where(self.source.prefix),
                        len(self.units), "shards" if format == "tar" else "samples", self.world_size, self.rank)
        self._fingerprint = fingerprint(listed)
        self._uid = uuid.uuid4().hex
        table = _COUNTS + (len(self.units) if format == "tar" else 0)
        self._shared = torch.zeros(table, dtype=torch.int64).share_memory_()

    # --- epochs and positions -----------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._shared[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch``'s order from the next iteration on, in every
        worker (persistent ones too), from its beginning."""
        if type(epoch) is not int or epoch < 0:
            raise InvalidArgument(f"epoch must be an int >= 0: {epoch!r}")
        self._shared[_EPOCH] = epoch
        self.set_resume(None)

    def set_resume(self, positions: list[int] | None, first: int = 0,
                   counts: Mapping[int, int] | None = None) -> None:
        """Start the next iteration part-way: logical worker ``k`` skips the
        first ``positions[k]`` samples of its stream, and DataLoader worker
        ``j`` plays logical worker ``(j + first) % len(positions)`` (DataLoader
        asks its workers for batches round-robin from worker 0, so ``first`` is
        the worker the interrupted run would have asked next). ``counts`` maps
        tar units to their number of samples, as far as known: with them the
        workers re-read only the shards they still need (see ``_tarstream``).
        ``None``: start at the beginning. :class:`~gpufeed.ai.data.ResumableLoader`
        calls this from its saved state.

        Raises:
            InvalidArgument: more than :data:`MAX_WORKERS` positions, a negative
                one, ``first`` not a worker, or a count of no unit.
        """
        if positions is None:
            self._shared[_RESUME] = 0
            return
        if len(positions) > MAX_WORKERS or any(type(p) is not int or p < 0 for p in positions):
            raise InvalidArgument(f"need at most {MAX_WORKERS} positions, each an int >= 0")
        if type(first) is not int or not 0 <= first < max(1, len(positions)):
            raise InvalidArgument(f"first must be a worker index: {first!r}")
        if self.format == "tar":
            self._shared[_COUNTS:] = -1
            for u, n in (counts or {}).items():
                if not 0 <= u < len(self.units) or n < 0:
                    raise InvalidArgument(f"a saved sample count of no shard: unit {u}, {n} samples")
                self._shared[_COUNTS + u] = n
        self._shared[_POSITIONS:_POSITIONS + len(positions)] = torch.tensor(positions, dtype=torch.int64)
        self._shared[_FIRST] = first
        self._shared[_RESUME] = len(positions)

    def _logical_worker(self) -> tuple[int, int, int]:
        """``(logical worker, workers, samples to skip)`` for the iteration starting here."""
        wid, nworkers = worker()
        saved = int(self._shared[_RESUME])
        if saved == 0:
            return wid, nworkers, 0
        if saved != nworkers:
            raise InvalidArgument(f"the saved position is for {saved} DataLoader workers, "
                                  f"this loader has {nworkers}: resume with the same num_workers")
        wid = (wid + int(self._shared[_FIRST])) % nworkers
        return wid, nworkers, int(self._shared[_POSITIONS + wid])

    def state_dict(self) -> dict:
        """The dataset's part of a saved position: its epoch, order settings and
        listing fingerprint (the per-worker positions are the loader's)."""
        return {"kind": "shards", "epoch": self.epoch, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer, "rank": self.rank, "world_size": self.world_size,
                "even": self.even, "units": len(self.units), "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Take the epoch of ``state`` after checking that it was saved over the
        same listing with the same order settings.

        Raises:
            InvalidArgument: another kind of dataset, listing, rank or settings.
        """
        mine = self.state_dict()
        diff = sorted(k for k in mine if k != "epoch" and state.get(k) != mine[k])
        if diff:
            raise InvalidArgument("the saved data state does not match this dataset: " +
                                  ", ".join(f"{k} saved {state.get(k)!r}, here {mine[k]!r}" for k in diff))
        self.set_epoch(int(state["epoch"]))

    # --- iteration ------------------------------------------------------------------------
    def my_units(self, epoch: int, wid: int = 0, nworkers: int = 1) -> list[int]:
        """Indices into :attr:`units` that worker ``wid`` of ``nworkers`` of this
        rank reads in epoch ``epoch``, in reading order."""
        order = epoch_order(len(self.units), self.seed, epoch, self.shuffle)
        return split(split(order, self.rank, self.world_size, even=self.even), wid, nworkers)

    def __iter__(self) -> Iterator[Any]:
        wid, nworkers, skip = self._logical_worker()
        epoch = self.epoch
        mine = self.my_units(epoch, wid, nworkers)
        stream: Iterator[tuple[dict, Any]]  # (raw sample, its shard or its objects)
        if self.spec is not None:
            yield from self._tensor_batches(wid, skip, epoch, mine)
            return
        if self.format == "tar":
            gen = rng(self.seed, epoch, self.rank, wid)
            buf: ShuffleBuffer = ShuffleBuffer(self.shuffle_buffer if self.shuffle else 0, gen)
            tar = TarStream(mine, [u[0] for u in self.units], self.reader.read, self._parse, buf,
                            self.source.bucket)
            counts = self._shared[_COUNTS:].tolist() if skip else []
            pos, stream = tar.start(skip, counts.__getitem__)
            parsed = tar.parsed  # the stream appends to this list; Progress.take_parsed empties it
        else:  # raw objects: the order is known from the listing, so a resume reads nothing it skips
            pos, stream, parsed = skip, self._object_samples(mine, skip), []
        for raw, unit in stream:
            pos += 1
            if pos <= skip:
                continue  # replaying a tar stream without its shards' sample counts
            units = unit if isinstance(unit, list) else [unit]
            sample = self.decode_or_skip(self.decode, raw, units[0].key, functools.partial(self._reread, units, raw),
                                         raw["__key__"] if self.format == "tar" else None)
            stream_positions[self._uid] = Progress(wid, pos, parsed)
            if sample is not SKIP:
                yield sample

    def _tensor_batches(self, wid: int, skip: int, epoch: int, mine: list[int]) -> Iterator[torch.Tensor]:
        assert self.spec is not None
        buf: ShuffleBuffer = ShuffleBuffer(self.shuffle_buffer if self.shuffle else 0,
                                           rng(self.seed, epoch, self.rank, wid))
        saved = self._shared[_COUNTS:].tolist() if skip else []
        parsed: list[tuple[int, int]] = []
        shards = TensorShards(self.reader, [u[0] for u in self.units], self.spec, self._indexes)
        for pos, batch in shards.batches(mine, buf, skip, saved.__getitem__, parsed):
            stream_positions[self._uid] = Progress(wid, pos, parsed)
            yield batch

    def _parse(self, shard: Listed, data) -> list[dict]:
        try:
            return parse_shard(data, self.source.where(shard.key))
        except CorruptShard as exc:
            exc.bucket, exc.key = self.source.bucket, shard.key
            if self.policy.on_error == "retry":
                for _ in range(self.policy.max_retries):
                    again = self.reader.read_one(shard)
                    try:
                        return parse_shard(again, self.source.where(shard.key)) if again is not None else []
                    except CorruptShard:
                        pass
            if self.policy.on_error == "skip":
                self.reader.skip(exc)
                return []
            raise

    def _object_samples(self, mine: list[int], skip: int) -> Iterator[tuple[dict, list[Listed]]]:
        units = [self.units[i] for i in mine[skip:]]
        reads = self.reader.read(it for unit in units for it in unit)
        for unit in units:
            datas = [next(reads)[1] for _ in unit]
            if all(d is not None for d in datas):
                yield self._assemble(unit, datas), unit

    def _assemble(self, unit: list[Listed], datas: list) -> dict:
        """One raw-objects sample: ``{"__key__", "__url__", ext: bytes}`` (an
        object without an extension gives ``""``)."""
        sample: dict = {"__key__": _split(unit[0].key)[0], "__url__": self.source.where(unit[0].key)}
        for it, data in zip(unit, datas):
            sample[_split(it.key)[1]] = bytes(data)
        return sample

    def _reread(self, unit: list[Listed], raw: dict) -> Any:
        if self.format == "tar":
            data = self.reader.read_one(unit[0])
            if data is None:
                return SKIP
            found = [s for s in self._parse(unit[0], data) if s["__key__"] == raw["__key__"]]
            return found[0] if found else SKIP
        datas = [self.reader.read_one(it) for it in unit]
        return SKIP if any(d is None for d in datas) else self._assemble(unit, datas)


def _tensor_spec(decode, format: str, dtype, shape, ext, batch_size) -> TensorSpec | None:
    """The raw-tensor settings, checked (``None`` without ``dtype``).

    Raises:
        InvalidArgument: ``decode`` with ``dtype``, a tensor setting without
            ``dtype``, no ``batch_size``, raw objects, or a bad value.
    """
    if dtype is None:
        if shape is not None or ext is not None or batch_size is not None:
            raise InvalidArgument("shape=, ext= and batch_size= need dtype=")
        return None
    if decode is not None:
        raise InvalidArgument("decode= and dtype= exclude each other (dtype samples are raw tensors)")
    if format == "objects":
        raise InvalidArgument("dtype= reads tar shards (for one object per sample, use ObjectDataset(dtype=...))")
    if type(batch_size) is not int or batch_size < 1:
        raise InvalidArgument(f"dtype= needs batch_size=, an int >= 1 (the dataset yields whole batches): "
                              f"{batch_size!r}")
    if ext is not None and (not isinstance(ext, str) or not ext):
        raise InvalidArgument(f"ext must be a file extension such as 'bin': {ext!r}")
    return TensorSpec(dtype, check_dtype(dtype, shape), ext.lower() if ext else None, batch_size)


def _split(key: str) -> tuple[str, str]:
    """``"dir/0001.seg.png"`` -> ``("dir/0001", "seg.png")``: the sample key up
    to the first dot of the name, and the extension (``""`` without one)."""
    head, sep, name = key.rpartition("/")
    base, _, ext = name.partition(".")
    return head + sep + base, ext


def _sample_groups(listed: list[Listed]) -> list[list[Listed]]:
    """Listed objects grouped into samples by key up to the first dot of the
    name, in the order of each sample's first object (a folder whose name has a
    dot may sort between one sample's objects: ``x/1.jpg``, ``x/1.k/z.png``,
    ``x/1.txt``)."""
    groups: dict[str, list[Listed]] = {}
    for it in listed:
        groups.setdefault(_split(it.key)[0], []).append(it)
    return list(groups.values())
