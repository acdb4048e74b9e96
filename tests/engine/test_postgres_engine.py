"""The engine over a PostgreSQL catalog: the Store conformance suite, the data
folder's guards (a folder whose catalog is in PostgreSQL, a new catalog beside
data files), and reopening."""

from __future__ import annotations

import pytest

from gpufeed.engine import CatalogSettings, Engine, EngineStore
from gpufeed.errors import CatalogDamaged, CatalogInUse, InternalError
from gpufeed.testing.store import StoreTests


class TestEngineStorePostgres(StoreTests):
    """The Store suite through an engine whose catalog is in PostgreSQL (S3 ETags, as the S3 front)."""

    def set_raw(self, store, key, value):
        store.engine.put_object(store.bucket, key, value)

    def get_raw(self, store, key):
        return store.engine.get_object(store.bucket, key)

    def open_read_only(self, store):
        return EngineStore(store.engine, store.bucket, read_only=True, page_keys=store.page_keys)

    @pytest.fixture
    def store(self, tmp_path, postgres_url):
        with Engine(tmp_path / "data", fsync=False, catalog=CatalogSettings(url=postgres_url)) as engine:
            engine.create_bucket("conformance")
            yield EngineStore(engine, "conformance", etag="md5", page_keys=7)


def test_objects_versions_and_uploads_survive_reopen(tmp_path, postgres_url):
    settings = CatalogSettings(url=postgres_url)
    with Engine(tmp_path / "data", fsync=False, catalog=settings) as engine:
        engine.create_bucket("bkt")
        engine.put_object("bkt", "k\u00e9y", b"hello")
        engine.put_bucket_versioning("bkt", "Enabled")
        engine.put_object("bkt", "v", b"one")
        engine.put_object("bkt", "v", b"two")
        up = engine.create_multipart_upload("bkt", "mp")
        part = engine.upload_part("bkt", "mp", up.upload_id, 1, b"x" * 10)
        engine.complete_multipart_upload("bkt", "mp", up.upload_id, [(1, part.etag)])
    assert (tmp_path / "data" / "catalog.postgresql").is_file()
    assert not (tmp_path / "data" / "catalog.sqlite3").exists()
    with Engine(tmp_path / "data", fsync=False, catalog=settings) as engine:
        assert engine.get_object("bkt", "k\u00e9y") == b"hello"
        assert engine.get_object("bkt", "v") == b"two"
        assert len(engine.list_object_versions("bkt", prefix="v").versions) == 2
        assert engine.get_object("bkt", "mp") == b"x" * 10


def test_folder_of_a_postgres_catalog_refuses_sqlite(tmp_path, postgres_url):
    with Engine(tmp_path / "data", fsync=False, catalog=CatalogSettings(url=postgres_url)) as engine:
        engine.create_bucket("bkt")
        engine.put_object("bkt", "k", b"data")
    with pytest.raises(CatalogDamaged, match="PostgreSQL"):
        Engine(tmp_path / "data", fsync=False)


def test_new_catalog_beside_data_files_is_refused(tmp_path, postgres_server, postgres_url):
    with Engine(tmp_path / "data", fsync=False, catalog=CatalogSettings(url=postgres_url)) as engine:
        engine.create_bucket("bkt")
        engine.put_object("bkt", "k", b"data")
    other = postgres_server.create_database("other")
    try:
        with pytest.raises(InternalError, match="is new"):
            Engine(tmp_path / "data", fsync=False, catalog=CatalogSettings(url=other))
        with Engine(tmp_path / "data", fsync=False, catalog=CatalogSettings(url=postgres_url)) as engine:
            assert engine.get_object("bkt", "k") == b"data"  # nothing was swept
    finally:
        postgres_server.drop_database(other)


def test_second_deployment_is_refused_unless_same_cluster(tmp_path, postgres_url):
    with Engine(tmp_path / "a", fsync=False, catalog=CatalogSettings(url=postgres_url)):
        pass
    with pytest.raises(CatalogInUse, match="--cluster"):
        Engine(tmp_path / "bkt", fsync=False, catalog=CatalogSettings(url=postgres_url))


def test_cluster_name_lets_another_folder_open_it(tmp_path, postgres_url):
    with Engine(tmp_path / "a", fsync=False, catalog=CatalogSettings(url=postgres_url, cluster="c1")):
        pass
    with Engine(tmp_path / "bkt", fsync=False, catalog=CatalogSettings(url=postgres_url, cluster="c1")) as engine:
        assert engine.list_buckets() == []
    with pytest.raises(CatalogInUse, match="cluster:c1"):
        Engine(tmp_path / "c", fsync=False, catalog=CatalogSettings(url=postgres_url, cluster="c2"))


def test_folder_of_a_sqlite_catalog_refuses_postgres(tmp_path, postgres_url):
    with Engine(tmp_path / "data", fsync=False) as engine:
        engine.create_bucket("bkt")
    with pytest.raises(CatalogDamaged, match="one catalog"):
        Engine(tmp_path / "data", fsync=False, catalog=CatalogSettings(url=postgres_url))
    with Engine(tmp_path / "data", fsync=False) as engine:  # nothing changed
        assert [b.name for b in engine.list_buckets()] == ["bkt"]
