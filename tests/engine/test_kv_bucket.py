"""KV buckets: a cache that evicts least recently used objects to stay within its
capacity and hides objects past their TTL; standard buckets never lose an object.

Real engines on temp folders; no mocks.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import pytest

from gpufeed.engine import BucketInfo, Engine
from gpufeed.errors import EntityTooLarge, InvalidArgument, NoSuchBucket, NoSuchKey

KB = 1 << 10


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync=False)
    yield e
    e.close()


def _blob_files(data_dir) -> set[str]:
    out = set()
    for _root, _, files in os.walk(data_dir / "blobs"):
        out.update(files)
    return out


def _keys(e: Engine, bucket: str) -> list[str]:
    return [o.key for o in e.list_objects(bucket).objects]


# --- creation and policy ---------------------------------------------------------
def test_create_kv_bucket_reports_its_policy(eng):
    info = eng.create_bucket("kvb", kind="kv", capacity_bytes=10 * KB, ttl_s=30)
    assert info == BucketInfo("kvb", info.created, "kv", 10 * KB, 30.0)
    assert eng.head_bucket("kvb") == info
    eng.create_bucket("plain")
    assert eng.head_bucket("plain").kind == "standard"
    assert {b.name: b.kind for b in eng.list_buckets()} == {"kvb": "kv", "plain": "standard"}


@pytest.mark.parametrize("kw", [
    {"kind": "kv"},                                   # neither limit
    {"kind": "lru", "capacity_bytes": 10},            # unknown kind
    {"kind": "kv", "capacity_bytes": -1},
    {"kind": "kv", "ttl_s": -1.0},
    {"kind": "kv", "ttl_s": float("nan")},
    {"kind": "kv", "capacity_bytes": True},
    {"kind": "kv", "capacity_bytes": "10"},
    {"capacity_bytes": 10},                           # a standard bucket never evicts
    {"ttl_s": 1.0},
])
def test_bad_policies_are_refused(eng, kw):
    with pytest.raises(InvalidArgument):
        eng.create_bucket("kvb", **kw)
    with pytest.raises(NoSuchBucket):
        eng.head_bucket("kvb")


def test_set_bucket_policy_shrinks_by_lru(eng):
    eng.create_bucket("kvb", kind="kv", capacity_bytes=10 * KB)
    for i in range(10):
        eng.put_object("kvb", f"k{i}", bytes(KB))
    eng.head_object("kvb", "k0")
    info = eng.set_bucket_policy("kvb", capacity_bytes=3 * KB)
    assert (info.capacity_bytes, info.ttl_s) == (3 * KB, 0.0)
    assert _keys(eng, "kvb") == ["k0", "k8", "k9"]
    assert eng.bucket_stats("kvb")["evictions"] == 7
    eng.create_bucket("plain")
    with pytest.raises(InvalidArgument):
        eng.set_bucket_policy("plain", capacity_bytes=KB)
    with pytest.raises(InvalidArgument):
        eng.set_bucket_policy("kvb", capacity_bytes=0)  # then it would have no limit at all


# --- capacity and LRU ------------------------------------------------------------
def test_full_kv_bucket_never_refuses_a_put(eng):
    cap = 64 * KB
    eng.create_bucket("kvb", kind="kv", capacity_bytes=cap)
    sizes = [(i * 7919) % (8 * KB) + 1 for i in range(300)]  # ~1.2 MiB in all, 19x the capacity
    for i, n in enumerate(sizes):
        eng.put_object("kvb", f"k{i:04d}", os.urandom(n), etag="xxh3")
        assert eng.bucket_stats("kvb")["bytes"] <= cap
    stats = eng.bucket_stats("kvb")
    live = eng.list_objects("kvb").objects
    assert stats["bytes"] == sum(o.size for o in live) <= cap
    assert stats["objects"] == len(live)
    assert stats["evictions"] == len(sizes) - len(live)
    # Nothing was evicted while newer ones survive: what is left is a suffix of the writes.
    left = sorted(int(o.key[1:]) for o in live)
    assert left == list(range(left[0], len(sizes)))
    assert _blob_files(eng.data_dir) == {o.blob_id for o in live}


def test_lru_keeps_what_is_read(eng):
    eng.create_bucket("kvb", kind="kv", capacity_bytes=4 * KB)
    for i in range(4):
        eng.put_object("kvb", f"k{i}", bytes(KB))
    assert eng.get_object("kvb", "k0") == bytes(KB)   # k0 is now the most recently used
    eng.put_object("kvb", "k4", bytes(KB))            # evicts k1, the least recently used
    assert _keys(eng, "kvb") == ["k0", "k2", "k3", "k4"]
    eng.head_object("kvb", "k2")
    eng.put_object("kvb", "k5", bytes(2 * KB))        # evicts k3 then k0
    assert _keys(eng, "kvb") == ["k2", "k4", "k5"]
    with pytest.raises(NoSuchKey):
        eng.head_object("kvb", "k1")


def test_overwrite_counts_the_new_size_only(eng):
    eng.create_bucket("kvb", kind="kv", capacity_bytes=4 * KB)
    for i in range(4):
        eng.put_object("kvb", f"k{i}", bytes(KB))
    eng.put_object("kvb", "k0", bytes(KB))  # same size: fits without evicting
    assert eng.bucket_stats("kvb")["evictions"] == 0
    eng.put_object("kvb", "k0", bytes(2 * KB))  # one more KiB: the LRU one (k1) goes
    assert _keys(eng, "kvb") == ["k0", "k2", "k3"]
    eng.delete_object("kvb", "k2")
    assert eng.bucket_stats("kvb")["bytes"] == 3 * KB


def test_entity_larger_than_capacity_is_refused(eng):
    eng.create_bucket("kvb", kind="kv", capacity_bytes=4 * KB)
    eng.put_object("kvb", "keep", bytes(KB))
    with pytest.raises(EntityTooLarge):
        eng.put_object("kvb", "big", bytes(4 * KB + 1))
    eng.put_object("kvb", "exact", bytes(4 * KB))  # exactly the capacity fits (alone)
    assert _keys(eng, "kvb") == ["exact"]
    assert _blob_files(eng.data_dir) == {eng.head_object("kvb", "exact").blob_id}
    assert os.listdir(eng.data_dir / "tmp") == []


def test_standard_bucket_never_evicts(eng):
    eng.create_bucket("plain")
    eng.create_bucket("kvb", kind="kv", capacity_bytes=2 * KB)
    for i in range(50):
        eng.put_object("plain", f"k{i:02d}", bytes(KB))
        eng.put_object("kvb", f"k{i:02d}", bytes(KB))
    assert len(_keys(eng, "plain")) == 50
    stats = eng.bucket_stats("plain")
    assert stats.pop("data")["logical_bytes"] == 50 * KB
    assert stats == {"kind": "standard", "capacity_bytes": 0, "ttl_s": 0.0,
                     "bytes": 50 * KB, "objects": 50, "evictions": 0,
                     "expirations": 0, "etag_policy": "md5"}
    assert _keys(eng, "kvb") == ["k48", "k49"]


def test_multipart_and_copy_into_kv_bucket_evict_too(eng):
    eng.create_bucket("kvb", kind="kv", capacity_bytes=3 * KB)
    eng.create_bucket("plain")
    eng.put_object("plain", "src", bytes(2 * KB))
    for i in range(3):
        eng.put_object("kvb", f"k{i}", bytes(KB))
    eng.copy_object("plain", "src", "kvb", "copy")
    assert _keys(eng, "kvb") == ["copy", "k2"]
    eng.head_object("kvb", "k2")  # now the copy is the least recently used
    up = eng.create_multipart_upload("kvb", "mp")
    part = eng.upload_part("kvb", "mp", up.upload_id, 1, bytes(2 * KB))
    eng.complete_multipart_upload("kvb", "mp", up.upload_id, [(1, part.etag)])
    assert _keys(eng, "kvb") == ["k2", "mp"]


# --- TTL ---------------------------------------------------------------------------
def test_ttl_hides_then_deletes(eng):
    eng.create_bucket("kvb", kind="kv", ttl_s=0.5)
    eng.put_object("kvb", "old", b"1")
    eng.put_object("kvb", "dir/old", b"2")
    time.sleep(0.6)
    eng.put_object("kvb", "new", b"3")  # this put's eviction pass deletes the expired ones
    assert _keys(eng, "kvb") == ["new"]
    assert eng.list_objects("kvb", delimiter="/").common_prefixes == []
    with pytest.raises(NoSuchKey):
        eng.head_object("kvb", "old")
    stats = eng.bucket_stats("kvb")
    assert (stats["objects"], stats["expirations"], stats["evictions"]) == (1, 2, 0)
    assert _blob_files(eng.data_dir) == {eng.head_object("kvb", "new").blob_id}


def test_ttl_counts_from_the_last_write_and_reads_delete(eng):
    eng.create_bucket("kvb", kind="kv", ttl_s=0.5)
    eng.put_object("kvb", "a", b"1")
    eng.put_object("kvb", "b", b"1")
    time.sleep(0.3)
    eng.put_object("kvb", "a", b"2")  # rewritten: a new half second
    time.sleep(0.3)
    assert eng.get_object("kvb", "a") == b"2"
    assert _keys(eng, "kvb") == ["a"]  # b is hidden from listings before anything deletes it
    blob_b = eng._cat.reader().execute("SELECT blob_id FROM objects WHERE key='b'").fetchone()[0]
    with pytest.raises(NoSuchKey):
        eng.get_object("kvb", "b")  # the read that finds it expired deletes it
    assert blob_b not in _blob_files(eng.data_dir)
    assert eng.bucket_stats("kvb")["expirations"] == 1


def test_ttl_and_capacity_together_drop_expired_first(eng):
    eng.create_bucket("kvb", kind="kv", capacity_bytes=3 * KB, ttl_s=0.5)
    eng.put_object("kvb", "stale", bytes(KB))
    time.sleep(0.6)
    eng.put_object("kvb", "a", bytes(KB))
    eng.put_object("kvb", "b", bytes(KB))
    eng.put_object("kvb", "c", bytes(KB))
    assert _keys(eng, "kvb") == ["a", "b", "c"]
    stats = eng.bucket_stats("kvb")
    assert (stats["expirations"], stats["evictions"]) == (1, 0)


# --- restart and concurrency -----------------------------------------------------------
def test_restart_recounts_totals_and_keeps_lru_order(tmp_path):
    d = tmp_path / "data"
    with Engine(d, fsync=False) as e:
        e.create_bucket("kvb", kind="kv", capacity_bytes=4 * KB)
        for i in range(4):
            e.put_object("kvb", f"k{i}", bytes(KB))
        e.head_object("kvb", "k0")  # flushed to the catalog on close
    with Engine(d, fsync=False) as e:
        assert e.head_bucket("kvb").capacity_bytes == 4 * KB
        stats = e.bucket_stats("kvb")
        assert (stats["bytes"], stats["objects"]) == (4 * KB, 4)
        e.put_object("kvb", "k4", bytes(KB))
        assert _keys(e, "kvb") == ["k0", "k2", "k3", "k4"]


def test_catalog_from_before_kv_buckets_upgrades(tmp_path):
    d = tmp_path / "data"
    with Engine(d, fsync=False) as e:
        e.create_bucket("plain")
        e.put_object("plain", "k", b"v")
    con = sqlite3.connect(d / "catalog.sqlite3")  # strip the new columns: an older catalog
    for table, col in [("buckets", "kind"), ("buckets", "capacity_bytes"), ("buckets", "ttl_s"),
                       ("objects", "last_access")]:
        con.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    con.commit()
    con.close()
    with Engine(d, fsync=False) as e:
        assert e.head_bucket("plain").kind == "standard"
        assert e.get_object("plain", "k") == b"v"
        e.create_bucket("kvb", kind="kv", capacity_bytes=KB)
        e.put_object("kvb", "k", b"v")


def test_concurrent_puts_stay_within_capacity_and_leak_nothing(tmp_path):
    d = tmp_path / "data"
    cap = 32 * KB
    e = Engine(d, fsync=False)
    e.create_bucket("kvb", kind="kv", capacity_bytes=cap)
    errors: list[BaseException] = []
    over: list[int] = []
    stop = threading.Event()

    def writer(t: int) -> None:
        try:
            for i in range(60):
                e.put_object("kvb", f"t{t}/{i % 25}", os.urandom(1 + (i * 613 + t) % (3 * KB)), etag="xxh3")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        while not stop.is_set():
            for o in e.list_objects("kvb").objects:
                try:
                    e.get_object("kvb", o.key)
                except NoSuchKey:
                    pass  # evicted between list and get
            n = e.bucket_stats("kvb")["bytes"]
            if n > cap:
                over.append(n)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    rd = threading.Thread(target=reader)
    rd.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    rd.join()
    assert not errors and not over
    stats = e.bucket_stats("kvb")
    live = {o.key: o for o in e.list_objects("kvb").objects}
    assert stats["bytes"] == sum(o.size for o in live.values()) <= cap
    assert stats["evictions"] > 0
    e.close()
    e = Engine(d, fsync=False)
    try:
        assert e.recovered["blobs"] == 0  # every evicted blob was unlinked after its commit
        assert _blob_files(d) == {o.blob_id for o in live.values()}
        assert e.bucket_stats("kvb")["bytes"] == stats["bytes"]
    finally:
        e.close()


def test_crash_between_commit_and_unlink_leaves_no_blob(tmp_path, monkeypatch):
    """An eviction commits, then the process dies before the victims' blobs are
    unlinked: the next start removes them (they are unreferenced)."""
    d = tmp_path / "data"
    e = Engine(d, fsync=False)
    e.create_bucket("kvb", kind="kv", capacity_bytes=2 * KB)
    e.put_object("kvb", "a", bytes(KB))
    e.put_object("kvb", "b", bytes(KB))
    monkeypatch.setattr(e._files, "remove_blobs", lambda blobs: None)  # the "crash": unlinks never happen
    e.put_object("kvb", "c", bytes(KB))
    assert len(_blob_files(d)) == 3
    e.close()
    with Engine(d, fsync=False) as e2:
        assert e2.recovered["orphan_manifests"] == 1  # its data is released on start
        assert _keys(e2, "kvb") == ["b", "c"]
        assert len(_blob_files(d)) == 2
