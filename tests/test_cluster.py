"""``gpufeed serve --catalog postgresql://... --cluster NAME`` nodes as an operator
runs them: they register, heartbeat and leave; ``gpufeed admin cluster status``
shows them live, left or expired (a node killed with SIGKILL); a second cluster
on one database, a copied data folder and settings that cannot work are refused
at start with one clear line; the database going away mid-run is logged and
ridden out. Heartbeats and expiry are shortened through their settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from gpufeed.admin import RemoteAdmin, catalog_cluster_status
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.errors import InvalidArgument
from gpufeed.testing.node import NodeProcess, start_node, wait_for

FAST = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "1.5"}


def _gf(*args, env=None, timeout_s=60):
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True,
                          env={**os.environ, **FAST, **(env or {})}, timeout=timeout_s)


def _member(path, url: str, cluster: str = "c1") -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", cluster], env=FAST)


def _status(node: NodeProcess) -> dict:
    return RemoteAdmin(node.s3_url, node.access_key, node.secret_key).cluster_status()


def _health(report: dict) -> dict[int, str]:
    return {n["s3_port"]: n["health"] for n in report["nodes"]}


def _port(node: NodeProcess) -> int:
    return int(node.s3_url.rsplit(":", 1)[1])



def test_nodes_join_leave_and_expire(tmp_path, postgres_url):
    nodes = [_member(tmp_path / f"n{i}", postgres_url) for i in range(3)]
    try:
        assert nodes[0].warnings == () and nodes[2].warnings == ()  # replication factor 2: no warning
        report = _status(nodes[0])
        assert report["cluster"] == "c1" and report["live"] == 3 and report["expiry_s"] == 1.5
        assert set(_health(report).values()) == {"live"}
        assert report["under_replicated_chunks"] == 0 and report["replicas"] == 2
        assert "fewer copies on live nodes" in report["under_replicated_note"]
        for n in report["nodes"]:
            assert n["host"] == "127.0.0.1" and n["wire_port"] > 0 and n["since_heartbeat_s"] < 1.5
            assert n["node_id"] == (tmp_path / f"n{[_port(x) for x in nodes].index(n['s3_port'])}" / "node.id"
                                    ).read_text().strip()
        assert _health(_status(nodes[2])) == _health(report)  # every node answers for the whole cluster
        assert nodes[1].stop() == 0, nodes[1].log_path.read_text()  # a clean stop leaves at once
        assert _health(_status(nodes[0]))[_port(nodes[1])] == "left"
        nodes[2].kill()  # no leave: the node expires once its heartbeats stop
        started = time.monotonic()

        def expired() -> dict | None:
            r = _status(nodes[0])
            return r if _health(r)[_port(nodes[2])] == "expired" else None

        report = wait_for(expired)
        assert time.monotonic() - started < 5
        assert report["live"] == 1 and _health(report)[_port(nodes[0])] == "live"
        [gone] = [n for n in report["nodes"] if n["s3_port"] == _port(nodes[2])]
        assert gone["since_heartbeat_s"] >= 1.5
        out = _gf("admin", "--url", nodes[0].s3_url, "cluster", "status")  # the table
        assert out.returncode == 0, out.stderr
        assert "cluster c1: 1 of 3 nodes live" in out.stdout and "expired" in out.stdout and "left" in out.stdout
        assert "under-replicated chunks: 0 (replication factor 2" in out.stdout
        out = _gf("admin", "--catalog", postgres_url, "cluster", "status", "--json")  # no node asked
        assert out.returncode == 0, out.stderr
        assert _health(json.loads(out.stdout)) == _health(report)
    finally:
        for n in nodes:
            n.stop()


def test_restart_after_kill_keeps_its_id_and_a_copy_is_refused(tmp_path, postgres_url):
    a = _member(tmp_path / "a", postgres_url)
    try:
        shutil.copytree(tmp_path / "a", tmp_path / "copy", ignore=shutil.ignore_patterns("*.sock"))
        out = _gf("serve", "--data-dir", str(tmp_path / "copy"), "--s3-port", "0", "--port", "0", "--socket", "",
                  "--catalog", postgres_url, "--cluster", "c1")
        assert out.returncode == 1 and "Traceback" not in out.stderr
        node_id = (tmp_path / "a" / "node.id").read_text().strip()
        assert out.stderr.startswith(f"error: NodeIdInUse: node id {node_id} of cluster 'c1' is held by a live "
                                     f"member at 127.0.0.1:{_port(a)}"), out.stderr
        a.kill()
        a = _member(tmp_path / "a", postgres_url)  # at once: same machine and folder, the old process is gone
        report = _status(a)
        assert report["live"] == 1 and [n["s3_port"] for n in report["nodes"]] == [_port(a)]
    finally:
        a.stop()
    out = _gf("admin", "--data-dir", str(tmp_path / "a"), "--catalog", postgres_url, "cluster", "status", "--json",
              env={"GPUFEED_CLUSTER": "c1"})  # the stopped node's folder
    assert out.returncode == 0, out.stderr
    assert [n["health"] for n in json.loads(out.stdout)["nodes"]] == ["left"]


def test_a_second_cluster_on_one_database_is_refused(tmp_path, postgres_url):
    a = _member(tmp_path / "a", postgres_url)
    try:
        out = _gf("serve", "--data-dir", str(tmp_path / "b"), "--s3-port", "0", "--port", "0", "--socket", "",
                  "--catalog", postgres_url, "--cluster", "other")
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert out.stderr.startswith("error: CatalogInUse: the catalog at ") and "belongs to 'cluster:c1'" in out.stderr
        assert "'cluster:other'" in out.stderr and "same --cluster NAME" in out.stderr
        assert _status(a)["live"] == 1  # the running cluster is untouched
    finally:
        a.stop()


def test_database_down_mid_run_is_logged_and_ridden_out(tmp_path, postgres_server, postgres_url):
    a = _member(tmp_path / "a", postgres_url)
    try:
        postgres_server.stop()
        try:
            wait_for(lambda: "heartbeat failed, retrying" in a.log_path.read_text())
            assert a.proc.poll() is None  # still serving
        finally:
            postgres_server.start()
        wait_for(lambda: "heartbeats resumed after" in a.log_path.read_text())
        assert _status(a)["live"] == 1
    finally:
        assert a.stop() == 0, a.log_path.read_text()
    assert [n["health"] for n in catalog_cluster_status(postgres_url)["nodes"]] == ["left"]


def test_the_cluster_call_is_authenticated_and_needs_a_cluster(tmp_path, postgres_url):
    a = _member(tmp_path / "a", postgres_url)
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{a.s3_url}/_gpufeed/admin/cluster", timeout=10)
        assert err.value.code == 403
        err.value.close()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(f"{a.s3_url}/_gpufeed/admin/cluster", method="DELETE"),
                                   timeout=10)
        assert err.value.code == 403  # unsigned: refused before the method is looked at
        err.value.close()
    finally:
        a.stop()


def test_status_from_a_catalog_no_cluster_owns_is_refused(postgres_url):
    PostgresCatalog(postgres_url, owner="node:solo").close()
    with pytest.raises(InvalidArgument, match="belongs to no cluster \\(owner 'node:solo'\\)"):
        catalog_cluster_status(postgres_url)
    with pytest.raises(InvalidArgument, match="needs the cluster's PostgreSQL catalog"):
        catalog_cluster_status("")


def test_sqlite_node_is_a_one_node_cluster_and_bad_settings_are_refused(tmp_path):
    a = start_node(tmp_path / "a", extra_args=["--cluster", "solo"], env=FAST)
    try:
        assert any("SQLite catalog has this node as its only member" in w for w in a.warnings)
        report = _status(a)
        assert report["cluster"] == "solo" and report["live"] == 1
    finally:
        a.stop()
    b = start_node(tmp_path / "b")
    try:
        with pytest.raises(InvalidArgument, match="not in a cluster"):
            _status(b)
    finally:
        b.stop()
    out = _gf("serve", "--data-dir", str(tmp_path / "c"), "--s3-port", "0", "--port", "0", "--socket", "",
              "--cluster", "solo", env={"GPUFEED_CLUSTER_EXPIRY_S": "0.2"})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "the cluster expiry (0.2 s) must be longer than the heartbeat interval (0.2 s)" in out.stderr
    assert not (tmp_path / "c").exists()  # a refused start leaves nothing behind


def test_a_member_whose_id_was_taken_over_logs_it_and_keeps_trying(tmp_path, caplog):
    """After this process's row expired and another process took the id, the
    heartbeat is refused; the member logs it once, keeps serving, and gets the
    id back once the other process leaves."""
    from gpufeed._cluster import ClusterMember
    from gpufeed.engine._membership import LocalMembership, NodeClaim

    m = LocalMembership()
    member = ClusterMember(m, cluster="c1", node_id="n1", host="127.0.0.1", s3_port=9000, wire_port=0,
                           data_dir=tmp_path, heartbeat_s=0.05, expiry_s=0.5, count_bytes=lambda: 7)
    caplog.set_level("INFO", logger="gpufeed.cluster")
    member.join()
    try:
        other = NodeClaim("c1", "n1", "10.0.0.2", 9100, 0, "other", "elsewhere", "/copy")
        m.register(other, expiry_s=0)  # as if this member's row had expired
        wait_for(lambda: "this node keeps trying" in caplog.text)
        assert caplog.text.count("this node keeps trying") == 1
        assert [n.s3_port for n in m.nodes("c1")] == [9100]
        m.leave(other)
        wait_for(lambda: "registered again" in caplog.text)
        [back] = m.nodes("c1")
        assert (back.s3_port, back.state, back.bytes_stored) == (9000, "up", 7)
    finally:
        member.stop()
    assert [n.state for n in m.nodes("c1")] == ["left"]
