"""The SQLite catalog's snapshot operations: the snapshot methods of
:class:`~gpufeed.engine.catalog.CatalogReader` and
:class:`~gpufeed.engine.catalog.CatalogWriter` as SQL, mixed into the classes
of :mod:`._sqlite` (kept apart so that module stays one size).

A snapshot is one ``snapshots`` row and a copy of the version columns of the
bucket's current objects in ``snapshot_objects``, made by one
``INSERT ... SELECT`` inside the write transaction, so it is exactly the state
of that commit; ``snapshot_blobs`` counts the entries naming each blob (an
upsert in blob order when a snapshot is made, decrements when it is deleted).
The SQL is plain (``INSERT ... ON CONFLICT DO UPDATE``, no SQLite-only
functions) so a PostgreSQL catalog can share it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from .types import ObjectInfo, SnapshotInfo

__all__ = ["SnapshotReads", "SnapshotWrites", "SNAPSHOT_VERSION_COLS"]

#: The version columns a snapshot entry copies (as ``objects`` holds them).
SNAPSHOT_VERSION_COLS = ("size, etag, last_modified, content_type, metadata, checksums, blob_id, headers,"
                         " version_id, seq, lock_mode, lock_until, legal_hold, tags")
_SNAP_COLS = "SELECT bucket, name, created, kind, objects, bytes FROM snapshots"
_ENTRY_SQL = (f"SELECT {SNAPSHOT_VERSION_COLS} FROM snapshot_objects"
              " WHERE bucket=? AND snapshot=? AND key=?")
_IN_CHUNK = 400  # ids per IN (...) list: below every database's bound on parameters


class SnapshotReads:
    """Snapshot reads over ``_conn()``, mixed into the SQLite reader classes."""

    _blob_path: Callable[[str], str]
    if TYPE_CHECKING:
        def _conn(self) -> sqlite3.Connection:
            """The connection reads use (the reader class's)."""

        def _object_info(self, bucket: str, key: str, row, delete_marker: bool = False,
                         is_latest: bool = True) -> ObjectInfo:
            """A row of version columns as an :class:`ObjectInfo` (the reader class's)."""

    def bucket_snapshot(self, bucket: str, name: str) -> SnapshotInfo | None:
        rows = self._conn().execute(_SNAP_COLS + " WHERE bucket=? AND name=?", (bucket, name)).fetchall()
        return SnapshotInfo(*rows[0]) if rows else None

    def bucket_snapshots(self, bucket: str) -> list[SnapshotInfo]:
        rows = self._conn().execute(_SNAP_COLS + " WHERE bucket=? ORDER BY created, name", (bucket,)).fetchall()
        return [SnapshotInfo(*r) for r in rows]

    def snapshot_object(self, bucket: str, snapshot: str, key: str) -> ObjectInfo | None:
        try:
            rows = self._conn().execute(_ENTRY_SQL, (bucket, snapshot, key)).fetchall()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"object key {key!r} is not valid UTF-8") from exc
        return self._object_info(bucket, key, rows[0]) if rows else None

    def scan_snapshot(self, bucket: str, snapshot: str, start: str, *, inclusive: bool, end: str | None,
                      limit: int) -> Generator[ObjectInfo, None, None]:
        lo = "key >= ?" if inclusive else "key > ?"
        up = "" if end is None else " AND key < ?"
        sql = (f"SELECT key, {SNAPSHOT_VERSION_COLS} FROM snapshot_objects WHERE bucket=? AND snapshot=?"
               f" AND {lo}{up} ORDER BY key LIMIT ?")
        args = (bucket, snapshot, start, limit) if end is None else (bucket, snapshot, start, end, limit)
        cur = self._conn().execute(sql, args)
        try:
            for row in cur:
                yield self._object_info(bucket, row[0], row[1:])
        finally:
            cur.close()


class SnapshotWrites:
    """Snapshot writes over ``_c`` (the write transaction's connection)."""

    _c: sqlite3.Connection

    def insert_snapshot(self, info: SnapshotInfo) -> SnapshotInfo:
        c = self._c
        n = c.execute(
            f"INSERT INTO snapshot_objects (bucket, snapshot, key, {SNAPSHOT_VERSION_COLS})"
            f" SELECT bucket, ?, key, {SNAPSHOT_VERSION_COLS} FROM objects WHERE bucket=?",
            (info.name, info.bucket)).rowcount
        c.execute("INSERT INTO snapshot_blobs (blob_id, refs) SELECT blob_id, COUNT(*) FROM objects WHERE bucket=?"
                  " GROUP BY blob_id ON CONFLICT (blob_id) DO UPDATE SET refs = snapshot_blobs.refs + excluded.refs",
                  (info.bucket,))
        size = c.execute("SELECT COALESCE(SUM(size), 0) FROM objects WHERE bucket=?", (info.bucket,)).fetchone()[0]
        c.execute("INSERT INTO snapshots (bucket, name, created, kind, objects, bytes) VALUES (?, ?, ?, ?, ?, ?)",
                  (info.bucket, info.name, info.created, info.kind, n, size))
        return SnapshotInfo(info.bucket, info.name, info.created, info.kind, n, size)

    def delete_snapshot(self, bucket: str, name: str) -> list[str]:
        c = self._c
        counts = c.execute("SELECT blob_id, COUNT(*) FROM snapshot_objects WHERE bucket=? AND snapshot=?"
                           " GROUP BY blob_id", (bucket, name)).fetchall()
        c.executemany("UPDATE snapshot_blobs SET refs = refs - ? WHERE blob_id=?", [(n, b) for b, n in counts])
        c.executemany("DELETE FROM snapshot_blobs WHERE blob_id=? AND refs <= 0", [(b,) for b, _ in counts])
        blobs = [b for b, _ in counts]
        c.execute("DELETE FROM snapshot_objects WHERE bucket=? AND snapshot=?", (bucket, name))
        c.execute("DELETE FROM snapshots WHERE bucket=? AND name=?", (bucket, name))
        return blobs

    def referenced_blobs(self, blob_ids: list[str]) -> set[str]:
        found: set[str] = set()
        ids = list(dict.fromkeys(b for b in blob_ids if b))
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i:i + _IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            sql = " UNION ".join(f"SELECT blob_id FROM {t} WHERE blob_id IN ({marks})"
                                 for t in ("objects", "versions", "snapshot_blobs"))
            found.update(r[0] for r in self._c.execute(sql, chunk * 3))
        return found
