"""Mapping memory in ahead of use: gpufeed._memory.populate, Client.map_ahead
(pages the node fills are mapped into the client before the first touch, and
never walked twice) and Client.map_object (zero-copy maps of stored objects)."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from gpufeed._memory import address_of, populate, populate_range
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument, NoSuchBucket, NoSuchKey
from gpufeed.testing.memory import resident_bytes as _rss_bytes

SIZE = 24 << 20


def _memfd_map(size: int) -> tuple[int, mmap.mmap]:
    fd = os.memfd_create("test-populate")
    os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


@pytest.mark.parametrize("threads", [1, 3])
def test_populate_maps_every_page_and_keeps_contents(threads):
    size = 200 << 20  # 3 threads get >= 64 MiB each
    fd, mm = _memfd_map(size)
    try:
        mm[:5] = b"hello"
        base = address_of(mm)[0]
        assert _rss_bytes(base) < size // 2
        assert populate(mm, threads=threads) is True
        assert _rss_bytes(base) >= size
        assert mm[:5] == b"hello" and mm[size - 1] == 0
    finally:
        mm.close()
        os.close(fd)


def test_populate_read_maps_pages_another_mapping_filled():
    fd, writer = _memfd_map(SIZE)
    reader = mmap.mmap(fd, SIZE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        np.frombuffer(writer, np.uint8)[:] = 7  # "the node" fills the pages
        base = address_of(reader)[0]
        assert _rss_bytes(base) == 0
        assert populate(reader, write=False) is True
        assert _rss_bytes(base) >= SIZE
        arr = np.frombuffer(reader, np.uint8)
        assert int(arr.min()) == int(arr.max()) == 7
        arr[:] = 9  # read-populated shared pages are writable
        assert writer[SIZE - 1] == 9
        del arr
    finally:
        reader.close()
        writer.close()
        os.close(fd)


def test_populate_edge_cases():
    assert populate_range(0, 0) is False
    fd, mm = _memfd_map(4096)
    mm.close()
    with pytest.raises(ValueError):
        populate(mm)
    os.close(fd)
    # an unaligned range is widened to whole pages
    fd, mm = _memfd_map(3 * mmap.PAGESIZE)
    try:
        assert populate_range(address_of(mm)[0] + 100, mmap.PAGESIZE) is True
        assert _rss_bytes(address_of(mm)[0]) == 2 * mmap.PAGESIZE
    finally:
        mm.close()
        os.close(fd)


def test_map_ahead_maps_lent_pages_once(node):
    data = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    with Client(node.tcp_url) as up:  # an shm put would leave mapped memory in c's pool
        up.create_bucket("map-ahead")
        up.put("map-ahead", "obj", data)
    with Client(node.shm_url) as c:
        buf = c.alloc(SIZE)
        address, _ = address_of(buf)
        before = _rss_bytes(address)
        thread = c.map_ahead(buf)
        assert thread is not None
        assert c.get_into("map-ahead", "obj", buf) == SIZE
        thread.join()
        assert before < SIZE // 2 <= SIZE <= _rss_bytes(address)
        assert bytes(buf) == data
        assert c.map_ahead(buf) is None  # already mapped: nothing to walk
        assert c.map_ahead(buf[4096:8192]) is None
        assert c.map_ahead(memoryview(bytearray(SIZE))) is None  # not in a region
        del buf
        again = c.alloc(SIZE)  # the same region from the client's pool
        assert address_of(again)[0] == address
        assert c.map_ahead(again) is None


def test_map_ahead_is_a_no_op_over_tcp(node):
    with Client(node.tcp_url) as c:
        buf = c.alloc(SIZE)
        assert c.map_ahead(buf) is None


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_map_object_is_a_private_snapshot(node):
    data = np.random.default_rng(9).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    with Client(node.shm_url) as c:
        c.create_bucket("map-object")
        c.put("map-object", "obj", data)
        fds = _open_fds()
        view = c.map_object("map-object", "obj")
        assert _open_fds() == fds  # the descriptor is closed once mapped
        assert len(view) == SIZE and bytes(view) == data
        assert _rss_bytes(address_of(view)[0]) >= SIZE  # populated before return
        lazy = c.map_object("map-object", "obj", populate=False)
        assert _rss_bytes(address_of(lazy)[0]) < SIZE // 2 and bytes(lazy) == data
        view[:4] = b"\0\0\0\0"  # copy-on-write: the object is unchanged
        assert bytes(c.get("map-object", "obj")[:4]) == data[:4]
        c.put("map-object", "obj", b"replaced")
        c.delete("map-object", "obj")
        assert bytes(lazy) == data and bytes(view[4:]) == data[4:]
        c.put("map-object", "empty", b"")
        assert len(c.map_object("map-object", "empty")) == 0
        with pytest.raises(NoSuchKey):
            c.map_object("map-object", "obj")
        with pytest.raises(NoSuchBucket):
            c.map_object("no-such-bucket", "obj")
    with Client(node.tcp_url) as c, pytest.raises(InvalidArgument, match="shm"):
        c.map_object("map-object", "empty")
