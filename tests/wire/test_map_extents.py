"""MAP_EXTENTS: an object's data files and extents sent as descriptors (more than
``SCM_MAX_FD`` of them over several messages), mapped by the client side by side;
MAP keeps its one-descriptor form for clients and nodes without the feature."""

from __future__ import annotations

import mmap
import os
import socket
import time

import msgspec
import numpy as np
import pytest

from gpufeed._memory import map_extents
from gpufeed.client import Client
from gpufeed.client._conn import Connection
from gpufeed.errors import InternalError, NoSuchKey, NotImplementedByGpufeed, ProtocolError
from gpufeed.wire import protocol as p
from gpufeed.wire._frames import FrameIO
from gpufeed.wire._mapping import plan_extents, send_map

PAGE = mmap.PAGESIZE
BUCKET = "map-extents"


# --- the descriptors' journey over a real Unix socket, no node ----------------------
@pytest.fixture
def pair():
    """``(server FrameIO, client Connection)`` over a socketpair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = FrameIO(a, "shm")
    client = Connection(b, True, request_timeout_s=20)
    yield server, client
    client.close()
    a.close()


def _serve_one(server: FrameIO, size: int, etag: str, extents, op=p.Op.MAP_EXTENTS) -> None:
    """Read one request off the socket and answer it with ``send_map``."""
    hdr = server.recv_header()
    assert hdr is not None
    _op, meta_len, rid, _plen = p.unpack_header(hdr)
    server.recv_meta(meta_len)
    send_map(server, op, rid, size, etag, extents)


def _page_files(tmp_path, n: int, last_bytes: int) -> tuple[list[int], bytes]:
    """``n`` files of one page each (the last of ``last_bytes``), opened read-only;
    and what they hold, back to back."""
    rng = np.random.default_rng(n)
    fds, parts = [], []
    for i in range(n):
        data = rng.integers(0, 256, PAGE if i < n - 1 else last_bytes, dtype=np.uint8).tobytes()
        path = tmp_path / f"chunk-{i:04d}"
        path.write_bytes(data)
        fds.append(os.open(path, os.O_RDONLY))
        parts.append(data)
    return fds, b"".join(parts)


@pytest.mark.parametrize("n", [1, 2, 253, 254, 300, 600])
def test_many_descriptors_travel_in_batches(pair, tmp_path, n):
    server, client = pair
    fds, want = _page_files(tmp_path, n, 123)
    try:
        fut = client.request(p.Op.MAP_EXTENTS, p.Head(BUCKET, "k"))
        _serve_one(server, len(want), "etag", [(fd, 0, PAGE if i < n - 1 else 123)
                                               for i, fd in enumerate(fds)])
        reply, got = fut.result(timeout=20)
    finally:
        p.close_fds(fds)
    try:
        assert reply.size == len(want) and reply.files == n == len(got)
        assert reply.extents == [(i, 0, PAGE if i < n - 1 else 123) for i in range(n)]
        with map_extents([(got[f], off, ln) for f, off, ln in reply.extents]) as m:
            assert bytes(m.view) == want
    finally:
        p.close_fds(got)
    # the connection is still framed: a second reply arrives whole
    fut = client.request(p.Op.MAP_EXTENTS, p.Head(BUCKET, "empty"))
    _serve_one(server, 0, "e", [])
    assert fut.result(timeout=20) == (p.MapExtentsReply(0, "e", 0, []), [])


def test_one_descriptor_per_file_however_many_extents(pair, tmp_path):
    server, client = pair
    fds, want = _page_files(tmp_path, 1, PAGE)
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 64)  # 4 pages
    fds.append(os.open(big, os.O_RDONLY))
    try:
        fut = client.request(p.Op.MAP_EXTENTS, p.Head(BUCKET, "k"))
        _serve_one(server, 4 * PAGE, "x", [(fds[1], 2 * PAGE, PAGE), (fds[0], 0, PAGE),
                                           (fds[1], 0, PAGE), (fds[1], PAGE, PAGE)])
        reply, got = fut.result(timeout=20)
    finally:
        p.close_fds(fds)
    try:
        # the last two extents continue each other in one file: merged
        assert reply.files == 2 and reply.extents == [(0, 2 * PAGE, PAGE), (1, 0, PAGE),
                                                      (0, 0, 2 * PAGE)]
        with map_extents([(got[f], off, ln) for f, off, ln in reply.extents]) as m:
            page = (bytes(range(256)) * 16)
            assert bytes(m.view) == page + want + page + page
    finally:
        p.close_fds(got)


def test_map_sends_the_first_form(pair, tmp_path):
    server, client = pair
    fds, want = _page_files(tmp_path, 1, 100)
    try:
        fut = client.request(p.Op.MAP, p.Head(BUCKET, "k"))
        _serve_one(server, 100, "e1", [(fds[0], 0, 100)], op=p.Op.MAP)
        reply, fd = fut.result(timeout=20)
        assert reply == p.MapReply(100, "e1")
        assert os.pread(fd, 200, 0) == want
        os.close(fd)
        fut = client.request(p.Op.MAP, p.Head(BUCKET, "empty"))  # no file: still a descriptor
        _serve_one(server, 0, "e0", [], op=p.Op.MAP)
        reply, fd = fut.result(timeout=20)
        assert reply == p.MapReply(0, "e0") and os.read(fd, 1) == b""
        os.close(fd)
    finally:
        p.close_fds(fds)


def test_map_refuses_an_object_in_pieces(tmp_path):
    fds, _want = _page_files(tmp_path, 2, 10)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(NotImplementedByGpufeed, match="MAP_EXTENTS"):
            send_map(FrameIO(a, "shm"), p.Op.MAP, 1, PAGE + 10, "e",
                     [(fds[0], 0, PAGE), (fds[1], 0, 10)])
        with pytest.raises(NotImplementedByGpufeed):  # one piece, not from offset 0
            send_map(FrameIO(a, "shm"), p.Op.MAP, 1, 10, "e", [(fds[1], PAGE, 10)])
    finally:
        p.close_fds(fds)
        a.close()
        b.close()


def test_plan_extents():
    assert plan_extents([(7, 0, PAGE), (7, PAGE, 0), (7, PAGE, 5)], PAGE + 5) == \
        ([7], [(0, 0, PAGE + 5)])
    assert plan_extents([(7, PAGE, PAGE), (8, 0, PAGE), (7, 0, 3)], 2 * PAGE + 3) == \
        ([7, 8], [(0, PAGE, PAGE), (1, 0, PAGE), (0, 0, 3)])
    assert plan_extents([], 0) == ([], [])
    with pytest.raises(InternalError, match="not page-aligned"):
        plan_extents([(7, 10, PAGE)], PAGE)
    with pytest.raises(InternalError, match="ends mid-page"):
        plan_extents([(7, 0, 10), (8, 0, PAGE)], PAGE + 10)
    with pytest.raises(InternalError, match="not its"):
        plan_extents([(7, 0, PAGE)], PAGE + 1)


def test_golden_map_extents_reply():
    # [size=5, etag="e", files=1, extents=[[0, 0, 5]]]: fixarray(4), positive fixints,
    # fixstr(1), fixarray(1) of fixarray(3)
    golden = bytes([0x94, 0x05, 0xA1]) + b"e" + bytes([0x01, 0x91, 0x93, 0x00, 0x00, 0x05])
    assert p.encode(p.MapExtentsReply(5, "e", 1, [(0, 0, 5)])) == golden
    assert p.decode(p.MapExtentsReply, golden) == p.MapExtentsReply(5, "e", 1, [(0, 0, 5)])
    assert p.Op.MAP_EXTENTS == 21 and p.REQUEST_TYPES[p.Op.MAP_EXTENTS] is p.Head
    assert msgspec.msgpack.encode(["b", "k"]) == p.encode(p.Head("b", "k"))


# --- a real node ---------------------------------------------------------------------
SIZES = [0, 1, PAGE - 1, PAGE, PAGE + 1, (3 << 20) + 7]


def _objects(c: Client) -> dict[str, bytes]:
    rng = np.random.default_rng(21)
    c.create_bucket(BUCKET) if BUCKET not in c.list_buckets() else None
    out = {}
    for size in SIZES:
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        c.put(BUCKET, f"obj-{size}", data)
        out[f"obj-{size}"] = data
    return out


def test_hello_announces_map_extents_on_shm_only(node):
    with Client(node.shm_url) as shm, Client(node.tcp_url) as tcp:
        assert {"map", "map_extents"} <= shm._t.features
        assert "map_extents" not in tcp._t.features and not tcp.supports_map


def test_map_object_of_one_file_objects_through_map_extents(node):
    with Client(node.shm_url) as c:
        objects = _objects(c)
        for key, data in objects.items():
            reply, fds = c._t.conn().call(p.Op.MAP_EXTENTS, p.Head(BUCKET, key))
            got = len(fds)
            p.close_fds(fds)
            assert reply.size == len(data) and reply.files == got == (1 if data else 0)
            assert reply.extents == ([(0, 0, len(data))] if data else [])
            view = c.map_object(BUCKET, key)
            assert bytes(view) == data and not view.readonly
            lazy = c.map_object(BUCKET, key, populate=False)
            assert bytes(lazy) == data
        with pytest.raises(NoSuchKey):
            c.map_object(BUCKET, "missing")


def test_map_object_as_a_client_without_map_extents(node):
    """What a client (or a node) from before MAP_EXTENTS does: MAP, one descriptor."""
    with Client(node.shm_url) as c:
        objects = _objects(c)
        c._t.features.discard("map_extents")
        assert c.supports_map
        for key, data in objects.items():
            reply, fd = c._t.conn().call(p.Op.MAP, p.Head(BUCKET, key))
            os.close(fd)
            assert reply == p.MapReply(len(data), reply.etag)
            view = c.map_object(BUCKET, key)
            assert bytes(view) == data and not view.readonly
        with pytest.raises(NoSuchKey):
            c.map_object(BUCKET, "missing")


def test_map_object_leaves_no_descriptor_and_unmaps_with_its_view(node):
    with Client(node.shm_url) as c:
        _objects(c)
        c.map_object(BUCKET, f"obj-{SIZES[-1]}")  # first use opens what the client keeps
        fds = len(os.listdir("/proc/self/fd"))
        view = c.map_object(BUCKET, f"obj-{SIZES[-1]}")
        assert len(os.listdir("/proc/self/fd")) == fds
        address = np.frombuffer(view, np.uint8).ctypes.data
        tensor_like = np.frombuffer(view, np.uint8)[PAGE:]
        del view
        assert int(tensor_like[0]) >= 0  # still mapped through the array
        del tensor_like
        with open("/proc/self/maps") as f:
            spans = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f]
        assert not any(lo <= address < hi for lo, hi in spans)


@pytest.mark.parametrize("files, sent, payload_len", [(2, 1, 0), (1, 0, 0), (1, 1, 1)])
def test_a_reply_whose_descriptors_do_not_match_fails_the_connection(pair, tmp_path, files, sent,
                                                                     payload_len):
    server, client = pair
    fds, _want = _page_files(tmp_path, 1, 10)
    try:
        fut = client.request(p.Op.MAP_EXTENTS, p.Head(BUCKET, "k"))
        hdr = server.recv_header()
        assert hdr is not None
        _op, meta_len, rid, _plen = p.unpack_header(hdr)
        server.recv_meta(meta_len)
        meta = p.encode(p.MapExtentsReply(10, "e", files, [(0, 0, 10)]))
        frame = p.pack_header(p.Op.MAP_EXTENTS | p.REPLY, len(meta), rid, payload_len) + meta
        server._send_with_fds(frame + b"\0" * payload_len, fds[:sent])
        with pytest.raises(ProtocolError):
            fut.result(timeout=20)
        deadline = time.monotonic() + 10  # the reader fails the request, then closes the connection
        while not client.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.closed
    finally:
        p.close_fds(fds)
