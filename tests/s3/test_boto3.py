"""The S3 front through a real boto3 client against a real ``gpufeed serve``."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import uuid

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError


def _code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def _status(exc: ClientError) -> int:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"]


# buckets -------------------------------------------------------------------------------
def test_bucket_lifecycle(s3):
    name = f"life-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=name)
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] is None
    # the node is in us-east-1, where S3 answers 200 to creating a bucket you own
    assert s3.create_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200
    s3.put_object(Bucket=name, Key="x", Body=b"1")
    with pytest.raises(ClientError) as ei:
        s3.delete_bucket(Bucket=name)
    assert _code(ei.value) == "BucketNotEmpty" and _status(ei.value) == 409
    s3.delete_object(Bucket=name, Key="x")
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as ei:
        s3.head_bucket(Bucket=name)
    assert _status(ei.value) == 404
    with pytest.raises(ClientError) as ei:
        s3.list_objects_v2(Bucket=name)
    assert _code(ei.value) == "NoSuchBucket"


def test_create_bucket_with_location_and_bad_name(s3):
    name = f"loc-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    s3.head_bucket(Bucket=name)
    with pytest.raises(ClientError) as ei:
        s3.create_bucket(Bucket="Bad_Name")
    assert _code(ei.value) == "InvalidBucketName" and _status(ei.value) == 400


# objects ---------------------------------------------------------------------------------
def test_put_get_metadata_roundtrip(s3, bucket):
    body = os.urandom(100_000)
    put = s3.put_object(Bucket=bucket, Key="dir/obj.bin", Body=body, ContentType="application/x-test",
                        Metadata={"Alpha": "one", "beta-two": "2"})
    assert put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    got = s3.get_object(Bucket=bucket, Key="dir/obj.bin")
    assert got["Body"].read() == body
    assert got["ContentType"] == "application/x-test"
    assert got["Metadata"] == {"alpha": "one", "beta-two": "2"}
    assert got["ContentLength"] == len(body)
    assert got["ETag"] == put["ETag"]
    assert got["AcceptRanges"] == "bytes"
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    head = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert head["ContentLength"] == len(body) and head["Metadata"]["alpha"] == "one"
    age = dt.datetime.now(dt.UTC) - head["LastModified"]
    assert abs(age.total_seconds()) < 120


def test_empty_object_and_overwrite(s3, bucket):
    s3.put_object(Bucket=bucket, Key="e", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="e")["Body"].read() == b""
    s3.put_object(Bucket=bucket, Key="e", Body=b"second")
    assert s3.get_object(Bucket=bucket, Key="e")["Body"].read() == b"second"


def test_unicode_and_special_keys(s3, bucket):
    keys = ["a b", "plus+sign", "ünïcødé/ключ", "q?x=1&y", "pct%20lit", "semi;colon", "tilde~", "a//b", "#hash"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    for k in keys:
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == k.encode()
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(listed, key=str.encode) == sorted(keys, key=str.encode)
    listed_v1 = [o["Key"] for o in s3.list_objects(Bucket=bucket)["Contents"]]  # encoding-type=url
    assert sorted(listed_v1) == sorted(keys)


def test_missing_key_and_bucket(s3, bucket):
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="nope")
    assert _code(ei.value) == "NoSuchKey" and _status(ei.value) == 404
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="nope")
    assert _status(ei.value) == 404
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket="no-such-bucket-here", Key="k")
    assert _code(ei.value) == "NoSuchBucket"
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket="no-such-bucket-here", Key="k", Body=b"x")
    assert _code(ei.value) == "NoSuchBucket"
    s3.delete_object(Bucket=bucket, Key="never-existed")  # not an error


def test_key_too_long(s3, bucket):
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"x")
    assert _code(ei.value) == "KeyTooLongError"


def test_ranges(s3, bucket):
    body = bytes(range(256)) * 40
    s3.put_object(Bucket=bucket, Key="r", Body=body)
    n = len(body)
    cases = {"bytes=0-9": 0, "bytes=100-": 100, "bytes=-7": n - 7, "bytes=10000-20000": 10000,
             "bytes=5-5": 5, "bytes=-20000": 0}
    ends = {"bytes=0-9": 10, "bytes=5-5": 6}
    for rng, first in cases.items():
        want = body[first:ends.get(rng, n)]
        got = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        assert got["Body"].read() == want, rng
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert got["ContentRange"] == f"bytes {first}-{first + len(want) - 1}/{len(body)}"
    for bad in ("bytes=10240-", "bytes=20000-30000"):
        with pytest.raises(ClientError) as ei:
            s3.get_object(Bucket=bucket, Key="r", Range=bad)
        assert _code(ei.value) == "InvalidRange" and _status(ei.value) == 416
    # several ranges or nonsense: the whole object (S3 behaviour)
    assert s3.get_object(Bucket=bucket, Key="r", Range="bytes=0-1,5-6")["Body"].read() == body
    assert s3.get_object(Bucket=bucket, Key="r", Range="items=0-1")["Body"].read() == body


def test_conditional_get_and_head(s3, bucket):
    put = s3.put_object(Bucket=bucket, Key="c", Body=b"cond")
    etag = put["ETag"]
    s3.get_object(Bucket=bucket, Key="c", IfMatch=etag)
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"0000"')
    assert _status(ei.value) == 412 and _code(ei.value) == "PreconditionFailed"
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert _status(ei.value) == 304
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="c", IfNoneMatch="*")
    assert _status(ei.value) == 304
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    past = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=future)
    assert _status(ei.value) == 304
    assert s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=past)["Body"].read() == b"cond"
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="c", IfUnmodifiedSince=past)
    assert _status(ei.value) == 412
    s3.head_object(Bucket=bucket, Key="c", IfUnmodifiedSince=future)
    # RFC 9110: If-Match true wins over If-Unmodified-Since false
    s3.get_object(Bucket=bucket, Key="c", IfMatch=etag, IfUnmodifiedSince=past)


def test_conditional_put(s3, bucket):
    s3.put_object(Bucket=bucket, Key="once", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="once", Body=b"2", IfNoneMatch="*")
    assert _status(ei.value) == 412
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"1"


def test_response_overrides(s3, bucket):
    s3.put_object(Bucket=bucket, Key="o", Body=b"x")
    got = s3.get_object(Bucket=bucket, Key="o", ResponseContentType="text/csv",
                        ResponseContentDisposition="attachment; filename=o.csv")
    assert got["ContentType"] == "text/csv"
    assert got["ContentDisposition"] == "attachment; filename=o.csv"


def test_copy_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src key+1", Body=b"copy me", ContentType="text/plain",
                  Metadata={"m": "1"})
    r = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src key+1"})
    assert r["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(b"copy me").hexdigest()}"'
    got = s3.get_object(Bucket=bucket, Key="dst")
    assert got["Body"].read() == b"copy me" and got["Metadata"] == {"m": "1"}
    assert got["ContentType"] == "text/plain"
    s3.copy_object(Bucket=bucket, Key="dst2", CopySource=f"{bucket}/src key+1",
                   MetadataDirective="REPLACE", Metadata={"n": "2"}, ContentType="text/x")
    head = s3.head_object(Bucket=bucket, Key="dst2")
    assert head["Metadata"] == {"n": "2"} and head["ContentType"] == "text/x"
    with pytest.raises(ClientError) as ei:  # to itself without changes
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "dst"})
    assert _code(ei.value) == "InvalidRequest"
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "dst"},
                   MetadataDirective="REPLACE", Metadata={"z": "9"})
    assert s3.head_object(Bucket=bucket, Key="dst")["Metadata"] == {"z": "9"}
    with pytest.raises(ClientError) as ei:
        s3.copy_object(Bucket=bucket, Key="d3", CopySource={"Bucket": bucket, "Key": "missing"})
    assert _code(ei.value) == "NoSuchKey"
    with pytest.raises(ClientError) as ei:
        s3.copy_object(Bucket=bucket, Key="d3", CopySource={"Bucket": bucket, "Key": "dst"},
                       CopySourceIfMatch='"nope"')
    assert _status(ei.value) == 412


def test_delete_objects(s3, bucket):
    for i in range(5):
        s3.put_object(Bucket=bucket, Key=f"d/{i}", Body=b"x")
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d/0"}, {"Key": "d/1"}, {"Key": "absent"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["absent", "d/0", "d/1"]
    assert "Errors" not in r
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d/2"}], "Quiet": True})
    assert "Deleted" not in r
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert left == ["d/3", "d/4"]
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k" * 1100}, {"Key": "d/3"}]})
    assert [e["Code"] for e in r["Errors"]] == ["KeyTooLongError"]
    assert [d["Key"] for d in r["Deleted"]] == ["d/3"]


# listing ---------------------------------------------------------------------------------
@pytest.fixture
def tree(s3, bucket) -> str:
    keys = ["a/1", "a/2", "a/b/3", "b/4", "c", "d/e/f/5"] + [f"many/{i:03d}" for i in range(25)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    return bucket


def test_list_v2_delimiter_prefix(s3, tree):
    r = s3.list_objects_v2(Bucket=tree, Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["c"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/", "b/", "d/", "many/"]
    assert r["KeyCount"] == 5 and r["IsTruncated"] is False
    r = s3.list_objects_v2(Bucket=tree, Prefix="a/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a/1", "a/2"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/b/"]
    r = s3.list_objects_v2(Bucket=tree, StartAfter="b/4", MaxKeys=2, FetchOwner=True)
    assert [o["Key"] for o in r["Contents"]] == ["c", "d/e/f/5"]
    assert r["IsTruncated"] is True and "Owner" in r["Contents"][0]
    assert r["Contents"][0]["Size"] == 1 and r["Contents"][0]["StorageClass"] == "STANDARD"
    assert s3.list_objects_v2(Bucket=tree, MaxKeys=0)["KeyCount"] == 0
    assert s3.list_objects_v2(Bucket=tree, Prefix="zzz")["KeyCount"] == 0


def test_list_pagination(s3, tree):
    pages = list(s3.get_paginator("list_objects_v2").paginate(Bucket=tree, PaginationConfig={"PageSize": 4}))
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])]
    assert len(keys) == 31 and keys == sorted(keys) and len(pages) == 8
    pages = list(s3.get_paginator("list_objects").paginate(Bucket=tree, PaginationConfig={"PageSize": 7}))
    assert [o["Key"] for p in pages for o in p.get("Contents", [])] == keys
    pages = list(s3.get_paginator("list_objects").paginate(Bucket=tree, Delimiter="/",
                                                           PaginationConfig={"PageSize": 2}))
    flat = [o["Key"] for p in pages for o in p.get("Contents", [])]
    flat += [c["Prefix"] for p in pages for c in p.get("CommonPrefixes", [])]
    assert sorted(flat) == ["a/", "b/", "c", "d/", "many/"]


def test_list_v1_marker(s3, tree):
    r = s3.list_objects(Bucket=tree, Marker="many/020", MaxKeys=3)
    assert [o["Key"] for o in r["Contents"]] == ["many/021", "many/022", "many/023"]
    assert r["IsTruncated"] is True and r["NextMarker"] == "many/023"
    assert "Owner" in r["Contents"][0]


def test_bad_continuation_token(s3, tree):
    with pytest.raises(ClientError) as ei:
        s3.list_objects_v2(Bucket=tree, ContinuationToken="not-a-token!!")
    assert _code(ei.value) == "InvalidArgument"


# multipart -------------------------------------------------------------------------------
MiB = 1 << 20


def test_multipart_explicit(s3, bucket):
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", ContentType="text/mp", Metadata={"k": "v"})
    uid = up["UploadId"]
    p1, p2 = os.urandom(5 * MiB), os.urandom(123)
    e1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1, Body=p1)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=2, Body=p2)["ETag"]
    parts = s3.list_parts(Bucket=bucket, Key="mp", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in parts] == [(1, e1, 5 * MiB), (2, e2, 123)]
    page = s3.list_parts(Bucket=bucket, Key="mp", UploadId=uid, MaxParts=1)
    assert page["IsTruncated"] is True and page["NextPartNumberMarker"] == 1
    ups = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [("mp", uid)]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    want = hashlib.md5(hashlib.md5(p1).digest() + hashlib.md5(p2).digest()).hexdigest() + "-2"
    assert done["ETag"] == f'"{want}"'
    got = s3.get_object(Bucket=bucket, Key="mp")
    assert got["Body"].read() == p1 + p2
    assert got["ContentType"] == "text/mp" and got["Metadata"] == {"k": "v"}
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_multipart_errors(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="bad")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="bad", UploadId=uid, PartNumber=1, Body=b"small")["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="bad", UploadId=uid, PartNumber=2, Body=b"small")["ETag"]
    with pytest.raises(ClientError) as ei:
        s3.complete_multipart_upload(Bucket=bucket, Key="bad", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert _code(ei.value) == "EntityTooSmall"
    with pytest.raises(ClientError) as ei:
        s3.complete_multipart_upload(Bucket=bucket, Key="bad", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]})
    assert _code(ei.value) == "InvalidPartOrder"
    with pytest.raises(ClientError) as ei:
        s3.complete_multipart_upload(Bucket=bucket, Key="bad", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]})
    assert _code(ei.value) == "InvalidPart"
    with pytest.raises(ClientError) as ei:
        s3.upload_part(Bucket=bucket, Key="bad", UploadId=uid, PartNumber=10001, Body=b"x")
    assert _code(ei.value) == "InvalidArgument"
    s3.abort_multipart_upload(Bucket=bucket, Key="bad", UploadId=uid)
    with pytest.raises(ClientError) as ei:
        s3.upload_part(Bucket=bucket, Key="bad", UploadId=uid, PartNumber=3, Body=b"x")
    assert _code(ei.value) == "NoSuchUpload" and _status(ei.value) == 404
    with pytest.raises(ClientError) as ei:
        s3.list_parts(Bucket=bucket, Key="bad", UploadId=uid)
    assert _code(ei.value) == "NoSuchUpload"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="bad")


def test_upload_part_copy(s3, bucket):
    src = os.urandom(6 * MiB)
    s3.put_object(Bucket=bucket, Key="big-src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="pc")["UploadId"]
    e1 = s3.upload_part_copy(Bucket=bucket, Key="pc", UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": bucket, "Key": "big-src"},
                             CopySourceRange=f"bytes=0-{5 * MiB - 1}")["CopyPartResult"]["ETag"]
    e2 = s3.upload_part_copy(Bucket=bucket, Key="pc", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "big-src"},
                             CopySourceRange=f"bytes={5 * MiB}-{6 * MiB - 1}")["CopyPartResult"]["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="pc", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert s3.get_object(Bucket=bucket, Key="pc")["Body"].read() == src


def test_transfer_manager_upload_download(s3, bucket, tmp_path):
    src = tmp_path / "src.bin"
    data = os.urandom(13 * MiB + 17)
    src.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4)
    s3.upload_file(str(src), bucket, "tm/obj", Config=cfg)
    head = s3.head_object(Bucket=bucket, Key="tm/obj")
    assert head["ContentLength"] == len(data) and head["ETag"].endswith('-3"')
    dst = tmp_path / "dst.bin"
    s3.download_file(bucket, "tm/obj", str(dst), Config=cfg)  # ranged GETs in parallel
    assert dst.read_bytes() == data


# checksums ---------------------------------------------------------------------------------
def test_default_crc32_checksum_stored_and_returned(s3, bucket):
    put = s3.put_object(Bucket=bucket, Key="ck", Body=b"checksummed")
    assert put["ChecksumCRC32"]  # boto3 >= 1.36 sends one by default
    got = s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    assert got["ChecksumCRC32"] == put["ChecksumCRC32"]
    assert got["Body"].read() == b"checksummed"  # botocore validates it on read
    head = s3.head_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == put["ChecksumCRC32"]
    assert "ChecksumCRC32" not in s3.head_object(Bucket=bucket, Key="ck")


@pytest.mark.parametrize("algorithm", ["SHA256", "SHA1", "CRC32"])
def test_checksum_algorithms(s3, bucket, algorithm):
    put = s3.put_object(Bucket=bucket, Key=f"ck-{algorithm}", Body=b"x" * 1000, ChecksumAlgorithm=algorithm)
    got = s3.get_object(Bucket=bucket, Key=f"ck-{algorithm}", ChecksumMode="ENABLED")
    assert got[f"Checksum{algorithm}"] == put[f"Checksum{algorithm}"]
    got["Body"].read()


def test_content_md5(s3, s3_once, bucket):
    import base64

    body = b"md5 body"
    good = base64.b64encode(hashlib.md5(body).digest()).decode()
    s3.put_object(Bucket=bucket, Key="md5", Body=body, ContentMD5=good)
    with pytest.raises(ClientError) as ei:
        s3_once.put_object(Bucket=bucket, Key="md5-bad", Body=body,
                           ContentMD5=base64.b64encode(hashlib.md5(b"other").digest()).decode())
    assert _code(ei.value) == "BadDigest" and _status(ei.value) == 400
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="md5-bad", Body=body, ContentMD5="not base64!")
    assert _code(ei.value) == "InvalidDigest"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="md5-bad")
