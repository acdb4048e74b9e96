"""Small GETs served from a connection's cache of opened versions
(``gpufeed.wire._cachedgets``), against a real node through the SDK: every
commit drops what a connection cached, so a read after an acknowledged
overwrite, delete, key revoke or policy change answers as the node does now;
every byte a cached version serves is still checked against its block sums;
a deleted version's data file is closed without waiting for the connection's
next request; kv buckets are not cached (their reads keep the LRU order); a
node told to cache nothing reads the same."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from gpufeed.admin import RemoteAdmin
from gpufeed.bench.integrity import _chunks  # the catalog's chunk list of one object
from gpufeed.client import Client
from gpufeed.config import WireLimits
from gpufeed.errors import AccessDenied, DamagedObject, InvalidAccessKeyId, NoSuchKey
from gpufeed.testing.node import flip_bits, start_node

BLOCK = 4096


def _data(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _reader(node, **kw) -> Client:
    """One TCP connection: every get goes through the same connection's cache."""
    return Client(node.tcp_url, kw.pop("access_key", node.access_key), kw.pop("secret_key", node.secret_key),
                  connections=1, **kw)


def _get(c: Client, bucket: str, key: str, offset: int = 0) -> bytes:
    buf = bytearray(BLOCK)
    n = c.get_into(bucket, key, buf, offset=offset)
    return bytes(buf[:n])


def test_an_overwrite_and_a_delete_are_seen_by_the_next_get(node):
    with _reader(node) as c, Client(node.tcp_url, node.access_key, node.secret_key) as w:
        w.create_bucket("cached-rw")
        w.put("cached-rw", "k", _data(3 * BLOCK, seed=1))
        for _ in range(3):  # opened once, then from the cache
            assert _get(c, "cached-rw", "k", BLOCK) == _data(3 * BLOCK, seed=1)[BLOCK:2 * BLOCK]
        w.put("cached-rw", "k", _data(3 * BLOCK, seed=2))  # acknowledged: every get after sees it
        assert _get(c, "cached-rw", "k", BLOCK) == _data(3 * BLOCK, seed=2)[BLOCK:2 * BLOCK]
        assert _get(c, "cached-rw", "k", 2 * BLOCK) == _data(3 * BLOCK, seed=2)[2 * BLOCK:]
        w.delete("cached-rw", "k")
        with pytest.raises(NoSuchKey):
            _get(c, "cached-rw", "k")


def test_a_revoked_key_reads_nothing_more(node):
    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    admin.tenant_create("cachekeys")
    key = admin.key_create("cachekeys")
    with _reader(node, access_key=key["access_key"], secret_key=key["secret_key"]) as c:
        c.create_bucket("cached-revoke")
        c.put("cached-revoke", "k", _data(2 * BLOCK, seed=3))
        assert _get(c, "cached-revoke", "k") == _data(2 * BLOCK, seed=3)[:BLOCK]
        assert _get(c, "cached-revoke", "k") == _data(2 * BLOCK, seed=3)[:BLOCK]
        admin.key_revoke(key["access_key"])
        with pytest.raises(InvalidAccessKeyId):
            _get(c, "cached-revoke", "k")


def test_a_policy_change_is_seen_by_the_next_get(node):
    s3 = node.boto3_client()
    with _reader(node) as c:
        c.create_bucket("cached-policy")
        c.put("cached-policy", "k", _data(BLOCK, seed=4))
        assert _get(c, "cached-policy", "k") == _data(BLOCK, seed=4)
        assert _get(c, "cached-policy", "k") == _data(BLOCK, seed=4)
        deny = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::cached-policy/*"}]}
        s3.put_bucket_policy(Bucket="cached-policy", Policy=json.dumps(deny))
        with pytest.raises(AccessDenied):
            _get(c, "cached-policy", "k")
        s3.delete_bucket_policy(Bucket="cached-policy")
        assert _get(c, "cached-policy", "k") == _data(BLOCK, seed=4)


def test_a_cached_version_still_checks_every_read(tmp_path):
    n = start_node(tmp_path / "data")
    try:
        with _reader(n) as c:
            c.create_bucket("cached-rot")
            c.put("cached-rot", "k", _data(8 * BLOCK, seed=11))
            assert _get(c, "cached-rot", "k", 3 * BLOCK) == _data(8 * BLOCK, seed=11)[3 * BLOCK:4 * BLOCK]
            ((_chunk, file, offset, _stored),) = _chunks(n.data_dir / "catalog.sqlite3", "cached-rot", "k")
            flip_bits(n.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + 5 * BLOCK + 7, 0x10)
            assert _get(c, "cached-rot", "k", 3 * BLOCK) == _data(8 * BLOCK, seed=11)[3 * BLOCK:4 * BLOCK]
            with pytest.raises(DamagedObject):
                _get(c, "cached-rot", "k", 5 * BLOCK)
            with pytest.raises(DamagedObject):  # marked damaged: refused again
                _get(c, "cached-rot", "k", 5 * BLOCK)
    finally:
        assert n.stop() == 0


def _open_files(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out.add(os.readlink(fd))
        except OSError:  # closed meanwhile
            pass
    return out


def _blob_files(data_dir: Path) -> set[str]:
    return {str(p) for p in (data_dir / "blobs").rglob("*") if p.is_file()}


def test_a_deleted_version_is_not_held_open_by_an_idle_connection(node):
    with _reader(node) as c, Client(node.tcp_url, node.access_key, node.secret_key) as w:
        w.create_bucket("cached-space")
        before = _blob_files(node.data_dir)
        w.put("cached-space", "big", _data(64 * BLOCK, seed=5))
        (blob,) = _blob_files(node.data_dir) - before
        assert _get(c, "cached-space", "big") == _data(64 * BLOCK, seed=5)[:BLOCK]
        assert blob in _open_files(node.pid)  # held for the cached version
        w.delete("cached-space", "big")  # the reader's connection sends nothing more
        deadline = time.monotonic() + 10
        while f"{blob} (deleted)" in _open_files(node.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert f"{blob} (deleted)" not in _open_files(node.pid)


def test_kv_reads_keep_the_lru_order(node):
    with _reader(node) as c:
        c.create_bucket("cached-kv", kind="kv", capacity_bytes=2 * BLOCK + BLOCK // 2)
        c.put("cached-kv", "a", _data(BLOCK, seed=6))
        c.put("cached-kv", "b", _data(BLOCK, seed=7))
        _get(c, "cached-kv", "a")
        _get(c, "cached-kv", "b")
        _get(c, "cached-kv", "a")  # a is the most recently used again (no commit since the last read)
        c.put("cached-kv", "c", _data(BLOCK, seed=8))  # room for c: b goes
        assert _get(c, "cached-kv", "a") == _data(BLOCK, seed=6)
        with pytest.raises(NoSuchKey):
            _get(c, "cached-kv", "b")


def test_a_node_that_caches_nothing_reads_the_same(tmp_path):
    n = start_node(tmp_path / "data", env={"GPUFEED_WIRE_READ_CACHE_ENTRIES": "0"})
    try:
        with _reader(n) as c:
            c.create_bucket("uncached")
            c.put("uncached", "k", _data(2 * BLOCK, seed=9))
            for _ in range(2):
                assert _get(c, "uncached", "k", BLOCK) == _data(2 * BLOCK, seed=9)[BLOCK:]
            c.put("uncached", "k", _data(2 * BLOCK, seed=10))
            assert _get(c, "uncached", "k", BLOCK) == _data(2 * BLOCK, seed=10)[BLOCK:]
    finally:
        assert n.stop() == 0


def test_the_cache_size_is_bounded(monkeypatch):
    monkeypatch.setenv("GPUFEED_WIRE_READ_CACHE_ENTRIES", "4097")
    with pytest.raises(ValueError, match="GPUFEED_WIRE_READ_CACHE_ENTRIES"):
        WireLimits.from_env()
    monkeypatch.setenv("GPUFEED_WIRE_READ_CACHE_ENTRIES", "8")
    assert WireLimits.from_env().read_cache_entries == 8
