"""The chunk store under the engine: data policies, dedup, integrity on read,
scrub, garbage collection and crash recovery, capacity."""

from __future__ import annotations

import os
import sqlite3
import threading

import numpy as np
import pytest

from gpufeed.engine import Engine
from gpufeed.errors import DamagedObject, InvalidArgument, NoSuchKey, StorageFull
from gpufeed.store import RangeByteRequest
from gpufeed.testing.node import flip_bits

POLICIES = {
    "raw": {},
    "zstd": {"compression": "zstd"},
    "lz4": {"compression": "lz4", "chunk_bytes": 256 << 10},
    "dedup": {"dedup": True, "chunk_bytes": 256 << 10},
    "cdc": {"dedup": True, "chunking": "cdc", "chunk_bytes": 128 << 10, "compression": "zstd"},
    "noverify": {"verify": False},
}


def _text(n: int) -> bytes:
    words = [b"gpufeed", b"tensor", b"chunk", b"the", b"of", b"and", b"storage", b"node"]
    rng = np.random.default_rng(1)
    return b" ".join(words[i] for i in rng.integers(0, len(words), n // 5))[:n]


def _random(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _data_files(root) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(os.path.join(root, "blobs")):
        for n in names:
            out[n] = os.path.getsize(os.path.join(dirpath, n))
    return out


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path, fsync=False)
    yield e
    e.close()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_round_trip_and_ranges(engine, name):
    engine.create_bucket("bkt")
    engine.set_bucket_data("bkt", **POLICIES[name])
    cases = {"text": _text(1_500_007), "random": _random(700_001), "empty": b"", "small": b"x"}
    for key, data in cases.items():
        engine.put_object("bkt", key, data)
    for key, data in cases.items():
        assert engine.get_object("bkt", key) == data
        n = len(data)
        for a, b in [(0, 1), (1, 65537), (65535, 65537), (65536, 131072), (n // 3, 2 * n // 3), (n - 1, n)]:
            if 0 <= a < b <= n:
                assert engine.get_object("bkt", key, RangeByteRequest(a, b)) == data[a:b], (key, a, b)
        buf = bytearray(n + 10)
        info = engine.head_object("bkt", key)
        assert engine.read_into(info, buf, 0) == n and bytes(buf[:n]) == data


def test_compression_shrinks_text_and_skips_random(engine):
    engine.create_bucket("bkt")
    engine.set_bucket_data("bkt", compression="zstd")
    engine.put_object("bkt", "text", _text(4 << 20))
    engine.put_object("bkt", "random", _random(4 << 20))
    stats = engine.data_stats("bkt")
    assert stats["compression"] == "zstd:3"
    assert stats["stored_bytes"] < (4 << 20) + (2 << 20)  # the text shrank by more than half
    assert stats["ratio"] > 1.3
    m = engine._chunks.manifest(engine.head_object("bkt", "random").blob_id)
    assert m.single_file  # random data: no chunk pays, so the object is one raw file (no rewrite)


def test_dedup_stores_identical_chunks_once_per_tenant(engine):
    engine.create_tenant("acme")
    for b, owner in [("one", "default"), ("two", "default"), ("acme-b", "acme")]:
        engine.create_bucket(b, owner=owner)
        engine.set_bucket_data(b, dedup=True, chunk_bytes=1 << 20)
    data = _random(8 << 20)
    engine.put_object("one", "a", data)
    before = engine.node_data_stats()["stored_bytes"]
    engine.put_object("one", "b", data)  # same bucket
    engine.put_object("two", "c", data)  # same tenant, other bucket
    assert engine.node_data_stats()["stored_bytes"] == before
    engine.put_object("acme-b", "d", data)  # another tenant: its own copy
    assert engine.node_data_stats()["stored_bytes"] == 2 * before
    # shifted data: fixed chunks do not match, content-defined ones mostly do
    engine.create_bucket("cdc")
    engine.set_bucket_data("cdc", dedup=True, chunking="cdc", chunk_bytes=256 << 10)
    engine.put_object("cdc", "v1", data)
    s1 = engine.data_stats("cdc")["stored_bytes"]
    engine.put_object("cdc", "v2", b"inserted!" + data)
    grown = engine.data_stats("cdc")["stored_bytes"] - s1
    assert grown < len(data) // 10
    assert engine.get_object("cdc", "v2") == b"inserted!" + data


def test_dedup_frees_chunks_when_the_last_user_goes(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        e.set_bucket_data("bkt", dedup=True, chunk_bytes=1 << 20)
        data = _random(3 << 20)
        e.put_object("bkt", "a", data)
        e.put_object("bkt", "b", data + _random(1 << 20, 1))
        files = _data_files(tmp_path)
        assert len(files) == 4
        e.delete_object("bkt", "a")
        assert _data_files(tmp_path) == files  # still used by b
        assert e.get_object("bkt", "b")[:len(data)] == data
        e.delete_object("bkt", "b")
        assert _data_files(tmp_path) == {}
        assert e.node_data_stats()["stored_bytes"] == 0 == e._chunks.stored_bytes


def test_concurrent_puts_of_the_same_content(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        e.set_bucket_data("bkt", dedup=True, chunk_bytes=256 << 10)
        data = _random(2 << 20)
        errors = []

        def put(i: int) -> None:
            try:
                for j in range(5):
                    e.put_object("bkt", f"k{i}-{j}", data)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=put, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert e.node_data_stats()["stored_bytes"] == len(data)
        for i in range(4):
            for j in range(5):
                e.delete_object("bkt", f"k{i}-{j}")
        assert e.node_data_stats()["chunks"] == 0 and _data_files(tmp_path) == {}



@pytest.mark.parametrize("name", ["raw", "zstd", "dedup"])
@pytest.mark.parametrize("harm", ["flip", "truncate", "delete"])
def test_damage_is_detected_never_served(tmp_path, name, harm):
    e = Engine(tmp_path, fsync=False)
    try:
        e.create_bucket("bkt")
        e.set_bucket_data("bkt", **POLICIES[name])
        data = _text(1 << 20) if name == "zstd" else _random(1 << 20)
        info = e.put_object("bkt", "k", data)
        m = e._chunks.manifest(info.blob_id)
        c = m.chunks[len(m.chunks) // 2]
        path = e._chunks.file_path(c.file)
        if harm == "flip":
            flip_bits(path, c.file_offset + c.stored // 2, 0x10)
        elif harm == "truncate":
            os.truncate(path, c.file_offset + c.stored - 1)
        else:
            os.unlink(path)
        e._files.open_files.close()
        with pytest.raises(DamagedObject) as got:
            e.get_object("bkt", "k")
        assert "bkt/k" in str(got.value) and c.chunk_id in str(got.value)
        assert got.value.chunk == c.chunk_id and got.value.code == "DamagedObject"
        assert e.node_data_stats()["damaged_reads"] >= 1
        rep = e.scrub()
        assert [d["chunk"] for d in rep.damaged] == [c.chunk_id]
        assert rep.damaged[0]["objects"] == [["bkt", "k", "null"]]
        assert [d["chunk"] for d in e.damaged_chunks()] == [c.chunk_id]
    finally:
        e.close()
    with Engine(tmp_path, fsync=False) as e2:  # still reported, still refused, after a restart
        with pytest.raises(DamagedObject):
            e2.get_object("bkt", "k")
        assert e2.node_data_stats()["damaged_chunks"] == 1


def test_good_ranges_of_a_damaged_object_still_read(engine):
    engine.create_bucket("bkt")
    data = _random(1 << 20)
    info = engine.put_object("bkt", "k", data)
    flip_bits(info.path, 700_000, 0x10)
    engine._files.open_files.close()
    assert engine.get_object("bkt", "k", RangeByteRequest(0, 65536)) == data[:65536]
    with pytest.raises(DamagedObject):
        engine.get_object("bkt", "k", RangeByteRequest(699_999, 700_001))


@pytest.mark.parametrize("length", [4096, 3 * 4096, 1_000_000 - 999_424])
def test_whole_block_reads_check_exactly_their_blocks(engine, length):
    """Small reads of whole 4 KiB blocks (or up to the object's unaligned end)."""
    engine.create_bucket("bkt")
    data = _random(1_000_000)
    info = engine.put_object("bkt", "k", data)
    start = 999_424 if length == 1_000_000 - 999_424 else 40 * 4096
    bad = start + length // 2
    flip_bits(info.path, bad, 0x10)
    engine._files.open_files.close()
    with pytest.raises(DamagedObject) as got:
        engine.get_object("bkt", "k", RangeByteRequest(start, start + length))
    assert f"block {bad // 4096} " in str(got.value)
    before = RangeByteRequest(start - 4096, start)
    assert engine.get_object("bkt", "k", before) == data[start - 4096:start]
    flip_bits(info.path, bad, 0x10)  # mended: the same read is served
    assert engine.get_object("bkt", "k", RangeByteRequest(start, start + length)) == data[start:start + length]


def test_scrub_clears_a_repaired_chunk_and_reports_orphans(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        data = _random(200_000)
        info = e.put_object("bkt", "k", data)
        flip_bits(info.path, 10, 0x10)
        e._files.open_files.close()
        assert len(e.scrub().damaged) == 1
        flip_bits(info.path, 10, 0x10)  # repaired by hand
        os.makedirs(tmp_path / "blobs" / "ab" / "cd", exist_ok=True)
        (tmp_path / "blobs" / "ab" / "cd" / ("ab" + "c" * 30)).write_bytes(b"stray")
        rep = e.scrub()
        assert rep.damaged == [] and rep.cleared == [info.blob_id] and rep.complete
        assert rep.orphan_files == ["ab" + "c" * 30]
        assert e.get_object("bkt", "k") == data


def test_crash_before_release_leaves_nothing_after_restart(tmp_path, monkeypatch):
    e = Engine(tmp_path, fsync=False)
    e.create_bucket("bkt")
    e.set_bucket_data("bkt", dedup=True, chunk_bytes=256 << 10)
    e.put_object("bkt", "a", _random(1 << 20))
    e.put_object("bkt", "b", _random(1 << 20, 2))
    monkeypatch.setattr(e._files, "release", lambda ids: None)  # the "crash": data never released
    e.delete_object("bkt", "a")
    e.put_object("bkt", "b", _random(1 << 20, 3))
    e.close()
    with Engine(tmp_path, fsync=False) as e2:
        assert e2.recovered["orphan_manifests"] == 2
        on_disk = sum(_data_files(tmp_path).values())
        assert on_disk == e2.node_data_stats()["stored_bytes"] == 1 << 20
        assert e2.get_object("bkt", "b") == _random(1 << 20, 3)


def test_data_of_an_older_layout_is_adopted(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        data = _random(300_000)
        info = e.put_object("bkt", "k", data)
        e.put_object("bkt", "gone", b"will lose its file")
    # What a gpufeed that kept one plain file per version leaves: no manifests.
    db = sqlite3.connect(tmp_path / "catalog.sqlite3")
    db.executescript("DELETE FROM manifest_chunks; DELETE FROM manifests; DELETE FROM chunks;")
    db.close()
    with sqlite3.connect(tmp_path / "catalog.sqlite3") as db:
        blob = db.execute("SELECT blob_id FROM objects WHERE key='gone'").fetchone()[0]
    os.unlink(tmp_path / "blobs" / blob[:2] / blob[2:4] / blob)
    with Engine(tmp_path, fsync=False) as e2:
        assert e2.recovered["adopted"] == 1 and e2.recovered["missing"] == 1
        assert e2.get_object("bkt", "k") == data
        with pytest.raises(DamagedObject):
            e2.get_object("bkt", "gone")
        flip_bits(info.path, 5, 0x10)
        e2._files.open_files.close()
        with pytest.raises(DamagedObject):  # adopted data is checked too
            e2.get_object("bkt", "k")


def test_capacity_refuses_writes_keeps_reads(tmp_path):
    with Engine(tmp_path, fsync=False, capacity_bytes=1 << 20) as e:
        e.create_bucket("bkt")
        e.put_object("bkt", "a", _random(600_000))
        with pytest.raises(StorageFull):
            e.put_object("bkt", "b", _random(600_000, 1))
        assert os.listdir(tmp_path / "tmp") == []
        assert sum(_data_files(tmp_path).values()) == 600_000
        assert e.get_object("bkt", "a") == _random(600_000)
        with pytest.raises(NoSuchKey):
            e.head_object("bkt", "b")
        e.set_bucket_data("bkt", compression="zstd")  # compressible data still fits
        e.put_object("bkt", "c", _text(2 << 20))
        e.delete_object("bkt", "a")
        e.set_bucket_data("bkt", compression="off")
        e.put_object("bkt", "b", _random(600_000, 1))


@pytest.mark.parametrize("bad", [
    {"compression": "gzip"}, {"level": 0}, {"level": 20}, {"chunking": "rabin"}, {"chunk_bytes": 1000},
    {"chunk_bytes": 1 << 30}, {"chunking": "cdc", "chunk_bytes": 4 << 20, "dedup": True}, {"digest": "md5"},
    {"chunking": "cdc"},
    {"dedup": "yes"}, {"colour": "red"},
])
def test_bad_policies_are_refused(engine, bad):
    engine.create_bucket("bkt")
    with pytest.raises(InvalidArgument):
        engine.set_bucket_data("bkt", **bad)
    assert engine.bucket_data("bkt").compression == "off"


def test_policy_survives_restart_and_bucket_stats_show_it(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        e.set_bucket_data("bkt", compression="lz4", verify=False)
    with Engine(tmp_path, fsync=False) as e:
        p = e.bucket_data("bkt")
        assert p.compression == "lz4" and p.verify is False
        assert e.bucket_stats("bkt")["data"]["verify"] is False


def test_block_sums_computed_while_writing_match_the_file(tmp_path):
    import random

    from gpufeed.engine._blocksums import BlockSummer, block_sums

    data = _random(1_000_003, 9)
    rng = random.Random(4)
    for _ in range(20):
        s, pos = BlockSummer(64 << 10), 0
        while pos < len(data):
            n = rng.choice([1, 7, 4096, 65535, 65536, 65537, 300_000])
            s.feed(memoryview(data)[pos:pos + n])
            pos += n
        assert s.finish() == block_sums(data, 64 << 10)
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        for parts in ([1, 65535, 65537, 200_000], [3 << 20]):
            src = _random(sum(parts), len(parts))
            with e.begin_put("bkt", "k") as pw:
                pos = 0
                for n in parts:  # mixed: buffers, a direct pwrite with and without its data
                    if n == 65537:
                        os.pwrite(pw.fileno(), src[pos:pos + n], pw.size)
                        pw.wrote(n, src[pos:pos + n])
                    else:
                        pw.write(src[pos:pos + n])
                    pos += n
                pw.commit()
            assert pw.block_sums == block_sums(src)
            assert e.get_object("bkt", "k") == src
        with e.begin_put("bkt", "k2") as pw:
            pw.write(b"abc")
            os.pwrite(pw.fileno(), b"def", 3)
            pw.wrote(3)  # bytes the summer never saw: the store reads the file back
            pw.commit()
        assert pw.block_sums is None and e.get_object("bkt", "k2") == b"abcdef"


def test_start_up_reports_missing_data_files(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        info = e.put_object("bkt", "k", _random(100_000))
        e.put_object("bkt", "fine", b"ok")
    os.unlink(info.path)
    with Engine(tmp_path, fsync=False) as e:
        assert e.recovered["missing_files"] == 1
        assert [d["objects"] for d in e.damaged_chunks()] == [[["bkt", "k", "null"]]]
        with pytest.raises(DamagedObject):
            e.get_object("bkt", "k")
        assert e.get_object("bkt", "fine") == b"ok"


def test_a_growing_write_past_capacity_stops_early(tmp_path):
    with Engine(tmp_path, fsync=False, capacity_bytes=4 << 20) as e:
        e.create_bucket("bkt")
        piece = _random(1 << 20)
        with pytest.raises(StorageFull):
            with e.begin_put("bkt", "big") as pw:
                for _ in range(200):  # refused at the first capacity check, long before 200 MiB
                    pw.write(piece)
        assert pw.size <= 64 << 20
        assert os.listdir(tmp_path / "tmp") == []
        e.put_object("bkt", "small", piece)  # room is still there for what fits


@pytest.mark.parametrize("harm", ["delete", "truncate", "flip"])
def test_a_write_of_the_same_data_repairs_a_damaged_shared_chunk(tmp_path, harm):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        e.set_bucket_data("bkt", dedup=True, chunk_bytes=256 << 10)
        data = _random(1 << 20, 11)
        info = e.put_object("bkt", "a", data)
        c = e._chunks.manifest(info.blob_id).chunks[2]
        path = e._chunks.file_path(c.file)
        if harm == "delete":
            os.unlink(path)
        elif harm == "truncate":
            os.truncate(path, 10)
        else:
            flip_bits(path, 100, 0x10)
        e._files.open_files.close()
        with pytest.raises(DamagedObject):
            e.get_object("bkt", "a")  # marks the chunk
        e.put_object("bkt", "b", data)  # the same bytes: stored afresh for the damaged chunk
        assert e.get_object("bkt", "b") == data
        assert e.get_object("bkt", "a") == data  # the shared chunk was repaired for both
        assert e.damaged_chunks() == []
        e.delete_object("bkt", "a")
        e.delete_object("bkt", "b")
        assert _data_files(tmp_path) == {} and e._chunks.stored_bytes == 0


def test_dedup_write_past_capacity_is_storage_full(tmp_path):
    with Engine(tmp_path, fsync=False, capacity_bytes=2 << 20) as e:
        e.create_bucket("bkt")
        e.set_bucket_data("bkt", dedup=True, chunk_bytes=256 << 10)
        e.put_object("bkt", "a", _random(1 << 20, 1))
        with pytest.raises(StorageFull):
            e.put_object("bkt", "b", _random(3 << 20, 2))
        assert os.listdir(tmp_path / "tmp") == []
        assert sum(_data_files(tmp_path).values()) == 1 << 20 == e._chunks.stored_bytes


def test_freeing_damaged_data_keeps_the_accounting_exact(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        info = e.put_object("bkt", "k", _random(500_000))
        os.truncate(info.path, 1000)  # the file now holds less than the catalog says
        e.delete_object("bkt", "k")
        assert e._chunks.stored_bytes == 0 == e.node_data_stats()["stored_bytes"]


def test_parts_of_uploads_in_progress_count_against_capacity(tmp_path):
    with Engine(tmp_path, fsync=False, capacity_bytes=3 << 20) as e:
        e.create_bucket("bkt")
        up = e.create_multipart_upload("bkt", "big")
        for n in (1, 2):
            e.upload_part("bkt", "big", up.upload_id, n, _random(1 << 20, n))
        with pytest.raises(StorageFull):
            e.upload_part("bkt", "big", up.upload_id, 3, _random(1536 << 10, 3))
        with pytest.raises(StorageFull):
            e.put_object("bkt", "other", _random(1536 << 10, 4))
        assert os.listdir(tmp_path / "tmp") == []
        e.abort_multipart_upload("bkt", "big", up.upload_id)
        e.put_object("bkt", "other", _random(1536 << 10, 4))  # room again


def test_cdc_gets_its_own_default_chunk_size(engine):
    engine.create_bucket("bkt")
    p = engine.set_bucket_data("bkt", dedup=True, chunking="cdc")
    assert p.chunk_bytes == 256 << 10


@pytest.mark.parametrize("name", ["raw", "zstd", "dedup"])
def test_reads_at_every_block_edge(engine, name):
    engine.create_bucket("bkt")
    engine.set_bucket_data("bkt", **POLICIES[name])
    data = _text(300_001) if name == "zstd" else _random(300_001, 5)
    engine.put_object("bkt", "k", data)
    n = len(data)
    for a, b in [(0, 4096), (1, 5), (100, 4000), (4095, 4097), (4096, 8192), (4095, 12289), (8191, 70000),
                 (n - 4097, n), (n - 1, n), (0, n)]:
        assert engine.get_object("bkt", "k", RangeByteRequest(a, b)) == data[a:b], (a, b)


def _to_legacy_sums(tmp_path, e) -> None:
    """Rewrite every chunk's sums in the legacy format (xxh3-64 per 64 KiB, kind 0)."""
    import xxhash

    db = sqlite3.connect(tmp_path / "catalog.sqlite3")
    with db:
        for cid, file, off, stored in db.execute("SELECT chunk_id, file, file_offset, stored FROM chunks").fetchall():
            with open(e._chunks.file_path(file), "rb") as f:
                f.seek(off)
                raw = f.read(stored)
            sums = b"".join(xxhash.xxh3_64_intdigest(raw[i:i + 65536]).to_bytes(8, "little")
                            for i in range(0, len(raw), 65536))
            db.execute("UPDATE chunks SET sums=?, sum_kind=0 WHERE chunk_id=?", (sums, cid))
    db.close()


def test_chunks_with_legacy_sums_are_read_and_checked(tmp_path):
    raw, text = _random(1_000_003, 3), _text(900_001)
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        e.create_bucket("zbkt")
        e.set_bucket_data("zbkt", compression="zstd", chunk_bytes=256 << 10)
        e.put_object("bkt", "k", raw)
        e.put_object("zbkt", "k", text)
        _to_legacy_sums(tmp_path, e)
    with Engine(tmp_path, fsync=False) as e:
        for bucket, data in (("bkt", raw), ("zbkt", text)):
            assert e.get_object(bucket, "k") == data
            for a, b in [(1, 5), (65535, 65537), (70000, 300000), (len(data) - 3, len(data))]:
                assert e.get_object(bucket, "k", RangeByteRequest(a, b)) == data[a:b]
        c = e._chunks.manifest(e.head_object("bkt", "k").blob_id).chunks[0]
        assert c.sum_kind == 0
        with open(e._chunks.file_path(c.file), "r+b") as f:
            f.seek(200_000)
            f.write(bytes([raw[200_000] ^ 1]))
        assert e.get_object("bkt", "k", RangeByteRequest(0, 131072)) == raw[:131072]  # blocks 0-1 are good
        with pytest.raises(DamagedObject):
            e.get_object("bkt", "k", RangeByteRequest(199_000, 199_100))  # block 3 is not
        assert [d["chunk"] for d in e.scrub().damaged] == [c.chunk_id]
