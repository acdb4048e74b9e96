"""Capacity per node and write placement in a cluster (``gpufeed serve
--catalog postgresql://... --cluster NAME`` subprocesses on one throwaway
PostgreSQL, replication factor 2): each node reports its used, capacity and
free bytes with its heartbeat; a write's data files land on their targets
(the first two live members by rank with room), whichever node it went
through; a full node is skipped and reads stay correct; a cluster without
room refuses writes with StorageFull (507) and keeps nothing of them."""

from __future__ import annotations

import os
import urllib.request

import pytest
from botocore.exceptions import ClientError

from gpufeed._replicas import short_error
from gpufeed.engine._placement import rank
from gpufeed.engine._room import folder_bytes
from gpufeed.errors import ServiceUnavailable, StorageFull
from gpufeed.testing.node import NodeProcess, wait_for
from test_cluster_replicas import _copies, _has_file, _member, _node_id, _status

ENV = {"GPUFEED_CLUSTER_BYTES_INTERVAL_S": "0.3", "GPUFEED_CLUSTER_ORPHAN_GRACE_S": "2",
       "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.5"}


def _data_files(node: NodeProcess) -> set[str]:
    return {f.name for f in (node.data_dir / "blobs").rglob("*") if f.is_file()}


def _figures(node: NodeProcess) -> dict[str, dict]:
    """node id -> its row of ``cluster status``, as ``node`` answers it."""
    return {n["node_id"]: n for n in _status(node)["nodes"]}


def _folder(node: NodeProcess) -> str:
    """What is in ``node``'s data folder, for an assertion's message: each file's path and size."""
    return "; ".join(f"{f.relative_to(node.data_dir)} {f.stat().st_size}" for f in sorted(node.data_dir.rglob("*"))
                     if f.is_file())


def _read_everywhere(nodes: tuple[NodeProcess, ...], want: dict[str, bytes]) -> None:
    for node in nodes:
        s3 = node.boto3_client()
        for key, data in want.items():
            assert s3.get_object(Bucket="bkt", Key=key)["Body"].read() == data, (node.data_dir.name, key)


def test_writes_land_on_their_targets_and_a_full_node_is_skipped(tmp_path, postgres_url):
    cap_a = 1_500_000
    # a does not drain here (its high-water mark is its capacity): it stays full (tests/test_cluster_drain.py)
    a = _member(tmp_path / "a", postgres_url, GPUFEED_CAPACITY=str(cap_a), GPUFEED_METRICS_PORT="0",
                GPUFEED_CLUSTER_DRAIN_HIGH="1", **ENV)
    b, c = (_member(tmp_path / n, postgres_url, GPUFEED_CAPACITY="50000000", **ENV) for n in "bc")
    nodes = (a, b, c)
    ids = {_node_id(n): n for n in nodes}
    try:
        rows = _figures(b)
        assert rows[_node_id(a)]["capacity_bytes"] == cap_a and rows[_node_id(b)]["capacity_bytes"] == 50_000_000
        for n in rows.values():  # used and free as the node counted them
            assert 0 < n["bytes_stored"] < 100_000 and n["free_bytes"] + n["bytes_stored"] <= n["capacity_bytes"]
            assert n["full"] is False
        s3c = c.boto3_client()
        s3c.create_bucket(Bucket="bkt")
        want: dict[str, bytes] = {}
        off_target = 0
        while off_target < 2 and len(want) < 60:  # through c, until c was off the targets of two files
            key = f"small{len(want)}"
            want[key] = os.urandom(1000 + len(want))
            before = set(_copies(postgres_url))
            s3c.put_object(Bucket="bkt", Key=key, Body=want[key])
            [(file, holders)] = [(f, h) for f, h in _copies(postgres_url).items() if f not in before]
            targets = rank(file.encode(), ids)[:2]  # every node has room for these
            assert holders == set(targets), (file, holders, targets)
            assert all(_has_file(ids[n], file) == (n in targets) for n in ids)  # c kept only its targets'
            off_target += _node_id(c) not in targets
        assert off_target == 2

        s3b = b.boto3_client()
        extra = 4
        for i in range(60):  # through b until a cannot take another file, then some more: a is passed over
            want[f"big{i}"] = os.urandom(200_000)
            s3b.put_object(Bucket="bkt", Key=f"big{i}", Body=want[f"big{i}"])
            extra -= folder_bytes(a.data_dir) > cap_a - 200_000
            if not extra:
                break
        assert folder_bytes(a.data_dir) <= cap_a and not extra, _folder(a)
        wait_for(lambda: _figures(b)[_node_id(a)]["free_bytes"] < 200_000, 10)
        row = _figures(b)[_node_id(a)]
        assert row["bytes_stored"] <= cap_a and row["full"]
        assert not _figures(a)[_node_id(b)]["full"]
        before = set(_copies(postgres_url))
        s3a = a.boto3_client()
        for i in range(4):  # through the full node: it keeps none of them
            want[f"via-a{i}"] = os.urandom(200_000)
            s3a.put_object(Bucket="bkt", Key=f"via-a{i}", Body=want[f"via-a{i}"])
        new = {f: h for f, h in _copies(postgres_url).items() if f not in before}
        assert len(new) == 4 and all(h == {_node_id(b), _node_id(c)} for h in new.values())
        assert not _data_files(a) & set(new)
        copies = _copies(postgres_url)
        for file, holders in copies.items():  # two copies of each, each a whole file where the catalog says
            assert len(holders) == 2 and all(_has_file(ids[n], file) for n in holders)
        assert folder_bytes(a.data_dir) <= cap_a, _folder(a)
        assert a.metrics_url is not None

        def gauges() -> dict[str, float]:
            text = urllib.request.urlopen(a.metrics_url, timeout=10).read().decode()
            return {k: float(v) for k, v in (line.split(" ", 1) for line in text.splitlines()
                                             if line.startswith("gpufeed_node_"))}
        # the files of writes through a count while they are there: a's next walk leaves them out
        wait_for(lambda: gauges()["gpufeed_node_used_bytes"] <= cap_a, 10)
        assert gauges()["gpufeed_node_capacity_bytes"] == cap_a and gauges()["gpufeed_node_full"] == 1
        _read_everywhere(nodes, want)
    finally:
        for n in nodes:
            n.stop()


def test_a_cluster_without_room_refuses_writes_and_keeps_nothing_of_them(tmp_path, postgres_url):
    cap = 1 << 20
    # no node drains here (high-water mark = capacity): a full cluster stays full
    nodes = tuple(_member(tmp_path / n, postgres_url, GPUFEED_CAPACITY=str(cap), GPUFEED_CLUSTER_DRAIN_HIGH="1",
                          **ENV) for n in "abc")
    a = nodes[0]
    try:
        s3 = a.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
        s3.create_bucket(Bucket="bkt")
        want: dict[str, bytes] = {}
        with pytest.raises(ClientError) as got:
            for i in range(12):  # 3 nodes of 1 MiB, two copies of 256 KiB each: 5 at most
                data = os.urandom(256 << 10)
                s3.put_object(Bucket="bkt", Key=f"k{i}", Body=data)
                want[f"k{i}"] = data
        err = got.value.response
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 507 and err["Error"]["Code"] == "StorageFull"
        assert "the write was not stored" in err["Error"]["Message"]
        assert 3 <= len(want) <= 5
        with pytest.raises(ClientError, match="404"):
            s3.head_object(Bucket="bkt", Key=f"k{len(want)}")
        assert len(_copies(postgres_url)) == len(want)
        ids = {_node_id(n): n for n in nodes}

        def named(node: NodeProcess) -> set[str]:
            return {f for f, holders in _copies(postgres_url).items() if _node_id(node) in holders}
        for node in nodes:  # no node keeps a file of the refused write (its orphan sweep takes a copy pushed
            # to one target when another, whose heartbeat was behind, refused it)
            assert folder_bytes(node.data_dir) <= cap
            wait_for(lambda node=node: _data_files(node) == named(node), 10)
            assert not list((node.data_dir / "tmp").glob("*"))

        def settled() -> bool:  # one node at most could take another copy, as the heartbeats say, once
            # they count no file of the refused write (the writer's own counts while it is in its folder)
            rows = _figures(a)
            return all(rows[n]["bytes_stored"] <= cap == rows[n]["capacity_bytes"] for n in ids) and \
                sum(rows[n]["free_bytes"] >= 256 << 10 for n in ids) <= 1
        wait_for(settled, 10)
        _read_everywhere(nodes, want)
    finally:
        for n in nodes:
            n.stop()


def test_a_write_short_of_nodes_only_for_lack_of_room_is_storage_full():
    skipped = "node n1: 0 bytes free by its last heartbeat, the file has 54333 (StorageFull)"
    refused = ("node n2 at 127.0.0.1:19202: the node refused (StorageFull, after 0.00 s): this node is full: 54333 "
               "bytes more do not fit in its 32540 free bytes")
    for errors in ([skipped, refused], [skipped], [refused]):
        assert isinstance(short_error("t", errors), StorageFull)
    for errors in ([skipped, "node n3 at 127.0.0.1:19302: [Errno 111] Connection refused"], []):
        assert isinstance(short_error("t", errors), ServiceUnavailable)
