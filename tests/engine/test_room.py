"""A cluster node's used, capacity and free bytes (:mod:`gpufeed.engine._room`),
on a real folder, with the file system's answer given so the figures are exact."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufeed.engine._membership import LocalMembership, NodeClaim, cluster_report
from gpufeed.engine._room import RECOUNT_SPACING, NodeRoom, folder_bytes, is_full
from gpufeed.errors import StorageFull


class _Disk:
    """What ``os.statvfs`` answers: a file system of ``size`` bytes with ``free`` free."""

    def __init__(self, size: int, free: int) -> None:
        self.size, self.free = size, free

    def __call__(self, _path: str) -> os.statvfs_result:
        return os.statvfs_result((4096, 1, self.size, self.free, self.free, 0, 0, 0, 0, 255))


def _file(path, nbytes: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * nbytes)
    return str(path)


def test_used_bytes_count_the_folder_but_its_temp_files_and_each_file_stored_since(tmp_path):
    _file(tmp_path / "blobs" / "ab" / "cd" / "f1", 1000)
    _file(tmp_path / "uploads" / "u1" / "1", 300)  # a part file counts
    _file(tmp_path / "tmp" / "t1", 5000)  # a write under way does not
    room = NodeRoom(tmp_path, capacity_bytes=3 << 20, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29))
    assert room.usage().used_bytes == 1300
    room.add_file(_file(tmp_path / "blobs" / "ab" / "cd" / "f2", 700), 700)  # stored after the walk
    u = room.usage()
    assert (u.used_bytes, u.capacity_bytes, u.free_bytes, u.full) == (2000, 3 << 20, (3 << 20) - 2000, False)
    room.add_file(str(tmp_path / "gone"), 500)  # deleted meanwhile: nothing counted
    assert room.usage().used_bytes == 2000


def test_capacity_and_reserve_decide_what_fits(tmp_path):
    disk = _Disk(1 << 20, 40_000)
    room = NodeRoom(tmp_path, reserve_bytes=15_000, count_interval_s=0, statvfs=disk)
    u = room.usage()
    assert u.capacity_bytes == 1 << 20 and u.free_bytes == 25_000  # the file system's size; its free less the reserve
    assert room.fits(25_000) and not room.fits(25_001)
    with pytest.raises(StorageFull, match="25001 bytes more do not fit in its 25000 free bytes"):
        room.check_keep(25_001)
    room.check_write(25_000)  # placing: a write through this node needs the disk above the reserve only
    with pytest.raises(StorageFull, match="disk of this node's data folder is full"):
        room.check_write(25_001)
    _file(tmp_path / "blobs" / "f", 9000)
    capped = NodeRoom(tmp_path, capacity_bytes=10_000, count_interval_s=0, statvfs=disk, placing=False)
    assert capped.usage().free_bytes == 1000
    with pytest.raises(StorageFull):  # without placing, a write must fit the capacity too
        capped.check_write(1001)
    disk.free = 10_000  # the disk fuller than the capacity says
    assert NodeRoom(tmp_path, reserve_bytes=9800, statvfs=disk).usage().free_bytes == 200


def test_full_is_less_than_one_percent_or_one_mib_free():
    assert is_full(100 << 30, (1 << 30) - 1) and not is_full(100 << 30, 1 << 30)
    assert is_full(10 << 20, (1 << 20) - 1) and not is_full(10 << 20, 1 << 20)
    assert not is_full(0, -1)  # not reported


def test_the_status_report_shows_each_members_figures():
    m = LocalMembership()
    m.register(NodeClaim("c1", "n1", "h", 1, 2, "i1"), expiry_s=10, bytes_stored=900, room=(1 << 30, 20 << 20))
    m.register(NodeClaim("c1", "n2", "h", 1, 2, "i2"), expiry_s=10, bytes_stored=900, room=(1 << 30, 1000))
    m.register(NodeClaim("c1", "n3", "h", 1, 2, "i3"), expiry_s=10, bytes_stored=7)  # reports no room figures
    rows = {n["node_id"]: n for n in cluster_report(m, "c1", 10)["nodes"]}
    assert [rows[n]["full"] for n in ("n1", "n2", "n3")] == [False, True, False]
    assert (rows["n1"]["bytes_stored"], rows["n1"]["capacity_bytes"], rows["n1"]["free_bytes"]) == (
        900, 1 << 30, 20 << 20)
    assert rows["n3"]["free_bytes"] is None and rows["n3"]["capacity_bytes"] == 0


def test_admitted_bytes_count_at_once_so_concurrent_checks_cannot_pass_the_capacity(tmp_path):
    import threading

    room = NodeRoom(tmp_path, capacity_bytes=10_000, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29))
    results: list[str] = []

    def take() -> None:
        try:
            room.reserve(4000)
            results.append("kept")
        except StorageFull:
            results.append("full")

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["full"] * 4 + ["kept"] * 2  # 2 x 4000 fit in 10,000, a third does not
    assert room.usage().used_bytes == 8000
    room.release(4000)
    assert room.usage().used_bytes == 4000
    staged = _file(tmp_path / "blobs" / "ab" / "cd" / "w1", 5000)  # a write's staged file, after the walk
    assert room.claim_staged(staged, 5000) == 5000  # 4000 + 5000 fit
    w2 = _file(tmp_path / "blobs" / "ab" / "cd" / "w2", 5000)
    assert room.claim_staged(w2, 5000) == -1  # recounted: 4000 + 5000 + 5000 do not fit
    with room.removing() as gone:  # the writer deletes the file of the write it refused
        n = room.counted_bytes(w2)
        os.unlink(w2)
        gone(n)
    room.add_file(staged, 5000)
    room.release(5000)
    assert room.usage().used_bytes == 9000
    capped = NodeRoom(tmp_path, capacity_bytes=14_000, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29),
                      placing=False)
    capped.check_write(5000)  # 5000 walked + 5000: without placing, a write counts from its check on ...
    time.sleep(RECOUNT_SPACING * capped.last_walk_s + 0.01)
    with pytest.raises(StorageFull):  # ... a recount too (its file may not be in the folder yet)
        capped.check_write(5000)


def test_a_node_drains_past_its_high_water_mark_until_it_is_back_under_its_low_water_mark(tmp_path):
    f1 = _file(tmp_path / "blobs" / "ab" / "cd" / "f1", 7000)
    room = NodeRoom(tmp_path, capacity_bytes=10_000, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29),
                    high_water=0.9, low_water=0.6)
    u = room.usage()
    assert (u.used_bytes, u.moving_bytes, u.draining) == (7000, 0, False)
    room.add_file(_file(tmp_path / "blobs" / "ab" / "cd" / "f2", 2500), 2500)  # 9500: past 9000
    u = room.usage()
    assert (u.used_bytes, u.moving_bytes, u.draining) == (9500, 3500, True)  # down to 6000
    with room.removing() as gone:
        os.unlink(f1)
        gone(2000)  # counted off at once (the walk is an hour away)
    room.moved_off(2000)
    u = room.usage()
    assert (u.used_bytes, u.moving_bytes, u.draining) == (7500, 1500, True)  # under the high mark: still draining
    with room.removing() as gone:
        gone(1500)
    room.moved_off(1500)
    assert room.usage().draining is False and room.usage().moving_bytes == 0
    assert (room.moved_files, room.moved_bytes) == (2, 3500)
    again = NodeRoom(tmp_path, capacity_bytes=10_000, count_interval_s=0, statvfs=_Disk(1 << 30, 1 << 29))
    assert again.usage().used_bytes == 2500  # a walk sees the folder as it is
    for high, low in ((0.8, 0.8), (0.9, -0.1), (1.5, 0.5)):
        with pytest.raises(ValueError, match="drain marks"):
            NodeRoom(tmp_path, high_water=high, low_water=low)


def test_files_deleted_while_a_walk_counts_them_come_off_once(tmp_path):
    f1 = _file(tmp_path / "blobs" / "ab" / "cd" / "f1", 3000)
    _file(tmp_path / "blobs" / "ab" / "cd" / "f2", 1000)
    room = NodeRoom(tmp_path, capacity_bytes=10_000, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29))
    assert room.used() == 4000
    with room.removing() as gone:
        os.unlink(f1)
        room.count_interval_s = 0
        assert room.used() == 1000  # a walk during the block sees the folder without f1 ...
        room.count_interval_s = 3600
        gone(3000)
    assert room.used() == 1000  # ... so f1 does not come off again
    with room.removing() as gone:  # no walk: off at once
        os.unlink(tmp_path / "blobs" / "ab" / "cd" / "f2")
        gone(1000)
    assert room.used() == 0


def test_callers_that_find_the_first_walk_under_way_wait_for_it(tmp_path):
    for i in range(2000):
        _file(tmp_path / "blobs" / f"{i % 16:02x}" / f"f{i}", 10)
    room = NodeRoom(tmp_path, capacity_bytes=1 << 20, count_interval_s=0.001, statvfs=_Disk(1 << 30, 1 << 29))
    with ThreadPoolExecutor(8) as pool:  # later walks may be under way too: a caller then gets the figures
        got = list(pool.map(lambda _: room.used(), range(64)))
    assert got == [20_000] * 64


def test_the_status_report_shows_a_draining_member():
    m = LocalMembership()
    m.register(NodeClaim("c1", "n1", "h", 1, 2, "i1"), expiry_s=10, bytes_stored=950, room=(1000, 50),
               moving_bytes=150)
    claim = NodeClaim("c1", "n2", "h", 1, 2, "i2")
    m.register(claim, expiry_s=10, bytes_stored=500, room=(1000, 500))
    rows = {n["node_id"]: n for n in cluster_report(m, "c1", 10)["nodes"]}
    assert (rows["n1"]["draining"], rows["n1"]["moving_bytes"]) == (True, 150)
    assert (rows["n2"]["draining"], rows["n2"]["moving_bytes"]) == (False, 0)
    assert m.heartbeat(claim, 900, room=(1000, 100), moving_bytes=100)
    assert {n.node_id: n.moving_bytes for n in m.nodes("c1")} == {"n1": 150, "n2": 100}


def _stored(tmp_path, name: str, nbytes: int) -> str:
    """A data file of ``nbytes`` bytes renamed into place whole under ``blobs/ff/``, as a write stores one."""
    tmp = _file(tmp_path / "tmp" / name, nbytes)
    path = tmp_path / "blobs" / "ff" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, path)
    return str(path)


def test_files_stored_while_walks_run_are_counted_once(tmp_path):
    for i in range(3000):  # a walk takes a while: files are stored while one runs
        _file(tmp_path / "blobs" / f"{i % 16:02x}" / f"f{i}", 10)
    room = NodeRoom(tmp_path, capacity_bytes=1 << 30, count_interval_s=0, statvfs=_Disk(1 << 30, 1 << 29))
    stop = threading.Event()

    def walk() -> None:
        while not stop.is_set():
            room.used()
    walker = threading.Thread(target=walk)
    walker.start()
    try:
        for i in range(300):
            room.add_file(_stored(tmp_path, f"new{i}", 1000), 1000)
    finally:
        stop.set()
        walker.join()
    room.count_interval_s = 3600
    assert room.used() == folder_bytes(tmp_path, skip=("tmp",)) == 3000 * 10 + 300 * 1000


def test_a_write_file_deleted_comes_off_when_a_walk_counted_it(tmp_path):
    room = NodeRoom(tmp_path, capacity_bytes=1 << 20, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29))
    assert room.used() == 0
    unseen = _stored(tmp_path, "unseen", 700)  # stored after the walk, not counted (no add_file: a write's own)
    assert room.counted_bytes(unseen) == 0 and room.used() == 0
    room.count_interval_s = 0
    assert room.used() == 700  # now a walk counts it
    room.count_interval_s = 3600
    assert room.counted_bytes(unseen) == 700
    added = _stored(tmp_path, "added", 300)
    room.add_file(added, 300)
    assert room.counted_bytes(added) == 300 and room.used() == 1000
    for path in (unseen, added):
        with room.removing() as gone:
            n = room.counted_bytes(path)
            os.unlink(path)
            gone(n)
    assert room.used() == 0 == folder_bytes(tmp_path, skip=("tmp",))


def test_a_node_counts_again_before_it_says_a_file_does_not_fit(tmp_path):
    f = _file(tmp_path / "blobs" / "ab" / "cd" / "f", 6000)
    room = NodeRoom(tmp_path, capacity_bytes=10_000, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29))
    assert room.used() == 6000
    os.unlink(f)  # deleted without counting it off: the figures still count it
    assert room.used() == 6000 and room.usage().free_bytes == 4000
    time.sleep(RECOUNT_SPACING * room.last_walk_s + 0.01)  # recounts are spaced by the walks' duration
    assert room.fits(6000)  # a recount found the room
    assert room.used() == 0
    room.check_keep(10_000)
    g = _file(tmp_path / "blobs" / "ab" / "cd" / "g", 6000)
    room.add_file(g, 6000)
    time.sleep(RECOUNT_SPACING * room.last_walk_s + 0.01)
    with pytest.raises(StorageFull, match="6000 bytes more do not fit in its 4000 free bytes"):
        room.check_keep(6000)  # recounted: it does not fit


def test_a_file_deleted_while_a_walk_ran_is_counted_right_by_a_walk_that_comes_soon(tmp_path):
    f = _file(tmp_path / "blobs" / "ab" / "cd" / "f", 6000)
    room = NodeRoom(tmp_path, capacity_bytes=10_000, count_interval_s=3600, statvfs=_Disk(1 << 30, 1 << 29))
    assert room.used() == 6000
    with room.removing() as gone:
        room.count_interval_s = 0
        assert room.used() == 6000  # a walk during the block, before the file is deleted, counts it ...
        room.count_interval_s = 3600
        os.unlink(f)
        gone(6000)
    time.sleep(RECOUNT_SPACING * room.last_walk_s + 0.01)
    assert room.used() == 0  # ... and the next walk comes as soon as a recount may, not an interval later
