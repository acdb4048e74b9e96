"""Copies of acknowledged multipart parts after nodes are lost (three
``gpufeed serve --catalog postgresql://... --cluster NAME`` subprocesses,
replication factor 2): once a node that held copies of parts is killed with
SIGKILL and expires, the re-replication pass copies each part again so that
it is on two live nodes; the other original holder of a part can then be
killed too, and the upload completes through the last node, bit-identical.
The cluster status (and the node's metrics) counts the parts short of copies
meanwhile.

Source: docs/cluster.md, "Multipart uploads across nodes".
"""

from __future__ import annotations

import hashlib
import os
import socket
import urllib.request

import pytest

from gpufeed._peers import PeerLink, call
from gpufeed.admin import RemoteAdmin
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.errors import HolderUnavailable
from gpufeed.testing.node import NodeProcess, start_node, wait_for
from gpufeed.wire import protocol as p
from test_cluster_multipart import FAST, MIB, _multipart_etag, _part_files, _status_live


def _holders(nodes: list[NodeProcess], upload_id: str, among: list[int] | None = None) -> dict[str, set[int]]:
    """``{part file: indexes of the nodes (of ``among``, or all) whose folder holds it}``."""
    held: dict[str, set[int]] = {}
    for i, n in enumerate(nodes):
        if among is not None and i not in among:
            continue
        for f in _part_files(n, upload_id):
            held.setdefault(f, set()).add(i)
    return held


def test_parts_are_copied_again_after_a_holder_dies_and_survive_the_other(tmp_path, postgres_url):
    nodes: list[NodeProcess] = []
    try:
        for name in "abc":  # INFO: the members log what they copied again
            nodes.append(start_node(tmp_path / name, extra_args=["--catalog", postgres_url, "--cluster", "c1"],
                                    env={**FAST, "GPUFEED_LOG_LEVEL": "INFO"}))
        s3 = [n.boto3_client(retries={"max_attempts": 1, "mode": "standard"}) for n in nodes]
        s3[0].create_bucket(Bucket="mpu")
        up = s3[0].create_multipart_upload(Bucket="mpu", Key="k")["UploadId"]
        parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), os.urandom(5 * MIB), os.urandom(1234)]
        etags = [s3[i % 3].upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=i + 1, Body=d)["ETag"]
                 for i, d in enumerate(parts)]
        before = _holders(nodes, up)
        assert len(before) == 4 and all(len(h) == 2 for h in before.values())
        _has_answers(nodes[0], nodes[1], up, sorted(before), postgres_url)
        # the node holding the most part files (copies it took among them) dies
        first = max(range(3), key=lambda i: sum(i in h for h in before.values()))
        nodes[first].kill()
        alive = [i for i in range(3) if i != first]
        # each part is on both survivors again, and on no more nodes than that
        assert wait_for(lambda: all(_holders(nodes, up, alive).get(f) == set(alive) for f in before), 20), \
            _holders(nodes, up, alive)
        # the sender logs once its copies are acknowledged, just after the files land
        assert wait_for(lambda: f"upload {up} (mpu/k): copied" in "".join(
            nodes[i].log_path.read_text(errors="replace") for i in alive), 10)
        # the other original holder of a part that the first node held dies too
        lost = next(f for f, h in before.items() if first in h)
        second = next(i for i in before[lost] if i != first)
        nodes[second].kill()
        [last] = [i for i in alive if i != second]
        assert wait_for(lambda: _status_live(nodes[last]) == 1, 15)
        done = {"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]}
        r = s3[last].complete_multipart_upload(Bucket="mpu", Key="k", UploadId=up, MultipartUpload=done)
        assert r["ETag"] == _multipart_etag(parts)
        got = s3[last].get_object(Bucket="mpu", Key="k")["Body"].read()
        assert hashlib.sha256(got).digest() == hashlib.sha256(b"".join(parts)).digest()
        assert _part_files(nodes[last]) == []
    finally:
        for n in nodes:
            n.stop()


def _has_answers(a: NodeProcess, b: NodeProcess, upload_id: str, files: list[str], url: str) -> None:
    """PART ``has`` names the files of those asked that node ``b`` holds, and refuses
    a request naming more than ``PART_HAS_MAX`` files."""
    host, port = b.tcp_url.removeprefix("gpufeed+tcp://").rsplit(":", 1)
    cat = PostgresCatalog(url)
    try:
        node = (a.data_dir / "node.id").read_text().strip()
        link = PeerLink(cat.membership, cluster="c1", node_id=node, expiry_s=1.5, timeout_s=3, fetches=1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            link.authenticate(sock)
            absent = "00009." + "ab" * 16
            reply = _call(sock, p.PartFile("has", "mpu", "k", upload_id, [*files, absent]))
            assert set(reply.files) == set(_part_files(b, upload_id)) and reply.size == len(reply.files)
            too_many = [f"{i:05d}." + "cd" * 16 for i in range(p.PART_HAS_MAX + 1)]
            with pytest.raises(HolderUnavailable, match="InvalidArgument"):
                _call(sock, p.PartFile("has", "mpu", "k", upload_id, too_many))
    finally:
        cat.close()


def _call(sock: socket.socket, req: p.PartFile) -> p.PartFileReply:
    return call(sock, p.Op.PART, req, p.PartFileReply)


def _under_parts(node: NodeProcess) -> tuple[int, int | None]:
    """``(live members, under_replicated_parts)`` of the cluster status through ``node``."""
    r = RemoteAdmin(node.s3_url, node.access_key, node.secret_key).cluster_status()
    return r["live"], r["under_replicated_parts"]


def _gauge(node: NodeProcess, name: str) -> float | None:
    assert node.metrics_url
    for line in urllib.request.urlopen(node.metrics_url, timeout=10).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_status_counts_parts_short_of_copies_until_they_are_copied_again(tmp_path, postgres_url):
    args = ["--catalog", postgres_url, "--cluster", "c1", "--metrics-port", "0"]
    idle = {**FAST, "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "3600"}  # no pass: no copy is made again
    nodes = [start_node(tmp_path / "a", extra_args=args, env=idle)]
    try:
        nodes += [start_node(tmp_path / n, extra_args=args, env=FAST) for n in "bc"]
        s3 = nodes[0].boto3_client(retries={"max_attempts": 1, "mode": "standard"})
        s3.create_bucket(Bucket="mpu")
        up = s3.create_multipart_upload(Bucket="mpu", Key="k")["UploadId"]
        parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), os.urandom(777)]
        etags = [s3.upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=i + 1, Body=d)["ETag"]
                 for i, d in enumerate(parts)]
        assert _under_parts(nodes[0]) == (3, 0)
        report = RemoteAdmin(nodes[0].s3_url, nodes[0].access_key, nodes[0].secret_key).cluster_status()
        assert "parts of open multipart uploads" in report["under_replicated_parts_note"]
        # every part is on a and on the upload's first-ranked other member, which dies
        [holder] = [i for i in (1, 2) if _part_files(nodes[i], up)]
        nodes[holder].kill()
        assert wait_for(lambda: _under_parts(nodes[0])[0] == 2, 15)
        assert _under_parts(nodes[0]) == (2, 3)
        assert wait_for(lambda: _gauge(nodes[0], "gpufeed_cluster_under_replicated_parts") == 3, 15)
        # a starts again with passes: it copies its parts to the other live member
        nodes[0].stop()
        nodes[0] = start_node(tmp_path / "a", extra_args=args, env=FAST)
        other = 3 - holder
        assert wait_for(lambda: _under_parts(nodes[other]) == (2, 0), 20), _under_parts(nodes[other])
        assert len(_part_files(nodes[other], up)) == 3
        assert wait_for(lambda: _gauge(nodes[0], "gpufeed_cluster_under_replicated_parts") == 0, 15)
        done = {"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]}
        r = nodes[other].boto3_client().complete_multipart_upload(Bucket="mpu", Key="k", UploadId=up,
                                                                   MultipartUpload=done)
        assert r["ETag"] == _multipart_etag(parts)
    finally:
        for n in nodes:
            n.stop()
