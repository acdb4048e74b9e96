"""Data on several nodes of one cluster (``gpufeed serve --catalog postgresql://...
--cluster NAME`` subprocesses on one throwaway PostgreSQL): each node records
the data files it holds, so restarts and scrubs on one node never mark another
node's data missing or damaged."""

from __future__ import annotations

import os

from gpufeed.admin import RemoteAdmin
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.testing.node import NodeProcess, start_node

FAST = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "1.5",
        "GPUFEED_CLUSTER_REPLICAS": "1"}  # each chunk on its writer only (tests/test_cluster_replicas.py: copies)


def _member(path, url: str) -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", "c1"], env=FAST)


def _admin(node: NodeProcess) -> RemoteAdmin:
    return RemoteAdmin(node.s3_url, node.access_key, node.secret_key)


def _node_id(node: NodeProcess) -> str:
    return (node.data_dir / "node.id").read_text().strip()


def _write(node: NodeProcess, bucket: str, names: list[str]) -> dict[str, bytes]:
    s3 = node.boto3_client()
    out = {}
    for i, name in enumerate(names):
        out[name] = os.urandom(100_000 + i * 4099)
        s3.put_object(Bucket=bucket, Key=name, Body=out[name])
    return out


def _read(node: NodeProcess, bucket: str, key: str) -> bytes:
    return node.boto3_client().get_object(Bucket=bucket, Key=key)["Body"].read()


def test_each_node_keeps_and_checks_only_the_files_it_holds(tmp_path, postgres_url):
    a, b = _member(tmp_path / "a", postgres_url), _member(tmp_path / "b", postgres_url)
    try:
        a.boto3_client().create_bucket(Bucket="raw")
        a.boto3_client().create_bucket(Bucket="packed")
        _admin(a).bucket_data("packed", compression="zstd", dedup=True, chunk_bytes=64 << 10)
        wrote = {"a": {("raw", k): v for k, v in _write(a, "raw", ["a1", "a2"]).items()},
                 "b": {("raw", k): v for k, v in _write(b, "raw", ["b1", "b2"]).items()}}
        packed = b"squeezable " * 30_000
        a.boto3_client().put_object(Bucket="packed", Key="pa", Body=packed)
        b.boto3_client().put_object(Bucket="packed", Key="pb", Body=packed[::-1])
        wrote["a"][("packed", "pa")], wrote["b"][("packed", "pb")] = packed, packed[::-1]
        for n in (a, b):
            assert n.stop() == 0, n.log_path.read_text()
        a, b = _member(tmp_path / "a", postgres_url), _member(tmp_path / "b", postgres_url)
        for name, node in (("a", a), ("b", b)):
            for (bucket, key), data in wrote[name].items():
                assert _read(node, bucket, key) == data
            assert _admin(node).damaged()["chunks"] == []
        cat = PostgresCatalog(postgres_url)
        try:
            held: dict[str, int] = {}
            after = ""
            while page := cat.scan_chunks(after, 100):
                for c in page:
                    held[c.holder] = held.get(c.holder, 0) + 1
                after = page[-1].chunk_id
        finally:
            cat.close()
        assert set(held) == {_node_id(a), _node_id(b)}
        for node in (a, b):
            report = _admin(node).scrub()["last"]
            assert report["damaged"] == [] and report["orphan_files"] == [] and report["complete"]
            assert report["chunks"] == held[_node_id(node)]
        assert _admin(a).damaged()["chunks"] == [] and _admin(b).damaged()["chunks"] == []
    finally:
        a.stop()
        b.stop()
