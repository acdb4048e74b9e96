"""Engine: object versions, delete markers, object lock and tags, call by call.

Each test follows the S3 semantics cited: "Retaining multiple versions of
objects with S3 Versioning" and "Working with delete markers"
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/Versioning.html),
"Locking objects with Object Lock"
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock.html), and
the API pages of DeleteObject, ListObjectVersions, PutObjectRetention,
PutObjectLegalHold and PutObjectTagging.
"""

from __future__ import annotations

import os
import time

import pytest

from gpufeed.engine import Engine
from gpufeed.engine.types import Retention
from gpufeed.errors import (
    AccessDenied,
    BucketNotEmpty,
    InvalidArgument,
    InvalidBucketState,
    InvalidRequestError,
    InvalidTag,
    MethodNotAllowed,
    NoSuchKey,
    NoSuchObjectLockConfiguration,
    NoSuchVersion,
    ObjectLockConfigurationNotFoundError,
)

B = "bkt"


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync=False)
    e.create_bucket(B)
    yield e
    e.close()


def _listing(e: Engine, bucket: str = B, **kw) -> list[tuple[str, str, bool, bool, int]]:
    return [(v.key, v.version_id, v.is_latest, v.delete_marker, v.size)
            for v in e.list_object_versions(bucket, **kw).versions]


def _blob_files(e: Engine) -> int:
    return sum(len(files) for _, _, files in os.walk(e.data_dir / "blobs"))


def test_never_versioned_bucket_has_null_versions(eng):
    """A bucket never versioned: every object is version null, a put replaces it, a delete removes it."""
    info = eng.put_object(B, "k", b"one")
    assert info.version_id == "null"
    eng.put_object(B, "k", b"two")
    assert _listing(eng) == [("k", "null", True, False, 3)]
    assert eng.get_object(B, "k", version_id="null") == b"two"
    assert _blob_files(eng) == 1
    assert eng.delete_object(B, "k").version_id is None
    assert _listing(eng) == [] and eng.get_bucket_versioning(B) == ""


def test_enabled_keeps_every_version_and_delete_adds_a_marker(eng):
    """Enabled: each put adds a version; a delete without version id adds a delete marker as latest."""
    eng.put_object(B, "k", b"0")  # the null version made before versioning
    eng.put_bucket_versioning(B, "Enabled")
    v1 = eng.put_object(B, "k", b"11")
    v2 = eng.put_object(B, "k", b"222")
    assert len(v1.version_id) == 32 and v1.version_id != v2.version_id
    assert _listing(eng) == [("k", v2.version_id, True, False, 3), ("k", v1.version_id, False, False, 2),
                             ("k", "null", False, False, 1)]
    marker = eng.delete_object(B, "k")
    assert marker.delete_marker and marker.version_id not in (v1.version_id, v2.version_id)
    with pytest.raises(NoSuchKey) as exc:
        eng.head_object(B, "k")
    assert exc.value.details["delete_marker"] is True and exc.value.details["version_id"] == marker.version_id
    assert eng.list_objects(B).objects == []
    for v, data in ((v1, b"11"), (v2, b"222")):
        assert eng.get_object(B, "k", version_id=v.version_id) == data
    assert eng.get_object(B, "k", version_id="null") == b"0"
    with pytest.raises(MethodNotAllowed) as exc:
        eng.head_object(B, "k", marker.version_id)
    assert exc.value.details["delete_marker"] is True
    # Removing the delete marker makes the newest version current again.
    assert eng.delete_object(B, "k", marker.version_id).delete_marker
    assert eng.head_object(B, "k").version_id == v2.version_id
    assert _blob_files(eng) == 3


def test_deleting_the_current_version_promotes_the_next(eng):
    """DeleteObject with the current version id removes it; the newest remaining version becomes current."""
    eng.put_bucket_versioning(B, "Enabled")
    v1 = eng.put_object(B, "k", b"a")
    v2 = eng.put_object(B, "k", b"bb")
    result = eng.delete_object(B, "k", v2.version_id)
    assert (result.version_id, result.delete_marker) == (v2.version_id, False)
    assert eng.head_object(B, "k").version_id == v1.version_id
    assert eng.get_object(B, "k") == b"a"
    eng.delete_object(B, "k", v1.version_id)
    with pytest.raises(NoSuchKey):
        eng.head_object(B, "k")
    assert _listing(eng) == [] and _blob_files(eng) == 0
    eng.delete_bucket(B)  # nothing left, not even a marker


def test_suspended_null_version_replaces_null(eng):
    """Suspended: a put or delete makes version null, replacing the key's null version; others stay."""
    eng.put_bucket_versioning(B, "Enabled")
    v1 = eng.put_object(B, "k", b"v1")
    eng.put_bucket_versioning(B, "Suspended")
    assert eng.put_object(B, "k", b"n1").version_id == "null"
    eng.put_object(B, "k", b"n22")
    assert _listing(eng) == [("k", "null", True, False, 3), ("k", v1.version_id, False, False, 2)]
    marker = eng.delete_object(B, "k")
    assert (marker.version_id, marker.delete_marker) == ("null", True)
    assert _listing(eng) == [("k", "null", True, True, 0), ("k", v1.version_id, False, False, 2)]
    assert _blob_files(eng) == 1
    eng.put_object(B, "k", b"n3")  # replaces the null delete marker
    assert _listing(eng) == [("k", "null", True, False, 2), ("k", v1.version_id, False, False, 2)]


def test_versions_survive_a_restart(tmp_path):
    """Noncurrent versions are live data: the start-up sweep keeps their files."""
    e = Engine(tmp_path / "d", fsync=False)
    e.create_bucket(B)
    e.put_bucket_versioning(B, "Enabled")
    v1 = e.put_object(B, "k", b"first")
    e.put_object(B, "k", b"second")
    e.delete_object(B, "k")
    e.close()
    e = Engine(tmp_path / "d", fsync=False)
    try:
        assert e.recovered["blobs"] == 0
        assert e.get_object(B, "k", version_id=v1.version_id) == b"first"
        assert [v.delete_marker for v in e.list_object_versions(B).versions] == [True, False, False]
    finally:
        e.close()


def test_version_ids_are_checked(eng):
    """A malformed version id is InvalidArgument; a well-formed unknown one is NoSuchVersion (404)."""
    eng.put_object(B, "k", b"x")
    for bad in ("", "NULL", "1234", "z" * 32, "A" * 32):
        with pytest.raises(InvalidArgument, match="Invalid version id"):
            eng.head_object(B, "k", bad)
    with pytest.raises(NoSuchVersion):
        eng.head_object(B, "k", "0" * 32)
    assert eng.delete_object(B, "k", "0" * 32).delete_marker is False  # S3: 204, nothing removed
    assert eng.get_object(B, "k") == b"x"


def test_list_versions_pages_and_delimiter(eng):
    """ListObjectVersions pages by (key, version) markers and rolls keys up under a delimiter."""
    eng.put_bucket_versioning(B, "Enabled")
    for key in ("a", "b/1", "b/2", "c"):
        for i in range(3):
            eng.put_object(B, key, bytes(i))
    eng.delete_object(B, "c")
    full = _listing(eng)
    assert len(full) == 13 and [k for k, *_ in full] == sorted(k for k, *_ in full)
    for size in (1, 2, 5):
        got, km, vm = [], "", ""
        while True:
            page = eng.list_object_versions(B, max_keys=size, key_marker=km, version_id_marker=vm)
            got += [(v.key, v.version_id, v.is_latest, v.delete_marker, v.size) for v in page.versions]
            if not page.is_truncated:
                break
            km, vm = page.next_key_marker, page.next_version_id_marker
        assert got == full
    page = eng.list_object_versions(B, delimiter="/")
    assert page.common_prefixes == ["b/"] and {v.key for v in page.versions} == {"a", "c"}
    page = eng.list_object_versions(B, delimiter="/", max_keys=4)
    assert len(page.versions) + len(page.common_prefixes) == 4 and page.is_truncated
    assert _listing(eng, prefix="b/", key_marker="b/1") == [e for e in full if e[0] == "b/2"]
    with pytest.raises(InvalidArgument):
        eng.list_object_versions(B, version_id_marker="0" * 32)


def test_bucket_with_versions_or_markers_is_not_empty(eng):
    """A bucket holding only noncurrent versions or delete markers cannot be deleted."""
    eng.put_bucket_versioning(B, "Enabled")
    v = eng.put_object(B, "k", b"x")
    eng.delete_object(B, "k")
    assert eng.list_objects(B).objects == []
    with pytest.raises(BucketNotEmpty):
        eng.delete_bucket(B)
    eng.delete_object(B, "k", v.version_id)
    with pytest.raises(BucketNotEmpty):
        eng.delete_bucket(B)  # the delete marker remains


def test_versioning_is_refused_for_kv_buckets(eng):
    eng.create_bucket("cache", kind="kv", capacity_bytes=1 << 20)
    with pytest.raises(InvalidArgument):
        eng.put_bucket_versioning("cache", "Enabled")
    with pytest.raises(InvalidArgument):
        eng.put_bucket_versioning(B, "enabled")


def test_copy_of_a_version_and_multipart_get_version_ids(eng):
    """CopyObject copies a named source version; a multipart completion makes a new version."""
    eng.put_bucket_versioning(B, "Enabled")
    v1 = eng.put_object(B, "src", b"old", tags={"t": "1"})
    eng.put_object(B, "src", b"new")
    copy = eng.copy_object(B, "src", B, "dst", src_version_id=v1.version_id)
    assert eng.get_object(B, "dst") == b"old" and copy.version_id != "null" and copy.tags == {"t": "1"}
    up = eng.create_multipart_upload(B, "mp", tags={"m": "p"})
    part = eng.upload_part(B, "mp", up.upload_id, 1, b"data")
    done = eng.complete_multipart_upload(B, "mp", up.upload_id, [(1, part.etag)])
    assert len(done.version_id) == 32 and eng.head_object(B, "mp").tags == {"m": "p"}


# -- object lock ---------------------------------------------------------------------

@pytest.fixture
def locked(eng):
    eng.create_bucket("lck", object_lock=True)
    return "lck"


def test_lock_bucket_is_versioned_for_good(eng, locked):
    """A bucket made with object lock has versioning Enabled and cannot suspend it."""
    assert eng.get_bucket_versioning(locked) == "Enabled"
    with pytest.raises(InvalidBucketState):
        eng.put_bucket_versioning(locked, "Suspended")
    with pytest.raises(ObjectLockConfigurationNotFoundError):
        eng.get_object_lock_configuration(B)
    with pytest.raises(InvalidBucketState):
        eng.put_object_lock_configuration(B, "GOVERNANCE", days=1)  # not versioned
    eng.put_object_lock_configuration(locked, "COMPLIANCE", years=1)
    b = eng.get_object_lock_configuration(locked)
    assert (b.lock_mode, b.lock_days, b.lock_years) == ("COMPLIANCE", 0, 1)
    for bad in ({"mode": "WORM", "days": 1}, {"mode": "GOVERNANCE"}, {"mode": "GOVERNANCE", "days": 1, "years": 1},
                {"mode": "GOVERNANCE", "days": -1}, {"days": 3}):
        with pytest.raises(InvalidArgument):
            eng.put_object_lock_configuration(locked, **bad)


def test_governance_retention_blocks_delete_unless_bypassed(eng, locked):
    """GOVERNANCE: a version cannot be removed until its date, except with bypass; a delete marker is fine."""
    eng.put_object_lock_configuration(locked, "GOVERNANCE", days=1)
    v = eng.put_object(locked, "k", b"keep")
    assert v.lock_mode == "GOVERNANCE" and 86000 < v.lock_until - time.time() <= 86400
    with pytest.raises(AccessDenied):
        eng.delete_object(locked, "k", v.version_id)
    marker = eng.delete_object(locked, "k")  # allowed: no data goes
    assert marker.delete_marker
    assert eng.get_object(locked, "k", version_id=v.version_id) == b"keep"
    with pytest.raises(AccessDenied):  # shortening needs bypass
        eng.put_object_retention(locked, "k", "GOVERNANCE", time.time() + 60, version_id=v.version_id)
    eng.put_object_retention(locked, "k", "GOVERNANCE", time.time() + 60, version_id=v.version_id,
                             bypass_governance=True)
    assert eng.delete_object(locked, "k", v.version_id, bypass_governance=True).version_id == v.version_id
    with pytest.raises(NoSuchVersion):
        eng.head_object(locked, "k", v.version_id)


def test_compliance_retention_can_only_be_extended(eng, locked):
    """COMPLIANCE: no bypass; the date can move later, never earlier; the mode cannot change."""
    until = time.time() + 3600
    v = eng.put_object(locked, "k", b"x", retention=Retention("COMPLIANCE", until))
    for mode, when in (("COMPLIANCE", until - 10), ("GOVERNANCE", until + 10), ("", 0.0)):
        with pytest.raises(AccessDenied):
            eng.put_object_retention(locked, "k", mode, when, version_id=v.version_id, bypass_governance=True)
    with pytest.raises(AccessDenied):
        eng.delete_object(locked, "k", v.version_id, bypass_governance=True)
    later = eng.put_object_retention(locked, "k", "COMPLIANCE", until + 100)
    assert later.lock_until == until + 100
    assert eng.get_object_retention(locked, "k").lock_until == until + 100
    with pytest.raises(InvalidArgument, match="future"):
        eng.put_object_retention(locked, "k", "COMPLIANCE", time.time() - 1)


def test_legal_hold_blocks_delete_until_removed(eng, locked):
    """A legal hold protects a version whatever its retention; taking it off releases it."""
    v = eng.put_object(locked, "k", b"x", retention=Retention(legal_hold=True))
    assert v.legal_hold and eng.get_object_legal_hold(locked, "k")
    with pytest.raises(AccessDenied):
        eng.delete_object(locked, "k", v.version_id, bypass_governance=True)
    with pytest.raises(NoSuchObjectLockConfiguration):
        eng.get_object_retention(locked, "k")
    eng.put_object_legal_hold(locked, "k", False)
    eng.delete_object(locked, "k", v.version_id)
    with pytest.raises(NoSuchKey):
        eng.head_object(locked, "k")


def test_lock_settings_need_a_lock_bucket(eng):
    """Retention or legal hold on a bucket without object lock is InvalidRequest; nothing is written."""
    for r in (Retention("GOVERNANCE", time.time() + 60), Retention(legal_hold=True)):
        with pytest.raises(InvalidRequestError, match="Object Lock"):
            eng.put_object(B, "k", b"x", retention=r)
        with pytest.raises(InvalidRequestError, match="Object Lock"):
            eng.create_multipart_upload(B, "k", retention=r)
    eng.put_object(B, "k", b"x")
    with pytest.raises(InvalidRequestError, match="Object Lock"):
        eng.put_object_legal_hold(B, "k", True)
    with pytest.raises(InvalidRequestError, match="Object Lock"):
        eng.get_object_retention(B, "k")
    assert _listing(eng) == [("k", "null", True, False, 1)] and eng.list_multipart_uploads(B) == []


def test_retention_in_the_past_is_refused(eng, locked):
    with pytest.raises(InvalidArgument, match="future"):
        eng.put_object(locked, "k", b"x", retention=Retention("GOVERNANCE", time.time() - 5))
    with pytest.raises(InvalidArgument):
        eng.put_object(locked, "k", b"x", retention=Retention("FOREVER", time.time() + 5))
    assert _listing(eng, locked) == []


# -- tags ----------------------------------------------------------------------------

def test_tags_per_version_and_limits(eng):
    """Tags belong to a version; PutObjectTagging replaces the set; S3's limits are InvalidTag."""
    eng.put_bucket_versioning(B, "Enabled")
    v1 = eng.put_object(B, "k", b"1", tags={"a": "1"})
    eng.put_object(B, "k", b"2")
    assert eng.head_object(B, "k", v1.version_id).tags == {"a": "1"} and eng.head_object(B, "k").tags == {}
    eng.put_object_tagging(B, "k", {"x": "y z", "k2": ""})
    assert eng.head_object(B, "k").tags == {"x": "y z", "k2": ""}
    eng.put_object_tagging(B, "k", {}, version_id=v1.version_id)
    assert eng.head_object(B, "k", v1.version_id).tags == {}
    for bad in ({f"k{i}": "v" for i in range(11)}, {"k" * 129: "v"}, {"k": "v" * 257}, {"aws:x": "v"},
                {"": "v"}, {"bad*char": "v"}):
        with pytest.raises(InvalidTag):
            eng.put_object_tagging(B, "k", bad)
        with pytest.raises(InvalidTag):
            eng.put_object(B, "other", b"x", tags=bad)
    assert eng.head_object(B, "k").tags == {"x": "y z", "k2": ""}
    with pytest.raises(NoSuchKey):
        eng.head_object(B, "other")
