"""The engine, through ``EngineStore``, passes the shared Store conformance suite."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from gpufeed.engine import Engine, EngineStore
from gpufeed.testing.stateful import make_store_state_machine
from gpufeed.testing.store import StoreTests


class TestEngineStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        with Engine(tmp_path / "data", fsync=False) as engine:
            engine.create_bucket("conformance")
            yield EngineStore(engine, "conformance")


class TestEngineStoreMD5Fsync(StoreTests):
    """The same suite with S3 ETags and full durability (the S3 front's settings)."""

    @pytest.fixture
    def store(self, tmp_path):
        with Engine(tmp_path / "data", fsync=True) as engine:
            engine.create_bucket("conformance")
            yield EngineStore(engine, "conformance", etag="md5")


def _open_store() -> EngineStore:
    engine = Engine(tempfile.mkdtemp(prefix="gpufeed-stateful-"), fsync=False)
    engine.create_bucket("stateful")
    return EngineStore(engine, "stateful")


def _close_store(store: EngineStore) -> None:
    store.engine.close()
    shutil.rmtree(store.engine.data_dir, ignore_errors=True)


TestEngineStoreStateful = make_store_state_machine(_open_store, _close_store).TestCase
