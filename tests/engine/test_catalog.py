"""The SQLite catalog passes the shared catalog conformance suite (``CatalogTests``)."""

from __future__ import annotations

import sqlite3

import pytest

from gpufeed.engine import Catalog, SqliteCatalog
from gpufeed.engine._sqlite import SCHEMA_VERSION
from gpufeed.engine.types import BucketInfo, LifecycleRule, ObjectInfo, SnapshotInfo
from gpufeed.errors import InternalError
from gpufeed.testing.catalog import CatalogTests


class TestSqliteCatalog(CatalogTests):
    @pytest.fixture
    def catalog(self, tmp_path):
        c = SqliteCatalog(str(tmp_path / "catalog.sqlite3"), fsync=False, blob_path=self.blob_path)
        yield c
        c.close()


def test_sqlite_catalog_keeps_commits_across_reopen(tmp_path):
    path = str(tmp_path / "catalog.sqlite3")
    c = SqliteCatalog(path, fsync=True)
    with c.write() as w:
        w.insert_bucket(BucketInfo("bkt", 1.0, "kv", 10, 0.0))
        w.put_object(ObjectInfo("bkt", "k", 3, "e", 5.0, blob_id="b1"))
    c.close()
    c = SqliteCatalog(path, fsync=False)
    try:
        assert isinstance(c, Catalog)
        assert c.bucket("bkt") == BucketInfo("bkt", 1.0, "kv", 10, 0.0)
        assert c.object("bkt", "k").path == ""  # no blob_path given
        assert c.live_files().blobs == {"b1"}
    finally:
        c.close()


# A catalog as the first release wrote it (schema version 1, before lifecycle rules).
_VERSION_1 = """
CREATE TABLE buckets (name TEXT PRIMARY KEY, created REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE objects (bucket TEXT NOT NULL, key TEXT NOT NULL, size INTEGER NOT NULL, etag TEXT NOT NULL,
    last_modified REAL NOT NULL, content_type TEXT NOT NULL, metadata TEXT NOT NULL, checksums TEXT NOT NULL,
    blob_id TEXT NOT NULL, PRIMARY KEY (bucket, key)) WITHOUT ROWID;
CREATE TABLE uploads (upload_id TEXT PRIMARY KEY, bucket TEXT NOT NULL, key TEXT NOT NULL,
    initiated REAL NOT NULL, content_type TEXT NOT NULL, metadata TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE parts (upload_id TEXT NOT NULL, part_number INTEGER NOT NULL, etag TEXT NOT NULL,
    size INTEGER NOT NULL, last_modified REAL NOT NULL, file TEXT NOT NULL,
    PRIMARY KEY (upload_id, part_number)) WITHOUT ROWID;
INSERT INTO buckets VALUES ('old', 7.0);
INSERT INTO objects VALUES ('old', 'k', 3, 'e', 5.0, 'text/plain', '', '', 'b1');
PRAGMA user_version=1;
"""


def test_version_1_catalog_is_migrated(tmp_path):
    path = str(tmp_path / "catalog.sqlite3")
    with sqlite3.connect(path) as db:
        db.executescript(_VERSION_1)
    db.close()
    c = SqliteCatalog(path, fsync=False)
    try:
        assert c.bucket("old") == BucketInfo("old", 7.0)
        assert c.object("old", "k").content_type == "text/plain"
        assert c.lifecycle("old") is None
        with c.write() as w:
            w.set_lifecycle("old", [LifecycleRule("r", expiration_days=3)])
        assert c.lifecycle("old") == [LifecycleRule("r", expiration_days=3)]
        assert c.completed_upload("a" * 32) is None and c.completion_of("b1") is None  # version 3
        assert c.bucket_config("old", "cors") is None  # version 4
        assert c.bucket_snapshots("old") == []  # version 6
        with c.write() as w:
            assert w.insert_snapshot(SnapshotInfo("old", "s", 9.0)).objects == 1
        assert c.snapshot_object("old", "s", "k").blob_id == "b1"
        assert c.live_files().blobs == {"b1"}
    finally:
        c.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    db.close()


def test_newer_catalog_is_refused(tmp_path):
    path = str(tmp_path / "catalog.sqlite3")
    SqliteCatalog(path, fsync=False).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(InternalError, match="newer than this gpufeed"):
        SqliteCatalog(path, fsync=False)


def test_object_answers_follow_every_commit(tmp_path):
    """The per-thread answer cache of SqliteCatalog.object never serves a row older
    than the last commit: by this node's writer, or by another connection."""
    import threading

    from gpufeed.engine import Engine
    from gpufeed.errors import NoSuchKey

    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket("bkt")
        e.put_object("bkt", "k", b"one")
        assert e.head_object("bkt", "k").size == 3
        assert e.head_object("bkt", "k").size == 3  # a repeat, from the cache
        e.put_object("bkt", "k", b"three")
        assert e.head_object("bkt", "k").size == 5
        db = sqlite3.connect(tmp_path / "catalog.sqlite3")
        with db:
            db.execute("UPDATE objects SET etag='\"x\"' WHERE bucket='bkt' AND key='k'")
        db.close()
        assert e.head_object("bkt", "k").etag == '"x"'
        seen = []
        t = threading.Thread(target=lambda: seen.append(e.head_object("bkt", "k").size))
        t.start()
        t.join()
        e.delete_object("bkt", "k")
        with pytest.raises(NoSuchKey):
            e.head_object("bkt", "k")
        assert seen == [5]
