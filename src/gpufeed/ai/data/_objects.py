"""The map-style dataset: one object under a prefix is one sample; and the
sampler that splits it across ranks, shuffles it per epoch and resumes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch.utils.data

from ...errors import InvalidArgument
from ._common import SKIP, DatasetBase, fingerprint
from ._epochbatches import note_batch
from ._errors import DataError
from ._fetch import ReadLimits
from ._sampling import epoch_order, resolve_rank, split
from ._source import Listed
from ._tensors import SampleList, as_sample, check_dtype, read_tensor_batch

__all__ = ["ObjectDataset", "ResumableSampler"]


class ObjectDataset(DatasetBase, torch.utils.data.Dataset):
    """Map-style dataset over the objects under a prefix: ``ds[i]`` is the
    ``i``-th object in key order, decoded.

    The prefix is listed once, when the dataset is made (in the main process),
    so every DataLoader worker and every rank that lists the same objects sees
    the same indices. ``DataLoader`` fetches whole batches through
    :meth:`__getitems__`, which reads small objects in groups with
    ``get_many_into`` (one round trip per group) and large ones whole, many
    requests in flight. Pickling the dataset (to DataLoader workers) carries
    no connection: each process opens its own client on first read.

    Use :meth:`sampler` for distributed, epoch-seeded, resumable order, and
    :class:`~gpufeed.ai.data.ResumableLoader` to save and restore the position
    mid-epoch.

    Args:
        url: ``gpufeed+tcp://HOST:PORT/BUCKET[/PREFIX]`` or
            ``gpufeed+shm:///path/gpufeed.sock/BUCKET[/PREFIX]``.
        prefix: appended to the URL's key prefix, used as is (``"train/"``).
        decode: ``decode(data) -> sample``; ``data`` is a writable
            ``memoryview`` of exactly the object's bytes, in memory of the
            process's read pool that is reused only once no view of it is left
            (``torch.frombuffer(data, dtype=...)`` keeps it without a copy).
            Default: the object's ``bytes``. Not with ``dtype``.
        dtype: samples are raw tensors of this ``torch.dtype`` (native byte
            order): ``ds[i]`` is the object's bytes viewed as a tensor, and a
            batch of equal-sized objects is read straight into one
            ``[batch, *shape]`` tensor (in a DataLoader worker, in memory shared
            with the main process); pass :func:`~gpufeed.ai.data.collate` as
            the DataLoader's ``collate_fn`` to take that tensor without a copy.
            An object whose size does not fit fails to decode (``on_error``
            applies). See :mod:`gpufeed.ai.data._tensors`.
        shape: with ``dtype``, each sample's shape (default: 1-D).
        on_error: ``"raise"`` (default), ``"skip"`` or ``"retry"``; see
            :class:`~gpufeed.ai.data.ErrorPolicy`. Skipped samples leave their
            batch shorter; ``ds[i]`` alone raises for a sample it cannot give.
        max_retries: retries per object for ``"retry"``.
        retry_backoff_s: seconds before the first retry, doubled after each.
        limits: read-ahead bytes/objects and grouping (:class:`ReadLimits`).
        access_key, secret_key: the node key (default: as ``Client`` resolves it).
        request_timeout_s: a read that makes no progress for this long fails
            (seconds), so a stopped node never hangs a step.
        connections: pooled connections per process (``Client``'s default if ``None``).

    Attributes:
        items: the listed objects (``.key``, ``.size`` in bytes), in key order.

    Raises:
        InvalidArgument: a malformed URL or argument.
        NoSuchBucket: no such bucket.
        TransportError: the node cannot be reached for the listing.
    """

    def __init__(self, url: str, prefix: str = "", *, decode: Callable[[memoryview], Any] | None = None,
                 on_error: str = "raise", max_retries: int = 3, retry_backoff_s: float = 0.5,
                 limits: ReadLimits | None = None, access_key: str | None = None,
                 secret_key: str | None = None, request_timeout_s: float = 30.0,
                 connections: int | None = None, dtype: torch.dtype | None = None,
                 shape: Sequence[int] | None = None) -> None:
        if dtype is not None and decode is not None:
            raise InvalidArgument("decode= and dtype= exclude each other (dtype samples are raw tensors)")
        if dtype is None and shape is not None:
            raise InvalidArgument("shape= needs dtype=")
        self.shape = check_dtype(dtype, shape) if dtype is not None else None
        self.dtype = dtype
        self._setup(url, prefix, on_error=on_error, max_retries=max_retries, retry_backoff_s=retry_backoff_s,
                    limits=limits, access_key=access_key, secret_key=secret_key,
                    request_timeout_s=request_timeout_s, connections=connections)
        self.decode = decode
        self.items: list[Listed] = self.source.list()
        self._fingerprint = fingerprint(self.items)

    @property
    def keys(self) -> list[str]:
        """The object keys, in index order."""
        return [it.key for it in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def _index(self, i) -> int:
        if type(i) is not int and not hasattr(i, "__index__"):
            raise InvalidArgument(f"index must be an int: {i!r}")
        i = int(i)
        if not -len(self.items) <= i < len(self.items):
            raise IndexError(f"index {i} out of range for {len(self.items)} samples")
        return i % len(self.items)

    def __getitem__(self, i: int) -> Any:
        """The ``i``-th sample, decoded.

        Raises:
            IndexError: out of range.
            DataError: the sample cannot be read or decoded (also under ``"skip"``:
                one index must give one sample).
        """
        out = self._read([i], alone=True)
        note_batch(i)
        return out[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, read together (DataLoader's batched fetch).

        Returns:
            The decoded samples in order; under ``on_error="skip"`` the ones
            that could not be read or decoded are left out. With ``dtype``, a
            batch of equal-sized objects read whole comes as a
            :class:`~gpufeed.ai.data.TensorBatch` (rows of one batch tensor).

        Raises:
            IndexError: an index out of range.
            DataError: as :meth:`__getitem__` (not for skipped samples).
        """
        out = self._read(indices, alone=False)
        note_batch(indices)  # for ResumableLoader's collate wrapper, called next in this thread
        return out

    def _read(self, indices: Sequence[int], alone: bool) -> list[Any]:
        items = [self.items[self._index(i)] for i in indices]
        decode = self.decode or bytes
        if self.dtype is not None:
            batch = read_tensor_batch(self.reader, items, self.dtype, self.shape)
            if batch is not None:
                return batch
            decode = functools.partial(as_sample, dtype=self.dtype, shape=self.shape)
        out, names = [], []
        for item, data in self.reader.read(items):
            sample = SKIP if data is None else self.decode_or_skip(
                decode, data, item.key, functools.partial(self._reread, item))
            if sample is SKIP:
                if alone:  # one index asked for: no sample to give instead
                    why = self.reader.last_skipped
                    why = why if why is not None and why.key == item.key else None
                    raise DataError(f"{self.source.where(item.key)}: skipped (on_error='skip')"
                                    + (f": {why}" if why is not None else ""),
                                    bucket=self.source.bucket, key=item.key) from why
                continue
            out.append(sample)
            names.append(self.source.where(item.key))
        return SampleList(out, names) if self.dtype is not None else out

    def _reread(self, item: Listed) -> Any:
        data = self.reader.read_one(item)
        return SKIP if data is None else data

    def sampler(self, *, shuffle: bool = True, seed: int = 0, rank: int | None = None,
                world_size: int | None = None, drop_last: bool = False) -> ResumableSampler:
        """A :class:`ResumableSampler` over this dataset (pass it as ``sampler=``)."""
        return ResumableSampler(len(self), shuffle=shuffle, seed=seed, rank=rank,
                                world_size=world_size, drop_last=drop_last)

    def state_dict(self) -> dict:
        """What ties a saved loader position to this listing: ``{"kind", "samples", "fingerprint"}``."""
        return {"kind": "objects", "samples": len(self.items), "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Check that ``state`` (from :meth:`state_dict`) was taken over the same listing.

        Raises:
            InvalidArgument: another kind of dataset or another listing.
        """
        if state.get("kind") != "objects" or state.get("fingerprint") != self._fingerprint:
            raise InvalidArgument(f"the saved data state is of another listing ({state.get('samples')} "
                                  f"samples, fingerprint {state.get('fingerprint')}; this dataset: "
                                  f"{len(self.items)}, {self._fingerprint})")


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Indices for one rank: an epoch-seeded permutation, identical on every
    rank, split across ranks (``order[rank::world_size]``), that can start
    part-way (resume mid-epoch).

    Args:
        n: samples in the dataset.
        shuffle: shuffle per epoch with seed ``(seed, epoch)``; ``False``: key order.
        seed: the shuffle seed (the same on every rank).
        rank, world_size: default: ``torch.distributed`` if initialised, else
            ``$RANK`` / ``$WORLD_SIZE``, else ``0`` / ``1``.
        drop_last: drop the last ``n % world_size`` samples of the permutation
            so every rank gets the same count; otherwise the first ranks get one more.

    Raises:
        InvalidArgument: a bad rank or world size.
    """

    def __init__(self, n: int, *, shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False) -> None:
        self.n, self.shuffle, self.seed, self.drop_last = n, shuffle, seed, drop_last
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation from the next iteration on (and start at its beginning)."""
        self.epoch, self.start = int(epoch), 0

    def skip(self, samples: int) -> None:
        """Start the next iteration after the first ``samples`` indices of this rank's epoch."""
        if type(samples) is not int or samples < 0:
            raise InvalidArgument(f"samples must be an int >= 0: {samples!r}")
        self.start = samples

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch, from the start."""
        order = epoch_order(self.n, self.seed, self.epoch, self.shuffle)
        return split(order, self.rank, self.world_size, even=self.drop_last)

    def __iter__(self) -> Iterator[int]:
        start, self.start = self.start, 0
        return iter(self.indices()[start:])

    def epoch_length(self) -> int:
        """This rank's indices per epoch, from the start."""
        n = self.n - self.n % self.world_size if self.drop_last else self.n
        return len(range(self.rank, n, self.world_size))

    def __len__(self) -> int:
        return max(0, self.epoch_length() - self.start)
