"""gpufeed._memory.map_extents: ranges of several files mapped side by side as one
buffer, zero-copy (the page cache's pages), refused when misaligned, unmapped
once and never under a live view."""

from __future__ import annotations

import gc
import mmap
import os
import random

import numpy as np
import pytest

from gpufeed._memory import MappedExtents, address_of, map_extents

PAGE = mmap.PAGESIZE


def _mappings() -> list[tuple[int, int, str]]:
    """``(start, end, path)`` of every mapping of this process (/proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi, fields[5].strip() if len(fields) > 5 else ""))
    return out


def _mappings_of(paths: list[str]) -> list[tuple[int, int, str]]:
    return [m for m in _mappings() if m[2] in paths]


def _mapped_at(address: int) -> tuple[int, int, str] | None:
    return next((m for m in _mappings() if m[0] <= address < m[1]), None)


@pytest.fixture
def files(tmp_path):
    """Four data files of 64 pages + 100 bytes of random bytes: (paths, contents, fds)."""
    rng = np.random.default_rng(15)
    paths, datas, fds = [], [], []
    for i in range(4):
        data = rng.integers(0, 256, 64 * PAGE + 100, dtype=np.uint8).tobytes()
        path = tmp_path / f"chunks-{i}"
        path.write_bytes(data)
        paths.append(str(path))
        datas.append(data)
        fds.append(os.open(path, os.O_RDONLY))
    yield paths, datas, fds
    for fd in fds:
        os.close(fd)


def _random_extents(n: int, datas: list[bytes], fds: list[int], seed: int):
    """``n`` extents from random files at random page offsets, 1-3 pages each, the
    last one ending mid-page; and the bytes they should read as."""
    rng = random.Random(seed)
    extents, want = [], []
    for i in range(n):
        f = rng.randrange(len(fds))
        offset = rng.randrange(0, 60) * PAGE
        length = rng.randrange(1, 4) * PAGE
        if i == n - 1:
            length -= rng.randrange(1, PAGE)
        extents.append((fds[f], offset, length))
        want.append(datas[f][offset:offset + length])
    return extents, b"".join(want)


@pytest.mark.parametrize("n", [2, 3, 300])
def test_extents_read_as_the_files_bytes_in_order(files, n):
    _paths, datas, fds = files
    extents, want = _random_extents(n, datas, fds, seed=n)
    with map_extents(extents) as m:
        assert isinstance(m, MappedExtents)
        assert len(m) == m.nbytes == len(want)
        assert m.address % PAGE == 0 and address_of(m.view)[0] == m.address
        assert m.view.readonly and not m.writable
        assert bytes(m.view) == want
        arr = np.frombuffer(m.view, np.uint8)
        assert not arr.flags.writeable and arr[-1] == want[-1]
        del arr


def test_descriptors_may_be_closed_after_mapping(files):
    paths, datas, _fds = files
    fds = [os.open(path, os.O_RDONLY) for path in paths[:3]]
    m = map_extents([(fds[0], 0, 2 * PAGE), (fds[1], PAGE, PAGE), (fds[2], 0, 10)])
    for fd in fds:
        os.close(fd)
    assert bytes(m.view) == datas[0][:2 * PAGE] + datas[1][PAGE:2 * PAGE] + datas[2][:10]
    m.close()


def test_pages_are_the_page_cache_not_a_copy(files):
    """The mapping is the files' own pages: each extent is a file-backed mapping
    of its path (``/proc/self/maps``), and a write through another descriptor
    shows in it at once."""
    paths, datas, fds = files
    m = map_extents([(fds[0], 0, PAGE), (fds[1], 8 * PAGE, 2 * PAGE), (fds[2], 0, 100)])
    for pos, path in [(0, paths[0]), (PAGE, paths[1]), (2 * PAGE, paths[1]), (3 * PAGE, paths[2])]:
        found = _mapped_at(m.address + pos)
        assert found is not None and found[2] == path, (pos, found)
    writer = os.open(paths[1], os.O_WRONLY)
    try:
        os.pwrite(writer, b"written elsewhere", 8 * PAGE + 5)
    finally:
        os.close(writer)
    assert bytes(m.view[PAGE + 5:PAGE + 22]) == b"written elsewhere"
    assert bytes(m.view[:PAGE]) == datas[0][:PAGE]
    m.close()


def test_copy_on_write_never_reaches_the_file(files):
    paths, datas, fds = files
    m = map_extents([(fds[0], 0, PAGE), (fds[1], 0, 5)], copy_on_write=True)
    assert m.writable and not m.view.readonly
    m.view[:4] = b"\0\0\0\0"
    m.view[PAGE:PAGE + 5] = b"12345"
    assert bytes(m.view[:4]) == b"\0\0\0\0" and bytes(m.view[PAGE:]) == b"12345"
    with open(paths[0], "rb") as f0, open(paths[1], "rb") as f1:
        assert f0.read(4) == datas[0][:4] and f1.read(5) == datas[1][:5]
    m.close()


@pytest.mark.parametrize("bad, match", [
    ([(0, 100, PAGE)], "offset 100 is not a multiple"),
    ([(0, 0, PAGE + 1), (1, 0, PAGE)], "length 4097 is not a multiple"),
    ([(0, -PAGE, PAGE)], "negative"),
    ([(0, 0, -1)], "negative"),
    ([(0, 0, PAGE), (1, 64 * PAGE, PAGE)], "fewer than the extent's end"),
])
def test_misaligned_or_out_of_file_extents_are_refused(files, bad, match):
    paths, _datas, fds = files
    extents = [(fds[f], offset, length) for f, offset, length in bad]
    with pytest.raises(ValueError, match=match):
        map_extents(extents)
    assert _mappings_of(paths) == []


def test_a_failed_mmap_leaves_nothing_mapped(files):
    paths, _datas, fds = files
    write_only = os.open(paths[1], os.O_WRONLY)  # PROT_READ of it: EACCES
    try:
        with pytest.raises(OSError, match="mapping extent 1"):
            map_extents([(fds[0], 0, PAGE), (write_only, 0, PAGE)])
        assert _mappings_of(paths) == []  # extent 0 was placed, then unmapped
    finally:
        os.close(write_only)
    with pytest.raises(OSError):
        map_extents([(fds[0], 0, PAGE), (-1, 0, PAGE)])  # not a descriptor


def test_empty():
    assert len(map_extents([]).view) == 0
    m = map_extents([], copy_on_write=True)
    assert len(m) == 0 and not m.view.readonly and m.unmapped


def test_close_with_live_views_keeps_their_pages_then_frees_once(files):
    _paths, datas, fds = files
    m = map_extents([(fds[0], 0, PAGE), (fds[1], 0, PAGE), (fds[2], 0, PAGE)])
    address = m.address
    arr = np.frombuffer(m.view, np.uint8)  # exports from the view itself
    tail = m.view[2 * PAGE:]  # a slice: shares the mapping, not an export
    m.close()
    m.close()  # idempotent
    assert m.closed and not m.unmapped
    with pytest.raises(ValueError, match="closed"):
        _ = m.view
    assert arr[:PAGE].tobytes() == datas[0][:PAGE]  # no crash: the pages are still there
    assert bytes(tail) == datas[2][:PAGE]
    del arr
    gc.collect()
    assert not m.unmapped and _mapped_at(address) is not None
    del tail
    gc.collect()
    assert m.unmapped
    assert _mapped_at(address) is None and _mapped_at(address + 2 * PAGE) is None


def test_garbage_collection_unmaps(files):
    _paths, _datas, fds = files
    m = map_extents([(fds[0], 0, PAGE), (fds[1], 0, 3)])
    address = m.address
    assert _mapped_at(address) is not None
    del m
    gc.collect()
    assert _mapped_at(address) is None


def test_close_without_views_unmaps_at_once(files):
    _paths, _datas, fds = files
    m = map_extents([(fds[3], 4 * PAGE, 4 * PAGE)])
    address = m.address
    m.close()
    assert m.unmapped and _mapped_at(address) is None
