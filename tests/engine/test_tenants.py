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
    InvalidTenantName,
    NoSuchAccessKey,
    NoSuchTenant,
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
        with pytest.raises(InternalError, match="master key"):
            e.lookup_access_key(info.access_key)


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
