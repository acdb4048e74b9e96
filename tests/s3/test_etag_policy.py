"""The per-bucket ETag policy over S3 (gpufeed's ``x-gpufeed-etag-policy``
CreateBucket header): ``none`` skips hashing object data on write.

S3 answers followed where they apply: "PutObject" (Content-MD5 is checked:
400 BadDigest), https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html
"""

from __future__ import annotations

import base64
import hashlib

import pytest
from botocore.exceptions import ClientError


def test_etag_policy_through_s3(s3):
    """CreateBucket with x-gpufeed-etag-policy: none answers ETags that are not MD5
    (n + the version's id), still checks Content-MD5, and boto3 reads the objects back."""
    def header(request, **_):
        request.headers["x-gpufeed-etag-policy"] = "none"

    s3.meta.events.register("before-sign.s3.CreateBucket", header)
    s3.create_bucket(Bucket="no-hash")
    s3.meta.events.unregister("before-sign.s3.CreateBucket", header)
    data = b"x" * 100_000
    etag = s3.put_object(Bucket="no-hash", Key="k", Body=data)["ETag"].strip('"')
    assert etag.startswith("n") and len(etag) == 33 and etag[1:] != hashlib.md5(data).hexdigest()
    assert s3.get_object(Bucket="no-hash", Key="k")["Body"].read() == data
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket="no-hash", Key="bad", Body=data, ContentMD5=base64.b64encode(b"0" * 16).decode())
    assert exc.value.response["Error"]["Code"] == "BadDigest"


def test_a_copy_takes_the_destination_policy(s3):
    """Copying from a none bucket into an md5 bucket answers the MD5 of the bytes; two
    copies inside a none bucket get ETags of their own."""
    def make(name, policy):
        def header(request, **_):
            request.headers["x-gpufeed-etag-policy"] = policy
        s3.meta.events.register("before-sign.s3.CreateBucket", header)
        try:
            s3.create_bucket(Bucket=name)
        finally:
            s3.meta.events.unregister("before-sign.s3.CreateBucket", header)

    make("copy-src-none", "none")
    make("copy-dst-md5", "md5")
    data = b"copied bytes" * 1000
    s3.put_object(Bucket="copy-src-none", Key="k", Body=data)
    src = {"Bucket": "copy-src-none", "Key": "k"}
    got = s3.copy_object(Bucket="copy-dst-md5", Key="c", CopySource=src)["CopyObjectResult"]["ETag"]
    assert got.strip('"') == hashlib.md5(data).hexdigest()
    a = s3.copy_object(Bucket="copy-src-none", Key="a", CopySource=src)["CopyObjectResult"]["ETag"]
    b = s3.copy_object(Bucket="copy-src-none", Key="b", CopySource=src)["CopyObjectResult"]["ETag"]
    assert a != b and a.strip('"').startswith("n")
