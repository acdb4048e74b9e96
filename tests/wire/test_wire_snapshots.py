"""Bucket snapshots over the fast path with the SDK (``snapshot=`` on head,
get, get_into, get_many_into, map_object and list), over TCP and shm, against
live nodes; and a snapshot's data surviving overwrites, deletes and a node
restart (the start-up sweep keeps what snapshots pin)."""

from __future__ import annotations

import uuid

import pytest

from gpufeed.admin import RemoteAdmin
from gpufeed.client import Client, ReadRequest
from gpufeed.errors import InvalidArgument, NoSuchKey, NoSuchSnapshot
from gpufeed.testing.node import start_node
from gpufeed.wire import protocol as p

BIG = bytes(range(256)) * 8192  # 2 MiB: several staging slots, a split TCP read


def _snapshot(node, bucket: str, name: str) -> dict:
    a = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    try:
        return a.snapshot_create(bucket, name)
    finally:
        a.close()


@pytest.fixture(params=["tcp", "shm"])
def client(node, request):
    with Client(node.tcp_url if request.param == "tcp" else node.shm_url, **node.credentials) as c:
        yield c


@pytest.fixture
def snapped(node, client):
    bucket = "ws-" + uuid.uuid4().hex[:10]
    client.create_bucket(bucket)
    client.put(bucket, "big", BIG)
    client.put(bucket, "small", b"old")
    client.put(bucket, "gone", b"g")
    _snapshot(node, bucket, "s1")
    client.put(bucket, "big", b"replaced")
    client.put(bucket, "small", b"new!")
    client.delete(bucket, "gone")
    client.put(bucket, "later", b"l")
    return bucket


def test_sdk_reads_a_snapshot(client, snapped):
    assert client.supports_snapshots
    assert client.head(snapped, "big", snapshot="s1").size == len(BIG)
    assert bytes(client.get(snapped, "big", snapshot="s1")) == BIG
    assert bytes(client.get(snapped, "small", snapshot="s1", offset=1)) == b"ld"
    assert bytes(client.get(snapped, "gone", snapshot="s1")) == b"g"
    buf = bytearray(len(BIG))
    assert client.get_into(snapped, "big", buf, snapshot="s1") == len(BIG) and bytes(buf) == BIG
    reg = client.alloc(len(BIG))
    assert client.get_into(snapped, "big", reg, snapshot="s1") == len(BIG) and bytes(reg) == BIG
    a, b = bytearray(3), bytearray(4)
    assert client.get_many_into([ReadRequest(snapped, "small", a, snapshot="s1"),
                                 ReadRequest(snapped, "small", b)]) == [3, 4]
    assert (bytes(a), bytes(b)) == (b"old", b"new!")
    assert [e.key for e in client.list(snapped, snapshot="s1")] == ["big", "gone", "small"]
    assert [e.key for e in client.list(snapped)] == ["big", "later", "small"]
    if client.supports_map:
        assert bytes(client.map_object(snapped, "big", snapshot="s1")) == BIG
    assert bytes(client.get(snapped, "big")) == b"replaced"


def test_sdk_snapshot_errors(client, snapped):
    with pytest.raises(NoSuchSnapshot):
        client.get(snapped, "big", snapshot="nope")
    with pytest.raises(NoSuchSnapshot):
        list(client.list(snapped, snapshot="nope"))
    with pytest.raises(NoSuchKey):
        client.head(snapped, "later", snapshot="s1")
    with pytest.raises(InvalidArgument):
        client.get(snapped, "big", snapshot="../x")
    with pytest.raises(InvalidArgument):
        client.head(snapped, "big", snapshot="")
    errors: list = []
    client.get_many_into([ReadRequest(snapped, "big", bytearray(4), snapshot="nope")], errors_out=errors)
    assert isinstance(errors[0], NoSuchSnapshot)


def test_requests_without_a_snapshot_keep_their_frames():
    assert p.encode(p.List("bkt")) == bytes([0x96]) + bytes([0xA3]) + b"bkt" + bytes([0xA0, 0xA0, 0xC0]) + \
        bytes([0xCD, 0x03, 0xE8, 0xA0])
    assert p.encode(p.Head("bkt", "k", snapshot="s")) == bytes([0x94, 0xA3]) + b"bkt" + bytes([0xA1]) + b"k" + \
        bytes([0xC0, 0xA1]) + b"s"
    assert p.decode(p.Head, p.encode(p.Head("bkt", "k"))) == p.Head("bkt", "k")


def test_snapshot_data_survives_overwrite_delete_and_restart(tmp_path):
    node = start_node(tmp_path / "data")
    try:
        with Client(node.tcp_url, **node.credentials) as c:
            c.create_bucket("pinned")
            for i in range(20):
                c.put("pinned", f"k{i}", f"v{i}".encode() * 1000)
            _snapshot(node, "pinned", "before")
            for i in range(20):
                if i % 2:
                    c.delete("pinned", f"k{i}")
                else:
                    c.put("pinned", f"k{i}", b"overwritten")
    finally:
        assert node.stop() == 0
    node = start_node(tmp_path / "data")
    try:
        with Client(node.shm_url, **node.credentials) as c:
            for i in range(20):
                assert bytes(c.get("pinned", f"k{i}", snapshot="before")) == f"v{i}".encode() * 1000
            assert sorted(e.key for e in c.list("pinned")) == sorted(f"k{i}" for i in range(0, 20, 2))
            assert bytes(c.get("pinned", "k0")) == b"overwritten"
    finally:
        assert node.stop() == 0
