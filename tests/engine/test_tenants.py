"""Engine: tenants, access keys and their sealed secrets, bucket ownership."""

from __future__ import annotations

import base64
import os

import pytest

from gpufeed.config import NodeConfig, master_key_from_text
from gpufeed.engine import Engine
from gpufeed.errors import (
    BucketAlreadyExists,
    BucketAlreadyOwnedByYou,
    InternalError,
    InvalidArgument,
    InvalidTenantName,
    NoSuchAccessKey,
    NoSuchTenant,
    QuotaExceeded,
    TenantAlreadyExists,
    TenantNotEmpty,
)


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "d", fsync=False)
    yield e
    e.close()


def test_keys_resolve_to_their_tenant_until_revoked(eng):
    eng.create_tenant("alice")
    info, secret = eng.create_access_key("alice")
    assert info.access_key.startswith("GF") and len(info.access_key) == 20 and len(secret) >= 40
    assert eng.lookup_access_key(info.access_key) == ("alice", secret)
    assert eng.lookup_access_key("GFNOSUCHKEY000000000") is None
    eng.revoke_access_key(info.access_key)
    assert eng.lookup_access_key(info.access_key) is None  # the cached answer is dropped
    with pytest.raises(NoSuchAccessKey):
        eng.revoke_access_key(info.access_key)
    assert [k.revoked > 0 for k in eng.list_access_keys("alice")] == [True]


def test_secrets_are_sealed_under_the_master_key(tmp_path):
    e = Engine(tmp_path / "d", fsync=False)
    e.create_tenant("t1")
    info, secret = e.create_access_key("t1")
    e.close()
    assert secret.encode() not in (tmp_path / "d" / "catalog.sqlite3").read_bytes()
    assert oct((tmp_path / "d" / "master.key").stat().st_mode & 0o777) == "0o600"
    with Engine(tmp_path / "d", fsync=False) as e:
        assert e.lookup_access_key(info.access_key) == ("t1", secret)  # the file key is read back
    with Engine(tmp_path / "d", fsync=False, master_key=os.urandom(32)) as e:
        assert e.lookup_access_key(info.access_key) is None  # refused (and logged), never a 500
        with pytest.raises(InternalError, match="does not open the access keys already stored"):
            e.create_access_key("t1")  # a key sealed under the wrong master key could never work
    (tmp_path / "d" / "master.key").unlink()
    with Engine(tmp_path / "d", fsync=False) as e:
        assert e.lookup_access_key(info.access_key) is None
        with pytest.raises(InternalError, match="master.key is missing"):
            e.create_access_key("t1")
    assert not (tmp_path / "d" / "master.key").exists()  # never replaced by a key that opens nothing


def test_master_key_from_the_environment(tmp_path, monkeypatch):
    key = os.urandom(32)
    monkeypatch.setenv("GPUFEED_MASTER_KEY", base64.b64encode(key).decode())
    assert NodeConfig.from_env().master_key == key
    with Engine(tmp_path / "d", fsync=False, master_key=key) as e:
        e.create_tenant("t")
        info, secret = e.create_access_key("t")
        assert e.lookup_access_key(info.access_key) == ("t", secret)
    assert not (tmp_path / "d" / "master.key").exists()
    for bad in ("not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(ValueError):
            master_key_from_text(bad)


def test_buckets_belong_to_tenants(eng):
    eng.create_tenant("alice")
    eng.create_bucket("shared-name", owner="alice")
    with pytest.raises(BucketAlreadyExists):
        eng.create_bucket("shared-name")  # the default tenant
    with pytest.raises(BucketAlreadyOwnedByYou):
        eng.create_bucket("shared-name", owner="alice")
    with pytest.raises(NoSuchTenant):
        eng.create_bucket("other-name", owner="nobody")
    assert eng.bucket_owner("shared-name") == "alice"
    assert [b.name for b in eng.list_buckets("alice")] == ["shared-name"] and eng.list_buckets("default") == []
    with pytest.raises(TenantNotEmpty):
        eng.delete_tenant("alice")
    eng.delete_bucket("shared-name")
    eng.create_bucket("shared-name")  # the name is free again, for anyone
    assert eng.bucket_owner("shared-name") == "default"
    eng.delete_tenant("alice")
    assert [t.name for t in eng.list_tenants()] == ["default"]


def test_tenant_names_and_the_default_tenant(eng):
    for bad in ("", "A", "-x", "a/b", "../x", "a" * 64, "é"):
        with pytest.raises(InvalidTenantName):
            eng.create_tenant(bad)
    with pytest.raises(TenantAlreadyExists):
        eng.create_tenant("default")
    with pytest.raises(InvalidTenantName):
        eng.delete_tenant("default")
    with pytest.raises(NoSuchTenant):
        eng.create_access_key("ghost")
    info, _ = eng.create_access_key("default")
    assert eng.lookup_access_key(info.access_key)[0] == "default"


# -- quotas ------------------------------------------------------------------------

def test_usage_counts_every_version_exactly(eng):
    """The usage counters follow puts, overwrites, versions, markers and deletes."""
    eng.create_bucket("counted")
    eng.put_object("counted", "a", b"12345")
    eng.put_object("counted", "a", b"123")  # replaces: 3 bytes, 1 version
    assert eng.quota("bucket", "counted")["stored_bytes"] == 3
    eng.put_bucket_versioning("counted", "Enabled")
    v = eng.put_object("counted", "a", b"1234567")
    eng.delete_object("counted", "a")  # a marker: no data
    got = eng.quota("bucket", "counted")
    assert (got["stored_bytes"], got["stored_versions"]) == (10, 2)
    eng.delete_object("counted", "a", v.version_id)
    got = eng.quota("bucket", "counted")
    assert (got["stored_bytes"], got["stored_versions"]) == (3, 1)


def test_bucket_quota_refuses_the_write_whole(eng):
    """A put past the bucket's quota is QuotaExceeded and leaves nothing; deletes free room."""
    eng.create_bucket("capped")
    eng.set_quota("bucket", "capped", max_bytes=10, max_objects=2)
    eng.put_object("capped", "a", b"123456")
    with pytest.raises(QuotaExceeded):
        eng.put_object("capped", "b", b"123456")
    assert [o.key for o in eng.list_objects("capped").objects] == ["a"]
    eng.put_object("capped", "a", b"1234567890")  # an overwrite replaces: 10 bytes
    eng.put_object("capped", "c", b"")
    with pytest.raises(QuotaExceeded):
        eng.put_object("capped", "d", b"")  # third object
    with pytest.raises(QuotaExceeded):
        eng.copy_object("capped", "a", "capped", "e")
    eng.delete_object("capped", "c")
    eng.put_object("capped", "d", b"")
    assert eng.quota("bucket", "capped")["stored_versions"] == 2
    leftovers = [f for _, _, fs in os.walk(eng.data_dir / "tmp") for f in fs]
    assert leftovers == []


def test_tenant_quota_spans_its_buckets(eng):
    eng.create_tenant("team")
    eng.create_bucket("team-a", owner="team")
    eng.create_bucket("team-b", owner="team")
    eng.set_quota("tenant", "team", max_bytes=8)
    eng.put_object("team-a", "x", b"12345")
    with pytest.raises(QuotaExceeded):
        eng.put_object("team-b", "y", b"12345")
    up = eng.create_multipart_upload("team-b", "mp")
    with pytest.raises(QuotaExceeded):  # a part counts as held from its upload on
        eng.upload_part("team-b", "mp", up.upload_id, 1, b"1234")
    part = eng.upload_part("team-b", "mp", up.upload_id, 1, b"123")
    with pytest.raises(QuotaExceeded):
        eng.put_object("team-b", "y", b"1")  # 5 held + 3 pending
    eng.complete_multipart_upload("team-b", "mp", up.upload_id, [(1, part.etag)])
    assert [o.key for o in eng.list_objects("team-b").objects] == ["mp"]
    eng.delete_object("team-b", "mp")
    eng.put_object("team-b", "y", b"123")
    stats = eng.tenant_stats("team")
    assert (stats["stored_bytes"], stats["quota_bytes"]) == (8, 8)
    eng.create_bucket("elsewhere")
    eng.put_object("elsewhere", "z", b"x" * 100)  # the default tenant has no quota


def test_quota_below_usage_and_bad_quotas_are_refused(eng):
    eng.create_bucket("full")
    eng.put_object("full", "a", b"x" * 100)
    with pytest.raises(InvalidArgument, match="already holds"):
        eng.set_quota("bucket", "full", max_bytes=50)
    for bad in ({"max_bytes": -1}, {"max_objects": 1.5}, {"max_bytes": True}):
        with pytest.raises(InvalidArgument):
            eng.set_quota("bucket", "full", **bad)
    with pytest.raises(InvalidArgument):
        eng.set_quota("planet", "full", max_bytes=1)
    with pytest.raises(NoSuchTenant):
        eng.set_quota("tenant", "ghost", max_bytes=1)
    assert eng.quota("bucket", "full")["quota_bytes"] == 0
    eng.set_quota("bucket", "full", max_bytes=100)
    eng.set_quota("bucket", "full", max_bytes=0, max_objects=0)  # no limit again
    eng.put_object("full", "b", b"x" * 1000)


def test_usage_of_a_catalog_made_before_counters(tmp_path):
    """A catalog from before usage counting gets its counters filled on open."""
    import sqlite3

    from gpufeed.engine._sqlite import SqliteCatalog

    path = str(tmp_path / "catalog.sqlite3")
    with sqlite3.connect(path) as db:
        db.executescript("""
CREATE TABLE buckets (name TEXT PRIMARY KEY, created REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE objects (bucket TEXT NOT NULL, key TEXT NOT NULL, size INTEGER NOT NULL, etag TEXT NOT NULL,
    last_modified REAL NOT NULL, content_type TEXT NOT NULL, metadata TEXT NOT NULL, checksums TEXT NOT NULL,
    blob_id TEXT NOT NULL, PRIMARY KEY (bucket, key)) WITHOUT ROWID;
INSERT INTO buckets VALUES ('old', 7.0);
INSERT INTO objects VALUES ('old', 'k1', 3, 'e', 5.0, 'text/plain', '', '', 'b1');
INSERT INTO objects VALUES ('old', 'k2', 4, 'e', 5.0, 'text/plain', '', '', 'b2');
PRAGMA user_version=3;
""")
    db.close()
    c = SqliteCatalog(path, fsync=False)
    try:
        assert c.usage("old") == (7, 2)
    finally:
        c.close()


def test_parts_of_uploads_in_progress_count_against_quotas(eng):
    """Parts never completed cannot pass a quota: UploadPart is refused once held plus pending bytes would."""
    eng.create_bucket("parts-capped")
    eng.set_quota("bucket", "parts-capped", max_bytes=10)
    up = eng.create_multipart_upload("parts-capped", "k")
    eng.upload_part("parts-capped", "k", up.upload_id, 1, b"x" * 6)
    other = eng.create_multipart_upload("parts-capped", "j")
    with pytest.raises(QuotaExceeded):
        eng.upload_part("parts-capped", "j", other.upload_id, 1, b"x" * 6)
    assert eng.list_parts("parts-capped", "j", other.upload_id) == []
    eng.abort_multipart_upload("parts-capped", "k", up.upload_id)
    eng.upload_part("parts-capped", "j", other.upload_id, 1, b"x" * 6)


def test_a_quota_limit_left_out_is_kept(eng):
    eng.create_bucket("kept")
    eng.set_quota("bucket", "kept", max_bytes=1000, max_objects=100)
    eng.set_quota("bucket", "kept", max_bytes=5000)
    got = eng.quota("bucket", "kept")
    assert (got["quota_bytes"], got["quota_objects"]) == (5000, 100)
    eng.set_quota("bucket", "kept", max_objects=0)
    assert eng.quota("bucket", "kept")["quota_objects"] == 0


def test_a_tenant_named_in_a_policy_cannot_be_deleted(eng):
    """Deleting a tenant a bucket policy grants to is refused, so a new tenant of
    the same name can never inherit the grant."""
    import json

    eng.create_tenant("owner")
    eng.create_tenant("carol")
    eng.create_bucket("owned", owner="owner")
    policy = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": "carol"}, "Action": "s3:GetObject",
                             "Resource": "arn:aws:s3:::owned/*"}]}
    eng.put_bucket_policy("owned", json.dumps(policy))
    with pytest.raises(TenantNotEmpty, match="named in the bucket policy"):
        eng.delete_tenant("carol")
    eng.delete_bucket_policy("owned")
    eng.delete_tenant("carol")
