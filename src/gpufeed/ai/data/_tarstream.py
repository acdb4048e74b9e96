"""One DataLoader worker's stream of tar samples, and its resume.

The worker reads its shards in order, parses each, and passes the samples
through a :class:`ShuffleBuffer`. Which sample comes out ``p``-th depends
only on the number of samples in each shard read so far (and the seeded
generator), so the stream reports each shard's sample count as it parses
it (:attr:`TarStream.parsed`; the loader keeps them in its state). A resume
at position ``p`` replays the buffer on placeholders ``(unit, member)`` built
from those counts, with no reads, then reads only the shards that the
samples still in the buffer came from and the shard it stopped in; so
resuming late in an epoch does not read the epoch again. Without the counts
(a state from elsewhere) it replays the stream for real instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from ._errors import SampleChanged
from ._sampling import NOTHING, ShuffleBuffer
from ._source import Listed

__all__ = ["TarStream"]

Item = tuple[dict, Listed]


class TarStream:
    """The samples of ``mine`` (unit indices, in reading order) through ``buf``.

    Args:
        mine: the units this worker reads, in order.
        shards: the shard of each unit (``shards[u]``).
        read: ``read(shards)`` yields ``(shard, bytes or None)`` in order
            (``None``: skipped by the error policy).
        parse: ``parse(shard, bytes)`` -> the shard's samples (may apply the policy).
        buf: the shuffle buffer, seeded for this worker and epoch.
        bucket: the shards' bucket (named in errors).

    Attributes:
        parsed: ``(unit, samples)`` of the shards parsed since it was last emptied.
    """

    def __init__(self, mine: Sequence[int], shards: Sequence[Listed],
                 read: Callable[[list[Listed]], Iterator[tuple[Listed, memoryview | None]]],
                 parse: Callable[[Listed, memoryview], list[dict]], buf: ShuffleBuffer, bucket: str) -> None:
        self.mine, self.shards, self.read, self.parse, self.buf = mine, shards, read, parse, buf
        self.bucket = bucket
        self.parsed: list[tuple[int, int]] = []
        self._held: dict[int, list[dict]] = {}

    def take_parsed(self) -> list[tuple[int, int]]:
        """A copy of :attr:`parsed`, which is emptied (the same list object stays)."""
        out = list(self.parsed)
        self.parsed.clear()
        return out

    def start(self, skip: int, counts: Callable[[int], int]) -> tuple[int, Iterator[Item]]:
        """``(position, items)``: the stream after ``skip`` items, and the position
        its first item has minus one. The position is below ``skip`` when the
        stream had to be replayed for real (the caller drops items up to ``skip``).

        Args:
            skip: items already delivered.
            counts: ``counts(unit)``: its number of samples, or -1 when unknown.

        Raises:
            SampleChanged: a shard read again holds another number of samples.
        """
        if skip:
            saved = self.buf.gen.getstate()
            ahead = self._fast_forward(skip, counts)
            if ahead is not None:
                return skip, ahead
            self.buf.gen.setstate(saved)  # a count is missing: replay from the start, for real
            self.buf.items = []
        return 0, self._run(0, 0)

    def _run(self, k: int, j: int, counts: Callable[[int], int] | None = None) -> Iterator[Item]:
        for item in self._samples(k, j, counts):
            out = self.buf.push(item)
            if out is not NOTHING:
                yield out  # type: ignore[misc]
        yield from self.buf.drain()

    def _samples(self, k: int, j: int, counts: Callable[[int], int] | None) -> Iterator[Item]:
        """Samples of ``mine[k:]``, the first unit's from member ``j`` (its count
        checked against ``counts`` when given; taken from :attr:`_held` when a
        resume already read it)."""
        units = list(self.mine[k:])
        if units and units[0] in self._held:
            first = units.pop(0)
            for s in self._held.pop(first)[j:]:
                yield s, self.shards[first]
            j, counts = 0, None
        for i, (u, (shard, data)) in enumerate(zip(units, self.read([self.shards[u] for u in units]))):
            samples = [] if data is None else self.parse(shard, data)
            self.parsed.append((u, len(samples)))
            if i == 0 and counts is not None and data is not None:
                self._check(u, len(samples), counts)
            for s in (samples[j:] if i == 0 else samples):
                yield s, shard

    def _fast_forward(self, skip: int, counts: Callable[[int], int]) -> Iterator[Item] | None:
        out = 0
        for k, u in enumerate(self.mine):
            if out == skip:  # stopped between shards: this one is read as usual
                self.buf.items = self._materialize(self.buf.items, counts)
                return self._run(k, 0)
            c = counts(u)
            if c < 0:
                return None
            for j in range(c):
                if out == skip:  # the next push is the first the interrupted run had not made
                    self.buf.items = self._materialize(self.buf.items, counts, keep=u)
                    return self._run(k, j, counts)
                if self.buf.push((u, j)) is not NOTHING:
                    out += 1
        tail = self.buf.drain()[skip - out:]  # stopped while the buffer was draining
        return iter(self._materialize(tail, counts))

    def _materialize(self, items: list, counts: Callable[[int], int], keep: int | None = None) -> list[Item]:
        """Placeholders ``(unit, member)`` replaced by the samples, reading their
        shards; unit ``keep`` (the one the stream goes on with) is read too, and
        its samples held for :meth:`_samples`."""
        order = {u: i for i, u in enumerate(self.mine)}
        need = sorted({u for u, _ in items} | ({keep} if keep is not None else set()), key=order.__getitem__)
        got: dict[int, list[dict]] = {}
        for u, (shard, data) in zip(need, self.read([self.shards[u] for u in need])):
            got[u] = [] if data is None else self.parse(shard, data)
            if data is not None:
                self._check(u, len(got[u]), counts)
        if keep is not None:
            self._held[keep] = got[keep]
        return [(got[u][j], self.shards[u]) for u, j in items if j < len(got[u])]

    def _check(self, u: int, n: int, counts: Callable[[int], int]) -> None:
        if n != counts(u):
            shard = self.shards[u]
            raise SampleChanged(f"{self.bucket}/{shard.key}: holds {n} samples, {counts(u)} when the "
                                f"position was saved", bucket=self.bucket, key=shard.key)
