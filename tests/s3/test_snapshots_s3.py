"""S3 reads of bucket snapshots with boto3 (``?snapshot=NAME`` added by a
botocore event hook, as the README shows), the admin API's snapshot calls and
who may make them, and the refusals: writes through a snapshot, a missing
snapshot, a name with path characters."""

from __future__ import annotations

import uuid
from urllib.parse import quote, urlsplit, urlunsplit

import boto3
import pytest
from botocore.exceptions import ClientError

from gpufeed.admin import RemoteAdmin
from gpufeed.errors import AccessDenied, InvalidArgument, NoSuchSnapshot

_READS = ("GetObject", "HeadObject", "ListObjects", "ListObjectsV2")


def read_snapshot(client, name: str, operations=_READS) -> None:
    """Make ``client`` read snapshot ``name``: add ``?snapshot=NAME`` to each
    request of ``operations`` before it is signed (the README's recipe)."""
    def add(request, **_kw) -> None:
        u = urlsplit(request.url)
        query = (u.query + "&" if u.query else "") + "snapshot=" + quote(name, safe="")
        request.url = urlunsplit((u.scheme, u.netloc, u.path, query, u.fragment))

    for op in operations:
        client.meta.events.register(f"before-sign.s3.{op}", add)


@pytest.fixture
def admin(node):
    a = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    yield a
    a.close()


@pytest.fixture
def snapped(node, s3, bucket, admin):
    """``bucket`` with a, dir/b, dir/c in snapshot "s1", then a overwritten, dir/b deleted, d added."""
    for key, body in (("a", b"a-old"), ("dir/b", b"b-old"), ("dir/c", b"c")):
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    snap = admin.snapshot_create(bucket, "s1")
    assert (snap["name"], snap["objects"], snap["bytes"], snap["kind"]) == ("s1", 3, 11, "manual")
    s3.put_object(Bucket=bucket, Key="a", Body=b"a-new")
    s3.delete_object(Bucket=bucket, Key="dir/b")
    s3.put_object(Bucket=bucket, Key="d", Body=b"d")
    return bucket


def test_boto3_reads_a_snapshot(node, s3, snapped):
    snap = node.boto3_client()
    read_snapshot(snap, "s1")
    try:
        assert snap.get_object(Bucket=snapped, Key="a")["Body"].read() == b"a-old"
        assert snap.get_object(Bucket=snapped, Key="dir/b")["Body"].read() == b"b-old"
        assert snap.get_object(Bucket=snapped, Key="a", Range="bytes=2-")["Body"].read() == b"old"
        assert snap.head_object(Bucket=snapped, Key="dir/b")["ContentLength"] == 5
        listed = snap.list_objects_v2(Bucket=snapped)
        assert [o["Key"] for o in listed["Contents"]] == ["a", "dir/b", "dir/c"]
        rolled = snap.list_objects(Bucket=snapped, Delimiter="/")
        assert [o["Key"] for o in rolled["Contents"]] == ["a"]
        assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["dir/"]
        with pytest.raises(ClientError) as e:
            snap.get_object(Bucket=snapped, Key="d")
        assert e.value.response["Error"]["Code"] == "NoSuchKey"
    finally:
        snap.close()
    # the live bucket is unchanged by all that
    assert s3.get_object(Bucket=snapped, Key="a")["Body"].read() == b"a-new"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=snapped)["Contents"]] == ["a", "d", "dir/c"]


@pytest.mark.parametrize("name, code, status", [
    ("nope", "NoSuchSnapshot", 404),
    ("../etc", "InvalidArgument", 400),
    ("a/b", "InvalidArgument", 400),
])
def test_bad_or_missing_snapshot(node, snapped, name, code, status):
    snap = node.boto3_client()
    read_snapshot(snap, name)
    try:
        with pytest.raises(ClientError) as e:
            snap.get_object(Bucket=snapped, Key="a")
        assert (e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]) == \
            (code, status)
        with pytest.raises(ClientError) as e:
            snap.list_objects_v2(Bucket=snapped)
        assert e.value.response["Error"]["Code"] == code
    finally:
        snap.close()


def test_writes_through_a_snapshot_are_refused(node, s3, snapped):
    snap = node.boto3_client()
    read_snapshot(snap, "s1", ("PutObject", "DeleteObject", "CopyObject", "PutObjectTagging"))
    try:
        for call in (lambda: snap.put_object(Bucket=snapped, Key="a", Body=b"x"),
                     lambda: snap.delete_object(Bucket=snapped, Key="a"),
                     lambda: snap.copy_object(Bucket=snapped, Key="z", CopySource=f"{snapped}/a"),
                     lambda: snap.put_object_tagging(Bucket=snapped, Key="a",
                                                     Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})):
            with pytest.raises(ClientError) as e:
                call()
            assert e.value.response["Error"]["Code"] == "MethodNotAllowed"
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 405
    finally:
        snap.close()
    assert s3.get_object(Bucket=snapped, Key="a")["Body"].read() == b"a-new"
    assert "z" not in [o["Key"] for o in s3.list_objects_v2(Bucket=snapped)["Contents"]]


def test_admin_snapshot_calls(s3, snapped, admin):
    want = {"added": ["d"], "changed": ["a"], "removed": ["dir/b"], "retagged": []}
    assert admin.snapshot_diff(snapped, "s1") == want
    assert [s["name"] for s in admin.snapshot_list(snapped)["snapshots"]] == ["s1"]
    assert admin.snapshot_restore(snapped, "s1", prefix="dir/") == {"restored": 1, "deleted": 0, "unchanged": 1}
    assert s3.get_object(Bucket=snapped, Key="dir/b")["Body"].read() == b"b-old"
    assert admin.snapshot_schedule(snapped, hourly=3) == {"hourly": 3, "daily": 0}
    assert admin.snapshot_schedule(snapped) == {"hourly": 3, "daily": 0}
    with pytest.raises(NoSuchSnapshot):
        admin.snapshot_diff(snapped, "s1", "nope")
    with pytest.raises(InvalidArgument):
        admin.snapshot_create(snapped, "..")
    admin.snapshot_schedule(snapped, hourly=0)
    for s in admin.snapshot_list(snapped)["snapshots"]:
        admin.snapshot_delete(snapped, s["name"])
    assert admin.snapshot_list(snapped) == {"snapshots": []}


def test_a_tenant_snapshots_its_own_buckets_only(node, bucket, admin):
    tenant = "snap-" + uuid.uuid4().hex[:8]
    admin.tenant_create(tenant)
    key = admin.key_create(tenant)
    own = "own-" + uuid.uuid4().hex[:8]
    tc = boto3.client("s3", endpoint_url=node.s3_url, aws_access_key_id=key["access_key"],
                      aws_secret_access_key=key["secret_key"], region_name="us-east-1")
    ta = RemoteAdmin(node.s3_url, key["access_key"], key["secret_key"])
    try:
        tc.create_bucket(Bucket=own)
        tc.put_object(Bucket=own, Key="k", Body=b"v")
        assert ta.snapshot_create(own, "mine")["objects"] == 1
        with pytest.raises(AccessDenied):
            ta.snapshot_create(bucket, "theirs")  # the default tenant's bucket
        with pytest.raises(AccessDenied):
            ta.snapshot_list(bucket)
        with pytest.raises(AccessDenied):
            ta.tenant_list()  # the rest of the admin API stays the admin key's
        assert [s["name"] for s in admin.snapshot_list(own)["snapshots"]] == ["mine"]  # the admin sees all
        ta.snapshot_delete(own, "mine")
    finally:
        tc.close()
        ta.close()


def test_a_sigv2_url_cannot_be_turned_into_a_snapshot_read(node, snapped):
    """SigV2 does not sign the snapshot parameter, so a SigV2 request naming one
    is refused (a live URL extended with ``&snapshot=`` would otherwise read
    deleted data without a new signature)."""
    import urllib.error
    import urllib.request

    from botocore.config import Config

    v2 = boto3.client("s3", endpoint_url=node.s3_url, aws_access_key_id=node.access_key,
                      aws_secret_access_key=node.secret_key, region_name="us-east-1",
                      config=Config(signature_version="s3"))
    url = v2.generate_presigned_url("get_object", Params={"Bucket": snapped, "Key": "dir/b"})
    with pytest.raises(urllib.error.HTTPError) as gone:
        urllib.request.urlopen(url, timeout=10)
    assert gone.value.code == 404  # deleted from the live bucket
    gone.value.close()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url + "&snapshot=s1", timeout=10)
    assert refused.value.code == 403 and b"Signature Version 4" in refused.value.read()
    refused.value.close()


def test_snapshot_parameter_once_and_schedule_calls_checked(node, s3, snapped, admin):
    url = s3.generate_presigned_url("get_object", Params={"Bucket": snapped, "Key": "a"})
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as twice:
        urllib.request.urlopen(url + "&snapshot=s1&snapshot=s1", timeout=10)
    assert twice.value.code in (400, 403)  # refused either way (SigV4 also refuses the unsigned extras)
    twice.value.close()
    admin.snapshot_schedule(snapped, daily=2)
    assert admin._call("PUT", f"buckets/{snapped}/snapshot-schedule", {"hourly": 3}) == {"hourly": 3, "daily": 2}
    with pytest.raises(InvalidArgument):
        admin._call("PUT", f"buckets/{snapped}/snapshot-schedule", {"weekly": 3})
    assert admin.snapshot_schedule(snapped) == {"hourly": 3, "daily": 2}
    admin.snapshot_schedule(snapped, hourly=0, daily=0)
    with pytest.raises(InvalidArgument):
        RemoteAdmin(node.s3_url.removeprefix("http://"), node.access_key, node.secret_key)


def test_snapshot_argument_given_twice_is_refused():
    from multidict import MultiDict

    from gpufeed.s3._snapshots import snapshot_arg

    assert snapshot_arg(MultiDict([("snapshot", "s1")])) == "s1"
    assert snapshot_arg(MultiDict()) is None
    with pytest.raises(InvalidArgument):
        snapshot_arg(MultiDict([("snapshot", "s1"), ("snapshot", "nope")]))
