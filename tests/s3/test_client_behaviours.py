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


def test_create_bucket_location_us_east_1_named_is_invalid(s3c):
    """Naming us-east-1 as the LocationConstraint is 400 InvalidLocationConstraint
    (S3 wants none there); nothing is created. Another region is taken, as S3's
    us-east-1 endpoint takes it.

    Source: "CreateBucketConfiguration" (LocationConstraint: "If you don't specify
    a Region, the bucket is created in the US East (N. Virginia) Region
    (us-east-1)") and "Error responses" (InvalidLocationConstraint), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucketConfiguration.html"""
    name = f"lc-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ClientError) as ei:
        s3c.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "us-east-1"})
    assert _err(ei.value) == (400, "InvalidLocationConstraint")
    assert ei.value.response["Error"]["Message"] == "The specified location-constraint is not valid"
    assert ei.value.response["Error"]["LocationConstraint"] == "us-east-1"
    with pytest.raises(ClientError) as ei:
        s3c.head_bucket(Bucket=name)
    assert _err(ei.value)[0] == 404


def test_create_bucket_location_elsewhere_must_name_the_region(tmp_path, serve, node_config):
    """Outside us-east-1 the LocationConstraint must name the node's region: none
    or another region is 400 IllegalLocationConstraintException, worded as S3
    words it; nothing is created.

    Source: "CreateBucket" and "Error responses" (IllegalLocationConstraintException),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html"""
    import boto3

    cfg = dataclasses.replace(node_config(tmp_path / "eu"), region="eu-west-1")
    engine = Engine(cfg.data_dir, fsync=False)
    try:
        with serve(engine, cfg) as port:
            c = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="eu-west-1",
                             aws_access_key_id=cfg.access_key, aws_secret_access_key=cfg.secret_key)
            for conf, said in (({}, "unspecified"), ({"LocationConstraint": "eu-central-1"}, "eu-central-1"),
                               ({"LocationConstraint": "us-east-1"}, "us-east-1")):
                kw = {"CreateBucketConfiguration": conf} if conf else {}
                with pytest.raises(ClientError) as ei:
                    c.create_bucket(Bucket="eu-lc", **kw)
                assert _err(ei.value) == (400, "IllegalLocationConstraintException")
                assert ei.value.response["Error"]["Message"] == (
                    f"The {said} location constraint is incompatible for the region specific endpoint "
                    "this request was sent to.")
            assert c.list_buckets()["Buckets"] == []
            c.create_bucket(Bucket="eu-lc", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
            assert c.get_bucket_location(Bucket="eu-lc")["LocationConstraint"] == "eu-west-1"
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


def test_presigned_expiry_not_a_number(s3_node, bkt, code_of):
    """An ``X-Amz-Expires`` that is not a number is 400
    AuthorizationQueryParametersError "X-Amz-Expires should be a number"; the
    week itself (604800 s) is accepted.

    Source: "Authenticating Requests: Using Query Parameters (AWS Signature
    Version 4)", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html"""
    s3c = s3_node.client(signature_version="s3v4")
    s3c.put_object(Bucket=bkt, Key="pre-n", Body=b"n")
    url = s3c.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": "pre-n"}, ExpiresIn=604800)
    assert _urlopen(url) == (200, b"n")
    status, body = _urlopen(re.sub(r"X-Amz-Expires=\d+", "X-Amz-Expires=abc", url))
    assert (status, code_of(body)) == (400, "AuthorizationQueryParametersError")
    assert ET.fromstring(body).findtext("Message") == "X-Amz-Expires should be a number"
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


def _send_signed_bytes(raw, method: str, path: str, headers: dict[str, bytes], body: bytes = b"",
                       secret_key: str | None = None) -> tuple[int, bytes]:
    """``method path`` with header values sent as exactly these bytes, signed
    (SigV4, written out here) over the same bytes, as a client holding bytes does."""
    import datetime
    import hashlib
    import hmac

    now = datetime.datetime.now(datetime.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    all_headers = {"host": f"127.0.0.1:{raw.port}".encode(), "x-amz-date": amz_date.encode(),
                   "x-amz-content-sha256": payload.encode(), **{k.lower(): v for k, v in headers.items()}}
    names = sorted(all_headers)
    uri, _, query = path.partition("?")  # one query parameter at most, already canonical
    canonical = b"\n".join([method.encode(), uri.encode(), query.encode(),
                            *(n.encode() + b":" + all_headers[n].strip() for n in names), b"",
                            ";".join(names).encode(), payload.encode()])
    scope = f"{day}/us-east-1/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical).hexdigest()])
    key = f"AWS4{secret_key or raw.endpoint.secret_key}".encode()
    for part in (day, "us-east-1", "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    conn = http.client.HTTPConnection("127.0.0.1", raw.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in all_headers.items():
            conn.putheader(k, v)
        conn.putheader("Authorization", f"AWS4-HMAC-SHA256 Credential={raw.endpoint.access_key}/{scope}, "
                                        f"SignedHeaders={';'.join(names)}, Signature={signature}")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _get_raw_headers(raw, path: str) -> http.client.HTTPMessage:
    """The headers of a GET, as http.client reads them (bytes decoded as latin-1)."""
    conn = http.client.HTTPConnection("127.0.0.1", raw.port, timeout=30)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        for k, v in raw.sign("GET", path).items():
            conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        resp.read()
        return resp.headers
    finally:
        conn.close()


@pytest.mark.parametrize("value", [b"caf\xe9", b"\xff\xfe raw \x80\x81", "日本".encode() + b"\xe9"])
def test_user_metadata_not_utf8_round_trips(raw, s3c, bkt, value):
    """Metadata bytes that are not UTF-8 (latin-1 text, arbitrary bytes) are stored
    and returned byte for byte on HEAD and GET, through CopyObject too, and the
    signature is checked over those bytes.

    Source: "Working with object metadata" (user-defined metadata is returned as
    stored), Amazon S3 User Guide, https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingMetadata.html"""
    path = f"/{bkt}/raw-{uuid.uuid4().hex[:6]}"
    headers = {"x-amz-meta-v": value, "x-amz-meta-plain": b"ascii", "Content-Disposition": b"inline; x=" + value,
               "Content-Type": b"text/plain; x=" + value}
    assert _send_signed_bytes(raw, "PUT", path, headers, b"m")[0] == 200
    assert _raw_header(raw, path, "x-amz-meta-v") == value
    got = _get_raw_headers(raw, path)
    assert got["x-amz-meta-v"].encode("latin-1") == value
    assert got["Content-Disposition"].encode("latin-1") == b"inline; x=" + value
    assert got["Content-Type"].encode("latin-1") == b"text/plain; x=" + value
    assert got["x-amz-meta-plain"] == "ascii" and "x-gpufeed-raw-bytes" not in got
    head = s3c.head_object(Bucket=bkt, Key=path.rsplit("/", 1)[1])
    assert head["Metadata"]["v"] == value.decode("latin-1")  # what http.client hands boto3
    s3c.copy_object(Bucket=bkt, Key="raw-copy", CopySource={"Bucket": bkt, "Key": path.rsplit("/", 1)[1]})
    assert _raw_header(raw, f"/{bkt}/raw-copy", "x-amz-meta-v") == value
    wrong = _send_signed_bytes(raw, "PUT", path, headers, b"m", secret_key="not-the-secret")
    assert wrong[0] == 403


def test_user_metadata_not_utf8_signature_v2(raw, bkt):
    """A signature version 2 request is checked over the bytes sent too.

    Source: "Signing and authenticating REST requests" (canonicalized
    ``x-amz-*`` headers), Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/RESTAuthentication.html"""
    import base64
    import email.utils
    import hashlib
    import hmac

    path = f"/{bkt}/v2-{uuid.uuid4().hex[:6]}"
    date = email.utils.formatdate(usegmt=True)
    to_sign = f"PUT\n\n\n{date}\n".encode() + b"x-amz-meta-v:caf\xe9\n" + path.encode()
    sig = base64.b64encode(hmac.new(raw.endpoint.secret_key.encode(), to_sign, hashlib.sha1).digest()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", raw.port, timeout=30)
    try:
        conn.putrequest("PUT", path, skip_accept_encoding=True)
        conn.putheader("Date", date)
        conn.putheader("x-amz-meta-v", b"caf\xe9")
        conn.putheader("Authorization", f"AWS {raw.endpoint.access_key}:{sig}")
        conn.putheader("Content-Length", "1")
        conn.endheaders(b"m")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"")
    finally:
        conn.close()
    assert _raw_header(raw, path, "x-amz-meta-v") == b"caf\xe9"


def test_user_metadata_utf8_reads_back_in_boto3(raw, s3c, bkt):
    """UTF-8 metadata sent as raw bytes (boto3 itself refuses to send non-ASCII
    metadata) comes back as the same bytes; boto3 (whose http.client reads header
    bytes as latin-1) gets the string that was sent once re-decoded as UTF-8, and
    the engine holds it as text.

    Source: "Working with object metadata", Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingMetadata.html"""
    value = "café ✓ 日本"
    key = f"utf8-{uuid.uuid4().hex[:6]}"
    assert _send_signed_bytes(raw, "PUT", f"/{bkt}/{key}", {"x-amz-meta-v": value.encode()}, b"m")[0] == 200
    got = s3c.get_object(Bucket=bkt, Key=key)["Metadata"]["v"]
    assert got.encode("latin-1").decode("utf-8") == value
    assert s3_node_metadata(raw, bkt, key) == {"v": value}


def s3_node_metadata(raw, bkt: str, key: str) -> dict[str, str]:
    """The metadata the engine holds for ``bkt/key`` (UTF-8 is stored as text)."""
    return raw.endpoint.engine.head_object(bkt, key).metadata


@pytest.mark.parametrize(("char", "fits"), [("é", 1023), ("日", 682)])
def test_user_metadata_limit_counts_bytes(raw, bkt, code_of, char, fits):
    """The 2 KiB limit on user metadata counts the bytes of each name and value
    (a two-byte or three-byte character counts two or three), for bytes that are
    not UTF-8 too.

    Source: "Working with object metadata" ("The PUT request header is limited to
    8 KB in size. Within the PUT request header, the user-defined metadata is
    limited to 2 KB in size. The size of user-defined metadata is measured by
    taking the sum of the number of bytes in the UTF-8 encoding of each key and
    value."), Amazon S3 User Guide, https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingMetadata.html"""
    width = len(char.encode())
    name = "k" * (2048 - fits * width)  # name + value == 2048 bytes exactly
    path = f"/{bkt}/lim-{uuid.uuid4().hex[:6]}"
    assert _send_signed_bytes(raw, "PUT", path, {f"x-amz-meta-{name}": (char * fits).encode()}, b"m")[0] == 200
    status, body = _send_signed_bytes(raw, "PUT", path, {f"x-amz-meta-{name}": (char * fits).encode() + b"x"}, b"m")
    assert (status, code_of(body)) == (400, "MetadataTooLarge")
    assert _send_signed_bytes(raw, "PUT", path, {f"x-amz-meta-{name}": b"\xe9" * (fits * width)}, b"m")[0] == 200
    status, body = _send_signed_bytes(raw, "PUT", path, {f"x-amz-meta-{name}": b"\xe9" * (fits * width + 1)}, b"m")
    assert (status, code_of(body)) == (400, "MetadataTooLarge")


def test_multipart_metadata_not_utf8_round_trips(raw, s3c, bkt):
    """Metadata given at CreateMultipartUpload comes back byte for byte on the
    completed object.

    Source: "CreateMultipartUpload" (``x-amz-meta-*``), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateMultipartUpload.html"""
    key = f"mpraw-{uuid.uuid4().hex[:6]}"
    status, body = _send_signed_bytes(raw, "POST", f"/{bkt}/{key}?uploads=", {"x-amz-meta-v": b"caf\xe9"})
    assert status == 200
    uid = ET.fromstring(body).findtext(f"{NS}UploadId")
    etag = s3c.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=b"x")["ETag"]
    s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert _raw_header(raw, f"/{bkt}/{key}", "x-amz-meta-v") == b"caf\xe9"


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
    ({"ObjectLockEventHold": "ON"}, "event holds"),
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
    for call in (s3c.get_object, s3c.head_object, s3c.delete_object):
        with pytest.raises(ClientError) as ei:
            call(Bucket=bkt, Key="v", VersionId="3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")
        assert _err(ei.value)[0] == 400  # a HEAD answer has no body, so no code
    assert s3c.get_object(Bucket=bkt, Key="v", VersionId="null")["Body"].read() == b"v"
    res = s3c.delete_objects(Bucket=bkt, Delete={"Objects": [{"Key": "v", "VersionId": "3HL4kqtJlcpXroDTDmJ"}]})
    assert [e["Code"] for e in res["Errors"]] == ["InvalidArgument"]
    assert s3c.get_object(Bucket=bkt, Key="v")["Body"].read() == b"v"  # nothing was deleted
    with pytest.raises(ClientError) as ei:
        s3c.put_bucket_logging(Bucket=bkt, BucketLoggingStatus={})
    assert _err(ei.value) == (501, "NotImplemented")


def test_expected_bucket_owner_is_501(s3c, bkt):
    """``x-amz-expected-bucket-owner`` asks for an account check gpufeed cannot
    make (it has no account ids): 501 naming it, never a request that passes
    unchecked; nothing changes.

    Source: "Verifying bucket ownership with bucket owner condition" (a mismatch
    is 403 Access Denied), Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-owner-condition.html,
    and "Error responses" (501 NotImplemented), https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    key = f"owner-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ClientError) as ei:
        s3c.put_object(Bucket=bkt, Key=key, Body=b"x", ExpectedBucketOwner="111122223333")
    assert _err(ei.value) == (501, "NotImplemented")
    assert "x-amz-expected-bucket-owner" in ei.value.response["Error"]["Message"]
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x")
    for call in (lambda: s3c.list_objects_v2(Bucket=bkt, ExpectedBucketOwner="111122223333"),
                 lambda: s3c.delete_object(Bucket=bkt, Key=key, ExpectedBucketOwner="111122223333"),
                 lambda: s3c.copy_object(Bucket=bkt, Key=key + "-c", CopySource={"Bucket": bkt, "Key": key},
                                         ExpectedSourceBucketOwner="111122223333")):
        with pytest.raises(ClientError) as ei:
            call()
        assert _err(ei.value) == (501, "NotImplemented")
    assert s3c.get_object(Bucket=bkt, Key=key)["Body"].read() == b"x"


def test_unknown_storage_class_is_invalid(s3c, bkt):
    """A storage class S3 does not define is 400 InvalidStorageClass ("The storage
    class you specified is not valid"); one it defines but gpufeed does not build
    is 501.

    Source: "PutObject" (x-amz-storage-class) and "Error responses"
    (InvalidStorageClass), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    key = f"sc-{uuid.uuid4().hex[:6]}"

    def no_validation(params, **_kw):
        params["StorageClass"] = "FANCY"

    s3c.meta.events.register("provide-client-params.s3.PutObject", no_validation)
    try:
        with pytest.raises(ClientError) as ei:
            s3c.put_object(Bucket=bkt, Key=key, Body=b"x", StorageClass="STANDARD")
    finally:
        s3c.meta.events.unregister("provide-client-params.s3.PutObject", no_validation)
    assert _err(ei.value) == (400, "InvalidStorageClass")
    assert ei.value.response["Error"]["Message"] == "The storage class you specified is not valid"
    with pytest.raises(ClientError) as ei:
        s3c.put_object(Bucket=bkt, Key=key, Body=b"x", StorageClass="STANDARD_IA")
    assert _err(ei.value) == (501, "NotImplemented")
    with pytest.raises(ClientError):
        s3c.head_object(Bucket=bkt, Key=key)


def test_unknown_encryption_method_is_invalid_argument(raw, bkt, code_of):
    """An ``x-amz-server-side-encryption`` that is no S3 method is 400 InvalidArgument
    "The encryption method specified is not supported", naming the argument.

    Source: "PutObject" (x-amz-server-side-encryption: AES256 | aws:kms |
    aws:kms:dsse), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    r = raw.request("PUT", f"/{bkt}/sse-bad", body=b"x", headers={"x-amz-server-side-encryption": "ROT13"})
    doc = ET.fromstring(r.body)
    assert (r.status, code_of(r.body)) == (400, "InvalidArgument")
    assert doc.findtext("Message") == "The encryption method specified is not supported"
    assert (doc.findtext("ArgumentName"), doc.findtext("ArgumentValue")) == ("x-amz-server-side-encryption", "ROT13")
