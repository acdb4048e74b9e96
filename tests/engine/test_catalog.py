"""The SQLite catalog passes the shared catalog conformance suite (``CatalogTests``)."""

from __future__ import annotations

import pytest

from gpufeed.engine import Catalog, SqliteCatalog
from gpufeed.engine.types import BucketInfo, ObjectInfo
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
