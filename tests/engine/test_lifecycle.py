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

from gpufeed.engine import Engine, LifecycleResult, LifecycleRule, _lifecycle, _multipart
from gpufeed.engine._lifecycle import DAY_S, due_time
from gpufeed.errors import (
    InvalidArgument,
    InvalidRequestError,
    NoSuchBucket,
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
