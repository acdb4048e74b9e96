"""The receiving side of part files on the nodes of a cluster
(:mod:`gpufeed.engine._partcopies`), on a real engine: a copy is stored only
whole and with the part's MD5, sent back as stored, deleted only when no row
names it, and files no row names are swept once old; with a cluster node's
room, parts and copies are admitted by it and their bytes counted while kept."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from gpufeed.engine import Engine
from gpufeed.engine._room import NodeRoom
from gpufeed.errors import BadDigest, InvalidArgument, NoSuchKey, NoSuchUpload, StorageFull

B, K = "bkt", "key"


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path / "data", fsync=False)
    e.create_bucket(B)
    yield e
    e.close()


def _name(n: int = 1) -> str:
    return f"{n:05d}." + os.urandom(16).hex()


def _pieces(data: bytes, step: int = 1000) -> list[memoryview]:
    return [memoryview(data)[i:i + step] for i in range(0, len(data), step)]


def test_a_copy_is_kept_only_whole_and_with_its_md5(engine):
    up = engine.create_multipart_upload(B, K).upload_id
    data = os.urandom(5000)
    md5 = hashlib.md5(data).hexdigest()
    name = _name()
    with pytest.raises(BadDigest):
        engine.receive_part(B, K, up, name, hashlib.md5(b"other").hexdigest(), len(data), _pieces(data))
    with pytest.raises(NoSuchKey):  # nothing of it was kept
        with engine.held_part(B, K, up, name):
            pass
    assert engine.receive_part(B, K, up, name, md5, len(data), _pieces(data)) is True
    assert engine.receive_part(B, K, up, name, md5, len(data), _pieces(data)) is False  # here already
    with engine.held_part(B, K, up, name) as (fd, size):
        assert size == len(data) and os.pread(fd, size, 0) == data
    for bad in ("../../catalog.sqlite3", "1." + "0" * 32, ""):
        with pytest.raises(InvalidArgument):
            engine.receive_part(B, K, up, bad, md5, len(data), _pieces(data))
    with pytest.raises(NoSuchUpload):
        engine.receive_part(B, K, "0" * 32, name, md5, len(data), _pieces(data))


def test_drops_spare_named_parts_and_open_uploads(engine):
    up = engine.create_multipart_upload(B, K).upload_id
    part = engine.upload_part(B, K, up, 1, b"named part")
    named = os.listdir(engine.data_dir / "uploads" / up)[0]
    stray = _name(2)
    engine.receive_part(B, K, up, stray, hashlib.md5(b"x").hexdigest(), 1, [memoryview(b"x")])
    assert engine.drop_part_files(B, K, up, [named, stray]) == 1  # the named one stays
    assert os.listdir(engine.data_dir / "uploads" / up) == [named]
    with pytest.raises(InvalidArgument, match="still open"):
        engine.drop_part_files(B, K, up, [])
    engine.complete_multipart_upload(B, K, up, [(1, part.etag)])
    assert engine.drop_part_files(B, K, up, []) == 0  # the completion removed the folder already


def test_the_sweep_frees_old_unnamed_part_files_and_empty_folders(engine):
    up = engine.create_multipart_upload(B, K).upload_id
    engine.upload_part(B, K, up, 1, b"named part")
    folder = engine.data_dir / "uploads" / up
    [named] = os.listdir(folder)
    stray = _name(3)
    engine.receive_part(B, K, up, stray, hashlib.md5(b"x").hexdigest(), 1, [memoryview(b"x")])
    ended = engine.data_dir / "uploads" / ("e" * 32)
    ended.mkdir()
    assert engine.free_unnamed_parts(3600) == 0  # young: a part may be on its way to its row
    old = time.time() - 7200
    for path in (folder / stray, folder / named, folder, ended):
        os.utime(path, (old, old))
    assert engine.free_unnamed_parts(3600) == 2  # the stray file and the empty folder
    assert os.listdir(folder) == [named] and not ended.exists()


def test_held_files_and_the_open_uploads_with_parts_here(engine):
    assert engine.open_parts_here() == []  # no upload folder: no catalog query needed
    up = engine.create_multipart_upload(B, K).upload_id
    assert engine.open_parts_here() == []  # a folder without parts
    engine.upload_part(B, K, up, 1, b"first")
    engine.upload_part(B, K, up, 2, b"second")
    stray = _name(3)
    engine.receive_part(B, K, up, stray, hashlib.md5(b"x").hexdigest(), 1, [memoryview(b"x")])
    named = sorted(n for n in os.listdir(engine.data_dir / "uploads" / up) if n != stray)
    os.unlink(engine.part_file_path(up, named[1]))  # part 2's file is on other nodes only
    [(info, recs)] = engine.open_parts_here()
    assert (info.bucket, info.key, info.upload_id) == (B, K, up)
    assert [(r.info.part_number, r.file) for r in recs] == [(1, named[0])]  # the stray file is no part
    assert engine.held_part_files(up, [named[0], named[1], stray]) == [named[0], stray]
    with pytest.raises(InvalidArgument):
        engine.held_part_files(up, ["../node.id"])
    ended = engine.create_multipart_upload(B, "other").upload_id
    engine.upload_part(B, "other", ended, 1, b"gone")
    engine.abort_multipart_upload(B, "other", ended)
    assert [u.upload_id for u, _ in engine.open_parts_here()] == [up]


def test_a_copy_racing_the_end_of_its_upload_is_swept(engine):
    up = engine.create_multipart_upload(B, K).upload_id
    data = os.urandom(3000)
    name = _name(1)

    def pieces_then_abort():  # the upload is aborted while the copy's bytes arrive
        yield from _pieces(data)[:1]
        engine.abort_multipart_upload(B, K, up)
        yield from _pieces(data)[1:]

    assert engine.receive_part(B, K, up, name, hashlib.md5(data).hexdigest(), len(data), pieces_then_abort())
    folder = engine.data_dir / "uploads" / up
    assert os.listdir(folder) == [name]  # it landed after the abort's deletes
    assert engine.open_parts_here() == []  # never copied again: its upload is not open
    with pytest.raises(NoSuchUpload):  # and no node takes a copy of it now
        engine.receive_part(B, K, up, _name(2), hashlib.md5(data).hexdigest(), len(data), _pieces(data))
    old = time.time() - 7200
    os.utime(folder / name, (old, old))
    os.utime(folder, (old, old))
    assert engine.free_unnamed_parts(3600) == 2  # the orphan sweep takes the file and the folder
    assert not folder.exists()


def test_parts_and_part_copies_are_admitted_by_the_nodes_room(tmp_path):
    e = Engine(tmp_path / "data", fsync=False)
    try:
        e.create_bucket(B)
        room = NodeRoom(e.data_dir, count_interval_s=3600)
        cap = room.used() + 300_000
        room = NodeRoom(e.data_dir, capacity_bytes=cap, count_interval_s=3600)
        e.use_room(room)
        base = room.used()
        up = e.create_multipart_upload(B, K).upload_id
        e.upload_part(B, K, up, 1, os.urandom(200_000))
        assert room.used() == base + 200_000
        with pytest.raises(StorageFull, match="this node is full"):
            e.upload_part(B, K, up, 2, os.urandom(200_000))
        assert len(os.listdir(e.data_dir / "uploads" / up)) == 1 and not os.listdir(e.data_dir / "tmp")
        read = []

        def pieces(data: bytes):
            for piece in _pieces(data, 50_000):
                read.append(len(piece))
                yield piece
        big = os.urandom(200_000)
        with pytest.raises(StorageFull):  # refused, its bytes read to the end, nothing kept
            e.receive_part(B, K, up, _name(3), hashlib.md5(big).hexdigest(), len(big), pieces(big))
        assert sum(read) == len(big) and len(os.listdir(e.data_dir / "uploads" / up)) == 1
        base = room.used() - 200_000  # the refusals counted the folder again: its SQLite catalog has grown
        small = os.urandom(50_000)
        assert e.receive_part(B, K, up, _name(4), hashlib.md5(small).hexdigest(), len(small), _pieces(small))
        assert room.used() == base + 250_000
        assert room.usage().free_bytes == cap - base - 250_000
        e.abort_multipart_upload(B, K, up)  # its part files' bytes stop counting
        assert room.used() == base
        up = e.create_multipart_upload(B, K).upload_id
        e.upload_part(B, K, up, 1, os.urandom(120_000))
        e.upload_part(B, K, up, 1, os.urandom(60_000))  # the part it replaces goes
        assert room.used() == base + 60_000
        done = e.complete_multipart_upload(B, K, up, [(1, e.list_parts(B, K, up)[0].etag)])
        # the part's bytes stop counting (a cluster's push counts the object's data file; none here)
        assert done.size == 60_000 and room.used() == base
    finally:
        e.close()
