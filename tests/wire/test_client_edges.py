"""SDK edge cases found by a first-use trial: every one is a typed error, never a
hang, a reset or a dead connection."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import numpy as np
import pytest
import torch

from gpufeed.client import AsyncClient, Client
from gpufeed.errors import InvalidArgument, KeyTooLong, NoSuchBucket, NoSuchKey, TransportError


@pytest.fixture(params=["tcp", "shm"])
def url(request, node):
    return node.tcp_url if request.param == "tcp" else node.shm_url


@pytest.fixture
def bucket(node):
    name = "edge-" + uuid.uuid4().hex[:10]
    with Client(node.tcp_url) as c:
        c.create_bucket(name)
    return name


def test_rejected_large_put_reports_the_real_error(url, bucket):
    big = os.urandom(65 << 20)
    with Client(url) as c:
        with pytest.raises(NoSuchBucket):
            c.put("no-such-bucket-x", "k", big)
        with pytest.raises(KeyTooLong):
            c.put(bucket, "k" * 1025, big)
        c.put(bucket, "after", b"still works")  # same connection survived
        assert bytes(c.get(bucket, "after")) == b"still works"


def test_bad_arguments_are_typed(url, bucket):
    with Client(url) as c:
        c.put(bucket, "obj", b"0123456789")
        for kwargs in ({"length": -1}, {"offset": 1 << 64}, {"offset": -5}, {"length": 1.5}):
            with pytest.raises(InvalidArgument):
                c.get_into(bucket, "obj", bytearray(10), **kwargs)
        with pytest.raises(InvalidArgument):
            c.put(bucket, "bad-\udcff", b"x")
        with pytest.raises(InvalidArgument):
            c.head(bucket, None)
        with pytest.raises(InvalidArgument):
            c.get_into(bucket, "obj", b"read-only bytes")
        with pytest.raises(InvalidArgument):
            c.get_into(bucket, "obj", np.zeros((4, 4), np.uint8)[:, 1])
        assert bytes(c.get(bucket, "obj")) == b"0123456789"  # connection still fine


def test_torch_tensors_are_buffers(url, bucket):
    with Client(url) as c:
        src = torch.arange(1000, dtype=torch.bfloat16)
        c.put(bucket, "t", src)
        dst = torch.empty(1000, dtype=torch.bfloat16)
        assert c.get_into(bucket, "t", dst) == 2000
        assert torch.equal(src, dst)
        with pytest.raises(InvalidArgument):
            c.get_into(bucket, "t", torch.empty(20, 100).t())


def test_closed_client_raises_transport_error(url, bucket):
    c = Client(url)
    c.close()
    for call in (lambda: c.get(bucket, "x"), lambda: c.head(bucket, "x"),
                 lambda: c.put(bucket, "x", b"1"), lambda: c.get_into(bucket, "x", bytearray(4)),
                 lambda: list(c.list(bucket)), lambda: c.alloc(10)):
        with pytest.raises(TransportError, match="closed"):
            call()
    with pytest.raises(TransportError):
        with c:
            pass


def test_async_client_from_url(url, bucket):
    async def main():
        async with AsyncClient(url) as ac:
            await ac.put(bucket, "a", b"abc")
            return (await ac.head(bucket, "a")).size

    assert asyncio.run(main()) == 3


def test_stalled_server_times_out(fresh_node):
    with Client(fresh_node.tcp_url, request_timeout_s=1.5) as c:
        c.create_bucket("stall")
        c.put("stall", "k", b"x" * 100)
        fresh_node.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(TransportError, match="no reply"):
                c.get("stall", "k")
            assert time.monotonic() - t0 < 10
        finally:
            fresh_node.resume()
    with Client(fresh_node.tcp_url) as c:  # the node is fine afterwards
        assert bytes(c.get("stall", "k")) == b"x" * 100


def test_reply_cut_off_mid_payload_fails_its_request():
    """A server that dies while it sends a reply's payload: the request being
    received fails with TransportError at once, like every other one in flight
    (it was once left waiting forever: its entry had already left the table)."""
    import socket
    import threading

    from gpufeed.wire import protocol as p

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            for _ in range(2):  # HELLO, then the batch read
                hdr = b""
                while len(hdr) < p.HEADER_SIZE:
                    hdr += conn.recv(p.HEADER_SIZE - len(hdr))
                op, meta_len, rid, _plen = p.unpack_header(hdr)
                meta = b""
                while len(meta) < meta_len:
                    meta += conn.recv(meta_len - len(meta))
                if op == p.Op.HELLO:
                    reply = p.encode(p.HelloReply("fake", p.VERSION, "tcp"))
                    conn.sendall(p.pack_header(op | p.REPLY, len(reply), rid) + reply)
                else:  # promise 2 x 1 MiB, send 100 KiB, then die
                    reply = p.encode(p.GetVReply([1 << 20, 1 << 20]))
                    conn.sendall(p.pack_header(op | p.REPLY, len(reply), rid, 2 << 20) + reply)
                    conn.sendall(b"x" * 100_000)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with Client(f"gpufeed+tcp://127.0.0.1:{port}", connections=1, request_timeout_s=30,
                allow_unauthenticated=True) as c:
        fut = c.submit_get_many_into([("b", "k", bytearray(1 << 20)), ("b", "k", bytearray(1 << 20))])
        t0 = time.monotonic()
        with pytest.raises(TransportError):
            fut.result(timeout=20)
        assert time.monotonic() - t0 < 10
    t.join(timeout=5)


def test_requests_given_up_on_never_touch_shared_memory_later(fresh_node):
    """A node stopped while shm requests are queued: the clients time out and may
    reuse that memory; once the node runs again it must neither write a get's bytes
    into it nor store a put from memory that now holds other bytes."""
    n = 16 << 20
    with Client(fresh_node.shm_url, connections=1, request_timeout_s=1.0) as g, \
            Client(fresh_node.shm_url, connections=2, request_timeout_s=1.0) as w:
        g.create_bucket("late")
        g.put("late", "src", b"s" * n)
        w.put("late", "warm", os.urandom(n))  # leaves n bytes of pooled memory in w
        dest = g.alloc(n)
        fresh_node.pause()
        try:
            with pytest.raises(TransportError):
                g.get_into("late", "src", dest)
            dest[:] = b"x" * n  # the caller reuses its buffer after the failure
            with pytest.raises(TransportError):
                w.put("late", "keyA", b"A" * n)
            try:  # on w's other connection: its copy must not land in keyA's memory
                w.put("late", "keyB", b"B" * n)
            except TransportError:
                pass
        finally:
            fresh_node.resume()
        time.sleep(1.0)  # let the node drain what was queued
        assert bytes(dest) == b"x" * n
    with Client(fresh_node.shm_url) as c:
        try:
            stored = bytes(c.get("late", "keyA"))
        except NoSuchKey:
            stored = None
        assert stored in (None, b"A" * n)


@pytest.mark.parametrize("size", [100, 8 << 20])  # staged, and a side read past a slot
def test_errors_out_still_raises_transport_errors(fresh_node, size):
    """``errors_out`` collects per-item errors of the node; a lost or stuck
    connection still raises, for staged items and side reads alike."""
    with Client(fresh_node.shm_url, request_timeout_s=1.0) as c:
        c.create_bucket("side")
        c.put("side", "k", os.urandom(8 << 20))
        fresh_node.pause()
        try:
            with pytest.raises(TransportError):
                c.get_many_into([("side", "k", bytearray(size))], errors_out=[])
        finally:
            fresh_node.resume()
