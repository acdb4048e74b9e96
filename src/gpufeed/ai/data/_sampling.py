"""Who reads what: ranks, DataLoader workers, epoch-seeded shuffles.

Every choice here is a pure function of ``(seed, epoch, rank, world_size,
worker, num_workers)`` and the listing, so every rank computes the same
global order without talking to the others, and a resumed run replays the
same order.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Generic, TypeVar

import numpy as np

from ...errors import InvalidArgument

__all__ = ["resolve_rank", "worker", "rng", "epoch_order", "split", "ShuffleBuffer", "NOTHING"]

T = TypeVar("T")


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments where given, else those of an
    initialised ``torch.distributed`` process group, else ``$RANK`` /
    ``$WORLD_SIZE`` (as ``torchrun`` sets them), else ``(0, 1)``.

    Raises:
        InvalidArgument: not ``0 <= rank < world_size``.
    """
    if rank is None or world_size is None:
        r, w = _dist_rank()
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if type(rank) is not int or type(world_size) is not int or not 0 <= rank < world_size:
        raise InvalidArgument(f"need 0 <= rank < world_size, got rank={rank!r} world_size={world_size!r}")
    return rank, world_size


def _dist_rank() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover - torch is a dependency of gpufeed.ai
        pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as exc:
        raise InvalidArgument(f"$RANK / $WORLD_SIZE are not integers: {exc}") from exc


def worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker this runs in;
    ``(0, 1)`` in the main process."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def rng(seed: int, epoch: int, *stream: int) -> random.Random:
    """A generator seeded by ``(seed, epoch, *stream)`` through numpy's
    ``SeedSequence`` (well-mixed for neighbouring seeds and epochs)."""
    words = np.random.SeedSequence([seed & (2**64 - 1), epoch, *stream]).generate_state(4)
    return random.Random(int.from_bytes(words.tobytes(), "little"))


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """``range(n)`` shuffled by ``(seed, epoch)`` (identical on every rank), or in order."""
    order = list(range(n))
    if shuffle:
        rng(seed, epoch).shuffle(order)
    return order


def split(order: Sequence[T], part: int, parts: int, *, even: bool = False) -> list[T]:
    """Part ``part`` of ``parts`` of ``order``, strided (``order[part::parts]``):
    the parts are disjoint and together are ``order``. With ``even`` the tail
    ``len(order) % parts`` items are dropped so every part is as long."""
    if even:
        order = order[: len(order) - len(order) % parts]
    return list(order[part::parts])


#: What :meth:`ShuffleBuffer.push` returns while the buffer is filling.
NOTHING = object()


class ShuffleBuffer(Generic[T]):
    """A stream shuffle with a buffer of ``size`` items (``webdataset``'s
    ``shuffle`` stage), one item at a time so a resume can replay it on
    placeholders: once the buffer is full, each pushed item replaces a
    randomly chosen one, which comes out; :meth:`drain` gives the rest,
    shuffled. ``size <= 1`` keeps the order. Deterministic for a given ``gen``.

    Attributes:
        items: the items held (a resume swaps placeholders for real items here).
    """

    def __init__(self, size: int, gen: random.Random) -> None:
        self.size, self.gen = size, gen
        self.items: list = []

    def push(self, item: T) -> T | object:
        """Add ``item``; returns the item that leaves, or :data:`NOTHING`."""
        if self.size <= 1:
            return item
        if len(self.items) < self.size:
            self.items.append(item)
            return NOTHING
        j = self.gen.randrange(self.size)
        out, self.items[j] = self.items[j], item
        return out

    def drain(self) -> list:
        """The items left, shuffled (the end of the stream)."""
        if self.size > 1:
            self.gen.shuffle(self.items)
        out, self.items = self.items, []
        return out
