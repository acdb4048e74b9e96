"""ResumableLoader states taken at epoch boundaries, against a live node: before
an epoch's first batch (a fresh loader, after ``set_epoch``) and after its last
one, for tar shards decoded and as raw-tensor batches and for an
ObjectDataset, with 0 and 2 workers. A loader resumed from such a state
delivers exactly the batches an uninterrupted run delivers
(docs/training-data.md, "Resuming mid-epoch")."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import torch

from gpufeed.ai.data import ObjectDataset, ResumableLoader, ShardDataset, write_shard
from gpufeed.client import Client

BUCKET = "data-resume-tests"
SHARDS, PER_SHARD, OBJECTS, BATCH = 4, 6, 22, 4

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def row(i: int) -> bytes:
    """Sample ``i`` as a raw tensor: 4 float32, the first ``i``."""
    return np.array([i, 1, 2, 3], dtype=np.float32).tobytes()


@pytest.fixture(scope="module")
def urls(node) -> dict[str, str]:
    """``{"tar": decoded shards, "tensor": the same shards as raw tensors, "objects": ObjectDataset}``."""
    prefix = uuid.uuid4().hex[:8]
    with Client(node.tcp_url) as c:
        try:
            c.create_bucket(BUCKET)
        except Exception:  # noqa: BLE001 - made by an earlier module of the session
            pass
        for s in range(SHARDS):
            c.put(BUCKET, f"{prefix}/shards/{s:03d}.tar", write_shard(
                [{"__key__": f"s{s}/{j}", "bin": row(s * PER_SHARD + j)} for j in range(PER_SHARD)]))
        for i in range(OBJECTS):
            c.put(BUCKET, f"{prefix}/objs/{i:03d}.bin", row(i))
    base = f"{node.tcp_url}/{BUCKET}/{prefix}"
    return {"tar": f"{base}/shards/", "tensor": f"{base}/shards/", "objects": f"{base}/objs/"}


def _keys(samples):
    return [s["__key__"] for s in samples]


def make(urls: dict[str, str], kind: str, workers: int) -> ResumableLoader:
    if kind == "tar":
        return ResumableLoader(ShardDataset(urls[kind], seed=3, shuffle_buffer=5), batch_size=BATCH,
                               num_workers=workers, collate_fn=_keys)
    if kind == "tensor":
        ds = ShardDataset(urls[kind], format="tar", dtype=torch.float32, shape=(4,), batch_size=BATCH,
                          seed=3, shuffle_buffer=5)
        return ResumableLoader(ds, num_workers=workers)
    objects = ObjectDataset(urls[kind], dtype=torch.float32, shape=(4,))
    return ResumableLoader(objects, batch_size=BATCH, num_workers=workers, sampler=objects.sampler(seed=3))


def batches(loader: ResumableLoader) -> list[list]:
    """The batches of one pass, each as its sample keys (tar) or sample numbers (tensors)."""
    return [b if isinstance(b, list) else [int(x) for x in b[:, 0]] for b in loader]


def saved(loader: ResumableLoader) -> dict:
    """The loader's state as a checkpoint stores it (through JSON: plain values only)."""
    return json.loads(json.dumps(loader.state_dict()))


def resumed(urls, kind: str, workers: int, state: dict) -> ResumableLoader:
    loader = make(urls, kind, workers)
    loader.load_state_dict(state)
    loader.set_epoch(loader.epoch)  # a training loop's set_epoch at the top of the resumed epoch
    return loader


KINDS = pytest.mark.parametrize("kind", ["tar", "tensor", "objects"])
WORKERS = pytest.mark.parametrize("workers", [0, 2])


@KINDS
@WORKERS
def test_a_state_taken_before_the_first_batch_resumes_the_whole_epoch(urls, kind, workers):
    reference = make(urls, kind, workers)
    reference.set_epoch(2)
    full = batches(reference)
    assert sum(map(len, full)) == (SHARDS * PER_SHARD if kind != "objects" else OBJECTS)
    before = make(urls, kind, workers)
    before.set_epoch(2)
    state = saved(before)
    assert state["epoch"] == 2
    assert batches(resumed(urls, kind, workers, state)) == full
    fresh = saved(make(urls, kind, workers))  # never iterated: epoch 0 from its beginning
    reference.set_epoch(0)
    assert batches(resumed(urls, kind, workers, fresh)) == batches(reference)
    loaded = make(urls, kind, workers)
    loaded.load_state_dict(state)
    assert saved(loaded) == state  # a loaded state, not yet iterated, is saved as it was


@KINDS
@WORKERS
@pytest.mark.parametrize("on", ["loader", "owner"])
def test_a_state_taken_after_set_epoch_starts_that_epoch_from_its_beginning(urls, kind, workers, on):
    reference = make(urls, kind, workers)
    reference.set_epoch(1)
    full = batches(reference)
    loader = make(urls, kind, workers)
    loader.set_epoch(0)
    batches(loader)
    done = saved(loader)  # after epoch 0's last batch: epoch 0 is done
    assert done["epoch"] == 0 and batches(resumed(urls, kind, workers, done)) == []
    owner = loader.sampler if kind == "objects" else loader.dataset
    (loader if on == "loader" else owner).set_epoch(1)
    state = saved(loader)
    assert state["epoch"] == 1
    again = resumed(urls, kind, workers, state)
    assert batches(again) == full
    again.set_epoch(2)  # and the epoch after starts from its beginning too
    reference.set_epoch(2)
    assert batches(again) == batches(reference)


@WORKERS
def test_objects_consumed_counts_the_sampler_indices_used(urls, workers):
    loader = make(urls, "objects", workers)
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["consumed"] == 2 * BATCH
    list(it)
    assert loader.state_dict()["consumed"] == OBJECTS  # not 6 batches x 4: the last batch holds 2


def test_out_of_order_delivery_of_shards_resumes_each_sample_once(urls):
    def make_unordered():
        return ResumableLoader(ShardDataset(urls["tar"], seed=3, shuffle_buffer=5), batch_size=BATCH,
                               num_workers=2, collate_fn=_keys, in_order=False)

    full = sorted(k for b in make_unordered() for k in b)
    first = make_unordered()
    it = iter(first)
    got = [k for _ in range(3) for k in next(it)]
    state = saved(first)
    del it
    second = make_unordered()
    second.load_state_dict(state)
    rest = [k for b in second for k in b]
    assert sorted(got + rest) == full and len(full) == SHARDS * PER_SHARD  # each sample once
