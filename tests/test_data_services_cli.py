"""The data services from the outside: ``gpufeed admin bucket data``, ``gpufeed
scrub`` (on a running node and on a stopped node's folder), ``gpufeed admin
damaged``, a node's ``--capacity`` (S3 507 StorageFull), and the metrics."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import urllib.request

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from gpufeed.client import Client
from gpufeed.errors import DamagedObject
from gpufeed.testing.node import flip_bits, start_node


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})



@pytest.fixture
def node(tmp_path):
    n = start_node(tmp_path / "data", extra_args=["--metrics-port", "0"])
    yield n
    assert n.stop() == 0, n.log_path.read_text()


def _admin(node, *args: str) -> subprocess.CompletedProcess:
    return _cli("admin", "--url", node.s3_url, "--access-key", node.access_key, "--secret-key", node.secret_key,
                *args)


def test_bucket_data_policy_scrub_and_damage_report(node):
    s3 = node.boto3_client(retries={"max_attempts": 1})
    s3.create_bucket(Bucket="docs")
    r = _admin(node, "bucket", "data", "docs", "--compression", "zstd:5", "--dedup", "--chunk-size", "256KiB",
               "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) | {} == {"compression": "zstd", "level": 5, "dedup": True, "chunking": "fixed",
                                         "chunk_bytes": 256 << 10, "digest": "blake3", "verify": True}
    text = b"the quick brown fox jumps over the lazy dog " * 50_000
    s3.put_object(Bucket="docs", Key="a.txt", Body=text)
    s3.put_object(Bucket="docs", Key="b.txt", Body=text)  # deduplicated
    stats = json.loads(_admin(node, "bucket", "stats", "docs", "--json").stdout)["data"]
    assert stats["logical_bytes"] == 2 * len(text) and stats["stored_bytes"] < len(text) // 20
    assert "ratio" in _admin(node, "bucket", "stats", "docs").stdout
    bad = _admin(node, "bucket", "data", "docs", "--compression", "gzip")
    assert bad.returncode != 0 and "compression" in (bad.stderr + bad.stdout) and "Traceback" not in bad.stderr

    r = _cli("scrub", "--endpoint", node.s3_url, "--access-key", node.access_key,
             "--secret-key", node.secret_key)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 damaged" in r.stdout

    s3.create_bucket(Bucket="raw")
    s3.put_object(Bucket="raw", Key="w.bin", Body=os.urandom(300_000))
    db = sqlite3.connect(f"file:{node.data_dir / 'catalog.sqlite3'}?mode=ro", uri=True)
    blob = db.execute("SELECT blob_id FROM objects WHERE bucket='raw' AND key='w.bin'").fetchone()[0]
    db.close()
    flip_bits(node.data_dir / "blobs" / blob[:2] / blob[2:4] / blob, 123_456, 1)
    r = _cli("scrub", "--endpoint", node.s3_url, "--access-key", node.access_key,
             "--secret-key", node.secret_key, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)["last"]
    assert [d["objects"] for d in report["damaged"]] == [[["raw", "w.bin", "null"]]]
    listed = _admin(node, "damaged").stdout
    assert blob in listed and "raw/w.bin" in listed
    with pytest.raises(ClientError) as got:
        s3.get_object(Bucket="raw", Key="w.bin")["Body"].read()
    assert got.value.response["Error"]["Code"] == "DamagedObject"
    with Client(node.tcp_url) as c:
        with pytest.raises(DamagedObject):
            c.get("raw", "w.bin")
        assert bytes(c.get("docs", "a.txt")) == text  # the connection still works
    metrics = urllib.request.urlopen(node.metrics_url).read().decode()
    assert "gpufeed_damaged_chunks 1.0" in metrics and "gpufeed_scrub_last_damaged_chunks 1.0" in metrics


def test_scrub_stop_and_a_scrub_already_running(node):
    s3 = node.boto3_client()
    s3.create_bucket(Bucket="slow")
    for i in range(4):
        s3.put_object(Bucket="slow", Key=f"k{i}", Body=os.urandom(1 << 20))
    args = ("--endpoint", node.s3_url, "--access-key", node.access_key, "--secret-key", node.secret_key)
    r = _cli("scrub", *args, "--rate", "256KiB", "--no-wait", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["started"] is True, r.stderr
    again = json.loads(_cli("scrub", *args, "--no-wait", "--json").stdout)
    assert again["started"] is False and again["running"] is True  # not started twice
    r = _cli("scrub", *args, "--stop")
    assert r.returncode == 0 and "scrub stopped" in r.stdout, r.stdout + r.stderr
    assert "no scrub was running" in _cli("scrub", *args, "--stop").stdout


def test_capacity_refuses_writes_with_507(tmp_path):
    node = start_node(tmp_path / "data", extra_args=["--capacity", "1MiB"])
    try:
        s3 = node.boto3_client(retries={"max_attempts": 1})
        s3.create_bucket(Bucket="small")
        s3.put_object(Bucket="small", Key="a", Body=b"x" * 700_000)
        with pytest.raises(ClientError) as got:
            s3.put_object(Bucket="small", Key="b", Body=b"y" * 700_000)
        assert got.value.response["Error"]["Code"] == "StorageFull"
        assert got.value.response["ResponseMetadata"]["HTTPStatusCode"] == 507
        assert s3.get_object(Bucket="small", Key="a")["Body"].read() == b"x" * 700_000
        assert [o["Key"] for o in s3.list_objects_v2(Bucket="small")["Contents"]] == ["a"]
    finally:
        assert node.stop() == 0


def test_scrub_of_a_stopped_nodes_folder(tmp_path):
    node = start_node(tmp_path / "data")
    try:
        s3 = node.boto3_client()
        s3.create_bucket(Bucket="bkt1")
        s3.put_object(Bucket="bkt1", Key="k", Body=b"z" * 100_000)
    finally:
        assert node.stop() == 0
    stray = tmp_path / "data" / "blobs" / "ab" / "cd" / ("abcd" + "0" * 28)
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"left by a crash")
    r = _cli("scrub", "--data-dir", str(tmp_path / "data"))
    assert r.returncode == 0 and "1 chunks" in r.stdout, r.stdout + r.stderr
    assert "1 orphaned data files removed" in r.stdout and not stray.exists()  # said, not silent
    r = _cli("scrub", "--data-dir", str(tmp_path / "nope"))
    assert r.returncode != 0 and "Traceback" not in r.stderr


def test_s3_get_aborts_when_damage_is_found_after_the_headers(node):
    import http.client

    s3 = node.boto3_client(retries={"max_attempts": 1})
    s3.create_bucket(Bucket="large")
    data = os.urandom(20 << 20)
    s3.put_object(Bucket="large", Key="big", Body=data)
    db = sqlite3.connect(f"file:{node.data_dir / 'catalog.sqlite3'}?mode=ro", uri=True)
    blob = db.execute("SELECT blob_id FROM objects WHERE bucket='large' AND key='big'").fetchone()[0]
    db.close()
    flip_bits(node.data_dir / "blobs" / blob[:2] / blob[2:4] / blob, 15 << 20, 1)  # past the first checked piece
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "large", "Key": "big"})
    host, port = node.s3_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", url.removeprefix(node.s3_url))
    resp = conn.getresponse()
    assert resp.status == 200 and int(resp.getheader("Content-Length")) == len(data)
    with pytest.raises(http.client.IncompleteRead) as got:
        resp.read()
    assert len(got.value.partial) < len(data) and got.value.partial == data[:len(got.value.partial)]
    conn.close()
    # a range that avoids the damaged block still reads, and boto3 sees the failure too
    assert s3.get_object(Bucket="large", Key="big", Range="bytes=0-99")["Body"].read() == data[:100]
    with pytest.raises((BotoCoreError, ClientError)):  # the body broke off (or a retry got the 500)
        s3.get_object(Bucket="large", Key="big")["Body"].read()
