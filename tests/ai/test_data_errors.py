"""Bad input for gpufeed.ai.data against live nodes: objects deleted or
rewritten during an epoch, corrupt shards, samples that fail to decode, a node
restarted or stopped mid-epoch. Each policy (raise, skip, retry) ends the step
with a typed error naming the object, leaves the sample out, or reads it again;
nothing hangs and no wrong sample is yielded."""

from __future__ import annotations

import time
import uuid

import pytest
from torch.utils.data import DataLoader

from gpufeed.ai.data import (
    CorruptShard,
    DataError,
    ObjectDataset,
    SampleChanged,
    SampleDecodeError,
    SampleMissing,
    SampleReadError,
    ShardDataset,
    write_shard,
)
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument
from gpufeed.testing.node import start_node

BUCKET = "data-bad"
FAST = {"retry_backoff_s": 0.01}

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture
def place(node):
    """``(client, url, prefix)`` of a fresh prefix in the session node."""
    prefix = uuid.uuid4().hex[:8] + "/"
    with Client(node.tcp_url) as c:
        try:
            c.create_bucket(BUCKET)
        except Exception:  # noqa: BLE001 - made by an earlier test
            pass
        yield c, f"{node.tcp_url}/{BUCKET}/{prefix}", prefix


def put_objects(c, prefix, n=10):
    for i in range(n):
        c.put(BUCKET, f"{prefix}{i:03d}.bin", bytes([i]) * 50)


def shard(s: int, n: int = 4) -> bytes:
    return write_shard([{"__key__": f"s{s}/{j}", "cls": str(s * 10 + j)} for j in range(n)])


def put_shards(c, prefix, n=4):
    for s in range(n):
        c.put(BUCKET, f"{prefix}{s:03d}.tar", shard(s))


def cls_of(sample):
    return int(sample["cls"])


def strict_decode(sample):
    if sample["cls"] == b"21":
        raise ValueError("not an image")
    return int(sample["cls"])


# --- objects deleted or rewritten during the epoch ------------------------------------------
def test_deleted_object_raises_naming_it(place):
    c, url, prefix = place
    put_objects(c, prefix)
    ds = ObjectDataset(url)
    c.delete(BUCKET, f"{prefix}003.bin")
    with pytest.raises(SampleMissing, match=f"{BUCKET}/{prefix}003.bin") as info:
        ds.__getitems__(list(range(10)))
    assert info.value.key == f"{prefix}003.bin" and isinstance(info.value, FileNotFoundError)
    with pytest.raises(SampleMissing):
        ds[3]
    assert ds[4] == bytes([4]) * 50


def test_deleted_object_skip_and_retry(place):
    c, url, prefix = place
    put_objects(c, prefix)
    skip = ObjectDataset(url, on_error="skip")
    retry = ObjectDataset(url, on_error="retry", max_retries=2, **FAST)
    c.delete(BUCKET, f"{prefix}003.bin")
    got = skip.__getitems__(list(range(10)))
    assert got == [bytes([i]) * 50 for i in range(10) if i != 3] and skip.skipped == 1
    with pytest.raises(DataError, match="003.bin: skipped .*listed, but gone") as info:
        skip[3]  # one index must give one sample: the error says why it has none
    assert isinstance(info.value.__cause__, SampleMissing)
    t0 = time.monotonic()
    with pytest.raises(SampleMissing, match="003.bin"):
        retry.__getitems__([2, 3])
    assert time.monotonic() - t0 < 5


def test_object_rewritten_with_another_size_is_never_yielded(place):
    c, url, prefix = place
    put_objects(c, prefix)
    ds = ObjectDataset(url)
    skip = ObjectDataset(url, on_error="skip")
    c.put(BUCKET, f"{prefix}005.bin", bytes([5]) * 80)  # longer: a read of the listed size would cut it
    c.put(BUCKET, f"{prefix}006.bin", bytes([6]) * 20)  # shorter
    for i in (5, 6):
        with pytest.raises(SampleChanged, match=f"{prefix}00{i}.bin"):
            ds.__getitems__([4, i])
        with pytest.raises(SampleChanged):
            ds[i]
    assert skip.__getitems__([4, 5, 6]) == [bytes([4]) * 50]


def test_shard_deleted_during_the_epoch_through_workers(place):
    c, url, prefix = place
    put_shards(c, prefix, 6)
    ds = ShardDataset(url, decode=cls_of)
    c.delete(BUCKET, f"{prefix}002.tar")
    with pytest.raises(SampleMissing, match=f"{prefix}002.tar"):
        list(DataLoader(ds, batch_size=3, num_workers=2))
    skip = ShardDataset(url, decode=cls_of, on_error="skip")
    got = sorted(int(x) for b in DataLoader(skip, batch_size=3, num_workers=2) for x in b)
    assert got == [s * 10 + j for s in range(6) if s != 2 for j in range(4)]


# --- corrupt shards -------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_shard_raises_or_is_skipped_whole(place, damage):
    c, url, prefix = place
    put_shards(c, prefix)
    good = shard(1)
    bad = {"truncate": good[:1500], "flip": good[:1029] + bytes([good[1029] ^ 0xFF]) + good[1030:],  # the 2nd header
           "garbage": good + b"junk" * 128}[damage]
    c.put(BUCKET, f"{prefix}001.tar", bad)
    with pytest.raises(CorruptShard, match=f"{BUCKET}/{prefix}001.tar") as info:
        list(ShardDataset(url, decode=cls_of))
    assert info.value.key == f"{prefix}001.tar"
    skip = ShardDataset(url, decode=cls_of, on_error="skip")
    assert sorted(skip) == [s * 10 + j for s in (0, 2, 3) for j in range(4)] and skip.skipped == 1
    with pytest.raises(CorruptShard):
        list(ShardDataset(url, decode=cls_of, on_error="retry", max_retries=1, **FAST))


# --- decode failures ------------------------------------------------------------------------
def test_decode_failure_raises_names_object_and_chains_cause(place):
    c, url, prefix = place
    put_shards(c, prefix)
    with pytest.raises(SampleDecodeError, match=f"{prefix}002.tar: sample 's2/1': decode failed: "
                       "ValueError: .*not an image") as info:
        list(ShardDataset(url, decode=strict_decode))
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(SampleDecodeError, match=f"{prefix}002.tar"):  # the type survives the worker
        list(DataLoader(ShardDataset(url, decode=strict_decode), batch_size=2, num_workers=2))
    skip = ShardDataset(url, decode=strict_decode, on_error="skip")
    assert sorted(skip) == [s * 10 + j for s in range(4) for j in range(4) if s * 10 + j != 21]


def test_decode_retry_reads_again(place):
    c, url, prefix = place
    put_objects(c, prefix, 4)
    calls = []

    def flaky(mv):
        calls.append(bytes(mv[:1]))
        if len(calls) == 2:
            raise OSError("torn read")
        return bytes(mv)
    ds = ObjectDataset(url, decode=flaky, on_error="retry", **FAST)
    assert ds.__getitems__([0, 1, 2]) == [bytes([i]) * 50 for i in range(3)]
    assert calls == [b"\x00", b"\x01", b"\x01", b"\x02"]
    with pytest.raises(SampleDecodeError, match="001.bin"):
        ObjectDataset(url, decode=lambda mv: 1 / 0, on_error="retry", max_retries=2, **FAST)[1]


def test_bad_policy_arguments():
    with pytest.raises(InvalidArgument):
        ObjectDataset("gpufeed+tcp://127.0.0.1:1/bkt", on_error="ignore")
    with pytest.raises(InvalidArgument):
        ShardDataset("gpufeed+tcp://127.0.0.1:1/bkt", on_error="retry", max_retries=-1)


# --- the node restarts or stops mid-epoch ---------------------------------------------------
def _restart(node):
    node.stop()
    return start_node(node.data_dir)


@pytest.mark.slow
def test_node_restart_mid_epoch_retry_completes_exactly(tmp_path):
    node = start_node(tmp_path / "data")
    try:
        with Client(node.shm_url) as c:
            c.create_bucket(BUCKET)
            put_shards(c, "p/", 6)
            put_objects(c, "o/", 40)
        url = f"{node.shm_url}/{BUCKET}/p/"
        ds = ShardDataset(url, decode=cls_of, shuffle=False, on_error="retry", max_retries=6,
                          retry_backoff_s=0.2, limits=_one_at_a_time())
        objs = ObjectDataset(f"{node.shm_url}/{BUCKET}/o/", on_error="retry", max_retries=6, retry_backoff_s=0.5)
        assert objs.__getitems__(range(5)) == [bytes([i]) * 50 for i in range(5)]
        it = iter(ds)
        got = [next(it) for _ in range(6)]
        node = _restart(node)  # same data folder, same socket path
        got += list(it)
        assert got == [s * 10 + j for s in range(6) for j in range(4)]
        t0 = time.monotonic()  # one group of 35 reads failed with its connection: one wait, not 35
        assert objs.__getitems__(range(5, 40)) == [bytes([i]) * 50 for i in range(5, 40)]
        assert time.monotonic() - t0 < 5
        raising = ShardDataset(url, decode=cls_of, shuffle=False, limits=_one_at_a_time())
        it = iter(raising)
        next(it)
        node.stop()
        t0 = time.monotonic()
        with pytest.raises(SampleReadError, match=f"{BUCKET}/p/00") as info:
            list(it)
        assert time.monotonic() - t0 < 10 and info.value.key.startswith("p/")
    finally:
        node.stop()


@pytest.mark.slow
def test_a_stopped_node_fails_the_step_instead_of_hanging(tmp_path):
    node = start_node(tmp_path / "data")
    try:
        with Client(node.tcp_url) as c:
            c.create_bucket(BUCKET)
            put_objects(c, "p/", 6)
        ds = ObjectDataset(f"{node.tcp_url}/{BUCKET}/p/", request_timeout_s=1.0)
        assert ds[0] == bytes(50)
        node.pause()
        t0 = time.monotonic()
        with pytest.raises(SampleReadError, match=f"{BUCKET}/p/001.bin"):
            ds.__getitems__([1, 2])
        assert time.monotonic() - t0 < 5
        node.resume()
        assert ds[1] == bytes([1]) * 50  # the lost connection was replaced
    finally:
        node.resume()
        node.stop()


def _one_at_a_time():
    from gpufeed.ai.data import ReadLimits

    return ReadLimits(max_inflight=1, batch_bytes=1024)  # one shard per read, one read in flight
