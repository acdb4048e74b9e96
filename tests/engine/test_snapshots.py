"""Engine: bucket snapshots (create, read as of, diff, restore, delete,
schedules), the data they pin, and their refusals."""

from __future__ import annotations

import calendar
import os
import time

import pytest

from gpufeed.engine import Engine, LifecycleRule
from gpufeed.engine.types import RestoreResult, Retention, SnapshotDiff
from gpufeed.errors import (
    AccessDenied,
    BucketNotEmpty,
    InvalidArgument,
    InvalidRequestError,
    NoSuchBucket,
    NoSuchKey,
    NoSuchSnapshot,
    SnapshotAlreadyExists,
)

B = "bkt"


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync=False)
    e.create_bucket(B)
    yield e
    e.close()


def _blob_files(e: Engine) -> int:
    return sum(len(files) for _, _, files in os.walk(e.data_dir / "blobs"))


def _live(e: Engine, bucket: str = B) -> dict[str, bytes]:
    return {o.key: e.get_object(bucket, o.key) for o in e.list_objects(bucket).objects}


def test_create_list_head_delete(eng):
    eng.put_object(B, "a", b"1")
    eng.put_object(B, "b/c", b"22")
    s = eng.create_snapshot(B, "s1")
    assert (s.bucket, s.name, s.kind, s.objects, s.bytes) == (B, "s1", "manual", 2, 3)
    assert abs(s.created - time.time()) < 60
    assert eng.list_snapshots(B) == [s]
    assert eng.head_snapshot(B, "s1") == s
    with pytest.raises(SnapshotAlreadyExists):
        eng.create_snapshot(B, "s1")
    eng.delete_snapshot(B, "s1")
    assert eng.list_snapshots(B) == []
    with pytest.raises(NoSuchSnapshot):
        eng.delete_snapshot(B, "s1")
    with pytest.raises(NoSuchBucket):
        eng.create_snapshot("nope-bucket", "s1")


@pytest.mark.parametrize("name", ["", "../x", "a/b", "a\\b", "..", "a..b", ".hidden", "-x", "a b", "a@b",
                                  "x" * 129, "é", "a\x00", "auto-hourly-2026"])
def test_bad_names_are_refused(eng, name):
    with pytest.raises(InvalidArgument):
        eng.create_snapshot(B, name)
    assert eng.list_snapshots(B) == []


def test_longest_name_and_kv_bucket(eng):
    assert eng.create_snapshot(B, "x" * 128).name == "x" * 128
    eng.create_bucket("cache", kind="kv", capacity_bytes=1 << 20)
    with pytest.raises(InvalidArgument, match="kv"):
        eng.create_snapshot("cache", "s")
    with pytest.raises(InvalidArgument, match="snapshot name"):
        eng.head_object(B, "k", snapshot="../etc")


def test_reads_as_of_snapshot(eng):
    eng.put_object(B, "a", b"old-a", metadata={"m": "1"}, content_type="text/plain")
    eng.put_object(B, "dir/x", b"x")
    eng.put_object(B, "dir/y", b"y")
    eng.create_snapshot(B, "s")
    eng.put_object(B, "a", b"new-a")
    eng.delete_object(B, "dir/x")
    eng.put_object(B, "z", b"later")
    info = eng.head_object(B, "a", snapshot="s")
    assert (info.size, info.metadata, info.content_type) == (5, {"m": "1"}, "text/plain")
    assert eng.get_object(B, "a", snapshot="s") == b"old-a"
    assert eng.get_object(B, "dir/x", snapshot="s") == b"x"
    with eng.open_version(B, "a", snapshot="s") as h:
        assert os.pread(h.fd, 5, 0) == b"old-a"
    page = eng.list_objects(B, snapshot="s")
    assert [o.key for o in page.objects] == ["a", "dir/x", "dir/y"]
    page = eng.list_objects(B, snapshot="s", delimiter="/", max_keys=1)
    assert [o.key for o in page.objects] == ["a"] and page.is_truncated
    page = eng.list_objects(B, snapshot="s", delimiter="/", continuation_token=page.next_token)
    assert page.common_prefixes == ["dir/"] and not page.is_truncated
    with pytest.raises(NoSuchKey):
        eng.head_object(B, "z", snapshot="s")
    with pytest.raises(NoSuchSnapshot):
        eng.get_object(B, "a", snapshot="nope")
    with pytest.raises(NoSuchSnapshot):
        eng.list_objects(B, snapshot="nope")
    with pytest.raises(InvalidArgument):
        eng.head_object(B, "a", "null", snapshot="s")


def test_snapshot_pins_data_through_overwrites_deletes_lifecycle_and_restart(tmp_path):
    e = Engine(tmp_path / "d", fsync=False)
    e.create_bucket(B)
    for i in range(5):
        e.put_object(B, f"k{i}", f"v{i}".encode())
    e.create_snapshot(B, "s")
    e.put_object(B, "k0", b"overwritten")
    e.delete_object(B, "k1")
    e.put_bucket_lifecycle(B, [LifecycleRule("all", expiration_days=1)])
    e.apply_lifecycle(now=time.time() + 3 * 86400)
    assert e.list_objects(B).objects == []
    e.close()
    e = Engine(tmp_path / "d", fsync=False)
    try:
        assert e.recovered["blobs"] == 0  # the sweep deleted nothing a snapshot names
        assert {k: e.get_object(B, k, snapshot="s") for k in ("k0", "k1", "k4")} == \
            {"k0": b"v0", "k1": b"v1", "k4": b"v4"}
        assert _blob_files(e) == 5
        e.delete_snapshot(B, "s")
        assert _blob_files(e) == 0
    finally:
        e.close()


def test_sweep_keeps_pinned_blobs(tmp_path):
    e = Engine(tmp_path / "d", fsync=False)
    e.create_bucket(B)
    e.put_object(B, "k", b"v1")
    e.create_snapshot(B, "s")
    e.put_object(B, "k", b"v2")
    e.close()
    e = Engine(tmp_path / "d", fsync=False)
    try:
        assert e.recovered["blobs"] == 0
        assert e.get_object(B, "k", snapshot="s") == b"v1" and e.get_object(B, "k") == b"v2"
    finally:
        e.close()


def test_diff_between_snapshots_and_live(eng):
    eng.put_object(B, "same", b"s")
    eng.put_object(B, "chg", b"1")
    eng.put_object(B, "gone", b"g")
    eng.create_snapshot(B, "a")
    eng.put_object(B, "chg", b"2")
    eng.delete_object(B, "gone")
    eng.put_object(B, "new", b"n")
    eng.create_snapshot(B, "b")
    want = SnapshotDiff(added=["new"], changed=["chg"], removed=["gone"])
    assert eng.diff_snapshots(B, "a", "b") == want
    assert eng.diff_snapshots(B, "a") == want
    assert eng.diff_snapshots(B, "b", "a") == SnapshotDiff(["gone"], ["chg"], ["new"])
    assert eng.diff_snapshots(B, "a", prefix="n") == SnapshotDiff(["new"], [], [])
    with pytest.raises(NoSuchSnapshot):
        eng.diff_snapshots(B, "a", "nope")


def test_a_tag_only_change_is_retagged_in_the_diff_and_undone_by_restore(eng):
    eng.put_object(B, "t", b"data")
    eng.put_object_tagging(B, "t", {"a": "1"})
    eng.put_object(B, "u", b"other")
    eng.create_snapshot(B, "s")
    eng.put_object_tagging(B, "t", {"a": "2", "b": "x"})
    assert eng.diff_snapshots(B, "s") == SnapshotDiff([], [], [], retagged=["t"])
    files = _blob_files(eng)
    assert eng.restore_snapshot(B, "s") == RestoreResult(restored=1, deleted=0, unchanged=1)
    assert eng.head_object(B, "t").tags == {"a": "1"}
    assert eng.get_object(B, "t") == b"data" and _blob_files(eng) == files  # no data copied
    assert eng.diff_snapshots(B, "s") == SnapshotDiff([], [], [])


def test_restore_unversioned_bucket(eng):
    eng.put_object(B, "keep", b"k")
    eng.put_object(B, "p/a", b"a1")
    eng.put_object(B, "p/b", b"b1")
    eng.create_snapshot(B, "s")
    eng.put_object(B, "p/a", b"a2")
    eng.delete_object(B, "p/b")
    eng.put_object(B, "p/new", b"n")
    eng.put_object(B, "q", b"q")
    before = _blob_files(eng)
    r = eng.restore_snapshot(B, "s", prefix="p/")
    assert r == RestoreResult(restored=2, deleted=1, unchanged=0)
    assert _live(eng) == {"keep": b"k", "p/a": b"a1", "p/b": b"b1", "q": b"q"}
    assert _blob_files(eng) == before - 2  # a2 and p/new freed; a1, b1 reused, not copied
    assert eng.diff_snapshots(B, "s") == SnapshotDiff(["q"], [], [])
    assert eng.restore_snapshot(B, "s") == RestoreResult(0, 1, 3)
    assert _live(eng) == {"keep": b"k", "p/a": b"a1", "p/b": b"b1"}
    eng.delete_snapshot(B, "s")  # the restored objects keep their data
    assert _live(eng) == {"keep": b"k", "p/a": b"a1", "p/b": b"b1"}
    eng.put_object(B, "p/a", b"a3")  # the last row naming a1 goes: a1 is freed
    assert _blob_files(eng) == 3


def test_restore_versioned_bucket_makes_versions_and_markers(eng):
    eng.put_bucket_versioning(B, "Enabled")
    v1 = eng.put_object(B, "k", b"one")
    eng.create_snapshot(B, "s")
    eng.put_object(B, "k", b"two")
    eng.put_object(B, "extra", b"e")
    r = eng.restore_snapshot(B, "s")
    assert r == RestoreResult(1, 1, 0)
    cur = eng.head_object(B, "k")
    assert cur.version_id not in ("null", v1.version_id) and cur.blob_id == v1.blob_id
    assert eng.get_object(B, "k") == b"one"
    versions = eng.list_object_versions(B).versions
    assert [(v.key, v.delete_marker) for v in versions] == [
        ("extra", True), ("extra", False), ("k", False), ("k", False), ("k", False)]
    # the original version and the restored one share a blob: removing one keeps the data
    eng.delete_object(B, "k", v1.version_id)
    eng.delete_snapshot(B, "s")
    assert eng.get_object(B, "k") == b"one"


def test_restore_refuses_locked_versions_and_changes_nothing(eng):
    eng.create_bucket("locked", object_lock=True)
    eng.put_object("locked", "free", b"f1")
    eng.put_object("locked", "held", b"h1")
    eng.create_snapshot("locked", "s")
    eng.put_object("locked", "free", b"f2")
    eng.put_object("locked", "held", b"h2", retention=Retention("GOVERNANCE", time.time() + 3600))
    state = _live(eng, "locked")
    with pytest.raises(AccessDenied, match="'held'"):
        eng.restore_snapshot("locked", "s")
    assert _live(eng, "locked") == state
    eng.put_object("locked", "new", b"n", retention=Retention("", 0.0, True))  # legal hold
    with pytest.raises(AccessDenied, match="'new'"):
        eng.restore_snapshot("locked", "s", prefix="n")
    assert eng.restore_snapshot("locked", "s", prefix="f") == RestoreResult(1, 0, 0)


def test_snapshot_of_protected_versions_cannot_be_deleted_before_the_lock_ends(eng):
    eng.create_bucket("locked", object_lock=True)
    until = time.time() + 3600
    v = eng.put_object("locked", "k", b"v", retention=Retention("GOVERNANCE", until))
    eng.create_snapshot("locked", "s")
    with pytest.raises(AccessDenied, match="'k'"):
        eng.delete_snapshot("locked", "s")
    eng.delete_snapshot("locked", "s", bypass_governance=True)
    eng.create_snapshot("locked", "t")
    eng.put_object_legal_hold("locked", "k", True, version_id=v.version_id)
    with pytest.raises(AccessDenied):
        eng.delete_snapshot("locked", "t", bypass_governance=True)
    eng.put_object_legal_hold("locked", "k", False, version_id=v.version_id)
    eng.put_object_retention("locked", "k", "GOVERNANCE", time.time() + 1, version_id=v.version_id,
                             bypass_governance=True)
    time.sleep(1.1)
    eng.delete_snapshot("locked", "t")


def test_bucket_with_snapshots_cannot_be_deleted(eng):
    eng.put_object(B, "k", b"v")
    eng.create_snapshot(B, "s")
    eng.delete_object(B, "k")
    with pytest.raises(BucketNotEmpty, match="snapshot"):
        eng.delete_bucket(B)
    eng.delete_snapshot(B, "s")
    eng.delete_bucket(B)
    assert _blob_files(eng) == 0


def test_schedule_makes_and_prunes_automatic_snapshots(eng):
    assert eng.snapshot_schedule(B) == {"hourly": 0, "daily": 0}
    assert eng.set_snapshot_schedule(B, hourly=2, daily=1) == {"hourly": 2, "daily": 1}
    eng.create_snapshot(B, "mine", now=0.0)
    t0 = float(calendar.timegm((2026, 12, 1, 1, 0, 0)))
    for h in range(4):
        eng.put_object(B, "k", f"v{h}".encode())
        eng.run_snapshot_schedules(now=t0 + h * 3600 + 5)
    eng.run_snapshot_schedules(now=t0 + 3 * 3600 + 50)  # same hour: nothing new
    names = [s.name for s in eng.list_snapshots(B)]
    assert names == ["mine", "auto-daily-2026-12-01", "auto-hourly-2026-12-01T03", "auto-hourly-2026-12-01T04"]
    assert eng.get_object(B, "k", snapshot="auto-hourly-2026-12-01T03") == b"v2"
    assert eng.get_object(B, "k", snapshot="auto-daily-2026-12-01") == b"v0"
    eng.set_snapshot_schedule(B)
    assert eng.snapshot_schedule(B) == {"hourly": 0, "daily": 0}
    assert eng.run_snapshot_schedules(now=t0 + 10 * 3600) == []
    with pytest.raises(InvalidArgument):
        eng.set_snapshot_schedule(B, hourly=-1)
    with pytest.raises(NoSuchBucket):
        eng.set_snapshot_schedule("nope-bucket", hourly=1)


@pytest.mark.parametrize("policy", [{"compression": "zstd"}, {"dedup": True, "chunk_bytes": 64 << 10}])
def test_snapshot_pins_chunked_data_across_restart(tmp_path, policy):
    """Compressed and deduplicated data: a snapshot keeps the manifest (and its
    chunks) of what it recorded, through the start-up recovery that frees
    manifests no row names."""
    e = Engine(tmp_path / "d", fsync=False)
    e.create_bucket(B)
    e.set_bucket_data(B, **policy)
    body = b"tokens " * 40_000  # compresses; 280 KB in several 64 KiB chunks
    e.put_object(B, "k", body)
    e.put_object(B, "same", body)  # dedup: the same chunks again
    e.create_snapshot(B, "s")
    e.put_object(B, "k", b"new")
    e.delete_object(B, "same")
    e.close()
    e = Engine(tmp_path / "d", fsync=False)
    try:
        assert e.recovered.get("orphan_manifests", 0) == 0
        assert e.get_object(B, "k", snapshot="s") == body
        assert e.get_object(B, "same", snapshot="s") == body
        assert e.restore_snapshot(B, "s") == RestoreResult(2, 0, 0)
        e.delete_snapshot(B, "s")
        assert e.get_object(B, "k") == body and e.get_object(B, "same") == body
    finally:
        e.close()


def test_a_replication_rules_snapshot_is_deleted_by_its_rule_only(eng):
    """The base a replication rule diffs against is not deleted by hand (the
    next round would miss deletes); the rule's own pruning deletes it."""
    eng.put_object(B, "k", b"v")
    eng.create_snapshot(B, "auto-repl-1", kind="replication")
    with pytest.raises(InvalidRequestError, match="replicate remove"):
        eng.delete_snapshot(B, "auto-repl-1")
    assert [s.name for s in eng.list_snapshots(B)] == ["auto-repl-1"]
    eng.delete_snapshot(B, "auto-repl-1", replication=True)
    assert eng.list_snapshots(B) == []
