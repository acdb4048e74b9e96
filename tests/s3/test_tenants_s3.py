"""Tenants and access keys through a running node: the admin API and CLI, and
S3 isolation between tenants (boto3 with each tenant's own key).

S3 behaviour followed: a request on a bucket of another account is 403
AccessDenied; creating a name another account holds is 409
BucketAlreadyExists; a revoked key is 403 InvalidAccessKeyId.
Sources: "CreateBucket" (https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html),
"Error responses" (https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html).
"""

from __future__ import annotations

import json
import subprocess
import sys

import boto3
import pytest
from botocore.exceptions import ClientError

from gpufeed.admin import RemoteAdmin
from gpufeed.errors import (
    AccessError,
    InvalidArgument,
    InvalidTenantName,
    NoSuchAccessKey,
    TenantAlreadyExists,
    TenantNotEmpty,
)
from gpufeed.testing.node import start_node


@pytest.fixture(scope="module")
def tnode(tmp_path_factory):
    node = start_node(tmp_path_factory.mktemp("tenants") / "data")
    yield node
    node.stop()


@pytest.fixture(scope="module")
def admin(tnode):
    return RemoteAdmin(tnode.s3_url, tnode.access_key, tnode.secret_key)


def _client(node, key: dict):
    return boto3.client("s3", endpoint_url=node.s3_url, aws_access_key_id=key["access_key"],
                        aws_secret_access_key=key["secret_key"], region_name="us-east-1")


def _code(exc: pytest.ExceptionInfo) -> tuple[int, str]:
    r = exc.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


@pytest.fixture(scope="module")
def two(tnode, admin):
    admin.tenant_create("alice")
    admin.tenant_create("bob")
    a, b = admin.key_create("alice"), admin.key_create("bob")
    alice, bob = _client(tnode, a), _client(tnode, b)
    alice.create_bucket(Bucket="alice-data")
    alice.put_object(Bucket="alice-data", Key="secret/plan.txt", Body=b"alice's plan")
    bob.create_bucket(Bucket="bob-data")
    return alice, bob, a, b


def test_each_tenant_lists_only_its_buckets(tnode, two):
    alice, bob, _, _ = two
    assert [b["Name"] for b in alice.list_buckets()["Buckets"]] == ["alice-data"]
    assert [b["Name"] for b in bob.list_buckets()["Buckets"]] == ["bob-data"]
    default = tnode.boto3_client()
    names = [b["Name"] for b in default.list_buckets()["Buckets"]]
    assert "alice-data" not in names and "bob-data" not in names
    owners = {alice.list_buckets()["Owner"]["DisplayName"], bob.list_buckets()["Owner"]["DisplayName"]}
    assert owners == {"alice", "bob"}


@pytest.mark.parametrize("call", [
    lambda c: c.get_object(Bucket="alice-data", Key="secret/plan.txt"),
    lambda c: c.head_object(Bucket="alice-data", Key="secret/plan.txt"),
    lambda c: c.put_object(Bucket="alice-data", Key="x", Body=b"bob was here"),
    lambda c: c.delete_object(Bucket="alice-data", Key="secret/plan.txt"),
    lambda c: c.list_objects_v2(Bucket="alice-data"),
    lambda c: c.list_objects(Bucket="alice-data"),
    lambda c: c.head_bucket(Bucket="alice-data"),
    lambda c: c.delete_bucket(Bucket="alice-data"),
    lambda c: c.get_bucket_location(Bucket="alice-data"),
    lambda c: c.create_multipart_upload(Bucket="alice-data", Key="m"),
    lambda c: c.list_multipart_uploads(Bucket="alice-data"),
    lambda c: c.copy_object(Bucket="bob-data", Key="stolen", CopySource={"Bucket": "alice-data",
                                                                        "Key": "secret/plan.txt"}),
    lambda c: c.delete_objects(Bucket="alice-data", Delete={"Objects": [{"Key": "secret/plan.txt"}]}),
    lambda c: c.get_bucket_acl(Bucket="alice-data"),
    lambda c: c.get_object_acl(Bucket="alice-data", Key="secret/plan.txt"),
], ids=["get", "head", "put", "delete", "list-v2", "list-v1", "head-bucket", "delete-bucket", "location",
        "create-mpu", "list-mpu", "copy-from", "delete-objects", "bucket-acl", "object-acl"])
def test_another_tenants_bucket_is_refused(two, call):
    """Every call by bob on alice's bucket is 403 AccessDenied, and alice's data is untouched."""
    alice, bob, _, _ = two
    with pytest.raises(ClientError) as exc:
        call(bob)
    status, code = _code(exc)
    assert (status, code) in ((403, "AccessDenied"), (403, "403")), (status, code)
    err = exc.value.response.get("Error", {})
    assert "alice's" not in json.dumps(err)  # no data; the message names nothing
    assert err.get("Message", "Access Denied") in ("Access Denied", "Forbidden")  # HEAD: no body
    assert alice.get_object(Bucket="alice-data", Key="secret/plan.txt")["Body"].read() == b"alice's plan"
    assert [o["Key"] for o in alice.list_objects_v2(Bucket="alice-data")["Contents"]] == ["secret/plan.txt"]


def test_a_name_another_tenant_holds_is_bucket_already_exists(two):
    alice, bob, _, _ = two
    with pytest.raises(ClientError) as exc:
        bob.create_bucket(Bucket="alice-data")
    assert _code(exc) == (409, "BucketAlreadyExists")
    alice.create_bucket(Bucket="alice-data")  # its owner, in us-east-1: 200


def test_admin_api_needs_the_admin_key(tnode, two):
    _, _, a, _ = two
    with pytest.raises(AccessError, match="admin key"):
        RemoteAdmin(tnode.s3_url, a["access_key"], a["secret_key"]).tenant_list()


def test_revoked_key_is_refused_at_once(tnode, admin, two):
    key = admin.key_create("bob")
    c = _client(tnode, key)
    assert c.list_buckets()["Owner"]["DisplayName"] == "bob"
    admin.key_revoke(key["access_key"])
    with pytest.raises(ClientError) as exc:
        c.list_buckets()
    assert _code(exc) == (403, "InvalidAccessKeyId")
    listed = {k["access_key"]: k for k in admin.key_list("bob")["keys"]}
    assert listed[key["access_key"]]["revoked"] > 0
    with pytest.raises(NoSuchAccessKey):
        admin.key_revoke(key["access_key"])


def test_tenant_admin_errors(admin, two):
    with pytest.raises(TenantAlreadyExists):
        admin.tenant_create("alice")
    for bad in ("../etc", "A", "", "a/b", "x" * 64):
        with pytest.raises(InvalidTenantName):
            admin.tenant_create(bad)
    with pytest.raises(TenantNotEmpty):
        admin.tenant_delete("alice")
    stats = admin.tenant_stats("alice")
    n = len(b"alice's plan")
    assert stats == {"name": "alice", "buckets": 1, "bytes": n, "objects": 1, "stored_bytes": n,
                     "stored_versions": 1, "quota_bytes": 0, "quota_objects": 0}
    names = [t["name"] for t in admin.tenant_list()["tenants"]]
    assert names == sorted(names) and {"alice", "bob", "default"} <= set(names)


def test_deleting_a_tenant_stops_its_keys(tnode, admin):
    admin.tenant_create("carol")
    key = admin.key_create("carol")
    c = _client(tnode, key)
    c.list_buckets()
    admin.tenant_delete("carol")
    with pytest.raises(ClientError) as exc:
        c.list_buckets()
    assert _code(exc) == (403, "InvalidAccessKeyId")


def test_cli_against_a_running_node(tnode):
    base = [sys.executable, "-m", "gpufeed", "admin", "--url", tnode.s3_url, "--access-key", tnode.access_key,
            "--secret-key", tnode.secret_key]
    out = subprocess.run(base + ["tenant", "create", "dave", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["name"] == "dave"
    out = subprocess.run(base + ["key", "create", "dave", "--json"], capture_output=True, text=True, check=True)
    key = json.loads(out.stdout)
    assert set(key) == {"access_key", "secret_key", "tenant"}
    _client(tnode, key).create_bucket(Bucket="dave-bucket")
    out = subprocess.run(base + ["tenant", "stats", "dave", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["buckets"] == 1
    out = subprocess.run(base + ["quota", "set", "bucket", "dave-bucket", "--bytes", "1MiB", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["quota_bytes"] == 1 << 20
    out = subprocess.run(base + ["quota", "show", "tenant", "dave"], capture_output=True, text=True, check=True)
    assert "quota no limit bytes" in out.stdout
    bad = subprocess.run(base + ["tenant", "create", "Dave/../x"], capture_output=True, text=True)
    assert bad.returncode == 1 and "InvalidTenantName" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_on_a_stopped_node_and_a_node_that_is_down(tmp_path):
    node = start_node(tmp_path / "d")
    assert node.stop() == 0
    run = [sys.executable, "-m", "gpufeed", "admin", "--data-dir", str(tmp_path / "d")]
    subprocess.run(run + ["tenant", "create", "erin"], check=True, capture_output=True)
    key = json.loads(subprocess.run(run + ["key", "create", "erin", "--json"], check=True, capture_output=True,
                                    text=True).stdout)
    assert oct((tmp_path / "d" / "master.key").stat().st_mode & 0o777) == "0o600"
    assert key["secret_key"].encode() not in (tmp_path / "d" / "catalog.sqlite3").read_bytes()
    node = start_node(tmp_path / "d")
    try:
        c = _client(node, key)
        c.create_bucket(Bucket="erin-bucket")
        assert [b["Name"] for b in c.list_buckets()["Buckets"]] == ["erin-bucket"]
    finally:
        node.stop()
    typo = subprocess.run([sys.executable, "-m", "gpufeed", "admin", "--data-dir", str(tmp_path / "typo"),
                           "tenant", "create", "zed"], capture_output=True, text=True)
    assert typo.returncode == 1 and "no gpufeed data folder" in typo.stderr and not (tmp_path / "typo").exists()
    down = subprocess.run([sys.executable, "-m", "gpufeed", "admin", "--url", node.s3_url, "tenant", "list"],
                          capture_output=True, text=True)
    assert down.returncode == 1 and "cannot reach the node" in down.stderr and "Traceback" not in down.stderr


def test_quotas_through_the_admin_api_and_s3(tnode, admin):
    """A tenant quota refuses the S3 put that would pass it (403 QuotaExceeded), whole."""
    admin.tenant_create("quota-team")
    key = admin.key_create("quota-team")
    c = _client(tnode, key)
    c.create_bucket(Bucket="quota-bucket")
    got = admin.quota_set("tenant", "quota-team", max_bytes=1000, max_objects=3)
    assert (got["quota_bytes"], got["quota_objects"], got["stored_bytes"]) == (1000, 3, 0)
    c.put_object(Bucket="quota-bucket", Key="a", Body=b"x" * 600)
    with pytest.raises(ClientError) as exc:
        c.put_object(Bucket="quota-bucket", Key="b", Body=b"x" * 600)
    assert _code(exc) == (403, "QuotaExceeded")
    assert [o["Key"] for o in c.list_objects_v2(Bucket="quota-bucket")["Contents"]] == ["a"]
    with pytest.raises(ClientError) as exc:
        c.copy_object(Bucket="quota-bucket", Key="c", CopySource={"Bucket": "quota-bucket", "Key": "a"})
    assert _code(exc) == (403, "QuotaExceeded")
    with pytest.raises(InvalidArgument, match="already holds"):
        admin.quota_set("tenant", "quota-team", max_bytes=100)
    assert admin.tenant_stats("quota-team")["quota_bytes"] == 1000
    c.delete_object(Bucket="quota-bucket", Key="a")
    c.put_object(Bucket="quota-bucket", Key="b", Body=b"x" * 600)
    assert admin.quota_get("bucket", "quota-bucket")["stored_bytes"] == 600



def test_startup_warns_of_a_wrong_master_key_and_a_public_admin_secret(tmp_path):
    """The startup line's warnings say when stored keys will not open, and when
    tenants exist under the built-in admin secret."""
    import base64
    import os

    node = start_node(tmp_path / "d")
    try:
        RemoteAdmin(node.s3_url, node.access_key, node.secret_key).tenant_create("warned")
        RemoteAdmin(node.s3_url, node.access_key, node.secret_key).key_create("warned")
    finally:
        node.stop()
    node = start_node(tmp_path / "d")
    try:
        assert any("built-in secret" in w for w in node.warnings)
    finally:
        node.stop()
    wrong = base64.b64encode(os.urandom(32)).decode()
    node = start_node(tmp_path / "d", env={"GPUFEED_MASTER_KEY": wrong})
    try:
        assert any("does not open the access keys" in w for w in node.warnings)
    finally:
        node.stop()
