"""KV buckets over the fast path: creation with a policy, eviction on puts,
BUCKET_STATS, and old clients that send CREATE_BUCKET as just ``[bucket]``."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import msgspec
import pytest

from gpufeed.client import AsyncClient, Client, parse_url
from gpufeed.errors import EntityTooLarge, InvalidArgument, NoSuchBucket, NoSuchKey
from gpufeed.testing.wire_fuzz import authenticate_raw
from gpufeed.wire import protocol as p

KB = 1 << 10


@pytest.fixture(params=["tcp", "shm"])
def client(request, node):
    with Client(node.tcp_url if request.param == "tcp" else node.shm_url) as c:
        yield c


def _name() -> str:
    return "kvw-" + uuid.uuid4().hex[:12]


def test_kv_bucket_evicts_lru_and_never_refuses(client):
    b = _name()
    client.create_bucket(b, kind="kv", capacity_bytes=8 * KB)
    for i in range(8):
        client.put(b, f"k{i}", bytes([i]) * KB)
    assert bytes(client.get(b, "k0")) == bytes([0]) * KB  # keeps k0 alive
    for i in range(8, 40):
        client.put(b, f"k{i}", bytes([i]) * KB)
        client.head(b, "k0")
    keys = [e.key for e in client.list(b)]
    assert "k0" in keys and len(keys) == 8
    with pytest.raises(NoSuchKey):
        client.head(b, "k1")
    stats = client.bucket_stats(b)
    assert stats.pop("data")["logical_bytes"] == 8 * KB
    assert stats == {"kind": "kv", "capacity_bytes": 8 * KB, "ttl_s": 0.0, "bytes": 8 * KB,
                     "objects": 8, "evictions": 32, "expirations": 0, "etag_policy": "md5"}
    with pytest.raises(EntityTooLarge):
        client.put(b, "huge", bytes(8 * KB + 1))
    assert client.bucket_stats(b)["objects"] == 8  # the refused put dropped nothing


def test_standard_bucket_stats_and_bad_policies(client):
    b = _name()
    client.create_bucket(b)
    client.put(b, "x", bytes(3 * KB))
    stats = client.bucket_stats(b)
    assert stats.pop("data")["stored_bytes"] == 3 * KB
    assert stats == {"kind": "standard", "capacity_bytes": 0, "ttl_s": 0.0,
                     "bytes": 3 * KB, "objects": 1, "evictions": 0,
                     "expirations": 0, "etag_policy": "md5"}
    with pytest.raises(InvalidArgument):
        client.create_bucket(_name(), kind="kv")  # needs a capacity or a TTL
    with pytest.raises(InvalidArgument):
        client.create_bucket(_name(), kind="kv", capacity_bytes="big")  # checked before sending
    with pytest.raises(NoSuchBucket):
        client.bucket_stats(_name())
    client.put(b, "y", b"still connected")


def test_ttl_over_the_wire(client):
    b = _name()
    client.create_bucket(b, kind="kv", ttl_s=0.4)
    client.put(b, "k", b"v")
    assert bytes(client.get(b, "k")) == b"v"
    time.sleep(0.5)
    with pytest.raises(NoSuchKey):
        client.get(b, "k")
    assert list(client.list(b)) == []
    assert client.bucket_stats(b)["expirations"] == 1


def test_async_client_creates_kv_bucket(node):
    b = _name()

    async def main() -> dict:
        async with AsyncClient(node.tcp_url) as ac:
            await ac.create_bucket(b, kind="kv", capacity_bytes=2 * KB, ttl_s=60)
            for i in range(4):
                await ac.put(b, f"k{i}", bytes(KB))
            return await ac.bucket_stats(b)

    stats = asyncio.run(main())
    assert (stats["kind"], stats["bytes"], stats["objects"], stats["evictions"]) == ("kv", 2 * KB, 2, 2)


def test_old_client_create_bucket_frame_still_works(node):
    """A client from before KV buckets sends CREATE_BUCKET metadata ``[bucket]``."""
    b = _name()
    host, port = parse_url(node.tcp_url)[1]
    with socket.create_connection((host, port), timeout=10) as s:

        def call(op: int, meta: bytes) -> tuple[int, bytes]:
            s.sendall(p.pack_header(op, len(meta), 7) + meta)
            hdr = b""
            while len(hdr) < p.HEADER_SIZE:
                hdr += s.recv(p.HEADER_SIZE - len(hdr))
            rop, mlen, rid, plen = p.unpack_header(hdr)
            body = b""
            while len(body) < mlen:
                body += s.recv(mlen - len(body))
            assert rid == 7 and plen == 0
            return rop, body

        authenticate_raw(s, "tcp")  # nodes authenticate every client now
        rop, _ = call(p.Op.CREATE_BUCKET, msgspec.msgpack.encode([b]))
        assert rop == p.Op.CREATE_BUCKET | p.REPLY
    with Client(node.tcp_url) as c:
        assert c.bucket_stats(b)["kind"] == "standard"
