"""The fast path end to end: a live `gpufeed serve`, our SDK over TCP and shm."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import uuid

import msgspec
import numpy as np
import pytest

from gpufeed.client import AsyncClient, Client, ReadRequest, parse_url
from gpufeed.errors import (
    InvalidArgument,
    InvalidRange,
    KeyTooLong,
    NoSuchBucket,
    NoSuchKey,
    TransportError,
)
from gpufeed.testing.wire_fuzz import authenticate_raw
from gpufeed.wire import protocol as p

TRANSPORTS = ["tcp", "shm"]


@pytest.fixture(params=TRANSPORTS)
def client(request, node):
    url = node.tcp_url if request.param == "tcp" else node.shm_url
    with Client(url) as c:
        yield c


@pytest.fixture(scope="module")
def setup_client(node):
    """A client for setup only, so tests that pick their own transport run once."""
    with Client(node.tcp_url) as c:
        yield c


@pytest.fixture
def bucket(setup_client):
    name = "wire-" + uuid.uuid4().hex[:12]
    setup_client.create_bucket(name)
    return name


def _data(n: int, seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_put_get_head_list_delete(client, bucket):
    data = _data(1 << 20)
    meta = client.put(bucket, "a/b.bin", data, content_type="application/x-test",
                      metadata={"owner": "me"})
    assert meta.size == len(data) and meta.etag
    head = client.head(bucket, "a/b.bin")
    assert (head.size, head.etag, head.content_type, head.metadata) == (
        len(data), meta.etag, "application/x-test", {"owner": "me"})
    assert bytes(client.get(bucket, "a/b.bin")) == data
    client.put(bucket, "a/c.bin", b"")
    client.put(bucket, "top", b"x")
    assert [e.key for e in client.list(bucket)] == ["a/b.bin", "a/c.bin", "top"]
    entries = list(client.list(bucket, delimiter="/"))
    assert [(e.key, e.is_prefix) for e in entries] == [("a/", True), ("top", False)]
    assert bytes(client.get(bucket, "a/c.bin")) == b""
    client.delete(bucket, "a/b.bin")
    client.delete(bucket, "a/b.bin")  # idempotent
    with pytest.raises(NoSuchKey):
        client.head(bucket, "a/b.bin")


def test_get_into_ranges(client, bucket):
    data = _data(3 << 20, seed=2)
    client.put(bucket, "obj", data)
    buf = bytearray(1000)
    assert client.get_into(bucket, "obj", buf, offset=12345) == 1000
    assert bytes(buf) == data[12345:13345]
    tail = bytearray(5000)
    assert client.get_into(bucket, "obj", tail, offset=len(data) - 10) == 10
    assert bytes(tail[:10]) == data[-10:]
    arr = np.zeros(4096, dtype=np.uint8)
    assert client.get_into(bucket, "obj", arr, offset=4096, length=100) == 100
    assert arr[:100].tobytes() == data[4096:4196] and not arr[100:].any()
    with pytest.raises(InvalidRange):
        client.get_into(bucket, "obj", bytearray(10), offset=len(data))
    with pytest.raises(InvalidArgument):
        client.get_into(bucket, "obj", bytearray(10), length=11)


@pytest.mark.parametrize("registered", [True, False])
def test_large_object_round_trip(client, bucket, registered):
    n = (80 << 20) + 12345  # larger than the split and staging thresholds
    src = client.alloc(n) if registered else bytearray(n)
    np.frombuffer(src, dtype=np.uint8)[:] = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    client.put(bucket, "big", src)
    dst = client.alloc(n + 100) if registered else bytearray(n + 100)
    assert client.get_into(bucket, "big", dst) == n
    assert np.array_equal(np.frombuffer(dst, np.uint8)[:n], np.frombuffer(src, np.uint8))


def test_large_unregistered_puts_over_shm_reuse_pooled_memory(node, bucket):
    """A put from plain memory larger than a staging slot is copied into pooled
    registered memory (not sent through the socket); later puts of a similar size
    reuse it rather than registering more."""
    import gc

    with Client(node.shm_url, slot_bytes=1 << 20) as c:
        datas = [_data(8 << 20, seed=30 + i) for i in range(6)]
        c.put(bucket, "pooled-0", bytearray(datas[0]))
        gc.collect()
        regions = len(c._regions)
        for i, d in enumerate(datas[1:], 1):
            c.put(bucket, f"pooled-{i}", bytearray(d))
            gc.collect()
        assert len(c._regions) == regions
        futs = [c.submit_put(bucket, f"pooled-c{i}", bytearray(d)) for i, d in enumerate(datas)]
        assert all(f.result(timeout=60).size == 8 << 20 for f in futs)
        for i, d in enumerate(datas):
            assert bytes(c.get(bucket, f"pooled-{i}")) == d
            assert bytes(c.get(bucket, f"pooled-c{i}")) == d


def test_get_many_into(client, bucket):
    data = _data(1 << 20, seed=4)
    client.put(bucket, "x", data)
    client.put(bucket, "y", data[::-1])
    region = client.alloc(64 << 10)
    reqs = []
    for i in range(16):
        dest = region[i * 4096:(i + 1) * 4096] if i % 2 else bytearray(4096)
        reqs.append(ReadRequest(bucket, "x" if i % 3 else "y", dest, offset=i * 7919))
    ns = client.get_many_into(reqs)
    assert ns == [4096] * 16
    for i, r in enumerate(reqs):
        src = data if r.key == "x" else data[::-1]
        assert bytes(r.dest) == src[i * 7919:i * 7919 + 4096]
    with pytest.raises(NoSuchKey, match="request 1"):
        client.get_many_into([(bucket, "x", bytearray(4)), (bucket, "nope", bytearray(4))])


def test_typed_errors(client, bucket):
    with pytest.raises(NoSuchBucket):
        client.put("no-such-bucket-here", "k", b"1")
    with pytest.raises(NoSuchKey) as info:
        client.get(bucket, "missing")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(KeyTooLong):
        client.put(bucket, "k" * 1025, b"1")
    client.put(bucket, "k" * 1024, b"ok")
    assert bytes(client.get(bucket, "k" * 1024)) == b"ok"


def test_odd_keys_round_trip(client, bucket):
    keys = ["../../etc/passwd", "%2e%2e/x", "日本/キー", "sp ace", "q?x=1#f", "a" * 1024]
    for i, k in enumerate(keys):
        client.put(bucket, k, str(i).encode())
    for i, k in enumerate(keys):
        assert bytes(client.get(bucket, k)) == str(i).encode()
    assert sorted(keys, key=lambda k: k.encode()) == [e.key for e in client.list(bucket)]


def test_many_requests_in_flight(client, bucket):
    data = _data(256 << 10, seed=5)
    futs = [client.submit_put(bucket, f"k{i}", data[i:]) for i in range(32)]
    for f in futs:
        f.result()
    bufs = [bytearray(len(data)) for _ in range(32)]
    futs = [client.submit_get_into(bucket, f"k{i}", bufs[i]) for i in range(32)]
    assert [f.result() for f in futs] == [len(data) - i for i in range(32)]
    errors = []

    def worker(t):
        try:
            for i in range(t, 32, 4):
                assert bytes(client.get(bucket, f"k{i}")) == data[i:]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_async_client(node, bucket):
    async def main():
        for url in (node.tcp_url, node.shm_url):
            ac = await AsyncClient.connect(url)
            async with ac:
                await asyncio.gather(*(ac.put(bucket, f"async{i}", bytes([i]) * 1000) for i in range(20)))
                bufs = [bytearray(1000) for _ in range(20)]
                ns = await asyncio.gather(*(ac.get_into(bucket, f"async{i}", bufs[i]) for i in range(20)))
                assert ns == [1000] * 20 and all(b == bytes([i]) * 1000 for i, b in enumerate(bufs))
                assert (await ac.head(bucket, "async3")).size == 1000
                assert len(await ac.list(bucket, "async")) == 20

    asyncio.run(main())


def test_url_parsing():
    assert parse_url("gpufeed+tcp://127.0.0.1:9400") == ("tcp", ("127.0.0.1", 9400))
    assert parse_url("gpufeed+shm:///tmp/x.sock") == ("shm", "/tmp/x.sock")
    for bad in ("http://x:1", "gpufeed+tcp://nohost", "gpufeed+shm://"):
        with pytest.raises(InvalidArgument):
            parse_url(bad)
    with pytest.raises(TransportError):
        Client("gpufeed+shm:///nonexistent/gpufeed.sock")


# --- hostile input: raw frames ------------------------------------------------------

def _raw(node):
    """A raw TCP connection that has authenticated (HELLO, AUTH) with the node's key."""
    host, port = parse_url(node.tcp_url)[1]
    sock = socket.create_connection((host, port), timeout=10)
    authenticate_raw(sock, "tcp", node.access_key, node.secret_key)
    return sock


def _read_frame(sock):
    hdr = b""
    while len(hdr) < p.HEADER_SIZE:
        chunk = sock.recv(p.HEADER_SIZE - len(hdr))
        if not chunk:
            return None
        hdr += chunk
    op, meta_len, rid, payload_len = p.unpack_header(hdr)
    meta = b""
    while len(meta) < meta_len:
        meta += sock.recv(meta_len - len(meta))
    return op, rid, meta


def _assert_alive(node, bucket):
    with Client(node.tcp_url, connections=1) as c:
        assert bytes(c.get(bucket, "alive")) == b"yes"


def test_truncated_frames_leave_server_up(node, client, bucket):
    client.put(bucket, "alive", b"yes")
    # half a header
    with _raw(node) as s:
        s.sendall(b"GF\x01")
    # header promising metadata that never comes
    with _raw(node) as s:
        s.sendall(p.pack_header(p.Op.HEAD, 100, 1) + b"\x92")
    # a PUT whose payload stops early: nothing may become visible
    meta = p.encode(p.Put(bucket, "partial", 1 << 20))
    with _raw(node) as s:
        s.sendall(p.pack_header(p.Op.PUT, len(meta), 7, 1 << 20) + meta + b"x" * 1000)
    _assert_alive(node, bucket)
    with pytest.raises(NoSuchKey):
        client.head(bucket, "partial")


def test_bad_frames_get_protocol_errors(node, client, bucket):
    client.put(bucket, "alive", b"yes")
    with _raw(node) as s:
        s.sendall(b"XX" + b"\x00" * 22)
        op, _rid, meta = _read_frame(s)
        assert op == p.ERROR_OP and msgspec.msgpack.decode(meta)[0] == "ProtocolError"
        assert _read_frame(s) is None  # then the server closes
    with _raw(node) as s:  # unknown op
        s.sendall(p.pack_header(99, 0, 5))
        op, rid, meta = _read_frame(s)
        assert (op, rid) == (p.ERROR_OP, 5)
    with _raw(node) as s:  # metadata of the wrong shape
        bad = msgspec.msgpack.encode(["only-bucket"])
        s.sendall(p.pack_header(p.Op.GET, len(bad), 6) + bad)
        op, rid, meta = _read_frame(s)
        assert (op, rid) == (p.ERROR_OP, 6)
    with _raw(node) as s:  # oversized metadata claim
        s.sendall(struct.pack("<2sBBIQQ", b"GF", 1, p.Op.HEAD, p.MAX_META + 1, 8, 0))
        op, _rid, _meta = _read_frame(s)
        assert op == p.ERROR_OP
    with _raw(node) as s:  # a region on TCP is refused
        meta = p.encode(p.Get(bucket, "alive", 0, 3, region=1))
        s.sendall(p.pack_header(p.Op.GET, len(meta), 9) + meta)
        op, rid, meta = _read_frame(s)
        assert op == p.ERROR_OP and msgspec.msgpack.decode(meta)[0] == "InvalidArgument"
    _assert_alive(node, bucket)


def test_shm_region_bounds(node, bucket):
    with Client(node.shm_url) as c:
        c.put(bucket, "obj", b"z" * (4 << 20))
        region = c.alloc(4096)
        conn = c._conns[0]
        reg, _off = c._find_region(region)  # the server may lend a larger region (<= 1 MiB)
        rid = reg.region_id
        with pytest.raises(InvalidArgument):  # write past the region's end
            conn.call(p.Op.GET, p.Get(bucket, "obj", 0, reg.size + 1, rid, 0))
        with pytest.raises(InvalidArgument):  # unknown region
            conn.call(p.Op.GET, p.Get(bucket, "obj", 0, 10, 999, 0))
        assert c.get_into(bucket, "obj", region) == 4096
        assert bytes(region) == b"z" * 4096


def test_client_disconnect_mid_put_shm(node, bucket):
    """A client killed while its shm PUT is in flight leaves nothing visible."""
    import subprocess
    import sys

    code = (
        "import os, sys, numpy as np\n"
        "from gpufeed.client import Client\n"
        f"c = Client({node.shm_url!r})\n"
        "buf = c.alloc(256 << 20)\n"
        f"f = c.submit_put({bucket!r}, 'killed', buf)\n"
        "print('sent', flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "sent" in out.stdout, out.stderr
    with Client(node.tcp_url) as c:
        try:
            meta = c.head(bucket, "killed")
        except NoSuchKey:
            return
        # if the server finished it, it must be whole
        assert meta.size == 256 << 20


def test_get_many_into_mixed_sizes_shm(node, bucket):
    """A batch mixing region, staged and larger-than-a-slot destinations."""
    with Client(node.shm_url, staging_bytes=8 << 20, slot_bytes=1 << 20) as c:
        data = _data(6 << 20, seed=9)
        c.put(bucket, "mixed", data)
        region = c.alloc(1 << 20)
        reqs = [ReadRequest(bucket, "mixed", region[:4096], 0),
                ReadRequest(bucket, "mixed", bytearray(3 << 20), 100),      # > a slot: side read
                *[ReadRequest(bucket, "mixed", bytearray(300_000), 7 * i) for i in range(20)]]
        ns = c.get_many_into(reqs)
        assert ns == [4096, 3 << 20] + [300_000] * 20
        for r in reqs:
            assert bytes(r.dest) == data[r.offset:r.offset + len(r.dest)]
        futs = [c.submit_get_many_into(reqs) for _ in range(8)]  # concurrent batches share slots
        assert all(f.result(timeout=60) == ns for f in futs)


def test_get_many_into_server_digests(node, bucket):
    """Piece digests: over shm the server hashes what it delivered (registered,
    staged and large batches alike); over TCP none come back; bad sizes are refused."""
    import xxhash

    data = _data(9 << 20, seed=12)

    def pieces(buf, size):
        mv = memoryview(buf)
        return [xxhash.xxh3_64_intdigest(mv[o:o + size]) for o in range(0, len(mv), size)]

    with Client(node.shm_url, staging_bytes=8 << 20, slot_bytes=1 << 20) as c:
        c.put(bucket, "dig", data)
        region = c.alloc(8 << 20)
        reqs = [ReadRequest(bucket, "dig", region[:5 << 20], 3, digest=1 << 20),   # registered, split
                ReadRequest(bucket, "dig", bytearray(300_000), 11, digest=4096),   # staged, short tail
                ReadRequest(bucket, "dig", bytearray(1000), 0),                    # no digest asked
                ReadRequest(bucket, "dig", bytearray(3 << 20), 5, digest=1 << 20),  # side read: None
                ReadRequest(bucket, "dig", region[5 << 20:6 << 20], len(data) - 100, digest=64),
                # the object ends inside a piece larger than the server's hash step
                ReadRequest(bucket, "dig", region[6 << 20:8 << 20], len(data) - (1 << 20) - 700_000,
                            digest=1 << 20)]
        sums: list = []
        ns = c.get_many_into(reqs, digests_out=sums)
        assert ns == [5 << 20, 300_000, 1000, 3 << 20, 100, (1 << 20) + 700_000]
        for r, n in zip(reqs, ns):
            assert bytes(memoryview(r.dest)[:n]) == data[r.offset:r.offset + n]
        assert sums[0] == pieces(region[:5 << 20], 1 << 20) and len(sums[0]) == 5
        assert sums[1] == pieces(reqs[1].dest, 4096) and len(sums[1]) == 74  # 73 full + 1 short
        assert sums[2] is None and sums[3] is None
        assert sums[4] == pieces(data[-100:], 64)
        assert sums[5] == pieces(data[-(1 << 20) - 700_000:], 1 << 20) and len(sums[5]) == 2
        # a failed item carries no digests; the batch raises its typed error
        with pytest.raises(NoSuchKey):
            c.get_many_into([(bucket, "dig", region[:64], 0, 64, 16), (bucket, "nope", bytearray(4))],
                            digests_out=sums)
        with pytest.raises(InvalidArgument):
            c.get_many_into([(bucket, "dig", bytearray(8), 0, 8, -1)])
    with Client(node.tcp_url) as c:
        sums = []
        assert c.get_many_into([(bucket, "dig", bytearray(4096), 0, 4096, 1024)], digests_out=sums) == [4096]
        assert sums == [None]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_get_many_into_errors_out(node, bucket, transport):
    """With ``errors_out`` a failed item does not fail the batch: it reads -1 and
    carries its typed error; every other item (registered, staged, side read, over
    shm and TCP) is served and lands whole. Without it the batch still raises."""
    data = _data(6 << 20, seed=21)
    url = node.shm_url if transport == "shm" else node.tcp_url
    with Client(url, staging_bytes=8 << 20, slot_bytes=1 << 20) as c:
        c.put(bucket, "here", data)
        region = c.alloc(5 << 20)
        reqs = [ReadRequest(bucket, "here", region[:4 << 20], 0, digest=1 << 20),
                ReadRequest(bucket, "gone", region[4 << 20:], 0),
                ReadRequest(bucket, "here", bytearray(300_000), 5),
                ReadRequest(bucket, "here", bytearray(10), len(data) + 1),      # past the end
                ReadRequest(bucket, "here", bytearray(3 << 20), 1000),          # > a slot: side read
                ReadRequest("no-such-bucket-x", "k", bytearray(10), 0)]
        errs: list = []
        sums: list = []
        ns = c.get_many_into(reqs, errors_out=errs, digests_out=sums)
        assert ns[1] == ns[3] == ns[5] == -1
        assert ns[0] == 4 << 20 and ns[2] == 300_000 and ns[4] == 3 << 20
        assert isinstance(errs[1], NoSuchKey) and "gone" in str(errs[1])
        assert isinstance(errs[3], InvalidRange)
        assert isinstance(errs[5], NoSuchBucket)
        assert errs[0] is None and errs[2] is None and errs[4] is None
        for i in (0, 2, 4):
            r = reqs[i]
            assert bytes(memoryview(r.dest)[:ns[i]]) == data[r.offset:r.offset + ns[i]]
        if transport == "shm":
            assert sums[0] is not None and len(sums[0]) == 4 and sums[1] is None
        # a side read that fails is reported the same way
        errs = []
        assert c.get_many_into([(bucket, "gone", bytearray(3 << 20))], errors_out=errs) == [-1]
        assert isinstance(errs[0], NoSuchKey)
        with pytest.raises(NoSuchKey):
            c.get_many_into(reqs[:2])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_alloc_memory_is_reused_after_its_views_die(node, bucket, transport):
    import gc

    import torch

    url = node.tcp_url if transport == "tcp" else node.shm_url
    with Client(url) as c:
        c.put(bucket, "reuse", b"r" * (2 << 20))
        buf = c.alloc(2 << 20)
        addr = np.frombuffer(buf, np.uint8).ctypes.data
        t = torch.frombuffer(buf, dtype=torch.uint8)
        del buf
        gc.collect()
        other = c.alloc(2 << 20)  # the first buffer is still alive through the tensor
        addr2 = np.frombuffer(other, np.uint8).ctypes.data
        assert addr2 != addr
        assert c.get_into(bucket, "reuse", t.numpy()) == 2 << 20 and bool((t == ord("r")).all())
        del t, other
        gc.collect()
        again = c.alloc((2 << 20) - 100)
        assert np.frombuffer(again, np.uint8).ctypes.data in (addr, addr2)  # a pooled region
        assert c.get_into(bucket, "reuse", again) == (2 << 20) - 100
        # The node may lend a pooled region up to twice the size asked for (another
        # client's, zeroed), too big for a 1 MiB buffer: the first 1 MiB alloc may
        # register one region; after it, a steady state registers none.
        b = c.alloc(1 << 20)
        del b
        gc.collect()
        regions_before = len(c._regions)
        for _ in range(5):  # steady state: no new registrations
            b = c.alloc(1 << 20)
            del b
            gc.collect()
        assert len(c._regions) == regions_before
