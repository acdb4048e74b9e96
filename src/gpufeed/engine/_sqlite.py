"""The SQLite catalog: schema, connections, the single-writer transaction, and
every metadata operation of :class:`gpufeed.engine.catalog.Catalog` as SQL.

Why SQLite and these settings: the catalog must make a write visible
atomically and durably (one ``COMMIT`` is the moment an object exists), serve
many concurrent point lookups (the fast-path server looks an object up per
request) and list keys in UTF-8 byte order. SQLite in WAL mode does all three
in-process: readers never block the writer nor each other, and ``TEXT``
compared with the default ``BINARY`` collation is ``memcmp`` of UTF-8, which
is exactly S3's listing order.

Threads: every thread gets its own read connection (``threading.local``),
opened once, in autocommit mode, so each statement reads the latest committed
state; all writes go through one connection guarded by a lock
(:meth:`SqliteCatalog.write`). Statements are prepared once per connection by the
``sqlite3`` statement cache. Source: https://www.sqlite.org/wal.html
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import weakref
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager

from ..errors import InternalError, InvalidArgument
from ._catalogcheck import require_healthy
from ._private import create_private_file
from ._schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, add_columns
from ._sqlite_snapshots import SnapshotReads, SnapshotWrites
from ._sqlitechunks import ChunkReads, ChunkWrites
from .catalog import Catalog, CatalogReader, CatalogWriter, CompletedUpload, LiveFiles, ObjectUse, PartRecord
from .types import (
    DEFAULT_TENANT,
    AccessKeyInfo,
    BucketInfo,
    LifecycleRule,
    ObjectInfo,
    PartInfo,
    Retention,
    TenantInfo,
    UploadInfo,
)

__all__ = ["SqliteCatalog", "SCHEMA_VERSION"]

_MMAP_BYTES = 256 << 20  # 256 MiB of the catalog file mapped per connection
_BUSY_TIMEOUT_S = 30.0
_OBJECT_CACHE_ROWS = 1024  # rows each reading thread keeps in SqliteCatalog.object's cache (about 1 MB)

_BUCKET_COLS = ("SELECT name, created, kind, capacity_bytes, ttl_s, versioning, object_lock, lock_mode,"
                " lock_days, lock_years, owner, etag_policy FROM buckets")
#: The columns of a version after its key, in :meth:`_Reads._object_info` order.
_VERSION_COLS = ("size, etag, last_modified, content_type, metadata, checksums, blob_id, headers,"
                 " version_id, seq, lock_mode, lock_until, legal_hold, tags")
_SQL_HEAD = f"SELECT {_VERSION_COLS} FROM objects WHERE bucket=? AND key=?"
_OBJ_COLS = "key, " + _VERSION_COLS
#: A versions row: key, the version columns, delete_marker, latest.
_NONCURRENT_COLS = f"key, {_VERSION_COLS}, delete_marker, latest"
_UPLOAD_COLS = "SELECT key, upload_id, initiated, content_type, metadata, headers, tags, lock FROM uploads"
_IDLE_UPLOADS_SQL = (
    "SELECT u.bucket, u.key, u.upload_id, u.initiated, u.content_type, u.metadata, u.headers, u.tags, u.lock"
    " FROM uploads AS u LEFT JOIN parts AS p ON p.upload_id = u.upload_id"
    " GROUP BY u.upload_id HAVING MAX(u.initiated, COALESCE(MAX(p.last_modified), u.initiated)) < ?"
    " ORDER BY u.bucket, u.key, u.initiated"
)
_RULE_FIELDS = frozenset(f.name for f in dataclasses.fields(LifecycleRule))
_SCAN_SQL: dict[tuple[bool, bool], str] = {}


def _dumps(d: dict[str, str]) -> str:
    """A ``str -> str`` map as stored: compact JSON, ``''`` when empty (the caller checked the types)."""
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False) if d else ""


def _loads(s: str) -> dict[str, str]:
    return json.loads(s) if s else {}


def _rules_dumps(rules: list[LifecycleRule]) -> str:
    return json.dumps([dataclasses.asdict(r) for r in rules], separators=(",", ":"), ensure_ascii=False)


def _rules_loads(s: str) -> list[LifecycleRule]:
    """Stored rules; fields a later gpufeed added and this one lacks are ignored
    (the schema version guards against that), missing ones take their defaults."""
    return [LifecycleRule(**{k: v for k, v in d.items() if k in _RULE_FIELDS}) for d in json.loads(s)]


def _no_path(blob_id: str) -> str:
    return ""


def _bucket(row) -> BucketInfo:
    name, created, kind, cap, ttl, versioning, lock, mode, days, years, owner, etag_policy = row
    return BucketInfo(name, created, kind, cap, ttl, versioning, bool(lock), mode, days, years, owner, etag_policy)


def _lock_dumps(r: Retention) -> str:
    return "" if r == Retention() else json.dumps([r.mode, r.until, r.legal_hold])


def _lock_loads(s: str) -> Retention:
    if not s:
        return Retention()
    mode, until, hold = json.loads(s)
    return Retention(mode, until, hold)


def _upload(bucket: str, row) -> UploadInfo:
    key, upload_id, initiated, ct, md, hd, tags, lock = row
    return UploadInfo(bucket, key, upload_id, initiated, ct, _loads(md), _loads(hd), _loads(tags), _lock_loads(lock))


def _version_values(info: ObjectInfo) -> tuple:
    """The values of :data:`_VERSION_COLS` for ``info``."""
    return (info.size, info.etag, info.last_modified, info.content_type, _dumps(info.metadata),
            _dumps(info.checksums), info.blob_id, _dumps(info.headers), info.version_id, info.seq,
            info.lock_mode, info.lock_until, int(info.legal_hold), _dumps(info.tags))


class _Reads(ChunkReads, SnapshotReads, CatalogReader):
    """The read operations as SQL over :meth:`_conn` (one connection or this thread's)."""

    _blob_path: Callable[[str], str]

    def _conn(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _object_info(self, bucket: str, key: str, row, delete_marker: bool = False,
                     is_latest: bool = True) -> ObjectInfo:
        size, etag, lm, ct, md, ck, blob, hd, vid, seq, mode, until, hold, tags = row
        return ObjectInfo(bucket, key, size, etag, lm, ct, _loads(md), _loads(ck), blob,
                          self._blob_path(blob) if blob else "", _loads(hd), vid, seq, delete_marker,
                          is_latest, mode, until, bool(hold), _loads(tags))

    def _noncurrent(self, bucket: str, row) -> ObjectInfo:
        return self._object_info(bucket, row[0], row[1:-2], bool(row[-2]), bool(row[-1]))

    def bucket(self, name: str) -> BucketInfo | None:
        rows = self._conn().execute(_BUCKET_COLS + " WHERE name=?", (name,)).fetchall()
        return _bucket(rows[0]) if rows else None

    def buckets(self) -> list[BucketInfo]:
        return [_bucket(r) for r in self._conn().execute(_BUCKET_COLS + " ORDER BY name").fetchall()]

    def bucket_usage(self, name: str) -> tuple[int, int]:
        size, count = self._conn().execute(
            "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM objects WHERE bucket=?", (name,)).fetchone()
        return size, count

    def bucket_has_objects(self, name: str) -> bool:
        c = self._conn()
        return bool(c.execute("SELECT 1 FROM objects WHERE bucket=? LIMIT 1", (name,)).fetchall()
                    or c.execute("SELECT 1 FROM versions WHERE bucket=? LIMIT 1", (name,)).fetchall())

    def bucket_has_uploads(self, name: str) -> bool:
        return bool(self._conn().execute("SELECT 1 FROM uploads WHERE bucket=? LIMIT 1", (name,)).fetchall())

    def object(self, bucket: str, key: str) -> ObjectInfo | None:
        try:
            rows = self._conn().execute(_SQL_HEAD, (bucket, key)).fetchall()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"object key {key!r} is not valid UTF-8") from exc
        return self._object_info(bucket, key, rows[0]) if rows else None

    def scan_objects(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                     limit: int) -> Generator[ObjectInfo, None, None]:
        sig = (inclusive, end is None)
        sql = _SCAN_SQL.get(sig)
        if sql is None:
            lo = "key >= ?" if inclusive else "key > ?"
            up = "" if end is None else " AND key < ?"
            sql = _SCAN_SQL[sig] = f"SELECT {_OBJ_COLS} FROM objects WHERE bucket=? AND {lo}{up} ORDER BY key LIMIT ?"
        args = (bucket, start, limit) if end is None else (bucket, start, end, limit)
        cur = self._conn().execute(sql, args)
        try:
            for row in cur:
                yield self._object_info(bucket, row[0], row[1:])
        finally:
            cur.close()

    def version(self, bucket: str, key: str, version_id: str) -> ObjectInfo | None:
        c = self._conn()
        try:
            rows = c.execute(_SQL_HEAD + " AND version_id=?", (bucket, key, version_id)).fetchall()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"object key {key!r} is not valid UTF-8") from exc
        if rows:
            return self._object_info(bucket, key, rows[0])
        rows = c.execute(f"SELECT {_NONCURRENT_COLS} FROM versions WHERE bucket=? AND key=? AND version_id=?",
                         (bucket, key, version_id)).fetchall()
        return self._noncurrent(bucket, rows[0]) if rows else None

    def noncurrent(self, bucket: str, key: str, limit: int = 1) -> list[ObjectInfo]:
        rows = self._conn().execute(
            f"SELECT {_NONCURRENT_COLS} FROM versions WHERE bucket=? AND key=? ORDER BY seq DESC LIMIT ?",
            (bucket, key, limit)).fetchall()
        return [self._noncurrent(bucket, r) for r in rows]

    def scan_noncurrent(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                        limit: int) -> Generator[ObjectInfo, None, None]:
        lo = "key >= ?" if inclusive else "key > ?"
        up = "" if end is None else " AND key < ?"
        sql = f"SELECT {_NONCURRENT_COLS} FROM versions WHERE bucket=? AND {lo}{up} ORDER BY key, seq DESC LIMIT ?"
        args = (bucket, start, limit) if end is None else (bucket, start, end, limit)
        cur = self._conn().execute(sql, args)
        try:
            for row in cur:
                yield self._noncurrent(bucket, row)
        finally:
            cur.close()

    def object_uses(self, bucket: str) -> list[ObjectUse]:
        rows = self._conn().execute(
            "SELECT key, size, blob_id, last_modified, MAX(last_access, last_modified) AS used"
            " FROM objects WHERE bucket=? ORDER BY used, key", (bucket,),
        ).fetchall()
        return [ObjectUse(*r) for r in rows]

    def live_files(self) -> LiveFiles:
        c = self._conn()
        blobs = {r[0] for r in c.execute("SELECT blob_id FROM objects")}
        blobs.update(r[0] for r in c.execute("SELECT blob_id FROM versions WHERE delete_marker=0"))
        blobs.update(r[0] for r in c.execute("SELECT blob_id FROM snapshot_blobs"))
        parts: dict[str, set[str]] = {r[0]: set() for r in c.execute("SELECT upload_id FROM uploads")}
        for upload_id, file in c.execute("SELECT upload_id, file FROM parts"):
            parts.setdefault(upload_id, set()).add(file)
        return LiveFiles(blobs, parts)

    def upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo | None:
        rows = self._conn().execute(_UPLOAD_COLS + " WHERE upload_id=? AND bucket=? AND key=?",
                                    (upload_id, bucket, key)).fetchall()
        return _upload(bucket, rows[0]) if rows else None

    def uploads(self, bucket: str) -> list[UploadInfo]:
        rows = self._conn().execute(_UPLOAD_COLS + " WHERE bucket=? ORDER BY key, initiated", (bucket,)).fetchall()
        return [_upload(bucket, r) for r in rows]

    def parts(self, upload_id: str) -> list[PartRecord]:
        rows = self._conn().execute(
            "SELECT part_number, etag, size, last_modified, checksums, file FROM parts"
            " WHERE upload_id=? ORDER BY part_number",
            (upload_id,),
        ).fetchall()
        return [PartRecord(PartInfo(n, e, sz, lm, _loads(ck)), f) for n, e, sz, lm, ck, f in rows]

    def part_file(self, upload_id: str, part_number: int) -> str | None:
        rows = self._conn().execute(
            "SELECT file FROM parts WHERE upload_id=? AND part_number=?", (upload_id, part_number)
        ).fetchall()
        return rows[0][0] if rows else None

    def idle_uploads(self, before: float) -> list[UploadInfo]:
        rows = self._conn().execute(_IDLE_UPLOADS_SQL, (before,)).fetchall()
        return [_upload(r[0], r[1:]) for r in rows]

    def lifecycle(self, bucket: str) -> list[LifecycleRule] | None:
        rows = self._conn().execute("SELECT rules FROM lifecycle WHERE bucket=?", (bucket,)).fetchall()
        return _rules_loads(rows[0][0]) if rows else None

    def lifecycles(self) -> dict[str, list[LifecycleRule]]:
        rows = self._conn().execute("SELECT bucket, rules FROM lifecycle ORDER BY bucket").fetchall()
        return {b: _rules_loads(r) for b, r in rows}

    def quota(self, scope: str, name: str) -> tuple[int, int]:
        rows = self._conn().execute("SELECT bytes, objects FROM quotas WHERE scope=? AND name=?",
                                    (scope, name)).fetchall()
        return (rows[0][0], rows[0][1]) if rows else (0, 0)

    def usage(self, bucket: str) -> tuple[int, int]:
        rows = self._conn().execute("SELECT bytes, objects FROM usage WHERE bucket=?", (bucket,)).fetchall()
        return (rows[0][0], rows[0][1]) if rows else (0, 0)

    def parts_usage(self, bucket: str) -> int:
        return self._conn().execute(
            "SELECT COALESCE(SUM(p.size), 0) FROM parts AS p JOIN uploads AS u ON u.upload_id = p.upload_id"
            " WHERE u.bucket=?", (bucket,)).fetchone()[0]

    def tenant_parts_usage(self, tenant: str) -> int:
        owner = "" if tenant == DEFAULT_TENANT else tenant
        return self._conn().execute(
            "SELECT COALESCE(SUM(p.size), 0) FROM parts AS p JOIN uploads AS u ON u.upload_id = p.upload_id"
            " JOIN buckets AS b ON b.name = u.bucket WHERE b.owner=?", (owner,)).fetchone()[0]

    def tenant_usage(self, tenant: str) -> tuple[int, int]:
        owner = "" if tenant == DEFAULT_TENANT else tenant
        return self._conn().execute(
            "SELECT COALESCE(SUM(u.bytes), 0), COALESCE(SUM(u.objects), 0) FROM usage AS u"
            " JOIN buckets AS b ON b.name = u.bucket WHERE b.owner=?", (owner,)).fetchone()

    def tenant(self, name: str) -> TenantInfo | None:
        rows = self._conn().execute("SELECT name, created FROM tenants WHERE name=?", (name,)).fetchall()
        return TenantInfo(*rows[0]) if rows else None

    def tenants(self) -> list[TenantInfo]:
        return [TenantInfo(*r) for r in self._conn().execute("SELECT name, created FROM tenants ORDER BY name")]

    def access_key(self, access_key: str) -> tuple[AccessKeyInfo, str] | None:
        rows = self._conn().execute("SELECT access_key, tenant, created, revoked, secret FROM access_keys"
                                    " WHERE access_key=?", (access_key,)).fetchall()
        return (AccessKeyInfo(*rows[0][:4]), rows[0][4]) if rows else None

    def access_keys(self, tenant: str | None = None) -> list[AccessKeyInfo]:
        sql = "SELECT access_key, tenant, created, revoked FROM access_keys"
        rows = self._conn().execute(sql + " ORDER BY tenant, created, access_key") if tenant is None else \
            self._conn().execute(sql + " WHERE tenant=? ORDER BY created, access_key", (tenant,))
        return [AccessKeyInfo(*r) for r in rows]

    def bucket_config(self, bucket: str, name: str) -> str | None:
        rows = self._conn().execute("SELECT value FROM bucket_configs WHERE bucket=? AND name=?",
                                    (bucket, name)).fetchall()
        return rows[0][0] if rows else None

    def completed_upload(self, upload_id: str) -> CompletedUpload | None:
        rows = self._conn().execute(_COMPLETED_COLS + " WHERE upload_id=?", (upload_id,)).fetchall()
        return _completed(rows[0]) if rows else None

    def completion_of(self, blob_id: str) -> CompletedUpload | None:
        rows = self._conn().execute(_COMPLETED_COLS + " WHERE blob_id=?", (blob_id,)).fetchall()
        return _completed(rows[0]) if rows else None


_COMPLETED_COLS = "SELECT bucket, key, upload_id, etag, blob_id, completed, parts FROM completed_uploads"


def _completed(row) -> CompletedUpload:
    bucket, key, upload_id, etag, blob_id, completed, parts = row
    infos = tuple(PartInfo(n, e, sz, lm, ck) for n, e, sz, lm, ck in json.loads(parts))
    return CompletedUpload(bucket, key, upload_id, etag, blob_id, completed, infos)


class _View(_Reads):
    """Reads over one connection (inside a snapshot or the write transaction)."""

    def __init__(self, conn: sqlite3.Connection, blob_path: Callable[[str], str]) -> None:
        self._c = conn
        self._blob_path = blob_path

    def _conn(self) -> sqlite3.Connection:
        return self._c


class _Writer(ChunkWrites, SnapshotWrites, _View, CatalogWriter):
    """The open write transaction of a :class:`SqliteCatalog`."""

    def __init__(self, conn: sqlite3.Connection, blob_path: Callable[[str], str], hooks: list) -> None:
        super().__init__(conn, blob_path)
        self._hooks = hooks

    def on_commit(self, fn: Callable[[], None]) -> None:
        self._hooks.append(fn)

    def insert_bucket(self, info: BucketInfo) -> None:
        self._c.execute(
            "INSERT INTO buckets (name, created, kind, capacity_bytes, ttl_s, versioning, object_lock, lock_mode,"
            " lock_days, lock_years, owner, etag_policy) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info.name, info.created, info.kind, info.capacity_bytes, info.ttl_s, info.versioning,
             int(info.object_lock), info.lock_mode, info.lock_days, info.lock_years, info.owner, info.etag_policy))

    def insert_tenant(self, info: TenantInfo) -> None:
        self._c.execute("INSERT INTO tenants (name, created) VALUES (?, ?)", (info.name, info.created))

    def set_quota(self, scope: str, name: str, max_bytes: int, max_objects: int) -> None:
        if max_bytes or max_objects:
            self._c.execute("INSERT OR REPLACE INTO quotas (scope, name, bytes, objects) VALUES (?, ?, ?, ?)",
                            (scope, name, max_bytes, max_objects))
        else:
            self._c.execute("DELETE FROM quotas WHERE scope=? AND name=?", (scope, name))

    def delete_tenant(self, name: str) -> None:
        self._c.execute("DELETE FROM quotas WHERE scope='tenant' AND name=?", (name,))
        self._c.execute("DELETE FROM access_keys WHERE tenant=?", (name,))
        self._c.execute("DELETE FROM tenants WHERE name=?", (name,))

    def insert_access_key(self, info: AccessKeyInfo, sealed_secret: str) -> None:
        self._c.execute("INSERT INTO access_keys (access_key, tenant, secret, created, revoked) VALUES (?, ?, ?, ?, ?)",
                        (info.access_key, info.tenant, sealed_secret, info.created, info.revoked))

    def revoke_access_key(self, access_key: str, when: float) -> bool:
        return self._c.execute("UPDATE access_keys SET revoked=? WHERE access_key=? AND revoked=0",
                               (when, access_key)).rowcount > 0

    def set_bucket_versioning(self, name: str, state: str) -> None:
        self._c.execute("UPDATE buckets SET versioning=? WHERE name=?", (state, name))

    def set_bucket_lock(self, name: str, mode: str, days: int, years: int) -> None:
        self._c.execute("UPDATE buckets SET object_lock=1, lock_mode=?, lock_days=?, lock_years=? WHERE name=?",
                        (mode, days, years, name))

    def set_bucket_limits(self, name: str, capacity_bytes: int, ttl_s: float) -> None:
        self._c.execute("UPDATE buckets SET capacity_bytes=?, ttl_s=? WHERE name=?", (capacity_bytes, ttl_s, name))

    def delete_bucket(self, name: str) -> None:
        self._c.execute("DELETE FROM buckets WHERE name=?", (name,))
        self._c.execute("DELETE FROM lifecycle WHERE bucket=?", (name,))
        self._c.execute("DELETE FROM bucket_configs WHERE bucket=?", (name,))
        self._c.execute("DELETE FROM usage WHERE bucket=?", (name,))
        self._c.execute("DELETE FROM quotas WHERE scope='bucket' AND name=?", (name,))

    def set_lifecycle(self, bucket: str, rules: list[LifecycleRule]) -> None:
        self._c.execute("INSERT OR REPLACE INTO lifecycle (bucket, rules) VALUES (?, ?)",
                        (bucket, _rules_dumps(rules)))

    def delete_lifecycle(self, bucket: str) -> bool:
        return self._c.execute("DELETE FROM lifecycle WHERE bucket=?", (bucket,)).rowcount > 0

    def set_bucket_config(self, bucket: str, name: str, value: str) -> None:
        self._c.execute("INSERT OR REPLACE INTO bucket_configs (bucket, name, value) VALUES (?, ?, ?)",
                        (bucket, name, value))

    def delete_bucket_config(self, bucket: str, name: str) -> bool:
        return self._c.execute("DELETE FROM bucket_configs WHERE bucket=? AND name=?",
                               (bucket, name)).rowcount > 0

    def put_object(self, info: ObjectInfo) -> None:
        self._c.execute(
            f"INSERT OR REPLACE INTO objects (bucket, key, {_VERSION_COLS}, last_access)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info.bucket, info.key, *_version_values(info), info.last_modified),
        )

    def insert_noncurrent(self, info: ObjectInfo) -> None:
        self._c.execute(
            f"INSERT INTO versions (bucket, key, {_VERSION_COLS}, delete_marker, latest)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info.bucket, info.key, *_version_values(info), int(info.delete_marker),
             int(info.delete_marker and info.is_latest)),
        )

    def delete_noncurrent(self, bucket: str, key: str, version_id: str) -> bool:
        return self._c.execute("DELETE FROM versions WHERE bucket=? AND key=? AND version_id=?",
                               (bucket, key, version_id)).rowcount > 0

    def set_latest_marker(self, bucket: str, key: str, version_id: str | None) -> None:
        self._c.execute("UPDATE versions SET latest=0 WHERE bucket=? AND key=? AND latest=1", (bucket, key))
        if version_id is not None:
            self._c.execute("UPDATE versions SET latest=1 WHERE bucket=? AND key=? AND version_id=?"
                            " AND delete_marker=1", (bucket, key, version_id))

    def update_version(self, info: ObjectInfo) -> bool:
        args = (info.lock_mode, info.lock_until, int(info.legal_hold), _dumps(info.tags),
                info.bucket, info.key, info.version_id)
        sets = "SET lock_mode=?, lock_until=?, legal_hold=?, tags=? WHERE bucket=? AND key=? AND version_id=?"
        if self._c.execute("UPDATE objects " + sets, args).rowcount:
            return True
        return self._c.execute("UPDATE versions " + sets, args).rowcount > 0

    def delete_object(self, bucket: str, key: str, blob_id: str | None = None) -> bool:
        if blob_id is None:
            cur = self._c.execute("DELETE FROM objects WHERE bucket=? AND key=?", (bucket, key))
        else:
            cur = self._c.execute("DELETE FROM objects WHERE bucket=? AND key=? AND blob_id=?", (bucket, key, blob_id))
        return cur.rowcount > 0

    def delete_versions(self, bucket: str, versions: list[tuple[str, str]]) -> None:
        self._c.executemany("DELETE FROM objects WHERE bucket=? AND key=? AND blob_id=?",
                            [(bucket, k, b) for k, b in versions])

    def set_last_used(self, bucket: str, times: dict[str, float]) -> None:
        self._c.executemany("UPDATE objects SET last_access=? WHERE bucket=? AND key=?",
                            [(t, bucket, k) for k, t in times.items()])

    def insert_upload(self, info: UploadInfo) -> None:
        self._c.execute(
            "INSERT INTO uploads (upload_id, bucket, key, initiated, content_type, metadata, headers, tags, lock)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info.upload_id, info.bucket, info.key, info.initiated, info.content_type,
             _dumps(info.metadata), _dumps(info.headers), _dumps(info.tags), _lock_dumps(info.retention)),
        )

    def put_part(self, upload_id: str, record: PartRecord) -> None:
        p = record.info
        self._c.execute(
            "INSERT OR REPLACE INTO parts (upload_id, part_number, etag, size, last_modified, file,"
            " checksums) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (upload_id, p.part_number, p.etag, p.size, p.last_modified, record.file, _dumps(p.checksums)),
        )

    def delete_upload(self, upload_id: str) -> None:
        self._c.execute("DELETE FROM parts WHERE upload_id=?", (upload_id,))
        self._c.execute("DELETE FROM uploads WHERE upload_id=?", (upload_id,))

    def insert_completed(self, record: CompletedUpload) -> None:
        parts = [[p.part_number, p.etag, p.size, p.last_modified, p.checksums] for p in record.parts]
        self._c.execute(
            "INSERT OR REPLACE INTO completed_uploads (upload_id, bucket, key, etag, blob_id, completed, parts)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.upload_id, record.bucket, record.key, record.etag, record.blob_id, record.completed,
             json.dumps(parts, separators=(",", ":"), ensure_ascii=False)),
        )

    def prune_completed(self, before: float) -> int:
        cur = self._c.execute(
            "DELETE FROM completed_uploads WHERE completed < ? AND NOT EXISTS (SELECT 1 FROM objects o"
            " WHERE o.bucket=completed_uploads.bucket AND o.key=completed_uploads.key"
            " AND o.blob_id=completed_uploads.blob_id) AND NOT EXISTS (SELECT 1 FROM versions v"
            " WHERE v.bucket=completed_uploads.bucket AND v.key=completed_uploads.key"
            " AND v.blob_id=completed_uploads.blob_id)", (before,))
        return cur.rowcount


class SqliteCatalog(_Reads, Catalog):
    """The catalog in ``catalog.sqlite3``: connections, transactions and the SQL of every operation.

    Plain reads use this thread's read connection; :meth:`object` (the hot
    path) reuses one cursor per thread.

    Args:
        path: the database file.
        fsync: ``synchronous=FULL`` (every commit is durable) when true,
            ``NORMAL`` otherwise (durable at checkpoints; still atomic).
        blob_path: maps a blob id to its data file (fills :attr:`ObjectInfo.path`);
            by default paths are ``""``.
        check: the integrity check run before anything else touches the file:
            ``"quick"``, ``"full"`` or ``"off"`` (:mod:`._catalogcheck`).

    Attributes:
        commit_listeners: called after every commit of :meth:`write` and its own hooks
            (which drop cached policies and keys), under the write lock (lease counter).

    Raises:
        CatalogDamaged: the check found damage; the file is left unchanged.
        CatalogTooNew: a newer gpufeed wrote the catalog.
        InternalError: the file is not a gpufeed catalog or cannot be opened.
    """

    def __init__(self, path: str, *, fsync: bool, blob_path: Callable[[str], str] = _no_path,
                 check: str = "quick") -> None:
        self._blob_path, self._path, self._closed = blob_path, path, False
        self._wlock, self._rlock, self._local = threading.Lock(), threading.Lock(), threading.local()
        self.commit_listeners: list[Callable[[], None]] = []
        self._readers: dict[int, tuple[weakref.ref[threading.Thread], sqlite3.Connection]] = {}
        try:
            if path != ":memory:" and not path.startswith("file:"):
                require_healthy(path, check)
                # SQLite makes the database 0644 and its -wal/-shm files with the
                # database's mode: creating it 0600 first keeps all three private.
                create_private_file(path)
            w = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)
        except (sqlite3.Error, OSError) as exc:
            raise InternalError(f"cannot open catalog {path}: {exc}") from exc
        try:
            mode = w.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise InternalError(f"catalog {path}: cannot enable WAL (got {mode!r})")
            w.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            w.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")
            w.execute("PRAGMA recursive_triggers=ON")  # INSERT OR REPLACE fires the usage delete trigger
            version = w.execute("PRAGMA user_version").fetchone()[0]
            if not 0 <= version <= SCHEMA_VERSION:
                raise InternalError(f"catalog {path} has schema version {version}, newer than this gpufeed's "
                                    f"{SCHEMA_VERSION}; open it with a newer gpufeed")
            steps = " ".join(MIGRATIONS[v] for v in range(max(version, 1), SCHEMA_VERSION))
            w.executescript(f"BEGIN IMMEDIATE; {SCHEMA} {steps} PRAGMA user_version={SCHEMA_VERSION};")
            try:
                add_columns(w)
            except BaseException:
                w.execute("ROLLBACK")
                raise
            w.execute("COMMIT")
        except BaseException as exc:
            w.close()
            if isinstance(exc, sqlite3.Error):
                raise InternalError(f"cannot open catalog {path}: {exc}") from exc
            raise
        self._writer = w

    # reading ------------------------------------------------------------
    def reader(self) -> sqlite3.Connection:
        """This thread's read connection (autocommit; ``query_only``).

        Raises:
            InternalError: the catalog is closed.
        """
        try:
            return self._local.conn
        except AttributeError:
            return self._new_reader()

    def lookup_cursor(self) -> sqlite3.Cursor:
        """This thread's cursor for single-row point lookups (saves making a
        cursor per call on the hot path). Callers must consume its result
        fully (``fetchall``) before the thread uses it again.

        Raises:
            InternalError: the catalog is closed.
        """
        try:
            return self._local.cur
        except AttributeError:
            self._local.cur = cur = self.reader().cursor()
            return cur

    def _new_reader(self) -> sqlite3.Connection:
        with self._rlock:
            if self._closed:
                raise InternalError("the engine is closed")
            # Connections of threads that have ended are closed here, so a
            # program that churns threads does not pile up open databases.
            for ident, (ref, c) in list(self._readers.items()):
                t = ref()
                if t is None or not t.is_alive():
                    c.close()
                    del self._readers[ident]
            c = sqlite3.connect(
                self._path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
            )
            c.execute("PRAGMA query_only=ON")
            c.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")
            me = threading.current_thread()
            self._readers[id(c)] = (weakref.ref(me), c)
            self._local.conn = c
            return c

    def _conn(self) -> sqlite3.Connection:
        return self.reader()

    def object(self, bucket: str, key: str) -> ObjectInfo | None:
        """The current version's row of ``bucket/key`` (``None``: none). Repeats come from a per-thread
        cache, dropped when ``PRAGMA data_version`` shows a commit by any other connection or process."""
        cur, local = self.lookup_cursor(), self._local
        version = cur.execute("PRAGMA data_version").fetchall()[0][0]
        cache = getattr(local, "objects", None)
        if cache is None or local.objects_version != version or len(cache) >= _OBJECT_CACHE_ROWS:
            cache = local.objects = {}
            local.objects_version = version
        hit = cache.get((bucket, key), cache)  # the dict itself: not cached
        if hit is not cache:
            return hit
        try:
            rows = cur.execute(_SQL_HEAD, (bucket, key)).fetchall()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"object key {key!r} is not valid UTF-8") from exc
        info = cache[(bucket, key)] = self._object_info(bucket, key, rows[0]) if rows else None
        return info

    @contextmanager
    def snapshot(self) -> Iterator[CatalogReader]:
        """A read transaction on this thread's read connection: every read
        inside sees one committed state."""
        c = self.reader()
        c.execute("BEGIN")
        try:
            yield _View(c, self._blob_path)
        finally:
            c.execute("COMMIT")

    # writing ------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[CatalogWriter]:
        """The one write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``).

        Commits when the block ends normally, rolls back on an exception. Only
        one thread writes at a time. Hooks given to
        :meth:`CatalogWriter.on_commit` run after the commit, under the write lock.

        Raises:
            InternalError: SQLite failed (disk full, I/O error); translated
                from ``sqlite3.Error``.
        """
        with self._wlock:
            if self._closed:
                raise InternalError("the engine is closed")
            w = self._writer
            hooks: list[Callable[[], None]] = []
            try:
                w.execute("BEGIN IMMEDIATE")
                try:
                    yield _Writer(w, self._blob_path, hooks)
                except BaseException:
                    w.execute("ROLLBACK")
                    raise
                w.execute("COMMIT")
            except sqlite3.Error as exc:
                if w.in_transaction:
                    w.execute("ROLLBACK")
                raise InternalError(f"catalog write failed: {exc}") from exc
            for fn in (*hooks, *self.commit_listeners):
                fn()

    def close(self) -> None:
        """Close every connection; idempotent. Later calls raise InternalError."""
        with self._wlock, self._rlock:
            if self._closed:
                return
            self._closed = True
            self._local = threading.local()
            for _, c in self._readers.values():
                c.close()
            self._readers.clear()
            try:
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # a reader elsewhere may still hold the WAL; the next open recovers it
            self._writer.close()

