"""The write operations of the PostgreSQL catalog: every method of
:class:`~gpufeed.engine.catalog.CatalogWriter` but ``on_commit``, as SQL over
the write transaction's ``_rows`` / ``_count`` / ``_many``.

The running totals that the SQLite catalog keeps with triggers (``usage``:
bytes and count of the versions with data, per bucket; ``chunk_usage``:
stored bytes and count of the chunks each bucket stored) are kept here by the
statements that add or remove those rows: deletes say what they removed with
``RETURNING``, and one upsert per change adds the difference. Every write
transaction holds the writer row's lock (:mod:`._pgschema`), so no other
writer changes the rows in between.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

from ._pgreads import CHUNK_COLS, VERSION_COLS, dumps, key_bytes, lock_dumps, rules_dumps
from .catalog import CompletedUpload, PartRecord
from .types import (
    AccessKeyInfo,
    BucketInfo,
    ChunkRecord,
    LifecycleRule,
    ObjectInfo,
    SnapshotInfo,
    TenantInfo,
    UploadInfo,
)

__all__ = ["PgWrites"]

_VERSION_MARKS = ", ".join(["%s"] * 14)
_VERSION_SETS = ", ".join(f"{c.strip()} = excluded.{c.strip()}" for c in VERSION_COLS.split(","))
_PUT_OBJECT_SQL = (
    f"WITH put AS (INSERT INTO objects (bucket, key, {VERSION_COLS}, last_access)"
    f" VALUES (%s, %s, {_VERSION_MARKS}, %s) ON CONFLICT (bucket, key) DO UPDATE SET {_VERSION_SETS},"
    " last_access = excluded.last_access RETURNING 1),"
    " old AS (SELECT size FROM objects WHERE bucket = %s AND key = %s)"
    " INSERT INTO usage (bucket, bytes, objects)"
    " SELECT %s, %s - COALESCE((SELECT SUM(size) FROM old), 0), 1 - (SELECT COUNT(*) FROM old) FROM put"
    " ON CONFLICT (bucket) DO UPDATE SET bytes = usage.bytes + excluded.bytes,"
    " objects = usage.objects + excluded.objects")


def _version_values(info: ObjectInfo) -> tuple:
    """The values of :data:`VERSION_COLS` for ``info``."""
    return (info.size, info.etag, info.last_modified, info.content_type, dumps(info.metadata),
            dumps(info.checksums), info.blob_id, dumps(info.headers), info.version_id, info.seq,
            info.lock_mode, info.lock_until, int(info.legal_hold), dumps(info.tags))


class PgWrites:
    """Every write of the catalog interface but ``on_commit``."""

    _holder: str = ""

    if TYPE_CHECKING:
        def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
            """Run one statement; its rows (the writer class's)."""

        def _count(self, sql: str, args: tuple = ()) -> int:
            """Run one statement; the rows it changed (the writer class's)."""

        def _many(self, sql: str, args: list[tuple]) -> None:
            """Run one statement once per tuple of ``args`` (the writer class's)."""

    def _add_usage(self, bucket: str, size: int, versions: int) -> None:
        if size or versions:
            self._count("INSERT INTO usage (bucket, bytes, objects) VALUES (%s, %s, %s) ON CONFLICT (bucket)"
                        " DO UPDATE SET bytes = usage.bytes + excluded.bytes,"
                        " objects = usage.objects + excluded.objects", (bucket, size, versions))

    def _add_chunk_usage(self, bucket: str, stored: int, chunks: int) -> None:
        self._count("INSERT INTO chunk_usage (bucket, stored, chunks) VALUES (%s, %s, %s) ON CONFLICT (bucket)"
                    " DO UPDATE SET stored = chunk_usage.stored + excluded.stored,"
                    " chunks = chunk_usage.chunks + excluded.chunks", (bucket, stored, chunks))

    # buckets, tenants, keys -----------------------------------------------------
    def insert_bucket(self, info: BucketInfo) -> None:
        self._count(
            "INSERT INTO buckets (name, created, kind, capacity_bytes, ttl_s, versioning, object_lock, lock_mode,"
            " lock_days, lock_years, owner, etag_policy) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (info.name, info.created, info.kind, info.capacity_bytes, info.ttl_s, info.versioning,
             int(info.object_lock), info.lock_mode, info.lock_days, info.lock_years, info.owner, info.etag_policy))

    def set_bucket_limits(self, name: str, capacity_bytes: int, ttl_s: float) -> None:
        self._count("UPDATE buckets SET capacity_bytes = %s, ttl_s = %s WHERE name = %s", (capacity_bytes, ttl_s, name))

    def insert_tenant(self, info: TenantInfo) -> None:
        self._count("INSERT INTO tenants (name, created) VALUES (%s, %s)", (info.name, info.created))

    def delete_tenant(self, name: str) -> None:
        self._count("DELETE FROM quotas WHERE scope = 'tenant' AND name = %s", (name,))
        self._count("DELETE FROM access_keys WHERE tenant = %s", (name,))
        self._count("DELETE FROM tenants WHERE name = %s", (name,))

    def set_quota(self, scope: str, name: str, max_bytes: int, max_objects: int) -> None:
        if max_bytes or max_objects:
            self._count("INSERT INTO quotas (scope, name, bytes, objects) VALUES (%s, %s, %s, %s)"
                        " ON CONFLICT (scope, name) DO UPDATE SET bytes = excluded.bytes, objects = excluded.objects",
                        (scope, name, max_bytes, max_objects))
        else:
            self._count("DELETE FROM quotas WHERE scope = %s AND name = %s", (scope, name))

    def insert_access_key(self, info: AccessKeyInfo, sealed_secret: str) -> None:
        self._count("INSERT INTO access_keys (access_key, tenant, secret, created, revoked)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (info.access_key, info.tenant, sealed_secret, info.created, info.revoked))

    def revoke_access_key(self, access_key: str, when: float) -> bool:
        return self._count("UPDATE access_keys SET revoked = %s WHERE access_key = %s AND revoked = 0",
                           (when, access_key)) > 0

    def set_bucket_versioning(self, name: str, state: str) -> None:
        self._count("UPDATE buckets SET versioning = %s WHERE name = %s", (state, name))

    def set_bucket_lock(self, name: str, mode: str, days: int, years: int) -> None:
        self._count("UPDATE buckets SET object_lock = 1, lock_mode = %s, lock_days = %s, lock_years = %s"
                    " WHERE name = %s", (mode, days, years, name))

    def delete_bucket(self, name: str) -> None:
        for sql in ("DELETE FROM buckets WHERE name = %s", "DELETE FROM lifecycle WHERE bucket = %s",
                    "DELETE FROM bucket_configs WHERE bucket = %s", "DELETE FROM usage WHERE bucket = %s",
                    "DELETE FROM quotas WHERE scope = 'bucket' AND name = %s"):
            self._count(sql, (name,))

    def set_lifecycle(self, bucket: str, rules: list[LifecycleRule]) -> None:
        self._count("INSERT INTO lifecycle (bucket, rules) VALUES (%s, %s)"
                    " ON CONFLICT (bucket) DO UPDATE SET rules = excluded.rules", (bucket, rules_dumps(rules)))

    def delete_lifecycle(self, bucket: str) -> bool:
        return self._count("DELETE FROM lifecycle WHERE bucket = %s", (bucket,)) > 0

    def set_bucket_config(self, bucket: str, name: str, value: str) -> None:
        self._count("INSERT INTO bucket_configs (bucket, name, value) VALUES (%s, %s, %s)"
                    " ON CONFLICT (bucket, name) DO UPDATE SET value = excluded.value", (bucket, name, value))

    def delete_bucket_config(self, bucket: str, name: str) -> bool:
        return self._count("DELETE FROM bucket_configs WHERE bucket = %s AND name = %s", (bucket, name)) > 0

    # objects -------------------------------------------------------------
    def put_object(self, info: ObjectInfo) -> None:
        # One statement: the old row's size (read before the upsert), the upsert, and the usage change.
        self._count(_PUT_OBJECT_SQL, (info.bucket, key_bytes(info.key), *_version_values(info), info.last_modified,
                                      info.bucket, key_bytes(info.key), info.bucket, info.size))

    def insert_noncurrent(self, info: ObjectInfo) -> None:
        self._count(f"INSERT INTO versions (bucket, key, {VERSION_COLS}, delete_marker, latest)"
                    f" VALUES (%s, %s, {_VERSION_MARKS}, %s, %s)",
                    (info.bucket, key_bytes(info.key), *_version_values(info), int(info.delete_marker),
                     int(info.delete_marker and info.is_latest)))
        if not info.delete_marker:
            self._add_usage(info.bucket, info.size, 1)

    def delete_noncurrent(self, bucket: str, key: str, version_id: str) -> bool:
        gone = self._rows("DELETE FROM versions WHERE bucket = %s AND key = %s AND version_id = %s"
                          " RETURNING size, delete_marker", (bucket, key_bytes(key), version_id))
        data = [size for size, marker in gone if not marker]
        self._add_usage(bucket, -sum(data), -len(data))
        return bool(gone)

    def set_latest_marker(self, bucket: str, key: str, version_id: str | None) -> None:
        k = key_bytes(key)
        self._count("UPDATE versions SET latest = 0 WHERE bucket = %s AND key = %s AND latest = 1", (bucket, k))
        if version_id is not None:
            self._count("UPDATE versions SET latest = 1 WHERE bucket = %s AND key = %s AND version_id = %s"
                        " AND delete_marker = 1", (bucket, k, version_id))

    def update_version(self, info: ObjectInfo) -> bool:
        args = (info.lock_mode, info.lock_until, int(info.legal_hold), dumps(info.tags),
                info.bucket, key_bytes(info.key), info.version_id)
        sets = (" SET lock_mode = %s, lock_until = %s, legal_hold = %s, tags = %s"
                " WHERE bucket = %s AND key = %s AND version_id = %s")
        if self._count("UPDATE objects" + sets, args):
            return True
        return self._count("UPDATE versions" + sets, args) > 0

    def delete_object(self, bucket: str, key: str, blob_id: str | None = None) -> bool:
        if blob_id is None:
            gone = self._rows("DELETE FROM objects WHERE bucket = %s AND key = %s RETURNING size",
                              (bucket, key_bytes(key)))
        else:
            gone = self._rows("DELETE FROM objects WHERE bucket = %s AND key = %s AND blob_id = %s RETURNING size",
                              (bucket, key_bytes(key), blob_id))
        self._add_usage(bucket, -sum(r[0] for r in gone), -len(gone))
        return bool(gone)

    def delete_versions(self, bucket: str, versions: list[tuple[str, str]]) -> None:
        size = count = 0
        for key, blob_id in versions:
            for (n,) in self._rows("DELETE FROM objects WHERE bucket = %s AND key = %s AND blob_id = %s"
                                   " RETURNING size", (bucket, key_bytes(key), blob_id)):
                size, count = size + n, count + 1
        self._add_usage(bucket, -size, -count)

    def set_last_used(self, bucket: str, times: dict[str, float]) -> None:
        self._many("UPDATE objects SET last_access = %s WHERE bucket = %s AND key = %s",
                   [(t, bucket, key_bytes(k)) for k, t in times.items()])

    # snapshots -------------------------------------------------------------
    def insert_snapshot(self, info: SnapshotInfo) -> SnapshotInfo:
        n = self._count(f"INSERT INTO snapshot_objects (bucket, snapshot, key, {VERSION_COLS})"
                        f" SELECT bucket, %s, key, {VERSION_COLS} FROM objects WHERE bucket = %s",
                        (info.name, info.bucket))
        self._count("INSERT INTO snapshot_blobs (blob_id, refs) SELECT blob_id, COUNT(*) FROM objects"
                    " WHERE bucket = %s GROUP BY blob_id ON CONFLICT (blob_id)"
                    " DO UPDATE SET refs = snapshot_blobs.refs + excluded.refs", (info.bucket,))
        size = int(self._rows("SELECT COALESCE(SUM(size), 0) FROM objects WHERE bucket = %s", (info.bucket,))[0][0])
        self._count("INSERT INTO snapshots (bucket, name, created, kind, objects, bytes)"
                    " VALUES (%s, %s, %s, %s, %s, %s)", (info.bucket, info.name, info.created, info.kind, n, size))
        return SnapshotInfo(info.bucket, info.name, info.created, info.kind, n, size)

    def delete_snapshot(self, bucket: str, name: str) -> list[str]:
        counts = self._rows("SELECT blob_id, COUNT(*) FROM snapshot_objects WHERE bucket = %s AND snapshot = %s"
                            " GROUP BY blob_id", (bucket, name))
        self._many("UPDATE snapshot_blobs SET refs = refs - %s WHERE blob_id = %s", [(n, b) for b, n in counts])
        self._many("DELETE FROM snapshot_blobs WHERE blob_id = %s AND refs <= 0", [(b,) for b, _ in counts])
        self._count("DELETE FROM snapshot_objects WHERE bucket = %s AND snapshot = %s", (bucket, name))
        self._count("DELETE FROM snapshots WHERE bucket = %s AND name = %s", (bucket, name))
        return [b for b, _ in counts]

    def referenced_blobs(self, blob_ids: list[str]) -> set[str]:
        ids = list(dict.fromkeys(b for b in blob_ids if b))
        if not ids:
            return set()
        sql = " UNION ".join(f"SELECT blob_id FROM {t} WHERE blob_id = ANY(%s)"
                             for t in ("objects", "versions", "snapshot_blobs"))
        return {r[0] for r in self._rows(sql, (ids, ids, ids))}

    # multipart -------------------------------------------------------------
    def insert_upload(self, info: UploadInfo) -> None:
        self._count(
            "INSERT INTO uploads (upload_id, bucket, key, initiated, content_type, metadata, headers, tags, lock)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (info.upload_id, info.bucket, key_bytes(info.key), info.initiated, info.content_type,
             dumps(info.metadata), dumps(info.headers), dumps(info.tags), lock_dumps(info.retention)))

    def put_part(self, upload_id: str, record: PartRecord) -> None:
        p = record.info
        self._count("DELETE FROM part_copies WHERE upload_id = %s AND file IN (SELECT file FROM parts"
                    " WHERE upload_id = %s AND part_number = %s)", (upload_id, upload_id, p.part_number))
        self._count(
            "INSERT INTO parts (upload_id, part_number, etag, size, last_modified, file, checksums)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (upload_id, part_number) DO UPDATE SET"
            " etag = excluded.etag, size = excluded.size, last_modified = excluded.last_modified,"
            " file = excluded.file, checksums = excluded.checksums",
            (upload_id, p.part_number, p.etag, p.size, p.last_modified, record.file, dumps(p.checksums)))

    def delete_upload(self, upload_id: str) -> None:
        self._count("DELETE FROM part_copies WHERE upload_id = %s", (upload_id,))
        self._count("DELETE FROM parts WHERE upload_id = %s", (upload_id,))
        self._count("DELETE FROM uploads WHERE upload_id = %s", (upload_id,))

    def insert_completed(self, record: CompletedUpload) -> None:
        parts = [[p.part_number, p.etag, p.size, p.last_modified, p.checksums] for p in record.parts]
        self._count(
            "INSERT INTO completed_uploads (upload_id, bucket, key, etag, blob_id, completed, parts)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (upload_id) DO UPDATE SET bucket = excluded.bucket,"
            " key = excluded.key, etag = excluded.etag, blob_id = excluded.blob_id,"
            " completed = excluded.completed, parts = excluded.parts",
            (record.upload_id, record.bucket, key_bytes(record.key), record.etag, record.blob_id, record.completed,
             json.dumps(parts, separators=(",", ":"), ensure_ascii=False)))

    def prune_completed(self, before: float) -> int:
        return self._count(
            "DELETE FROM completed_uploads WHERE completed < %s AND NOT EXISTS (SELECT 1 FROM objects AS o"
            " WHERE o.bucket = completed_uploads.bucket AND o.key = completed_uploads.key"
            " AND o.blob_id = completed_uploads.blob_id) AND NOT EXISTS (SELECT 1 FROM versions AS v"
            " WHERE v.bucket = completed_uploads.bucket AND v.key = completed_uploads.key"
            " AND v.blob_id = completed_uploads.blob_id)", (before,))

    # chunks and manifests ----------------------------------------------------
    def insert_chunk(self, record: ChunkRecord, refs: int, bucket: str = "") -> None:
        r = record
        self._count(f"WITH c AS (INSERT INTO chunks ({CHUNK_COLS}, refs, bucket)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING stored)"
                    " INSERT INTO chunk_usage (bucket, stored, chunks) SELECT %s, stored, 1 FROM c"
                    " ON CONFLICT (bucket) DO UPDATE SET stored = chunk_usage.stored + excluded.stored,"
                    " chunks = chunk_usage.chunks + excluded.chunks",
                    (r.chunk_id, r.file, r.file_offset, r.stored, r.size, r.codec, r.digest, r.sums, r.domain,
                     r.sum_kind, r.holder or self._holder, refs, bucket, bucket))

    def add_chunk_refs(self, chunk_id: str, n: int) -> bool:
        return self._count("UPDATE chunks SET refs = refs + %s WHERE chunk_id = %s", (n, chunk_id)) == 1

    def insert_manifest(self, blob_id: str, size: int, chunk_ids: list[str]) -> None:
        self._count("INSERT INTO manifests (blob_id, size, chunks) VALUES (%s, %s, %s)",
                    (blob_id, size, len(chunk_ids)))
        self._many("INSERT INTO manifest_chunks (blob_id, seq, chunk_id) VALUES (%s, %s, %s)",
                   [(blob_id, i, cid) for i, cid in enumerate(chunk_ids)])

    def release_manifest(self, blob_id: str) -> tuple[list[str], int]:
        uses = Counter(r[0] for r in self._rows("DELETE FROM manifest_chunks WHERE blob_id = %s RETURNING chunk_id",
                                                (blob_id,)))
        self._count("DELETE FROM manifests WHERE blob_id = %s", (blob_id,))
        files: set[str] = set()
        freed: Counter[str] = Counter()
        gone: Counter[str] = Counter()
        for cid, n in uses.items():
            self._count("UPDATE chunks SET refs = refs - %s WHERE chunk_id = %s", (n, cid))
            for file, stored, bucket in self._rows("DELETE FROM chunks WHERE chunk_id = %s AND refs <= 0"
                                                   " RETURNING file, stored, bucket", (cid,)):
                self._count("DELETE FROM damaged_chunks WHERE chunk_id = %s", (cid,))
                files.add(file)
                freed[bucket] += stored
                gone[bucket] += 1
        for bucket, stored in freed.items():
            self._add_chunk_usage(bucket, -stored, -gone[bucket])
        free = [f for f in files if not self._rows("SELECT 1 FROM chunks WHERE file = %s LIMIT 1", (f,))]
        if free:  # other nodes' copies: each node deletes its own file (docs/cluster.md)
            self._count("DELETE FROM file_copies WHERE file = ANY(%s)", (free,))
        return free, sum(freed.values())

    def add_file_copies(self, file: str, nodes: list[str]) -> None:
        for node in nodes:
            self._count("INSERT INTO file_copies (file, node) SELECT %s, %s WHERE EXISTS"
                        " (SELECT 1 FROM chunks WHERE file = %s) ON CONFLICT (file, node) DO NOTHING",
                        (file, node, file))

    def add_part_copies(self, upload_id: str, file: str, nodes: list[str]) -> None:
        """Record that ``nodes`` hold a copy of part file ``file`` of an upload (while
        a part row of the open upload names it; none otherwise)."""
        for node in nodes:
            self._count("INSERT INTO part_copies (upload_id, file, node) SELECT %s, %s, %s WHERE EXISTS"
                        " (SELECT 1 FROM parts WHERE upload_id = %s AND file = %s)"
                        " ON CONFLICT (upload_id, file, node) DO NOTHING", (upload_id, file, node, upload_id, file))

    def repair_chunk(self, chunk_id: str, record: ChunkRecord) -> str | None:
        rows = self._rows("SELECT file FROM chunks WHERE chunk_id = %s", (chunk_id,))
        if not rows:
            return None
        r = record
        self._count("UPDATE chunks SET file = %s, file_offset = %s, stored = %s, codec = %s, sums = %s,"
                    " sum_kind = %s, holder = %s WHERE chunk_id = %s",
                    (r.file, r.file_offset, r.stored, r.codec, r.sums, r.sum_kind, r.holder or self._holder,
                     chunk_id))
        self._count("DELETE FROM damaged_chunks WHERE chunk_id = %s", (chunk_id,))
        return rows[0][0]

    def mark_damaged(self, chunk_id: str, reason: str, when: float) -> None:
        self._count("INSERT INTO damaged_chunks (chunk_id, reason, found) VALUES (%s, %s, %s)"
                    " ON CONFLICT (chunk_id) DO NOTHING", (chunk_id, reason, when))

    def clear_damaged(self, chunk_id: str) -> None:
        self._count("DELETE FROM damaged_chunks WHERE chunk_id = %s", (chunk_id,))
