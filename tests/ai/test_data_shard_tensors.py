"""ShardDataset(dtype=...) against a live node: raw-tensor batches of tar
shards read by range straight into their rows (GETR), through real
DataLoaders with 0 and 2 workers, bit-identical to the decode path's
samples; shuffle, ranks, resume; and the bad-input rules."""

from __future__ import annotations

import collections
import uuid

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gpufeed.ai.data import (
    CorruptShard,
    ResumableLoader,
    SampleChanged,
    SampleDecodeError,
    SampleMissing,
    ShardDataset,
    write_shard,
)
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument

BUCKET = "data-shard-tensor-tests"
SHARDS, PER_SHARD, NBYTES = 5, 9, 1200  # shards, samples per shard, bytes per sample (300 float32)

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
              pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"), pytest.mark.usefixtures("bucket")]


def sample(i: int, nbytes: int = NBYTES) -> bytes:
    """Sample ``i``: float32 ``i`` in its first element, then random bytes."""
    return np.float32(i).tobytes() + np.random.default_rng(i).bytes(nbytes - 4)


def ids(batch: torch.Tensor) -> list[int]:
    """The sample numbers of a batch (checking every row's bytes)."""
    out = []
    for row in batch.reshape(batch.shape[0], -1):
        i = int(row.view(torch.float32)[0].item()) if row.dtype != torch.float32 else int(row[0].item())
        assert row.numpy().tobytes() == sample(i, row.numpy().nbytes), f"row of sample {i} differs"
        out.append(i)
    return out


def put_shards(c: Client, prefix: str, shards: int = SHARDS, per: int = PER_SHARD, **kw) -> None:
    for s in range(shards):
        c.put(BUCKET, f"{prefix}{s:04d}.tar", write_shard(
            [{"__key__": f"{s:02d}{j:03d}", "bin": sample(s * per + j), **kw} for j in range(per)]))


@pytest.fixture(scope="module")
def bucket(node) -> str:
    with Client(node.tcp_url) as c:
        try:
            c.create_bucket(BUCKET)
        except Exception:  # noqa: BLE001 - made by an earlier test of the session
            pass
    return BUCKET


@pytest.fixture(scope="module")
def shards(node, bucket):
    """``{"one": prefix (one file per sample), "two": prefix (bin + cls)}``."""
    base = uuid.uuid4().hex[:8]
    with Client(node.tcp_url) as c:
        put_shards(c, f"{base}/one/")
        put_shards(c, f"{base}/two/", cls="7")
    return {"one": f"{base}/one/", "two": f"{base}/two/"}


def url(node, transport: str = "shm") -> str:
    return f"{node.shm_url if transport == 'shm' else node.tcp_url}/{BUCKET}"


def tensors(node, prefix, transport="shm", **kw) -> ShardDataset:
    kw.setdefault("dtype", torch.float32)
    kw.setdefault("shape", (NBYTES // 4,))
    kw.setdefault("batch_size", 4)
    return ShardDataset(url(node, transport), prefix, **kw)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_hold_every_sample_once_bit_identical(node, shards, transport, workers):
    ds = tensors(node, shards["one"], transport, batch_size=7, shuffle_buffer=5)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, pin_memory=True)
    got = []
    for batch in loader:
        assert batch.dtype == torch.float32 and batch.shape[1:] == (NBYTES // 4,) and batch.shape[0] <= 7
        got += ids(batch)
    assert sorted(got) == list(range(SHARDS * PER_SHARD))


def test_the_same_samples_as_the_decode_path_batch_by_batch(node, shards):
    """Tensor batches hold the samples the decode path's batches hold (rows grouped by shard)."""
    def decode(s):
        return int(np.frombuffer(s["bin"][:4], np.float32)[0])

    for epoch in (0, 1):
        plain = ShardDataset(url(node), shards["two"], decode=decode, shuffle_buffer=6, seed=3)
        fast = tensors(node, shards["two"], ext="bin", batch_size=5, shuffle_buffer=6, seed=3)
        plain.set_epoch(epoch)
        fast.set_epoch(epoch)
        want = [sorted(b.tolist()) for b in DataLoader(plain, batch_size=5, num_workers=2)]
        got = [sorted(ids(b)) for b in DataLoader(fast, batch_size=None, num_workers=2)]
        assert got == want


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_the_shards(node, shards, world):
    seen = collections.Counter()
    for rank in range(world):
        ds = tensors(node, shards["one"], rank=rank, world_size=world)
        for batch in DataLoader(ds, batch_size=None, num_workers=2):
            seen.update(ids(batch))
    assert seen == collections.Counter(range(SHARDS * PER_SHARD))


def test_without_shape_one_size_a_batch_and_the_main_process(node, shards):
    ds = tensors(node, shards["one"], dtype=torch.uint8, shape=None, batch_size=10, shuffle=False)
    batches = list(ds)
    assert [b.shape for b in batches] == [(10, NBYTES)] * 4 + [(5, NBYTES)]
    assert [i for b in batches for i in ids(b)] == list(range(SHARDS * PER_SHARD))


def test_resume_mid_epoch_continues_with_the_next_batch(node, shards):
    def make():
        ds = tensors(node, shards["one"], batch_size=3, shuffle_buffer=4, seed=1)
        return ResumableLoader(ds, num_workers=2)

    loader = make()
    it = iter(loader)
    head = [ids(next(it)) for _ in range(5)]
    state = loader.state_dict()
    rest = [ids(b) for b in it]
    again = make()
    again.load_state_dict(state)
    assert [ids(b) for b in again] == rest
    assert sorted(i for b in head + rest for i in b) == list(range(SHARDS * PER_SHARD))


def test_arguments_are_checked(node, shards):
    u = url(node)
    with pytest.raises(InvalidArgument, match="batch_size"):
        ShardDataset(u, shards["one"], dtype=torch.uint8)
    with pytest.raises(InvalidArgument, match="exclude"):
        ShardDataset(u, shards["one"], dtype=torch.uint8, batch_size=2, decode=dict)
    with pytest.raises(InvalidArgument, match="need dtype"):
        ShardDataset(u, shards["one"], batch_size=2)
    with pytest.raises(InvalidArgument, match="tar shards"):
        ShardDataset(u, shards["one"], dtype=torch.uint8, batch_size=2, format="objects")
    with pytest.raises(InvalidArgument, match="batch_size=None"):
        ResumableLoader(tensors(node, shards["one"]), batch_size=4)


def test_samples_with_two_files_need_ext(node, shards):
    with pytest.raises(SampleDecodeError, match=r"0000\.tar: sample '00000' has files \['bin', 'cls'\].*ext="):
        next(iter(tensors(node, shards["two"], shuffle=False)))
    labels = tensors(node, shards["two"], ext="cls", dtype=torch.uint8, shape=None, batch_size=100)
    assert [b.tolist() for b in labels] == [[[ord("7")]] * SHARDS * PER_SHARD]
    with pytest.raises(SampleDecodeError, match=r"sample '\d+' has no 'jpg' file"):
        list(tensors(node, shards["two"], ext="JPG"))
    skipping = tensors(node, shards["two"], ext="jpg", on_error="skip")
    assert list(skipping) == [] and skipping.skipped == SHARDS  # each shard left out whole


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_of_another_size_is_named(node, workers):
    prefix = uuid.uuid4().hex[:8] + "/"
    with Client(node.tcp_url) as c:
        put_shards(c, prefix, shards=1)
        c.put(BUCKET, f"{prefix}0001.tar", write_shard([{"__key__": "a", "bin": sample(100)},
                                                        {"__key__": "odd", "bin": sample(101, NBYTES - 8)}]))
    strict = DataLoader(tensors(node, prefix, shuffle=False, batch_size=20), batch_size=None, num_workers=workers)
    with pytest.raises(SampleDecodeError, match=r"0001\.tar: sample 'odd' \(member 1\) has 1192 bytes.*shape"):
        list(strict)
    ragged = DataLoader(tensors(node, prefix, shuffle=False, batch_size=20, dtype=torch.uint8, shape=None),
                        batch_size=None, num_workers=workers)
    with pytest.raises(InvalidArgument, match=r"differ in size.*0001\.tar sample 'odd' \(1192 bytes\).*shape="):
        list(ragged)
    skipping = tensors(node, prefix, shuffle=False, batch_size=20, on_error="skip")
    assert [ids(b) for b in skipping] == [list(range(PER_SHARD)) + [100]] and skipping.skipped == 1


def test_a_corrupt_shard_is_named(node):
    prefix = uuid.uuid4().hex[:8] + "/"
    with Client(node.tcp_url) as c:
        put_shards(c, prefix, shards=2)
        bad = bytearray(c.get(BUCKET, f"{prefix}0001.tar"))
        bad[512 + NBYTES + 600] ^= 0xFF  # the second member's header (past the first's padded data)
        c.put(BUCKET, f"{prefix}0001.tar", bytes(bad))
    with pytest.raises(CorruptShard, match=r"0001\.tar: tar header checksum mismatch"):
        list(tensors(node, prefix, shuffle=False))
    skipping = tensors(node, prefix, shuffle=False, on_error="skip", batch_size=100)
    assert [ids(b) for b in skipping] == [list(range(PER_SHARD))] and skipping.skipped == 1


@pytest.mark.parametrize("change", ["deleted", "grown", "shrunk"])
def test_a_shard_deleted_or_rewritten_mid_epoch_is_named(node, change):
    prefix = uuid.uuid4().hex[:8] + "/"
    with Client(node.tcp_url) as c:
        put_shards(c, prefix, shards=2)
        before = tensors(node, prefix, shuffle=False, batch_size=PER_SHARD)  # indexes shard 1 after the change
        after = tensors(node, prefix, shuffle_buffer=100, batch_size=4)  # has both indexes for its first batch
        first, later = iter(before), iter(after)
        assert ids(next(first)) == list(range(PER_SHARD))
        next(later)
        key = f"{prefix}0001.tar"
        if change == "deleted":
            c.delete(BUCKET, key)
        else:
            data = bytes(c.get(BUCKET, key))
            c.put(BUCKET, key, data + bytes(10240) if change == "grown" else data[:len(data) // 2])
        want = SampleMissing if change == "deleted" else SampleChanged
        with pytest.raises(want, match=r"0001\.tar"):
            next(first)
        with pytest.raises(want, match=r"0001\.tar"):
            list(later)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_deleted_shard_is_skipped_or_retried_then_named(node, workers):
    prefix = uuid.uuid4().hex[:8] + "/"
    with Client(node.tcp_url) as c:
        put_shards(c, prefix, shards=3)
        skipping = tensors(node, prefix, shuffle=False, batch_size=100, on_error="skip")
        retrying = tensors(node, prefix, shuffle=False, batch_size=100, on_error="retry", max_retries=1,
                           retry_backoff_s=0.0)
        c.delete(BUCKET, f"{prefix}0001.tar")
    got = [ids(b) for b in DataLoader(skipping, batch_size=None, num_workers=workers)]
    assert sorted(i for b in got for i in b) == list(range(PER_SHARD)) + list(range(2 * PER_SHARD, 3 * PER_SHARD))
    with pytest.raises(SampleMissing, match=r"0001\.tar: listed, but gone"):
        list(DataLoader(retrying, batch_size=None, num_workers=workers))


def test_resume_refuses_a_shard_whose_sample_count_changed(node):
    prefix = uuid.uuid4().hex[:8] + "/"
    with Client(node.tcp_url) as c:
        put_shards(c, prefix, shards=2)
        loader = ResumableLoader(tensors(node, prefix, shuffle=False, batch_size=4), num_workers=1)
        it = iter(loader)
        assert ids(next(it)) == [0, 1, 2, 3]
        state = loader.state_dict()
        del it
        c.put(BUCKET, f"{prefix}0000.tar", write_shard(
            [{"__key__": f"00{j:03d}", "bin": sample(j)} for j in range(PER_SHARD - 1)]))
    again = ResumableLoader(tensors(node, prefix, shuffle=False, batch_size=4), num_workers=1)
    again.load_state_dict(state)
    with pytest.raises(SampleChanged, match=r"0000\.tar: holds 8 samples, 9 when the position was saved"):
        list(again)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_batches_of_a_mebibyte_and_more_go_to_the_main_process_by_descriptor(node, transport):
    from gpufeed.ai.data._tensors import DIRECT_MIN_BYTES

    prefix, big = uuid.uuid4().hex[:8] + "/", 128 << 10
    with Client(node.tcp_url) as c:
        for s in range(2):
            c.put(BUCKET, f"{prefix}{s:04d}.tar", write_shard(
                [{"__key__": f"{s}{j:03d}", "bin": sample(s * 10 + j, big)} for j in range(10)]))
    ds = tensors(node, prefix, transport, shape=(big // 4,), batch_size=9, shuffle_buffer=4)
    assert 9 * big >= DIRECT_MIN_BYTES
    got = []
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        assert batch.is_shared() and batch.shape[1:] == (big // 4,)
        got += ids(batch)
    assert sorted(got) == [s * 10 + j for s in range(2) for j in range(10)]
