"""Directory buckets over the fast path: read and written like any bucket, and
what the fast path writes is what S3 (stock boto3, with CreateSession) reads.

Source: "Directory buckets", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/directory-buckets-overview.html
"""

from __future__ import annotations

import uuid

import pytest

from gpufeed.client import Client
from gpufeed.errors import InvalidBucketName


def _name() -> str:
    return f"w{uuid.uuid4().hex[:10]}--use1-az4--x-s3"


@pytest.fixture(params=["tcp", "shm"])
def client(request, node):
    with Client(node.tcp_url if request.param == "tcp" else node.shm_url) as c:
        yield c


def test_fast_path_reads_and_writes_a_directory_bucket(client, node):
    b = _name()
    client.create_bucket(b, kind="directory")
    client.put(b, "dir/a", b"alpha")
    client.put(b, "dir/sub/b", b"beta")
    assert bytes(client.get(b, "dir/a")) == b"alpha"
    assert [e.key for e in client.list(b, prefix="dir/")] == ["dir/a", "dir/sub/b"]
    s3 = node.boto3_client()
    try:
        assert s3.get_object(Bucket=b, Key="dir/sub/b")["Body"].read() == b"beta"
        s3.put_object(Bucket=b, Key="dir/c", Body=b"gamma")
        listing = s3.list_objects_v2(Bucket=b, Prefix="dir/", Delimiter="/")
        assert [o["Key"] for o in listing["Contents"]] == ["dir/a", "dir/c"]
        assert [p["Prefix"] for p in listing["CommonPrefixes"]] == ["dir/sub/"]
    finally:
        s3.close()
    assert bytes(client.get(b, "dir/c")) == b"gamma"
    assert client.bucket_stats(b)["kind"] == "directory"


def test_fast_path_directory_bucket_names_are_checked(client):
    with pytest.raises(InvalidBucketName):
        client.create_bucket("not-a-directory-name", kind="directory")
    with pytest.raises(InvalidBucketName):
        client.create_bucket(_name())  # a standard bucket may not end in --x-s3
