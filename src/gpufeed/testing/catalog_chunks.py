"""Conformance cases for the chunk-store operations of a catalog (manifests,
chunks and their references, dedup lookups, damage marks): mixed into
:class:`gpufeed.testing.catalog.CatalogTests`, which provides the ``catalog``
and ``bucket`` fixtures."""

from __future__ import annotations

from ..engine.catalog import Catalog
from ..engine.types import ChunkRecord, ObjectInfo

__all__ = ["ChunkCatalogTests"]


def _chunk(cid: str, file: str | None = None, *, size: int = 100, domain: str | None = None,
           digest: bytes = b"", offset: int = 0, codec: str = "") -> ChunkRecord:
    return ChunkRecord(cid, file or cid, offset, size, size, codec, digest or cid.encode().ljust(16, b"."),
                       bytes(8), domain)


class ChunkCatalogTests:
    """Chunk-store cases every catalog passes."""

    def test_manifest_round_trip_in_order(self, catalog: Catalog, bucket: str) -> None:
        a, b = _chunk("ca", "f1", size=70), _chunk("cb", "f1", size=30, offset=70, codec="zstd")
        with catalog.write() as w:
            w.insert_chunk(a, 1)
            w.insert_chunk(b, 2)
            w.insert_manifest("blob1", 130, ["cb", "ca", "cb"])
            w.insert_manifest("empty", 0, [])
        assert catalog.manifest("blob1") == (130, [b, a, b])
        assert catalog.manifest("empty") == (0, [])
        assert catalog.manifest("nope") is None
        assert catalog.chunk_totals() == (2, 100, 100)
        assert catalog.data_files() == {"f1"}
        assert catalog.file_chunks("f1") == ["ca", "cb"] and catalog.file_chunks("f2") == []
        assert [c.chunk_id for c in catalog.scan_chunks("", 10)] == ["ca", "cb"]
        assert [c.chunk_id for c in catalog.scan_chunks("ca", 10)] == ["cb"]

    def test_release_drops_references_and_returns_free_files(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_chunk(_chunk("shared", domain="t", digest=b"d" * 32), 2)
            w.insert_chunk(_chunk("own1", "pack"), 1)
            w.insert_chunk(_chunk("own2", "pack", offset=100), 1)
            w.insert_manifest("v1", 300, ["shared", "own1", "own2"])
            w.insert_manifest("v2", 100, ["shared"])
        with catalog.write() as w:
            assert w.release_manifest("v1") == (["pack"], 200)  # both chunks of the pack went
        assert catalog.manifest("v1") is None
        assert catalog.find_chunk("t", b"d" * 32) is not None  # v2 still holds it
        with catalog.write() as w:
            assert w.release_manifest("v2") == (["shared"], 100)
        assert catalog.find_chunk("t", b"d" * 32) is None
        assert catalog.chunk_totals() == (0, 0, 0)
        with catalog.write() as w:
            assert w.release_manifest("v2") == ([], 0)  # already gone: nothing

    def test_shared_chunks_are_found_per_domain(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_chunk(_chunk("x1", domain="acme", digest=b"z" * 32), 1)
            w.insert_chunk(_chunk("x2", domain="other", digest=b"z" * 32), 1)
            w.insert_chunk(_chunk("x3", digest=b"z" * 32), 1)  # not shared: never found
        found = [catalog.find_chunk(d, b"z" * 32) for d in ("acme", "other")]
        assert [c.chunk_id if c else None for c in found] == ["x1", "x2"]
        assert catalog.find_chunk("nobody", b"z" * 32) is None
        with catalog.write() as w:
            assert w.add_chunk_refs("x1", 3)
            assert not w.add_chunk_refs("missing", 1)

    def test_references_from_versions_and_orphans(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_chunk(_chunk("c1"), 1, bucket)
            w.insert_manifest("live", 100, ["c1"])
            w.insert_manifest("orphan", 0, [])
            w.put_object(ObjectInfo(bucket, "k", 100, "e", 1.0, blob_id="live"))
            w.put_object(ObjectInfo(bucket, "old", 5, "e", 1.0, blob_id="legacy"))
        assert catalog.blob_referenced("live") and not catalog.blob_referenced("orphan")
        assert catalog.orphan_manifests() == ["orphan"]
        assert catalog.unmanifested_blobs() == [("legacy", 5, bucket)]
        assert catalog.chunk_users("c1") == [(bucket, "k", "null")]
        assert catalog.bucket_data_usage(bucket) == (105, 100, 1)

    def test_repair_points_a_chunk_at_a_good_copy(self, catalog: Catalog, bucket: str) -> None:
        old = _chunk("c9", "oldfile", domain="t", digest=b"q" * 32)
        with catalog.write() as w:
            w.insert_chunk(old, 2)
            w.insert_manifest("m", 100, ["c9"])
            w.mark_damaged("c9", "data file is missing", 1.0)
        fresh = ChunkRecord("other-id", "newfile", 0, 60, 100, "zstd", b"q" * 32, bytes(8), "t")
        with catalog.write() as w:
            assert w.repair_chunk("c9", fresh) == "oldfile"
            assert w.repair_chunk("nope", fresh) is None
        got = catalog.manifest("m")
        assert got is not None and got[1] == [ChunkRecord("c9", "newfile", 0, 60, 100, "zstd", b"q" * 32,
                                                          bytes(8), "t")]
        assert catalog.damaged_chunks() == {} and catalog.data_files() == {"newfile"}
        assert catalog.chunk("c9") == got[1][0] and catalog.chunk("nope") is None
        with catalog.write() as w:
            assert w.add_chunk_refs("c9", 1)

    def test_damage_marks(self, catalog: Catalog, bucket: str) -> None:
        with catalog.write() as w:
            w.insert_chunk(_chunk("c1"), 1)
            w.mark_damaged("c1", "block 3 does not match its sum", 5.0)
            w.mark_damaged("c1", "a later reason", 6.0)  # the first is kept
        assert catalog.damaged_chunks() == {"c1": ("block 3 does not match its sum", 5.0)}
        with catalog.write() as w:
            w.clear_damaged("c1")
        assert catalog.damaged_chunks() == {}
