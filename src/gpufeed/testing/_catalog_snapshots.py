"""The snapshot cases of the catalog conformance suite (inherited by
:class:`gpufeed.testing.catalog.CatalogTests`; kept apart so each module stays one size).

They cover what snapshots rest on: an instant copy of the current objects with
every field, isolation from later writes, scans in UTF-8 byte order,
deletion returning the blobs it named, and the "is this blob still named"
test across current objects, noncurrent versions and snapshot entries.
"""

from __future__ import annotations

import dataclasses
from contextlib import closing

import pytest

from ..engine.catalog import Catalog
from ..engine.types import BucketInfo, ObjectInfo, SnapshotInfo

__all__ = ["SnapshotCatalogTests"]


def _o(bucket: str, key: str, blob_id: str, size: int = 3, **kw) -> ObjectInfo:
    return ObjectInfo(bucket, key, size, "e-" + blob_id, 1000.0, blob_id=blob_id, **kw)


class SnapshotCatalogTests:
    """Snapshot behaviour every catalog shares (uses the ``catalog`` and ``bucket`` fixtures)."""

    def test_snapshot_records_current_objects_with_every_field(self, catalog: Catalog, bucket: str) -> None:
        full = _o(bucket, "a/κ", "b1", 7, content_type="text/plain", metadata={"m": "ü"},
                  checksums={"crc32": "AAAAAA=="}, headers={"Content-Language": "de"}, version_id="v" * 32,
                  seq=42, lock_mode="GOVERNANCE", lock_until=5e9, legal_hold=True, tags={"t": "1"})
        with catalog.write() as w:
            w.put_object(full)
            w.put_object(_o(bucket, "b", "b2", 5))
            w.insert_noncurrent(dataclasses.replace(_o(bucket, "b", "old"), version_id="o" * 32, seq=1,
                                                    is_latest=False))
            w.insert_noncurrent(ObjectInfo(bucket, "gone", 0, "", 1.0, version_id="d" * 32, seq=2,
                                           delete_marker=True, is_latest=True))
            info = w.insert_snapshot(SnapshotInfo(bucket, "s1", 123.5))
        assert info == SnapshotInfo(bucket, "s1", 123.5, "manual", 2, 12)
        assert catalog.bucket_snapshot(bucket, "s1") == info
        got = catalog.snapshot_object(bucket, "s1", "a/κ")
        assert got == dataclasses.replace(full, path=self.blob_path("b1"))  # type: ignore[attr-defined]
        assert catalog.snapshot_object(bucket, "s1", "gone") is None  # delete markers are not recorded
        assert catalog.snapshot_object(bucket, "s1", "nope") is None
        assert catalog.snapshot_object(bucket, "nope", "b") is None

    def test_snapshot_is_isolated_from_later_writes(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_o(bucket, "k", "old"))
            w.insert_snapshot(SnapshotInfo(bucket, "s", 1.0))
        with catalog.write() as w:
            w.put_object(_o(bucket, "k", "new"))
            w.put_object(_o(bucket, "k2", "x"))
        entry = catalog.snapshot_object(bucket, "s", "k")
        assert entry is not None and entry.blob_id == "old"
        assert catalog.snapshot_object(bucket, "s", "k2") is None
        assert catalog.bucket_snapshot(bucket, "s") == SnapshotInfo(bucket, "s", 1.0, "manual", 1, 3)

    def test_snapshot_of_another_bucket_and_empty_bucket(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_bucket(BucketInfo("other", 2.0))
            w.put_object(_o("other", "k", "b"))
            empty = w.insert_snapshot(SnapshotInfo(bucket, "s", 1.0, "hourly"))
        assert empty == SnapshotInfo(bucket, "s", 1.0, "hourly", 0, 0)
        assert catalog.bucket_snapshots("other") == []
        assert catalog.bucket_snapshot("other", "s") is None

    def test_scan_snapshot_in_byte_order_with_bounds(self, catalog: Catalog, bucket: str) -> None:
        keys = ["b", "a/", "a/b", "é", "\U0001f680", "\uffff", "a0"]
        with catalog.write() as w:
            for i, k in enumerate(keys):
                w.put_object(_o(bucket, k, f"b{i}"))
            w.insert_snapshot(SnapshotInfo(bucket, "s", 1.0))
            w.put_object(_o(bucket, "a/c", "later"))
        want = sorted(keys, key=lambda k: k.encode())

        def scan(start: str, *, inclusive: bool = True, end: str | None = None, limit: int = 100) -> list[str]:
            rows = catalog.scan_snapshot(bucket, "s", start, inclusive=inclusive, end=end, limit=limit)
            with closing(rows):
                return [o.key for o in rows]

        assert scan("") == want
        assert scan("a/", inclusive=False, end="b") == ["a/b", "a0"]
        assert scan("a", limit=2) == ["a/", "a/b"]
        rows = catalog.scan_snapshot(bucket, "s", "", inclusive=True, end=None, limit=100)
        first = next(rows)
        rows.close()
        assert first.key == want[0] and first.path == self.blob_path(first.blob_id)  # type: ignore[attr-defined]

    def test_snapshots_listed_oldest_first(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            for name, t in (("z", 1.0), ("a", 3.0), ("m", 2.0), ("b", 3.0)):
                w.insert_snapshot(SnapshotInfo(bucket, name, t))
        assert [s.name for s in catalog.bucket_snapshots(bucket)] == ["z", "m", "a", "b"]

    def test_delete_snapshot_returns_its_blobs(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_o(bucket, "a", "x"))
            w.put_object(_o(bucket, "b", "x"))  # two keys of one blob (a restore can do that)
            w.put_object(_o(bucket, "c", "y"))
            w.insert_snapshot(SnapshotInfo(bucket, "s", 1.0))
            w.insert_snapshot(SnapshotInfo(bucket, "t", 2.0))
        with catalog.write() as w:
            assert sorted(w.delete_snapshot(bucket, "s")) == ["x", "y"]
            assert w.bucket_snapshot(bucket, "s") is None
        assert catalog.snapshot_object(bucket, "s", "a") is None
        assert catalog.snapshot_object(bucket, "t", "a") is not None
        with catalog.write() as w:
            assert w.delete_snapshot(bucket, "nope") == []

    def test_referenced_blobs_counts_every_kind_of_row(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_o(bucket, "cur", "c"))
            w.insert_noncurrent(dataclasses.replace(_o(bucket, "cur", "n"), version_id="n" * 32, seq=1,
                                                    is_latest=False))
            w.put_object(_o(bucket, "snap", "s"))
            w.insert_snapshot(SnapshotInfo(bucket, "s1", 1.0))
            w.delete_object(bucket, "snap")
            ids = ["c", "n", "s", "free", "", "c"] + [f"z{i}" for i in range(1000)]  # past any IN (...) bound
            assert w.referenced_blobs(ids) == {"c", "n", "s"}
            assert w.referenced_blobs([]) == set()
        assert catalog.live_files().blobs == {"c", "n", "s"}

    def test_a_blob_stays_named_until_its_last_snapshot_goes(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_o(bucket, "k", "b"))
            w.insert_snapshot(SnapshotInfo(bucket, "s1", 1.0))
            w.insert_snapshot(SnapshotInfo(bucket, "s2", 2.0))
            w.delete_object(bucket, "k")
            assert w.referenced_blobs(["b"]) == {"b"}
        with catalog.write() as w:
            assert w.delete_snapshot(bucket, "s1") == ["b"]
            assert w.referenced_blobs(["b"]) == {"b"}  # s2 still names it
        assert catalog.live_files().blobs == {"b"}
        with catalog.write() as w:
            w.put_object(_o(bucket, "k", "b"))  # a restore: the blob is current again
            assert w.delete_snapshot(bucket, "s2") == ["b"]
            assert w.referenced_blobs(["b"]) == {"b"}
            w.delete_object(bucket, "k")
            assert w.referenced_blobs(["b"]) == set()
        assert catalog.live_files().blobs == set()

    def test_snapshot_rolls_back(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.put_object(_o(bucket, "k", "b"))
        with pytest.raises(RuntimeError), catalog.write() as w:
            w.insert_snapshot(SnapshotInfo(bucket, "s", 1.0))
            raise RuntimeError("roll back")
        assert catalog.bucket_snapshot(bucket, "s") is None
        assert catalog.snapshot_object(bucket, "s", "k") is None
        with catalog.write() as w:
            w.delete_object(bucket, "k")
            assert w.referenced_blobs(["b"]) == set()  # the rolled-back snapshot counts nothing
