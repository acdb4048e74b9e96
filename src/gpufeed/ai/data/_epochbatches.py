"""An :class:`~gpufeed.ai.data.ObjectDataset` epoch as numbered batches, and
which of them were delivered, so that a loader resumes exactly even when its
DataLoader delivers batches out of order (``in_order=False``).

Batch ``k`` of an epoch is ``indices[offset + k * size : offset + (k + 1) * size]``
of the rank's sampler indices (``offset`` is 0 except after resuming from a
state that saved only a count of indices, see :meth:`EpochBatches.parse`).
Each batch of indices travels to its DataLoader worker with its number
(:class:`NumberedBatch`, or :class:`NumberedIndex` without batching); the
dataset notes the number of what it read (:func:`note_batch`) and the
loader's collate wrapper, called next in the same thread, takes it
(:func:`take_batch_number`) to tag the batch. The loader records the numbers
it delivered in a :class:`Delivered`, which stays small: the leading run of
delivered batches as a count, and only the ones past it by number.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch.utils.data

from ...errors import InvalidArgument

if TYPE_CHECKING:
    from ._objects import ResumableSampler

__all__ = ["NumberedBatch", "NumberedIndex", "note_batch", "take_batch_number", "Delivered", "EpochBatches"]


class NumberedBatch(list):
    """A batch of sampler indices that knows its number in the epoch."""

    def __init__(self, indices: Iterable[int], number: int) -> None:
        super().__init__(indices)
        self.number = number

    def __reduce__(self):  # to a DataLoader worker: the indices and the number
        return NumberedBatch, (list(self), self.number)


class NumberedIndex(int):
    """One sampler index (a loader with ``batch_size=None``) that knows its number in the epoch."""

    number: int

    def __new__(cls, index: int, number: int) -> NumberedIndex:
        self = super().__new__(cls, index)
        self.number = number
        return self

    def __reduce__(self):
        return NumberedIndex, (int(self), self.number)


_last = threading.local()


def note_batch(indices: Any) -> None:
    """Note the number of the batch (or index) just read in this thread, if it has one."""
    _last.number = getattr(indices, "number", None)


def take_batch_number() -> int | None:
    """The number :func:`note_batch` noted last in this thread (once), or ``None``."""
    number, _last.number = getattr(_last, "number", None), None
    return number


class Delivered:
    """A set of batch numbers: ``0 .. run - 1`` as the count ``run``, and those past it."""

    def __init__(self, run: int = 0, after: Iterable[int] = ()) -> None:
        self.run, self.after = run, set(after)
        self._absorb()

    def _absorb(self) -> None:
        while self.run in self.after:
            self.after.remove(self.run)
            self.run += 1

    def add(self, number: int) -> None:
        if number >= self.run:
            self.after.add(number)
            self._absorb()

    def __contains__(self, number: object) -> bool:
        return isinstance(number, int) and (number < self.run or number in self.after)

    def count_below(self, n: int) -> int:
        """How many of ``0 .. n - 1`` are in the set."""
        return min(self.run, n) + sum(1 for k in self.after if k < n)

    def copy(self) -> Delivered:
        return Delivered(self.run, self.after)


class EpochBatches(torch.utils.data.Sampler[Any]):
    """The loader's index sampler for an ObjectDataset: the rank's epoch in
    numbered batches, less those delivered before the iteration began.

    Args:
        sampler: the rank's :class:`~gpufeed.ai.data.ResumableSampler` (its
            ``indices()`` for the current epoch; its ``skip`` is not used).
        batch_size: sampler indices per batch; ``None``: single indices, unbatched.
        drop_last: leave out a last batch shorter than ``batch_size`` (DataLoader's).
    """

    def __init__(self, sampler: ResumableSampler, batch_size: int | None, drop_last: bool) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.offset = 0
        self.delivered = Delivered()
        self._skip = Delivered()  # what the current (or next) iteration leaves out

    @property
    def size(self) -> int:
        """Sampler indices per batch (1 when unbatched)."""
        return self.batch_size if self.batch_size is not None else 1

    def _remaining(self) -> int:
        return max(0, self.sampler.epoch_length() - self.offset)

    def batches(self, *, drop_last: bool | None = None) -> int:
        """The epoch's batches (from ``offset``), with or without a short last one."""
        drop = self.drop_last if drop_last is None else drop_last
        n = self._remaining()
        return n // self.size if drop else -(-n // self.size)

    def consumed(self) -> int:
        """Sampler indices that the delivered batches took (the last batch may take fewer than ``size``)."""
        return self._consumed(self.offset, self.delivered)

    def _consumed(self, offset: int, delivered: Delivered) -> int:
        n = max(0, self.sampler.epoch_length() - offset)
        return (offset + min(delivered.run * self.size, n)
                + sum(min(self.size, n - k * self.size) for k in delivered.after))

    def _batches_from(self, offset: int) -> int:
        """Batches, a short last one included, in the epoch from ``offset``."""
        return -(-max(0, self.sampler.epoch_length() - offset) // self.size)

    def restart(self) -> None:
        """The epoch from its beginning, nothing delivered."""
        self.offset, self.delivered = 0, Delivered()
        self.begin()

    def begin(self) -> None:
        """Make the iterations from now on leave out what was delivered so far."""
        self._skip = self.delivered.copy()

    def __iter__(self) -> Iterator[Any]:
        skip, n, size = self._skip, self.batches(), self.size
        order = self.sampler.indices()[self.offset:]
        for k in range(min(skip.run, n), n):
            if k in skip:
                continue
            if self.batch_size is None:
                yield NumberedIndex(order[k], k)
            else:
                yield NumberedBatch(order[k * size:(k + 1) * size], k)

    def __len__(self) -> int:
        n = self.batches()
        return n - self._skip.count_below(n)

    def state(self) -> dict:
        """``{"size", "offset", "run", "after"}``: plain ints and a sorted list."""
        return {"size": self.size, "offset": self.offset, "run": self.delivered.run,
                "after": sorted(self.delivered.after)}

    def resume(self, offset: int, delivered: Delivered) -> None:
        """Continue from a position :meth:`parse` gave."""
        self.offset, self.delivered = offset, delivered
        self.begin()

    def parse(self, saved: Any, consumed: Any) -> tuple[int, Delivered]:
        """``(offset, delivered)`` of a saved :meth:`state` and ``consumed``
        count, checked; ``saved`` ``None`` (a state that counted only indices,
        delivered in order): the batches start after the first ``consumed``
        indices, as they do for a state saved with another batch size whose
        batches were all delivered in order.

        Raises:
            InvalidArgument: a malformed state, batch numbers out of range,
                batches delivered out of order with another batch size, or a
                ``consumed`` that does not match them.
        """
        total = self.sampler.epoch_length()
        if type(consumed) is not int or not 0 <= consumed <= total:
            raise InvalidArgument(f"the saved 'consumed' must be an int from 0 to {total} "
                                  f"(this rank's indices per epoch): {consumed!r}")
        if saved is None:
            return consumed, Delivered()
        saved = _checked(saved)
        if saved["size"] != self.size:
            if saved["after"]:
                raise InvalidArgument(f"the saved position has batches delivered out of order with "
                                      f"batch_size={saved['size']}: resume it with that batch size, "
                                      f"not {self.size}")
            return consumed, Delivered()  # in order: a count of indices is the position
        offset, run, after = saved["offset"], saved["run"], saved["after"]
        if offset > total:
            raise InvalidArgument(f"the saved batch 'offset' {offset} is past this rank's {total} indices")
        limit = self._batches_from(offset)
        if run > limit or any(k >= limit for k in after):
            raise InvalidArgument(f"the saved batches {run} (run) and {after} (after) are not all "
                                  f"below the epoch's {limit} batches")
        delivered = Delivered(run, after)
        if self._consumed(offset, delivered) != consumed:
            raise InvalidArgument(f"the saved 'consumed' {consumed} does not match the saved batches "
                                  f"(they took {self._consumed(offset, delivered)} indices)")
        return offset, delivered


def _checked(saved: Any) -> dict:
    """``saved`` if it is ``{"size": int >= 1, "offset": int >= 0, "run": int >= 0,
    "after": [ints > run, increasing]}``.

    Raises:
        InvalidArgument: it is not.
    """
    if not isinstance(saved, dict) or set(saved) != {"size", "offset", "run", "after"}:
        raise InvalidArgument("the saved 'batches' must be a dict with 'size', 'offset', 'run' and 'after': "
                              f"{saved!r}")
    size, offset, run, after = saved["size"], saved["offset"], saved["run"], saved["after"]
    if any(type(v) is not int for v in (size, offset, run)) or size < 1 or offset < 0 or run < 0:
        raise InvalidArgument(f"the saved batch 'size' must be an int >= 1, 'offset' and 'run' ints >= 0: "
                              f"{saved!r}")
    if (not isinstance(after, list) or any(type(k) is not int for k in after)
            or any(b <= a for a, b in zip([run, *after], after))):
        raise InvalidArgument(f"the saved batches 'after' must be increasing ints above 'run' ({run}): {after!r}")
    return saved
