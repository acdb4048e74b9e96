"""Server-lent shared memory (ALLOC_REGION) and its pool: reused only when no
process can still see it, always zeroed, never under a live buffer."""

from __future__ import annotations

import gc
import subprocess
import sys
import time

import numpy as np
import pytest

from gpufeed.client import Client
from gpufeed.testing.node import start_node

SIZE = 8 << 20

# A client process that allocates, fills with a pattern, optionally reads an
# object into the region, then exits *without* closing (its buffers alive).
CHILD = """
import sys
import numpy as np
import pytest
from gpufeed.client import Client
c = Client(sys.argv[1])
buf = c.alloc(int(sys.argv[2]))
a = np.frombuffer(buf, np.uint8)
print(c.regions_reused, int(np.count_nonzero(a)), flush=True)
a[:] = 0xAB
"""


def _child(url: str, size: int = SIZE) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, url, str(size)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return int(out[0]), int(out[1])


def _wait_reuse(url: str, size: int = SIZE, timeout_s: float = 10.0) -> tuple[int, int]:
    """Run children until one gets a pooled region (the previous child's exit is
    noticed asynchronously); returns its (reused, nonzero bytes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        reused, nonzero = _child(url, size)
        if reused or time.monotonic() > deadline:
            return reused, nonzero


def test_exited_process_memory_is_zeroed_and_lent_again(fresh_node):
    url = fresh_node.shm_url
    reused, nonzero = _child(url)
    assert (reused, nonzero) == (0, 0)  # fresh memory
    reused, nonzero = _wait_reuse(url)
    assert reused == 1, "the exited child's region never came back to the pool"
    assert nonzero == 0, "a lent region still held the previous client's bytes"


def test_live_buffers_survive_their_client_closing(fresh_node):
    url = fresh_node.shm_url
    c1 = Client(url)
    buf = c1.alloc(SIZE)
    a = np.frombuffer(buf, np.uint8)
    a[:] = 0x5A
    c1.close()  # this process lives on and so does buf: the region must not be lent again
    with Client(url) as c2:
        for _ in range(3):
            other = np.frombuffer(c2.alloc(SIZE), np.uint8)
            other[:] = 0x11
        assert c2.regions_reused == 0
    for _ in range(3):  # later clients may get c2's released regions, never c1's live one
        assert _child(url)[1] == 0
    assert int(np.count_nonzero(a != 0x5A)) == 0, "a live buffer was overwritten"


def test_unmapped_regions_are_pooled_on_close(fresh_node):
    url = fresh_node.shm_url
    c1 = Client(url)
    buf = c1.alloc(SIZE)
    np.frombuffer(buf, np.uint8)[:] = 0xCD
    del buf
    gc.collect()
    c1.close()  # no buffer left: the client unmaps and says so
    deadline = time.monotonic() + 10
    while True:
        with Client(url) as c2:
            got = np.frombuffer(c2.alloc(SIZE), np.uint8)
            if c2.regions_reused or time.monotonic() > deadline:
                assert c2.regions_reused == 1
                assert int(np.count_nonzero(got)) == 0
                break
        time.sleep(0.1)


def test_reads_land_in_lent_regions(node):
    """The whole read path works on server-lent memory (and a pooled region
    from an earlier client carries none of its bytes)."""
    data = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    with Client(node.shm_url) as c:
        c.create_bucket("lent-regions")
        c.put("lent-regions", "obj", data)
        buf = c.alloc(SIZE)
        assert c.get_into("lent-regions", "obj", buf) == SIZE
        assert bytes(buf) == data
        out = bytearray(100_000)  # not in a region: staged through a lent staging region
        assert c.get_into("lent-regions", "obj", out, offset=5) == 100_000
        assert bytes(out) == data[5:100_005]


def test_pool_disabled_still_lends_memory(tmp_path):
    proc = start_node(tmp_path / "data", extra_args=["--region-pool", "0"])
    try:
        _child(proc.shm_url)
        time.sleep(0.5)
        assert _child(proc.shm_url) == (0, 0)  # nothing kept, nothing reused
    finally:
        proc.stop()


def test_alloc_region_bad_requests(node):
    from gpufeed.errors import InvalidArgument
    from gpufeed.wire import protocol as p

    with Client(node.tcp_url) as c, pytest.raises(InvalidArgument):  # shm only
        c._conns[0].call(p.Op.ALLOC_REGION, p.AllocRegion(1, 4096))
    with Client(node.shm_url) as c:
        conn = c._conns[0]
        with pytest.raises(InvalidArgument):  # larger than the host could populate
            conn.call(p.Op.ALLOC_REGION, p.AllocRegion(900, 1 << 50))
        reply, fd = conn.call(p.Op.ALLOC_REGION, p.AllocRegion(901, 4096))
        try:
            assert reply.size >= 4096
            with pytest.raises(InvalidArgument):  # the id is taken
                conn.call(p.Op.ALLOC_REGION, p.AllocRegion(901, 4096))
        finally:
            import os
            os.close(fd)
        buf = c.alloc(1000)  # the connection still serves
        assert len(buf) == 1000


FORKER = """
import os, sys, time
import numpy as np
from gpufeed.client import Client
c = Client(sys.argv[1])
a = np.frombuffer(c.alloc(int(sys.argv[2])), np.uint8)
a[:] = 0xEE
pid = os.fork()
if pid == 0:  # the child outlives its parent and keeps reading the inherited memory
    time.sleep(3)
    ok = int(np.count_nonzero(a != 0xEE)) == 0
    with open(sys.argv[3], "w") as f:
        f.write("ok" if ok else "overwritten")
    os._exit(0)
print(pid, flush=True)
"""


def _fork_and_compete(code: str, url: str, report) -> None:
    """Run a FORKER-style script, let other clients try hard to get its region while
    the orphaned child holds it, and check the child's report."""
    subprocess.run([sys.executable, "-c", code, url, str(SIZE), str(report)], check=True,
                   timeout=60, capture_output=True)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        with Client(url) as c:
            np.frombuffer(c.alloc(SIZE), np.uint8)[:] = 0x11
        _child(url)
    for _ in range(100):
        if report.exists() and report.read_text():
            break
        time.sleep(0.1)
    assert report.read_text() == "ok"


def test_forked_child_keeps_inherited_memory_after_parent_exits(fresh_node, tmp_path):
    """The parent exits while its forked child still maps the lent region: the
    region must not go to another client (the child can read it, unchanged)."""
    url, report = fresh_node.shm_url, tmp_path / "child.txt"
    _fork_and_compete(FORKER, url, report)


VICTIM = """
import sys, time
from gpufeed.client import Client
c = Client(sys.argv[1], connections=2)
buf = c.alloc(int(sys.argv[2]))
futs = [c.submit_get_into("victim", "obj", buf) for _ in range(8)]  # on both connections
print("reading", flush=True)
time.sleep(100)
"""


def test_killed_multi_connection_client_never_leaks_into_reused_memory(fresh_node):
    """A client with two connections is killed while reads into its lent region
    run on both: the region is reused only after every one of them is done, and
    arrives zeroed (and stays so)."""
    url, size = fresh_node.shm_url, 256 << 20
    with Client(url) as c:
        c.create_bucket("victim")
        src = c.alloc(size)
        np.frombuffer(src, np.uint8)[:] = 0xEE
        c.put("victim", "obj", src)
        del src
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", VICTIM, url, str(size)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "reading"
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with Client(url) as c:
                got = np.frombuffer(c.alloc(size), np.uint8)
                if c.regions_reused:
                    assert int(np.count_nonzero(got)) == 0, "reused memory held a dead client's bytes"
                    time.sleep(0.5)  # no late write from the dead client's reads either
                    assert int(np.count_nonzero(got)) == 0, "a dead client's read wrote into reused memory"
                    break
            time.sleep(0.05)


FORK_USER = """
import os, sys
import numpy as np
from gpufeed.client import Client
from gpufeed.errors import TransportError
c = Client(sys.argv[1])
a = np.frombuffer(c.alloc(1 << 20), np.uint8)
a[:] = 7
pid = os.fork()
if pid == 0:
    try:
        c.head("nope", "x")
        code = 3
    except TransportError:
        code = 0 if int(a.sum()) == 7 << 20 else 4  # the inherited buffer reads fine
    os._exit(code)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), c.list_buckets() is not None, flush=True)
"""


def test_client_in_forked_child_fails_fast(node):
    out = subprocess.run([sys.executable, "-c", FORK_USER, node.shm_url], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out == ["0", "True"]  # child: TransportError at once; parent: still works


def test_alloc_refuses_absurd_sizes(node):
    from gpufeed.errors import InvalidArgument

    for url in (node.tcp_url, node.shm_url):
        with Client(url) as c:
            for n in (1 << 62, 2**64):
                with pytest.raises(InvalidArgument):
                    c.alloc(n)
            assert len(c.alloc(10)) == 10


def test_other_connections_cannot_write_a_released_region(fresh_node):
    """A region lent on connection 0 and registered again on connection 1: once
    it is released for reuse (here: unmapped on connection 0 only), connection 1
    can neither write nor read it, so the next client's memory is safe."""
    from gpufeed.errors import InvalidArgument
    from gpufeed.wire import protocol as p

    url = fresh_node.shm_url
    with Client(url) as c:
        c.create_bucket("alias")
        c.put("alias", "obj", b"\xee" * SIZE)
    c = Client(url, connections=2)
    try:
        buf = c.alloc(SIZE)
        reg, _off = c._find_region(buf)
        assert reg.lent
        conn0, conn1 = c._conns
        assert conn1.call(p.Op.GET, p.Get("alias", "obj", 0, SIZE, reg.region_id, 0)).n == SIZE
        conn0.call(p.Op.UNREGISTER, p.Unregister(reg.region_id, True))  # a client bug or a race
        deadline = time.monotonic() + 10
        while True:  # the next client gets that very region (zeroed)
            with Client(url) as other:
                got = np.frombuffer(other.alloc(SIZE), np.uint8)
                if other.regions_reused:
                    break
            assert time.monotonic() < deadline, "the released region never came back"
            time.sleep(0.05)
        with pytest.raises(InvalidArgument, match="released"):
            conn1.call(p.Op.GET, p.Get("alias", "obj", 0, SIZE, reg.region_id, 0))
        with pytest.raises(InvalidArgument, match="released"):
            conn1.call(p.Op.PUT, p.Put("alias", "leak", SIZE, reg.region_id, 0))
        assert int(np.count_nonzero(got)) == 0
    finally:
        del buf
        c.close()


def test_fork_after_close_keeps_childs_memory(fresh_node, tmp_path):
    """Close the Client, keep the buffer, fork, let the parent exit: the region
    must not be lent again while the child still maps it."""
    code = FORKER.replace("a[:] = 0xEE\n", "a[:] = 0xEE\nc.close()\n")
    assert code != FORKER
    url, report = fresh_node.shm_url, tmp_path / "child.txt"
    _fork_and_compete(code, url, report)


def test_hostile_descriptors_and_shrinking_memfds(node):
    """Unsealed memfds are refused (shrinking one would SIGBUS the node), lent
    ones cannot be shrunk, and descriptors sent with other frames are closed."""
    import os

    from gpufeed.errors import InvalidArgument, ProtocolError, TransportError
    from gpufeed.wire import protocol as p

    def fd_count() -> int:
        return len(os.listdir(f"/proc/{node.pid}/fd"))

    with Client(node.shm_url) as c:
        conn = c._conns[0]
        raw = os.memfd_create("unsealed")
        os.ftruncate(raw, 1 << 20)
        try:
            with pytest.raises(InvalidArgument, match="sealed"):
                conn.call(p.Op.REGISTER, p.Register(777, 1 << 20), fds=[raw])
        finally:
            os.close(raw)
        reply, fd = conn.call(p.Op.ALLOC_REGION, p.AllocRegion(778, 1 << 20))
        try:
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)
    before = fd_count()
    for _ in range(20):
        with Client(node.shm_url) as c:
            fds = [os.memfd_create("junk") for _ in range(4)]
            try:
                with pytest.raises((ProtocolError, TransportError)):
                    c._conns[0].call(p.Op.LIST_BUCKETS, p.Empty(), fds=fds)
            finally:
                for f in fds:
                    os.close(f)
    time.sleep(0.5)
    assert fd_count() <= before + 4, "descriptors sent with other frames leaked in the node"
    with Client(node.shm_url) as c:
        assert isinstance(c.list_buckets(), list)


def test_client_that_stops_reading_cannot_stall_others(tmp_path):
    """A client pipelines thousands of requests and never reads a reply: once a
    reply cannot be sent for GPUFEED_SEND_TIMEOUT_S the node drops that client,
    and everyone else keeps being served."""
    import os
    import socket

    from gpufeed.testing.wire_fuzz import authenticate_raw
    from gpufeed.wire import protocol as p

    proc = start_node(tmp_path / "data", env={**os.environ, "GPUFEED_SEND_TIMEOUT_S": "2"})
    try:
        with Client(proc.tcp_url) as c:
            c.create_bucket("stall")
            c.put("stall", "obj", b"x" * (1 << 20))
        host, port = proc.tcp_url.split("//")[1].rsplit(":", 1)
        hog = socket.create_connection((host, int(port)))
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        authenticate_raw(hog, "tcp")
        meta = p.encode(p.Get("stall", "obj"))
        frame = b"".join(p.pack_header(p.Op.GET, len(meta), i + 1, 0) + meta for i in range(64))
        hog.sendall(frame)  # 64 MiB of replies that nobody reads
        time.sleep(0.5)
        t0 = time.monotonic()
        with Client(proc.tcp_url, request_timeout_s=30) as c:
            for _ in range(16):  # more than the node's worker threads
                assert len(c.get("stall", "obj")) == 1 << 20
        assert time.monotonic() - t0 < 25
        hog.close()
    finally:
        proc.stop()
