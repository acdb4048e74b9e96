"""Read leases (``Client(leases=True)``, op LEASE) against a real node: small
reads of a leased object are served in the client's process and are
bit-identical (whole blocks, odd ranges, the object's end); every commit
voids them (an overwrite, a delete, a revoked key); a flipped byte is caught
by the client's own check and reported by GET; objects that cannot be leased,
a node that offers none, and TCP read through GET; the lease's life is bounded;
a node killed and restarted is never read through an old lease; the client
holds a bounded number of leases and closes them with itself; LEASE itself
follows GET's rules; what it hands out (a data file, the commit counter)
cannot be written, resized or made to change the node's own reads."""

from __future__ import annotations

import fcntl
import mmap
import os
import time

import numpy as np
import pytest

from gpufeed.admin import RemoteAdmin
from gpufeed.bench.integrity import _chunks  # the catalog's chunk list of one object
from gpufeed.client import Client
from gpufeed.config import WireLimits
from gpufeed.engine import Engine
from gpufeed.errors import (
    AccessDenied,
    DamagedObject,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRange,
    NoSuchKey,
    NotImplementedByGpufeed,
    TransportError,
)
from gpufeed.testing.node import flip_bits, start_node
from gpufeed.wire import protocol as p

BLOCK = 4096
SIZE = (1 << 20) + 1000  # not a whole number of blocks


def _data(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _text(n: int) -> bytes:
    return (b"".join(b"line %d of a compressible object\n" % i for i in range(n // 20)))[:n]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    data = tmp_path_factory.mktemp("leases") / "data"
    with Engine(data, fsync=False) as e:
        e.create_bucket("raw")
        e.create_bucket("zst")
        e.set_bucket_data("zst", compression="zstd")
    n = start_node(data)
    with Client(n.tcp_url, n.access_key, n.secret_key) as c:
        c.put("raw", "obj", _data(SIZE))
        c.put("zst", "obj", _text(SIZE))  # compressible: stored zstd
    yield n
    assert n.stop() == 0, n.log_path.read_text()


def _leased(n, **kw) -> Client:
    return Client(n.shm_url, n.access_key, n.secret_key, leases=True, **kw)


def _hits(c: Client) -> int:
    leases = c.leases
    assert leases is not None, "the client took no leases"
    return leases.hits


def test_reads_are_served_in_process_and_bit_identical(node):
    data = _data(SIZE)
    rng = np.random.default_rng(1)
    with _leased(node) as c:
        assert "lease" in c._t.features
        cases = [(int(o) * BLOCK, BLOCK) for o in rng.integers(0, SIZE // BLOCK, 200)]
        cases += [(int(o), int(k)) for o, k in zip(rng.integers(0, SIZE - 70_000, 60), rng.integers(1, 70_000, 60))]
        cases += [(SIZE - 1000, 1000), (SIZE - 1000, 4096), (SIZE - 5, 3), (0, SIZE)]
        for offset, length in cases:
            buf = bytearray(length)
            got = c.get_into("raw", "obj", buf, offset=offset)
            assert got == min(length, SIZE - offset)
            assert bytes(buf[:got]) == data[offset:offset + got], (offset, length)
        assert _hits(c) == len(cases) - 1  # the whole object (over 1 MiB) went through GET
        with pytest.raises(InvalidRange):  # past the end: GET answers, as without leases
            c.get_into("raw", "obj", bytearray(10), offset=SIZE + 1)


def test_a_commit_voids_the_lease_overwrite_then_delete(node):
    with _leased(node) as c, Client(node.tcp_url, node.access_key, node.secret_key) as w:
        w.put("raw", "moving", _data(3 * BLOCK, seed=5))
        buf = bytearray(BLOCK)
        c.get_into("raw", "moving", buf, offset=BLOCK)
        assert bytes(buf) == _data(3 * BLOCK, seed=5)[BLOCK:2 * BLOCK]
        before = _hits(c)
        w.put("raw", "moving", _data(3 * BLOCK, seed=6))  # acknowledged: every read after sees it
        c.get_into("raw", "moving", buf, offset=BLOCK)
        assert bytes(buf) == _data(3 * BLOCK, seed=6)[BLOCK:2 * BLOCK]
        assert _hits(c) == before + 1  # served from a new lease
        w.delete("raw", "moving")
        with pytest.raises(NoSuchKey):
            c.get_into("raw", "moving", buf)


def _tenant_key(node, tenant: str) -> tuple[RemoteAdmin, dict]:
    """A new tenant and its key (through the admin API), with the admin client."""
    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    admin.tenant_create(tenant)
    return admin, admin.key_create(tenant)


def test_a_revoked_key_reads_nothing_more_through_its_lease(node):
    admin, key = _tenant_key(node, "lessee")
    with Client(node.shm_url, key["access_key"], key["secret_key"], leases=True) as c:
        c.create_bucket("lessee-bkt")
        c.put("lessee-bkt", "k", _data(2 * BLOCK, seed=9))
        buf = bytearray(BLOCK)
        c.get_into("lessee-bkt", "k", buf)
        c.get_into("lessee-bkt", "k", buf)
        assert _hits(c) == 2
        admin.key_revoke(key["access_key"])
        with pytest.raises(InvalidAccessKeyId):
            c.get_into("lessee-bkt", "k", buf)


def test_other_tenants_get_no_lease(node):
    _admin, key = _tenant_key(node, "outsider")
    with Client(node.shm_url, key["access_key"], key["secret_key"], leases=True) as c:
        with pytest.raises((AccessDenied, NoSuchKey)):
            c.get_into("raw", "obj", bytearray(BLOCK))
        assert _hits(c) == 0


def test_a_flipped_byte_is_caught_by_the_client_and_reported_by_get(tmp_path):
    data_dir = tmp_path / "data"
    n = start_node(data_dir)
    try:
        with _leased(n) as c:
            c.create_bucket("rot")
            c.put("rot", "obj", _data(8 * BLOCK, seed=2))
            buf = bytearray(BLOCK)
            c.get_into("rot", "obj", buf, offset=3 * BLOCK)  # leased
            ((_chunk, file, offset, _stored),) = _chunks(n.data_dir / "catalog.sqlite3", "rot", "obj")
            flip_bits(n.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + 5 * BLOCK + 7, 0x10)
            c.get_into("rot", "obj", buf, offset=3 * BLOCK)  # other blocks stay good
            assert bytes(buf) == _data(8 * BLOCK, seed=2)[3 * BLOCK:4 * BLOCK]
            with pytest.raises(DamagedObject):
                c.get_into("rot", "obj", buf, offset=5 * BLOCK)
    finally:
        assert n.stop() == 0


def test_what_cannot_be_leased_reads_through_get(node):
    data, text = _data(SIZE), _text(SIZE)
    buf = bytearray(BLOCK)
    with _leased(node) as c:
        c.get_into("zst", "obj", buf, offset=BLOCK)  # compressed: no lease, GET
        c.get_into("zst", "obj", buf, offset=BLOCK)
        assert bytes(buf) == text[BLOCK:2 * BLOCK] and _hits(c) == 0
        with pytest.raises(NotImplementedByGpufeed):
            c._t.conn().call(p.Op.LEASE, p.Head("zst", "obj"))
        with pytest.raises(InvalidArgument):  # a lease covers the current version only
            c._t.conn().call(p.Op.LEASE, p.Head("raw", "obj", "null"))
        with pytest.raises(NoSuchKey):
            c._t.conn().call(p.Op.LEASE, p.Head("raw", "missing"))
    with Client(node.tcp_url, node.access_key, node.secret_key, leases=True) as c:  # no leases over TCP
        c.get_into("raw", "obj", buf)
        assert c.leases is None and bytes(buf) == data[:BLOCK]


def test_a_node_without_leases_and_the_lease_life(tmp_path):
    off = start_node(tmp_path / "off", env={"GPUFEED_WIRE_LEASE_S": "0"})
    try:
        with _leased(off) as c:
            assert "lease" not in c._t.features and c.leases is None
            c.create_bucket("plain")
            c.put("plain", "k", b"x" * BLOCK)
            assert bytes(c.get("plain", "k")) == b"x" * BLOCK
    finally:
        assert off.stop() == 0
    short = start_node(tmp_path / "short", env={"GPUFEED_WIRE_LEASE_S": "0.3"})
    try:
        with _leased(short) as c:
            c.create_bucket("brief")
            c.put("brief", "k", b"y" * BLOCK)
            buf = bytearray(BLOCK)
            c.get_into("brief", "k", buf)
            (lease,) = c.leases._held.values()
            assert 0 < lease.expires - time.monotonic() <= 0.3
            time.sleep(0.4)
            c.get_into("brief", "k", buf)
            assert c.leases._held[("brief", "k")] is not lease  # renewed
    finally:
        assert short.stop() == 0


def test_a_killed_node_is_never_read_through_an_old_lease(tmp_path):
    data_dir = tmp_path / "data"
    n = start_node(data_dir)
    c = _leased(n)
    try:
        c.create_bucket("crash")
        c.put("crash", "k", _data(2 * BLOCK, seed=3))
        buf = bytearray(BLOCK)
        c.get_into("crash", "k", buf)
        n.kill()
        n2 = start_node(data_dir)
        try:
            with Client(n2.tcp_url, n2.access_key, n2.secret_key) as w:
                w.put("crash", "k", _data(2 * BLOCK, seed=4))
            deadline = time.monotonic() + 10
            while not c._t.conns[0].closed and time.monotonic() < deadline:
                time.sleep(0.01)  # the client's receiver sees the hang-up
            with pytest.raises(TransportError):
                c.get_into("crash", "k", buf)
        finally:
            assert n2.stop() == 0
    finally:
        c.close()


def test_the_client_holds_a_bounded_number_of_leases(node):
    with Client(node.tcp_url, node.access_key, node.secret_key) as w:
        for i in range(12):
            w.put("raw", f"many/{i}", _data(BLOCK, seed=i))
    with _leased(node) as c:
        c.leases.max_leases = 5
        buf = bytearray(BLOCK)
        for i in range(12):
            c.get_into("raw", f"many/{i}", buf)
            assert bytes(buf) == _data(BLOCK, seed=i)
        assert len(c.leases._held) <= 5
        assert _hits(c) == 12


def test_what_a_lease_hands_out_cannot_hurt_the_node_or_others(node):
    data = _data(SIZE)
    with _leased(node) as c:
        reply, fds = c._t.conn().call(p.Op.LEASE, p.Head("raw", "obj"))
        data_fd, counter_fd = fds
        try:
            with pytest.raises(OSError):  # the counter: no writable mapping, no write, no resize
                mmap.mmap(counter_fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            again = os.open(f"/proc/self/fd/{counter_fd}", os.O_RDWR)  # opened again, read-write
            try:
                for attempt in (lambda: mmap.mmap(again, 4096, mmap.MAP_SHARED, mmap.PROT_WRITE),
                                lambda: os.pwrite(again, b"\0" * 8, 0), lambda: os.ftruncate(again, 0)):
                    with pytest.raises(OSError):
                        attempt()
            finally:
                os.close(again)
            assert fcntl.fcntl(data_fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
            flags = fcntl.fcntl(data_fd, fcntl.F_GETFL)
            fcntl.fcntl(data_fd, fcntl.F_SETFL, flags | os.O_DIRECT)  # the client's own description only
        finally:
            for fd in fds:
                os.close(fd)
    with Client(node.shm_url, node.access_key, node.secret_key) as plain:  # the node reads as before
        assert bytes(plain.get("raw", "obj", offset=777, length=1000)) == data[777:1777]
    s3 = node.boto3_client()
    assert s3.get_object(Bucket="raw", Key="obj", Range="bytes=5-9")["Body"].read() == data[5:10]


def test_closing_the_client_closes_its_leases_descriptors(node):
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))
    with Client(node.tcp_url, node.access_key, node.secret_key) as w:
        for i in range(20):
            w.put("raw", f"fds/{i}", _data(BLOCK, seed=i))
    c = _leased(node)
    before = open_fds()
    for i in range(20):
        c.get_into("raw", f"fds/{i}", bytearray(BLOCK))
    assert open_fds() >= before + 20  # one data file each
    c.close()
    assert open_fds() < before


def test_the_lease_life_is_bounded(monkeypatch):
    monkeypatch.setenv("GPUFEED_WIRE_LEASE_S", "61")
    with pytest.raises(ValueError, match="GPUFEED_WIRE_LEASE_S"):
        WireLimits.from_env()
    monkeypatch.setenv("GPUFEED_WIRE_LEASE_S", "60")
    assert WireLimits.from_env().lease_s == 60
