"""Reads into fresh memory (``Client.alloc_shared``: a memfd registered fresh):
the node writes each checked piece in by ``pwrite`` and maps none of it
populated. The bytes that land are the object's, exactly where asked (GET,
GETV, GETR, unaligned, across pieces, clipped at the object's end, split over
threads); bytes nobody asked for stay as they were; a damaged piece is refused
and never written."""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed import _native
from gpufeed.bench.integrity import _chunks  # the catalog's chunk list of one object
from gpufeed.client import Client, ReadRequest
from gpufeed.errors import DamagedObject, InvalidRange
from gpufeed.testing.node import NodeProcess, flip_bits, start_node
from gpufeed.wire._staged import STAGE_BYTES

BLOCK = 4096
SENTINEL = 0xA5


@pytest.fixture(params=["native", "python"])
def fresh_node(request, tmp_path) -> NodeProcess:
    """A node of its own, reading ranges in its C loop or in Python (``GPUFEED_NATIVE=0``)."""
    if request.param == "native" and _native.read_ranges is None:
        pytest.skip("the native batch loop is not built here")
    proc = start_node(tmp_path / "data", env={"GPUFEED_NATIVE": "1" if request.param == "native" else "0"})
    yield proc
    proc.stop()


def _data(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _fresh(c: Client, n: int):
    buf = c.alloc_shared(n)
    view = buf.view
    view[:] = bytes([SENTINEL]) * n
    return buf, view


def _untouched(view: memoryview) -> bool:
    return bytes(view) == bytes([SENTINEL]) * len(view)


def _node_resident_kib(pid: int, name: str) -> int:
    """Resident KiB of the node's mappings of memfds named ``name`` (``/proc/PID/smaps``)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = f"memfd:{name}" in line
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_batch_rows_land_right_and_the_node_maps_none_of_it(fresh_node):
    size = 3 * STAGE_BYTES + 12_345  # rows cross pieces and end mid-block
    objs = [_data(size, i) for i in range(5)]
    with Client(fresh_node.shm_url, **fresh_node.credentials) as c:
        c.create_bucket("fresh")
        for i, d in enumerate(objs):
            c.put("fresh", f"o{i}", d)
        buf, view = _fresh(c, len(objs) * size + 1)
        # the raw-tensor loader's read: each row asks one byte more, landing on the next row
        reqs = [ReadRequest("fresh", f"o{i}", view[i * size:(i + 1) * size + 1]) for i in range(len(objs))]
        assert c.get_many_into(reqs) == [size] * len(objs)
        for i, d in enumerate(objs):
            assert bytes(view[i * size:(i + 1) * size]) == d
        assert view[len(objs) * size] == SENTINEL  # the spare byte: nothing grew
        # the node wrote through its descriptor: its (unpopulated) mapping holds no page
        assert _node_resident_kib(fresh_node.pid, "gpufeed-shared") == 0
        # a single GET at an odd offset over several pieces
        view[:] = bytes([SENTINEL]) * len(view)
        n = 2 * STAGE_BYTES + 999
        assert c.get_into("fresh", "o3", view[777:777 + n], offset=STAGE_BYTES - 5) == n
        assert bytes(view[777:777 + n]) == objs[3][STAGE_BYTES - 5:STAGE_BYTES - 5 + n]
        assert _untouched(view[:777]) and _untouched(view[777 + n:])
        del view
        buf.close()


def test_ranges_land_packed_and_clipped_ranges_leave_the_rest(fresh_node):
    size = 4 * STAGE_BYTES + 3_000
    data = _data(size, 9)
    with Client(fresh_node.shm_url, **fresh_node.credentials) as c:
        c.create_bucket("fresh")
        c.put("fresh", "shard", data)
        offsets = [512 + k * 29_184 for k in range(20)] + [STAGE_BYTES + 3, size - 100, size + 10]
        lengths = [28_672] * 20 + [STAGE_BYTES + 50_000, 1_000, 10]
        buf, view = _fresh(c, sum(lengths))
        errors: list = []
        got = c.get_ranges_into("fresh", "shard", view, offsets, lengths, errors_out=errors)
        want = [28_672] * 20 + [STAGE_BYTES + 50_000, 100, -1]
        assert got.tolist() == want
        assert isinstance(errors[-1], InvalidRange) and all(e is None for e in errors[:-1])
        pos = 0
        for off, ln, n in zip(offsets, lengths, want):
            if n > 0:
                assert bytes(view[pos:pos + n]) == data[off:off + n]
            # past what a range delivered, its slot keeps what was there
            assert _untouched(view[pos + max(n, 0):pos + ln])
            pos += ln
        del view
        buf.close()


def _damage(node, bucket: str, key: str, pos: int) -> None:
    """Flip a bit at object offset ``pos`` in its data file."""
    for _cid, file, offset, stored in _chunks(node.data_dir / "catalog.sqlite3", bucket, key):
        if pos < stored:
            flip_bits(node.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + pos, 0x10)
            return
        pos -= stored
    raise AssertionError("the offset is past the object")


def test_a_large_get_is_split_and_lands_whole_or_refuses_damage(fresh_node):
    size = (40 << 20) + 4_321  # past SPLIT_BYTES: parts on several threads
    data = _data(size, 3)
    with Client(fresh_node.shm_url, **fresh_node.credentials) as c:
        c.create_bucket("fresh")
        c.put("fresh", "big", data)
        buf, view = _fresh(c, size + 10)
        assert c.get_into("fresh", "big", view[5:5 + size]) == size
        assert bytes(view[5:5 + size]) == data
        assert _untouched(view[:5]) and _untouched(view[5 + size:])
        bad = 20 * STAGE_BYTES + 3 * BLOCK  # in the part of a thread other than the first
        _damage(fresh_node, "fresh", "big", bad)
        view[:] = bytes([SENTINEL]) * len(view)
        with pytest.raises(DamagedObject):
            c.get_into("fresh", "big", view[:size])
        assert _untouched(view[bad - bad % STAGE_BYTES:bad - bad % STAGE_BYTES + STAGE_BYTES])
        del view
        buf.close()


def test_a_parallel_batch_fails_only_its_damaged_item(fresh_node):
    size = 2 << 20  # three of them: a batch read on several threads
    objs = [_data(size, 20 + i) for i in range(3)]
    with Client(fresh_node.shm_url, **fresh_node.credentials) as c:
        c.create_bucket("fresh")
        for i, d in enumerate(objs):
            c.put("fresh", f"o{i}", d)
        bad = 5 * STAGE_BYTES + 9
        _damage(fresh_node, "fresh", "o1", bad)
        buf, view = _fresh(c, 3 * size)
        errors: list = []
        got = c.get_many_into([ReadRequest("fresh", f"o{i}", view[i * size:(i + 1) * size]) for i in range(3)],
                              errors_out=errors)
        assert got == [size, -1, size] and isinstance(errors[1], DamagedObject)
        assert bytes(view[:size]) == objs[0] and bytes(view[2 * size:]) == objs[2]
        piece = size + bad - bad % STAGE_BYTES
        assert _untouched(view[piece:piece + STAGE_BYTES])
        del view
        buf.close()


def test_a_damaged_piece_is_refused_and_never_written(fresh_node):
    size = 4 * STAGE_BYTES
    data, other = _data(size, 11), _data(size, 12)
    bad = STAGE_BYTES + 40 * BLOCK + 77  # in the second piece
    with Client(fresh_node.shm_url, **fresh_node.credentials) as c:
        c.create_bucket("fresh")
        c.put("fresh", "obj", data)
        c.put("fresh", "other", other)
        chunks = _chunks(fresh_node.data_dir / "catalog.sqlite3", "fresh", "obj")
        _cid, file, offset, _stored = chunks[0]
        assert _stored > bad, "the damaged byte must lie in the first chunk"
        flip_bits(fresh_node.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + bad, 0x10)
        buf, view = _fresh(c, 2 * size)
        piece = slice(STAGE_BYTES, 2 * STAGE_BYTES)  # the damaged piece's place in a whole read
        with pytest.raises(DamagedObject):
            c.get_into("fresh", "obj", view[:size])
        assert _untouched(view[piece])
        errors: list = []
        got = c.get_many_into([ReadRequest("fresh", "obj", view[:size]), ReadRequest("fresh", "other", view[size:])],
                              errors_out=errors)
        assert got[0] == -1 and isinstance(errors[0], DamagedObject)
        assert got[1] == size and bytes(view[size:]) == other
        assert _untouched(view[piece])
        view[:] = bytes([SENTINEL]) * len(view)
        errors = []
        # a short range, one longer than the staging buffer (its first 10 bytes lie before the damaged piece)
        got = c.get_ranges_into("fresh", "obj", view, [0, bad - 100, 3 * STAGE_BYTES, STAGE_BYTES - 10],
                                [BLOCK, 200, BLOCK, STAGE_BYTES + 20], errors_out=errors)
        assert got.tolist() == [BLOCK, -1, BLOCK, -1]
        assert isinstance(errors[1], DamagedObject) and isinstance(errors[3], DamagedObject)
        assert bytes(view[:BLOCK]) == data[:BLOCK]
        assert _untouched(view[BLOCK:BLOCK + 200])
        assert bytes(view[BLOCK + 200:2 * BLOCK + 200]) == data[3 * STAGE_BYTES:3 * STAGE_BYTES + BLOCK]
        assert _untouched(view[2 * BLOCK + 200 + 10:2 * BLOCK + 200 + STAGE_BYTES + 20])
        # the connection still serves the undamaged parts
        assert c.get_into("fresh", "obj", view[:STAGE_BYTES]) == STAGE_BYTES
        assert bytes(view[:STAGE_BYTES]) == data[:STAGE_BYTES]
        del view
        buf.close()
