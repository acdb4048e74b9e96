"""ResumableLoader over an ObjectDataset with DataLoader workers and
``in_order=False``, against a live node: one batch of each epoch decodes
slowly, so the other worker's batches overtake it, and states taken before
the first batch, mid-epoch, after ``set_epoch`` and after the last batch
resume in a fresh loader so that the batches delivered before the save and
after the resume are exactly the epoch's batches, each once, each with the
samples of an uninterrupted run (docs/training-data.md, "Resuming mid-epoch")."""

from __future__ import annotations

import collections
import json
import time
import uuid

import pytest

from gpufeed.ai import checkpoint as ck
from gpufeed.ai.data import ObjectDataset, ResumableLoader, ResumableSampler
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument

BUCKET = "data-resume-unordered-tests"
OBJECTS, BATCH, SEED = 29, 3, 5  # 10 batches, the last one of 2 samples
SLOW_S = 0.8  # how long the slow batch takes to decode: the other worker delivers several meanwhile

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class SlowDecode:
    """Decode a sample's number; sleep first for the samples in ``slow``
    (picklable: it travels to the DataLoader workers with the dataset)."""

    def __init__(self, slow: set[int]) -> None:
        self.slow = slow

    def __call__(self, data: memoryview) -> int:
        n = int.from_bytes(data[:4], "little")
        if n in self.slow:
            time.sleep(SLOW_S)
        return n


@pytest.fixture(scope="module")
def url(node) -> str:
    prefix = uuid.uuid4().hex[:8]
    with Client(node.tcp_url) as c:
        try:
            c.create_bucket(BUCKET)
        except Exception:  # noqa: BLE001 - made by an earlier module of the session
            pass
        for i in range(OBJECTS):
            c.put(BUCKET, f"{prefix}/{i:03d}.bin", i.to_bytes(4, "little") * 8)
    return f"{node.tcp_url}/{BUCKET}/{prefix}/"


def first_sample(epoch: int, rank: int = 0, world_size: int = 1, drop_last: bool = False) -> int:
    """The sample that opens batch 0 of ``epoch`` on ``rank``."""
    s = ResumableSampler(OBJECTS, seed=SEED, rank=rank, world_size=world_size, drop_last=drop_last)
    s.set_epoch(epoch)
    return s.indices()[0]


def make(url: str, *, workers: int = 2, in_order: bool = False, slow_epochs=(0, 1), rank: int = 0,
         world_size: int = 1, sampler_drop_last: bool = False, **kwargs) -> ResumableLoader:
    """A loader whose batch 0 of each epoch in ``slow_epochs`` decodes slowly."""
    slow = {first_sample(e, rank, world_size, sampler_drop_last) for e in slow_epochs}
    ds = ObjectDataset(url, decode=SlowDecode(slow))
    sampler = ds.sampler(seed=SEED, rank=rank, world_size=world_size, drop_last=sampler_drop_last)
    return ResumableLoader(ds, batch_size=kwargs.pop("batch_size", BATCH), num_workers=workers,
                           in_order=in_order, sampler=sampler, **kwargs)


def as_tuples(batches) -> list[tuple[int, ...]]:
    return [(b,) if isinstance(b, int) else tuple(int(x) for x in b) for b in batches]  # unbatched: an int


def reference(url: str, epoch: int, **kwargs) -> list[tuple[int, ...]]:
    """The epoch's batches, in order, from an uninterrupted run without workers or slow samples."""
    loader = make(url, workers=0, in_order=True, slow_epochs=(), **kwargs)
    loader.set_epoch(epoch)
    return as_tuples(loader)


def saved(loader: ResumableLoader) -> dict:
    """The state as a checkpoint stores it (through JSON: plain values only)."""
    return json.loads(json.dumps(loader.state_dict()))


def take(loader: ResumableLoader, n: int) -> tuple[list[tuple[int, ...]], dict]:
    """The first ``n`` batches of an iteration, then the state; the iteration is dropped."""
    it = iter(loader)
    got = as_tuples(next(it) for _ in range(n))
    state = saved(loader)
    del it
    return got, state


def resume(url: str, state: dict, **kwargs) -> ResumableLoader:
    loader = make(url, **kwargs)
    loader.load_state_dict(state)
    loader.set_epoch(loader.epoch)  # a training loop's set_epoch at the top of the resumed epoch
    return loader


def assert_exact(before, after, full) -> None:
    """Before and after together are the epoch's batches, each once, with the same samples."""
    assert collections.Counter(before + after) == collections.Counter(full)
    assert len(before) + len(after) == len(full)


@pytest.mark.parametrize("n", [1, 4, 8])
def test_a_mid_epoch_state_resumes_exactly_the_batches_not_delivered(url, n):
    full = reference(url, 0)
    assert len(full) == 10 and sorted(x for b in full for x in b) == list(range(OBJECTS))
    before, state = take(make(url), n)
    assert [full.index(b) for b in before] != list(range(n))  # batch 0 was overtaken: out of order
    assert state["batches"]["after"] and state["consumed"] == sum(map(len, before))
    after = as_tuples(resume(url, state))
    assert_exact(before, after, full)
    if full[0] in after and len(after) > 1:
        assert after[0] != full[0]  # the resumed loader delivers out of order too


def test_a_state_before_the_first_batch_and_after_the_last_one(url):
    full = reference(url, 0)
    fresh = saved(make(url))
    assert fresh["consumed"] == 0 and fresh["batches"] == {"size": BATCH, "offset": 0, "run": 0, "after": []}
    assert_exact([], as_tuples(resume(url, fresh)), full)
    loader = make(url)
    everything = as_tuples(loader)
    assert_exact(everything, [], full)
    done = saved(loader)
    assert done["consumed"] == OBJECTS and done["batches"]["run"] == len(full) and not done["batches"]["after"]
    assert as_tuples(resume(url, done)) == []  # the epoch is done


@pytest.mark.parametrize("on", ["loader", "sampler"])
def test_a_state_after_set_epoch_resumes_the_next_epoch_whole(url, on):
    loader = make(url)
    as_tuples(loader)
    (loader if on == "loader" else loader.sampler).set_epoch(1)
    state = saved(loader)
    assert state["epoch"] == 1 and state["consumed"] == 0
    again = resume(url, state)
    assert_exact([], as_tuples(again), reference(url, 1))
    again.set_epoch(2)  # the epoch after starts from its beginning
    assert_exact([], as_tuples(again), reference(url, 2))


def test_a_resumed_loader_saved_again_resumes_again(url):
    full = reference(url, 1)
    first = make(url)
    first.set_epoch(1)
    before, state = take(first, 3)
    second = resume(url, state)
    middle, state2 = take(second, 3)
    assert state2["consumed"] == sum(map(len, before + middle))
    rest = as_tuples(resume(url, state2))
    assert_exact(before + middle, rest, full)
    stored = f"{url.split('/' + BUCKET)[0]}/{BUCKET}/ckpt-{uuid.uuid4().hex[:8]}"
    ck.save({"data": state2}, stored, async_=False)  # through the checkpoint API, too
    assert_exact(before + middle, as_tuples(resume(url, ck.load(stored)["data"])), full)


@pytest.mark.parametrize("prefetch", [1, 4])
def test_persistent_workers_resume_in_the_same_and_in_a_fresh_loader(url, prefetch):
    full0, full1 = reference(url, 0), reference(url, 1)
    loader = make(url, persistent_workers=True, prefetch_factor=prefetch)
    assert_exact(as_tuples(loader), [], full0)
    assert_exact(as_tuples(loader), [], full0)  # iterated again after a full epoch: the epoch again
    loader.set_epoch(1)
    before, state = take(loader, 5)
    loader.load_state_dict(state)  # the same loader, its workers kept, resumes too
    assert_exact(before, as_tuples(loader), full1)
    fresh = resume(url, state, persistent_workers=True, prefetch_factor=prefetch)
    assert_exact(before, as_tuples(fresh), full1)
    again, state = take(fresh, 4)  # its next iteration is the whole epoch again
    assert_exact(again, as_tuples(resume(url, state)), full1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_and_drop_last_resume_each_rank_exactly(url, drop_last):
    shards = []
    for rank in range(2):
        opts = dict(rank=rank, world_size=2, sampler_drop_last=drop_last, drop_last=drop_last)
        full = reference(url, 0, **opts)
        before, state = take(make(url, **opts), 3)
        after = as_tuples(resume(url, state, **opts))
        assert_exact(before, after, full)
        shards.append(full)
    samples = sorted(x for full in shards for b in full for x in b)
    if drop_last:  # 28 of 29 samples, 14 per rank: 4 full batches each, 2 dropped
        assert len(samples) == 24 and all(len(b) == BATCH for full in shards for b in full)
    else:
        assert samples == list(range(OBJECTS))


def test_unbatched_samples_resume_exactly(url):
    full = reference(url, 0, batch_size=None)
    assert len(full) == OBJECTS
    before, state = take(make(url, batch_size=None), 5)
    assert state["batches"]["size"] == 1 and state["consumed"] == 5
    assert_exact(before, as_tuples(resume(url, state, batch_size=None)), full)


def test_an_in_order_state_and_one_without_batches_still_load(url):
    full = reference(url, 0)
    before, state = take(make(url, in_order=True, slow_epochs=()), 4)
    assert before == full[:4] and state["batches"] == {"size": BATCH, "offset": 0, "run": 4, "after": []}
    counted = {k: v for k, v in state.items() if k != "batches"}  # a state that counts only indices
    counted["sampler"] = {k: v for k, v in state["sampler"].items() if k != "drop_last"}
    assert_exact(before, as_tuples(resume(url, counted)), full)
    resumed = resume(url, counted)
    assert saved(resumed)["batches"] == {"size": BATCH, "offset": 12, "run": 0, "after": []}
    before2, state2 = take(resumed, 2)  # from the offset, out of order
    assert_exact(before + before2, as_tuples(resume(url, state2)), full)
    bigger = resume(url, state, batch_size=4, in_order=True)  # in order, so another batch size continues by count
    rest = [x for b in as_tuples(bigger) for x in b]
    assert rest == [x for b in full[4:] for x in b]


def test_malformed_states_are_refused(url):
    _, state = take(make(url), 4)
    assert state["batches"]["after"]

    def refused(match: str, **changes) -> None:
        bad = json.loads(json.dumps(state))
        for k, v in changes.items():
            if k in ("size", "offset", "run", "after"):
                bad["batches"][k] = v
            else:
                bad[k] = v
        with pytest.raises(InvalidArgument, match=match):
            make(url).load_state_dict(bad)

    refused("dict with", batches=[0, 1])
    refused("epoch is an int >= 0", epoch=-1)
    refused("epoch is an int >= 0", epoch="1")
    refused("increasing", after=[3, 2])
    refused("increasing", after=[0])  # not above the run
    refused("increasing", after=["1"])
    refused("size", size=0)
    refused("below the epoch's 10 batches", after=[*state["batches"]["after"], 10])
    refused("does not match", consumed=state["consumed"] + 1)
    refused("consumed", consumed=OBJECTS + 1)
    refused("past this rank", offset=OBJECTS + 1)
    with pytest.raises(InvalidArgument, match="batch_size=3"):
        make(url, batch_size=4).load_state_dict(state)
    with pytest.raises(InvalidArgument, match="sampler settings"):
        make(url, sampler_drop_last=True).load_state_dict(state)
