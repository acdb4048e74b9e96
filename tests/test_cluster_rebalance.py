"""Rebalancing a cluster (``gpufeed serve --catalog postgresql://... --cluster
NAME`` subprocesses on one throwaway PostgreSQL, replication factor 2): a node
that joins takes the data files it ranks among the first two for, the copies
they displace are given up, and a node that comes back after its files were
copied again elsewhere leaves exactly two copies of each; every object reads
bit-identical through every node throughout."""

from __future__ import annotations

import os

from gpufeed.engine._placement import rank
from gpufeed.testing.node import NodeProcess, start_node, wait_for
from test_cluster_replicas import FAST, _copies, _has_file, _node_id, _status

ENV = {**FAST, "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.3"}


def _member(path, url: str) -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", "c1"], env=ENV)


def _read_all(nodes, want: dict[str, bytes]) -> None:
    for node in nodes:
        s3 = node.boto3_client()
        for key, data in want.items():
            assert s3.get_object(Bucket="bal", Key=key)["Body"].read() == data, (node.data_dir, key)


def _placed(url: str, live: list[str]) -> bool:
    """Every data file has exactly two holders, both among ``live``."""
    return all(len(nodes) == 2 and nodes <= set(live) for nodes in _copies(url).values())


def test_a_joining_node_takes_its_share_and_a_returning_one_is_trimmed(tmp_path, postgres_url):
    a, b, c = (_member(tmp_path / n, postgres_url) for n in "abc")
    d = None
    try:
        s3 = a.boto3_client()
        s3.create_bucket(Bucket="bal")
        want = {f"obj/{i}": os.urandom(20_000 + i) for i in range(40)}
        for key, data in want.items():
            s3.put_object(Bucket="bal", Key=key, Body=data)
        # two holders each (a member that looked expired for a moment under load may
        # have got extra copies, which the trim removes)
        assert wait_for(lambda: _placed(postgres_url, list(map(_node_id, (a, b, c)))), 30), _copies(postgres_url)
        assert len(_copies(postgres_url)) == 40

        d = _member(tmp_path / "d", postgres_url)
        ids = {_node_id(n): n for n in (a, b, c, d)}
        new = _node_id(d)

        def joined() -> bool:
            now = _copies(postgres_url)
            return all(len(nodes) == 2 and (new in nodes) == (new in rank(f.encode(), ids)[:2])
                       for f, nodes in now.items())
        assert wait_for(joined, 60), _copies(postgres_url)
        share = sum(new in nodes for nodes in _copies(postgres_url).values())
        assert 8 <= share <= 32  # about factor / n = half of the 40 files
        for f, nodes in _copies(postgres_url).items():  # each holder has the file, the others do not
            for n, node in ids.items():
                assert _has_file(node, f) == (n in nodes), (f, n, nodes)
        _read_all((a, b, c, d), want)
        assert _status(a)["under_replicated_chunks"] == 0

        d.kill()  # its files are copied again onto the three others
        assert wait_for(lambda: _status(a)["live"] == 3 and _status(a)["under_replicated_chunks"] == 0, 30)
        d = _member(tmp_path / "d", postgres_url)  # back: every file ends with two copies again
        assert wait_for(lambda: _placed(postgres_url, list(ids)), 60), _copies(postgres_url)
        for f, nodes in _copies(postgres_url).items():
            for n, node in ids.items():
                assert _has_file(node, f) == (n in nodes), (f, n, nodes)
        _read_all((a, b, c, d), want)
    finally:
        for node in (a, b, c, d):
            if node is not None:
                node.stop()


def test_copies_past_the_factor_are_trimmed(tmp_path, postgres_url):
    three = [start_node(tmp_path / n, extra_args=["--catalog", postgres_url, "--cluster", "c1", "--replicas", "3"],
                        env=ENV) for n in "abc"]
    try:
        s3 = three[0].boto3_client()
        s3.create_bucket(Bucket="bal")
        want = {f"t/{i}": os.urandom(10_000 + i) for i in range(20)}
        for key, data in want.items():
            s3.put_object(Bucket="bal", Key=key, Body=data)
        assert wait_for(lambda: all(len(n) == 3 for n in _copies(postgres_url).values()), 30)
    finally:
        for node in three:
            node.stop()
    two = [_member(tmp_path / n, postgres_url) for n in "abc"]  # the factor is 2 now
    try:
        ids = {_node_id(n): n for n in two}
        assert wait_for(lambda: _placed(postgres_url, list(ids)), 60), _copies(postgres_url)
        for f, nodes in _copies(postgres_url).items():
            for n, node in ids.items():
                assert _has_file(node, f) == (n in nodes), (f, n, nodes)
        _read_all(two, want)
    finally:
        for node in two:
            node.stop()
