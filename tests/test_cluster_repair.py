"""Repairs from copies on a cluster (``gpufeed serve --catalog postgresql://...
--cluster NAME`` subprocesses on one throwaway PostgreSQL, replication factor
2): a byte flipped in a node's data file, as the chunks' holder or as a copy,
is found by that node's scrub and rewritten from another node's good copy; a
read that finds it first is served from another node and asks for the
repair; when every copy is damaged nothing is served, the holder's chunk
stays marked damaged and the damaged copy is dropped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from gpufeed.admin import RemoteAdmin
from gpufeed.client import Client
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.testing.node import NodeProcess, flip_bits, start_node, wait_for

FAST = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "1.5",
        "GPUFEED_CLUSTER_FETCH_TIMEOUT_S": "3", "GPUFEED_CLUSTER_COPY_TIMEOUT_S": "3",
        "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "600"}  # the copies stay as the writes made them


def _member(path, url: str) -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", "c1"], env=FAST)


def _node_id(node: NodeProcess) -> str:
    return (node.data_dir / "node.id").read_text().strip()


def _admin(node: NodeProcess) -> RemoteAdmin:
    return RemoteAdmin(node.s3_url, node.access_key, node.secret_key)


def _path(node: NodeProcess, file: str) -> Path:
    return node.data_dir / "blobs" / file[:2] / file[2:4] / file


def _where(url: str, nodes: list[NodeProcess]) -> dict[str, tuple[NodeProcess, NodeProcess]]:
    """data file -> (its chunks' holder, the node with its copy), from the catalog."""
    ids = {_node_id(n): n for n in nodes}
    cat = PostgresCatalog(url)
    try:
        out = {}
        for c in cat.scan_chunks("", 100_000):
            [copy] = cat.file_copies(c.file)
            out[c.file] = (ids[c.holder], ids[copy])
        return out
    finally:
        cat.close()


def _copy_rows(url: str, file: str) -> list[str]:
    cat = PostgresCatalog(url)
    try:
        return cat.file_copies(file)
    finally:
        cat.close()


def _put(a: NodeProcess) -> dict[str, bytes]:
    """One raw object (one chunk in its file) and one compressed object (many
    chunks in one file), written through ``a``."""
    s3 = a.boto3_client()
    s3.create_bucket(Bucket="raw")
    s3.create_bucket(Bucket="packed")
    _admin(a).bucket_data("packed", compression="zstd", chunk_bytes=64 << 10)
    want = {"raw/obj": os.urandom(300_000),
            "packed/text": b"".join(b"line %08d of a squeezable file\n" % i for i in range(20_000))}
    for name, data in want.items():
        bucket, key = name.split("/")
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    return want


def _reads_everywhere(nodes: list[NodeProcess], want: dict[str, bytes]) -> None:
    for node in nodes:
        s3 = node.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
        for name, data in want.items():
            bucket, key = name.split("/")
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data, (node.data_dir, name)


def _writer_holds(tmp_path, url: str, env: dict[str, str] = FAST) -> list[NodeProcess]:
    """Two members, a and b: a write through a keeps its files there (both are its targets)."""
    return [start_node(tmp_path / n, extra_args=["--catalog", url, "--cluster", "c1"], env=env) for n in "ab"]


def _third(tmp_path, url: str, nodes: list[NodeProcess], env: dict[str, str] = FAST) -> None:
    """A third member, c, once the writes are made (re-replication and rebalancing wait 600 s: nothing moves)."""
    nodes.append(start_node(tmp_path / "c", extra_args=["--catalog", url, "--cluster", "c1"], env=env))


def test_scrub_repairs_the_holders_file_and_a_copy_from_a_good_copy(tmp_path, postgres_url):
    nodes = _writer_holds(tmp_path, postgres_url)
    a = nodes[0]
    try:
        want = _put(a)
        _third(tmp_path, postgres_url, nodes)
        where = _where(postgres_url, nodes)
        assert len(where) == 2 and all(holder is a for holder, _ in where.values())
        before = {f: _path(a, f).read_bytes() for f in where}
        for f in where:  # one byte in each of the holder's files: one chunk of each
            flip_bits(_path(a, f), len(before[f]) // 2, 0x20)
        report = _admin(a).scrub()["last"]
        assert report["complete"] and report["damaged"] == [] and report["dropped_copies"] == []
        assert sorted(r["file"] for r in report["repaired"]) == sorted(where)
        assert all(r["from"] == _node_id(where[r["file"]][1]) and not r["copy"] for r in report["repaired"])
        raw = next(f for f in where if len(before[f]) == 300_000)
        # one flipped byte of the 300,000-byte chunk: only its 4 KiB block is fetched
        assert [r["fetched_bytes"] for r in report["repaired"] if r["file"] == raw] == [4096]
        assert all(_path(a, f).read_bytes() == before[f] for f in where)  # bit-identical again
        assert _admin(a).damaged()["chunks"] == []
        _reads_everywhere(nodes, want)
        again = _admin(a).scrub()["last"]
        assert again["repaired"] == [] and again["damaged"] == []

        file = next(iter(where))  # now a byte of a copy: the node that keeps it repairs it from the holder
        copy_node = where[file][1]
        flip_bits(_path(copy_node, file), 7, 0x01)
        r = subprocess.run([sys.executable, "-m", "gpufeed", "scrub", "--endpoint", copy_node.s3_url, "--access-key",
                            copy_node.access_key, "--secret-key", copy_node.secret_key],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr  # nothing left damaged
        assert "0 damaged, 0 cleared, 1 repaired from other nodes, 0 damaged copies dropped" in r.stdout
        assert f"(copy of data file {file}: " in r.stdout and f"from node {_node_id(a)}" in r.stdout
        assert _path(copy_node, file).read_bytes() == before[file]
        assert _copy_rows(postgres_url, file) == [_node_id(copy_node)]
        packed = next(f for f in where if len(before[f]) != 300_000)  # a file of many compressed chunks
        _path(a, packed).unlink()  # the holder's file gone: every chunk of it fetched from the copy
        report = _admin(a).scrub()["last"]
        assert {r["file"] for r in report["repaired"]} == {packed} and len(report["repaired"]) > 1
        assert all(r["reason"] == "data file is missing" for r in report["repaired"]) and report["damaged"] == []
        assert _path(a, packed).read_bytes() == before[packed]
        _reads_everywhere([a], want)
        other = where[raw][1]  # other blocks of one file damaged on both nodes: each repaired from the other
        flip_bits(_path(a, raw), 10 * 4096 + 5, 0x04)
        flip_bits(_path(other, raw), 20 * 4096 + 5, 0x04)
        assert [r["fetched_bytes"] for r in _admin(a).scrub()["last"]["repaired"]] == [4096]
        assert [r["fetched_bytes"] for r in _admin(other).scrub()["last"]["repaired"]] == [4096]
        assert _path(a, raw).read_bytes() == _path(other, raw).read_bytes() == before[raw]
        a.kill()  # the copies alone serve everything, bit-identical
        _reads_everywhere(nodes[1:], want)
    finally:
        for n in nodes:
            n.stop()


def test_reads_fall_back_to_another_node_and_the_file_is_repaired(tmp_path, postgres_url):
    nodes = _writer_holds(tmp_path, postgres_url)
    a = nodes[0]
    try:
        want = _put(a)
        _third(tmp_path, postgres_url, nodes)
        where = _where(postgres_url, nodes)
        before = {f: _path(a, f).read_bytes() for f in where}
        for f in where:
            flip_bits(_path(a, f), len(before[f]) // 3, 0x04)
        _reads_everywhere([a], want)  # the holder's reads: each damaged chunk from the copy
        wait_for(lambda: all(_path(a, f).read_bytes() == before[f] for f in where), 15)  # the reads asked
        wait_for(lambda: _admin(a).damaged()["chunks"] == [], 10)
        with Client(a.tcp_url, **a.credentials) as cl:
            assert bytes(cl.get("packed", "text", offset=70_000, length=5000)) == want["packed/text"][70_000:75_000]

        file = next(f for f in where if len(before[f]) == 300_000)  # raw/obj's file (stored as it is)
        copy_node = where[file][1]  # a copy's read: from the holder, and the copy repaired
        flip_bits(_path(copy_node, file), 100, 0x80)
        with Client(copy_node.tcp_url, **copy_node.credentials) as cl:
            assert bytes(cl.get("raw", "obj")) == want["raw/obj"]
        wait_for(lambda: _path(copy_node, file).read_bytes() == before[file], 15)
        assert _copy_rows(postgres_url, file) == [_node_id(copy_node)]
        assert _admin(copy_node).scrub()["last"]["repaired"] == []
    finally:
        for n in nodes:
            n.stop()


def test_every_copy_damaged_serves_nothing_and_drops_the_damaged_copy(tmp_path, postgres_url):
    env = {**FAST, "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.3"}  # passes run: the damaged file is not pushed
    nodes = [start_node(tmp_path / n, extra_args=["--catalog", postgres_url, "--cluster", "c1"], env=env)
             for n in "abc"]
    a = nodes[0]
    try:
        s3 = a.boto3_client()
        s3.create_bucket(Bucket="raw")
        s3.put_object(Bucket="raw", Key="k", Body=os.urandom(200_000))
        [(file, (holder, copy_node))] = _where(postgres_url, nodes).items()
        flip_bits(_path(holder, file), 5000, 0x02)  # the same 4 KiB block of both (blocks apart are
        flip_bits(_path(copy_node, file), 6000, 0x02)  # repaired from each other: see the test above)
        report = _admin(holder).scrub()["last"]
        assert report["repaired"] == [] and len(report["damaged"]) == 1
        damage = report["damaged"][0]
        assert damage["chunk"] == file and damage["objects"][0][:2] == ["raw", "k"]
        assert f"node {_node_id(copy_node)} sent failed their check" in damage["repair"]
        assert [d["chunk"] for d in _admin(holder).damaged()["chunks"]] == [file]
        for node in nodes:  # nothing wrong is served, by any node
            s3n = node.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
            with pytest.raises(ClientError) as got:
                s3n.get_object(Bucket="raw", Key="k")["Body"].read()
            assert got.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        report = _admin(copy_node).scrub()["last"]  # the copy cannot be repaired either: dropped
        assert [d["file"] for d in report["dropped_copies"]] == [file] and report["damaged"] == []
        assert "failed their check" in report["dropped_copies"][0]["repair"]
        assert not _path(copy_node, file).exists() and _copy_rows(postgres_url, file) == []
        assert _admin(a).cluster_status()["under_replicated_chunks"] == 1
        assert [d["chunk"] for d in _admin(holder).damaged()["chunks"]] == [file]  # still marked
        # re-replication passes leave the marked file alone (a copy would be refused), saying so once
        wait_for(lambda: "re-replication of data file" in holder.log_path.read_text(), timeout_s=20)
        time.sleep(1.5)  # several more passes
        log = holder.log_path.read_text()
        assert log.count(f"re-replication of data file {file} waits: chunk {file} is marked damaged") == 1, log
        assert "copies made" not in log
    finally:
        for n in nodes:
            n.stop()


def test_every_read_path_falls_back_while_the_file_stays_damaged(tmp_path, postgres_url):
    env = {**FAST, "GPUFEED_CLUSTER_REPAIR_QUEUE": "0"}  # reads ask for no repair: each one falls back
    nodes = _writer_holds(tmp_path, postgres_url, env)
    a = nodes[0]
    try:
        s3 = a.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
        s3.create_bucket(Bucket="raw")
        data = os.urandom(300_000)
        s3.put_object(Bucket="raw", Key="obj", Body=data)
        _third(tmp_path, postgres_url, nodes, env)
        [(file, (holder, _))] = _where(postgres_url, nodes).items()
        assert holder is a
        flip_bits(_path(a, file), 8192 + 5, 0x40)  # block 2 of the holder's file
        assert s3.get_object(Bucket="raw", Key="obj", Range="bytes=8000-9000")["Body"].read() == data[8000:9001]
        with Client(a.tcp_url, **a.credentials) as cl:
            assert bytes(cl.get("raw", "obj")) == data
            assert bytes(cl.get("raw", "obj", offset=8192, length=4096)) == data[8192:12288]  # the small read
            dest = bytearray(3 * 4096)
            got = cl.get_ranges_into("raw", "obj", dest, [0, 8192, 200_000], [4096, 4096, 4096])
            assert list(got) == [4096] * 3
            assert bytes(dest) == data[:4096] + data[8192:12288] + data[200_000:204_096]
            bufs = [bytearray(4096), bytearray(20_000)]
            assert cl.get_many_into([("raw", "obj", bufs[0], 8192, 4096), ("raw", "obj", bufs[1], 0, 20_000)]) \
                == [4096, 20_000]
            assert bufs[0] == data[8192:12288] and bufs[1] == data[:20_000]
        assert _path(a, file).read_bytes() != data  # still damaged: every read above came from the copy
        assert [d["chunk"] for d in _admin(a).damaged()["chunks"]] == [file]  # and the holder marked it
        report = _admin(a).scrub()["last"]
        assert [r["chunk"] for r in report["repaired"]] == [file] and report["damaged"] == []
        assert _path(a, file).read_bytes() == data and _admin(a).damaged()["chunks"] == []
    finally:
        for n in nodes:
            n.stop()
