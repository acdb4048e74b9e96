"""A worker's tar sample stream resumes at any position, reading only the
shards it still needs, for any shard sizes and shuffle buffer (no node: the
shards are in memory)."""

from __future__ import annotations

import random

import pytest

from gpufeed.ai.data import SampleChanged
from gpufeed.ai.data._sampling import ShuffleBuffer
from gpufeed.ai.data._source import Listed
from gpufeed.ai.data._tarstream import TarStream


class Shards:
    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.shards = [Listed(f"s{u}", 1) for u in range(len(counts))]
        self.reads: list[str] = []

    def read(self, shards):
        for sh in shards:
            self.reads.append(sh.key)
            yield sh, memoryview(b"x")

    def parse(self, shard, _data):
        u = int(shard.key[1:])
        return [{"__key__": f"{u}/{j}"} for j in range(self.counts[u])]

    def stream(self, mine, buffer, seed) -> TarStream:
        return TarStream(mine, self.shards, self.read, self.parse, ShuffleBuffer(buffer, random.Random(seed)), "bkt")


def keys(items) -> list[str]:
    return [s["__key__"] for s, _ in items]


@pytest.mark.parametrize("case", range(12))
def test_resume_at_every_position_matches_the_uninterrupted_stream(case):
    gen = random.Random(case)
    counts = [gen.choice([0, 1, 2, 3, 7, 15]) for _ in range(gen.randint(1, 9))]
    mine = list(range(len(counts)))
    gen.shuffle(mine)
    buffer = gen.choice([0, 1, 2, 5, 40])
    src = Shards(counts)
    full = keys(src.stream(mine, buffer, case).start(0, lambda u: -1)[1])
    assert sorted(full) == sorted(f"{u}/{j}" for u in mine for j in range(counts[u]))
    for skip in range(1, len(full) + 1):
        first = src.stream(mine, buffer, case)
        it = first.start(0, lambda u: -1)[1]
        for _ in range(skip):
            next(it)
        known = dict(first.take_parsed())  # what the loader's state holds at this point
        src.reads.clear()
        again = src.stream(mine, buffer, case)
        pos, rest = again.start(skip, lambda u, known=known: known.get(u, -1))
        assert pos == skip and keys(rest) == full[skip:], (counts, mine, buffer, skip)
        assert len(src.reads) == len(set(src.reads)), "read a shard twice"
        done = {u for u in known if counts[u] and not any(k.startswith(f"{u}/") for k in full[skip:])}
        assert not done & {int(k[1:]) for k in src.reads}, "read a shard whose samples were all delivered"


def test_without_counts_the_stream_replays_from_the_start():
    src = Shards([3, 4, 5])
    full = keys(src.stream([2, 0, 1], 4, 1).start(0, lambda u: -1)[1])
    pos, rest = src.stream([2, 0, 1], 4, 1).start(5, lambda u: -1)
    assert pos == 0 and keys(rest) == full  # the caller drops the first 5


def test_a_shard_with_another_sample_count_is_refused():
    src = Shards([3, 4, 5])
    first = src.stream([0, 1, 2], 2, 0)
    full = keys(src.stream([0, 1, 2], 2, 0).start(0, lambda u: -1)[1])
    it = first.start(0, lambda u: -1)[1]
    for _ in range(5):
        next(it)
    known = dict(first.take_parsed())
    pending = int(full[5].split("/")[0])  # a shard the resume must read again
    src.counts[pending] -= 1  # rewritten since
    with pytest.raises(SampleChanged, match=f"bkt/s{pending}"):
        list(src.stream([0, 1, 2], 2, 0).start(5, lambda u: known.get(u, -1))[1])
