"""Reads through any node of a cluster (``gpufeed serve --catalog postgresql://...
--cluster NAME`` subprocesses on one throwaway PostgreSQL): a node fetches the
chunks another node holds over the fast path, authenticated with node keys,
checks them, and serves them; damage from the holder and a holder that is gone
are clear errors, quickly."""

from __future__ import annotations

import os
import socket
import time
import urllib.request

import pytest
from botocore.exceptions import ClientError

from gpufeed._peers import PeerLink, call, request
from gpufeed.client import Client
from gpufeed.engine._partial import PARTIAL_MIN_BYTES, WINDOW_BYTES
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.engine.types import ChunkRecord
from gpufeed.errors import HolderUnavailable, ServiceUnavailable
from gpufeed.testing.node import NodeProcess, start_node
from gpufeed.wire import protocol as p

FAST = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "1.5",
        "GPUFEED_CLUSTER_FETCH_TIMEOUT_S": "3", "GPUFEED_CLUSTER_REPLICAS": "1"}  # each chunk on its writer only


def _member(path, url: str) -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", "c1", "--metrics-port", "0"], env=FAST)


def _chunks(url: str) -> list[ChunkRecord]:
    cat = PostgresCatalog(url)
    try:
        return cat.scan_chunks("", 10_000)
    finally:
        cat.close()


def _s3_error(node: NodeProcess, bucket: str, key: str) -> tuple[dict, float]:
    s3 = node.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
    started = time.monotonic()
    with pytest.raises(ClientError) as got:
        s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return got.value.response, time.monotonic() - started


@pytest.fixture
def pair(tmp_path, postgres_url):
    a, b = _member(tmp_path / "a", postgres_url), _member(tmp_path / "b", postgres_url)
    yield a, b
    a.stop()
    b.stop()


def test_an_object_written_through_one_node_reads_through_another(pair, postgres_url):
    a, b = pair
    s3a = a.boto3_client()
    s3a.create_bucket(Bucket="raw")
    s3a.create_bucket(Bucket="packed")
    from gpufeed.admin import RemoteAdmin
    RemoteAdmin(a.s3_url, a.access_key, a.secret_key).bucket_data("packed", compression="zstd", dedup=True,
                                                                    chunk_bytes=64 << 10)
    big = os.urandom(3 << 20) + b"tail"
    packed = b"".join(b"line %08d of a squeezable file\n" % i for i in range(40_000))
    s3a.put_object(Bucket="raw", Key="big", Body=big)
    s3a.put_object(Bucket="packed", Key="text", Body=packed)
    s3b = b.boto3_client()
    assert s3b.get_object(Bucket="raw", Key="big")["Body"].read() == big
    assert s3b.get_object(Bucket="raw", Key="big", Range="bytes=100-200099")["Body"].read() == big[100:200100]
    assert s3b.get_object(Bucket="packed", Key="text")["Body"].read() == packed
    with Client(b.tcp_url, **b.credentials) as c:
        assert bytes(c.get("raw", "big")) == big
        assert bytes(c.get("packed", "text", offset=70_000, length=100_000)) == packed[70_000:170_000]
    holders = {c.holder for c in _chunks(postgres_url)}
    assert holders == {(a.data_dir / "node.id").read_text().strip()}  # nothing was copied to b
    assert RemoteAdmin(b.s3_url, b.access_key, b.secret_key).damaged()["chunks"] == []
    # b keeps the chunks it fetched: ten range reads of the big object fetch it once
    before = _fetch_cache(b)
    for i in range(10):
        start = i * 300_000
        got = s3b.get_object(Bucket="raw", Key="big", Range=f"bytes={start}-{start + 999}")["Body"].read()
        assert got == big[start:start + 1000]
    after = _fetch_cache(b)
    assert after["hits"] - before["hits"] == 10 and after["misses"] == before["misses"]
    assert after["bytes"] >= len(big)


def test_range_reads_of_a_large_raw_object_fetch_only_the_windows_they_need(pair):
    a, b = pair
    s3a, s3b = a.boto3_client(), b.boto3_client()
    s3a.create_bucket(Bucket="big")
    data = os.urandom(PARTIAL_MIN_BYTES + (6 << 20))  # one raw chunk of 70 MiB, held by a alone
    s3a.put_object(Bucket="big", Key="weights", Body=data)
    w = WINDOW_BYTES
    before = _fetch_cache(b)["fetched"]
    assert s3b.get_object(Bucket="big", Key="weights", Range="bytes=0-999")["Body"].read() == data[:1000]
    assert _fetch_cache(b)["fetched"] - before == w  # one window, not 70 MiB
    start = 5 * w - 100  # across the end of window 4 into window 5
    got = s3b.get_object(Bucket="big", Key="weights", Range=f"bytes={start}-{start + 199}")["Body"].read()
    assert got == data[start:start + 200]
    assert _fetch_cache(b)["fetched"] - before == 3 * w
    with Client(b.tcp_url, **b.credentials) as c:  # the fast path's reads too
        assert bytes(c.get("big", "weights", offset=len(data) - 5000, length=5000)) == data[-5000:]
        assert _fetch_cache(b)["fetched"] - before == 3 * w + (len(data) - 8 * w)  # the short last window
        assert bytes(c.get("big", "weights")) == data  # a whole read fetches the rest, each window once
    assert _fetch_cache(b)["fetched"] - before == 3 * w + (len(data) - 8 * w) + len(data)


def _fetch_cache(node: NodeProcess) -> dict[str, float]:
    """The node's fetch-cache gauges from its metrics endpoint."""
    assert node.metrics_url
    text = urllib.request.urlopen(node.metrics_url, timeout=10).read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith(("gpufeed_fetch_cache_", "gpufeed_fetched_bytes"))}
    out = {k: values[f"gpufeed_fetch_cache_{k}"] for k in ("bytes", "hits", "misses")}
    return {**out, "fetched": values["gpufeed_fetched_bytes"]}


def test_damage_at_the_holder_is_a_clear_error_and_a_dead_holder_answers_503(pair, postgres_url):
    a, b = pair
    a.boto3_client().create_bucket(Bucket="raw")
    data = os.urandom(300_000)
    a.boto3_client().put_object(Bucket="raw", Key="obj", Body=data)
    [chunk] = _chunks(postgres_url)
    path = a.data_dir / "blobs" / chunk.file[:2] / chunk.file[2:4] / chunk.file
    with open(path, "r+b") as f:  # one flipped byte in the holder's file
        f.seek(123_456)
        byte = f.read(1)
        f.seek(123_456)
        f.write(bytes([byte[0] ^ 0xFF]))
    err, _ = _s3_error(b, "raw", "obj")
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 500 and err["Error"]["Code"] == "DamagedObject"
    assert f"raw/obj: chunk {chunk.chunk_id}" in err["Error"]["Message"]
    assert "failed their check" in err["Error"]["Message"]
    with open(path, "r+b") as f:
        f.seek(123_456)
        f.write(byte)
    assert b.boto3_client().get_object(Bucket="raw", Key="obj")["Body"].read() == data
    a.boto3_client().put_object(Bucket="raw", Key="unread", Body=b"never read through b")
    a.kill()
    err, took = _s3_error(b, "raw", "unread")  # before expiry: the connection is refused
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 503 and err["Error"]["Code"] == "ServiceUnavailable"
    assert chunk.holder in err["Error"]["Message"] and took < 3
    # the chunk b fetched (checked) before is kept there, and still served
    assert b.boto3_client().get_object(Bucket="raw", Key="obj", Range="bytes=5-99")["Body"].read() == data[5:100]
    time.sleep(2.0)  # past the expiry (1.5 s): not even tried
    err, took = _s3_error(b, "raw", "unread")
    assert err["Error"]["Code"] == "ServiceUnavailable" and "has expired" in err["Error"]["Message"]
    assert took < 1.5
    with Client(b.tcp_url, **b.credentials) as c, pytest.raises(ServiceUnavailable, match="has expired"):
        c.get("raw", "unread")


def test_chunk_is_served_only_to_members_of_the_cluster(pair, postgres_url):
    a, b = pair
    a.boto3_client().create_bucket(Bucket="raw")
    a.boto3_client().put_object(Bucket="raw", Key="obj", Body=b"x" * 5000)
    [chunk] = _chunks(postgres_url)
    host, port = a.tcp_url.removeprefix("gpufeed+tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:  # no AUTH
        call(sock, p.Op.HELLO, p.Hello("t"), p.HelloReply)
        with pytest.raises(HolderUnavailable, match="AccessDenied"):
            request(sock, p.Op.CHUNK, p.ChunkReq(chunk.chunk_id))
    with socket.create_connection((host, int(port)), timeout=5) as sock:  # the node's own S3 key: no node key
        hello = call(sock, p.Op.HELLO, p.Hello("t"), p.HelloReply)
        mine = os.urandom(32)
        proof = p.auth_proof(p.auth_key(a.secret_key), "client", "tcp", a.access_key, hello.nonce, mine)
        call(sock, p.Op.AUTH, p.Auth(a.access_key, mine, proof), p.AuthReply)
        with pytest.raises(HolderUnavailable, match="AccessDenied"):
            request(sock, p.Op.CHUNK, p.ChunkReq(chunk.chunk_id))
    cat = PostgresCatalog(postgres_url)
    try:  # a node id that is no member: AUTH is refused
        stranger = PeerLink(cat.membership, cluster="c1", node_id="0" * 32, expiry_s=1.5, timeout_s=3, fetches=1)
        with pytest.raises(HolderUnavailable, match="InvalidAccessKeyId"):
            stranger.fetch(chunk, [chunk.holder], os.open(os.devnull, os.O_WRONLY))
        b_id = (b.data_dir / "node.id").read_text().strip()  # a member asks for a range of the chunk
        member = PeerLink(cat.membership, cluster="c1", node_id=b_id, expiry_s=1.5, timeout_s=3, fetches=1)
        fd = os.memfd_create("range")
        try:
            member.fetch(chunk, [chunk.holder], fd, (4096, 904))
            assert os.pread(fd, 904, chunk.file_offset + 4096) == b"x" * 904
            with pytest.raises(HolderUnavailable, match="not within"):
                member.fetch(chunk, [chunk.holder], fd, (4096, 905))
        finally:
            os.close(fd)
    finally:
        cat.close()


def test_deletes_through_another_node_and_uploads_complete_through_another_node(pair, tmp_path, postgres_url):
    a, b = pair
    s3a, s3b = a.boto3_client(), b.boto3_client()
    s3a.create_bucket(Bucket="raw")
    s3a.put_object(Bucket="raw", Key="gone", Body=b"y" * 70_000)
    [chunk] = _chunks(postgres_url)
    path = a.data_dir / "blobs" / chunk.file[:2] / chunk.file[2:4] / chunk.file
    s3b.delete_object(Bucket="raw", Key="gone")
    with pytest.raises(ClientError, match="NoSuchKey"):
        s3a.get_object(Bucket="raw", Key="gone")
    assert _chunks(postgres_url) == [] and path.exists()  # the holder deletes it at its next start
    a.stop()
    a = _member(tmp_path / "a", postgres_url)
    try:
        assert not path.exists()
        s3a = a.boto3_client()
        up = s3a.create_multipart_upload(Bucket="raw", Key="mp")["UploadId"]
        etag = s3a.upload_part(Bucket="raw", Key="mp", UploadId=up, PartNumber=1, Body=b"z" * 1000)["ETag"]
        # factor 1: the part is in a's folder only; b fetches it to complete the upload
        s3b.complete_multipart_upload(Bucket="raw", Key="mp", UploadId=up,
                                      MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
        assert s3a.get_object(Bucket="raw", Key="mp")["Body"].read() == b"z" * 1000
        assert not (a.data_dir / "uploads" / up).exists() and not (b.data_dir / "uploads" / up).exists()
    finally:
        a.stop()
