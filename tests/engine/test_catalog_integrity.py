"""The catalog's integrity check on open and its recovery (``gpufeed.engine._catalogcheck``,
``gpufeed.engine._salvage``), on real catalogs damaged the ways disks and people damage
them: a page of garbage in a table or an index b-tree, a truncated file, an overwritten
header, a file that is not a database, a catalog deleted beside its data.

Source of the page layout used to aim the damage: https://www.sqlite.org/fileformat2.html
(pages are ``page_size`` bytes, page 1 first; ``dbstat`` names each page's b-tree).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpufeed.config import NodeConfig
from gpufeed.engine import Engine, check_catalog, check_data_dir, recover_catalog
from gpufeed.errors import CatalogDamaged, CatalogTooNew, DataFolderInUse, GpufeedError, InternalError

PLAIN, VERSIONED = "plain", "versioned"
N_PLAIN, N_VERSIONED = 2000, 600


def body(bucket: str, key: str, n: int = 0) -> bytes:
    return f"{bucket}/{key}/{n}".encode() * 3


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A data folder of N_PLAIN objects and N_VERSIONED keys with two versions each."""
    d = tmp_path_factory.mktemp("template") / "data"
    with Engine(d, fsync=False) as e:
        e.create_bucket(PLAIN)
        for i in range(N_PLAIN):
            e.put_object(PLAIN, f"k/{i:06d}", body(PLAIN, f"k/{i:06d}"))
        e.create_bucket(VERSIONED)
        e.put_bucket_versioning(VERSIONED, "Enabled")
        for n in range(2):
            for i in range(N_VERSIONED):
                e.put_object(VERSIONED, f"v/{i:06d}", body(VERSIONED, f"v/{i:06d}", n))
    return d


@pytest.fixture
def data(template, tmp_path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(template, d)
    return d


def catalog(d: Path) -> Path:
    return d / "catalog.sqlite3"


def digest(d: Path) -> dict[str, str]:
    """Hashes of the catalog's files (main, -wal), to show nothing wrote them. An
    empty WAL counts as none: a read-only connection may create one (and the -shm
    index, left out here), which holds nothing."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.glob("catalog.sqlite3*"))
            if not p.name.endswith("-shm") and (p.stat().st_size or not p.name.endswith("-wal"))}


def pages(d: Path, btree: str, pagetype: str = "leaf") -> list[int]:
    """Page numbers of one b-tree's pages of a type, in key order."""
    db = sqlite3.connect(f"file:{catalog(d)}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT pageno FROM dbstat WHERE name=? AND pagetype=? ORDER BY path",
                          (btree, pagetype)).fetchall()
    finally:
        db.close()
    return [r[0] for r in rows]


def garble(d: Path, page: int, page_size: int = 4096) -> None:
    """Write a page of garbage over ``page``: seeded random bytes whose first byte is
    no b-tree page type (so no test depends on random bytes happening to parse)."""
    junk = bytearray(random.Random(page).randbytes(page_size))
    junk[0] = 0x77
    with open(catalog(d), "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(junk)


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def assert_refused(d: Path) -> CatalogDamaged:
    before = digest(d)
    with pytest.raises(CatalogDamaged) as info:
        Engine(d, fsync=False)
    msg = str(info.value)
    assert "damaged" in msg or "missing" in msg
    assert f"gpufeed catalog recover --data-dir {d.resolve()}" in msg
    assert "\n" not in msg
    assert digest(d) == before, "opening a damaged catalog changed it"
    return info.value


def keys_of(e: Engine, bucket: str) -> set[str]:
    out: set[str] = set()
    token = None
    while True:
        page = e.list_objects(bucket, continuation_token=token)
        out.update(o.key for o in page.objects)
        if not page.is_truncated:
            return out
        token = page.next_token


def assert_serves(d: Path, plain: set[str], versioned: int | None = None) -> None:
    """The engine opens the recovered folder and every saved object reads back whole."""
    with Engine(d, fsync=False) as e:
        keys = keys_of(e, PLAIN) if plain else set()
        assert keys == plain
        for k in sorted(keys)[:: max(len(keys) // 50, 1)]:
            assert e.get_object(PLAIN, k) == body(PLAIN, k)
        if versioned is not None:
            vkeys = keys_of(e, VERSIONED)
            assert len(vkeys) == versioned


ALL_PLAIN = {f"k/{i:06d}" for i in range(N_PLAIN)}


def test_a_clean_catalog_passes_every_level_and_recover_leaves_it(data):
    for level in ("quick", "full", "off"):
        report = check_catalog(str(catalog(data)), level)
        assert report.ok and report.problems == () and report.schema_version is not None
    before = digest(data)
    r = recover_catalog(data)
    assert not r.recovered and r.before.ok
    assert digest(data) == before
    assert not (data / "lost+found").exists()
    assert_serves(data, ALL_PLAIN, N_VERSIONED)


def test_the_check_never_writes_even_beside_a_live_wal(data):
    with Engine(data, fsync=False) as e:
        e.put_object(PLAIN, "late", b"in the WAL only")  # not checkpointed while the engine is open
        assert (data / "catalog.sqlite3-wal").stat().st_size > 0
        before = digest(data)
        assert check_catalog(str(catalog(data)), "full").ok
        garble_copy = data.parent / "copy"
        shutil.copytree(data, garble_copy, ignore=shutil.ignore_patterns("lock"))
        assert digest(data) == before
    garble(garble_copy, pages(garble_copy, "objects")[5])
    before = digest(garble_copy)
    assert not check_catalog(str(catalog(garble_copy)), "quick").ok
    assert digest(garble_copy) == before


def test_garbage_in_an_index_btree_is_refused_and_recovered_whole(data):
    garble(data, pages(data, "versions_by_id")[len(pages(data, "versions_by_id")) // 2])
    assert_refused(data)
    assert not check_data_dir(data).ok
    r = recover_catalog(data)
    assert r.recovered and r.after is not None and r.after.ok
    by_table = {t.table: t for t in r.tables}
    assert by_table["objects"].rows == N_PLAIN + N_VERSIONED and not by_table["objects"].damaged
    assert by_table["versions"].rows == N_VERSIONED and not by_table["versions"].damaged
    assert r.lost_found is None and r.missing_files == 0
    assert_serves(data, ALL_PLAIN, N_VERSIONED)


def test_garbage_in_a_table_leaf_loses_that_page_only_and_keeps_its_files(data):
    leaf = pages(data, "objects")
    db = sqlite3.connect(f"file:{catalog(data)}?mode=ro", uri=True)
    per_page = db.execute("SELECT ncell FROM dbstat WHERE pageno=?", (leaf[len(leaf) // 2],)).fetchone()[0]
    db.close()
    garble(data, leaf[len(leaf) // 2])
    err = assert_refused(data)
    assert err.details["problems"]
    kept_bytes = catalog(data).read_bytes()

    r = recover_catalog(data)
    objects = next(t for t in r.tables if t.table == "objects")
    assert objects.damaged and objects.rows == N_PLAIN + N_VERSIONED - per_page
    assert r.moved["blobs"] == per_page and r.lost_found is not None
    assert len(files_under(Path(r.lost_found))) == per_page
    assert Path(r.kept[0]).read_bytes() == kept_bytes  # the damaged file, kept byte for byte
    assert r.after is not None and r.after.ok
    with Engine(data, fsync=False) as e:
        assert e.recovered["blobs"] == 0  # the start-up sweep found nothing left to delete
        saved = keys_of(e, PLAIN)
    assert len(saved) >= N_PLAIN - per_page
    assert_serves(data, saved)


def test_two_damaged_leaves_of_an_indexed_table_lose_only_their_rows(data):
    leaf = pages(data, "versions")
    db = sqlite3.connect(f"file:{catalog(data)}?mode=ro", uri=True)
    hit = [leaf[len(leaf) // 3], leaf[2 * len(leaf) // 3]]
    cells = sum(db.execute("SELECT ncell FROM dbstat WHERE pageno=?", (p,)).fetchone()[0] for p in hit)
    db.close()
    for p in hit:
        garble(data, p)
    assert_refused(data)
    r = recover_catalog(data)
    versions = next(t for t in r.tables if t.table == "versions")
    assert versions.known == N_VERSIONED and versions.lost == cells
    assert versions.rows == N_VERSIONED - cells
    assert r.moved["blobs"] == cells
    assert_serves(data, ALL_PLAIN, N_VERSIONED)


def cells_under(d: Path, pageno: int) -> int:
    """Rows on a page and every page below it (a WITHOUT ROWID table keeps rows in interior pages too)."""
    db = sqlite3.connect(f"file:{catalog(d)}?mode=ro", uri=True)
    try:
        name, path = db.execute("SELECT name, path FROM dbstat WHERE pageno=?", (pageno,)).fetchone()
        return db.execute("SELECT SUM(ncell) FROM dbstat WHERE name=? AND path LIKE ? AND pagetype != 'overflow'",
                          (name, path + "%")).fetchone()[0]
    finally:
        db.close()


def test_rows_between_damaged_leaves_of_a_table_without_index_are_found(data):
    """``manifests`` has no secondary index: the rows between its damaged pages are
    reached by reading from keys halfway between. The versions whose manifest was
    lost get a one-file manifest at the next start (raw data stored whole), so
    every object still reads back."""
    leaf = pages(data, "manifests")
    hit = [leaf[len(leaf) // 4], leaf[len(leaf) // 2], leaf[3 * len(leaf) // 4]]
    lost = sum(cells_under(data, p) for p in hit)
    for p in hit:
        garble(data, p)
    r = recover_catalog(data)
    manifests = next(t for t in r.tables if t.table == "manifests")
    assert manifests.known is None  # no secondary index to count by
    assert manifests.rows == N_PLAIN + 2 * N_VERSIONED - lost
    assert r.lost_found is None and r.missing_files == 0
    with Engine(data, fsync=False) as e:
        assert e.recovered["adopted"] == lost
    assert_serves(data, ALL_PLAIN, N_VERSIONED)


def test_a_damaged_interior_page_loses_the_rows_beneath_it_and_keeps_their_files(data):
    inner = [p for p in pages(data, "objects", "internal") if p != pages(data, "objects", "internal")[0]]
    if not inner:
        pytest.skip("the objects b-tree has no interior page below its root")
    lost = cells_under(data, inner[len(inner) // 2])
    garble(data, inner[len(inner) // 2])
    assert_refused(data)
    r = recover_catalog(data)
    objects = next(t for t in r.tables if t.table == "objects")
    assert objects.damaged and objects.rows == N_PLAIN + N_VERSIONED - lost
    assert r.moved["blobs"] == lost and r.after is not None and r.after.ok


def test_an_overwritten_header_is_rebuilt_and_nothing_is_lost(data):
    with open(catalog(data), "r+b") as f:
        f.write(bytes(100))
    assert_refused(data)
    r = recover_catalog(data)
    assert r.header_rebuilt
    assert {t.table: t.rows for t in r.tables}["objects"] == N_PLAIN + N_VERSIONED
    assert r.lost_found is None
    assert_serves(data, ALL_PLAIN, N_VERSIONED)


def test_a_truncated_catalog_is_refused_and_recovers_what_precedes_the_cut(data):
    size = catalog(data).stat().st_size
    os.truncate(catalog(data), size * 2 // 3)
    assert_refused(data)
    r = recover_catalog(data)
    assert r.after is not None and r.after.ok
    with Engine(data, fsync=False) as e:
        saved = keys_of(e, PLAIN) if e.list_buckets() else set()
    lost_found = files_under(Path(r.lost_found)) if r.lost_found else []
    assert len(saved) + len(lost_found) >= N_PLAIN  # every plain object: served, or its file kept
    assert_serves(data, saved)


@pytest.mark.parametrize("content", [b"", b"hello, this is not a database\n" * 200, os.urandom(8192)],
                         ids=["empty", "text", "random"])
def test_a_file_that_is_not_a_database_is_refused_and_every_data_file_kept(data, content):
    catalog(data).write_bytes(content)
    for p in data.glob("catalog.sqlite3-*"):
        p.unlink()
    assert_refused(data)
    r = recover_catalog(data)
    assert r.recovered and sum(t.rows for t in r.tables) == 0
    assert r.moved["blobs"] == N_PLAIN + 2 * N_VERSIONED
    assert len(files_under(Path(r.lost_found))) == N_PLAIN + 2 * N_VERSIONED
    if content:
        assert any(Path(k).read_bytes() == content for k in r.kept)
    with Engine(data, fsync=False) as e:
        assert e.list_buckets() == []


def test_a_deleted_catalog_beside_data_is_refused_not_swept(data):
    for p in data.glob("catalog.sqlite3*"):
        p.unlink()
    err = assert_refused(data)
    assert "missing" in str(err)
    assert len(files_under(data / "blobs")) == N_PLAIN + 2 * N_VERSIONED
    assert not check_data_dir(data).ok


def test_buckets_whose_rows_were_lost_are_recreated_for_their_objects(data):
    garble(data, pages(data, "buckets")[0])
    assert_refused(data)
    r = recover_catalog(data)
    assert set(r.buckets_recreated) == {PLAIN, VERSIONED}
    assert_serves(data, ALL_PLAIN, N_VERSIONED)


def test_usage_is_rebuilt_from_the_saved_rows(data):
    first = recover_catalog(data, force=True)
    r = recover_catalog(data, force=True)  # twice within a second: each keeps its own file
    assert first.kept[0] != r.kept[0] and all(Path(k).exists() for k in first.kept + r.kept)
    assert r.recovered and r.after is not None and r.after.ok
    db = sqlite3.connect(catalog(data))
    rows = dict(db.execute("SELECT bucket, objects FROM usage").fetchall())
    db.close()
    assert rows[PLAIN] == N_PLAIN and rows[VERSIONED] == 2 * N_VERSIONED
    db = sqlite3.connect(catalog(data))
    stored = db.execute("SELECT bucket, stored, chunks FROM chunk_usage ORDER BY bucket").fetchall()
    want = db.execute("SELECT bucket, SUM(stored), COUNT(*) FROM chunks GROUP BY bucket ORDER BY bucket").fetchall()
    db.close()
    assert stored == want and dict((b, n) for b, _, n in stored)[PLAIN] == N_PLAIN


def test_recover_refuses_a_folder_in_use_and_a_newer_catalog(data):
    with Engine(data, fsync=False):
        with pytest.raises(DataFolderInUse):
            recover_catalog(data)
    db = sqlite3.connect(catalog(data))
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(CatalogTooNew, match="newer than this gpufeed"):
        Engine(data, fsync=False)
    with pytest.raises(CatalogTooNew):
        recover_catalog(data)
    assert issubclass(CatalogTooNew, InternalError) and issubclass(CatalogDamaged, InternalError)


def test_level_off_skips_the_page_walk_and_full_checks_indexes(data):
    garble(data, pages(data, "objects")[3])
    assert check_catalog(str(catalog(data)), "off").ok
    assert not check_catalog(str(catalog(data)), "full").ok
    with pytest.raises(ValueError):
        check_catalog(str(catalog(data)), "thorough")


def test_the_level_is_a_node_setting(monkeypatch):
    assert NodeConfig().catalog_check == "quick"
    monkeypatch.setenv("GPUFEED_CATALOG_CHECK", "full")
    assert NodeConfig.from_env().catalog_check == "full"
    monkeypatch.setenv("GPUFEED_CATALOG_CHECK", "sometimes")
    with pytest.raises(ValueError, match="GPUFEED_CATALOG_CHECK"):
        NodeConfig.from_env()


@pytest.mark.parametrize("btree", ["chunks", "manifest_chunks"])
def test_lost_chunk_rows_never_serve_wrong_bytes(tmp_path, btree):
    """Objects of a compressed bucket are several chunks each: a version whose chunk
    list was not saved whole reads as damaged after recovery (never with chunks
    missing), its data files go to lost+found; whole raw objects read back."""
    d = tmp_path / "data"
    packed = {f"p/{i:04d}": (f"packed object {i} ".encode() * 20_000)[:300_000] for i in range(40)}
    with Engine(d, fsync=False) as e:
        e.create_bucket(PLAIN)
        for i in range(300):
            e.put_object(PLAIN, f"k/{i:06d}", body(PLAIN, f"k/{i:06d}"))
        e.create_bucket("packed")
        e.set_bucket_data("packed", compression="zstd", chunk_bytes=64 << 10)
        for k, v in packed.items():
            e.put_object("packed", k, v)
    leaf = pages(d, btree)
    garble(d, leaf[len(leaf) // 2])
    assert_refused(d)
    r = recover_catalog(d)
    assert r.after is not None and r.after.ok
    assert r.fixes.get("manifests whose chunk list was not saved whole", 0) > 0
    with Engine(d, fsync=False) as e:
        damaged = 0
        for k, v in packed.items():
            try:
                got = e.get_object("packed", k)
            except GpufeedError:
                damaged += 1
                continue
            assert got == v, f"{k}: wrong bytes served after recovery"
        assert 0 < damaged < len(packed)
        for i in range(300):
            assert e.get_object(PLAIN, f"k/{i:06d}") == body(PLAIN, f"k/{i:06d}")
