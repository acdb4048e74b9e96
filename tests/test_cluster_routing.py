"""Cluster-aware SDK routing (``gpufeed serve --catalog postgresql://...
--cluster NAME`` subprocesses on one throwaway PostgreSQL, factor 2 on three
nodes): LOCATE names the members that hold an object, refuses connections
that have not authenticated and node keys; the routing client reads
bit-identical objects from their holders (the nodes' own request counters
show it), goes on through the given node when a holder is killed and through
another holder when the given node is killed, and is a plain client of a node
outside a cluster."""

from __future__ import annotations

import os
import re
import socket
import urllib.request

import pytest

from gpufeed._peers import PeerLink, call, request
from gpufeed.client import Client, ClusterClient, ReadRequest
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.errors import HolderUnavailable, InvalidArgument, NoSuchKey
from gpufeed.testing.node import NodeProcess, start_node, wait_for
from gpufeed.wire import protocol as p

FAST = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "1.5",
        "GPUFEED_CLUSTER_FETCH_TIMEOUT_S": "3", "GPUFEED_CLUSTER_COPY_TIMEOUT_S": "3",
        "GPUFEED_CLUSTER_REPLICAS": "2"}


def _member(path, url: str) -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", "c1", "--metrics-port", "0"], env=FAST)


def _node_id(node: NodeProcess) -> str:
    return (node.data_dir / "node.id").read_text().strip()


def _holders(url: str) -> dict[str, set[str]]:
    """data file -> every node holding it (holder and copies), from the catalog."""
    cat = PostgresCatalog(url)
    try:
        return {c.file: {c.holder, *cat.file_copies(c.file)} for c in cat.scan_chunks("", 100_000)}
    finally:
        cat.close()


def _gets(node: NodeProcess) -> int:
    """Fast-path GET and GETV requests the node answered (its metrics)."""
    assert node.metrics_url
    text = urllib.request.urlopen(node.metrics_url, timeout=10).read().decode()
    return sum(int(float(v)) for v in re.findall(
        r'^gpufeed_requests_total\{[^}]*front="tcp"[^}]*op="(?:get|getv)"[^}]*\} (\S+)$', text, re.M))


@pytest.fixture
def trio(tmp_path, postgres_url):
    nodes = [_member(tmp_path / n, postgres_url) for n in "abc"]
    yield nodes
    for n in nodes:
        n.stop()


def _write(node: NodeProcess, count: int = 12) -> dict[str, bytes]:
    with Client(node.tcp_url, **node.credentials) as c:
        c.create_bucket("data")
        objs = {f"obj-{i:03d}": os.urandom(100_000 + 7_919 * i) for i in range(count)}
        for k, v in objs.items():
            c.put("data", k, v)
    return objs


def _locate(c: Client, key: str) -> p.LocateReply:
    return c._t.request(p.Op.LOCATE, p.Head("data", key)).result()


def test_locate_names_the_live_members_that_hold_an_object(trio, postgres_url):
    a, b, c = trio
    objs = _write(a)
    ids = {_node_id(n): n for n in trio}
    by_file = _holders(postgres_url)
    with Client(b.tcp_url, **b.credentials) as cl:
        for key in objs:
            got = _locate(cl, key)
            assert got.node == _node_id(b) and got.size == len(objs[key])
            assert len(got.holders) == 2 and set(got.holders) in by_file.values()
            assert {m.node_id for m in got.members} == set(ids) and all(m.live and m.wire_port for m in got.members)
        with pytest.raises(NoSuchKey):
            _locate(cl, "missing")
    c.kill()
    with Client(a.tcp_url, **a.credentials) as cl:
        wait_for(lambda: not any(m.live for m in _locate(cl, "obj-000").members if m.node_id == _node_id(c)))
        for key in objs:  # an expired holder is not named
            assert _node_id(c) not in _locate(cl, key).holders


def test_locate_is_refused_before_auth_and_to_node_keys(trio, postgres_url):
    a, _, c = trio
    _write(a, 1)
    host, port = a.tcp_url.removeprefix("gpufeed+tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        call(sock, p.Op.HELLO, p.Hello("t"), p.HelloReply)
        with pytest.raises(HolderUnavailable, match="AccessDenied"):
            request(sock, p.Op.LOCATE, p.Head("data", "obj-000"))
    cat = PostgresCatalog(postgres_url)
    try:  # node c's own node key: a peer, which may name no bucket
        link = PeerLink(cat.membership, cluster="c1", node_id=_node_id(c), expiry_s=1.5, timeout_s=3, fetches=1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            link.authenticate(sock)
            with pytest.raises(HolderUnavailable, match="AccessDenied"):
                request(sock, p.Op.LOCATE, p.Head("data", "obj-000"))
    finally:
        cat.close()


def test_routing_client_reads_from_the_holders(trio, postgres_url):
    a, b, c = trio
    objs = _write(a, 24)  # b and c each hold about 12: each is picked for some (all but surely)
    ids = {_node_id(n): n for n in trio}
    with ClusterClient(a.tcp_url, **a.credentials) as cl:
        for key, data in objs.items():
            holders = set(_locate(cl, key).holders)
            before = {nid: _gets(n) for nid, n in ids.items()}
            assert bytes(cl.get("data", key)) == data
            buf = bytearray(len(data))
            assert cl.get_into("data", key, buf) == len(data) and buf == data
            def counted(before=before) -> dict | None:  # a node counts a request as its reply leaves
                now = {nid: _gets(n) for nid, n in ids.items()}
                return now if sum(now.values()) - sum(before.values()) >= 2 else None
            after = wait_for(counted)
            for nid in set(ids) - holders:  # the member without a copy served none of it
                assert after[nid] == before[nid], (key, nid)
            assert sum(after.values()) - sum(before.values()) == 2
        dests = {k: bytearray(len(v)) for k, v in objs.items()}
        assert cl.get_many_into([ReadRequest("data", k, d) for k, d in dests.items()]) == \
            [len(v) for v in objs.values()]
        assert all(dests[k] == v for k, v in objs.items())
        errors: list = []
        n = cl.get_many_into([("data", "obj-001", bytearray(10)), ("data", "nope", bytearray(10))], errors_out=errors)
        assert n[0] == 10 and n[1] == -1 and isinstance(errors[1], NoSuchKey) and "request 1 " in str(errors[1])
        with pytest.raises(NoSuchKey, match="request 1 "):
            cl.get_many_into([("data", "obj-001", bytearray(10)), ("data", "nope", bytearray(10))])
        stats = cl.routing_stats()
        assert cl.routes and cl.given_node == _node_id(a)
        assert set(stats["reads"]) <= set(ids) and len(stats["reads"]) == 3  # the load spreads over all three
        assert stats["fallbacks"] == 0 and stats["locates"] >= len(objs)
    with Client(b.tcp_url.replace("gpufeed+tcp", "gpufeed+cluster"), **b.credentials) as cl:  # the URL form
        assert cl.transport == "cluster"
        assert bytes(cl.get("data", "obj-003")) == objs["obj-003"]


def test_reads_go_on_through_the_given_node_when_a_holder_is_killed(trio):
    a, b, c = trio
    objs = _write(a, 16)
    with ClusterClient(a.tcp_url, **a.credentials, retry_after_s=60.0) as cl:
        for key, data in objs.items():
            assert bytes(cl.get("data", key)) == data
        assert cl.routing_stats()["reads"].get(_node_id(c), 0) > 0
        c.kill()
        dests = [bytearray(len(v)) for v in objs.values()]  # a batch first: c's part goes to a
        assert cl.get_many_into([ReadRequest("data", k, d) for k, d in zip(objs, dests)]) == \
            [len(v) for v in objs.values()]
        assert dests == list(objs.values())
        for key, data in objs.items():  # c is passed over once its connection failed
            assert bytes(cl.get("data", key)) == data
            buf = bytearray(len(data))
            assert cl.submit_get_into("data", key, buf).result() == len(data) and buf == data
        assert cl.routing_stats()["fallbacks"] >= 1


def test_reads_go_on_through_another_holder_when_the_given_node_is_killed(trio):
    a, b, c = trio
    objs = _write(b, 12)  # b holds each object; a holds about half of them
    with ClusterClient(a.tcp_url, **a.credentials) as cl:
        for key, data in objs.items():
            assert bytes(cl.get("data", key)) == data
        a.kill()
        for key, data in objs.items():  # each has a live holder: no read fails
            assert bytes(cl.get("data", key)) == data
            buf = bytearray(len(data))
            assert cl.get_into("data", key, buf) == len(data) and buf == data
        dests = [bytearray(len(v)) for v in objs.values()]
        assert cl.get_many_into([ReadRequest("data", k, d) for k, d in zip(objs, dests)]) == \
            [len(v) for v in objs.values()]
        assert dests == list(objs.values())
        objs["later"] = os.urandom(50_000)  # a key it never located: asked of a live member
        with Client(b.tcp_url, **b.credentials) as w:
            w.put("data", "later", objs["later"])
        assert bytes(cl.get("data", "later")) == objs["later"]


def test_a_node_outside_a_cluster_is_read_as_a_plain_client(tmp_path):
    node = start_node(tmp_path / "solo")
    try:
        objs = _write(node, 3)
        with ClusterClient(node.tcp_url, **node.credentials) as cl:
            for key, data in objs.items():
                assert bytes(cl.get("data", key)) == data
            assert not cl.routes and cl.given_node == ""
            assert cl.routing_stats()["reads"] == {"": 3}
        with pytest.raises(InvalidArgument, match="gpufeed\\+tcp"):
            ClusterClient(node.shm_url)
        with pytest.raises(InvalidArgument, match="locations"):
            ClusterClient(node.tcp_url, **node.credentials, locations=0)
    finally:
        node.stop()


def test_locate_reply_bytes_are_the_spec():
    """LOCATE's reply from docs/wire-protocol.md and the msgpack spec, not from the encoder."""
    reply = p.LocateReply("n1", 5, "e", ["n1"], [p.Member("n1", "h", 9400, True)])
    want = (b"\x95" + b"\xa2n1" + b"\x05" + b"\xa1e" + b"\x91\xa2n1"
            + b"\x91" + b"\x94\xa2n1\xa1h\xcd\x24\xb8\xc3")
    assert p.encode(reply) == want and p.decode(p.LocateReply, want) == reply
    assert p.REQUEST_TYPES[p.Op.LOCATE] is p.Head and p.Op.LOCATE == 25


def test_a_dataset_reads_through_a_cluster_url(trio):
    from gpufeed.ai.data import ObjectDataset

    a, _, _ = trio
    objs = _write(a, 6)
    url = a.tcp_url.replace("gpufeed+tcp", "gpufeed+cluster") + "/data"
    ds = ObjectDataset(url, access_key=a.access_key, secret_key=a.secret_key)
    assert [it.key for it in ds.items] == sorted(objs)
    assert [bytes(x) for x in ds.__getitems__(list(range(len(ds))))] == [objs[k] for k in sorted(objs)]
