"""Multipart uploads through any node of a cluster (``gpufeed serve --catalog
postgresql://... --cluster NAME`` subprocesses on one throwaway PostgreSQL,
replication factor 2): parts spread over the nodes by boto3, each part on two
nodes before UploadPart is answered, completion and abort through any node,
no part file left on any node afterwards, a node killed with SIGKILL after it
took parts, and races between nodes.

Source: "Uploading and copying objects using multipart upload", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html
"""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from gpufeed._peers import PeerLink, call, read_reply
from gpufeed.admin import RemoteAdmin
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.errors import HolderUnavailable
from gpufeed.testing.node import NodeProcess, start_node, wait_for
from gpufeed.wire import protocol as p

FAST = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "1.5",
        "GPUFEED_CLUSTER_FETCH_TIMEOUT_S": "3", "GPUFEED_CLUSTER_COPY_TIMEOUT_S": "3",
        "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.3"}
MIB = 1 << 20


def _cluster(tmp_path: Path, url: str, n: int = 3) -> list[NodeProcess]:
    nodes: list[NodeProcess] = []
    try:
        for name in "abcd"[:n]:
            nodes.append(start_node(tmp_path / name, extra_args=["--catalog", url, "--cluster", "c1"], env=FAST))
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def _part_files(node: NodeProcess, upload_id: str | None = None) -> list[str]:
    """The part files in ``node``'s folder (of one upload, or of all)."""
    root = node.data_dir / "uploads"
    dirs = [root / upload_id] if upload_id else [d for d in root.iterdir() if d.is_dir()]
    return sorted(f.name for d in dirs if d.is_dir() for f in d.iterdir())


def _error(call) -> str:
    with pytest.raises(ClientError) as got:
        call()
    return got.value.response["Error"]["Code"]


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data).hexdigest() + '"'


def _multipart_etag(parts: list[bytes]) -> str:
    joined = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f'"{joined}-{len(parts)}"'


def _settled(nodes: list[NodeProcess]) -> None:
    """Wait until the cluster counts no chunk under-replicated, through each node."""
    for node in nodes:
        admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
        assert wait_for(lambda admin=admin: admin.cluster_status()["under_replicated_chunks"] == 0, 20)


def test_parts_through_every_node_complete_through_another_and_read_through_all(tmp_path, postgres_url):
    nodes = _cluster(tmp_path, postgres_url)
    try:
        s3 = [n.boto3_client() for n in nodes]
        s3[0].create_bucket(Bucket="mpu")
        source = os.urandom(6 * MIB)
        s3[0].put_object(Bucket="mpu", Key="source", Body=source)
        up = s3[0].create_multipart_upload(Bucket="mpu", Key="big", ContentType="application/x-test",
                                           Metadata={"who": "cluster"})["UploadId"]
        parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), source[:5 * MIB], os.urandom(1000)]
        etags = []
        for i, data in enumerate(parts):
            client = s3[i % 3]
            if i == 2:  # UploadPartCopy through the third node
                r = client.upload_part_copy(Bucket="mpu", Key="big", UploadId=up, PartNumber=3,
                                            CopySource={"Bucket": "mpu", "Key": "source"},
                                            CopySourceRange=f"bytes=0-{5 * MIB - 1}")
                etags.append(r["CopyPartResult"]["ETag"])
            else:
                etags.append(client.upload_part(Bucket="mpu", Key="big", UploadId=up, PartNumber=i + 1,
                                                Body=data)["ETag"])
        assert etags == [_etag(d) for d in parts]
        # every node lists the same parts and the upload; each part file is on two nodes
        listed = [c.list_parts(Bucket="mpu", Key="big", UploadId=up)["Parts"] for c in s3]
        assert all([(p["PartNumber"], p["ETag"], p["Size"]) for p in got] ==
                   [(i + 1, e, len(d)) for i, (e, d) in enumerate(zip(etags, parts))] for got in listed)
        for c in s3:
            assert [u["UploadId"] for u in c.list_multipart_uploads(Bucket="mpu")["Uploads"]] == [up]
        held = [f for n in nodes for f in _part_files(n, up)]
        assert len(held) == 8 and all(held.count(f) == 2 for f in held)
        # S3's errors, through a node that did not start the upload
        b = s3[1]
        done = [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]
        assert _error(lambda: b.complete_multipart_upload(Bucket="mpu", Key="big", UploadId=up, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": _etag(b"other")}]})) == "InvalidPart"
        assert _error(lambda: b.complete_multipart_upload(Bucket="mpu", Key="big", UploadId=up, MultipartUpload={
            "Parts": [done[1], done[0]]})) == "InvalidPartOrder"
        tiny = s3[2].upload_part(Bucket="mpu", Key="big", UploadId=up, PartNumber=5, Body=b"x")["ETag"]
        assert _error(lambda: b.complete_multipart_upload(Bucket="mpu", Key="big", UploadId=up, MultipartUpload={
            "Parts": [done[3], {"PartNumber": 5, "ETag": tiny}]})) == "EntityTooSmall"
        assert _error(lambda: b.upload_part(Bucket="mpu", Key="big", UploadId="0" * 32, PartNumber=1,
                                            Body=b"x")) == "NoSuchUpload"
        # completion through the node that holds the fewest part files: it fetches the others' parts
        fewest = min(range(3), key=lambda i: len(_part_files(nodes[i], up)))
        assert len(_part_files(nodes[fewest], up)) < 4
        r = s3[fewest].complete_multipart_upload(Bucket="mpu", Key="big", UploadId=up,
                                                 MultipartUpload={"Parts": done})
        assert r["ETag"] == _multipart_etag(parts)
        want = b"".join(parts)
        for c in s3:
            got = c.get_object(Bucket="mpu", Key="big")
            assert got["Body"].read() == want
            assert got["ETag"] == r["ETag"] and got["ContentType"] == "application/x-test"
            assert got["Metadata"] == {"who": "cluster"}
            assert c.head_object(Bucket="mpu", Key="big", PartNumber=2)["ContentLength"] == 5 * MIB
        again = s3[0].complete_multipart_upload(Bucket="mpu", Key="big", UploadId=up, MultipartUpload={"Parts": done})
        assert again["ETag"] == r["ETag"]
        for c in s3:
            assert _error(lambda c=c: c.upload_part(Bucket="mpu", Key="big", UploadId=up, PartNumber=1,
                                                    Body=b"x")) == "NoSuchUpload"
            assert c.list_multipart_uploads(Bucket="mpu").get("Uploads", []) == []
        assert all(_part_files(n) == [] for n in nodes)  # no part file left on any node
        _settled(nodes)
    finally:
        for n in nodes:
            n.stop()


class _RoundRobin:
    """Sends each request of one boto3 client to the next node (rewritten before
    it is signed, as a load balancer in front of the nodes would spread them)."""

    def __init__(self, nodes: list[NodeProcess]) -> None:
        self._next = itertools.cycle([n.s3_url for n in nodes])
        self._lock = threading.Lock()
        self.sent: dict[str, int] = {}

    def __call__(self, request, **_kw) -> None:
        with self._lock:
            url = next(self._next)
        self.sent[url] = self.sent.get(url, 0) + 1
        rest = request.url.split("://", 1)[1].split("/", 1)[1]
        request.url = f"{url}/{rest}"


def test_upload_file_through_a_round_robin_of_nodes_and_abort_through_another(tmp_path, postgres_url):
    nodes = _cluster(tmp_path, postgres_url)
    try:
        s3 = [n.boto3_client() for n in nodes]
        s3[0].create_bucket(Bucket="mpu")
        spread = nodes[0].boto3_client()
        robin = _RoundRobin(nodes)
        spread.meta.events.register("before-sign.s3", robin)
        data = os.urandom(23 * MIB)
        path = tmp_path / "big.bin"
        path.write_bytes(data)
        config = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB, max_concurrency=3)
        spread.upload_file(str(path), "mpu", "file", Config=config)
        assert len(robin.sent) == 3 and sum(robin.sent.values()) >= 7  # create, 5 parts, complete
        for c in s3:
            assert c.get_object(Bucket="mpu", Key="file")["Body"].read() == data
        out = tmp_path / "back.bin"
        spread.download_file("mpu", "file", str(out), Config=config)
        assert out.read_bytes() == data
        # an upload started on one node, parts through two, aborted through the third
        up = s3[0].create_multipart_upload(Bucket="mpu", Key="dropped")["UploadId"]
        for i, c in enumerate(s3[:2]):
            c.upload_part(Bucket="mpu", Key="dropped", UploadId=up, PartNumber=i + 1, Body=os.urandom(MIB))
        assert sum(len(_part_files(n, up)) for n in nodes) == 4
        s3[2].abort_multipart_upload(Bucket="mpu", Key="dropped", UploadId=up)
        assert all(_part_files(n) == [] for n in nodes)
        assert not any((n.data_dir / "uploads" / up).exists() for n in nodes)
        for c in s3:
            assert _error(lambda c=c: c.list_parts(Bucket="mpu", Key="dropped", UploadId=up)) == "NoSuchUpload"
            assert _error(lambda c=c: c.abort_multipart_upload(Bucket="mpu", Key="dropped", UploadId=up)) == \
                "NoSuchUpload"
        _part_op_is_for_members_and_checked(nodes, postgres_url)
        _settled(nodes)
    finally:
        for n in nodes:
            n.stop()


def _part_op_is_for_members_and_checked(nodes: list[NodeProcess], url: str) -> None:
    """PART answers node keys only; a copy whose bytes fail their MD5 is refused and
    nothing of it kept; names that are not part files, and the folder of an open
    upload, are refused."""
    a, b = nodes[0], nodes[1]
    up = a.boto3_client().create_multipart_upload(Bucket="mpu", Key="checked")["UploadId"]
    host, port = b.tcp_url.removeprefix("gpufeed+tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:  # the node's own S3 key
        hello = call(sock, p.Op.HELLO, p.Hello("t"), p.HelloReply)
        mine = os.urandom(32)
        proof = p.auth_proof(p.auth_key(a.secret_key), "client", "tcp", a.access_key, hello.nonce, mine)
        call(sock, p.Op.AUTH, p.Auth(a.access_key, mine, proof), p.AuthReply)
        with pytest.raises(HolderUnavailable, match="AccessDenied"):
            call(sock, p.Op.PART, p.PartFile("drop", "mpu", "checked", up, []), p.PartFileReply)
    cat = PostgresCatalog(url)
    try:
        node = (a.data_dir / "node.id").read_text().strip()
        link = PeerLink(cat.membership, cluster="c1", node_id=node, expiry_s=1.5, timeout_s=3, fetches=1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            link.authenticate(sock)
            data = b"x" * 5000
            meta = p.encode(p.PartFile("put", "mpu", "checked", up, ["00001." + "ab" * 16], len(data),
                                       hashlib.md5(b"other").hexdigest()))
            sock.sendall(p.pack_header(p.Op.PART, len(meta), 1, len(data)) + meta + data)
            with pytest.raises(HolderUnavailable, match="BadDigest"):
                read_reply(sock, p.Op.PART, time.monotonic())
            with pytest.raises(HolderUnavailable, match="InvalidArgument"):
                call(sock, p.Op.PART, p.PartFile("get", "mpu", "checked", up, ["../../node.id"]), p.PartFileReply)
            with pytest.raises(HolderUnavailable, match="still open"):
                call(sock, p.Op.PART, p.PartFile("drop", "mpu", "checked", up, []), p.PartFileReply)
    finally:
        cat.close()
    assert _part_files(b, up) == []


def test_a_killed_node_that_took_parts_loses_none_and_completion_retried_elsewhere(tmp_path, postgres_url):
    nodes = _cluster(tmp_path, postgres_url)
    a, b, c = nodes
    try:
        s3 = {id(n): n.boto3_client(retries={"max_attempts": 1, "mode": "standard"}) for n in nodes}
        s3[id(a)].create_bucket(Bucket="mpu")
        up = s3[id(a)].create_multipart_upload(Bucket="mpu", Key="k")["UploadId"]
        parts = [os.urandom(5 * MIB) for _ in range(3)] + [os.urandom(77)]
        senders = [a, a, b, a]
        etags = [s3[id(n)].upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=i + 1, Body=d)["ETag"]
                 for i, (n, d) in enumerate(zip(senders, parts))]
        a.kill()  # it received three of the parts: each has a copy on another node
        done = {"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]}
        r = s3[id(c)].complete_multipart_upload(Bucket="mpu", Key="k", UploadId=up, MultipartUpload=done)
        assert r["ETag"] == _multipart_etag(parts)
        for n in (b, c):
            assert s3[id(n)].get_object(Bucket="mpu", Key="k")["Body"].read() == b"".join(parts)
        assert _part_files(b) == [] and _part_files(c) == []
        # a completion cut off by SIGKILL of its node, then sent to another one
        up2 = s3[id(b)].create_multipart_upload(Bucket="mpu", Key="k2")["UploadId"]
        parts2 = [os.urandom(5 * MIB) for _ in range(4)]
        etags2 = [s3[id(n)].upload_part(Bucket="mpu", Key="k2", UploadId=up2, PartNumber=i + 1, Body=d)["ETag"]
                  for i, (n, d) in enumerate(zip([b, c, b, c], parts2))]
        done2 = {"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags2)]}
        cut = threading.Thread(target=_complete_quietly, args=(s3[id(b)], up2, done2), daemon=True)
        cut.start()
        time.sleep(0.05)
        b.kill()
        cut.join(30)
        try:  # nothing or the whole object, never a part of it
            assert s3[id(c)].get_object(Bucket="mpu", Key="k2")["Body"].read() == b"".join(parts2)
        except ClientError as exc:
            assert exc.response["Error"]["Code"] in ("NoSuchKey", "503", "ServiceUnavailable")
        assert wait_for(lambda: _status_live(c) == 1, 10)  # b expired: the completed object's copy needs no b
        r2 = s3[id(c)].complete_multipart_upload(Bucket="mpu", Key="k2", UploadId=up2, MultipartUpload=done2)
        assert r2["ETag"] == _multipart_etag(parts2)
        assert s3[id(c)].get_object(Bucket="mpu", Key="k2")["Body"].read() == b"".join(parts2)
        assert _part_files(c) == []
    finally:
        for n in nodes:
            n.stop()


def _complete_quietly(client, upload_id: str, done: dict) -> None:
    try:
        client.complete_multipart_upload(Bucket="mpu", Key="k2", UploadId=upload_id, MultipartUpload=done)
    except Exception:  # its node is killed under it
        pass


def _status_live(node: NodeProcess) -> int:
    return RemoteAdmin(node.s3_url, node.access_key, node.secret_key).cluster_status()["live"]


def test_races_between_nodes_same_part_number_and_complete_against_abort(tmp_path, postgres_url):
    nodes = _cluster(tmp_path, postgres_url)
    try:
        s3 = [n.boto3_client() for n in nodes]
        s3[0].create_bucket(Bucket="mpu")
        up = s3[0].create_multipart_upload(Bucket="mpu", Key="race")["UploadId"]
        bodies = [os.urandom(5 * MIB) for _ in nodes]
        answers: dict[int, str] = {}
        start = threading.Barrier(len(nodes))

        def send(i: int) -> None:
            start.wait()
            answers[i] = s3[i].upload_part(Bucket="mpu", Key="race", UploadId=up, PartNumber=1,
                                           Body=bodies[i])["ETag"]

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(nodes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(answers.values()) == sorted(_etag(d) for d in bodies)  # every one acknowledged
        [kept] = s3[1].list_parts(Bucket="mpu", Key="race", UploadId=up)["Parts"]
        winner = next(d for d in bodies if _etag(d) == kept["ETag"])
        held = [f for n in nodes for f in _part_files(n, up)]
        assert len(held) == 2 and len(set(held)) == 1  # the replaced parts' files are gone everywhere
        last = s3[0].upload_part(Bucket="mpu", Key="race", UploadId=up, PartNumber=2, Body=b"tail")["ETag"]
        done = {"Parts": [{"PartNumber": 1, "ETag": kept["ETag"]}, {"PartNumber": 2, "ETag": last}]}
        # completion and abort at once, through different nodes: one wins, the other says so
        results: dict[str, object] = {}
        go = threading.Barrier(2)

        def complete() -> None:
            go.wait()
            try:
                results["complete"] = s3[2].complete_multipart_upload(Bucket="mpu", Key="race", UploadId=up,
                                                                      MultipartUpload=done)["ETag"]
            except ClientError as exc:
                results["complete"] = exc.response["Error"]["Code"]

        def abort() -> None:
            go.wait()
            try:
                s3[1].abort_multipart_upload(Bucket="mpu", Key="race", UploadId=up)
                results["abort"] = "ok"
            except ClientError as exc:
                results["abort"] = exc.response["Error"]["Code"]

        threads = [threading.Thread(target=complete), threading.Thread(target=abort)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if results["abort"] == "ok":
            assert results["complete"] == "NoSuchUpload", results
            assert _error(lambda: s3[0].head_object(Bucket="mpu", Key="race")) == "404"
        else:
            assert results["abort"] == "NoSuchUpload" and results["complete"] == _multipart_etag(
                [winner, b"tail"]), results
            for c in s3:
                assert c.get_object(Bucket="mpu", Key="race")["Body"].read() == winner + b"tail"
        assert all(_part_files(n) == [] for n in nodes)
    finally:
        for n in nodes:
            n.stop()
