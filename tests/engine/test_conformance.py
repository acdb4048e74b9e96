"""The engine, through ``EngineStore``, passes the shared Store conformance suite."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from gpufeed.engine import Engine, EngineStore
from gpufeed.testing.stateful import make_store_state_machine
from gpufeed.testing.store import StoreTests


class _EngineHooks(StoreTests):
    """Raw access through the engine itself, beside the store under test."""

    def set_raw(self, store, key, value):
        store.engine.put_object(store.bucket, key, value)

    def get_raw(self, store, key):
        return store.engine.get_object(store.bucket, key)

    def open_read_only(self, store):
        return EngineStore(store.engine, store.bucket, read_only=True, page_keys=store.page_keys)


class TestEngineStore(_EngineHooks):
    @pytest.fixture
    def store(self, tmp_path):
        with Engine(tmp_path / "data", fsync=False) as engine:
            engine.create_bucket("conformance")
            yield EngineStore(engine, "conformance", page_keys=7)


class TestEngineStoreMD5Fsync(_EngineHooks):
    """The same suite with S3 ETags and full durability (the S3 front's settings)."""

    @pytest.fixture
    def store(self, tmp_path):
        with Engine(tmp_path / "data", fsync=True) as engine:
            engine.create_bucket("conformance")
            yield EngineStore(engine, "conformance", etag="md5", page_keys=7)


def _open_store() -> EngineStore:
    engine = Engine(tempfile.mkdtemp(prefix="gpufeed-stateful-"), fsync=False)
    engine.create_bucket("stateful")
    return EngineStore(engine, "stateful")


def _close_store(store: EngineStore) -> None:
    store.engine.close()
    shutil.rmtree(store.engine.data_dir, ignore_errors=True)


TestEngineStoreStateful = make_store_state_machine(_open_store, _close_store).TestCase
