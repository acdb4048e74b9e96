"""Copies of data on several nodes of a cluster (``gpufeed serve --catalog
postgresql://... --cluster NAME`` subprocesses on one throwaway PostgreSQL):
a write is acknowledged once each new data file is on ``factor`` nodes, the
catalog records every copy, reads go to any node that holds one, a write that
cannot reach enough nodes is refused with nothing visible, and the background
job restores the factor after a node is lost."""

from __future__ import annotations

import os
import socket
import time

import pytest
from botocore.exceptions import ClientError

from gpufeed._peers import PeerLink, call, read_reply
from gpufeed.admin import RemoteAdmin
from gpufeed.client import Client
from gpufeed.engine._placement import rank
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.errors import DamagedObject, HolderUnavailable
from gpufeed.testing.node import NodeProcess, start_node, wait_for
from gpufeed.wire import protocol as p

FAST = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "1.5",
        "GPUFEED_CLUSTER_FETCH_TIMEOUT_S": "3", "GPUFEED_CLUSTER_COPY_TIMEOUT_S": "3"}


def _member(path, url: str, **env: str) -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", "c1"], env={**FAST, **env})


def _node_id(node: NodeProcess) -> str:
    return (node.data_dir / "node.id").read_text().strip()


def _copies(url: str) -> dict[str, set[str]]:
    """data file -> every node holding it (holder and copies), from the catalog, in
    one statement (one snapshot: a holder handed over meanwhile is not seen twice)."""
    import psycopg

    out: dict[str, set[str]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT file, holder FROM chunks UNION "
                            "SELECT c.file, f.node FROM file_copies f JOIN chunks c ON c.file = f.file").fetchall()
    for file, node in rows:
        out.setdefault(file, set()).add(node)
    return out


def _files_of(url: str, bucket: str, key: str) -> set[str]:
    """The data files of the object ``bucket/key``, from the catalog."""
    cat = PostgresCatalog(url)
    try:
        info = cat.object(bucket, key)
        got = cat.manifest(info.blob_id) if info is not None else None
        return {c.file for c in got[1]} if got is not None else set()
    finally:
        cat.close()


def _has_file(node: NodeProcess, file: str) -> bool:
    return (node.data_dir / "blobs" / file[:2] / file[2:4] / file).exists()


def _status(node: NodeProcess) -> dict:
    return RemoteAdmin(node.s3_url, node.access_key, node.secret_key).cluster_status()



def _write_all_kinds(a: NodeProcess) -> dict[tuple[str, str], bytes]:
    """Objects of every write path through ``a``: S3 put (raw, compressed, deduplicated),
    multipart completion, server-side copy and the SDK's fast-path put."""
    s3 = a.boto3_client()
    for b in ("raw", "packed", "dedup"):
        s3.create_bucket(Bucket=b)
    admin = RemoteAdmin(a.s3_url, a.access_key, a.secret_key)
    admin.bucket_data("packed", compression="zstd", chunk_bytes=64 << 10)
    admin.bucket_data("dedup", dedup=True, chunk_bytes=64 << 10)
    want = {("raw", "big"): os.urandom(3 << 20),
            ("packed", "text"): b"".join(b"line %08d of a squeezable file\n" % i for i in range(20_000)),
            ("dedup", "d"): os.urandom(300_000)}
    for (b, k), data in want.items():
        s3.put_object(Bucket=b, Key=k, Body=data)
    up = s3.create_multipart_upload(Bucket="raw", Key="mp")["UploadId"]
    parts = [os.urandom(5 << 20), os.urandom(1000)]
    etags = [s3.upload_part(Bucket="raw", Key="mp", UploadId=up, PartNumber=i + 1, Body=d)["ETag"]
             for i, d in enumerate(parts)]
    s3.complete_multipart_upload(Bucket="raw", Key="mp", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
    want[("raw", "mp")] = b"".join(parts)
    s3.copy_object(Bucket="raw", Key="copied", CopySource={"Bucket": "raw", "Key": "big"})
    want[("raw", "copied")] = want[("raw", "big")]
    with Client(a.tcp_url, **a.credentials) as c:
        want[("raw", "sdk")] = os.urandom(700_000)
        c.put("raw", "sdk", want[("raw", "sdk")])
    return want


def test_every_write_path_is_on_two_nodes_and_reads_survive_a_killed_holder(tmp_path, postgres_url):
    env = {"GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "600"}  # no re-replication here: the count stays
    a, b, c = (_member(tmp_path / n, postgres_url, **env) for n in "abc")
    try:
        want = _write_all_kinds(a)
        copies = _copies(postgres_url)
        ids = {_node_id(n): n for n in (a, b, c)}
        # each file on its targets: the first two nodes by rank, the writer among them or not
        assert copies and all(nodes == set(rank(f.encode(), ids)[:2]) for f, nodes in copies.items())
        for file, nodes in copies.items():  # each copy is a whole file in its node's folder, and only there
            assert all(_has_file(ids[n], file) == (n in nodes) for n in ids)
        assert {n for nodes in copies.values() for n in nodes} == set(ids)  # placement spreads the copies
        assert _status(b)["under_replicated_chunks"] == 0
        a.kill()  # the writer, which holds about two thirds of the files: reads go to the other copies at once
        for node in (b, c):
            s3 = node.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
            for (bucket, key), data in want.items():
                assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data, (bucket, key)
        with Client(b.tcp_url, **b.credentials) as cl:
            assert bytes(cl.get("packed", "text")) == want[("packed", "text")]
            assert bytes(cl.get("raw", "mp", offset=5 << 20, length=1000)) == want[("raw", "mp")][5 << 20:]

        def counted() -> int:
            r = _status(b)
            return r["under_replicated_chunks"] if r["live"] == 2 else 0
        assert wait_for(counted, 10) > 0  # a expired: its copies no longer count
        s3b = b.boto3_client()
        # b deletes an object of one data file that c holds: the rows go at once, each node frees its own file
        [(bucket, key, file)] = [(bk, k, f) for bk, k in want if len(fs := _files_of(postgres_url, bk, k)) == 1
                                 for f in fs if _node_id(c) in copies[f]][:1]
        s3b.delete_object(Bucket=bucket, Key=key)
        assert file not in _copies(postgres_url)
        assert not _has_file(b, file) and _has_file(c, file)  # the deleting node removed its copy (if it had one)
        other = c
        other.stop()
        restarted = _member(other.data_dir, postgres_url, **env)  # a restart's sweep frees the rest
        try:
            assert not _has_file(restarted, file)
            rest = _copies(postgres_url)
            assert all(_has_file(restarted, f) for f, n in rest.items() if _node_id(restarted) in n)
        finally:
            restarted.stop()
    finally:
        for n in (a, b, c):
            n.stop()


def test_a_write_that_cannot_reach_enough_nodes_is_refused_and_copy_pushes_are_checked(tmp_path, postgres_url):
    a, b, c = (_member(tmp_path / n, postgres_url, GPUFEED_CLUSTER_REPLICAS="3") for n in "abc")
    try:
        s3 = a.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
        s3.create_bucket(Bucket="raw")
        s3.put_object(Bucket="raw", Key="ok", Body=b"k" * 10_000)
        assert all(len(n) == 3 for n in _copies(postgres_url).values())
        c.kill()  # still live for 1.5 s: the push to it fails, and no fourth node can take its place
        with pytest.raises(ClientError) as got:
            s3.put_object(Bucket="raw", Key="refused", Body=b"r" * 10_000)
        err = got.value.response
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 503 and err["Error"]["Code"] == "ServiceUnavailable"
        message = err["Error"]["Message"]
        assert f"node {_node_id(c)}" in message and "the write was not stored" in message
        with pytest.raises(ClientError, match="404"):
            s3.head_object(Bucket="raw", Key="refused")
        assert len(_copies(postgres_url)) == 1  # nothing of it in the catalog
        time.sleep(2.0)  # c expired: the factor is capped to the two live members
        s3.put_object(Bucket="raw", Key="capped", Body=b"c" * 10_000)
        assert b.boto3_client().get_object(Bucket="raw", Key="capped")["Body"].read() == b"c" * 10_000
        host, port = b.tcp_url.removeprefix("gpufeed+tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:  # the S3 key may not push
            hello = call(sock, p.Op.HELLO, p.Hello("t"), p.HelloReply)
            mine = os.urandom(32)
            proof = p.auth_proof(p.auth_key(a.secret_key), "client", "tcp", a.access_key, hello.nonce, mine)
            call(sock, p.Op.AUTH, p.Auth(a.access_key, mine, proof), p.AuthReply)
            with pytest.raises(HolderUnavailable, match="AccessDenied"):
                _push(sock, b"x" * 5000, b"\0" * 8)
        cat = PostgresCatalog(postgres_url)
        try:  # a member's node key, bytes that do not match their sums: refused, nothing kept
            link = PeerLink(cat.membership, cluster="c1", node_id=_node_id(a), expiry_s=1.5, timeout_s=3,
                            fetches=1)
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                link.authenticate(sock)
                with pytest.raises(DamagedObject, match="failed its check"):
                    _push(sock, b"x" * 5000, b"\0" * 8)
        finally:
            cat.close()
        assert not _has_file(b, "ab" * 16)
    finally:
        for n in (a, b, c):
            n.stop()


def _push(sock: socket.socket, data: bytes, sums: bytes) -> None:
    chunk = p.CopyChunk("ab" * 16, 0, len(data), len(data), "", b"\1" * 16, None, 1, len(sums))
    meta = p.encode(p.ChunkPut("ab" * 16, len(data), [chunk]))
    sock.sendall(p.pack_header(p.Op.CHUNK_PUT, len(meta), 1, len(sums) + len(data)) + meta + sums + data)
    read_reply(sock, p.Op.CHUNK_PUT, time.monotonic())


def test_re_replication_restores_the_factor_after_a_node_is_lost(tmp_path, postgres_url):
    env = {"GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.3", "GPUFEED_CLUSTER_ORPHAN_GRACE_S": "4"}
    a, b, c = (_member(tmp_path / n, postgres_url, **env) for n in "abc")
    try:
        s3 = a.boto3_client()
        s3.create_bucket(Bucket="raw")
        want = {f"k{i}": os.urandom(50_000 + i) for i in range(24)}
        for k, data in want.items():
            s3.put_object(Bucket="raw", Key=k, Body=data)
        on_b = [f for f, n in _copies(postgres_url).items() if _node_id(b) in n]
        assert on_b  # placement gave b a share
        b.kill()
        killed = time.monotonic()

        def restored() -> bool:
            r = _status(a)
            return r["live"] == 2 and r["under_replicated_chunks"] == 0
        wait_for(restored, 20)
        took = time.monotonic() - killed
        copies = _copies(postgres_url)
        assert all({_node_id(a), _node_id(c)} <= n for n in copies.values())
        assert all(_has_file(c, f) for f in copies)
        print(f"time to full redundancy after the kill: {took:.1f} s (expiry 1.5 s, {len(on_b)} files re-copied)")
        before = _copies(postgres_url)
        c.boto3_client().delete_object(Bucket="raw", Key="k0")  # through c: a frees its copy by its sweep
        [gone] = [f for f in before if f not in _copies(postgres_url)]
        assert not _has_file(c, gone)
        wait_for(lambda: not _has_file(a, gone), 15)  # a's sweep: the file is older than the grace
        del want["k0"]
        a.kill()  # every file is on c now: c alone serves everything
        s3c = c.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
        for k, data in want.items():
            assert s3c.get_object(Bucket="raw", Key=k)["Body"].read() == data
    finally:
        for n in (a, b, c):
            n.stop()
