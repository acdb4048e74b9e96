"""The conformance suite every engine catalog passes.

Subclass :class:`CatalogTests` and provide a ``catalog`` fixture that yields a
fresh, empty, open :class:`gpufeed.engine.catalog.Catalog` made with
``blob_path=CatalogTests.blob_path``; every behavioural test of the interface
is inherited::

    class TestPostgresCatalog(CatalogTests):
        @pytest.fixture
        def catalog(self, postgres_url):
            c = PostgresCatalog(postgres_url, blob_path=self.blob_path)
            yield c
            c.close()

The tests use only the interface (no SQL), each in a few dozen operations,
and cover what the engine relies on: UTF-8 byte order of keys (S3 listing
order, which a database collation easily breaks), replace-on-put, lazy range
scans, commit hooks, rollback, isolation of plain reads and snapshots
from an open write, idle uploads, lifecycle rules (round trip, replace,
dropped with their bucket), bucket snapshots (their entries, and which
blobs any row still names) and cluster membership (register, heartbeat,
leave, one live holder per node id).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from contextlib import closing

import pytest

from ..engine.catalog import Catalog, CatalogReader, CompletedUpload, LiveFiles, ObjectUse, PartRecord
from ..engine.types import (
    AccessKeyInfo,
    BucketInfo,
    LifecycleRule,
    ObjectInfo,
    PartInfo,
    Retention,
    TenantInfo,
    UploadInfo,
)
from ..errors import InternalError, InvalidArgument
from ._catalog_membership import MembershipCatalogTests
from ._catalog_snapshots import SnapshotCatalogTests
from .catalog_chunks import ChunkCatalogTests

__all__ = ["CatalogTests", "BYTE_ORDER_KEYS"]

#: Keys in UTF-8 byte order (which is code-point order). Linguistic collations
#: sort several of these differently: case, punctuation, accents, and
#: characters beyond the Basic Multilingual Plane (UTF-16 order puts them
#: before U+E000..U+FFFF).
BYTE_ORDER_KEYS = [
    "\x00",
    " ",
    "A",
    "B",
    "Z",
    "a",
    "a b",
    "a-b",
    "a.b",
    "a/",
    "a/b",
    "a0",
    "aB",
    "ab",
    "b",
    "z",
    "é",
    "\u30ad",
    "\uffff",
    "\U0001f680",
    "\U0010ffff",
]


def _obj(bucket: str, key: str, blob_id: str = "b0", *, size: int = 3, etag: str = "e",
         last_modified: float = 1000.0, **kw) -> ObjectInfo:
    return ObjectInfo(bucket, key, size, etag, last_modified, blob_id=blob_id, **kw)


def _part(number: int, file: str, *, etag: str = "p", size: int = 5, checksums=None) -> PartRecord:
    return PartRecord(PartInfo(number, etag, size, 2000.0 + number, dict(checksums or {})), file)


def _bucket(reader: CatalogReader, name: str) -> BucketInfo:
    info = reader.bucket(name)
    assert info is not None, f"bucket {name} missing"
    return info


def _get(reader: CatalogReader, bucket: str, key: str) -> ObjectInfo:
    info = reader.object(bucket, key)
    assert info is not None, f"{bucket}/{key} missing"
    return info


def _keys(reader: CatalogReader, bucket: str, start: str = "", *, inclusive: bool = True,
          end: str | None = None, limit: int = 1000) -> list[str]:
    with closing(reader.scan_objects(bucket, start, inclusive=inclusive, end=end, limit=limit)) as rows:
        return [o.key for o in rows]


class CatalogTests(ChunkCatalogTests, SnapshotCatalogTests, MembershipCatalogTests):
    """Behavioural tests for a :class:`~gpufeed.engine.catalog.Catalog` (the
    chunk store's cases come from :class:`ChunkCatalogTests`, the snapshot
    cases from :class:`SnapshotCatalogTests`).

    Subclasses provide a ``catalog`` fixture: a fresh, empty, open catalog made
    with ``blob_path=CatalogTests.blob_path``. They may add their own tests.
    """

    @staticmethod
    def blob_path(blob_id: str) -> str:
        """Where the suite's blobs "live": the catalog fills ``ObjectInfo.path`` with this."""
        return f"/blobs/{blob_id}"

    @pytest.fixture
    def catalog(self) -> Catalog:
        raise NotImplementedError("subclasses of CatalogTests provide a `catalog` fixture")

    @pytest.fixture
    def bucket(self, catalog: Catalog) -> str:
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("bkt", 1.0))
        return "bkt"

    # buckets -----------------------------------------------------------
    def test_is_a_catalog(self, catalog: Catalog) -> None:
        assert isinstance(catalog, Catalog)
        assert catalog.buckets() == []
        assert catalog.bucket("none") is None

    def test_bucket_round_trip_and_order(self, catalog: Catalog) -> None:
        kv = BucketInfo("kv-b", 2.5, "kv", 1 << 20, 30.0)
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("z.b", 1.0))
            w.insert_bucket(kv)
            w.insert_bucket(BucketInfo("a-b", 3.0))
        assert catalog.bucket("kv-b") == kv
        assert [b.name for b in catalog.buckets()] == ["a-b", "kv-b", "z.b"]

    def test_set_bucket_limits_and_delete(self, catalog: Catalog) -> None:
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("kvb", 1.0, "kv", 10, 0.0))
        with catalog.write() as w:
            w.set_bucket_limits("kvb", 20, 1.5)
        assert catalog.bucket("kvb") == BucketInfo("kvb", 1.0, "kv", 20, 1.5)
        with catalog.write() as w:
            w.delete_bucket("kvb")
        assert catalog.bucket("kvb") is None

    def test_bucket_usage_and_contents(self, catalog: Catalog, bucket: str) -> None:
        assert catalog.bucket_usage(bucket) == (0, 0)
        assert not catalog.bucket_has_objects(bucket)
        assert not catalog.bucket_has_uploads(bucket)
        with catalog.write() as w:
            w.put_object(_obj(bucket, "a", "b1", size=10))
            w.put_object(_obj(bucket, "b", "b2", size=32))
            w.insert_upload(UploadInfo(bucket, "k", "u" * 32, 5.0))
        assert catalog.bucket_usage(bucket) == (42, 2)
        assert catalog.bucket_has_objects(bucket)
        assert catalog.bucket_has_uploads(bucket)
        assert catalog.bucket_usage("other") == (0, 0)

    # objects -----------------------------------------------------------
    def test_object_round_trip(self, catalog: Catalog, bucket: str) -> None:
        info = ObjectInfo(bucket, "dir/κλειδί", 7, "abc-2", 1234.5, "text/plain; charset=utf-8",
                          {"owner": "ünïcode", "empty": ""}, {"crc32c": "AAAAAA=="}, "blob1", "",
                          {"Cache-Control": "no-cache"})
        with catalog.write() as w:
            w.put_object(info)
        got = _get(catalog, bucket, "dir/κλειδί")
        assert got.path == self.blob_path("blob1")
        assert (got.bucket, got.key, got.size, got.etag, got.last_modified, got.content_type, got.metadata,
                got.checksums, got.blob_id, got.headers) == (
                    info.bucket, info.key, info.size, info.etag, info.last_modified, info.content_type,
                    info.metadata, info.checksums, info.blob_id, info.headers)

    def test_empty_maps_round_trip(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "k"))
        got = _get(catalog, bucket, "k")
        assert (got.metadata, got.checksums, got.headers) == ({}, {}, {})
        assert got.content_type == "application/octet-stream"

    def test_missing_object(self, catalog: Catalog, bucket: str) -> None:
        assert catalog.object(bucket, "nope") is None
        assert catalog.object("no-bucket", "nope") is None

    def test_non_utf8_key_is_invalid_argument(self, catalog: Catalog, bucket: str) -> None:
        with pytest.raises(InvalidArgument):
            catalog.object(bucket, "bad\udcff")

    def test_put_replaces(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "k", "b1", size=1))
        with catalog.write() as w:
            assert _get(w, bucket, "k").blob_id == "b1"
            w.put_object(_obj(bucket, "k", "b2", size=2, metadata={"v": "2"}))
        got = _get(catalog, bucket, "k")
        assert (got.blob_id, got.size, got.metadata) == ("b2", 2, {"v": "2"})
        assert catalog.bucket_usage(bucket) == (2, 1)

    def test_buckets_are_separate_key_spaces(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("other", 1.0))
            w.put_object(_obj(bucket, "k", "b1"))
            w.put_object(_obj("other", "k", "b2"))
        assert _get(catalog, bucket, "k").blob_id == "b1"
        assert _get(catalog, "other", "k").blob_id == "b2"
        assert _keys(catalog, "other") == ["k"]

    def test_delete_object(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "a", "b1"))
            w.put_object(_obj(bucket, "b", "b2"))
        with catalog.write() as w:
            assert w.delete_object(bucket, "a") is True
            assert w.delete_object(bucket, "a") is False
            assert w.delete_object(bucket, "b", "not-b2") is False
            assert w.delete_object(bucket, "b", "b2") is True
        assert _keys(catalog, bucket) == []

    def test_delete_versions_only_matching_blobs(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            for i, k in enumerate("abc"):
                w.put_object(_obj(bucket, k, f"b{i}"))
        with catalog.write() as w:
            w.delete_versions(bucket, [("a", "b0"), ("b", "stale"), ("zz", "b9")])
        assert _keys(catalog, bucket) == ["b", "c"]

    # listing order and scans ----------------------------------------------
    def test_keys_scan_in_utf8_byte_order(self, catalog: Catalog, bucket: str) -> None:
        keys = list(BYTE_ORDER_KEYS)
        assert sorted(keys, key=lambda k: k.encode("utf-8")) == keys  # the table itself is in order
        with catalog.write() as w:
            for i, k in enumerate(reversed(keys)):
                w.put_object(_obj(bucket, k, f"b{i}"))
        assert _keys(catalog, bucket) == keys

    def test_scan_bounds_and_limit(self, catalog: Catalog, bucket: str) -> None:
        keys = ["a", "a/1", "a/2", "a0", "b"]
        with catalog.write() as w:
            for k in keys:
                w.put_object(_obj(bucket, k, "b-" + k))
        assert _keys(catalog, bucket, "a/") == ["a/1", "a/2", "a0", "b"]
        assert _keys(catalog, bucket, "a/1", inclusive=True) == ["a/1", "a/2", "a0", "b"]
        assert _keys(catalog, bucket, "a/1", inclusive=False) == ["a/2", "a0", "b"]
        assert _keys(catalog, bucket, "a/", end="a0") == ["a/1", "a/2"]
        assert _keys(catalog, bucket, "", limit=2) == ["a", "a/1"]
        assert _keys(catalog, bucket, "c") == []
        assert _keys(catalog, "no-bucket") == []

    def test_scan_yields_full_records(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "k", "b1", size=9, metadata={"m": "1"}, headers={"Expires": "x"}))
        with closing(catalog.scan_objects(bucket, "", inclusive=True, end=None, limit=10)) as rows:
            (got,) = list(rows)
        assert (got.bucket, got.size, got.metadata, got.headers, got.path) == (
            bucket, 9, {"m": "1"}, {"Expires": "x"}, self.blob_path("b1"))

    def test_scan_can_stop_early(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            for i in range(50):
                w.put_object(_obj(bucket, f"k{i:03d}", f"b{i}"))
        with closing(catalog.scan_objects(bucket, "", inclusive=True, end=None, limit=50)) as rows:
            assert next(rows).key == "k000"
        with catalog.write() as w:  # the abandoned scan holds nothing that blocks a writer
            w.put_object(_obj(bucket, "k999", "b999"))
        assert len(_keys(catalog, bucket)) == 51

    # kv bookkeeping and recovery ----------------------------------------------
    def test_object_uses_order_by_last_use(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "old", "b1", size=1, last_modified=10.0))
            w.put_object(_obj(bucket, "mid", "b2", size=2, last_modified=20.0))
            w.put_object(_obj(bucket, "new", "b3", size=3, last_modified=30.0))
            w.put_object(_obj(bucket, "tie", "b4", size=4, last_modified=20.0))
        with catalog.write() as w:
            w.set_last_used(bucket, {"old": 40.0, "gone": 50.0, "new": 5.0})  # earlier than its write: ignored
        assert catalog.object_uses(bucket) == [
            ObjectUse("mid", 2, "b2", 20.0, 20.0),
            ObjectUse("tie", 4, "b4", 20.0, 20.0),
            ObjectUse("new", 3, "b3", 30.0, 30.0),
            ObjectUse("old", 1, "b1", 10.0, 40.0),
        ]
        assert catalog.object(bucket, "gone") is None

    def test_put_resets_last_use(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "k", "b1", last_modified=10.0))
            w.set_last_used(bucket, {"k": 99.0})
        with catalog.write() as w:
            w.put_object(_obj(bucket, "k", "b2", last_modified=50.0))
        assert catalog.object_uses(bucket) == [ObjectUse("k", 3, "b2", 50.0, 50.0)]

    def test_live_files(self, catalog: Catalog, bucket: str) -> None:
        assert catalog.live_files() == LiveFiles(set(), {})
        u1, u2 = "1" * 32, "2" * 32
        with catalog.write() as w:
            w.put_object(_obj(bucket, "a", "blob-a"))
            w.put_object(_obj(bucket, "b", "blob-b"))
            w.insert_upload(UploadInfo(bucket, "k", u1, 1.0))
            w.insert_upload(UploadInfo(bucket, "k", u2, 2.0))
            w.put_part(u1, _part(1, "00001.x"))
            w.put_part(u1, _part(2, "00002.y"))
        assert catalog.live_files() == LiveFiles({"blob-a", "blob-b"}, {u1: {"00001.x", "00002.y"}, u2: set()})

    # multipart -----------------------------------------------------------
    def test_upload_round_trip(self, catalog: Catalog, bucket: str) -> None:
        up = UploadInfo(bucket, "big/κ", "a" * 32, 12.5, "video/mp4", {"m": "ü"}, {"Content-Language": "de"})
        with catalog.write() as w:
            w.insert_upload(up)
        assert catalog.upload(bucket, "big/κ", "a" * 32) == up
        assert catalog.upload(bucket, "other", "a" * 32) is None
        assert catalog.upload("no-bucket", "big/κ", "a" * 32) is None
        assert catalog.upload(bucket, "big/κ", "b" * 32) is None

    def test_uploads_by_key_then_start(self, catalog: Catalog, bucket: str) -> None:
        rows = [UploadInfo(bucket, "b", "1" * 32, 3.0), UploadInfo(bucket, "a", "2" * 32, 9.0),
                UploadInfo(bucket, "b", "3" * 32, 1.0), UploadInfo(bucket, "a/", "4" * 32, 0.5)]
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("other", 1.0))
            w.insert_upload(UploadInfo("other", "a", "5" * 32, 0.1))
            for u in rows:
                w.insert_upload(u)
        assert [(u.key, u.initiated) for u in catalog.uploads(bucket)] == [
            ("a", 9.0), ("a/", 0.5), ("b", 1.0), ("b", 3.0)]

    def test_parts(self, catalog: Catalog, bucket: str) -> None:
        uid = "c" * 32
        with catalog.write() as w:
            w.insert_upload(UploadInfo(bucket, "k", uid, 1.0))
            w.put_part(uid, _part(3, "00003.a", checksums={"crc32": "AAAAAA=="}))
            w.put_part(uid, _part(1, "00001.a"))
        assert catalog.part_file(uid, 1) == "00001.a"
        assert catalog.part_file(uid, 2) is None
        with catalog.write() as w:
            w.put_part(uid, _part(1, "00001.b", etag="p2", size=7))  # re-upload replaces
        parts = catalog.parts(uid)
        assert [(p.info.part_number, p.file, p.info.etag, p.info.size) for p in parts] == [
            (1, "00001.b", "p2", 7), (3, "00003.a", "p", 5)]
        assert parts[1].info == PartInfo(3, "p", 5, 2003.0, {"crc32": "AAAAAA=="})

    def test_delete_upload_drops_its_parts(self, catalog: Catalog, bucket: str) -> None:
        uid, keep = "d" * 32, "e" * 32
        with catalog.write() as w:
            w.insert_upload(UploadInfo(bucket, "k", uid, 1.0))
            w.insert_upload(UploadInfo(bucket, "k", keep, 2.0))
            w.put_part(uid, _part(1, "00001.a"))
            w.put_part(keep, _part(1, "00001.b"))
        with catalog.write() as w:
            w.delete_upload(uid)
        assert catalog.upload(bucket, "k", uid) is None
        assert catalog.parts(uid) == []
        assert [p.file for p in catalog.parts(keep)] == ["00001.b"]
        assert not catalog.bucket_has_uploads("no-bucket")

    def test_idle_uploads_by_last_activity(self, catalog: Catalog, bucket: str) -> None:
        quiet, busy, fresh, other = "1" * 32, "2" * 32, "3" * 32, "4" * 32
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("a-first", 1.0))
            w.insert_upload(UploadInfo(bucket, "k", quiet, 100.0))
            w.put_part(quiet, PartRecord(PartInfo(1, "p", 5, 150.0), "00001.a"))
            w.insert_upload(UploadInfo(bucket, "k", busy, 100.0))
            w.put_part(busy, PartRecord(PartInfo(1, "p", 5, 150.0), "00001.b"))
            w.put_part(busy, PartRecord(PartInfo(2, "p", 5, 300.0), "00002.b"))  # touched late
            w.insert_upload(UploadInfo(bucket, "j", fresh, 250.0))  # started late, no parts
            w.insert_upload(UploadInfo("a-first", "z", other, 50.0))
        assert [u.upload_id for u in catalog.idle_uploads(200.0)] == [other, quiet]
        assert catalog.idle_uploads(50.0) == []
        assert [u.upload_id for u in catalog.idle_uploads(250.0)] == [other, quiet]  # strictly before
        got = catalog.idle_uploads(1000.0)
        assert [u.upload_id for u in got] == [other, fresh, quiet, busy]
        assert got[0] == UploadInfo("a-first", "z", other, 50.0)

    # versions --------------------------------------------------------------
    def test_bucket_versioning_and_lock_round_trip(self, catalog: Catalog, bucket: str) -> None:
        assert catalog.bucket(bucket) == BucketInfo(bucket, 1.0)
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("locked", 2.0, versioning="Enabled", object_lock=True))
            w.set_bucket_versioning(bucket, "Suspended")
        assert _bucket(catalog, bucket).versioning == "Suspended"
        assert catalog.bucket("locked") == BucketInfo("locked", 2.0, versioning="Enabled", object_lock=True)
        with catalog.write() as w:
            w.set_bucket_lock("locked", "COMPLIANCE", 0, 3)
        got = catalog.bucket("locked")
        assert got is not None
        assert (got.object_lock, got.lock_mode, got.lock_days, got.lock_years) == (True, "COMPLIANCE", 0, 3)

    def test_versions_current_noncurrent_and_markers(self, catalog: Catalog, bucket: str) -> None:
        cur = _obj(bucket, "k", "b3", version_id="c" * 32, seq=30, lock_mode="GOVERNANCE", lock_until=9e9,
                   legal_hold=True, tags={"t": "é"})
        old = _obj(bucket, "k", "b1", version_id="a" * 32, seq=10, is_latest=False)
        marker = ObjectInfo(bucket, "k", 0, "", 1500.0, "", version_id="null", seq=20, delete_marker=True,
                            is_latest=False)
        with catalog.write() as w:
            w.put_object(cur)
            w.insert_noncurrent(old)
            w.insert_noncurrent(marker)
        assert _get(catalog, bucket, "k") == dataclasses.replace(cur, path=self.blob_path("b3"))
        assert catalog.version(bucket, "k", "c" * 32) == _get(catalog, bucket, "k")
        assert catalog.version(bucket, "k", "a" * 32) == dataclasses.replace(old, path=self.blob_path("b1"))
        assert catalog.version(bucket, "k", "null") == marker
        assert catalog.version(bucket, "k", "b" * 32) is None and catalog.version(bucket, "j", "null") is None
        assert [v.version_id for v in catalog.noncurrent(bucket, "k", 5)] == ["null", "a" * 32]  # newest first
        assert catalog.live_files().blobs == {"b1", "b3"}  # noncurrent data is live; markers have none
        assert catalog.bucket_has_objects(bucket)
        with catalog.write() as w:
            w.set_latest_marker(bucket, "k", "null")
        assert catalog.noncurrent(bucket, "k")[0].is_latest
        with catalog.write() as w:
            w.set_latest_marker(bucket, "k", None)
            assert w.update_version(dataclasses.replace(old, tags={"x": "y"}, legal_hold=True)) is True
            assert w.update_version(dataclasses.replace(cur, tags={}, legal_hold=False, lock_mode="")) is True
            assert w.update_version(dataclasses.replace(old, version_id="f" * 32)) is False
        assert not catalog.noncurrent(bucket, "k")[0].is_latest
        got = catalog.version(bucket, "k", "a" * 32)
        assert got is not None
        assert (got.tags, got.legal_hold) == ({"x": "y"}, True)
        got = _get(catalog, bucket, "k")
        assert (got.tags, got.legal_hold, got.lock_mode) == ({}, False, "")
        with catalog.write() as w:
            assert w.delete_noncurrent(bucket, "k", "null") is True
            assert w.delete_noncurrent(bucket, "k", "null") is False
        assert [v.version_id for v in catalog.noncurrent(bucket, "k", 5)] == ["a" * 32]

    def test_scan_noncurrent_orders_by_key_then_newest(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            for i, key in enumerate(BYTE_ORDER_KEYS):
                for seq in (1, 3, 2):
                    w.insert_noncurrent(_obj(bucket, key, f"b{i}.{seq}", version_id=f"{i:016x}{seq:016x}",
                                             seq=seq, is_latest=False))
        with closing(catalog.scan_noncurrent(bucket, "", inclusive=True, end=None, limit=10_000)) as rows:
            got = [(v.key, v.seq) for v in rows]
        assert got == [(k, s) for k in BYTE_ORDER_KEYS for s in (3, 2, 1)]
        with closing(catalog.scan_noncurrent(bucket, "a", inclusive=False, end="b", limit=4)) as rows:
            assert [(v.key, v.seq) for v in rows] == [("a b", 3), ("a b", 2), ("a b", 1), ("a-b", 3)]

    def test_upload_tags_and_retention_round_trip(self, catalog: Catalog, bucket: str) -> None:
        info = UploadInfo(bucket, "k", "9" * 32, 5.0, "text/plain", {"m": "1"}, {}, {"t": "v"},
                          Retention("COMPLIANCE", 1e10, True))
        with catalog.write() as w:
            w.insert_upload(info)
        assert catalog.upload(bucket, "k", "9" * 32) == info
        assert catalog.uploads(bucket) == [info]

    # tenants and access keys -------------------------------------------------
    def test_tenants_and_access_keys(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_tenant(TenantInfo("zed", 2.0))
            w.insert_tenant(TenantInfo("amy", 1.0))
            w.insert_access_key(AccessKeyInfo("GFKEY1", "amy", 3.0), "sealed-1")
            w.insert_access_key(AccessKeyInfo("GFKEY2", "zed", 4.0), "sealed-2")
            w.insert_bucket(BucketInfo("amys", 5.0, owner="amy"))
        assert catalog.tenants() == [TenantInfo("amy", 1.0), TenantInfo("zed", 2.0)]
        assert catalog.tenant("amy") == TenantInfo("amy", 1.0) and catalog.tenant("bob") is None
        assert catalog.access_key("GFKEY1") == (AccessKeyInfo("GFKEY1", "amy", 3.0), "sealed-1")
        assert catalog.access_key("GFNONE") is None
        assert [k.access_key for k in catalog.access_keys()] == ["GFKEY1", "GFKEY2"]
        assert catalog.access_keys("zed") == [AccessKeyInfo("GFKEY2", "zed", 4.0)]
        assert _bucket(catalog, "amys").owner == "amy" and _bucket(catalog, bucket).owner == ""
        with catalog.write() as w:
            assert w.revoke_access_key("GFKEY1", 9.0) is True
            assert w.revoke_access_key("GFKEY1", 10.0) is False  # already revoked
        assert catalog.access_keys("amy") == [AccessKeyInfo("GFKEY1", "amy", 3.0, 9.0)]
        with catalog.write() as w:
            w.delete_tenant("zed")
        assert catalog.tenant("zed") is None and catalog.access_key("GFKEY2") is None

    # bucket configuration documents -----------------------------------------
    def test_bucket_config_round_trip_replace_delete(self, catalog: Catalog, bucket: str) -> None:
        doc = '<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin></CORSRule></CORSConfiguration>\u00e9'
        assert catalog.bucket_config(bucket, "cors") is None
        with catalog.write() as w:
            w.set_bucket_config(bucket, "cors", doc)
            w.set_bucket_config(bucket, "tagging", "{}")
            assert w.bucket_config(bucket, "cors") == doc
        assert catalog.bucket_config(bucket, "cors") == doc
        with catalog.write() as w:
            w.set_bucket_config(bucket, "cors", "second")
        assert catalog.bucket_config(bucket, "cors") == "second"
        assert catalog.bucket_config(bucket, "tagging") == "{}"
        with catalog.write() as w:
            assert w.delete_bucket_config(bucket, "cors") is True
            assert w.delete_bucket_config(bucket, "cors") is False
        assert catalog.bucket_config(bucket, "cors") is None
        assert catalog.bucket_config("no-bucket", "cors") is None

    def test_deleting_a_bucket_drops_its_configs(self, catalog: Catalog) -> None:
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("gone", 1.0))
            w.set_bucket_config("gone", "cors", "doc")
        with catalog.write() as w:
            w.delete_bucket("gone")
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("gone", 2.0))
        assert catalog.bucket_config("gone", "cors") is None

    # lifecycle -----------------------------------------------------------
    def test_lifecycle_round_trip_and_replace(self, catalog: Catalog, bucket: str) -> None:
        assert catalog.lifecycle(bucket) is None
        assert catalog.lifecycles() == {}
        rules = [
            LifecycleRule("expire logs", True, "logs/é", expiration_days=30),
            LifecycleRule("x" * 255, False, "", expiration_date=1893456000.0, abort_days=7),
            LifecycleRule("old-style", True, "tmp/", abort_days=1, legacy_prefix=True),
        ]
        with catalog.write() as w:
            w.set_lifecycle(bucket, rules)
            assert w.lifecycle(bucket) == rules
        assert catalog.lifecycle(bucket) == rules
        assert catalog.lifecycles() == {bucket: rules}
        with catalog.write() as w:
            w.set_lifecycle(bucket, rules[:1])
        assert catalog.lifecycle(bucket) == rules[:1]
        assert catalog.lifecycle("no-bucket") is None

    def test_delete_lifecycle(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("other", 1.0))
            w.set_lifecycle(bucket, [LifecycleRule("r", abort_days=1)])
            w.set_lifecycle("other", [LifecycleRule("s", expiration_days=2)])
        with catalog.write() as w:
            assert w.delete_lifecycle(bucket) is True
            assert w.delete_lifecycle(bucket) is False
        assert catalog.lifecycle(bucket) is None
        assert catalog.lifecycles() == {"other": [LifecycleRule("s", expiration_days=2)]}

    def test_deleting_a_bucket_drops_its_lifecycle(self, catalog: Catalog) -> None:
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("gone", 1.0))
            w.set_lifecycle("gone", [LifecycleRule("r", expiration_days=1)])
        with catalog.write() as w:
            w.delete_bucket("gone")
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("gone", 2.0))  # a new bucket of the same name starts without rules
        assert catalog.lifecycle("gone") is None
        assert catalog.lifecycles() == {}

    def test_lifecycle_rolls_back(self, catalog: Catalog, bucket: str) -> None:
        with pytest.raises(KeyError):
            with catalog.write() as w:
                w.set_lifecycle(bucket, [LifecycleRule("r", expiration_days=1)])
                raise KeyError("abort")
        assert catalog.lifecycle(bucket) is None

    def test_completed_uploads_round_trip_and_prune(self, catalog: Catalog, bucket: str) -> None:
        parts = (PartInfo(1, "p1", 5 << 20, 10.0, {"crc32": "AAAAAA=="}), PartInfo(4, "p4", 7, 11.0))
        live = CompletedUpload(bucket, "κ/k", "a" * 32, "e-2", "b1", 100.0, parts)
        gone = CompletedUpload(bucket, "old", "b" * 32, "e-1", "b2", 50.0, parts[1:])
        fresh = CompletedUpload(bucket, "new", "c" * 32, "e-1", "b3", 300.0, parts[:1])
        with catalog.write() as w:
            w.put_object(_obj(bucket, "κ/k", "b1"))
            w.put_object(_obj(bucket, "old", "b9"))  # overwritten since its completion
            for rec in (live, gone, fresh):
                w.insert_completed(rec)
        assert catalog.completed_upload("a" * 32) == live
        assert catalog.completion_of("b2") == gone
        assert catalog.completed_upload("d" * 32) is None and catalog.completion_of("b9") is None
        with catalog.write() as w:
            assert w.prune_completed(200.0) == 1  # old and no longer current; live is current; fresh is new
        assert catalog.completed_upload("b" * 32) is None
        assert catalog.completed_upload("a" * 32) == live and catalog.completion_of("b3") == fresh

    # transactions -----------------------------------------------------------
    def test_write_sees_its_own_changes(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "k", "b1"))
            assert _get(w, bucket, "k").blob_id == "b1"
            assert _keys(w, bucket) == ["k"]

    def test_rollback_on_exception(self, catalog: Catalog, bucket: str) -> None:
        ran: list[str] = []
        with pytest.raises(KeyError):
            with catalog.write() as w:
                w.put_object(_obj(bucket, "k", "b1"))
                w.insert_bucket(BucketInfo("new-bucket", 1.0))
                w.on_commit(lambda: ran.append("hook"))
                raise KeyError("abort")
        assert catalog.object(bucket, "k") is None
        assert catalog.bucket("new-bucket") is None
        assert ran == []
        with catalog.write() as w:  # the catalog is usable afterwards
            w.put_object(_obj(bucket, "k", "b2"))
        assert _get(catalog, bucket, "k").blob_id == "b2"

    def test_on_commit_hooks_run_after_commit_in_order(self, catalog: Catalog, bucket: str) -> None:
        seen: list[object] = []
        with catalog.write() as w:
            w.put_object(_obj(bucket, "k", "b1"))
            w.on_commit(lambda: seen.append(("first", catalog.object(bucket, "k") is not None)))
            w.on_commit(lambda: seen.append("second"))
            assert seen == []
        assert seen == [("first", True), "second"]

    def test_plain_reads_do_not_see_an_open_write(self, catalog: Catalog, bucket: str) -> None:
        seen: list[object] = []

        def look() -> None:
            seen.append(catalog.object(bucket, "k"))

        with catalog.write() as w:
            w.put_object(_obj(bucket, "k", "b1"))
            t = threading.Thread(target=look)
            t.start()
            t.join(10)
        assert seen == [None]
        assert catalog.object(bucket, "k") is not None

    def test_snapshot_sees_one_state(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_obj(bucket, "a", "b1"))

        def writer() -> None:
            with catalog.write() as w:
                w.put_object(_obj(bucket, "b", "b2"))
                w.delete_object(bucket, "a")

        with catalog.snapshot() as s:
            assert _keys(s, bucket) == ["a"]
            t = threading.Thread(target=writer)
            t.start()
            t.join(10)
            assert not t.is_alive()
            assert _keys(s, bucket) == ["a"]
            assert s.object(bucket, "b") is None
        assert _keys(catalog, bucket) == ["b"]

    def test_writes_are_serialised(self, catalog: Catalog, bucket: str) -> None:
        inside = [0]
        overlaps: list[int] = []
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(5):
                    with catalog.write() as w:
                        inside[0] += 1
                        overlaps.append(inside[0])
                        w.put_object(_obj(bucket, f"t{n}-{i}", f"b{n}-{i}"))
                        time.sleep(0.001)
                        inside[0] -= 1
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert set(overlaps) == {1}
        assert catalog.bucket_usage(bucket) == (3 * 20, 20)

    def test_close_is_idempotent_and_final(self, catalog: Catalog, bucket: str) -> None:
        catalog.close()
        catalog.close()
        with pytest.raises(InternalError):
            with catalog.write():
                pass
        with pytest.raises(InternalError):
            catalog.object(bucket, "k")
        with pytest.raises(InternalError):
            catalog.buckets()
