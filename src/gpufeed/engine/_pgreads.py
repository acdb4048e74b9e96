"""The read operations of the PostgreSQL catalog: every method of
:class:`~gpufeed.engine.catalog.CatalogReader` as SQL over ``self._rows``.

Mixed into :class:`~gpufeed.engine._postgres.PostgresCatalog` (where
``_rows`` borrows a pooled connection per statement, so each statement sees
the latest commit) and into its snapshot and write views (where ``_rows``
runs on the transaction's own connection). Object keys are stored as their
UTF-8 bytes (``BYTEA``, see :mod:`._pgschema`): :func:`key_bytes` encodes
them on the way in and rows decode them on the way out.

Range scans read in pages of at most :data:`PAGE_ROWS` rows, each page a
statement of its own after the last key seen, so an abandoned scan holds no
connection and no lock (inside a snapshot every page sees the snapshot's state).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Generator, Iterator

from ..errors import InvalidArgument
from ._pgcopies import PgCopyReads
from .catalog import CompletedUpload, LiveFiles, ObjectUse, PartRecord
from .types import (
    DEFAULT_TENANT,
    AccessKeyInfo,
    BucketInfo,
    ChunkRecord,
    LifecycleRule,
    ObjectInfo,
    PartInfo,
    Retention,
    SnapshotInfo,
    TenantInfo,
    UploadInfo,
)

__all__ = ["PgReads", "key_bytes", "dumps", "lock_dumps", "rules_dumps", "VERSION_COLS", "CHUNK_COLS",
           "PAGE_ROWS"]

#: Most rows one statement of a range scan reads.
PAGE_ROWS = 1024
#: The columns of a version after its key, in :meth:`PgReads._info` order.
VERSION_COLS = ("size, etag, last_modified, content_type, metadata, checksums, blob_id, headers,"
                " version_id, seq, lock_mode, lock_until, legal_hold, tags")
CHUNK_COLS = "chunk_id, file, file_offset, stored, size, codec, digest, sums, domain, sum_kind, holder"
_BUCKET_SQL = ("SELECT name, created, kind, capacity_bytes, ttl_s, versioning, object_lock, lock_mode,"
               " lock_days, lock_years, owner, etag_policy FROM buckets")
_NONCURRENT_COLS = f"key, {VERSION_COLS}, delete_marker, latest"
_UPLOAD_SQL = "SELECT key, upload_id, initiated, content_type, metadata, headers, tags, lock FROM uploads"
_COMPLETED_SQL = "SELECT bucket, key, upload_id, etag, blob_id, completed, parts FROM completed_uploads"
_SNAP_SQL = "SELECT bucket, name, created, kind, objects, bytes FROM snapshots"
_RULE_FIELDS = frozenset(f.name for f in dataclasses.fields(LifecycleRule))


def key_bytes(key: str) -> bytes:
    """``key`` as stored: its UTF-8 bytes.

    Raises:
        InvalidArgument: ``key`` is not valid UTF-8 (it holds a lone surrogate).
    """
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"object key {key!r} is not valid UTF-8") from exc


def _key(b: bytes) -> str:
    return bytes(b).decode("utf-8")


def dumps(d: dict[str, str]) -> str:
    """A ``str -> str`` map as stored: compact JSON, ``''`` when empty."""
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False) if d else ""


def _loads(s: str) -> dict[str, str]:
    return json.loads(s) if s else {}


def rules_dumps(rules: list[LifecycleRule]) -> str:
    """Lifecycle rules as stored: a JSON list of their fields, in order."""
    return json.dumps([dataclasses.asdict(r) for r in rules], separators=(",", ":"), ensure_ascii=False)


def _rules_loads(s: str) -> list[LifecycleRule]:
    return [LifecycleRule(**{k: v for k, v in d.items() if k in _RULE_FIELDS}) for d in json.loads(s)]


def lock_dumps(r: Retention) -> str:
    """An upload's retention as stored: ``''`` for none, else JSON ``[mode, until, legal_hold]``."""
    return "" if r == Retention() else json.dumps([r.mode, r.until, r.legal_hold])


def _lock_loads(s: str) -> Retention:
    if not s:
        return Retention()
    mode, until, hold = json.loads(s)
    return Retention(mode, until, hold)


def _bucket(row: tuple) -> BucketInfo:
    name, created, kind, cap, ttl, versioning, lock, mode, days, years, owner, etag_policy = row
    return BucketInfo(name, created, kind, cap, ttl, versioning, bool(lock), mode, days, years, owner, etag_policy)


def _upload(bucket: str, row: tuple) -> UploadInfo:
    key, upload_id, initiated, ct, md, hd, tags, lock = row
    return UploadInfo(bucket, _key(key), upload_id, initiated, ct, _loads(md), _loads(hd), _loads(tags),
                      _lock_loads(lock))


def _completed(row: tuple) -> CompletedUpload:
    bucket, key, upload_id, etag, blob_id, completed, parts = row
    infos = tuple(PartInfo(n, e, sz, lm, ck) for n, e, sz, lm, ck in json.loads(parts))
    return CompletedUpload(bucket, _key(key), upload_id, etag, blob_id, completed, infos)


def _chunk(row: tuple) -> ChunkRecord:
    cid, file, off, stored, size, codec, digest, sums, domain, kind, holder = row
    return ChunkRecord(cid, file, off, stored, size, codec, bytes(digest), bytes(sums), domain, kind, holder)


class PgReads(PgCopyReads):
    """Every read of the catalog interface, over :meth:`_rows`."""

    _blob_path: Callable[[str], str]
    #: The node id new chunks are recorded as held by, and whose files
    #: :meth:`data_files` lists (the data folder's id; ``""`` without one).
    _holder: str = ""

    def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        """Run one statement; its rows."""
        raise NotImplementedError

    def _info(self, bucket: str, key: str, row: tuple, delete_marker: bool = False,
              is_latest: bool = True) -> ObjectInfo:
        size, etag, lm, ct, md, ck, blob, hd, vid, seq, mode, until, hold, tags = row
        return ObjectInfo(bucket, key, size, etag, lm, ct, _loads(md), _loads(ck), blob,
                          self._blob_path(blob) if blob else "", _loads(hd), vid, seq, delete_marker,
                          is_latest, mode, until, bool(hold), _loads(tags))

    def _noncurrent(self, bucket: str, row: tuple) -> ObjectInfo:
        return self._info(bucket, _key(row[0]), row[1:-2], bool(row[-2]), bool(row[-1]))

    def _pages(self, select: str, head: tuple, start: str, end: str | None, limit: int,
               inclusive: bool) -> Iterator[tuple]:
        """Rows of ``select`` (``SELECT key, ... WHERE <conditions on head>``) whose key
        is after ``start`` (or at it, when ``inclusive``) and before ``end``, by key, at
        most ``limit``, read :data:`PAGE_ROWS` at a time."""
        after, op = key_bytes(start), ">=" if inclusive else ">"
        up = "" if end is None else " AND key < %s"
        tail = () if end is None else (key_bytes(end),)
        left = limit
        while left > 0:
            n = min(left, PAGE_ROWS)
            rows = self._rows(f"{select} AND key {op} %s{up} ORDER BY key LIMIT %s", (*head, after, *tail, n))
            yield from rows
            if len(rows) < n:
                return
            left -= n
            after, op = rows[-1][0], ">"

    # buckets -------------------------------------------------------------
    def bucket(self, name: str) -> BucketInfo | None:
        rows = self._rows(_BUCKET_SQL + " WHERE name = %s", (name,))
        return _bucket(rows[0]) if rows else None

    def buckets(self) -> list[BucketInfo]:
        return [_bucket(r) for r in self._rows(_BUCKET_SQL + " ORDER BY name")]

    def bucket_usage(self, name: str) -> tuple[int, int]:
        size, count = self._rows("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM objects WHERE bucket = %s",
                                 (name,))[0]
        return int(size), int(count)

    def bucket_has_objects(self, name: str) -> bool:
        return bool(self._rows("SELECT 1 FROM objects WHERE bucket = %s LIMIT 1", (name,))
                    or self._rows("SELECT 1 FROM versions WHERE bucket = %s LIMIT 1", (name,)))

    def bucket_has_uploads(self, name: str) -> bool:
        return bool(self._rows("SELECT 1 FROM uploads WHERE bucket = %s LIMIT 1", (name,)))

    # objects -------------------------------------------------------------
    def object(self, bucket: str, key: str) -> ObjectInfo | None:
        rows = self._rows(f"SELECT {VERSION_COLS} FROM objects WHERE bucket = %s AND key = %s",
                          (bucket, key_bytes(key)))
        return self._info(bucket, key, rows[0]) if rows else None

    def scan_objects(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                     limit: int) -> Generator[ObjectInfo, None, None]:
        select = f"SELECT key, {VERSION_COLS} FROM objects WHERE bucket = %s"
        for row in self._pages(select, (bucket,), start, end, limit, inclusive):
            yield self._info(bucket, _key(row[0]), row[1:])

    def version(self, bucket: str, key: str, version_id: str) -> ObjectInfo | None:
        k = key_bytes(key)
        rows = self._rows(f"SELECT {VERSION_COLS} FROM objects WHERE bucket = %s AND key = %s AND version_id = %s",
                          (bucket, k, version_id))
        if rows:
            return self._info(bucket, key, rows[0])
        rows = self._rows(f"SELECT {_NONCURRENT_COLS} FROM versions WHERE bucket = %s AND key = %s"
                          " AND version_id = %s", (bucket, k, version_id))
        return self._noncurrent(bucket, rows[0]) if rows else None

    def noncurrent(self, bucket: str, key: str, limit: int = 1) -> list[ObjectInfo]:
        rows = self._rows(f"SELECT {_NONCURRENT_COLS} FROM versions WHERE bucket = %s AND key = %s"
                          " ORDER BY seq DESC LIMIT %s", (bucket, key_bytes(key), limit))
        return [self._noncurrent(bucket, r) for r in rows]

    def scan_noncurrent(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                        limit: int) -> Generator[ObjectInfo, None, None]:
        up = "" if end is None else " AND key < %s"
        tail = () if end is None else (key_bytes(end),)
        lo = "key >= %s" if inclusive else "key > %s"
        args: tuple = (bucket, key_bytes(start))
        left = limit
        while left > 0:
            n = min(left, PAGE_ROWS)
            rows = self._rows(f"SELECT {_NONCURRENT_COLS} FROM versions WHERE bucket = %s AND {lo}{up}"
                              " ORDER BY key, seq DESC LIMIT %s", (*args, *tail, n))
            for row in rows:
                yield self._noncurrent(bucket, row)
            if len(rows) < n:
                return
            left -= n
            last = rows[-1]
            lo = "(key > %s OR (key = %s AND seq < %s))"
            args = (bucket, last[0], last[0], last[10])

    def object_uses(self, bucket: str) -> list[ObjectUse]:
        rows = self._rows("SELECT key, size, blob_id, last_modified, GREATEST(last_access, last_modified) AS used"
                          " FROM objects WHERE bucket = %s ORDER BY used, key", (bucket,))
        return [ObjectUse(_key(k), size, blob, lm, used) for k, size, blob, lm, used in rows]

    def live_files(self) -> LiveFiles:
        blobs = {r[0] for r in self._rows("SELECT blob_id FROM objects")}
        blobs.update(r[0] for r in self._rows("SELECT blob_id FROM versions WHERE delete_marker = 0"))
        blobs.update(r[0] for r in self._rows("SELECT blob_id FROM snapshot_blobs"))
        parts: dict[str, set[str]] = {r[0]: set() for r in self._rows("SELECT upload_id FROM uploads")}
        for upload_id, file in self._rows("SELECT upload_id, file FROM parts"):
            parts.setdefault(upload_id, set()).add(file)
        return LiveFiles(blobs, parts)

    # snapshots -----------------------------------------------------------
    def bucket_snapshot(self, bucket: str, name: str) -> SnapshotInfo | None:
        rows = self._rows(_SNAP_SQL + " WHERE bucket = %s AND name = %s", (bucket, name))
        return SnapshotInfo(*rows[0]) if rows else None

    def bucket_snapshots(self, bucket: str) -> list[SnapshotInfo]:
        return [SnapshotInfo(*r) for r in self._rows(_SNAP_SQL + " WHERE bucket = %s ORDER BY created, name",
                                                     (bucket,))]

    def snapshot_object(self, bucket: str, snapshot: str, key: str) -> ObjectInfo | None:
        rows = self._rows(f"SELECT {VERSION_COLS} FROM snapshot_objects WHERE bucket = %s AND snapshot = %s"
                          " AND key = %s", (bucket, snapshot, key_bytes(key)))
        return self._info(bucket, key, rows[0]) if rows else None

    def scan_snapshot(self, bucket: str, snapshot: str, start: str, *, inclusive: bool, end: str | None,
                      limit: int) -> Generator[ObjectInfo, None, None]:
        select = f"SELECT key, {VERSION_COLS} FROM snapshot_objects WHERE bucket = %s AND snapshot = %s"
        for row in self._pages(select, (bucket, snapshot), start, end, limit, inclusive):
            yield self._info(bucket, _key(row[0]), row[1:])

    # multipart -------------------------------------------------------------
    def upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo | None:
        rows = self._rows(_UPLOAD_SQL + " WHERE upload_id = %s AND bucket = %s AND key = %s",
                          (upload_id, bucket, key_bytes(key)))
        return _upload(bucket, rows[0]) if rows else None

    def uploads(self, bucket: str) -> list[UploadInfo]:
        rows = self._rows(_UPLOAD_SQL + " WHERE bucket = %s ORDER BY key, initiated", (bucket,))
        return [_upload(bucket, r) for r in rows]

    def parts(self, upload_id: str) -> list[PartRecord]:
        rows = self._rows("SELECT part_number, etag, size, last_modified, checksums, file FROM parts"
                          " WHERE upload_id = %s ORDER BY part_number", (upload_id,))
        return [PartRecord(PartInfo(n, e, sz, lm, _loads(ck)), f) for n, e, sz, lm, ck, f in rows]

    def part_file(self, upload_id: str, part_number: int) -> str | None:
        rows = self._rows("SELECT file FROM parts WHERE upload_id = %s AND part_number = %s",
                          (upload_id, part_number))
        return rows[0][0] if rows else None

    def idle_uploads(self, before: float) -> list[UploadInfo]:
        rows = self._rows(
            "SELECT u.bucket, u.key, u.upload_id, u.initiated, u.content_type, u.metadata, u.headers, u.tags,"
            " u.lock FROM uploads AS u WHERE GREATEST(u.initiated, COALESCE((SELECT MAX(p.last_modified)"
            " FROM parts AS p WHERE p.upload_id = u.upload_id), u.initiated)) < %s"
            " ORDER BY u.bucket, u.key, u.initiated", (before,))
        return [_upload(r[0], r[1:]) for r in rows]

    # lifecycle -------------------------------------------------------------
    def lifecycle(self, bucket: str) -> list[LifecycleRule] | None:
        rows = self._rows("SELECT rules FROM lifecycle WHERE bucket = %s", (bucket,))
        return _rules_loads(rows[0][0]) if rows else None

    def lifecycles(self) -> dict[str, list[LifecycleRule]]:
        return {b: _rules_loads(r) for b, r in self._rows("SELECT bucket, rules FROM lifecycle ORDER BY bucket")}

    # tenants, keys, quotas and usage -------------------------------------------
    def quota(self, scope: str, name: str) -> tuple[int, int]:
        rows = self._rows("SELECT bytes, objects FROM quotas WHERE scope = %s AND name = %s", (scope, name))
        return (rows[0][0], rows[0][1]) if rows else (0, 0)

    def usage(self, bucket: str) -> tuple[int, int]:
        rows = self._rows("SELECT bytes, objects FROM usage WHERE bucket = %s", (bucket,))
        return (rows[0][0], rows[0][1]) if rows else (0, 0)

    def parts_usage(self, bucket: str) -> int:
        return int(self._rows("SELECT COALESCE(SUM(p.size), 0) FROM parts AS p JOIN uploads AS u"
                              " ON u.upload_id = p.upload_id WHERE u.bucket = %s", (bucket,))[0][0])

    def tenant_parts_usage(self, tenant: str) -> int:
        owner = "" if tenant == DEFAULT_TENANT else tenant
        return int(self._rows("SELECT COALESCE(SUM(p.size), 0) FROM parts AS p JOIN uploads AS u"
                              " ON u.upload_id = p.upload_id JOIN buckets AS b ON b.name = u.bucket"
                              " WHERE b.owner = %s", (owner,))[0][0])

    def tenant_usage(self, tenant: str) -> tuple[int, int]:
        owner = "" if tenant == DEFAULT_TENANT else tenant
        size, count = self._rows("SELECT COALESCE(SUM(u.bytes), 0), COALESCE(SUM(u.objects), 0) FROM usage AS u"
                                 " JOIN buckets AS b ON b.name = u.bucket WHERE b.owner = %s", (owner,))[0]
        return int(size), int(count)

    def tenant(self, name: str) -> TenantInfo | None:
        rows = self._rows("SELECT name, created FROM tenants WHERE name = %s", (name,))
        return TenantInfo(*rows[0]) if rows else None

    def tenants(self) -> list[TenantInfo]:
        return [TenantInfo(*r) for r in self._rows("SELECT name, created FROM tenants ORDER BY name")]

    def access_key(self, access_key: str) -> tuple[AccessKeyInfo, str] | None:
        rows = self._rows("SELECT access_key, tenant, created, revoked, secret FROM access_keys"
                          " WHERE access_key = %s", (access_key,))
        return (AccessKeyInfo(*rows[0][:4]), rows[0][4]) if rows else None

    def access_keys(self, tenant: str | None = None) -> list[AccessKeyInfo]:
        sql = "SELECT access_key, tenant, created, revoked FROM access_keys"
        rows = (self._rows(sql + " ORDER BY tenant, created, access_key") if tenant is None else
                self._rows(sql + " WHERE tenant = %s ORDER BY created, access_key", (tenant,)))
        return [AccessKeyInfo(*r) for r in rows]

    def bucket_config(self, bucket: str, name: str) -> str | None:
        rows = self._rows("SELECT value FROM bucket_configs WHERE bucket = %s AND name = %s", (bucket, name))
        return rows[0][0] if rows else None

    def completed_upload(self, upload_id: str) -> CompletedUpload | None:
        rows = self._rows(_COMPLETED_SQL + " WHERE upload_id = %s", (upload_id,))
        return _completed(rows[0]) if rows else None

    def completion_of(self, blob_id: str) -> CompletedUpload | None:
        rows = self._rows(_COMPLETED_SQL + " WHERE blob_id = %s LIMIT 1", (blob_id,))
        return _completed(rows[0]) if rows else None

    # chunks and manifests ----------------------------------------------------
    def manifest(self, blob_id: str) -> tuple[int, list[ChunkRecord]] | None:
        rows = self._rows(
            "SELECT m.size, c.chunk_id, c.file, c.file_offset, c.stored, c.size, c.codec, c.digest, c.sums,"
            " c.domain, c.sum_kind, c.holder"
            " FROM manifests AS m LEFT JOIN manifest_chunks AS mc ON mc.blob_id = m.blob_id"
            " LEFT JOIN chunks AS c ON c.chunk_id = mc.chunk_id WHERE m.blob_id = %s ORDER BY mc.seq", (blob_id,))
        if not rows:
            return None
        return rows[0][0], [_chunk(r[1:]) for r in rows if r[1] is not None]

    def chunk(self, chunk_id: str) -> ChunkRecord | None:
        rows = self._rows(f"SELECT {CHUNK_COLS} FROM chunks WHERE chunk_id = %s", (chunk_id,))
        return _chunk(rows[0]) if rows else None

    def find_chunk(self, domain: str, digest: bytes) -> ChunkRecord | None:
        rows = self._rows(f"SELECT {CHUNK_COLS} FROM chunks WHERE domain = %s AND digest = %s", (domain, digest))
        return _chunk(rows[0]) if rows else None

    def blob_referenced(self, blob_id: str) -> bool:
        return bool(self._rows("SELECT 1 FROM objects WHERE blob_id = %s LIMIT 1", (blob_id,))
                    or self._rows("SELECT 1 FROM versions WHERE blob_id = %s LIMIT 1", (blob_id,))
                    or self._rows("SELECT 1 FROM snapshot_blobs WHERE blob_id = %s", (blob_id,)))

    def unmanifested_blobs(self) -> list[tuple[str, int, str]]:
        return [(r[0], r[1], r[2]) for r in self._rows(
            "SELECT blob_id, size, bucket FROM objects WHERE blob_id != ''"
            " AND blob_id NOT IN (SELECT blob_id FROM manifests)"
            " UNION SELECT blob_id, size, bucket FROM versions WHERE blob_id != ''"
            " AND blob_id NOT IN (SELECT blob_id FROM manifests)"
            " UNION SELECT blob_id, size, bucket FROM snapshot_objects WHERE blob_id != ''"
            " AND blob_id NOT IN (SELECT blob_id FROM manifests)")]

    def orphan_manifests(self) -> list[str]:
        return [r[0] for r in self._rows(
            "SELECT blob_id FROM manifests WHERE blob_id NOT IN (SELECT blob_id FROM objects)"
            " AND blob_id NOT IN (SELECT blob_id FROM versions)"
            " AND blob_id NOT IN (SELECT blob_id FROM snapshot_blobs)")]

    def data_files(self) -> set[str]:
        return {r[0] for r in self._rows("SELECT DISTINCT file FROM chunks WHERE holder = %s", (self._holder,))}

    def unheld_files(self) -> set[str]:
        return {r[0] for r in self._rows("SELECT DISTINCT file FROM chunks WHERE holder = ''")}

    def file_chunks(self, file: str) -> list[str]:
        return [r[0] for r in self._rows("SELECT chunk_id FROM chunks WHERE file = %s ORDER BY chunk_id", (file,))]

    def file_records(self, file: str) -> list[ChunkRecord]:
        return [_chunk(r) for r in self._rows(
            f"SELECT {CHUNK_COLS} FROM chunks WHERE file = %s ORDER BY file_offset, chunk_id", (file,))]

    def parts_total(self) -> int:
        return int(self._rows("SELECT COALESCE(SUM(size), 0) FROM parts")[0][0])

    def chunk_totals(self) -> tuple[int, int, int]:
        n, stored, size = self._rows(
            "SELECT COUNT(*), COALESCE(SUM(stored), 0), COALESCE(SUM(size), 0) FROM chunks")[0]
        return int(n), int(stored), int(size)

    def scan_chunks(self, after: str, limit: int) -> list[ChunkRecord]:
        return [_chunk(r) for r in self._rows(
            f"SELECT {CHUNK_COLS} FROM chunks WHERE chunk_id > %s ORDER BY chunk_id LIMIT %s", (after, limit))]

    def chunk_users(self, chunk_id: str, limit: int = 10) -> list[tuple[str, str, str]]:
        return [(b, _key(k), v) for b, k, v in self._rows(
            "SELECT bucket, key, version_id FROM objects WHERE blob_id IN"
            " (SELECT blob_id FROM manifest_chunks WHERE chunk_id = %s)"
            " UNION ALL SELECT bucket, key, version_id FROM versions WHERE blob_id IN"
            " (SELECT blob_id FROM manifest_chunks WHERE chunk_id = %s) LIMIT %s", (chunk_id, chunk_id, limit))]

    def damaged_chunks(self) -> dict[str, tuple[str, float]]:
        return {r[0]: (r[1], r[2]) for r in self._rows("SELECT chunk_id, reason, found FROM damaged_chunks")}

    def bucket_data_usage(self, bucket: str) -> tuple[int, int, int]:
        logical = self._rows("SELECT bytes FROM usage WHERE bucket = %s", (bucket,))
        stored = self._rows("SELECT stored, chunks FROM chunk_usage WHERE bucket = %s", (bucket,))
        return (logical[0][0] if logical else 0, *(stored[0] if stored else (0, 0)))
