"""The calls clients and test harnesses probe for: ACLs, bucket configurations,
default encryption, object attributes, part reads and bucket paging. Each test
names the AWS API page it follows."""

from __future__ import annotations

import os
import uuid

import pytest
from botocore.exceptions import ClientError

MiB = 1 << 20


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


@pytest.fixture(scope="module")
def multipart(s3_node, bkt):
    """A three-part object (5 MiB, 5 MiB, 7 bytes) uploaded with CRC32 checksums; yields its parts' bytes."""
    c = s3_node.client()
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), b"the end"]
    uid = c.create_multipart_upload(Bucket=bkt, Key="mp3", ChecksumAlgorithm="CRC32")["UploadId"]
    done = []
    for n, body in enumerate(parts, start=1):
        r = c.upload_part(Bucket=bkt, Key="mp3", UploadId=uid, PartNumber=n, Body=body, ChecksumAlgorithm="CRC32")
        done.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
    c.complete_multipart_upload(Bucket=bkt, Key="mp3", UploadId=uid, MultipartUpload={"Parts": done})
    c.close()
    return parts


# ACLs --------------------------------------------------------------------------------
def test_canned_acls_owner_full_control_accepted(s3c, bkt):
    """Source: "PutObject" / "PutObjectAcl" / "PutBucketAcl" (x-amz-acl), Amazon S3
    API Reference, and "Controlling ownership of objects and disabling ACLs"
    (bucket owner enforced: only bucket-owner-full-control ACLs succeed),
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/about-object-ownership.html"""
    for acl in ("private", "bucket-owner-full-control"):
        s3c.put_object(Bucket=bkt, Key=f"acl-{acl}", Body=b"a", ACL=acl)
        s3c.put_object_acl(Bucket=bkt, Key=f"acl-{acl}", ACL=acl)
    s3c.put_bucket_acl(Bucket=bkt, ACL="private")
    uid = s3c.create_multipart_upload(Bucket=bkt, Key="acl-mp", ACL="bucket-owner-full-control")["UploadId"]
    s3c.abort_multipart_upload(Bucket=bkt, Key="acl-mp", UploadId=uid)
    # the document GetObjectAcl answers is accepted back unchanged
    policy = s3c.get_object_acl(Bucket=bkt, Key="acl-private")
    s3c.put_object_acl(Bucket=bkt, Key="acl-private", AccessControlPolicy={
        "Owner": policy["Owner"], "Grants": policy["Grants"]})


def test_other_acls_are_refused(s3c, bkt):
    """Source: "Controlling ownership of objects and disabling ACLs" (other ACLs fail
    with AccessControlListNotSupported), Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/about-object-ownership.html"""
    s3c.put_object(Bucket=bkt, Key="acl-x", Body=b"a")
    for call in (lambda: s3c.put_object(Bucket=bkt, Key="acl-y", Body=b"a", ACL="public-read"),
                 lambda: s3c.put_object_acl(Bucket=bkt, Key="acl-x", ACL="public-read-write"),
                 lambda: s3c.put_bucket_acl(Bucket=bkt, ACL="authenticated-read"),
                 lambda: s3c.put_object(Bucket=bkt, Key="acl-y", Body=b"a", GrantRead='uri="http://acs"'),
                 lambda: s3c.create_bucket(Bucket=f"acl-{uuid.uuid4().hex[:8]}", ACL="public-read")):
        with pytest.raises(ClientError) as ei:
            call()
        assert _err(ei.value) == (400, "AccessControlListNotSupported")
    owner = s3c.get_object_acl(Bucket=bkt, Key="acl-x")["Owner"]
    with pytest.raises(ClientError) as ei:
        s3c.put_object_acl(Bucket=bkt, Key="acl-x", AccessControlPolicy={"Owner": owner, "Grants": [
            {"Grantee": {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"},
             "Permission": "READ"}]})
    assert _err(ei.value) == (400, "AccessControlListNotSupported")
    with pytest.raises(ClientError):
        s3c.head_object(Bucket=bkt, Key="acl-y")  # nothing was stored


def test_get_acls_answer_owner_full_control(s3c, bkt):
    """Source: "GetObjectAcl" and "GetBucketAcl", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObjectAcl.html"""
    s3c.put_object(Bucket=bkt, Key="acl-get", Body=b"a")
    for acl in (s3c.get_object_acl(Bucket=bkt, Key="acl-get"), s3c.get_bucket_acl(Bucket=bkt)):
        [grant] = acl["Grants"]
        assert grant["Permission"] == "FULL_CONTROL" and grant["Grantee"]["ID"] == acl["Owner"]["ID"]
    with pytest.raises(ClientError) as ei:
        s3c.get_object_acl(Bucket=bkt, Key="acl-missing")
    assert _err(ei.value) == (404, "NoSuchKey")


# bucket configurations ---------------------------------------------------------------------
@pytest.mark.parametrize(("call", "code"), [
    ("get_bucket_policy", "NoSuchBucketPolicy"),
    ("get_bucket_cors", "NoSuchCORSConfiguration"),
    ("get_bucket_encryption", "ServerSideEncryptionConfigurationNotFoundError"),
    ("get_bucket_website", "NoSuchWebsiteConfiguration"),
    ("get_bucket_replication", "ReplicationConfigurationNotFoundError"),
    ("get_bucket_tagging", "NoSuchTagSet"),
])
def test_unset_bucket_configuration_is_its_404(s3c, bkt, call, code):
    """Source: "GetBucketPolicy", "GetBucketCors", "GetBucketEncryption",
    "GetBucketWebsite", "GetBucketReplication", "GetBucketTagging" and "Error
    responses" (their 404 codes), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    with pytest.raises(ClientError) as ei:
        getattr(s3c, call)(Bucket=bkt)
    assert _err(ei.value) == (404, code)
    assert ei.value.response["Error"].get("BucketName") == bkt
    with pytest.raises(ClientError) as ei:
        getattr(s3c, call)(Bucket=f"none-{uuid.uuid4().hex[:8]}")
    assert _err(ei.value) == (404, "NoSuchBucket")


def test_delete_unset_bucket_configuration_is_204(s3c, bkt):
    """Source: "DeleteBucketPolicy", "DeleteBucketCors", "DeleteBucketEncryption",
    "DeleteBucketWebsite", "DeleteBucketReplication", "DeleteBucketTagging" (204 No Content),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteBucketPolicy.html"""
    for call in ("delete_bucket_policy", "delete_bucket_cors", "delete_bucket_encryption",
                 "delete_bucket_website", "delete_bucket_replication", "delete_bucket_tagging"):
        assert getattr(s3c, call)(Bucket=bkt)["ResponseMetadata"]["HTTPStatusCode"] == 204


# default encryption ------------------------------------------------------------------------
def test_sse_aes256_is_echoed(s3c, bkt):
    """Source: "Protecting data with server-side encryption" (SSE-S3, AES256) and
    "PutObject" / "HeadObject" / "CreateMultipartUpload" (x-amz-server-side-encryption
    in the response), Amazon S3 API Reference and User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingServerSideEncryption.html"""
    put = s3c.put_object(Bucket=bkt, Key="sse", Body=b"s", ServerSideEncryption="AES256")
    assert put["ServerSideEncryption"] == "AES256"
    assert s3c.head_object(Bucket=bkt, Key="sse")["ServerSideEncryption"] == "AES256"
    assert s3c.get_object(Bucket=bkt, Key="sse")["ServerSideEncryption"] == "AES256"
    copy = s3c.copy_object(Bucket=bkt, Key="sse-copy", CopySource={"Bucket": bkt, "Key": "sse"})
    assert copy["ServerSideEncryption"] == "AES256"
    up = s3c.create_multipart_upload(Bucket=bkt, Key="sse-mp", ServerSideEncryption="AES256")
    assert up["ServerSideEncryption"] == "AES256"
    etag = s3c.upload_part(Bucket=bkt, Key="sse-mp", UploadId=up["UploadId"], PartNumber=1, Body=b"p")["ETag"]
    done = s3c.complete_multipart_upload(Bucket=bkt, Key="sse-mp", UploadId=up["UploadId"],
                                         MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert done["ServerSideEncryption"] == "AES256"
    assert "ServerSideEncryption" not in s3c.put_object(Bucket=bkt, Key="plain", Body=b"p")


# GetObjectAttributes ----------------------------------------------------------------------
def test_get_object_attributes_of_a_single_part_object(s3c, bkt):
    """Source: "GetObjectAttributes", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObjectAttributes.html"""
    put = s3c.put_object(Bucket=bkt, Key="attrs", Body=b"attributes", ChecksumAlgorithm="SHA256")
    got = s3c.get_object_attributes(Bucket=bkt, Key="attrs", ObjectAttributes=[
        "ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"])
    assert got["ETag"] == put["ETag"].strip('"')
    assert got["Checksum"] == {"ChecksumSHA256": put["ChecksumSHA256"], "ChecksumType": "FULL_OBJECT"}
    assert "ObjectParts" not in got
    assert (got["StorageClass"], got["ObjectSize"]) == ("STANDARD", 10)
    assert "LastModified" in got
    only = s3c.get_object_attributes(Bucket=bkt, Key="attrs", ObjectAttributes=["ObjectSize"])
    assert only["ObjectSize"] == 10 and "ETag" not in only
    with pytest.raises(ClientError) as ei:
        s3c.get_object_attributes(Bucket=bkt, Key="attrs", ObjectAttributes=["Colour"])
    assert _err(ei.value) == (400, "InvalidArgument")
    with pytest.raises(ClientError) as ei:
        s3c.get_object_attributes(Bucket=bkt, Key="missing", ObjectAttributes=["ETag"])
    assert _err(ei.value) == (404, "NoSuchKey")


def test_get_object_attributes_of_a_multipart_object(s3c, bkt, multipart):
    """Source: "GetObjectAttributes" (ObjectParts, MaxParts, PartNumberMarker),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObjectAttributes.html"""
    got = s3c.get_object_attributes(Bucket=bkt, Key="mp3", ObjectAttributes=["ObjectParts", "Checksum", "ETag"])
    assert got["ETag"].endswith("-3")
    assert got["Checksum"]["ChecksumType"] == "COMPOSITE" and got["Checksum"]["ChecksumCRC32"].endswith("-3")
    parts = got["ObjectParts"]
    assert (parts["TotalPartsCount"], parts["IsTruncated"]) == (3, False)
    assert [(p["PartNumber"], p["Size"]) for p in parts["Parts"]] == [(1, 5 * MiB), (2, 5 * MiB), (3, 7)]
    assert all("ChecksumCRC32" in p for p in parts["Parts"])
    page = s3c.get_object_attributes(Bucket=bkt, Key="mp3", ObjectAttributes=["ObjectParts"], MaxParts=1,
                                     PartNumberMarker=1)["ObjectParts"]
    assert [p["PartNumber"] for p in page["Parts"]] == [2]
    assert (page["IsTruncated"], page["NextPartNumberMarker"]) == (True, 2)


# partNumber -------------------------------------------------------------------------------
def test_get_and_head_by_part_number(s3c, bkt, multipart):
    """Source: "GetObject" and "HeadObject" (partNumber, x-amz-mp-parts-count),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html;
    a part the object does not have is 416 InvalidPartNumber, "Error responses",
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    whole = s3c.head_object(Bucket=bkt, Key="mp3")
    assert "PartsCount" not in whole
    offset = 0
    for n, body in enumerate(multipart, start=1):
        got = s3c.get_object(Bucket=bkt, Key="mp3", PartNumber=n)
        assert got["Body"].read() == body
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206 and got["PartsCount"] == 3
        assert got["ContentRange"] == f"bytes {offset}-{offset + len(body) - 1}/{whole['ContentLength']}"
        assert got["ETag"] == whole["ETag"]
        head = s3c.head_object(Bucket=bkt, Key="mp3", PartNumber=n)
        assert (head["ContentLength"], head["PartsCount"]) == (len(body), 3)
        offset += len(body)
    for call in (s3c.get_object, s3c.head_object):
        with pytest.raises(ClientError) as ei:
            call(Bucket=bkt, Key="mp3", PartNumber=4)
        assert _err(ei.value)[0] == 416
    with pytest.raises(ClientError) as ei:
        s3c.get_object(Bucket=bkt, Key="mp3", PartNumber=4)
    assert _err(ei.value) == (416, "InvalidPartNumber")
    assert ei.value.response["Error"]["Message"] == "The requested partnumber is not satisfiable"
    with pytest.raises(ClientError) as ei:
        s3c.get_object(Bucket=bkt, Key="mp3", PartNumber=1, Range="bytes=0-1")
    assert _err(ei.value) == (400, "InvalidRequest")


def test_part_number_of_a_single_part_object(s3c, bkt):
    """Source: "GetObject" (partNumber; an object not uploaded in parts is part 1),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html"""
    s3c.put_object(Bucket=bkt, Key="one-part", Body=b"single")
    got = s3c.get_object(Bucket=bkt, Key="one-part", PartNumber=1)
    assert got["Body"].read() == b"single" and "PartsCount" not in got
    assert got["ContentRange"] == "bytes 0-5/6"
    with pytest.raises(ClientError) as ei:
        s3c.get_object(Bucket=bkt, Key="one-part", PartNumber=2)
    assert _err(ei.value) == (416, "InvalidPartNumber")


def test_part_number_out_of_range_is_invalid_argument(raw, bkt, code_of):
    """Source: "GetObject" (partNumber: a positive integer between 1 and 10,000),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html"""
    raw.request("PUT", f"/{bkt}/pn", body=b"x")
    for bad in ("0", "10001", "x"):
        r = raw.request("GET", f"/{bkt}/pn?partNumber={bad}")
        assert (r.status, code_of(r.body)) == (400, "InvalidArgument"), bad


# ListBuckets ---------------------------------------------------------------------------------
def test_list_buckets_pages_with_prefix(s3c, raw, code_of):
    """Source: "ListBuckets" (max-buckets, continuation-token, prefix), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListBuckets.html"""
    prefix = f"lb-{uuid.uuid4().hex[:6]}-"
    names = [f"{prefix}{i}" for i in range(5)]
    for name in names:
        s3c.create_bucket(Bucket=name)
    seen, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        page = s3c.list_buckets(Prefix=prefix, MaxBuckets=2, **kw)
        assert page["Prefix"] == prefix and len(page["Buckets"]) <= 2
        seen += [b["Name"] for b in page["Buckets"]]
        token = page.get("ContinuationToken")
        if not token:
            break
    assert seen == names
    everything = [b["Name"] for b in s3c.list_buckets()["Buckets"]]
    assert set(names) <= set(everything) and "ContinuationToken" not in s3c.list_buckets()
    assert [b["Name"] for b in s3c.list_buckets(Prefix=prefix, BucketRegion="us-east-1")["Buckets"]] == names
    assert s3c.list_buckets(Prefix=prefix, BucketRegion="eu-west-1")["Buckets"] == []
    for bad in ("max-buckets=0", "max-buckets=10001", "max-buckets=x", "continuation-token=%21%21not-ours"):
        r = raw.request("GET", f"/?{bad}")
        assert (r.status, code_of(r.body)) == (400, "InvalidArgument"), bad
