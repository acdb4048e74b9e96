"""S3 CreateBucket makes standard buckets; the x-gpufeed-* headers make a kv bucket."""

from __future__ import annotations

import uuid

import pytest
from botocore.exceptions import ClientError

from gpufeed.client import Client


def _with_headers(s3, headers: dict[str, str]):
    def add(request, **_kw):
        for name, value in headers.items():
            request.headers[name] = value
    s3.meta.events.register("before-sign.s3.CreateBucket", add)
    return add


def test_plain_create_bucket_is_standard(node, s3):
    b = "s3kv-" + uuid.uuid4().hex[:12]
    s3.create_bucket(Bucket=b)
    with Client(node.tcp_url) as c:
        assert c.bucket_stats(b)["kind"] == "standard"


def test_headers_make_a_kv_bucket_that_evicts(node):
    s3 = node.boto3_client()
    try:
        b = "s3kv-" + uuid.uuid4().hex[:12]
        hook = _with_headers(s3, {"x-gpufeed-bucket-kind": "kv", "x-gpufeed-capacity-bytes": "2048"})
        s3.create_bucket(Bucket=b)
        s3.meta.events.unregister("before-sign.s3.CreateBucket", hook)
        for i in range(5):
            s3.put_object(Bucket=b, Key=f"k{i}", Body=b"x" * 1024)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]]
        assert keys == ["k3", "k4"]
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket=b, Key="big", Body=b"x" * 2049)
        assert exc.value.response["Error"]["Code"] == "EntityTooLarge"
        _with_headers(s3, {"x-gpufeed-bucket-kind": "kv"})  # no limit: refused
        with pytest.raises(ClientError) as exc:
            s3.create_bucket(Bucket="s3kv-" + uuid.uuid4().hex[:12])
        assert exc.value.response["Error"]["Code"] == "InvalidArgument"
    finally:
        s3.close()
