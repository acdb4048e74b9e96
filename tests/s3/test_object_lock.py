"""S3 object lock through the S3 front: buckets with object lock, the bucket's
object lock configuration, retention and legal hold of versions, the lock
headers of writes and reads, and what locked versions survive. boto3 against
the in-process node; raw signed requests where boto3 cannot send the input.
Each test names the AWS page it follows."""

from __future__ import annotations

import base64
import hashlib
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError
from multidict import CIMultiDict

from gpufeed.s3 import _router as r


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def _fails(call, status: int, code: str, message: str | None = None, **kwargs) -> None:
    with pytest.raises(ClientError) as ei:
        call(**kwargs)
    assert _err(ei.value) == (status, code), ei.value.response
    if message is not None:
        assert message in ei.value.response["Error"]["Message"]


def _later(days: float = 1.0) -> datetime:
    return (datetime.now(UTC) + timedelta(days=days)).replace(microsecond=0)


def _md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


@pytest.fixture
def locked(s3c) -> str:
    """A fresh bucket created with object lock."""
    name = f"lock-{uuid.uuid4().hex[:10]}"
    s3c.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    return name


def _version(s3_node, bucket: str, key: str) -> str:
    """The key's current version id, as the engine holds it."""
    return s3_node.engine.head_object(bucket, key).version_id


# routing ------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "target", "expected"), [
    ("PUT", "/b?object-lock", r.PutObjectLockConfiguration("b")),
    ("GET", "/b?object-lock", r.GetObjectLockConfiguration("b")),
    ("PUT", "/b/k?retention", r.PutObjectRetention("b", "k")),
    ("GET", "/b/k?retention&versionId=null", r.GetObjectRetention("b", "k")),
    ("PUT", "/b/k?legal-hold", r.PutObjectLegalHold("b", "k")),
    ("GET", "/b/k?legal-hold", r.GetObjectLegalHold("b", "k")),
])
def test_lock_routes(method, target, expected):
    """Source: the request lines of "PutObjectLockConfiguration", "PutObjectRetention",
    "PutObjectLegalHold" and their Get operations, Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLockConfiguration.html"""
    ep = r.route(r.parse_target(method, target, CIMultiDict({"Host": "127.0.0.1:9000"})))
    assert ep == expected and type(ep) is type(expected)


@pytest.mark.parametrize(("method", "target"), [
    ("DELETE", "/b?object-lock"), ("POST", "/b?object-lock"), ("DELETE", "/b/k?retention"),
    ("POST", "/b/k?legal-hold"),
])
def test_lock_routes_other_methods_not_allowed(method, target):
    """Source: "Error responses" (405 MethodNotAllowed), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    from gpufeed.errors import MethodNotAllowed

    with pytest.raises(MethodNotAllowed):
        r.route(r.parse_target(method, target, CIMultiDict({"Host": "127.0.0.1:9000"})))


# buckets with object lock ---------------------------------------------------------------
def test_create_bucket_with_object_lock(s3c, s3_node, locked):
    """Source: "CreateBucket" (x-amz-bucket-object-lock-enabled; versioning is enabled
    with it) and "GetObjectLockConfiguration", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html"""
    assert s3c.get_object_lock_configuration(Bucket=locked)["ObjectLockConfiguration"] == \
        {"ObjectLockEnabled": "Enabled"}
    info = s3_node.engine.head_bucket(locked)
    assert info.object_lock and info.versioning == "Enabled"
    plain = f"plain-{uuid.uuid4().hex[:8]}"
    s3c.create_bucket(Bucket=plain, ObjectLockEnabledForBucket=False)
    assert not s3_node.engine.head_bucket(plain).object_lock
    _fails(s3c.get_object_lock_configuration, 404, "ObjectLockConfigurationNotFoundError", Bucket=plain)
    _fails(s3c.get_object_lock_configuration, 404, "NoSuchBucket", Bucket=f"none-{uuid.uuid4().hex[:8]}")


def test_create_bucket_object_lock_header_checked(raw, s3_node, code_of):
    """Source: "CreateBucket" (x-amz-bucket-object-lock-enabled is a boolean), Amazon
    S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html"""
    name = f"bad-{uuid.uuid4().hex[:8]}"
    resp = raw.request("PUT", f"/{name}", headers={"x-amz-bucket-object-lock-enabled": "maybe"})
    assert resp.status == 400 and code_of(resp.body) == "InvalidArgument"
    assert name not in {b.name for b in s3_node.engine.list_buckets()}
    resp = raw.request("PUT", f"/{name}", headers={"x-amz-bucket-object-lock-enabled": "true",
                                                    "x-gpufeed-bucket-kind": "kv", "x-gpufeed-capacity-bytes": "10"})
    assert resp.status == 400 and code_of(resp.body) == "InvalidArgument"  # a cache keeps one version
    assert name not in {b.name for b in s3_node.engine.list_buckets()}


def test_put_and_get_object_lock_configuration(s3c, locked):
    """Source: "PutObjectLockConfiguration" and "GetObjectLockConfiguration" (a Rule with
    a DefaultRetention of Days or Years; no Rule removes the default), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLockConfiguration.html"""
    for retention in ({"Mode": "GOVERNANCE", "Days": 1}, {"Mode": "COMPLIANCE", "Years": 2}):
        conf = {"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": retention}}
        s3c.put_object_lock_configuration(Bucket=locked, ObjectLockConfiguration=conf)
        assert s3c.get_object_lock_configuration(Bucket=locked)["ObjectLockConfiguration"] == conf
    s3c.put_object_lock_configuration(Bucket=locked, ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"})
    assert s3c.get_object_lock_configuration(Bucket=locked)["ObjectLockConfiguration"] == \
        {"ObjectLockEnabled": "Enabled"}


def test_object_lock_on_an_existing_versioned_bucket(s3c, s3_node):
    """Source: "PutObjectLockConfiguration" (object lock can be enabled on an existing
    bucket whose versioning is Enabled; otherwise 409 InvalidBucketState), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLockConfiguration.html"""
    name = f"ver-{uuid.uuid4().hex[:8]}"
    s3c.create_bucket(Bucket=name)
    conf = {"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Years": 1}}}
    _fails(s3c.put_object_lock_configuration, 409, "InvalidBucketState", Bucket=name, ObjectLockConfiguration=conf)
    _fails(s3c.get_object_lock_configuration, 404, "ObjectLockConfigurationNotFoundError", Bucket=name)
    s3_node.engine.put_bucket_versioning(name, "Enabled")
    s3c.put_object_lock_configuration(Bucket=name, ObjectLockConfiguration=conf)
    assert s3c.get_object_lock_configuration(Bucket=name)["ObjectLockConfiguration"] == conf


@pytest.mark.parametrize(("retention", "code"), [
    ({"Mode": "GOVERNANCE", "Days": 1, "Years": 1}, "MalformedXML"),
    ({"Mode": "GOVERNANCE"}, "MalformedXML"),
    ({"Mode": "invalid", "Days": 1}, "MalformedXML"),
    ({"Mode": "governance", "Days": 1}, "MalformedXML"),
    ({"Mode": "GOVERNANCE", "Days": 0}, "InvalidArgument"),
    ({"Mode": "GOVERNANCE", "Years": -1}, "InvalidArgument"),
    ({"Mode": "COMPLIANCE", "Years": 101}, "InvalidArgument"),
    ({"Mode": "COMPLIANCE", "Days": 36501}, "InvalidArgument"),
])
def test_bad_object_lock_configuration_changes_nothing(s3c, locked, retention, code):
    """Source: "PutObjectLockConfiguration" and "Error responses" (MalformedXML for a
    document off the schema: both Days and Years, an unknown mode; InvalidArgument for a
    retention period that is not a positive integer), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLockConfiguration.html"""
    before = {"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 3}}}
    s3c.put_object_lock_configuration(Bucket=locked, ObjectLockConfiguration=before)
    _fails(s3c.put_object_lock_configuration, 400, code, Bucket=locked,
           ObjectLockConfiguration={"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": retention}})
    _fails(s3c.put_object_lock_configuration, 400, "MalformedXML", Bucket=locked,
           ObjectLockConfiguration={"ObjectLockEnabled": "Disabled"})
    assert s3c.get_object_lock_configuration(Bucket=locked)["ObjectLockConfiguration"] == before


@pytest.mark.parametrize("body", [
    b"<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled>",
    b"<Other><ObjectLockEnabled>Enabled</ObjectLockEnabled></Other>",
    b"<ObjectLockConfiguration><Rule/></ObjectLockConfiguration>",
    b"<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled><Rule/></ObjectLockConfiguration>",
    b"<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled><Rule><DefaultRetention>"
    b"<Mode>GOVERNANCE</Mode><Days>x</Days></DefaultRetention></Rule></ObjectLockConfiguration>",
    b"<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled><Extra/></ObjectLockConfiguration>",
])
def test_malformed_object_lock_configuration(raw, locked, code_of, body):
    """Source: "PutObjectLockConfiguration" and "Error responses" (MalformedXML), Amazon
    S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    resp = raw.request("PUT", f"/{locked}?object-lock", body=body, headers={"Content-MD5": _md5(body)})
    assert resp.status == 400 and code_of(resp.body) == "MalformedXML"


def test_lock_documents_need_content_md5_or_a_checksum(raw, s3_node, locked, code_of):
    """Source: "PutObjectLockConfiguration", "PutObjectRetention", "PutObjectLegalHold"
    (Content-MD5 or an x-amz-checksum header is required), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectRetention.html"""
    s3_node.engine.put_object(locked, "k", b"x")
    until = _later().strftime("%Y-%m-%dT%H:%M:%SZ")
    for path, body in (
        (f"/{locked}?object-lock", b"<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled>"
                                   b"<Rule><DefaultRetention><Mode>GOVERNANCE</Mode><Days>1</Days>"
                                   b"</DefaultRetention></Rule></ObjectLockConfiguration>"),
        (f"/{locked}/k?retention", f"<Retention><Mode>GOVERNANCE</Mode><RetainUntilDate>{until}"
                                   f"</RetainUntilDate></Retention>".encode()),
        (f"/{locked}/k?legal-hold", b"<LegalHold><Status>ON</Status></LegalHold>"),
    ):
        resp = raw.request("PUT", path, body=body)
        assert resp.status == 400 and code_of(resp.body) == "InvalidRequest", path
        assert b"Content-MD5" in resp.body
        resp = raw.request("PUT", path, body=body, headers={"Content-MD5": _md5(b"other")})
        assert resp.status == 400 and code_of(resp.body) == "BadDigest", path
    info = s3_node.engine.head_object(locked, "k")
    assert (info.lock_mode, info.legal_hold) == ("", False)
    assert s3_node.engine.head_bucket(locked).lock_mode == ""
    body = b"<LegalHold><Status>ON</Status></LegalHold>"
    assert raw.request("PUT", f"/{locked}/k?legal-hold", body=body, headers={"Content-MD5": _md5(body)}).status == 200
    assert s3_node.engine.head_object(locked, "k").legal_hold


# default retention and lock headers on writes ----------------------------------------------
def test_default_retention_applies_to_new_versions(s3c, locked):
    """Source: "PutObjectLockConfiguration" (the default retention applies to new object
    versions) and "HeadObject" (x-amz-object-lock-mode, x-amz-object-lock-retain-until-date),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html"""
    s3c.put_object_lock_configuration(Bucket=locked, ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 2}}})
    s3c.put_object(Bucket=locked, Key="plain", Body=b"a")
    uid = s3c.create_multipart_upload(Bucket=locked, Key="mp")["UploadId"]
    part = s3c.upload_part(Bucket=locked, Key="mp", UploadId=uid, PartNumber=1, Body=b"part")
    s3c.complete_multipart_upload(Bucket=locked, Key="mp", UploadId=uid,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    s3c.copy_object(Bucket=locked, Key="copy", CopySource={"Bucket": locked, "Key": "plain"})
    expected = datetime.now(UTC) + timedelta(days=2)
    for key in ("plain", "mp", "copy"):
        for got in (s3c.head_object(Bucket=locked, Key=key), s3c.get_object(Bucket=locked, Key=key)):
            assert got["ObjectLockMode"] == "GOVERNANCE"
            assert abs((got["ObjectLockRetainUntilDate"] - expected).total_seconds()) < 60
            assert "ObjectLockLegalHoldStatus" not in got
        retention = s3c.get_object_retention(Bucket=locked, Key=key)["Retention"]
        assert retention["Mode"] == "GOVERNANCE"


def test_put_object_with_lock_headers(s3c, locked):
    """Source: "PutObject" (x-amz-object-lock-mode, -retain-until-date, -legal-hold) and
    "GetObject" (the same headers answered), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    until = _later(3)
    s3c.put_object(Bucket=locked, Key="k", Body=b"data", ObjectLockMode="COMPLIANCE",
                   ObjectLockRetainUntilDate=until, ObjectLockLegalHoldStatus="ON")
    for got in (s3c.head_object(Bucket=locked, Key="k"), s3c.get_object(Bucket=locked, Key="k")):
        assert (got["ObjectLockMode"], got["ObjectLockRetainUntilDate"], got["ObjectLockLegalHoldStatus"]) == \
            ("COMPLIANCE", until, "ON")
    assert s3c.get_object_retention(Bucket=locked, Key="k")["Retention"] == \
        {"Mode": "COMPLIANCE", "RetainUntilDate": until}
    assert s3c.get_object_legal_hold(Bucket=locked, Key="k")["LegalHold"] == {"Status": "ON"}
    s3c.put_object(Bucket=locked, Key="held", Body=b"h", ObjectLockLegalHoldStatus="ON")
    got = s3c.head_object(Bucket=locked, Key="held")
    assert got["ObjectLockLegalHoldStatus"] == "ON" and "ObjectLockMode" not in got
    _fails(s3c.get_object_retention, 404, "NoSuchObjectLockConfiguration", Bucket=locked, Key="held")


@pytest.mark.parametrize(("headers", "message"), [
    ({"x-amz-object-lock-mode": "abc", "x-amz-object-lock-retain-until-date": "abc"}, "ISO 8601"),
    ({"x-amz-object-lock-mode": "abc", "x-amz-object-lock-retain-until-date": "2020-01-01T00:00:00Z"},
     "must be in the future"),
    ({"x-amz-object-lock-mode": "GOVERNANCE"}, "must both be supplied"),
    ({"x-amz-object-lock-retain-until-date": "2099-01-01T00:00:00Z"}, "must both be supplied"),
    ({"x-amz-object-lock-mode": "abc", "x-amz-object-lock-retain-until-date": "2099-01-01T00:00:00Z"},
     "Unknown wormMode directive"),
    ({"x-amz-object-lock-legal-hold": "wrong"}, "Legal Hold must be either of"),
])
@pytest.mark.parametrize("lock", [True, False])
def test_bad_lock_headers_are_invalid_argument(raw, s3c, s3_node, bkt, code_of, headers, message, lock):
    """Source: "PutObject" and "CreateMultipartUpload" (x-amz-object-lock-*: an ISO 8601
    date in the future, a mode, both or neither; legal hold ON or OFF) and "Error
    responses" (InvalidArgument), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    bucket = bkt
    if lock:
        bucket = f"lock-{uuid.uuid4().hex[:10]}"
        s3c.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    key = f"bad-{uuid.uuid4().hex[:6]}"
    all_headers = {**headers, "Content-MD5": _md5(b"x")}
    for method, path, body in (("PUT", f"/{bucket}/{key}", b"x"), ("POST", f"/{bucket}/{key}?uploads", b"")):
        resp = raw.request(method, path, body=body, headers=all_headers)
        assert resp.status == 400 and code_of(resp.body) == "InvalidArgument", resp.body
        assert message.encode() in resp.body
    s3_node.engine.put_object(bucket, "src", b"s")
    resp = raw.request("PUT", f"/{bucket}/{key}", headers={**headers, "x-amz-copy-source": f"/{bucket}/src"})
    assert resp.status == 400 and code_of(resp.body) == "InvalidArgument"
    _fails(s3c.head_object, 404, "404", Bucket=bucket, Key=key)
    assert s3c.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_lock_headers_on_a_bucket_without_lock(s3c, bkt):
    """Source: "PutObject" (object lock settings need a bucket with object lock: 400
    InvalidRequest "Bucket is missing Object Lock Configuration"), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    key = f"nolock-{uuid.uuid4().hex[:6]}"
    s3c.put_object(Bucket=bkt, Key="src", Body=b"s")
    lock = {"ObjectLockMode": "GOVERNANCE", "ObjectLockRetainUntilDate": _later()}
    missing = "Bucket is missing Object Lock Configuration"
    for kwargs in (lock, {"ObjectLockLegalHoldStatus": "ON"}, {"ObjectLockLegalHoldStatus": "OFF"}):
        _fails(s3c.put_object, 400, "InvalidRequest", missing, Bucket=bkt, Key=key, Body=b"x", **kwargs)
        _fails(s3c.create_multipart_upload, 400, "InvalidRequest", missing, Bucket=bkt, Key=key, **kwargs)
        _fails(s3c.copy_object, 400, "InvalidRequest", missing, Bucket=bkt, Key=key,
               CopySource={"Bucket": bkt, "Key": "src"}, **kwargs)
    _fails(s3c.head_object, 404, "404", Bucket=bkt, Key=key)
    assert not [u for u in s3c.list_multipart_uploads(Bucket=bkt).get("Uploads", []) if u["Key"] == key]


def test_event_hold_headers_are_not_implemented(raw, locked, code_of):
    """Source: "PutObject" (x-amz-object-lock-event-hold) and "Error responses" (501
    NotImplemented for a header naming functionality not implemented), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    resp = raw.request("PUT", f"/{locked}/e", body=b"x", headers={"x-amz-object-lock-event-hold": "ON",
                                                                  "Content-MD5": _md5(b"x")})
    assert resp.status == 501 and code_of(resp.body) == "NotImplemented" and b"event hold" in resp.body


def test_lock_uploads_need_content_md5_or_a_checksum(raw, s3c, s3_node, locked, code_of):
    """Source: "PutObject" and "UploadPart" (Content-MD5 or a checksum is required to
    upload an object with a retention period configured using Object Lock), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    s3c.put_object_lock_configuration(Bucket=locked, ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}})
    resp = raw.request("PUT", f"/{locked}/nomd5", body=b"data")
    assert resp.status == 400 and code_of(resp.body) == "InvalidRequest"
    assert b"is required for Put Object requests with Object Lock parameters" in resp.body
    uid = s3c.create_multipart_upload(Bucket=locked, Key="nomd5")["UploadId"]
    resp = raw.request("PUT", f"/{locked}/nomd5?uploadId={uid}&partNumber=1", body=b"data")
    assert resp.status == 400 and code_of(resp.body) == "InvalidRequest"
    _fails(s3c.head_object, 404, "404", Bucket=locked, Key="nomd5")
    assert raw.request("PUT", f"/{locked}/md5", body=b"data", headers={"Content-MD5": _md5(b"data")}).status == 200
    assert s3_node.engine.head_object(locked, "md5").lock_mode == "GOVERNANCE"
    # a bucket with object lock and no default retention: only writes naming lock settings need one
    other = f"lock-{uuid.uuid4().hex[:10]}"
    s3c.create_bucket(Bucket=other, ObjectLockEnabledForBucket=True)
    assert raw.request("PUT", f"/{other}/plain", body=b"data").status == 200
    resp = raw.request("PUT", f"/{other}/held", body=b"data", headers={"x-amz-object-lock-legal-hold": "ON"})
    assert resp.status == 400 and code_of(resp.body) == "InvalidRequest" and b"Content-MD5" in resp.body


def test_create_multipart_and_copy_with_lock_headers(s3c, locked, bkt):
    """Source: "CreateMultipartUpload" and "CopyObject" (x-amz-object-lock-*; a copy does
    not carry the source's lock), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CopyObject.html"""
    until = _later(2)
    uid = s3c.create_multipart_upload(Bucket=locked, Key="mp", ObjectLockMode="GOVERNANCE",
                                      ObjectLockRetainUntilDate=until, ObjectLockLegalHoldStatus="ON")["UploadId"]
    part = s3c.upload_part(Bucket=locked, Key="mp", UploadId=uid, PartNumber=1, Body=b"part")
    s3c.complete_multipart_upload(Bucket=locked, Key="mp", UploadId=uid,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    got = s3c.head_object(Bucket=locked, Key="mp")
    assert (got["ObjectLockMode"], got["ObjectLockRetainUntilDate"], got["ObjectLockLegalHoldStatus"]) == \
        ("GOVERNANCE", until, "ON")
    s3c.copy_object(Bucket=locked, Key="c", CopySource={"Bucket": locked, "Key": "mp"},
                    ObjectLockMode="COMPLIANCE", ObjectLockRetainUntilDate=until)
    got = s3c.head_object(Bucket=locked, Key="c")
    assert (got["ObjectLockMode"], got["ObjectLockRetainUntilDate"]) == ("COMPLIANCE", until)
    assert "ObjectLockLegalHoldStatus" not in got
    s3c.copy_object(Bucket=bkt, Key="from-locked", CopySource={"Bucket": locked, "Key": "mp"})
    got = s3c.head_object(Bucket=bkt, Key="from-locked")
    assert "ObjectLockMode" not in got and "ObjectLockLegalHoldStatus" not in got


# retention and legal hold --------------------------------------------------------------
def test_retention_can_be_extended_and_weakened_only_with_bypass(s3c, locked):
    """Source: "PutObjectRetention" (x-amz-bypass-governance-retention) and "Locking
    objects with Object Lock" (GOVERNANCE retention is shortened or removed only with the
    bypass; COMPLIANCE can only be extended), https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock.html"""
    s3c.put_object(Bucket=locked, Key="k", Body=b"x")
    d1, d2, d3 = _later(1), _later(2), _later(3)
    s3c.put_object_retention(Bucket=locked, Key="k", Retention={"Mode": "GOVERNANCE", "RetainUntilDate": d2})
    assert s3c.get_object_retention(Bucket=locked, Key="k")["Retention"] == \
        {"Mode": "GOVERNANCE", "RetainUntilDate": d2}
    s3c.put_object_retention(Bucket=locked, Key="k", Retention={"Mode": "GOVERNANCE", "RetainUntilDate": d3})
    _fails(s3c.put_object_retention, 403, "AccessDenied", Bucket=locked, Key="k",
           Retention={"Mode": "GOVERNANCE", "RetainUntilDate": d1})
    assert s3c.get_object_retention(Bucket=locked, Key="k")["Retention"]["RetainUntilDate"] == d3
    s3c.put_object_retention(Bucket=locked, Key="k", Retention={"Mode": "GOVERNANCE", "RetainUntilDate": d1},
                             BypassGovernanceRetention=True)
    assert s3c.get_object_retention(Bucket=locked, Key="k")["Retention"]["RetainUntilDate"] == d1
    s3c.put_object_retention(Bucket=locked, Key="k", Retention={"Mode": "COMPLIANCE", "RetainUntilDate": d2})
    for mode, date in (("COMPLIANCE", d1), ("GOVERNANCE", d3)):
        _fails(s3c.put_object_retention, 403, "AccessDenied", Bucket=locked, Key="k",
               Retention={"Mode": mode, "RetainUntilDate": date}, BypassGovernanceRetention=True)
    s3c.put_object_retention(Bucket=locked, Key="k", Retention={"Mode": "COMPLIANCE", "RetainUntilDate": d3})
    assert s3c.get_object_retention(Bucket=locked, Key="k")["Retention"] == \
        {"Mode": "COMPLIANCE", "RetainUntilDate": d3}


def test_empty_retention_removes_governance_with_bypass(raw, s3c, locked, code_of):
    """Source: "PutObjectRetention" (GOVERNANCE retention is removed only with
    x-amz-bypass-governance-retention), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectRetention.html"""
    s3c.put_object(Bucket=locked, Key="k", Body=b"x", ObjectLockMode="GOVERNANCE",
                   ObjectLockRetainUntilDate=_later())
    body = b"<Retention/>"
    resp = raw.request("PUT", f"/{locked}/k?retention", body=body, headers={"Content-MD5": _md5(body)})
    assert resp.status == 403 and code_of(resp.body) == "AccessDenied"
    resp = raw.request("PUT", f"/{locked}/k?retention", body=body,
                       headers={"Content-MD5": _md5(body), "x-amz-bypass-governance-retention": "true"})
    assert resp.status == 200, resp.body
    _fails(s3c.get_object_retention, 404, "NoSuchObjectLockConfiguration", Bucket=locked, Key="k")
    assert "ObjectLockMode" not in s3c.head_object(Bucket=locked, Key="k")


def test_retention_errors_change_nothing(raw, s3c, locked, bkt, code_of):
    """Source: "PutObjectRetention", "GetObjectRetention" and "Error responses" (a date not
    in the future: InvalidArgument; an unknown mode: MalformedXML; a bucket without object
    lock: InvalidRequest; a version with no retention: NoSuchObjectLockConfiguration),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectRetention.html"""
    s3c.put_object(Bucket=locked, Key="k", Body=b"x")
    past = datetime(2020, 1, 1, tzinfo=UTC)
    _fails(s3c.put_object_retention, 400, "InvalidArgument", "must be in the future", Bucket=locked, Key="k",
           Retention={"Mode": "GOVERNANCE", "RetainUntilDate": past})
    for mode in ("invalid", "governance"):
        _fails(s3c.put_object_retention, 400, "MalformedXML", Bucket=locked, Key="k",
               Retention={"Mode": mode, "RetainUntilDate": _later()})
    for body in (b"<Retention><Mode>GOVERNANCE</Mode></Retention>",
                 b"<Retention><Mode>GOVERNANCE</Mode><RetainUntilDate>soon</RetainUntilDate></Retention>",
                 b"<Other/>", b"<Retention><Mode>GOVERNANCE</Mode>"):
        resp = raw.request("PUT", f"/{locked}/k?retention", body=body, headers={"Content-MD5": _md5(body)})
        assert resp.status == 400 and code_of(resp.body) == "MalformedXML", body
    _fails(s3c.get_object_retention, 404, "NoSuchObjectLockConfiguration", Bucket=locked, Key="k")
    _fails(s3c.put_object_retention, 404, "NoSuchKey", Bucket=locked, Key="missing",
           Retention={"Mode": "GOVERNANCE", "RetainUntilDate": _later()})
    _fails(s3c.get_object_retention, 404, "NoSuchKey", Bucket=locked, Key="missing")
    s3c.put_object(Bucket=bkt, Key="k", Body=b"x")
    missing = "Bucket is missing Object Lock Configuration"
    _fails(s3c.put_object_retention, 400, "InvalidRequest", missing, Bucket=bkt, Key="k",
           Retention={"Mode": "GOVERNANCE", "RetainUntilDate": _later()})
    _fails(s3c.get_object_retention, 400, "InvalidRequest", missing, Bucket=bkt, Key="k")
    assert "ObjectLockMode" not in s3c.head_object(Bucket=locked, Key="k")


def test_legal_hold_on_and_off(s3c, locked, bkt):
    """Source: "PutObjectLegalHold" and "GetObjectLegalHold" (Status ON or OFF; anything
    else is MalformedXML; a bucket without object lock is InvalidRequest), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLegalHold.html"""
    s3c.put_object(Bucket=locked, Key="k", Body=b"x")
    assert s3c.get_object_legal_hold(Bucket=locked, Key="k")["LegalHold"] == {"Status": "OFF"}
    s3c.put_object_legal_hold(Bucket=locked, Key="k", LegalHold={"Status": "ON"})
    assert s3c.get_object_legal_hold(Bucket=locked, Key="k")["LegalHold"] == {"Status": "ON"}
    assert s3c.head_object(Bucket=locked, Key="k")["ObjectLockLegalHoldStatus"] == "ON"
    _fails(s3c.put_object_legal_hold, 400, "MalformedXML", Bucket=locked, Key="k", LegalHold={"Status": "abc"})
    assert s3c.get_object_legal_hold(Bucket=locked, Key="k")["LegalHold"] == {"Status": "ON"}
    s3c.put_object_legal_hold(Bucket=locked, Key="k", LegalHold={"Status": "OFF"})
    assert s3c.get_object_legal_hold(Bucket=locked, Key="k")["LegalHold"] == {"Status": "OFF"}
    _fails(s3c.put_object_legal_hold, 404, "NoSuchKey", Bucket=locked, Key="missing", LegalHold={"Status": "ON"})
    s3c.put_object(Bucket=bkt, Key="k", Body=b"x")
    missing = "Bucket is missing Object Lock Configuration"
    _fails(s3c.put_object_legal_hold, 400, "InvalidRequest", missing, Bucket=bkt, Key="k", LegalHold={"Status": "ON"})
    _fails(s3c.get_object_legal_hold, 400, "InvalidRequest", missing, Bucket=bkt, Key="k")


def test_retention_and_legal_hold_of_one_version(s3c, s3_node, locked):
    """Source: "PutObjectRetention", "GetObjectRetention", "PutObjectLegalHold",
    "GetObjectLegalHold" (versionId names the version; without it, the current one),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectRetention.html"""
    s3c.put_object(Bucket=locked, Key="k", Body=b"old")
    old = _version(s3_node, locked, "k")
    s3c.put_object(Bucket=locked, Key="k", Body=b"new")
    until = _later()
    s3c.put_object_retention(Bucket=locked, Key="k", VersionId=old,
                             Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until})
    s3c.put_object_legal_hold(Bucket=locked, Key="k", VersionId=old, LegalHold={"Status": "ON"})
    assert s3c.get_object_retention(Bucket=locked, Key="k", VersionId=old)["Retention"]["RetainUntilDate"] == until
    assert s3c.get_object_legal_hold(Bucket=locked, Key="k", VersionId=old)["LegalHold"] == {"Status": "ON"}
    _fails(s3c.get_object_retention, 404, "NoSuchObjectLockConfiguration", Bucket=locked, Key="k")
    assert s3c.get_object_legal_hold(Bucket=locked, Key="k")["LegalHold"] == {"Status": "OFF"}
    _fails(s3c.get_object_retention, 404, "NoSuchVersion", Bucket=locked, Key="k", VersionId="0" * 32)
    _fails(s3c.put_object_legal_hold, 400, "InvalidArgument", "Invalid version id", Bucket=locked, Key="k",
           VersionId="not-a-version", LegalHold={"Status": "ON"})


# what locked versions survive --------------------------------------------------------------
def test_locked_versions_survive_deletes_and_overwrites(s3c, s3_node, locked):
    """Source: "Locking objects with Object Lock" (a delete without a version id only adds
    a delete marker; a locked version stays) and "DeleteBucket" (409 BucketNotEmpty),
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock.html"""
    s3c.put_object(Bucket=locked, Key="k", Body=b"kept", ObjectLockMode="COMPLIANCE",
                   ObjectLockRetainUntilDate=_later())
    kept = _version(s3_node, locked, "k")
    s3c.put_object(Bucket=locked, Key="k", Body=b"newer")
    assert s3c.get_object(Bucket=locked, Key="k")["Body"].read() == b"newer"
    assert s3c.delete_object(Bucket=locked, Key="k", BypassGovernanceRetention=True)[
        "ResponseMetadata"]["HTTPStatusCode"] == 204
    _fails(s3c.get_object, 404, "NoSuchKey", Bucket=locked, Key="k")
    versions = s3_node.engine.list_object_versions(locked).versions
    assert kept in {v.version_id for v in versions if not v.delete_marker}
    _fails(s3c.delete_bucket, 409, "BucketNotEmpty", Bucket=locked)
