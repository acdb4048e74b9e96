"""``gpufeed serve --catalog postgresql://...`` as an operator runs it: boto3 puts,
gets, lists, multipart uploads and versions against it, the node restarted keeps
them, a database outage mid-run answers 503 ServiceUnavailable and ends when the
database returns, a database down at start stops the node with one clear line,
and the SQLite-only commands say so."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from botocore.exceptions import ClientError

from gpufeed.testing.node import start_node

BUCKET = "pgnode"


def _gf(*args, env=None, timeout_s=60):
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout_s)


def _traffic(s3) -> None:
    s3.create_bucket(Bucket=BUCKET)
    for key in ("b", "a/x", "a/\u00e9", "\u30ad"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=key.encode() * 100)
    up = s3.create_multipart_upload(Bucket=BUCKET, Key="big")
    parts = []
    for n in (1, 2):
        r = s3.upload_part(Bucket=BUCKET, Key="big", UploadId=up["UploadId"], PartNumber=n,
                           Body=bytes([n]) * (5 << 20 if n == 1 else 1000))
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    s3.complete_multipart_upload(Bucket=BUCKET, Key="big", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": parts})
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=BUCKET, Key="v", Body=b"one")
    s3.put_object(Bucket=BUCKET, Key="v", Body=b"two")


def _check(s3, *more: str) -> None:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == sorted(["a/x", "a/\u00e9", "b", "big", "v", "\u30ad", *more], key=str.encode)  # S3 order
    assert s3.get_object(Bucket=BUCKET, Key="a/\u00e9")["Body"].read() == "a/\u00e9".encode() * 100
    big = s3.get_object(Bucket=BUCKET, Key="big")
    assert big["ContentLength"] == (5 << 20) + 1000 and big["ETag"].endswith('-2"')
    assert s3.get_object(Bucket=BUCKET, Key="v")["Body"].read() == b"two"
    versions = s3.list_object_versions(Bucket=BUCKET, Prefix="v")["Versions"]
    assert [v["IsLatest"] for v in versions] == [True, False]


@pytest.mark.slow
def test_node_on_postgres_serves_restarts_and_rides_out_an_outage(tmp_path, postgres_server, postgres_url):
    args = ["--catalog", postgres_url]
    node = start_node(tmp_path / "data", extra_args=args)
    try:
        s3 = node.boto3_client()
        _traffic(s3)
        _check(s3)
        once = node.boto3_client(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=60)
        postgres_server.stop()
        try:
            with pytest.raises(ClientError) as err:
                once.put_object(Bucket=BUCKET, Key="during", Body=b"x")
            assert err.value.response["Error"]["Code"] == "ServiceUnavailable"
            assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        finally:
            postgres_server.start()
        s3.put_object(Bucket=BUCKET, Key="after", Body=b"back")  # the pool reconnected
        assert s3.get_object(Bucket=BUCKET, Key="after")["Body"].read() == b"back"
    finally:
        assert node.stop() == 0, node.log_path.read_text()
    node = start_node(tmp_path / "data", extra_args=args)
    try:
        s3 = node.boto3_client()
        _check(s3, "after")
        assert s3.head_object(Bucket=BUCKET, Key="after")["ContentLength"] == 4
    finally:
        assert node.stop() == 0, node.log_path.read_text()
    out = _gf("catalog", "check", "--data-dir", str(tmp_path / "data"))
    assert out.returncode == 1 and "not on PostgreSQL" in out.stderr and "Traceback" not in out.stderr
    local = ["--data-dir", str(tmp_path / "data"), "--catalog", postgres_url]
    out = _gf("admin", *local, "bucket", "stats", BUCKET)
    assert out.returncode == 0, out.stderr
    out = _gf("snapshot", *local, "create", BUCKET, "s1")
    assert out.returncode == 0, out.stderr
    out = _gf("snapshot", *local, "list", BUCKET)
    assert out.returncode == 0 and "s1" in out.stdout, out.stderr
    out = _gf("scrub", *local, "--json")
    assert out.returncode == 0, out.stderr


def test_database_down_at_start_is_one_clear_line(tmp_path, postgres_server):
    url = f"postgresql://gpufeed:hunter2@127.0.0.1:{postgres_server.port + 1}/gpufeed"
    out = _gf("serve", "--data-dir", str(tmp_path / "data"), "--s3-port", "0", "--port", "0", "--socket", "",
              env={"GPUFEED_CATALOG": url})
    assert out.returncode == 1
    assert out.stderr.startswith("error: ServiceUnavailable: the catalog database gpufeed@127.0.0.1:")
    assert "hunter2" not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_unknown_catalog_url_is_refused(tmp_path):
    out = _gf("serve", "--data-dir", str(tmp_path / "data"), "--s3-port", "0", "--port", "0", "--socket", "",
              "--catalog", "mysql://x@y/z")
    assert out.returncode == 1 and "unknown catalog URL 'mysql'" in out.stderr and "Traceback" not in out.stderr
