"""The S3 front through boto3 against a live ``gpufeed serve``: standard headers,
atomic conditional writes, long keys on delete, multipart checksums, v1 markers."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import os
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

MiB = 1 << 20


def _code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def _status(exc: ClientError) -> int:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"]


EXPIRES = dt.datetime(2037, 10, 21, 7, 28, tzinfo=dt.UTC)
STD = dict(CacheControl="max-age=60", ContentDisposition='attachment; filename="r.csv"',
           ContentLanguage="de-CH", Expires=EXPIRES, WebsiteRedirectLocation="/elsewhere")


def _assert_std(resp) -> None:
    assert resp["CacheControl"] == "max-age=60"
    assert resp["ContentDisposition"] == 'attachment; filename="r.csv"'
    assert resp["ContentLanguage"] == "de-CH"
    assert resp["Expires"] == EXPIRES
    assert resp["WebsiteRedirectLocation"] == "/elsewhere"


# standard headers ------------------------------------------------------------------------
def test_put_headers_round_trip(s3, bucket):
    body = gzip.compress(b"a,b\n1,2\n")
    s3.put_object(Bucket=bucket, Key="r.csv.gz", Body=body, ContentEncoding="gzip", **STD)
    for resp in (s3.head_object(Bucket=bucket, Key="r.csv.gz"), s3.get_object(Bucket=bucket, Key="r.csv.gz")):
        _assert_std(resp)
        assert resp["ContentEncoding"] == "gzip"
    assert s3.get_object(Bucket=bucket, Key="r.csv.gz")["Body"].read() == body  # stored as sent
    # a response-* override still wins over the stored value
    got = s3.get_object(Bucket=bucket, Key="r.csv.gz", ResponseCacheControl="no-cache")
    assert got["CacheControl"] == "no-cache"


@pytest.mark.parametrize("encoding, stored", [("aws-chunked", None), ("aws-chunked,gzip", "gzip")])
def test_aws_chunked_is_not_stored_as_content_encoding(raw, s3_node, encoding, stored):
    """aws-chunked is the request's framing (what SDKs send over https with a
    trailing checksum), not the object's coding: S3 drops it."""
    bkt = f"w-{uuid.uuid4().hex[:12]}"
    s3_node.engine.create_bucket(bkt)
    data = b"z" * 1000
    crc = base64.b64encode(_crc32(data)).decode()
    body = f"{len(data):x}\r\n".encode() + data + f"\r\n0\r\nx-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    r = raw.request("PUT", f"/{bkt}/chunked", body=body, payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER",
                    headers={"Content-Encoding": encoding, "x-amz-decoded-content-length": str(len(data)),
                             "x-amz-trailer": "x-amz-checksum-crc32"})
    assert r.status == 200, r.body
    info = s3_node.engine.head_object(bkt, "chunked")
    assert info.headers.get("Content-Encoding") == stored and s3_node.engine.get_object(bkt, "chunked") == data


def test_multipart_and_copy_headers(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp", **STD)["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1, Body=b"data")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]})
    _assert_std(s3.head_object(Bucket=bucket, Key="mp"))
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "mp"})
    _assert_std(s3.head_object(Bucket=bucket, Key="copy"))
    s3.copy_object(Bucket=bucket, Key="replaced", CopySource={"Bucket": bucket, "Key": "mp"},
                   MetadataDirective="REPLACE", CacheControl="no-store", ContentType="text/plain")
    head = s3.head_object(Bucket=bucket, Key="replaced")
    assert head["CacheControl"] == "no-store" and head["ContentType"] == "text/plain"
    assert "ContentDisposition" not in head and "Expires" not in head


# conditional writes ------------------------------------------------------------------------
def test_if_match_put(s3, bucket):
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="m", Body=b"0", IfMatch='"' + "0" * 32 + '"')
    assert _status(ei.value) == 404
    etag = s3.put_object(Bucket=bucket, Key="m", Body=b"1")["ETag"]
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="m", Body=b"2", IfMatch='"' + "0" * 32 + '"')
    assert _status(ei.value) == 412
    s3.put_object(Bucket=bucket, Key="m", Body=b"2", IfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="m")["Body"].read() == b"2"


def test_concurrent_if_none_match_puts_have_one_winner(node, bucket):
    def put(i: int) -> int:
        client = node.boto3_client()
        try:
            client.put_object(Bucket=bucket, Key="race", Body=os.urandom(256 << 10), IfNoneMatch="*")
            return 200
        except ClientError as exc:
            return _status(exc)
        finally:
            client.close()

    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(put, range(12)))
    assert statuses.count(200) == 1 and statuses.count(412) == 11


def test_complete_multipart_if_none_match(s3, bucket):
    s3.put_object(Bucket=bucket, Key="mp", Body=b"there")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1, Body=b"data")["ETag"]
    with pytest.raises(ClientError) as ei:
        s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, IfNoneMatch="*",
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]})
    assert _status(ei.value) == 412
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"there"


# delete ---------------------------------------------------------------------------------
def test_delete_object_key_too_long(s3, bucket):
    with pytest.raises(ClientError) as ei:
        s3.delete_object(Bucket=bucket, Key="k" * 1025)
    assert _code(ei.value) == "KeyTooLongError" and _status(ei.value) == 400


# multipart checksums ----------------------------------------------------------------------
def _crc32(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def test_multipart_crc32_composite(s3, bucket):
    p1, p2 = os.urandom(5 * MiB), os.urandom(1000)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="ck", ChecksumAlgorithm="CRC32")["UploadId"]
    r1 = s3.upload_part(Bucket=bucket, Key="ck", UploadId=uid, PartNumber=1, Body=p1, ChecksumAlgorithm="CRC32")
    r2 = s3.upload_part(Bucket=bucket, Key="ck", UploadId=uid, PartNumber=2, Body=p2, ChecksumAlgorithm="CRC32")
    assert r1["ChecksumCRC32"] == base64.b64encode(_crc32(p1)).decode()
    parts = s3.list_parts(Bucket=bucket, Key="ck", UploadId=uid)["Parts"]
    assert [p["ChecksumCRC32"] for p in parts] == [r1["ChecksumCRC32"], r2["ChecksumCRC32"]]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="ck", UploadId=uid, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": r1["ETag"], "ChecksumCRC32": r1["ChecksumCRC32"]},
        {"PartNumber": 2, "ETag": r2["ETag"], "ChecksumCRC32": r2["ChecksumCRC32"]},
    ]})
    want = base64.b64encode(_crc32(_crc32(p1) + _crc32(p2))).decode() + "-2"
    assert done["ChecksumCRC32"] == want
    head = s3.head_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == want and head["ChecksumType"] == "COMPOSITE"
    got = s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    assert got["ChecksumCRC32"] == want
    assert got["Body"].read() == p1 + p2


def test_transfer_manager_crc32_upload_then_checked_download(s3, bucket, tmp_path):
    data = os.urandom(11 * MiB)
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_file(str(src), bucket, "tm", ExtraArgs={"ChecksumAlgorithm": "CRC32"}, Config=cfg)
    head = s3.head_object(Bucket=bucket, Key="tm", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"].endswith("-3")
    s3.download_file(bucket, "tm", str(dst), ExtraArgs={"ChecksumMode": "ENABLED"}, Config=cfg)
    assert dst.read_bytes() == data
    assert s3.get_object(Bucket=bucket, Key="tm", ChecksumMode="ENABLED")["Body"].read() == data


# listing --------------------------------------------------------------------------------
def test_list_v1_marker_at_common_prefix(s3, bucket):
    for k in ("a", "b/1", "b/2", "b/c/3", "b0", "c/1"):
        s3.put_object(Bucket=bucket, Key=k, Body=b"")
    r = s3.list_objects(Bucket=bucket, Delimiter="/", Marker="b/")
    assert [o["Key"] for o in r.get("Contents", [])] == ["b0"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["c/"]
    first = s3.list_objects(Bucket=bucket, Delimiter="/", MaxKeys=2)
    assert first["IsTruncated"] and first["NextMarker"] == "b/"
    pages = list(s3.get_paginator("list_objects").paginate(Bucket=bucket, Delimiter="/",
                                                          PaginationConfig={"PageSize": 1}))
    entries = [o["Key"] for p in pages for o in p.get("Contents", [])]
    entries += [c["Prefix"] for p in pages for c in p.get("CommonPrefixes", [])]
    assert sorted(entries) == ["a", "b/", "b0", "c/"]


def test_get_during_overwrites_never_404(node):
    """Readers racing overwriters get the old or the new version, never NoSuchKey."""
    import threading

    s3 = node.boto3_client()
    s3.create_bucket(Bucket="overwrite-race")
    s3.put_object(Bucket="overwrite-race", Key="race", Body=b"0" * 100_000)
    stop = threading.Event()
    errors: list[Exception] = []
    reads = [0]

    def writer(i: int) -> None:
        c = node.boto3_client()
        n = 0
        while not stop.is_set():
            c.put_object(Bucket="overwrite-race", Key="race", Body=bytes([48 + (i + n) % 10]) * 100_000)
            n += 1
        c.close()

    def reader() -> None:
        c = node.boto3_client()
        while not stop.is_set():
            try:
                body = c.get_object(Bucket="overwrite-race", Key="race")["Body"].read()
                assert len(body) == 100_000 and body == body[:1] * 100_000
                reads[0] += 1
            except Exception as exc:  # reported below
                errors.append(exc)
        c.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    import time

    time.sleep(4)
    stop.set()
    for t in threads:
        t.join()
    s3.close()
    assert not errors, errors[:3]
    assert reads[0] > 20


def test_metadata_too_large(s3):
    s3.create_bucket(Bucket="meta-large")
    import botocore.exceptions
    import pytest

    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.put_object(Bucket="meta-large", Key="k", Body=b"x", Metadata={"big": "a" * 5000})
    assert info.value.response["Error"]["Code"] == "MetadataTooLarge"
    s3.put_object(Bucket="meta-large", Key="k", Body=b"x", Metadata={"ok": "a" * 1000})
