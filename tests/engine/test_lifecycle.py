"""Bucket lifecycle rules in the engine: configuration and one pass at a chosen ``now``.

Source: "Lifecycle configuration elements", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html
(Days: "adding the number of days specified in the rule to the object creation
time and rounding the resulting time to the next day midnight UTC").
"""

from __future__ import annotations

import os
import types

import pytest

from gpufeed.engine import Engine, LifecycleResult, LifecycleRule, _lifecycle, _multipart, _versioning, _writes
from gpufeed.engine._lifecycle import DAY_S, due_time
from gpufeed.engine.types import Retention
from gpufeed.errors import (
    InvalidArgument,
    InvalidRequestError,
    MalformedXML,
    NoSuchBucket,
    NoSuchKey,
    NoSuchLifecycleConfiguration,
)

MIDNIGHT_2030 = 1893456000.0  # 2030-01-01T00:00:00Z


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync=False)
    e.create_bucket("bkt")
    yield e
    e.close()


def _blob_files(eng: Engine) -> int:
    return sum(len(files) for _, _, files in os.walk(eng.data_dir / "blobs"))


def test_due_time_rounds_up_to_midnight_utc():
    t = 1389781800.0  # 2014-01-15T10:30:00Z, the S3 guide's example
    assert due_time(t, 3) == 1390089600.0  # 2014-01-19T00:00:00Z
    assert due_time(MIDNIGHT_2030, 1) == MIDNIGHT_2030 + DAY_S


def test_configuration_round_trip(eng):
    """PutBucketLifecycleConfiguration replaces the whole configuration;
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketLifecycleConfiguration.html"""
    with pytest.raises(NoSuchLifecycleConfiguration):
        eng.get_bucket_lifecycle("bkt")
    rules = [LifecycleRule("a", prefix="logs/", expiration_days=30),
             LifecycleRule("b", enabled=False, abort_days=2)]
    eng.put_bucket_lifecycle("bkt", rules)
    assert eng.get_bucket_lifecycle("bkt") == rules
    eng.put_bucket_lifecycle("bkt", rules[1:])
    assert eng.get_bucket_lifecycle("bkt") == rules[1:]
    eng.delete_bucket_lifecycle("bkt")
    eng.delete_bucket_lifecycle("bkt")  # none is fine
    with pytest.raises(NoSuchLifecycleConfiguration):
        eng.get_bucket_lifecycle("bkt")
    for call in (eng.get_bucket_lifecycle, eng.delete_bucket_lifecycle):
        with pytest.raises(NoSuchBucket):
            call("nope")
    with pytest.raises(NoSuchBucket):
        eng.put_bucket_lifecycle("nope", rules)


def test_deleted_bucket_forgets_its_rules(eng):
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("a", expiration_days=1)])
    eng.delete_bucket("bkt")
    eng.create_bucket("bkt")
    with pytest.raises(NoSuchLifecycleConfiguration):
        eng.get_bucket_lifecycle("bkt")


@pytest.mark.parametrize("rules, error", [
    ([], InvalidArgument),
    ([LifecycleRule("a")], InvalidRequestError),  # no action
    ([LifecycleRule("a", expiration_days=0)], InvalidArgument),
    ([LifecycleRule("a", expiration_days=-1)], InvalidArgument),
    ([LifecycleRule("a", abort_days=0)], InvalidArgument),
    ([LifecycleRule("a", expiration_days=1, expiration_date=MIDNIGHT_2030)], InvalidRequestError),
    ([LifecycleRule("a", expiration_date=MIDNIGHT_2030 + 1)], InvalidArgument),  # not midnight
    ([LifecycleRule("", expiration_days=1)], InvalidArgument),
    ([LifecycleRule("x" * 256, expiration_days=1)], InvalidArgument),
    ([LifecycleRule("a", expiration_days=1), LifecycleRule("a", abort_days=1)], InvalidArgument),
    ([LifecycleRule(str(i), expiration_days=1) for i in range(1001)], InvalidArgument),
])
def test_invalid_rules_are_refused_and_change_nothing(eng, rules, error):
    keep = [LifecycleRule("keep", abort_days=9)]
    eng.put_bucket_lifecycle("bkt", keep)
    with pytest.raises(error):
        eng.put_bucket_lifecycle("bkt", rules)
    assert eng.get_bucket_lifecycle("bkt") == keep


def test_expiration_days_by_prefix_at_a_fake_now(eng):
    old = eng.put_object("bkt", "logs/a", b"1")
    eng.put_object("bkt", "logs/b", b"22")
    eng.put_object("bkt", "keep/c", b"333")
    eng.put_object("bkt", "logsX", b"4")  # starts with "logs" but not "logs/"
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("r", prefix="logs/", expiration_days=3)])
    due = due_time(old.last_modified, 3)
    assert eng.apply_lifecycle(now=due - 1) == LifecycleResult(0, 0)
    assert _blob_files(eng) == 4
    assert eng.apply_lifecycle(now=due + 10) == LifecycleResult(expired_objects=2)
    assert [o.key for o in eng.list_objects("bkt").objects] == ["keep/c", "logsX"]
    assert _blob_files(eng) == 2  # the expired versions' space is returned
    assert eng.apply_lifecycle(now=due + 10) == LifecycleResult(0, 0)


def test_expiration_date_and_disabled_rules(eng):
    for k in ("a", "b/c"):
        eng.put_object("bkt", k, b"x")
    eng.create_bucket("other")
    eng.put_object("other", "a", b"x")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("on", expiration_date=MIDNIGHT_2030)])
    eng.put_bucket_lifecycle("other", [LifecycleRule("off", enabled=False, expiration_days=1)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030 - 1).expired_objects == 0
    assert eng.apply_lifecycle(now=MIDNIGHT_2030).expired_objects == 2
    assert eng.list_objects("bkt").objects == []
    assert [o.key for o in eng.list_objects("other").objects] == ["a"]  # Disabled: kept


def test_expiration_pages_through_many_keys(eng, monkeypatch):
    monkeypatch.setattr(_lifecycle, "_BATCH", 3)
    for i in range(10):
        eng.put_object("bkt", f"k{i:02d}", b"x")
    eng.put_object("bkt", "zz", b"x")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("r", prefix="k", expiration_date=MIDNIGHT_2030)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030).expired_objects == 10
    assert [o.key for o in eng.list_objects("bkt").objects] == ["zz"]


def test_expiration_spares_a_version_written_meanwhile(eng):
    first = eng.put_object("bkt", "k", b"old")
    eng.put_object("bkt", "k", b"new")
    # what a pass that read the first version would then delete
    assert eng._lifecycle._delete_objects("bkt", [("k", first.blob_id)]) == 0
    assert eng.get_object("bkt", "k") == b"new"


def test_expiration_in_kv_bucket_keeps_its_accounting(eng):
    eng.create_bucket("cache", kind="kv", capacity_bytes=1 << 20)
    eng.put_object("cache", "a", b"12345")
    eng.put_object("cache", "b", b"678")
    eng.put_bucket_lifecycle("cache", [LifecycleRule("r", prefix="a", expiration_date=MIDNIGHT_2030)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030).expired_objects == 1
    stats = eng.bucket_stats("cache")
    assert (stats["bytes"], stats["objects"]) == (3, 1)


def test_abort_incomplete_uploads_by_rule(eng):
    """AbortIncompleteMultipartUpload counts DaysAfterInitiation from the upload's start;
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_AbortIncompleteMultipartUpload.html"""
    a = eng.create_multipart_upload("bkt", "tmp/a")
    eng.upload_part("bkt", "tmp/a", a.upload_id, 1, b"p" * 10)
    b = eng.create_multipart_upload("bkt", "data/b")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("r", prefix="tmp/", abort_days=1)])
    due = due_time(a.initiated, 1)
    assert eng.apply_lifecycle(now=due - 1).aborted_uploads == 0
    assert eng.apply_lifecycle(now=due).aborted_uploads == 1
    assert [u.upload_id for u in eng.list_multipart_uploads("bkt")] == [b.upload_id]
    assert sorted(os.listdir(eng.data_dir / "uploads")) == [b.upload_id]  # part files gone


def test_idle_uploads_default(eng, monkeypatch):
    """The node-wide default: an upload nobody touched for ``idle_upload_s`` is aborted,
    counted from its last part (a busy upload is not), with no rule set."""
    clock = [1_000_000.0]
    monkeypatch.setattr(_multipart, "time", types.SimpleNamespace(time=lambda: clock[0]))
    eng.create_multipart_upload("bkt", "quiet")
    busy = eng.create_multipart_upload("bkt", "busy")
    clock[0] += 3 * DAY_S
    eng.upload_part("bkt", "busy", busy.upload_id, 1, b"p")
    idle, t0 = 7 * DAY_S, 1_000_000.0
    assert eng.apply_lifecycle(now=t0 + idle, idle_upload_s=idle).aborted_uploads == 0  # strictly older
    assert eng.apply_lifecycle(now=t0 + idle + 1, idle_upload_s=0).aborted_uploads == 0  # 0: never
    assert eng.apply_lifecycle(now=t0 + idle + 1, idle_upload_s=idle).aborted_uploads == 1
    assert [u.key for u in eng.list_multipart_uploads("bkt")] == ["busy"]  # its part is 3 days younger
    assert eng.apply_lifecycle(now=t0 + 3 * DAY_S + idle + 1, idle_upload_s=idle).aborted_uploads == 1
    assert eng.list_multipart_uploads("bkt") == []
    assert os.listdir(eng.data_dir / "uploads") == []


# -- versioned buckets -----------------------------------------------------------------------

@pytest.fixture
def clock(monkeypatch):
    """A settable clock for the times new versions, delete markers and retention get (Unix s)."""
    now = [MIDNIGHT_2030 + 10 * 3600]  # 2030-01-01T10:00:00Z
    fake = types.SimpleNamespace(time=lambda: now[0])
    monkeypatch.setattr(_writes, "time", fake)
    monkeypatch.setattr(_versioning, "time", fake)
    return now


def _versions(eng: Engine, bucket: str = "bkt", prefix: str = "") -> list[tuple[str, str, bool, bool]]:
    """``(key, version_id, delete_marker, is_latest)`` of every version, as ListObjectVersions lists them."""
    return [(v.key, v.version_id, v.delete_marker, v.is_latest)
            for v in eng.list_object_versions(bucket, prefix=prefix).versions]


def test_expiration_in_versioned_bucket_adds_a_delete_marker(eng):
    """In a versioning-enabled bucket, Expiration of a current version adds a delete marker
    (as DeleteObject without a version id does) and removes no data;
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html#intro-lifecycle-rules-actions"""
    eng.put_bucket_versioning("bkt", "Enabled")
    v1 = eng.put_object("bkt", "logs/a", b"old")
    v2 = eng.put_object("bkt", "logs/a", b"new")
    eng.put_object("bkt", "keep", b"x")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("r", prefix="logs/", expiration_days=1)])
    due = due_time(v2.last_modified, 1)
    assert eng.apply_lifecycle(now=due - 1) == LifecycleResult()
    files = _blob_files(eng)
    assert eng.apply_lifecycle(now=due) == LifecycleResult(expired_objects=1)
    assert _blob_files(eng) == files  # no data removed
    (marker, k2, k1) = eng.list_object_versions("bkt", prefix="logs/").versions
    assert (marker.delete_marker, marker.is_latest, marker.last_modified) == (True, True, due)
    assert [(k2.version_id, k2.is_latest), (k1.version_id, k1.is_latest)] == [
        (v2.version_id, False), (v1.version_id, False)]
    with pytest.raises(NoSuchKey) as ei:
        eng.head_object("bkt", "logs/a")
    assert ei.value.details["delete_marker"] is True
    assert eng.get_object("bkt", "logs/a", version_id=v2.version_id) == b"new"
    assert eng.head_object("bkt", "keep").key == "keep"
    # the latest is a delete marker now: nothing current to expire, no second marker
    assert eng.apply_lifecycle(now=due + 5 * DAY_S).expired_objects == 0
    assert len(_versions(eng, prefix="logs/")) == 3


def test_expiration_in_suspended_bucket_replaces_the_null_version(eng):
    """Versioning suspended: the delete marker lifecycle adds is version ``null`` and replaces
    the key's ``null`` version (its data goes); older versions stay.
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-and-other-bucket-config.html"""
    eng.put_bucket_versioning("bkt", "Enabled")
    v1 = eng.put_object("bkt", "k", b"v1")
    eng.put_bucket_versioning("bkt", "Suspended")
    v2 = eng.put_object("bkt", "k", b"v2")
    assert v2.version_id == "null"
    files = _blob_files(eng)
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("r", expiration_date=MIDNIGHT_2030)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030).expired_objects == 1
    assert _versions(eng) == [("k", "null", True, True), ("k", v1.version_id, False, False)]
    assert _blob_files(eng) == files - 1


def test_versioned_expiration_spares_a_version_written_meanwhile(eng):
    eng.put_bucket_versioning("bkt", "Enabled")
    first = eng.put_object("bkt", "k", b"old")
    eng.put_object("bkt", "k", b"new")
    assert eng._lifecycle._delete_objects("bkt", [("k", first.blob_id)]) == 0
    assert eng.get_object("bkt", "k") == b"new"
    assert [dm for _, _, dm, _ in _versions(eng)] == [False, False]  # no delete marker added


def test_noncurrent_days_count_from_the_successor(eng, clock):
    """NoncurrentDays counts from when the version became noncurrent, i.e. when its successor was
    made, rounded up to midnight UTC; the versions go for good (their data too).
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html#non-current-days-calculations"""
    eng.put_bucket_versioning("bkt", "Enabled")
    t0 = clock[0]
    v1 = eng.put_object("bkt", "k", b"1")
    clock[0] = t0 + 2 * DAY_S
    v2 = eng.put_object("bkt", "k", b"22")
    clock[0] = t0 + 5 * DAY_S
    v3 = eng.put_object("bkt", "k", b"333")
    eng.put_object("bkt", "other/k", b"x")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("nc", prefix="k", noncurrent_days=3)])
    due1 = due_time(v2.last_modified, 3)  # v1 became noncurrent when v2 was made
    due2 = due_time(v3.last_modified, 3)
    assert due_time(v1.last_modified, 3) < due1 - 1  # counted from v1's own time, it would be due
    assert eng.apply_lifecycle(now=due1 - 1) == LifecycleResult()
    files = _blob_files(eng)
    assert eng.apply_lifecycle(now=due1) == LifecycleResult(noncurrent_expired=1)
    assert [vid for _, vid, _, _ in _versions(eng, prefix="k")] == [v3.version_id, v2.version_id]
    assert _blob_files(eng) == files - 1
    assert eng.apply_lifecycle(now=due2 - 1) == LifecycleResult()
    assert eng.apply_lifecycle(now=due2) == LifecycleResult(noncurrent_expired=1)
    assert _versions(eng, prefix="k") == [("k", v3.version_id, False, True)]
    assert eng.get_object("bkt", "k") == b"333"
    assert eng.apply_lifecycle(now=due2 + 100 * DAY_S) == LifecycleResult()  # the current one stays


def test_noncurrent_delete_markers_expire_like_versions(eng, clock):
    """A delete marker that is no longer latest is a noncurrent version too."""
    eng.put_bucket_versioning("bkt", "Enabled")
    v1 = eng.put_object("bkt", "k", b"1")
    clock[0] += DAY_S
    marker = eng.delete_object("bkt", "k")
    clock[0] += DAY_S
    v3 = eng.put_object("bkt", "k", b"3")
    assert _versions(eng) == [("k", v3.version_id, False, True), ("k", marker.version_id, True, False),
                              ("k", v1.version_id, False, False)]
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("nc", noncurrent_days=1)])
    assert eng.apply_lifecycle(now=due_time(v3.last_modified, 1)).noncurrent_expired == 2
    assert _versions(eng) == [("k", v3.version_id, False, True)]


def test_newer_noncurrent_versions_are_kept(eng, clock):
    """NewerNoncurrentVersions: that many newest noncurrent versions stay, whatever their age;
    older ones go once NoncurrentDays have passed.
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_NoncurrentVersionExpiration.html"""
    eng.put_bucket_versioning("bkt", "Enabled")
    made = []
    for i in range(5):
        made.append(eng.put_object("bkt", "k", str(i).encode()))
        clock[0] += DAY_S
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("nc", noncurrent_days=1, newer_noncurrent=2)])
    # made[0] became noncurrent when made[1] was made, made[1] a day later: only made[0] is due
    assert eng.apply_lifecycle(now=due_time(made[1].last_modified, 1)).noncurrent_expired == 1
    assert eng.apply_lifecycle(now=clock[0] + 30 * DAY_S) == LifecycleResult(noncurrent_expired=1)
    assert [vid for _, vid, _, _ in _versions(eng)] == [m.version_id for m in reversed(made[2:])]
    assert eng.apply_lifecycle(now=clock[0] + 60 * DAY_S) == LifecycleResult()


def test_noncurrent_expiration_never_removes_locked_versions(eng, clock):
    """A noncurrent version under retention or legal hold is kept (and counted) until its
    protection ends; https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock.html"""
    eng.create_bucket("worm", object_lock=True)
    t0 = clock[0]
    held = eng.put_object("worm", "k", b"held", retention=Retention(legal_hold=True))
    kept = eng.put_object("worm", "k", b"kept", retention=Retention("GOVERNANCE", t0 + 10 * DAY_S))
    free = eng.put_object("worm", "k", b"free")
    eng.put_object("worm", "k", b"current")
    eng.put_bucket_lifecycle("worm", [LifecycleRule("nc", noncurrent_days=1)])
    after = due_time(t0, 1)
    assert eng.apply_lifecycle(now=after) == LifecycleResult(noncurrent_expired=1, locked_skipped=2)
    left = [vid for _, vid, _, _ in _versions(eng, "worm")]
    assert free.version_id not in left and {held.version_id, kept.version_id} <= set(left)
    assert eng.apply_lifecycle(now=t0 + 10 * DAY_S + 1) == LifecycleResult(noncurrent_expired=1,
                                                                         locked_skipped=1)
    eng.put_object_legal_hold("worm", "k", False, version_id=held.version_id)
    assert eng.apply_lifecycle(now=t0 + 11 * DAY_S) == LifecycleResult(noncurrent_expired=1)
    assert len(_versions(eng, "worm")) == 1


def test_expired_object_delete_marker_is_removed(eng):
    """ExpiredObjectDeleteMarker: a delete marker with no other version left goes; one with
    versions behind it stays. https://docs.aws.amazon.com/AmazonS3/latest/userguide/ManagingDelMarkers.html"""
    eng.put_bucket_versioning("bkt", "Enabled")
    alone = eng.put_object("bkt", "alone", b"x")
    eng.delete_object("bkt", "alone")
    eng.delete_object("bkt", "alone", alone.version_id)  # only the marker is left
    eng.put_object("bkt", "backed", b"x")
    eng.delete_object("bkt", "backed")  # a marker with a noncurrent version behind it
    eng.delete_object("bkt", "never-was")  # a marker for a key with no version at all
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("dm", expired_object_delete_marker=True)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030) == LifecycleResult(delete_markers_removed=2)
    assert [(k, dm) for k, _, dm, _ in _versions(eng)] == [("backed", True), ("backed", False)]


def test_noncurrent_and_marker_cleanup_in_one_pass(eng, clock):
    """The usual "empty the bucket" pair: Expiration, NoncurrentVersionExpiration, then the lone
    delete markers go. https://repost.aws/knowledge-center/s3-empty-bucket-lifecycle-rule"""
    eng.put_bucket_versioning("bkt", "Enabled")
    v = eng.put_object("bkt", "k", b"x")
    eng.put_bucket_lifecycle("bkt", [
        LifecycleRule("cur", expiration_days=1),
        LifecycleRule("nc", noncurrent_days=1),
        LifecycleRule("dm", expired_object_delete_marker=True),
    ])
    made = due_time(v.last_modified, 1)
    assert eng.apply_lifecycle(now=made) == LifecycleResult(expired_objects=1)
    assert eng.apply_lifecycle(now=due_time(made, 1)) == LifecycleResult(noncurrent_expired=1,
                                                                         delete_markers_removed=1)
    assert _versions(eng) == []
    assert _blob_files(eng) == 0


def test_expiration_days_removes_old_lone_delete_markers(eng, clock):
    """With Expiration Days, S3 also removes a lone delete marker once it is Days old
    (no ExpiredObjectDeleteMarker in that rule); a Date rule does not.
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html#intro-lifecycle-rules-actions"""
    eng.put_bucket_versioning("bkt", "Enabled")
    marker = eng.delete_object("bkt", "k")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("r", expiration_days=2)])
    made = eng.list_object_versions("bkt").versions[0].last_modified
    assert eng.apply_lifecycle(now=due_time(made, 2) - 1) == LifecycleResult()
    assert eng.apply_lifecycle(now=due_time(made, 2)) == LifecycleResult(delete_markers_removed=1)
    assert _versions(eng) == [] and marker.delete_marker
    eng.delete_object("bkt", "k")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("r", expiration_date=MIDNIGHT_2030)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030 + 9 * DAY_S) == LifecycleResult()


def test_version_pass_pages_through_many_keys(eng, monkeypatch):
    monkeypatch.setattr(_lifecycle, "_BATCH", 3)
    eng.put_bucket_versioning("bkt", "Enabled")
    for i in range(7):
        for _ in range(2 + i % 3):  # 1 to 3 noncurrent versions per key
            eng.put_object("bkt", f"k{i}", b"x")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("nc", noncurrent_days=1)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030 + 400 * DAY_S).noncurrent_expired == sum(
        1 + i % 3 for i in range(7))
    assert len(_versions(eng)) == 7


def test_marker_pass_pages_through_many_keys(eng, monkeypatch):
    monkeypatch.setattr(_lifecycle, "_BATCH", 2)
    eng.put_bucket_versioning("bkt", "Enabled")
    for i in range(6):
        if i % 2:
            eng.put_object("bkt", f"k{i}", b"x")  # a version behind the marker: kept
        eng.delete_object("bkt", f"k{i}")
    eng.put_bucket_lifecycle("bkt", [LifecycleRule("dm", expired_object_delete_marker=True)])
    assert eng.apply_lifecycle(now=MIDNIGHT_2030).delete_markers_removed == 3
    assert sorted({k for k, _, _, _ in _versions(eng)}) == ["k1", "k3", "k5"]


def test_new_rule_fields_round_trip_and_survive_a_restart(tmp_path):
    rules = [LifecycleRule("nc", prefix="a/", noncurrent_days=3, newer_noncurrent=5),
             LifecycleRule("dm", expired_object_delete_marker=True),
             LifecycleRule("off", expired_object_delete_marker=False, abort_days=1)]
    e = Engine(tmp_path / "data", fsync=False)
    e.create_bucket("bkt")
    e.put_bucket_lifecycle("bkt", rules)
    assert e.get_bucket_lifecycle("bkt") == rules
    e.close()
    e = Engine(tmp_path / "data", fsync=False)
    assert e.get_bucket_lifecycle("bkt") == rules
    e.close()


@pytest.mark.parametrize("rule, error", [
    (LifecycleRule("a", expiration_days=1, expired_object_delete_marker=True), MalformedXML),
    (LifecycleRule("a", expiration_date=MIDNIGHT_2030, expired_object_delete_marker=False), MalformedXML),
    (LifecycleRule("a", noncurrent_days=0), InvalidArgument),
    (LifecycleRule("a", newer_noncurrent=2), InvalidArgument),  # NoncurrentDays is required
    (LifecycleRule("a", noncurrent_days=1, newer_noncurrent=0), InvalidArgument),
    (LifecycleRule("a", noncurrent_days=1, newer_noncurrent=101), InvalidArgument),
    (LifecycleRule("a", expired_object_delete_marker=1), InvalidArgument),  # type: ignore[arg-type]
])
def test_invalid_version_rules_are_refused(eng, rule, error):
    """https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleExpiration.html,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_NoncurrentVersionExpiration.html"""
    with pytest.raises(error):
        eng.put_bucket_lifecycle("bkt", [rule])
    with pytest.raises(NoSuchLifecycleConfiguration):
        eng.get_bucket_lifecycle("bkt")
