"""The chunk and manifest operations of the SQLite catalog: mixins of its reader
and writer classes (:mod:`._sqlite`), kept apart so that file stays one concern.

Tables (see :mod:`._schema`): ``chunks`` (one row per chunk, with its reference
count), ``manifests`` (one row per blob id: size and chunk count) and
``manifest_chunks`` (the chunks of each manifest, in order), ``damaged_chunks``.
"""

from __future__ import annotations

import sqlite3
from collections import Counter

from .types import ChunkRecord

__all__ = ["ChunkReads", "ChunkWrites"]

_CHUNK_COLS = "chunk_id, file, file_offset, stored, size, codec, digest, sums, domain, sum_kind"


def _chunk(row) -> ChunkRecord:
    cid, file, off, stored, size, codec, digest, sums, domain, kind = row
    return ChunkRecord(cid, file, off, stored, size, codec, bytes(digest), bytes(sums), domain, kind)


class ChunkReads:
    """Chunk reads over ``self._conn()``."""

    def _conn(self) -> sqlite3.Connection:
        raise NotImplementedError

    def manifest(self, blob_id: str) -> tuple[int, list[ChunkRecord]] | None:
        # One statement: SQLite reads it in one consistent state even outside a transaction.
        rows = self._conn().execute(
            "SELECT m.size, c.chunk_id, c.file, c.file_offset, c.stored, c.size, c.codec, c.digest, c.sums,"
            " c.domain, c.sum_kind FROM manifests m LEFT JOIN manifest_chunks mc ON mc.blob_id = m.blob_id"
            " LEFT JOIN chunks c ON c.chunk_id = mc.chunk_id WHERE m.blob_id=? ORDER BY mc.seq",
            (blob_id,)).fetchall()
        if not rows:
            return None
        return rows[0][0], [_chunk(r[1:]) for r in rows if r[1] is not None]

    def chunk(self, chunk_id: str) -> ChunkRecord | None:
        rows = self._conn().execute(f"SELECT {_CHUNK_COLS} FROM chunks WHERE chunk_id=?", (chunk_id,)).fetchall()
        return _chunk(rows[0]) if rows else None

    def find_chunk(self, domain: str, digest: bytes) -> ChunkRecord | None:
        rows = self._conn().execute(f"SELECT {_CHUNK_COLS} FROM chunks WHERE domain=? AND digest=?",
                                    (domain, digest)).fetchall()
        return _chunk(rows[0]) if rows else None

    def blob_referenced(self, blob_id: str) -> bool:
        c = self._conn()
        return bool(c.execute("SELECT 1 FROM objects WHERE blob_id=? LIMIT 1", (blob_id,)).fetchall()
                    or c.execute("SELECT 1 FROM versions WHERE blob_id=? LIMIT 1", (blob_id,)).fetchall()
                    or c.execute("SELECT 1 FROM snapshot_blobs WHERE blob_id=?", (blob_id,)).fetchall())

    def unmanifested_blobs(self) -> list[tuple[str, int, str]]:
        return [(r[0], r[1], r[2]) for r in self._conn().execute(
            "SELECT blob_id, size, bucket FROM objects WHERE blob_id != ''"
            " AND blob_id NOT IN (SELECT blob_id FROM manifests)"
            " UNION SELECT blob_id, size, bucket FROM versions WHERE blob_id != ''"
            " AND blob_id NOT IN (SELECT blob_id FROM manifests)"
            " UNION SELECT blob_id, size, bucket FROM snapshot_objects WHERE blob_id != ''"
            " AND blob_id NOT IN (SELECT blob_id FROM manifests)")]

    def orphan_manifests(self) -> list[str]:
        return [r[0] for r in self._conn().execute(
            "SELECT blob_id FROM manifests WHERE blob_id NOT IN (SELECT blob_id FROM objects)"
            " AND blob_id NOT IN (SELECT blob_id FROM versions)"
            " AND blob_id NOT IN (SELECT blob_id FROM snapshot_blobs)")]

    def data_files(self) -> set[str]:
        return {r[0] for r in self._conn().execute("SELECT DISTINCT file FROM chunks")}

    def file_chunks(self, file: str) -> list[str]:
        return [r[0] for r in self._conn().execute("SELECT chunk_id FROM chunks WHERE file=? ORDER BY chunk_id",
                                                   (file,))]

    def parts_total(self) -> int:
        return self._conn().execute("SELECT COALESCE(SUM(size), 0) FROM parts").fetchone()[0]

    def chunk_totals(self) -> tuple[int, int, int]:
        n, stored, size = self._conn().execute(
            "SELECT COUNT(*), COALESCE(SUM(stored), 0), COALESCE(SUM(size), 0) FROM chunks").fetchone()
        return n, stored, size

    def scan_chunks(self, after: str, limit: int) -> list[ChunkRecord]:
        rows = self._conn().execute(f"SELECT {_CHUNK_COLS} FROM chunks WHERE chunk_id > ? ORDER BY chunk_id"
                                    " LIMIT ?", (after, limit)).fetchall()
        return [_chunk(r) for r in rows]

    def chunk_users(self, chunk_id: str, limit: int = 10) -> list[tuple[str, str, str]]:
        return [tuple(r) for r in self._conn().execute(
            "SELECT bucket, key, version_id FROM objects WHERE blob_id IN"
            " (SELECT blob_id FROM manifest_chunks WHERE chunk_id=?)"
            " UNION ALL SELECT bucket, key, version_id FROM versions WHERE blob_id IN"
            " (SELECT blob_id FROM manifest_chunks WHERE chunk_id=?) LIMIT ?",
            (chunk_id, chunk_id, limit))]

    def damaged_chunks(self) -> dict[str, tuple[str, float]]:
        return {r[0]: (r[1], r[2]) for r in self._conn().execute(
            "SELECT chunk_id, reason, found FROM damaged_chunks")}

    def bucket_data_usage(self, bucket: str) -> tuple[int, int, int]:
        c = self._conn()
        logical = c.execute("SELECT bytes FROM usage WHERE bucket=?", (bucket,)).fetchall()
        stored = c.execute("SELECT stored, chunks FROM chunk_usage WHERE bucket=?", (bucket,)).fetchall()
        return (logical[0][0] if logical else 0, *(stored[0] if stored else (0, 0)))


class ChunkWrites:
    """Chunk writes over the write transaction's connection ``self._c``."""

    _c: sqlite3.Connection

    def insert_chunk(self, record: ChunkRecord, refs: int, bucket: str = "") -> None:
        r = record
        self._c.execute(
            f"INSERT INTO chunks ({_CHUNK_COLS}, refs, bucket) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.chunk_id, r.file, r.file_offset, r.stored, r.size, r.codec, r.digest, r.sums, r.domain, r.sum_kind,
             refs, bucket))

    def add_chunk_refs(self, chunk_id: str, n: int) -> bool:
        cur = self._c.execute("UPDATE chunks SET refs = refs + ? WHERE chunk_id=?", (n, chunk_id))
        return cur.rowcount == 1

    def insert_manifest(self, blob_id: str, size: int, chunk_ids: list[str]) -> None:
        self._c.execute("INSERT INTO manifests (blob_id, size, chunks) VALUES (?, ?, ?)",
                        (blob_id, size, len(chunk_ids)))
        self._c.executemany("INSERT INTO manifest_chunks (blob_id, seq, chunk_id) VALUES (?, ?, ?)",
                            [(blob_id, i, cid) for i, cid in enumerate(chunk_ids)])

    def release_manifest(self, blob_id: str) -> tuple[list[str], int]:
        c = self._c
        uses = Counter(r[0] for r in c.execute("SELECT chunk_id FROM manifest_chunks WHERE blob_id=?", (blob_id,)))
        c.execute("DELETE FROM manifest_chunks WHERE blob_id=?", (blob_id,))
        c.execute("DELETE FROM manifests WHERE blob_id=?", (blob_id,))
        files: set[str] = set()
        freed = 0
        for cid, n in uses.items():
            c.execute("UPDATE chunks SET refs = refs - ? WHERE chunk_id=?", (n, cid))
            rows = c.execute("SELECT file, stored FROM chunks WHERE chunk_id=? AND refs <= 0", (cid,)).fetchall()
            if rows:
                c.execute("DELETE FROM chunks WHERE chunk_id=?", (cid,))
                c.execute("DELETE FROM damaged_chunks WHERE chunk_id=?", (cid,))
                files.add(rows[0][0])
                freed += rows[0][1]
        return [f for f in files if not c.execute("SELECT 1 FROM chunks WHERE file=? LIMIT 1", (f,)).fetchall()], freed

    def repair_chunk(self, chunk_id: str, record: ChunkRecord) -> str | None:
        c = self._c
        rows = c.execute("SELECT file FROM chunks WHERE chunk_id=?", (chunk_id,)).fetchall()
        if not rows:
            return None
        r = record
        c.execute("UPDATE chunks SET file=?, file_offset=?, stored=?, codec=?, sums=?, sum_kind=? WHERE chunk_id=?",
                  (r.file, r.file_offset, r.stored, r.codec, r.sums, r.sum_kind, chunk_id))
        c.execute("DELETE FROM damaged_chunks WHERE chunk_id=?", (chunk_id,))
        return rows[0][0]

    def mark_damaged(self, chunk_id: str, reason: str, when: float) -> None:
        self._c.execute("INSERT OR IGNORE INTO damaged_chunks (chunk_id, reason, found) VALUES (?, ?, ?)",
                        (chunk_id, reason, when))

    def clear_damaged(self, chunk_id: str) -> None:
        self._c.execute("DELETE FROM damaged_chunks WHERE chunk_id=?", (chunk_id,))
