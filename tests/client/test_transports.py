"""The SDK's transport seam: capabilities callers ask instead of transport names,
the same argument checks on Client and AsyncClient, and batch reads of items
larger than a staging slot (no deadlock)."""

from __future__ import annotations

import asyncio
import os
import uuid

import numpy as np
import pytest

from gpufeed.client import AsyncClient, Client, ReadRequest
from gpufeed.errors import InvalidArgument, NoSuchKey, TransportError


@pytest.fixture(params=["tcp", "shm"])
def url(request, node):
    return node.tcp_url if request.param == "tcp" else node.shm_url


@pytest.fixture(scope="module")
def bucket(node):
    name = "seam-" + uuid.uuid4().hex[:10]
    with Client(node.tcp_url) as c:
        c.create_bucket(name)
        c.put(name, "k", b"0123456789")
    return name


# --- capabilities --------------------------------------------------------------------
def test_capabilities_follow_the_transport(node):
    with Client(node.tcp_url) as c:
        assert c.transport == "tcp"
        assert not c.supports_map and not c.supports_server_digests
        assert not c.supports_registered_alloc and c.max_batch_item_bytes is None
        assert not c.closed and not c.lost_connection
    assert c.closed
    with Client(node.shm_url, slot_bytes=2 << 20) as c:
        assert c.transport == "shm"
        assert c.supports_map and c.supports_server_digests and c.supports_registered_alloc
        assert c.max_batch_item_bytes == 2 << 20
        with pytest.raises(AttributeError):
            c.transport = "tcp"  # read-only


def test_lost_connection_is_reported(fresh_node):
    c = Client(fresh_node.tcp_url, request_timeout_s=5)
    try:
        c.create_bucket("lost-conn")
        assert not c.lost_connection
        fresh_node.stop()
        with pytest.raises(TransportError):
            for _ in range(3):
                c.head("lost-conn", "k")
        assert c.lost_connection and not c.closed
    finally:
        c.close()


# --- one set of argument checks ------------------------------------------------------
BAD_CALLS = [
    ("head", (1, "k"), {}),
    ("head", ("b", None), {}),
    ("delete", (1, "k"), {}),
    ("delete", ("b", b"k"), {}),
    ("get", ("b", "k"), {"offset": -1}),
    ("get", ("b", "k"), {"length": "10"}),
    ("get_into", ("b", "k", b"read-only"), {}),
    ("get_into", ("b", "k", bytearray(4)), {"length": 5}),
    ("get_into", ("b", "k", object()), {}),
    ("put", (1, "k", b"x"), {}),
    ("put", ("b", "k", object()), {}),
    ("get_many_into", ([("b", "k", b"read-only")],), {}),
    ("get_many_into", ([ReadRequest("b", "k", bytearray(4), digest=-1)],), {}),
    ("get_many_into", ([ReadRequest("b", "k", bytearray(4), length=8)],), {}),
    ("create_bucket", ("bkt",), {"ttl_s": -1}),
    ("create_bucket", ("bkt",), {"capacity_bytes": 1.5}),
    ("bucket_stats", (1,), {}),
    ("delete_bucket", (None,), {}),
    ("list", (1,), {}),
    ("map_object", (1, "k"), {}),
]


@pytest.mark.parametrize("name,args,kw", BAD_CALLS, ids=[f"{n}{i}" for i, (n, _a, _k) in enumerate(BAD_CALLS)])
def test_async_refuses_what_sync_refuses(url, name, args, kw):
    with Client(url) as c:
        with pytest.raises(InvalidArgument) as sync_err:
            out = getattr(c, name)(*args, **kw)
            if name == "list":
                list(out)

        async def main():
            ac = AsyncClient(c)
            with pytest.raises(InvalidArgument) as async_err:
                await getattr(ac, name)(*args, **kw)
            return async_err

        async_err = asyncio.run(main())
        assert type(async_err.value) is type(sync_err.value)
        assert str(async_err.value) == str(sync_err.value)
        assert c.list_buckets() is not None  # the connection survived


def test_async_covers_every_call(url, bucket):
    async def main():
        async with await AsyncClient.connect(url) as ac:
            meta = await ac.head(bucket, "k")
            got = await ac.get(bucket, "k", offset=2, length=3)
            listed = await ac.list(bucket)
            names = await ac.list_buckets()
            stats = await ac.bucket_stats(bucket)
            await ac.put(bucket, "gone", b"x")
            await ac.delete(bucket, "gone")
            return meta, bytes(got), [e.key for e in listed], names, stats
    meta, got, keys, names, stats = asyncio.run(main())
    assert meta.size == 10 and got == b"234" and keys == ["k"]
    assert bucket in names and stats["objects"] == 1


def test_closed_client_is_a_transport_error_on_both_forms(url, bucket):
    c = Client(url)
    c.close()
    with pytest.raises(TransportError):
        c.head(bucket, "k")

    async def main():
        with pytest.raises(TransportError):
            await AsyncClient(c).head(bucket, "k")
    asyncio.run(main())


# --- batch reads of items larger than a staging slot ---------------------------------
def test_batched_reads_larger_than_a_slot_complete_on_shm(fresh_node):
    # a node of its own: the regions these puts borrow stay out of the session node's pool
    bucket = "big-batch"
    slot = 1 << 20  # 1 MiB slots, 4 of them: every batch mixes staged and side reads
    rng = np.random.default_rng(7)
    big = [rng.integers(0, 256, (3 << 20) + 4096 * i, dtype=np.uint8) for i in range(6)]
    small = [os.urandom(1000 + i) for i in range(12)]
    with Client(fresh_node.shm_url, staging_bytes=4 * slot, slot_bytes=slot,
                request_timeout_s=30) as c:
        assert c.max_batch_item_bytes == slot
        c.create_bucket(bucket)
        for i, b in enumerate(big):
            c.put(bucket, f"big{i}", b)
        for i, s in enumerate(small):
            c.put(bucket, f"small{i}", s)
        # 10 batches in flight at once, more side reads than the client has threads
        runs = []
        for _ in range(10):
            bd = [bytearray(len(b)) for b in big]
            sd = [bytearray(len(s)) for s in small]
            reqs = [ReadRequest(bucket, f"big{i}", d) for i, d in enumerate(bd)]
            reqs += [ReadRequest(bucket, f"small{i}", d, digest=256) for i, d in enumerate(sd)]
            sums: list = []
            runs.append((bd, sd, sums, c.submit_get_many_into(reqs, digests_out=sums)))
        for bd, sd, sums, fut in runs:
            assert fut.result(timeout=120) == [len(b) for b in big] + [len(s) for s in small]
            assert all(bytes(d) == b.tobytes() for d, b in zip(bd, big))
            assert all(bytes(d) == s for d, s in zip(sd, small))
            assert sums[:len(big)] == [None] * len(big)  # read on the side: hash them yourself
            assert all(s is not None for s in sums[len(big):])
        # a missing large item reported per item, the others still read
        errs: list = []
        dest = bytearray(len(big[0]))
        n = c.get_many_into([(bucket, "big0", dest), (bucket, "no-such-big", bytearray(3 << 20))],
                            errors_out=errs)
        assert n == [len(big[0]), -1] and isinstance(errs[1], NoSuchKey) and errs[0] is None
        assert bytes(dest) == big[0].tobytes()


FORK_READER = """
import os, sys
from gpufeed.client import Client
from gpufeed.errors import TransportError
c = Client(sys.argv[1])
c.get_into(sys.argv[2], "k", bytearray(10))  # the client's threads now exist (staged read)
pid = os.fork()
if pid == 0:
    codes = []
    for call in (lambda: c.get(sys.argv[2], "k"), lambda: c.get_into(sys.argv[2], "k", bytearray(10)),
                 lambda: c.list_buckets()):
        try:
            call()
            codes.append(3)
        except TransportError:
            codes.append(0)
    os._exit(max(codes))
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), flush=True)
"""


def test_forked_child_fails_fast_on_threaded_calls(node, bucket):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FORK_READER, node.shm_url, bucket],
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out == ["0"]  # TransportError at once, never a wait on the parent's threads
