"""S3 versioning through boto3 against a real node: bucket versioning, version
ids and delete markers on the object calls, their headers and errors.

ListObjectVersions has its own module (``test_list_object_versions.py``).
"""

from __future__ import annotations

import uuid

import pytest
from botocore.exceptions import ClientError

MIB = 1 << 20


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def _headers(resp: dict) -> dict:
    return resp["ResponseMetadata"]["HTTPHeaders"]


@pytest.fixture
def raw_node(node, raw_for):
    """Raw signed requests to the session node."""
    return raw_for(node.s3_url, node.access_key, node.secret_key)


@pytest.fixture
def vbucket(s3, bucket) -> str:
    """A fresh bucket of the session node with versioning enabled."""
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return bucket


# -- PutBucketVersioning / GetBucketVersioning -------------------------------------------

def test_bucket_versioning_states(s3, bucket):
    """Source: "GetBucketVersioning" (no Status for a bucket never versioned) and
    "PutBucketVersioning", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketVersioning.html"""
    got = s3.get_bucket_versioning(Bucket=bucket)
    assert "Status" not in got and "MFADelete" not in got
    for state in ("Enabled", "Suspended", "Enabled"):
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": state})
        assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == state
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"MFADelete": "Disabled",
                                                                       "Status": "Suspended"})
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Suspended"


def test_bucket_versioning_bad_input_changes_nothing(s3, bucket, raw_node):
    """MFA delete is not built (501 naming it); a Status S3 does not know, or a
    document that is not a VersioningConfiguration, is MalformedXML.
    Source: "PutBucketVersioning", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketVersioning.html"""
    with pytest.raises(ClientError) as ei:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"MFADelete": "Enabled",
                                                                           "Status": "Enabled"})
    assert _err(ei.value) == (501, "NotImplemented") and "MfaDelete" in ei.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as ei:
        s3.put_bucket_versioning(Bucket=bucket, MFA="serial 123456",
                                 VersioningConfiguration={"Status": "Enabled"})
    assert _err(ei.value) == (501, "NotImplemented") and "mfa" in ei.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as ei:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "On"})
    assert _err(ei.value) == (400, "MalformedXML")
    for body in (b"<VersioningConfiguration><Status>Enabled", b"<Versioning><Status>Enabled</Status></Versioning>",
                 b"<VersioningConfiguration><Colour>Enabled</Colour></VersioningConfiguration>"):
        resp = raw_node.request("PUT", f"/{bucket}?versioning", body=body)
        assert resp.status == 400 and b"<Code>MalformedXML</Code>" in resp.body
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    with pytest.raises(ClientError) as ei:
        s3.get_bucket_versioning(Bucket=f"nope-{uuid.uuid4().hex[:8]}")
    assert _err(ei.value) == (404, "NoSuchBucket")


def test_kv_bucket_refuses_versioning(s3c, s3_node):
    """A kv bucket keeps one version per key: the engine's InvalidArgument.
    Source: "PutBucketVersioning", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketVersioning.html"""
    name = f"kv-{uuid.uuid4().hex[:8]}"
    s3_node.engine.create_bucket(name, kind="kv", capacity_bytes=1 << 20)
    with pytest.raises(ClientError) as ei:
        s3c.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    assert _err(ei.value) == (400, "InvalidArgument")
    assert "Status" not in s3c.get_bucket_versioning(Bucket=name)


# -- the whole cycle --------------------------------------------------------------------

def test_full_versioning_cycle(s3, bucket):
    """Enable, three versions, a delete marker, list, read each version, remove the
    marker, suspend and put (null replaces null). Sources: "Retaining multiple
    versions of objects with S3 Versioning", "Working with delete markers",
    "Working with objects in a versioning-suspended bucket", Amazon S3 User Guide;
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/Versioning.html"""
    first = s3.put_object(Bucket=bucket, Key="k", Body=b"v0")  # before versioning: the null version
    assert "VersionId" not in first
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    ids = [s3.put_object(Bucket=bucket, Key="k", Body=f"v{i}".encode())["VersionId"] for i in (1, 2, 3)]
    assert len(set(ids)) == 3 and all(len(v) == 32 for v in ids)
    dm = s3.delete_object(Bucket=bucket, Key="k")
    assert dm["DeleteMarker"] is True and len(dm["VersionId"]) == 32
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="k")
    assert _err(ei.value) == (404, "NoSuchKey")
    h = ei.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert h["x-amz-delete-marker"] == "true" and h["x-amz-version-id"] == dm["VersionId"]
    listed = s3.list_object_versions(Bucket=bucket)
    assert [(m["VersionId"], m["IsLatest"]) for m in listed["DeleteMarkers"]] == [(dm["VersionId"], True)]
    assert [v["VersionId"] for v in listed["Versions"]] == ids[::-1] + ["null"]
    assert not any(v["IsLatest"] for v in listed["Versions"])
    for vid, body in zip(["null", *ids], [b"v0", b"v1", b"v2", b"v3"]):
        got = s3.get_object(Bucket=bucket, Key="k", VersionId=vid)
        assert got["Body"].read() == body and got["VersionId"] == vid
    removed = s3.delete_object(Bucket=bucket, Key="k", VersionId=dm["VersionId"])
    assert removed["DeleteMarker"] is True and removed["VersionId"] == dm["VersionId"]
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"v3" and got["VersionId"] == ids[2]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    s3.put_object(Bucket=bucket, Key="k", Body=b"s1")
    s3.put_object(Bucket=bucket, Key="k", Body=b"s2")
    head = s3.head_object(Bucket=bucket, Key="k")
    assert head["VersionId"] == "null" and head["ContentLength"] == 2
    versions = s3.list_object_versions(Bucket=bucket)["Versions"]
    assert [v["VersionId"] for v in versions] == ["null", *ids[::-1]]  # v0 (null) was replaced
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"s2"


def test_delete_marker_in_suspended_bucket_is_null(s3, bucket):
    """Source: "Deleting objects from versioning-suspended buckets", Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/DeletingObjectsfromVersioningSuspendedBuckets.html"""
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    vid = s3.put_object(Bucket=bucket, Key="k", Body=b"kept")["VersionId"]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    dm = s3.delete_object(Bucket=bucket, Key="k")
    assert dm["DeleteMarker"] is True and dm["VersionId"] == "null"
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=vid)["Body"].read() == b"kept"


# -- headers of reads and writes -----------------------------------------------------------

def test_never_versioned_bucket_sends_no_version_headers(s3, bucket):
    """A bucket that was never versioned names no versions on writes or reads, but
    takes ``versionId=null``. Source: "GetObject" (x-amz-version-id), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html"""
    put = s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert "x-amz-version-id" not in _headers(put)
    for resp in (s3.get_object(Bucket=bucket, Key="k"), s3.head_object(Bucket=bucket, Key="k")):
        assert "x-amz-version-id" not in _headers(resp)
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"x"
    deleted = s3.delete_object(Bucket=bucket, Key="k")
    assert "x-amz-delete-marker" not in _headers(deleted) and "x-amz-version-id" not in _headers(deleted)
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="k")
    assert _err(ei.value)[0] == 404
    assert "x-amz-delete-marker" not in ei.value.response["ResponseMetadata"]["HTTPHeaders"]


def test_head_of_a_delete_marker(s3, vbucket):
    """HEAD of a key whose latest version is a delete marker: 404 with
    ``x-amz-delete-marker`` and the marker's version id; HEAD/GET of the marker by
    id: 405 with ``x-amz-delete-marker`` and ``Last-Modified``. Source: "HeadObject"
    and "GetObject", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html"""
    s3.put_object(Bucket=vbucket, Key="k", Body=b"x")
    dm = s3.delete_object(Bucket=vbucket, Key="k")["VersionId"]
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=vbucket, Key="k")
    h = ei.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert _err(ei.value)[0] == 404 and h["x-amz-delete-marker"] == "true" and h["x-amz-version-id"] == dm
    for call in (s3.head_object, s3.get_object):
        with pytest.raises(ClientError) as ei:
            call(Bucket=vbucket, Key="k", VersionId=dm)
        h = ei.value.response["ResponseMetadata"]["HTTPHeaders"]
        assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 405
        assert h["x-amz-delete-marker"] == "true" and h["last-modified"].endswith("GMT")
    assert ei.value.response["Error"]["Code"] == "MethodNotAllowed"


def test_missing_and_malformed_version_ids(s3, vbucket, raw_node):
    """A version that does not exist: 404 NoSuchVersion naming Key and VersionId;
    a malformed one: 400 InvalidArgument "Invalid version id specified"; nothing
    changes. Source: "Error responses" (NoSuchVersion), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    vid = s3.put_object(Bucket=vbucket, Key="k", Body=b"x")["VersionId"]
    missing = uuid.uuid4().hex
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=vbucket, Key="k", VersionId=missing)
    assert _err(ei.value) == (404, "NoSuchVersion")
    resp = raw_node.request("GET", f"/{vbucket}/k?versionId={missing}")
    assert resp.status == 404 and f"<VersionId>{missing}</VersionId>".encode() in resp.body
    assert b"<Key>k</Key>" in resp.body
    for bad in ("3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY", "NULL", "x" * 32):
        for call in (s3.get_object, s3.delete_object, s3.get_object_acl):
            with pytest.raises(ClientError) as ei:
                call(Bucket=vbucket, Key="k", VersionId=bad)
            assert _err(ei.value) == (400, "InvalidArgument")
            assert ei.value.response["Error"]["Message"] == "Invalid version id specified"
        with pytest.raises(ClientError) as ei:
            s3.head_object(Bucket=vbucket, Key="k", VersionId=bad)
        assert _err(ei.value)[0] == 400
    resp = raw_node.request("GET", f"/{vbucket}/k?versionId=")
    assert resp.status == 400 and b"<Code>InvalidArgument</Code>" in resp.body
    assert s3.get_object(Bucket=vbucket, Key="k")["VersionId"] == vid
    assert len(s3.list_object_versions(Bucket=vbucket)["Versions"]) == 1


def test_head_attributes_and_acl_by_version(s3, vbucket):
    """Source: "HeadObject", "GetObjectAttributes" and "GetObjectAcl" (versionId),
    Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObjectAttributes.html"""
    v1 = s3.put_object(Bucket=vbucket, Key="k", Body=b"one")["VersionId"]
    s3.put_object(Bucket=vbucket, Key="k", Body=b"three")
    head = s3.head_object(Bucket=vbucket, Key="k", VersionId=v1)
    assert head["ContentLength"] == 3 and head["VersionId"] == v1
    attrs = s3.get_object_attributes(Bucket=vbucket, Key="k", VersionId=v1,
                                     ObjectAttributes=["ObjectSize", "ETag"])
    assert attrs["ObjectSize"] == 3 and attrs["VersionId"] == v1
    acl = s3.get_object_acl(Bucket=vbucket, Key="k", VersionId=v1)
    assert acl["Grants"][0]["Permission"] == "FULL_CONTROL"
    rng = s3.get_object(Bucket=vbucket, Key="k", VersionId=v1, Range="bytes=1-")
    assert rng["Body"].read() == b"ne" and rng["VersionId"] == v1


# -- copies and multipart ------------------------------------------------------------------

def test_copy_object_by_version(s3, vbucket):
    """CopyObject from ``?versionId=``: the copy names its source version and (in a
    versioned bucket) its own; copying a previous version onto its key restores it.
    Source: "CopyObject", Amazon S3 API Reference, and "Restoring previous versions",
    Amazon S3 User Guide, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CopyObject.html"""
    v1 = s3.put_object(Bucket=vbucket, Key="src", Body=b"old")["VersionId"]
    s3.put_object(Bucket=vbucket, Key="src", Body=b"new")
    copied = s3.copy_object(Bucket=vbucket, Key="dst", CopySource={"Bucket": vbucket, "Key": "src", "VersionId": v1})
    assert copied["CopySourceVersionId"] == v1 and len(copied["VersionId"]) == 32
    assert s3.get_object(Bucket=vbucket, Key="dst")["Body"].read() == b"old"
    restored = s3.copy_object(Bucket=vbucket, Key="src", CopySource={"Bucket": vbucket, "Key": "src", "VersionId": v1})
    assert s3.get_object(Bucket=vbucket, Key="src")["VersionId"] == restored["VersionId"]
    assert s3.get_object(Bucket=vbucket, Key="src")["Body"].read() == b"old"
    plain_bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=plain_bucket)
    plain = s3.copy_object(Bucket=plain_bucket, Key="c", CopySource={"Bucket": vbucket, "Key": "src"})
    assert "VersionId" not in plain and plain["CopySourceVersionId"] == restored["VersionId"]
    with pytest.raises(ClientError) as ei:
        s3.copy_object(Bucket=vbucket, Key="dst", CopySource={"Bucket": vbucket, "Key": "src",
                                                              "VersionId": uuid.uuid4().hex})
    assert _err(ei.value) == (404, "NoSuchVersion")
    with pytest.raises(ClientError) as ei:
        s3.copy_object(Bucket=vbucket, Key="dst", CopySource=f"{vbucket}/src?versionId=bad")
    assert _err(ei.value) == (400, "InvalidArgument")


def test_upload_part_copy_by_version_and_complete_in_versioned_bucket(s3, vbucket):
    """UploadPartCopy from a version; CompleteMultipartUpload names the new version,
    and a repeated completion answers the same ETag and version id even once the
    version is noncurrent. Source: "UploadPartCopy" and "CompleteMultipartUpload",
    Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    v1 = s3.put_object(Bucket=vbucket, Key="src", Body=b"a" * (5 * MIB))["VersionId"]
    s3.put_object(Bucket=vbucket, Key="src", Body=b"b" * 10)
    up = s3.create_multipart_upload(Bucket=vbucket, Key="mp")["UploadId"]
    p1 = s3.upload_part_copy(Bucket=vbucket, Key="mp", UploadId=up, PartNumber=1,
                             CopySource={"Bucket": vbucket, "Key": "src", "VersionId": v1})
    assert p1["CopySourceVersionId"] == v1
    p2 = s3.upload_part(Bucket=vbucket, Key="mp", UploadId=up, PartNumber=2, Body=b"tail")
    parts = {"Parts": [{"PartNumber": 1, "ETag": p1["CopyPartResult"]["ETag"]},
                       {"PartNumber": 2, "ETag": p2["ETag"]}]}
    done = s3.complete_multipart_upload(Bucket=vbucket, Key="mp", UploadId=up, MultipartUpload=parts)
    assert len(done["VersionId"]) == 32
    again = s3.complete_multipart_upload(Bucket=vbucket, Key="mp", UploadId=up, MultipartUpload=parts)
    assert (again["ETag"], again["VersionId"]) == (done["ETag"], done["VersionId"])
    s3.put_object(Bucket=vbucket, Key="mp", Body=b"later")
    again = s3.complete_multipart_upload(Bucket=vbucket, Key="mp", UploadId=up, MultipartUpload=parts)
    assert (again["ETag"], again["VersionId"]) == (done["ETag"], done["VersionId"])
    got = s3.get_object(Bucket=vbucket, Key="mp", VersionId=done["VersionId"])
    assert got["Body"].read() == b"a" * (5 * MIB) + b"tail"
    assert s3.get_object(Bucket=vbucket, Key="mp")["Body"].read() == b"later"


# -- DeleteObjects ---------------------------------------------------------------------------

def test_delete_objects_with_versions(s3, vbucket):
    """DeleteObjects names per object the version removed, or the delete marker made
    or removed (DeleteMarker, DeleteMarkerVersionId); quiet mode reports only errors.
    Source: "DeleteObjects", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteObjects.html"""
    a1 = s3.put_object(Bucket=vbucket, Key="a", Body=b"1")["VersionId"]
    a2 = s3.put_object(Bucket=vbucket, Key="a", Body=b"2")["VersionId"]
    s3.put_object(Bucket=vbucket, Key="b", Body=b"b")
    res = s3.delete_objects(Bucket=vbucket, Delete={"Objects": [
        {"Key": "a", "VersionId": a1}, {"Key": "b"}, {"Key": "c", "VersionId": "bad"}]})
    by_key = {d["Key"]: d for d in res["Deleted"]}
    assert by_key["a"] == {"Key": "a", "VersionId": a1}
    assert by_key["b"]["DeleteMarker"] is True and len(by_key["b"]["DeleteMarkerVersionId"]) == 32
    assert "VersionId" not in by_key["b"]
    assert [(e["Key"], e["VersionId"], e["Code"]) for e in res["Errors"]] == [("c", "bad", "InvalidArgument")]
    marker = by_key["b"]["DeleteMarkerVersionId"]
    res = s3.delete_objects(Bucket=vbucket, Delete={"Objects": [{"Key": "b", "VersionId": marker}]})
    assert res["Deleted"] == [{"Key": "b", "VersionId": marker, "DeleteMarker": True,
                               "DeleteMarkerVersionId": marker}]
    assert s3.get_object(Bucket=vbucket, Key="b")["Body"].read() == b"b"
    quiet = s3.delete_objects(Bucket=vbucket, Delete={"Quiet": True, "Objects": [{"Key": "a", "VersionId": a2}]})
    assert "Deleted" not in quiet and "Errors" not in quiet
    assert [v["Key"] for v in s3.list_object_versions(Bucket=vbucket, Prefix="a").get("Versions", [])] == []


def test_delete_objects_in_never_versioned_bucket(s3, bucket):
    """Source: "DeleteObjects", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteObjects.html"""
    s3.put_object(Bucket=bucket, Key="x", Body=b"x")
    s3.put_object(Bucket=bucket, Key="y", Body=b"y")
    res = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "x"}, {"Key": "y", "VersionId": "null"}]})
    assert sorted(res["Deleted"], key=lambda d: d["Key"]) == [{"Key": "x"}, {"Key": "y", "VersionId": "null"}]
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
