"""The LMCache plugin driven by LMCache's own code against a live node (issue 4, item b).

LMCache 0.5.6 is imported for real from the folder ``make test`` installs it in
(``.lmcache``, see ``tests/ai/lmcache-requirements.txt``; ``GPUFEED_LMCACHE_PATH``):
its config and metadata classes, ``CacheEngineKey``, ``CreateStorageBackends``
(which builds the ``LocalCPUBackend`` with its CPU allocator and, from
``remote_storage_plugins``, a ``RemoteBackend`` whose ``ConnectorManager``
imports and wraps our connector) and ``RemoteBackend``'s put/get/contains paths.
Nothing is stubbed: LMCache's CUDA extension (``cuda_ops``) is never imported on
a CPU host. Without LMCache the module is skipped, unless
``GPUFEED_REQUIRE_LMCACHE=1`` (set by ``make test``) makes that a failure.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gpufeed.client import Client
from gpufeed.errors import NoSuchKey

_LMCACHE_DIR = Path(os.environ.get("GPUFEED_LMCACHE_PATH", Path(__file__).parents[2] / ".lmcache"))
if _LMCACHE_DIR.is_dir() and str(_LMCACHE_DIR) not in sys.path:
    sys.path.append(str(_LMCACHE_DIR))  # appended: the venv's own packages (torch, numpy) win
try:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend import CreateStorageBackends

    from gpufeed.ai.kvcache.lmcache import GpufeedConnector, PluginSettings
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("GPUFEED_REQUIRE_LMCACHE") == "1":
        raise
    pytest.skip(f"LMCache is not importable ({exc}); `make test` installs it into .lmcache",
                allow_module_level=True)

LAYERS, HEADS, HEAD_DIM, CT = 4, 2, 8, 16  # a tiny model: chunks of 16 tokens, 4 KiB in bf16
SHAPE = (2, LAYERS, CT, HEADS * HEAD_DIM)  # LMCache's KV_2LTD chunk
MODULE = "gpufeed.ai.kvcache.lmcache"
_buckets = itertools.count()


class Lmc:
    """LMCache's storage stack (CPU backend + RemoteBackend with our plugin) on its own
    event loop thread, as LMCache's StorageManager builds it."""

    def __init__(self, url: str, *, plugins: dict[str, dict] | None = None,
                 class_name: str = "GpufeedConnector", **settings) -> None:
        self.bucket = settings.setdefault("bucket", f"lmc-{next(_buckets)}")
        settings.setdefault("capacity_bytes", 64 << 20)
        plugins = plugins or {"gpufeed": dict(settings, url=url)}
        extra = {}
        for name, values in plugins.items():
            extra[f"remote_storage_plugin.{name}.module_path"] = MODULE
            extra[f"remote_storage_plugin.{name}.class_name"] = class_name
            extra.update({f"remote_storage_plugin.{name}.{k}": v for k, v in values.items()})
        self.config = LMCacheEngineConfig.from_defaults(
            chunk_size=CT, local_cpu=True, max_local_cpu_size=0.05, remote_serde="naive",
            remote_storage_plugins=list(plugins), extra_config=extra, blocking_timeout_secs=20)
        self.metadata = LMCacheMetadata(
            model_name="org/model", world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=torch.bfloat16,
            kv_shape=(LAYERS, 2, CT, HEADS, HEAD_DIM), chunk_size=CT)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.backends = CreateStorageBackends(self.config, self.metadata, self.loop)
        self.cpu = self.backends["LocalCPUBackend"]
        self.remotes = {n: self.backends[f"RemoteBackend-{n}"] for n in plugins}
        self.remote = next(iter(self.remotes.values()))
        self.conn: GpufeedConnector = self.remote.connection.getWrappedConnector()

    def obj(self, seed: int, shape=SHAPE):
        """A MemoryObj from LMCache's allocator filled with random bytes."""
        o = self.cpu.allocate([torch.Size(shape)], [torch.bfloat16])
        assert o is not None
        rng = np.random.default_rng(seed)
        np.frombuffer(memoryview(o.byte_array).cast("B"), np.uint8)[:] = rng.integers(
            0, 256, o.get_size(), dtype=np.uint8)
        return o

    def run(self, coro, timeout_s: float = 20.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def put(self, key, obj) -> None:
        self.remote.submit_put_task(key, obj).result(20)

    def close(self) -> None:
        for remote in self.remotes.values():
            remote.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def key(h: int, model: str = "org/model", **tags) -> CacheEngineKey:
    return CacheEngineKey(model, 1, 0, h, torch.bfloat16,
                          {f"lmcache.tag.{k}": v for k, v in tags.items()} or None)


def raw(obj) -> bytes:
    return bytes(memoryview(obj.byte_array).cast("B"))


def release(*objs) -> None:
    for o in objs:
        if o is not None:
            o.ref_count_down()


@pytest.fixture(params=["shm", "tcp"])
def url(request, node):
    return node.shm_url if request.param == "shm" else node.tcp_url


@pytest.fixture
def lmc(url):
    env = Lmc(url)
    yield env
    env.close()


# --- loading and round trips ---------------------------------------------------------
def test_lmcache_loads_the_plugin_from_its_config(lmc, url):
    assert isinstance(lmc.conn, GpufeedConnector)
    assert lmc.conn.settings == PluginSettings(url=url, bucket=lmc.bucket, capacity_bytes=64 << 20)
    with Client(url) as c:
        stats = c.bucket_stats(lmc.bucket)
    assert stats["kind"] == "kv" and stats["capacity_bytes"] == 64 << 20


def test_put_get_roundtrip_bit_exact(lmc, url):
    k, o = key(0x1234), lmc.obj(1)
    lmc.put(k, o)
    assert lmc.remote.contains(k)
    got = lmc.remote.get_blocking(k)
    assert got is not None and got is not o
    assert raw(got) == raw(o)
    assert got.get_shapes() == [torch.Size(SHAPE)] and got.get_dtypes() == [torch.bfloat16]
    # the object is the documented format: header (with the key) then the payload
    with Client(url) as c:
        data = bytes(c.get(lmc.bucket, k.to_string()))
    assert data[:4] == b"GFLC" and k.to_string().encode() in data[:256]
    assert data[-o.get_size():] == raw(o)
    m = lmc.conn.metrics.snapshot()
    assert (m["hits"], m["puts"], m["corrupt"], m["node_errors"]) == (1, 1, 0, 0)
    # shm: checked against the digest the node computed as the bytes landed; tcp: hashed here
    assert m["node_digests"] == (1 if url.startswith("gpufeed+shm") else 0)
    release(o, got)


def test_exists_sync_and_remove(lmc):
    k, o = key(7), lmc.obj(7)
    lmc.put(k, o)
    assert lmc.conn.exists_sync(k) and lmc.run(lmc.conn.exists(k))
    assert lmc.remote.remove(k)
    assert not lmc.conn.exists_sync(k) and not lmc.remote.contains(k)
    assert lmc.remote.get_blocking(k) is None
    release(o)


def test_batched_forms(lmc):
    keys = [key(100 + i) for i in range(6)]
    objs = [lmc.obj(100 + i) for i in range(6)]
    assert lmc.conn.support_batched_put() and lmc.conn.support_batched_get()
    stored = [0, 1, 2, 4, 5]  # key 3 is never stored
    lmc.remote.batched_submit_put_task([keys[i] for i in stored], [objs[i] for i in stored])
    deadline = time.monotonic() + 20
    while lmc.conn.metrics.snapshot()["puts"] < len(stored):
        assert time.monotonic() < deadline, lmc.conn.metrics.snapshot()
        time.sleep(0.01)
    assert lmc.remote.batched_contains(keys) == 3  # prefix semantics
    assert lmc.run(lmc.remote.batched_async_contains("req", keys)) == 3
    got = lmc.remote.batched_get_blocking(keys)
    assert [g is not None for g in got] == [True, True, True, False, True, True]
    assert all(raw(g) == raw(objs[i]) for i, g in enumerate(got) if g is not None)
    prefix = lmc.run(lmc.remote.batched_get_non_blocking("req", keys))
    assert [raw(p) for p in prefix] == [raw(o) for o in objs[:3]]
    assert lmc.run(lmc.conn.list()) and set(lmc.run(lmc.conn.list())) == {
        keys[i].to_string() for i in stored}
    release(*objs, *got, *prefix)


def test_missing_key_is_a_miss(lmc):
    k = key(0xDEAD)
    assert not lmc.remote.contains(k) and lmc.remote.batched_contains([k]) == 0
    assert lmc.remote.get_blocking(k) is None
    assert lmc.remote.batched_get_blocking([k]) == [None]
    assert lmc.run(lmc.remote.batched_get_non_blocking("r", [k])) == []
    assert lmc.conn.metrics.snapshot()["misses"] >= 3


def test_unfull_last_chunk_roundtrip(lmc):
    """A chunk of 5 tokens (save_unfull_chunk) comes back with its own shape."""
    k, o = key(0x5), lmc.obj(5, shape=(2, LAYERS, 5, HEADS * HEAD_DIM))
    lmc.put(k, o)
    got = lmc.remote.get_blocking(k)
    assert got is not None and got.get_shapes() == [torch.Size((2, LAYERS, 5, HEADS * HEAD_DIM))]
    assert raw(got) == raw(o)
    release(o, got)


@pytest.mark.parametrize("model, tags", [
    ("meta-llama/Llama-3.1-8B-Instruct", {}),
    ("a b%c?d#e&f=g+h\\i", {"user": "x/y z%"}),
    ("模型/κλειδί/🙂", {"租户": "値"}),
    ("x" * 1500, {}),              # over the node's 1,024-byte key limit: hashed
    ("lone\udcffsurrogate", {}),   # no UTF-8 form: hashed
])
def test_odd_keys(lmc, url, model, tags):
    k, o = key(0xABC, model, **tags), lmc.obj(11)
    lmc.put(k, o)
    got = lmc.remote.get_blocking(k)
    assert got is not None and raw(got) == raw(o)
    assert lmc.remote.contains(k)
    assert not lmc.remote.contains(key(0xABC, model + "2", **tags))
    release(o, got)


# --- bad objects -----------------------------------------------------------------------
def _corrupt(url, bucket, okey, fn) -> None:
    with Client(url) as c:
        data = bytearray(c.get(bucket, okey))
        c.put(bucket, okey, fn(data))


@pytest.mark.parametrize("damage", ["payload bit", "header key", "header shape", "checksum"])
def test_corrupt_object_is_a_miss_and_is_dropped(lmc, url, damage):
    k, o = key(0xC0), lmc.obj(0xC0)
    lmc.put(k, o)
    okey = k.to_string()
    at = {"payload bit": -17, "header key": 40 + 20 + 3, "header shape": 32 + 4,
          "checksum": 24}[damage]

    def flip(data: bytearray) -> bytearray:
        data[at] ^= 0x10
        return data

    _corrupt(url, lmc.bucket, okey, flip)
    assert lmc.remote.get_blocking(k) is None
    assert lmc.conn.metrics.snapshot()["corrupt"] == 1
    with Client(url) as c, pytest.raises(NoSuchKey):  # dropped: the next put replaces it
        c.head(lmc.bucket, okey)
    lmc.put(k, o)
    got = lmc.remote.get_blocking(k)
    assert got is not None and raw(got) == raw(o)
    release(o, got)


@pytest.mark.parametrize("make", [
    lambda d: d[:-10],                 # truncated payload
    lambda d: d[:64],                  # the header only
    lambda d: d[:20],                  # part of a header
    lambda d: b"\x00",                 # one byte
    lambda d: b"",                     # empty
    lambda d: os.urandom(len(d)),      # garbage of the right size
], ids=["truncated", "header-only", "half-header", "one-byte", "empty", "garbage"])
def test_short_or_garbage_object_is_a_miss(lmc, url, make):
    k, o = key(0x51), lmc.obj(0x51)
    lmc.put(k, o)
    _corrupt(url, lmc.bucket, k.to_string(), lambda d: make(bytes(d)))
    assert lmc.remote.get_blocking(k) is None
    assert lmc.remote.batched_get_blocking([k]) == [None]
    m = lmc.conn.metrics.snapshot()
    assert m["hits"] == 0 and m["node_errors"] == 0
    release(o)


def test_object_of_another_key_is_a_miss(lmc, url):
    a, b, o = key(0xA), key(0xB), lmc.obj(0xA)
    lmc.put(a, o)
    with Client(url) as c:
        c.put(lmc.bucket, b.to_string(), c.get(lmc.bucket, a.to_string()))
    assert not lmc.remote.contains(b)
    assert lmc.remote.get_blocking(b) is None
    release(o)


# --- node down -------------------------------------------------------------------------
@pytest.mark.parametrize("dead", ["gpufeed+shm:///nonexistent/gpufeed.sock",
                                  "gpufeed+tcp://127.0.0.1:1"])
def test_node_down_is_misses_without_hanging(dead):
    t0 = time.monotonic()
    env = Lmc(dead, retry_interval_s=0.0)  # retry on every call: each one fails fast
    try:
        k, o = key(1), env.obj(1)
        env.put(k, o)
        env.remote.batched_submit_put_task([key(2)], [o])
        assert not env.remote.contains(k) and env.remote.batched_contains([k]) == 0
        assert env.remote.get_blocking(k) is None
        assert env.remote.batched_get_blocking([k, key(2)]) == [None, None]
        assert env.run(env.remote.batched_get_non_blocking("r", [k])) == []
        assert env.run(env.conn.ping()) == 1
        m = env.conn.metrics.snapshot()
        assert m["node_errors"] >= 5 and m["hits"] == m["puts"] == 0
        release(o)
    finally:
        env.close()
    assert time.monotonic() - t0 < 10


def test_node_killed_midway(fresh_node):
    env = Lmc(fresh_node.shm_url, request_timeout_s=3.0, retry_interval_s=60.0)
    try:
        k, o = key(9), env.obj(9)
        env.put(k, o)
        assert env.run(env.conn.ping()) == 0
        fresh_node.stop(signal.SIGKILL)
        t0 = time.monotonic()
        assert env.remote.get_blocking(k) is None
        assert not env.remote.contains(k)
        env.put(key(10), o)
        assert time.monotonic() - t0 < 8
        assert env.conn.metrics.snapshot()["node_errors"] == 1  # logged once, then misses
        release(o)
    finally:
        env.close()


# --- configuration ---------------------------------------------------------------------
def test_settings_from_extra_config():
    extra = {"remote_storage_plugin.g.url": "gpufeed+tcp://h:1",
             "remote_storage_plugin.g.capacity_bytes": "1024",
             "remote_storage_plugin.g.request_timeout_s": "2.5"}
    s = PluginSettings.from_extra_config(extra, "g")
    assert (s.url, s.capacity_bytes, s.request_timeout_s, s.bucket) == ("gpufeed+tcp://h:1", 1024,
                                                                       2.5, "lmcache")
    with pytest.raises(ValueError, match="url"):
        PluginSettings.from_extra_config({}, "g")
    with pytest.raises(ValueError, match="capacity_bytes"):
        PluginSettings.from_extra_config(dict(extra, **{"remote_storage_plugin.g.capacity_bytes":
                                                        "lots"}), "g")


def test_adapter_serves_two_nodes_each_with_its_settings(node):
    plugins = {"gpufeed.shm": {"url": node.shm_url, "bucket": f"lmc-a{next(_buckets)}",
                               "capacity_bytes": 1 << 20},
               "gpufeed.tcp": {"url": node.tcp_url, "bucket": f"lmc-b{next(_buckets)}",
                               "capacity_bytes": 1 << 20}}
    env = Lmc(node.shm_url, plugins=plugins, class_name="GpufeedConnectorAdapter")
    try:
        conns = {n: r.connection.getWrappedConnector() for n, r in env.remotes.items()}
        assert {n: (c.settings.url, c.settings.bucket) for n, c in conns.items()} == {
            n: (p["url"], p["bucket"]) for n, p in plugins.items()}
        k, o = key(3), env.obj(3)
        env.remotes["gpufeed.tcp"].submit_put_task(k, o).result(20)
        assert env.remotes["gpufeed.tcp"].contains(k)
        assert not env.remotes["gpufeed.shm"].contains(k)
        release(o)
    finally:
        env.close()


def test_existing_standard_bucket_is_used_with_a_warning(node, caplog):
    """A bucket of the configured name that already exists as a standard bucket never
    evicts: the plugin still uses it, and says so."""
    name = f"lmc-std-{next(_buckets)}"
    with Client(node.tcp_url) as c:
        c.create_bucket(name)
    env = Lmc(node.tcp_url, bucket=name)
    try:
        o = env.obj(7)
        env.put(key(70), o)
        got = env.remote.get_blocking(key(70))
        assert got is not None and raw(got) == raw(o)
        release(o, got)
        assert any("not a kv bucket" in r.message for r in caplog.records)
    finally:
        env.close()


def test_hostile_layout_is_corrupt_before_any_allocation(lmc, url):
    """A header with the right key and checksum that declares an absurd layout: a
    corrupt object (dropped), never an allocation that makes LMCache evict its cache."""
    from gpufeed.ai.kvcache._lmcache_format import ObjectHeader, payload_checksum

    held = [lmc.obj(i) for i in range(3)]
    for i, o in enumerate(held):
        lmc.cpu.submit_put_task(key(1000 + i), o)
    release(*held)
    deadline = time.monotonic() + 10
    while len(lmc.cpu.hot_cache) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    k = key(77)
    kstr = k.to_string()
    payload = os.urandom(64)
    h = ObjectHeader(1, ((1 << 20, 1 << 12, 2, 2),), (torch.bfloat16,), kstr, len(payload),
                     payload_checksum(payload))
    okey = lmc.conn._object_key(kstr)
    with Client(url) as c:
        c.put(lmc.bucket, okey, h.pack() + payload)
        assert lmc.run(lmc.conn.get(k)) is None
        assert len(lmc.cpu.hot_cache) == 3  # nothing evicted
        m = lmc.conn.metrics.snapshot()
        assert m["corrupt"] == 1 and m["alloc_failures"] == 0
        assert okey not in [e.key for e in c.list(lmc.bucket)]
