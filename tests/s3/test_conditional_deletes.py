"""Conditional deletes and copies: a condition that does not hold refuses the
request (412) and changes nothing.

Sources: "DeleteObject" (``If-Match``, ``x-amz-if-match-last-modified-time``,
``x-amz-if-match-size``), "DeleteObjects" (``ETag``, ``LastModifiedTime``,
``Size`` per object) and "CopyObject" (``If-Match`` / ``If-None-Match`` on the
destination), Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteObject.html and
https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError


@pytest.fixture
def bucket(s3):
    name = "cond-deletes"
    try:
        s3.create_bucket(Bucket=name)
    except ClientError:
        pass
    return name


def _status(exc) -> tuple[int, str]:
    r = exc.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


def test_delete_if_match_etag_size_and_time(s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"important")["ETag"]
    for kw in ({"IfMatch": '"00000000000000000000000000000000"'}, {"IfMatchSize": 1}):
        with pytest.raises(ClientError) as exc:
            s3.delete_object(Bucket=bucket, Key="k", **kw)
        assert _status(exc) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"important"
    head = s3.head_object(Bucket=bucket, Key="k")
    s3.delete_object(Bucket=bucket, Key="k", IfMatch=etag, IfMatchSize=9,
                     IfMatchLastModifiedTime=head["LastModified"])
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="k")
    s3.delete_object(Bucket=bucket, Key="k", IfMatch=etag)  # no object: 204, nothing to do


def test_delete_objects_with_conditions(s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="a", Body=b"x")["ETag"]
    s3.put_object(Bucket=bucket, Key="b", Body=b"y")
    out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "a", "ETag": etag}, {"Key": "b", "ETag": '"0000"'}]})
    assert [d["Key"] for d in out.get("Deleted", [])] == ["a"]
    assert [(e["Key"], e["Code"]) for e in out["Errors"]] == [("b", "PreconditionFailed")]
    assert s3.get_object(Bucket=bucket, Key="b")["Body"].read() == b"y"


def test_copy_checks_the_destination(s3, bucket):
    s3.put_object(Bucket=bucket, Key="w", Body=b"0123456789")
    s3.put_object(Bucket=bucket, Key="r", Body=b"x")
    src = {"Bucket": bucket, "Key": "r"}
    for kw in ({"IfNoneMatch": "*"}, {"IfMatch": '"0000"'}):
        with pytest.raises(ClientError) as exc:
            s3.copy_object(Bucket=bucket, Key="w", CopySource=src, **kw)
        assert _status(exc) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=bucket, Key="w")["Body"].read() == b"0123456789"
    etag = s3.head_object(Bucket=bucket, Key="w")["ETag"]
    s3.copy_object(Bucket=bucket, Key="w", CopySource=src, IfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="w")["Body"].read() == b"x"
    s3.copy_object(Bucket=bucket, Key="new", CopySource=src, IfNoneMatch="*")
