"""A ``torch.utils.data.DataLoader`` that knows how far it got, so training
resumes mid-epoch at the step it saved.

Each batch leaves its DataLoader worker tagged with the worker's id and the
position, in that worker's sample stream, of the batch's last sample (the
collate function is wrapped; the tag is stripped before the batch is
yielded, after ``pin_memory``). The loader keeps the latest position per
worker and which worker it would ask next; :meth:`ResumableLoader.state_dict`
saves them with the epoch, and a loader restored from it makes each worker
skip exactly the samples it had delivered, its workers taking the roles
rotated so that the round-robin continues where it stopped (DataLoader asks
its workers in a fixed cycle, and a worker with no more samples is passed
over, so the order of batches depends only on each worker's stream).

With an :class:`ObjectDataset` the loader hands its DataLoader numbered
batches of the sampler's indices (:mod:`._epochbatches`), each batch is
tagged with its number, and the position is the set of batch numbers
delivered this epoch: a loader restored from it reads only the batches not
delivered, in order, each with the samples it would have had. So the
position is exact whether DataLoader delivers in order or not
(``in_order=False``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch.utils.data
from torch.utils.data._utils.collate import default_collate, default_convert

from ...errors import InvalidArgument
from ._epochbatches import EpochBatches, take_batch_number
from ._objects import ObjectDataset, ResumableSampler
from ._sampling import worker
from ._shards import ShardDataset, stream_positions
from ._tensors import collate as collate_tensors

__all__ = ["ResumableLoader"]


class _Tagged(NamedTuple):
    batch: Any
    worker: int
    position: int  # in the worker's stream (ShardDataset), or the batch's number in the epoch (ObjectDataset)
    parsed: list  # (unit, samples) of shards parsed since the last batch


class _TagCollate:
    """Collate, then tag the batch with the worker, its stream position (or
    its number) and the sample counts of the shards it parsed."""

    def __init__(self, collate, uid: str | None) -> None:
        self.collate, self.uid = collate, uid

    def __call__(self, samples):
        progress = stream_positions.get(self.uid) if self.uid is not None else None
        if progress is None:
            number = take_batch_number()
            return _Tagged(self.collate(samples), worker()[0], -1 if number is None else number, [])
        return _Tagged(self.collate(samples), progress.worker, progress.position, progress.take_parsed())


class ResumableLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` with ``state_dict()`` / ``load_state_dict()``
    for a :class:`ShardDataset`, or an :class:`ObjectDataset` read through a
    :class:`ResumableSampler`.

    Takes every ``DataLoader`` keyword argument (``batch_size``,
    ``num_workers``, ``persistent_workers``, ``pin_memory``, ``collate_fn``,
    ``in_order``, ...). Save ``loader.state_dict()`` with the model (it is
    plain ints, strings and lists, so :func:`gpufeed.ai.save` stores it); a
    new loader over a dataset made with the same arguments, given
    ``load_state_dict(state)``, continues the saved epoch with the next batch
    the old one would have delivered. The number of workers must be the same
    (with a :class:`ShardDataset`: each worker resumes its own stream).

    With ``in_order=False`` and workers, DataLoader yields each batch as soon
    as a worker has it. An :class:`ObjectDataset`'s position is the set of
    batches delivered, so the resumed loader delivers exactly the batches not
    delivered before the save, in the sampler's order, each with the samples
    it had in the uninterrupted run. A :class:`ShardDataset` resumes each
    remaining sample exactly once, in another order than the uninterrupted run.

    Args:
        dataset: a :class:`ShardDataset` or :class:`ObjectDataset`.
        **kwargs: ``DataLoader``'s (``collate_fn`` defaults to
            :func:`~gpufeed.ai.data.collate` for an ``ObjectDataset`` made
            with ``dtype=``; ``batch_size`` to ``None`` for a ``ShardDataset``
            made with ``dtype=``, which yields whole batches). With an :class:`ObjectDataset`,
            ``sampler`` must be a :class:`ResumableSampler` (default: the
            dataset's ``sampler(shuffle=shuffle)``, seed 0, ranks as
            :class:`ResumableSampler` finds them).

    Raises:
        InvalidArgument: another kind of dataset or sampler, or an
            :class:`ObjectDataset` with ``batch_sampler=``.
    """

    def __init__(self, dataset, **kwargs) -> None:
        self._shards: ShardDataset | None = None
        self._objects: ObjectDataset | None = None
        self._rsampler: ResumableSampler | None = None
        self._plan: EpochBatches | None = None
        if isinstance(dataset, ObjectDataset):
            if kwargs.get("batch_sampler") is not None:
                raise InvalidArgument("ResumableLoader counts positions through its sampler: "
                                      "pass sampler=, not batch_sampler=")
            if kwargs.get("sampler") is None:
                kwargs["sampler"] = dataset.sampler(shuffle=bool(kwargs.pop("shuffle", False)))
            sampler = kwargs["sampler"]
            if not isinstance(sampler, ResumableSampler):
                raise InvalidArgument("an ObjectDataset's sampler must be a ResumableSampler "
                                      "(dataset.sampler(...))")
            self._objects, self._rsampler, uid = dataset, sampler, None
        elif isinstance(dataset, ShardDataset):
            self._shards, uid = dataset, dataset._uid
            if dataset.spec is not None and kwargs.setdefault("batch_size", None) is not None:
                raise InvalidArgument("a ShardDataset made with dtype= yields whole batches (its batch_size=): "
                                      "give the loader batch_size=None")
        else:
            raise InvalidArgument(f"ResumableLoader reads a ShardDataset or an ObjectDataset, "
                                  f"not {type(dataset).__name__}")
        batched = kwargs.get("batch_size", 1) is not None
        collate = kwargs.pop("collate_fn", None) or (
            (collate_tensors if getattr(dataset, "dtype", None) is not None else default_collate)
            if batched else default_convert)
        super().__init__(dataset, collate_fn=_TagCollate(collate, uid), **kwargs)
        if self._rsampler is not None:
            self._plan = EpochBatches(self._rsampler, self.batch_size, self.drop_last)
        self._positions: list[int] = []
        self._next_worker = 0
        self._counts: dict[int, int] = {}
        self._progress_epoch = 0
        self._resume = False  # the next iteration continues from the progress (load_state_dict)
        self._restart()

    @property
    def _index_sampler(self):
        # DataLoader's iterators draw what they fetch from this property
        # (torch/utils/data/dataloader.py; a persistent iterator keeps the object
        # it got first): for an ObjectDataset, the epoch's numbered batches less
        # those delivered, so each batch comes back tagged with its number.
        return self._plan if self._plan is not None else super()._index_sampler

    @property
    def _epoch_owner(self) -> ShardDataset | ResumableSampler:
        owner = self._shards if self._shards is not None else self._rsampler
        assert owner is not None  # __init__ set one of them
        return owner

    @property
    def epoch(self) -> int:
        """The epoch the dataset (or sampler) reads next."""
        return self._epoch_owner.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (on the dataset or the sampler): from its
        beginning, or from the position :meth:`load_state_dict` loaded when
        that position is in epoch ``epoch`` (so a training loop that calls
        ``set_epoch`` at the top of every epoch resumes as it should)."""
        if self._resume and self._progress_epoch == epoch == self.epoch:
            return
        self._epoch_owner.set_epoch(epoch)
        self._restart()

    def _restart(self) -> None:
        """Make the progress the beginning of the epoch the owner reads next."""
        self._positions = [0] * max(1, self.num_workers)
        self._next_worker, self._counts = 0, {}
        if self._plan is not None:
            self._plan.restart()
        self._progress_epoch, self._resume = self.epoch, False

    def _sync(self) -> None:
        """Start the progress over when the epoch was set on the dataset or the
        sampler itself since the progress was made (that epoch has not begun)."""
        if self._progress_epoch != self.epoch:
            self._restart()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # yields batches, untagged
        self._sync()
        resume, self._resume = self._resume, False
        if not resume:
            self._restart()
        if self._shards is not None:
            self._shards.set_resume(list(self._positions) if resume else None, self._next_worker, self._counts)
        else:
            assert self._plan is not None
            self._plan.begin()
        for tagged in super().__iter__():
            if self._shards is not None:
                self._positions[tagged.worker] = max(self._positions[tagged.worker], tagged.position)
                self._next_worker = (tagged.worker + 1) % len(self._positions)
                self._counts.update((int(u), int(n)) for u, n in tagged.parsed)
            else:
                assert self._plan is not None and tagged.position >= 0  # ObjectDataset notes every read
                self._plan.delivered.add(tagged.position)
            yield tagged.batch

    def _sampler_settings(self) -> dict:
        s = self._rsampler
        assert s is not None
        return {"seed": s.seed, "shuffle": s.shuffle, "rank": s.rank, "world_size": s.world_size,
                "drop_last": s.drop_last}

    def state_dict(self) -> dict:
        """Where the loader is: ``{"epoch", "num_workers", "positions" (per worker),
        "next_worker" and "shard_samples"; or "consumed", "batches" and
        "sampler" (sampler indices the delivered batches took, which batches
        were delivered, the sampler's settings), "dataset": the dataset's
        state}``; all plain values (picklable, savable with :func:`gpufeed.ai.save`).

        ``"batches"`` is ``{"size": sampler indices per batch, "offset",
        "run": n, "after": [k, ...]}``: batches ``0 .. n - 1`` of the epoch
        and those numbered in ``after`` were delivered, batch ``k`` being the
        rank's sampler indices from ``offset + k * size`` (``offset`` is 0
        unless the epoch resumed from a state without ``"batches"``).

        May be called at any time: between batches, after an epoch's last
        batch (the epoch is done), or before an epoch's first batch, after
        ``set_epoch`` (that epoch from its beginning)."""
        self._sync()
        if self._shards is not None:
            return {"epoch": self.epoch, "num_workers": self.num_workers, "dataset": self._shards.state_dict(),
                    "positions": list(self._positions), "next_worker": self._next_worker,
                    "shard_samples": sorted([u, n] for u, n in self._counts.items())}
        assert self._objects is not None and self._plan is not None
        return {"epoch": self.epoch, "num_workers": self.num_workers, "dataset": self._objects.state_dict(),
                "consumed": self._plan.consumed(), "batches": self._plan.state(),
                "sampler": self._sampler_settings()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next iteration.

        A state without ``"batches"`` (only ``"consumed"``) continues after
        the first ``consumed`` sampler indices; so does one saved with
        another batch size whose batches were all delivered in order.

        Raises:
            InvalidArgument: the state is of another listing, dataset settings,
                sampler settings or number of workers, or holds a malformed
                position (an epoch that is no int >= 0, batch numbers out of range,
                a ``consumed`` that does not match them, batches delivered out of order with another
                batch size).
        """
        if not isinstance(state, dict) or not {"dataset", "epoch", "num_workers"} <= state.keys():
            raise InvalidArgument("a loader state is the dict of ResumableLoader.state_dict(), with 'dataset', "
                                  f"'epoch' and 'num_workers': got {type(state).__name__}")
        if type(state["epoch"]) is not int or state["epoch"] < 0:
            raise InvalidArgument(f"a loader state's epoch is an int >= 0: got {state['epoch']!r}")
        if state.get("num_workers") != self.num_workers:
            raise InvalidArgument(f"the saved position is for num_workers={state.get('num_workers')}, "
                                  f"this loader has {self.num_workers}")
        if self._shards is not None:
            self._shards.load_state_dict(state["dataset"])
            positions, first, counts = self._saved_positions(state)
        else:
            assert self._objects is not None and self._plan is not None
            self._objects.load_state_dict(state["dataset"])
            settings = self._sampler_settings()
            saved = state.get("sampler")
            if isinstance(saved, dict) and "drop_last" not in saved:  # saved before the setting was
                saved = {**saved, "drop_last": settings["drop_last"]}
            if saved != settings:
                raise InvalidArgument(f"the saved sampler settings {state.get('sampler')} differ from {settings}")
            batches = self._plan.parse(state.get("batches"), state.get("consumed", 0))
        self._resume = False
        self.set_epoch(int(state["epoch"]))
        if self._shards is not None:
            self._positions, self._next_worker, self._counts = positions, first, counts
        else:
            assert self._plan is not None
            self._plan.resume(*batches)
        self._resume = True

    def _saved_positions(self, state: dict) -> tuple[list[int], int, dict[int, int]]:
        """``(positions, next worker, shard sample counts)`` of a shard loader's
        state, checked; no positions (an empty list) is the epoch's beginning.

        Raises:
            InvalidArgument: positions not one int >= 0 per worker, or a next worker out of range.
        """
        workers = max(1, self.num_workers)
        positions = state.get("positions") or [0] * workers
        first = state.get("next_worker", 0)
        if (not isinstance(positions, list) or len(positions) != workers
                or any(type(p) is not int or p < 0 for p in positions)):
            raise InvalidArgument(f"the saved 'positions' must be {workers} ints >= 0 (one per worker): "
                                  f"{positions!r}")
        if type(first) is not int or not 0 <= first < workers:
            raise InvalidArgument(f"the saved 'next_worker' must be a worker index below {workers}: {first!r}")
        try:
            counts = {int(u): int(n) for u, n in state.get("shard_samples", [])}
        except (TypeError, ValueError):
            raise InvalidArgument("the saved 'shard_samples' must be [shard, samples] pairs of ints") from None
        return list(positions), first, counts
