"""Small inputs clients send and the answers S3 gives them: each test names the
AWS API page it follows."""

from __future__ import annotations

import dataclasses
import http.client
import os
import re
import urllib.error
import urllib.request
import uuid
import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError

from gpufeed.engine import Engine

MiB = 1 << 20
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def _urlopen(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


# CreateBucket ---------------------------------------------------------------------
def test_create_owned_bucket_in_us_east_1_is_200(s3c):
    """Source: "CreateBucket", Amazon S3 API Reference (BucketAlreadyOwnedByYou:
    "In all AWS Regions except us-east-1, this error is returned; in us-east-1 ...
    Amazon S3 returns 200 OK"),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html"""
    name = f"own-{uuid.uuid4().hex[:8]}"
    s3c.create_bucket(Bucket=name)
    again = s3c.create_bucket(Bucket=name)
    assert again["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_create_owned_bucket_elsewhere_is_409(tmp_path, serve, node_config):
    """Source: "CreateBucket", Amazon S3 API Reference (409 BucketAlreadyOwnedByYou
    outside us-east-1), https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html"""
    import boto3

    cfg = dataclasses.replace(node_config(tmp_path / "eu"), region="eu-west-1")
    engine = Engine(cfg.data_dir, fsync=False)
    try:
        with serve(engine, cfg) as port:
            c = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="eu-west-1",
                             aws_access_key_id=cfg.access_key, aws_secret_access_key=cfg.secret_key)
            conf = {"LocationConstraint": "eu-west-1"}
            c.create_bucket(Bucket="eu-bucket", CreateBucketConfiguration=conf)
            with pytest.raises(ClientError) as ei:
                c.create_bucket(Bucket="eu-bucket", CreateBucketConfiguration=conf)
            assert _err(ei.value) == (409, "BucketAlreadyOwnedByYou")
            c.close()
    finally:
        engine.close()


# multipart ------------------------------------------------------------------------
def test_repeated_complete_multipart_upload_answers_the_same_etag(s3c, bkt):
    """Source: "CompleteMultipartUpload", Amazon S3 API Reference (a retried
    completion that succeeded answers 200 with the same result),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    uid = s3c.create_multipart_upload(Bucket=bkt, Key="again")["UploadId"]
    e1 = s3c.upload_part(Bucket=bkt, Key="again", UploadId=uid, PartNumber=1, Body=b"x" * 5 * MiB)["ETag"]
    e2 = s3c.upload_part(Bucket=bkt, Key="again", UploadId=uid, PartNumber=2, Body=b"tail")["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]}
    first = s3c.complete_multipart_upload(Bucket=bkt, Key="again", UploadId=uid, MultipartUpload=parts)
    second = s3c.complete_multipart_upload(Bucket=bkt, Key="again", UploadId=uid, MultipartUpload=parts)
    assert second["ResponseMetadata"]["HTTPStatusCode"] == 200 and second["ETag"] == first["ETag"]
    with pytest.raises(ClientError) as ei:  # other parts: that upload is gone
        s3c.complete_multipart_upload(Bucket=bkt, Key="again", UploadId=uid,
                                      MultipartUpload={"Parts": parts["Parts"][:1]})
    assert _err(ei.value) == (404, "NoSuchUpload")


def test_upload_part_copy_range_rules(s3c, bkt):
    """Source: "UploadPartCopy", Amazon S3 API Reference (x-amz-copy-source-range
    is ``bytes=first-last`` within the source),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPartCopy.html"""
    s3c.put_object(Bucket=bkt, Key="ten", Body=b"0123456789")
    uid = s3c.create_multipart_upload(Bucket=bkt, Key="pc-rules")["UploadId"]
    src = {"Bucket": bkt, "Key": "ten"}

    def copy(rng):
        return s3c.upload_part_copy(Bucket=bkt, Key="pc-rules", UploadId=uid, PartNumber=1,
                                    CopySource=src, CopySourceRange=rng)

    for bad in ("0-3", "bytes=3-1", "bytes=a-b"):
        with pytest.raises(ClientError) as ei:
            copy(bad)
        assert _err(ei.value) == (400, "InvalidArgument"), bad
    for past in ("bytes=0-10", "bytes=10-12"):
        with pytest.raises(ClientError) as ei:
            copy(past)
        assert _err(ei.value) == (400, "InvalidRange"), past
    copy("bytes=2-5")
    etag = s3c.list_parts(Bucket=bkt, Key="pc-rules", UploadId=uid)["Parts"][0]["ETag"]
    s3c.complete_multipart_upload(Bucket=bkt, Key="pc-rules", UploadId=uid,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3c.get_object(Bucket=bkt, Key="pc-rules")["Body"].read() == b"2345"


# presigned URLs and Expect ------------------------------------------------------------
def test_presigned_expiry_out_of_range_is_access_denied(s3_node, bkt, code_of):
    """Source: "Authenticating Requests: Using Query Parameters (AWS Signature
    Version 4)", Amazon S3 API Reference (X-Amz-Expires: 1 to 604800 seconds;
    S3 answers 403 AccessDenied otherwise),
    https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html"""
    s3c = s3_node.client(signature_version="s3v4")
    s3c.put_object(Bucket=bkt, Key="pre", Body=b"p")
    url = s3c.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": "pre"}, ExpiresIn=300)
    assert _urlopen(url) == (200, b"p")
    for expires in ("604801", "-1"):
        status, body = _urlopen(re.sub(r"X-Amz-Expires=\d+", f"X-Amz-Expires={expires}", url))
        assert (status, code_of(body)) == (403, "AccessDenied"), expires
    s3c.close()


def test_unknown_expect_is_ignored(raw, bkt):
    """Source: "PutObject", Amazon S3 API Reference (S3 acts on ``Expect:
    100-continue`` only; RFC 9110 section 10.1.1 lets a server ignore others),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    r = raw.request("PUT", f"/{bkt}/expect", body=b"body", headers={"Expect": "something-else"})
    assert r.status == 200
    assert raw.request("GET", f"/{bkt}/expect", headers={"Expect": "202-accepted"}).body == b"body"


# listing encodings ----------------------------------------------------------------------
def _list_xml(raw, path: str) -> ET.Element:
    r = raw.request("GET", path)
    assert r.status == 200, r.body
    return ET.fromstring(r.body)


def test_list_objects_v1_url_encoding_echoes(raw, s3c, code_of):
    """Source: "ListObjects", Amazon S3 API Reference (with encoding-type=url,
    Delimiter, Marker, Prefix, NextMarker and Key are encoded),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjects.html"""
    bucket = f"enc-{uuid.uuid4().hex[:8]}"
    s3c.create_bucket(Bucket=bucket)
    for key in ("a b/1", "a b/2+x", "a+b", "é%"):
        s3c.put_object(Bucket=bucket, Key=key, Body=b"")
    doc = _list_xml(raw, f"/{bucket}?encoding-type=url&prefix=a%20b%2F&marker=a%20b%2F1&delimiter=%2B")
    assert doc.findtext(f"{NS}Prefix") == "a+b/"
    assert doc.findtext(f"{NS}Marker") == "a+b/1"
    assert doc.findtext(f"{NS}Delimiter") == "%2B"
    assert doc.findtext(f"{NS}EncodingType") == "url"
    assert [p.text for p in doc.iter(f"{NS}Prefix")][1:] == ["a+b/2%2B"]  # the common prefix
    doc = _list_xml(raw, f"/{bucket}?encoding-type=url")
    assert doc.findtext(f"{NS}Prefix") == "" and doc.findtext(f"{NS}Marker") == ""
    assert doc.find(f"{NS}Delimiter") is None
    assert [k.text for k in doc.iter(f"{NS}Key")] == ["a+b/1", "a+b/2%2Bx", "a%2Bb", "%C3%A9%25"]
    # boto3 asks for url encoding and decodes: keys with space and + stay apart
    assert [o["Key"] for o in s3c.list_objects(Bucket=bucket)["Contents"]] == ["a b/1", "a b/2+x", "a+b", "é%"]
    r = raw.request("GET", f"/{bucket}?encoding-type=base64")
    assert (r.status, code_of(r.body)) == (400, "InvalidArgument")


def test_list_objects_v2_empty_continuation_token_starts_over(raw, s3c):
    """Source: "ListObjectsV2", Amazon S3 API Reference (continuation-token),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html"""
    bucket = f"tok-{uuid.uuid4().hex[:8]}"
    s3c.create_bucket(Bucket=bucket)
    for key in ("k1", "k2", "k3"):
        s3c.put_object(Bucket=bucket, Key=key, Body=b"")
    doc = _list_xml(raw, f"/{bucket}?list-type=2&continuation-token=&max-keys=2")
    assert [k.text for k in doc.iter(f"{NS}Key")] == ["k1", "k2"]
    assert doc.findtext(f"{NS}IsTruncated") == "true"
    token = doc.findtext(f"{NS}NextContinuationToken")
    rest = s3c.list_objects_v2(Bucket=bucket, ContinuationToken=token)
    assert [o["Key"] for o in rest["Contents"]] == ["k3"]


# metadata and content coding ---------------------------------------------------------------
def _put_raw_header(raw, path: str, name: str, value: bytes) -> int:
    """PUT with one header sent as exactly ``value`` (signed over the same bytes)."""
    headers = raw.sign("PUT", path, body=b"m", headers={name: value.decode("utf-8")})
    headers[name] = value
    conn = http.client.HTTPConnection("127.0.0.1", raw.port, timeout=30)
    try:
        conn.putrequest("PUT", path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", "1")
        conn.endheaders(b"m")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _raw_header(raw, path: str, name: str) -> bytes:
    """The bytes of one response header of a HEAD, as sent."""
    conn = http.client.HTTPConnection("127.0.0.1", raw.port, timeout=30)
    try:
        conn.putrequest("HEAD", path, skip_host=True, skip_accept_encoding=True)
        for k, v in raw.sign("HEAD", path).items():
            conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        resp.read()
        return resp.headers[name].encode("latin-1")  # http.client decodes header bytes as latin-1
    finally:
        conn.close()


@pytest.mark.parametrize("value", ["café ✓ 日本".encode(), b"=?UTF-8?B?Y2Fmw6k=?=", b"tab\there"])
def test_user_metadata_bytes_round_trip(raw, bkt, value):
    """Source: "Working with object metadata", Amazon S3 User Guide (user-defined
    metadata is returned as stored), and "PutObject" / "HeadObject", API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingMetadata.html"""
    path = f"/{bkt}/meta-{uuid.uuid4().hex[:6]}"
    assert _put_raw_header(raw, path, "x-amz-meta-v", value) == 200
    assert _raw_header(raw, path, "x-amz-meta-v") == value


def test_user_metadata_not_utf8_is_refused(raw, bkt, code_of):
    """A value whose bytes are not UTF-8 cannot be stored as sent: 400, never a 500."""
    headers = raw.sign("PUT", f"/{bkt}/latin1", body=b"m", headers={"x-amz-meta-v": "cafe"})
    headers["x-amz-meta-v"] = b"caf\xe9"
    conn = http.client.HTTPConnection("127.0.0.1", raw.port, timeout=30)
    try:
        conn.putrequest("PUT", f"/{bkt}/latin1", skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", "1")
        conn.endheaders(b"m")
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
    finally:
        conn.close()
    assert (status, code_of(body)) == (400, "InvalidArgument")


@pytest.mark.parametrize("coding", ["deflate, gzip", "gzip", "br,  identity"])
def test_content_encoding_round_trips_byte_identical(s3c, bkt, coding):
    """Source: "PutObject" (Content-Encoding is stored and returned on GetObject),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    key = f"ce-{uuid.uuid4().hex[:6]}"
    body = os.urandom(64)
    s3c.put_object(Bucket=bkt, Key=key, Body=body, ContentEncoding=coding)
    got = s3c.get_object(Bucket=bkt, Key=key)
    assert got["ContentEncoding"] == coding and got["Body"].read() == body
    assert s3c.head_object(Bucket=bkt, Key=key)["ContentEncoding"] == coding


# features not built ------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "feature"), [
    ({"Tagging": "a=b"}, "tagging"),
    ({"ObjectLockMode": "GOVERNANCE", "ObjectLockRetainUntilDate": "2030-01-01T00:00:00Z"}, "object lock"),
    ({"ObjectLockLegalHoldStatus": "ON"}, "legal hold"),
    ({"ServerSideEncryption": "aws:kms"}, "SSE-KMS"),
    ({"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}, "SSE-C"),
    ({"StorageClass": "GLACIER"}, "storage class 'GLACIER'"),
])
def test_put_naming_a_feature_not_built_is_501(s3c, bkt, kwargs, feature):
    """Source: "Error responses" (501 NotImplemented: "A header you provided implies
    functionality that is not implemented"), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    key = f"nf-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ClientError) as ei:
        s3c.put_object(Bucket=bkt, Key=key, Body=b"x", **kwargs)
    assert _err(ei.value) == (501, "NotImplemented")
    assert feature in ei.value.response["Error"]["Message"]
    with pytest.raises(ClientError):
        s3c.head_object(Bucket=bkt, Key=key)  # nothing was stored
    with pytest.raises(ClientError) as ei:
        s3c.create_multipart_upload(Bucket=bkt, Key=key, **kwargs)
    assert _err(ei.value) == (501, "NotImplemented")


def test_other_requests_naming_features_not_built_are_501(s3c, bkt):
    """Source: "Error responses" (501 NotImplemented), "CreateBucket"
    (x-amz-bucket-object-lock-enabled) and "GetObject" (versionId: a malformed
    one is 400 InvalidArgument), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    s3c.put_object(Bucket=bkt, Key="v", Body=b"v")
    with pytest.raises(ClientError) as ei:
        s3c.create_bucket(Bucket=f"lock-{uuid.uuid4().hex[:8]}", ObjectLockEnabledForBucket=True)
    assert _err(ei.value) == (501, "NotImplemented") and "object lock" in ei.value.response["Error"]["Message"]
    for call in (s3c.get_object, s3c.head_object, s3c.delete_object):
        with pytest.raises(ClientError) as ei:
            call(Bucket=bkt, Key="v", VersionId="3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")
        assert _err(ei.value)[0] == 400  # a HEAD answer has no body, so no code
    assert s3c.get_object(Bucket=bkt, Key="v", VersionId="null")["Body"].read() == b"v"
    res = s3c.delete_objects(Bucket=bkt, Delete={"Objects": [{"Key": "v", "VersionId": "3HL4kqtJlcpXroDTDmJ"}]})
    assert [e["Code"] for e in res["Errors"]] == ["InvalidArgument"]
    assert s3c.get_object(Bucket=bkt, Key="v")["Body"].read() == b"v"  # nothing was deleted
    with pytest.raises(ClientError) as ei:
        s3c.put_bucket_policy(Bucket=bkt, Policy="{}")
    assert _err(ei.value) == (501, "NotImplemented")
