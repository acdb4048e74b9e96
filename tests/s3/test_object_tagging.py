"""S3 object tagging through the S3 front: Put/Get/DeleteObjectTagging, the
x-amz-tagging header of uploads and copies, x-amz-tagging-directive,
x-amz-tagging-count, the POST Object tagging field, and S3's limits. boto3
against the in-process node; raw signed requests where boto3 cannot send the
input. Each test names the AWS page it follows."""

from __future__ import annotations

import base64
import hashlib
import uuid

import pytest
from botocore.exceptions import ClientError
from multidict import CIMultiDict

from gpufeed.errors import MethodNotAllowed
from gpufeed.s3 import _router as r


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def _fails(call, status: int, code: str, message: str | None = None, **kwargs) -> None:
    with pytest.raises(ClientError) as ei:
        call(**kwargs)
    assert _err(ei.value) == (status, code), ei.value.response
    if message is not None:
        assert message in ei.value.response["Error"]["Message"]


def _tag_set(tags: dict[str, str]) -> dict:
    return {"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]}


def _tags(s3c, bucket: str, key: str, **kwargs) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in s3c.get_object_tagging(Bucket=bucket, Key=key, **kwargs)["TagSet"]}


def _md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


@pytest.fixture
def key() -> str:
    return f"tag-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(("method", "expected"), [
    ("PUT", r.PutObjectTagging("b", "k")),
    ("GET", r.GetObjectTagging("b", "k")),
    ("HEAD", r.GetObjectTagging("b", "k")),
    ("DELETE", r.DeleteObjectTagging("b", "k")),
])
def test_tagging_routes(method, expected):
    """Source: the request lines of "PutObjectTagging", "GetObjectTagging" and
    "DeleteObjectTagging", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectTagging.html"""
    ep = r.route(r.parse_target(method, "/b/k?tagging&versionId=null", CIMultiDict({"Host": "127.0.0.1:9000"})))
    assert ep == expected and type(ep) is type(expected)
    with pytest.raises(MethodNotAllowed):
        r.route(r.parse_target("POST", "/b/k?tagging", CIMultiDict({"Host": "127.0.0.1:9000"})))


def test_put_get_delete_object_tagging(s3c, bkt, key):
    """Source: "PutObjectTagging", "GetObjectTagging" (an object without tags answers an
    empty TagSet), "DeleteObjectTagging" (204) and "GetObject"/"HeadObject"
    (x-amz-tagging-count), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObjectTagging.html"""
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x")
    assert s3c.get_object_tagging(Bucket=bkt, Key=key)["TagSet"] == []
    assert "TagCount" not in s3c.get_object(Bucket=bkt, Key=key)
    tags = {"project": "gpufeed", "team": "storage + io", "empty": ""}
    s3c.put_object_tagging(Bucket=bkt, Key=key, Tagging=_tag_set(tags))
    assert _tags(s3c, bkt, key) == tags
    assert s3c.get_object(Bucket=bkt, Key=key)["TagCount"] == 3
    assert s3c.head_object(Bucket=bkt, Key=key)["TagCount"] == 3
    s3c.put_object_tagging(Bucket=bkt, Key=key, Tagging=_tag_set({"only": "one"}))
    assert _tags(s3c, bkt, key) == {"only": "one"}
    resp = s3c.delete_object_tagging(Bucket=bkt, Key=key)
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert s3c.get_object_tagging(Bucket=bkt, Key=key)["TagSet"] == []
    assert s3c.get_object(Bucket=bkt, Key=key)["Body"].read() == b"x"  # the data is untouched


def test_tagging_a_missing_object(s3c, bkt):
    """Source: "PutObjectTagging" / "GetObjectTagging" (NoSuchKey, NoSuchBucket), Amazon
    S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    for call, extra in ((s3c.get_object_tagging, {}), (s3c.delete_object_tagging, {}),
                        (s3c.put_object_tagging, {"Tagging": _tag_set({"a": "b"})})):
        _fails(call, 404, "NoSuchKey", Bucket=bkt, Key="no-such-key", **extra)
        _fails(call, 404, "NoSuchBucket", Bucket=f"none-{uuid.uuid4().hex[:8]}", Key="k", **extra)


@pytest.mark.parametrize(("tags", "message"), [
    ({f"k{i}": "v" for i in range(11)}, "Object tags cannot be greater than 10"),
    ({"k" * 129: "v"}, "TagKey you have provided is too long"),
    ({"k": "v" * 257}, "TagValue you have provided is too long"),
    ({"aws:reserved": "v"}, "aws:"),
    ({"bad<key>": "v"}, "TagKey you have provided is invalid"),
])
def test_tag_sets_over_the_limits_are_invalid_tag(s3c, bkt, key, tags, message):
    """Source: "PutObjectTagging" and "Categorizing your storage using tags" (up to 10
    tags per object; keys up to 128 characters, values up to 256; no aws: prefix; answered
    400 InvalidTag), https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-tagging.html"""
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x")
    s3c.put_object_tagging(Bucket=bkt, Key=key, Tagging=_tag_set({"keep": "me"}))
    _fails(s3c.put_object_tagging, 400, "InvalidTag", message, Bucket=bkt, Key=key, Tagging=_tag_set(tags))
    assert _tags(s3c, bkt, key) == {"keep": "me"}
    header = "&".join(f"{k}={v}" for k, v in tags.items())
    _fails(s3c.put_object, 400, "InvalidTag", message, Bucket=bkt, Key=key + "-new", Body=b"x", Tagging=header)
    _fails(s3c.create_multipart_upload, 400, "InvalidTag", message, Bucket=bkt, Key=key + "-new", Tagging=header)
    _fails(s3c.head_object, 404, "404", Bucket=bkt, Key=key + "-new")


def test_tag_sets_at_the_limits_are_accepted(s3c, bkt, key):
    """Source: "Categorizing your storage using tags" (10 tags, 128-character keys,
    256-character values), https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-tagging.html"""
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x")
    tags = {f"{i}" + "k" * 127: "v" * 256 for i in range(10)}
    s3c.put_object_tagging(Bucket=bkt, Key=key, Tagging=_tag_set(tags))
    assert _tags(s3c, bkt, key) == tags


@pytest.mark.parametrize(("body", "code"), [
    (b"<Tagging><TagSet><Tag><Key>a</Key><Value>1</Value></Tag><Tag><Key>a</Key><Value>2</Value></Tag>"
     b"</TagSet></Tagging>", "InvalidTag"),
    (b"<Tagging><TagSet><Tag><Key>a</Key></Tag></TagSet></Tagging>", "MalformedXML"),
    (b"<Tagging><TagSet><Tag><Key>a</Key><Value>1</Value><Extra/></Tag></TagSet></Tagging>", "MalformedXML"),
    (b"<Tagging><Other/></Tagging>", "MalformedXML"),
    (b"<Tags><TagSet/></Tags>", "MalformedXML"),
    (b"<Tagging><TagSet>", "MalformedXML"),
    (b"", "MalformedXML"),
])
def test_bad_tagging_documents_change_nothing(raw, s3c, bkt, key, code_of, body, code):
    """Source: "PutObjectTagging" and "Error responses" (MalformedXML; InvalidTag "Cannot
    provide multiple Tags with the same key"), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectTagging.html"""
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x", Tagging="keep=me")
    resp = raw.request("PUT", f"/{bkt}/{key}?tagging", body=body, headers={"Content-MD5": _md5(body)})
    assert resp.status == 400 and code_of(resp.body) == code, resp.body
    if code == "InvalidTag":
        assert b"Cannot provide multiple Tags with the same key" in resp.body
    assert _tags(s3c, bkt, key) == {"keep": "me"}


def test_put_object_tagging_needs_content_md5_or_a_checksum(raw, s3c, bkt, key, code_of):
    """Source: "PutObjectTagging" (Content-MD5 or an x-amz-checksum header is required),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectTagging.html"""
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x")
    body = b"<Tagging><TagSet><Tag><Key>a</Key><Value>1</Value></Tag></TagSet></Tagging>"
    resp = raw.request("PUT", f"/{bkt}/{key}?tagging", body=body)
    assert resp.status == 400 and code_of(resp.body) == "InvalidRequest"
    assert s3c.get_object_tagging(Bucket=bkt, Key=key)["TagSet"] == []
    assert raw.request("PUT", f"/{bkt}/{key}?tagging", body=body, headers={"Content-MD5": _md5(body)}).status == 200
    assert _tags(s3c, bkt, key) == {"a": "1"}


def test_x_amz_tagging_on_put_and_multipart(s3c, bkt, key):
    """Source: "PutObject" and "CreateMultipartUpload" (x-amz-tagging: the tag set encoded
    as URL query parameters), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x", Tagging="a=1&two%20words=x%2By&plus=a+b&novalue")
    assert _tags(s3c, bkt, key) == {"a": "1", "two words": "x+y", "plus": "a b", "novalue": ""}
    uid = s3c.create_multipart_upload(Bucket=bkt, Key=key + "-mp", Tagging="m=p")["UploadId"]
    part = s3c.upload_part(Bucket=bkt, Key=key + "-mp", UploadId=uid, PartNumber=1, Body=b"part")
    s3c.complete_multipart_upload(Bucket=bkt, Key=key + "-mp", UploadId=uid,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert _tags(s3c, bkt, key + "-mp") == {"m": "p"}
    assert s3c.get_object(Bucket=bkt, Key=key + "-mp")["TagCount"] == 1


def test_bad_x_amz_tagging_header_is_invalid_argument(raw, s3c, bkt, key, code_of):
    """Source: "PutObject" (x-amz-tagging is UTF-8, URL-encoded query parameters without
    duplicate names; otherwise 400 InvalidArgument), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html"""
    for value in ("a=1&a=2", "a=%FF"):
        _fails(s3c.put_object, 400, "InvalidArgument", "x-amz-tagging", Bucket=bkt, Key=key, Body=b"x",
               Tagging=value)
        _fails(s3c.create_multipart_upload, 400, "InvalidArgument", Bucket=bkt, Key=key, Tagging=value)
    _fails(s3c.head_object, 404, "404", Bucket=bkt, Key=key)


def test_copy_tagging_directive(s3c, bkt, key):
    """Source: "CopyObject" (x-amz-tagging-directive: COPY, the default, keeps the
    source's tags; REPLACE takes x-amz-tagging; anything else is InvalidArgument), Amazon
    S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CopyObject.html"""
    s3c.put_object(Bucket=bkt, Key=key, Body=b"x", Tagging="src=1&b=2")
    src = {"Bucket": bkt, "Key": key}
    s3c.copy_object(Bucket=bkt, Key=key + "-copy", CopySource=src)
    assert _tags(s3c, bkt, key + "-copy") == {"src": "1", "b": "2"}
    s3c.copy_object(Bucket=bkt, Key=key + "-copy", CopySource=src, TaggingDirective="COPY", Tagging="ignored=1")
    assert _tags(s3c, bkt, key + "-copy") == {"src": "1", "b": "2"}
    s3c.copy_object(Bucket=bkt, Key=key + "-replace", CopySource=src, TaggingDirective="REPLACE", Tagging="new=1")
    assert _tags(s3c, bkt, key + "-replace") == {"new": "1"}
    s3c.copy_object(Bucket=bkt, Key=key + "-none", CopySource=src, TaggingDirective="REPLACE")
    assert s3c.get_object_tagging(Bucket=bkt, Key=key + "-none")["TagSet"] == []
    _fails(s3c.copy_object, 400, "InvalidArgument", "Unknown tagging directive", Bucket=bkt, Key=key + "-bad",
           CopySource=src, TaggingDirective="MOVE")
    _fails(s3c.copy_object, 400, "InvalidTag", Bucket=bkt, Key=key + "-bad", CopySource=src,
           TaggingDirective="REPLACE", Tagging="aws:x=1")
    _fails(s3c.head_object, 404, "404", Bucket=bkt, Key=key + "-bad")


def test_tags_of_one_version(s3c, s3_node):
    """Source: "PutObjectTagging", "GetObjectTagging", "DeleteObjectTagging" (versionId
    names the version; without it, the current one; x-amz-version-id answers it), Amazon
    S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectTagging.html"""
    bucket = f"ver-{uuid.uuid4().hex[:8]}"
    s3c.create_bucket(Bucket=bucket)
    s3_node.engine.put_bucket_versioning(bucket, "Enabled")
    s3c.put_object(Bucket=bucket, Key="k", Body=b"old", Tagging="gen=old")
    old = s3_node.engine.head_object(bucket, "k").version_id
    s3c.put_object(Bucket=bucket, Key="k", Body=b"new", Tagging="gen=new")
    assert _tags(s3c, bucket, "k") == {"gen": "new"}
    assert _tags(s3c, bucket, "k", VersionId=old) == {"gen": "old"}
    resp = s3c.put_object_tagging(Bucket=bucket, Key="k", VersionId=old, Tagging=_tag_set({"gen": "first"}))
    assert resp["VersionId"] == old
    assert _tags(s3c, bucket, "k", VersionId=old) == {"gen": "first"}
    assert s3c.delete_object_tagging(Bucket=bucket, Key="k", VersionId=old)["VersionId"] == old
    assert _tags(s3c, bucket, "k", VersionId=old) == {}
    assert _tags(s3c, bucket, "k") == {"gen": "new"}
    _fails(s3c.get_object_tagging, 404, "NoSuchVersion", Bucket=bucket, Key="k", VersionId="0" * 32)
    _fails(s3c.get_object_tagging, 400, "InvalidArgument", Bucket=bucket, Key="k", VersionId="bad")


def test_tags_of_a_locked_version_can_change(s3c):
    """Source: "Locking objects with Object Lock" (object lock protects a version's data,
    not its tags: PutObjectTagging works on a locked version),
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock.html"""
    bucket = f"lock-{uuid.uuid4().hex[:10]}"
    s3c.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    s3c.put_object(Bucket=bucket, Key="k", Body=b"x", ObjectLockLegalHoldStatus="ON", Tagging="a=1")
    s3c.put_object_tagging(Bucket=bucket, Key="k", Tagging=_tag_set({"a": "2"}))
    assert _tags(s3c, bucket, "k") == {"a": "2"}
    assert s3c.get_object_legal_hold(Bucket=bucket, Key="k")["LegalHold"] == {"Status": "ON"}


def _form_post(url: str, fields: dict, file: bytes) -> tuple[int, bytes]:
    """POST a multipart/form-data upload (as a browser form does); ``(status, body)``."""
    import urllib.error
    import urllib.request

    boundary = uuid.uuid4().hex
    body = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
                    for k, v in fields.items())
    body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n").encode()
    body += file + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_post_object_tagging_field(s3_node, s3c, bkt, key, code_of):
    """Source: "POST Object" (the tagging form field is a Tagging XML document), Amazon S3
    API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/RESTObjectPOST.html"""
    c = s3_node.client(signature_version="s3v4")
    good = "<Tagging><TagSet><Tag><Key>form</Key><Value>yes</Value></Tag></TagSet></Tagging>"
    for tagging, status, code in ((good, 204, None), ("<Tagging><TagSet>", 400, "MalformedXML"),
                                  (good.replace("form", "aws:form"), 400, "InvalidTag")):
        name = f"{key}-{status}-{code}"
        post = c.generate_presigned_post(bkt, name, Fields={"tagging": tagging},
                                         Conditions=[{"tagging": tagging}], ExpiresIn=300)
        got, body = _form_post(post["url"], post["fields"], b"form data")
        assert got == status, body
        if code is None:
            assert _tags(s3c, bkt, name) == {"form": "yes"}
        else:
            assert code_of(body) == code
            _fails(s3c.head_object, 404, "404", Bucket=bkt, Key=name)
    c.close()
