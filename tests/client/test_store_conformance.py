"""Every remote backend passes the same Store suite as the engine: the fast path
(TCP and shm, through ClientStore) and S3 (boto3, through S3Store)."""

from __future__ import annotations

import shutil
import tempfile
import uuid

import pytest

from gpufeed.client import Client
from gpufeed.client.s3store import S3Store
from gpufeed.client.store import ClientStore
from gpufeed.config import NodeConfig
from gpufeed.engine import Engine
from gpufeed.testing.stateful import make_store_state_machine
from gpufeed.testing.store import StoreTests
from gpufeed.wire.server import WireServer


@pytest.fixture(scope="module")
def tcp_client(node):
    with Client(node.tcp_url) as c:
        yield c


@pytest.fixture(scope="module")
def shm_client(node):
    with Client(node.shm_url) as c:
        yield c


def _fresh_bucket(client) -> str:
    name = "conf-" + uuid.uuid4().hex[:16]
    client.create_bucket(name)
    return name


class _NodeHooks(StoreTests):
    """Raw access to the same bucket over S3 (boto3), beside the store under test."""

    @pytest.fixture(autouse=True)
    def _raw_s3(self, s3):
        self.s3 = s3

    def set_raw(self, store, key, value):
        self.s3.put_object(Bucket=store.bucket, Key=key, Body=value)

    def get_raw(self, store, key):
        return self.s3.get_object(Bucket=store.bucket, Key=key)["Body"].read()

    def open_read_only(self, store):
        return type(store)(store.client, store.bucket, read_only=True, page_keys=store.page_keys)


class TestClientStoreTCP(_NodeHooks):
    @pytest.fixture
    def store(self, tcp_client):
        return ClientStore(tcp_client, _fresh_bucket(tcp_client), page_keys=7)


class TestClientStoreShm(_NodeHooks):
    @pytest.fixture
    def store(self, shm_client):
        return ClientStore(shm_client, _fresh_bucket(shm_client), page_keys=7)


class TestS3Store(StoreTests):
    @pytest.fixture
    def store(self, s3):
        name = "conf-" + uuid.uuid4().hex[:16]
        s3.create_bucket(Bucket=name)
        return S3Store(s3, name, page_keys=7)

    @pytest.fixture(autouse=True)
    def _raw_client(self, tcp_client):
        self.client = tcp_client  # raw access over the fast path, beside boto3

    def set_raw(self, store, key, value):
        self.client.put(store.bucket, key, value)

    def get_raw(self, store, key):
        return bytes(self.client.get(store.bucket, key))

    def open_read_only(self, store):
        return S3Store(store.s3, store.bucket, read_only=True, page_keys=store.page_keys)


class _InProcessNode:
    """Engine + fast-path server on loopback, one per stateful run."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="gpufeed-stateful-wire-")
        self.engine = Engine(self.dir, fsync=False)
        self.server = WireServer(self.engine, NodeConfig(data_dir=self.dir, port=0, s3_port=0))
        port = self.server.start()
        self.client = Client(f"gpufeed+tcp://127.0.0.1:{port}", connections=2)
        self.client.create_bucket("stateful")

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _open() -> ClientStore:
    n = _InProcessNode()
    store = ClientStore(n.client, "stateful")
    store._node = n
    return store


TestClientStoreStateful = make_store_state_machine(_open, lambda s: s._node.close()).TestCase
