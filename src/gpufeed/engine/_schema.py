"""The SQLite catalog's schema: the tables of a fresh catalog, the steps that
bring an older catalog up to date, and the columns added since the first release.

A catalog records its version in ``PRAGMA user_version``; :class:`~gpufeed.engine._sqlite.SqliteCatalog`
runs the steps from that version on open, in one transaction.
"""

from __future__ import annotations

import sqlite3

__all__ = ["SCHEMA_VERSION", "SCHEMA", "MIGRATIONS", "DERIVED_TABLES", "AFTER_SALVAGE", "add_columns"]

#: Bumped when the schema changes; stored in ``PRAGMA user_version``. A catalog
#: of an older version is brought up to this one on open (:data:`MIGRATIONS`);
#: a newer one is refused, so an older gpufeed never ignores what it cannot read.
SCHEMA_VERSION = 6

SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (
    name    TEXT PRIMARY KEY,
    created REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS objects (
    bucket        TEXT NOT NULL,
    key           TEXT NOT NULL,
    size          INTEGER NOT NULL,
    etag          TEXT NOT NULL,
    last_modified REAL NOT NULL,
    content_type  TEXT NOT NULL,
    metadata      TEXT NOT NULL,   -- JSON object, '' when empty
    checksums     TEXT NOT NULL,   -- JSON object, '' when empty
    blob_id       TEXT NOT NULL,
    PRIMARY KEY (bucket, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uploads (
    upload_id    TEXT PRIMARY KEY,
    bucket       TEXT NOT NULL,
    key          TEXT NOT NULL,
    initiated    REAL NOT NULL,
    content_type TEXT NOT NULL,
    metadata     TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (bucket, key, initiated);
CREATE TABLE IF NOT EXISTS parts (
    upload_id     TEXT NOT NULL,
    part_number   INTEGER NOT NULL,
    etag          TEXT NOT NULL,
    size          INTEGER NOT NULL,
    last_modified REAL NOT NULL,
    file          TEXT NOT NULL,   -- '<part_number:05d>.<id>' under uploads/<upload_id>/
    PRIMARY KEY (upload_id, part_number)
) WITHOUT ROWID;
"""

# Version 2: bucket lifecycle rules, one row per bucket that has a configuration.
_LIFECYCLE_TABLE = """
CREATE TABLE IF NOT EXISTS lifecycle (
    bucket TEXT PRIMARY KEY,
    rules  TEXT NOT NULL   -- JSON list of LifecycleRule fields, in order
) WITHOUT ROWID;
"""

# Version 3: completed multipart uploads, for a repeated CompleteMultipartUpload
# and the part layout of multipart objects (GetObject partNumber).
_COMPLETED_UPLOADS_TABLE = """
CREATE TABLE IF NOT EXISTS completed_uploads (
    upload_id TEXT PRIMARY KEY,
    bucket    TEXT NOT NULL,
    key       TEXT NOT NULL,
    etag      TEXT NOT NULL,
    blob_id   TEXT NOT NULL,
    completed REAL NOT NULL,
    parts     TEXT NOT NULL    -- JSON [[part_number, etag, size, last_modified, {checksums}], ...]
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS completed_uploads_by_blob ON completed_uploads (blob_id);
CREATE INDEX IF NOT EXISTS completed_uploads_by_time ON completed_uploads (completed);
"""

# Version 4: tenants and their access keys; quotas, and usage counted by
# triggers on every write of a version (REPLACE counts as a delete and an
# insert: the writer runs with recursive_triggers on); bucket configuration documents S3
# stores whole (CORS, bucket tagging, ...); and the versions of keys that are not current: noncurrent
# versions and delete markers (``objects`` keeps each key's current version,
# unless that is a delete marker, which is here with latest=1).
_VERSION_4 = """
CREATE TABLE IF NOT EXISTS bucket_configs (
    bucket TEXT NOT NULL,
    name   TEXT NOT NULL,   -- 'cors', 'tagging', ...
    value  TEXT NOT NULL,   -- the document as the front stores it
    PRIMARY KEY (bucket, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS versions (
    bucket        TEXT NOT NULL,
    key           TEXT NOT NULL,
    seq           INTEGER NOT NULL,   -- order among the key's versions, larger is newer
    size          INTEGER NOT NULL,
    etag          TEXT NOT NULL,
    last_modified REAL NOT NULL,
    content_type  TEXT NOT NULL,
    metadata      TEXT NOT NULL,
    checksums     TEXT NOT NULL,
    blob_id       TEXT NOT NULL,      -- '' for a delete marker
    headers       TEXT NOT NULL,
    version_id    TEXT NOT NULL,
    lock_mode     TEXT NOT NULL,
    lock_until    REAL NOT NULL,
    legal_hold    INTEGER NOT NULL,
    tags          TEXT NOT NULL,
    delete_marker INTEGER NOT NULL,
    latest        INTEGER NOT NULL,   -- 1: a delete marker that is the key's current version
    PRIMARY KEY (bucket, key, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS versions_by_id ON versions (bucket, key, version_id);
CREATE TABLE IF NOT EXISTS tenants (
    name    TEXT PRIMARY KEY,
    created REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS access_keys (
    access_key TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    secret     TEXT NOT NULL,      -- the secret key encrypted with the node's master key (base64)
    created    REAL NOT NULL,
    revoked    REAL NOT NULL       -- Unix s of the revocation, 0 while valid
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS access_keys_by_tenant ON access_keys (tenant, created);
CREATE TABLE IF NOT EXISTS quotas (
    scope   TEXT NOT NULL,      -- 'tenant' | 'bucket'
    name    TEXT NOT NULL,
    bytes   INTEGER NOT NULL,   -- most bytes of object versions held; 0 = no limit
    objects INTEGER NOT NULL,   -- most object versions held (delete markers not counted); 0 = no limit
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage (
    bucket  TEXT PRIMARY KEY,
    bytes   INTEGER NOT NULL,   -- summed size of every version with data, current or not
    objects INTEGER NOT NULL    -- how many such versions
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS usage_objects_insert AFTER INSERT ON objects BEGIN
    INSERT INTO usage (bucket, bytes, objects) VALUES (new.bucket, new.size, 1)
        ON CONFLICT (bucket) DO UPDATE SET bytes = bytes + new.size, objects = objects + 1;
END;
CREATE TRIGGER IF NOT EXISTS usage_objects_delete AFTER DELETE ON objects BEGIN
    UPDATE usage SET bytes = bytes - old.size, objects = objects - 1 WHERE bucket = old.bucket;
END;
CREATE TRIGGER IF NOT EXISTS usage_versions_insert AFTER INSERT ON versions WHEN new.delete_marker = 0 BEGIN
    INSERT INTO usage (bucket, bytes, objects) VALUES (new.bucket, new.size, 1)
        ON CONFLICT (bucket) DO UPDATE SET bytes = bytes + new.size, objects = objects + 1;
END;
CREATE TRIGGER IF NOT EXISTS usage_versions_delete AFTER DELETE ON versions WHEN old.delete_marker = 0 BEGIN
    UPDATE usage SET bytes = bytes - old.size, objects = objects - 1 WHERE bucket = old.bucket;
END;
INSERT OR REPLACE INTO usage (bucket, bytes, objects)
    SELECT bucket, SUM(size), COUNT(*) FROM (SELECT bucket, size FROM objects
        UNION ALL SELECT bucket, size FROM versions WHERE delete_marker = 0) GROUP BY bucket;
"""

# Version 5: the chunk store. An object version's ``blob_id`` names a manifest
# (its chunks in order); a chunk is a run of data stored raw or compressed in a
# data file, checked on every read against its per-block sums, shared
# by every manifest that holds the same bytes in a deduplicating bucket
# (``domain`` set, found by ``digest``), freed when its references reach 0.
_VERSION_5 = """
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id    TEXT PRIMARY KEY,
    file        TEXT NOT NULL,      -- data file id: blobs/ab/cd/<file>
    file_offset INTEGER NOT NULL,   -- bytes into the file
    stored      INTEGER NOT NULL,   -- bytes in the file (compressed length)
    size        INTEGER NOT NULL,   -- bytes of data
    codec       TEXT NOT NULL,      -- '' | 'lz4' | 'zstd'
    digest      BLOB NOT NULL,      -- BLAKE3 or xxh3-128 of the data
    sums        BLOB NOT NULL,      -- block sums of the stored bytes (format: sum_kind)
    domain      TEXT,               -- dedup domain of a shared chunk, NULL otherwise
    refs        INTEGER NOT NULL,   -- appearances in manifests
    bucket      TEXT NOT NULL       -- the bucket that stored it (its stored bytes count there)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS chunks_by_digest ON chunks (domain, digest) WHERE domain IS NOT NULL;
CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks (file);
CREATE TABLE IF NOT EXISTS manifests (
    blob_id TEXT PRIMARY KEY,
    size    INTEGER NOT NULL,
    chunks  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS manifest_chunks (
    blob_id  TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    chunk_id TEXT NOT NULL,
    PRIMARY KEY (blob_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS manifest_chunks_by_chunk ON manifest_chunks (chunk_id);
CREATE TABLE IF NOT EXISTS damaged_chunks (
    chunk_id TEXT PRIMARY KEY,
    reason   TEXT NOT NULL,
    found    REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunk_usage (
    bucket TEXT PRIMARY KEY,
    stored INTEGER NOT NULL,   -- bytes of the chunks the bucket stored
    chunks INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS chunk_usage_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO chunk_usage (bucket, stored, chunks) VALUES (new.bucket, new.stored, 1)
        ON CONFLICT (bucket) DO UPDATE SET stored = stored + new.stored, chunks = chunks + 1;
END;
CREATE TRIGGER IF NOT EXISTS chunk_usage_delete AFTER DELETE ON chunks BEGIN
    UPDATE chunk_usage SET stored = stored - old.stored, chunks = chunks - 1 WHERE bucket = old.bucket;
END;
CREATE INDEX IF NOT EXISTS objects_by_blob ON objects (blob_id);
CREATE INDEX IF NOT EXISTS versions_by_blob ON versions (blob_id);
"""

# Version 6: bucket snapshots. A snapshot's entries copy the version columns of
# the bucket's current objects at one instant (one INSERT ... SELECT); several
# rows (current objects, noncurrent versions, snapshot entries) may name one
# blob, and the "is it still named" test of every path that frees data
# (engine/_release.py) looks blobs up in objects and versions by their
# blob_id indexes (version 5) and in snapshot_blobs: how many snapshot entries
# name each blob, kept in the snapshot's own transaction. A count per blob,
# rather than an index over every entry, keeps making a snapshot as fast with
# 30 snapshots kept as with none (the entries of an unchanged blob update one
# row, in blob_id order, instead of adding index entries at random places).
_SNAPSHOTS = """
CREATE TABLE IF NOT EXISTS snapshots (
    bucket  TEXT NOT NULL,
    name    TEXT NOT NULL,
    created REAL NOT NULL,
    kind    TEXT NOT NULL,      -- 'manual' | 'hourly' | 'daily'
    objects INTEGER NOT NULL,
    bytes   INTEGER NOT NULL,   -- summed sizes of its entries
    PRIMARY KEY (bucket, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshot_objects (
    bucket        TEXT NOT NULL,
    snapshot      TEXT NOT NULL,
    key           TEXT NOT NULL,
    size          INTEGER NOT NULL,
    etag          TEXT NOT NULL,
    last_modified REAL NOT NULL,
    content_type  TEXT NOT NULL,
    metadata      TEXT NOT NULL,
    checksums     TEXT NOT NULL,
    blob_id       TEXT NOT NULL,
    headers       TEXT NOT NULL,
    version_id    TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    lock_mode     TEXT NOT NULL,
    lock_until    REAL NOT NULL,
    legal_hold    INTEGER NOT NULL,
    tags          TEXT NOT NULL,
    PRIMARY KEY (bucket, snapshot, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshot_blobs (
    blob_id TEXT PRIMARY KEY,
    refs    INTEGER NOT NULL    -- snapshot entries naming it (> 0; the row goes at 0)
) WITHOUT ROWID;
"""

#: ``version -> SQL`` that takes a catalog of that version to the next one. A
#: fresh catalog (version 0) gets :data:`SCHEMA` and then every step. Each step
#: is idempotent (``IF NOT EXISTS``). Append a step when bumping SCHEMA_VERSION.
MIGRATIONS: dict[int, str] = {
    1: _LIFECYCLE_TABLE,
    2: _COMPLETED_UPLOADS_TABLE,
    3: _VERSION_4,
    4: _VERSION_5,
    5: _SNAPSHOTS,
}

#: Columns added after the first release: ``(table, column, declaration)``. Each
#: is added with ``ALTER TABLE ... ADD COLUMN`` when ``PRAGMA table_info`` lacks
#: it, so a catalog made by an older gpufeed opens unchanged otherwise (rows it
#: holds read the declared default). Append here; never reorder or remove.
_ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("objects", "headers", "TEXT NOT NULL DEFAULT ''"),    # JSON object of HTTP headers, '' when empty
    ("uploads", "headers", "TEXT NOT NULL DEFAULT ''"),    # same, for the object being uploaded
    ("parts", "checksums", "TEXT NOT NULL DEFAULT ''"),    # JSON {"crc32": b64, ...}, '' when empty
    ("buckets", "kind", "TEXT NOT NULL DEFAULT 'standard'"),  # 'standard' | 'kv' (evicting cache bucket)
    ("buckets", "capacity_bytes", "INTEGER NOT NULL DEFAULT 0"),  # kv: byte budget, 0 = unlimited
    ("buckets", "ttl_s", "REAL NOT NULL DEFAULT 0"),          # kv: seconds an object lives after its write, 0 = forever
    ("objects", "last_access", "REAL NOT NULL DEFAULT 0"),    # kv LRU: Unix s of the last read, flushed lazily
    ("objects", "version_id", "TEXT NOT NULL DEFAULT 'null'"),
    ("objects", "seq", "INTEGER NOT NULL DEFAULT 0"),         # as versions.seq
    ("objects", "lock_mode", "TEXT NOT NULL DEFAULT ''"),     # '' | 'GOVERNANCE' | 'COMPLIANCE'
    ("objects", "lock_until", "REAL NOT NULL DEFAULT 0"),     # retain-until, Unix s
    ("objects", "legal_hold", "INTEGER NOT NULL DEFAULT 0"),
    ("objects", "tags", "TEXT NOT NULL DEFAULT ''"),          # JSON object, '' when empty
    ("buckets", "versioning", "TEXT NOT NULL DEFAULT ''"),    # '' | 'Enabled' | 'Suspended'
    ("buckets", "object_lock", "INTEGER NOT NULL DEFAULT 0"),
    ("buckets", "lock_mode", "TEXT NOT NULL DEFAULT ''"),     # default retention of new versions
    ("buckets", "lock_days", "INTEGER NOT NULL DEFAULT 0"),
    ("buckets", "lock_years", "INTEGER NOT NULL DEFAULT 0"),
    ("buckets", "owner", "TEXT NOT NULL DEFAULT ''"),         # tenant name; '' = the default tenant
    ("buckets", "etag_policy", "TEXT NOT NULL DEFAULT 'md5'"),  # 'md5' | 'fast' | 'none'
    ("uploads", "tags", "TEXT NOT NULL DEFAULT ''"),          # of the object the upload completes into
    ("uploads", "lock", "TEXT NOT NULL DEFAULT ''"),          # JSON [mode, until, legal_hold], '' for none
    ("chunks", "sum_kind", "INTEGER NOT NULL DEFAULT 0"),     # 1: running CRC32C per 4 KiB; 0: xxh3-64 per 64 KiB
)


def add_columns(w: sqlite3.Connection) -> None:
    """Add the :data:`_ADDED_COLUMNS` a catalog lacks (inside the caller's transaction)."""
    have: dict[str, set[str]] = {}
    for table, column, decl in _ADDED_COLUMNS:
        if table not in have:
            have[table] = {row[1] for row in w.execute(f"PRAGMA table_info({table})")}
        if column not in have[table]:
            w.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            have[table].add(column)


#: Tables whose rows triggers derive from other tables' rows. A salvage
#: (``gpufeed catalog recover``) does not copy them from a damaged catalog; it
#: runs this SQL after copying the rest, so they agree with the rows saved.
DERIVED_TABLES: dict[str, str] = {
    "usage": """
DELETE FROM usage;
INSERT INTO usage (bucket, bytes, objects)
    SELECT bucket, SUM(size), COUNT(*) FROM (SELECT bucket, size FROM objects
        UNION ALL SELECT bucket, size FROM versions WHERE delete_marker = 0) GROUP BY bucket;
""",
    "chunk_usage": """
DELETE FROM chunk_usage;
INSERT INTO chunk_usage (bucket, stored, chunks) SELECT bucket, SUM(stored), COUNT(*) FROM chunks GROUP BY bucket;
""",
    "snapshot_blobs": """
DELETE FROM snapshot_blobs;
INSERT INTO snapshot_blobs (blob_id, refs)
    SELECT blob_id, COUNT(*) FROM snapshot_objects WHERE blob_id != '' GROUP BY blob_id;
""",
}

#: Statements a salvage runs after the rows are copied and :data:`DERIVED_TABLES`
#: rebuilt, so the chunk store's rows agree with the versions saved:
#: ``(what the statement drops or fixes, SQL)``; the report counts each. A
#: manifest whose chunk list was not saved whole is dropped (never served with
#: chunks missing): the next start gives its version the one-file manifest of
#: :meth:`~._chunks.ChunkStore.recover` (right for raw data stored whole; any
#: other version reads as damaged). Data files no saved chunk names are moved
#: to ``lost+found/`` by the salvage, never deleted.
AFTER_SALVAGE: tuple[tuple[str, str], ...] = (
    ("manifests no saved version or snapshot names",
     "DELETE FROM manifests WHERE blob_id NOT IN (SELECT blob_id FROM objects)"
     " AND blob_id NOT IN (SELECT blob_id FROM versions)"
     " AND blob_id NOT IN (SELECT blob_id FROM snapshot_objects)"),
    ("manifests whose chunk list was not saved whole",
     "DELETE FROM manifests WHERE (chunks, size) IS NOT (SELECT COUNT(*), COALESCE(SUM(c.size), 0)"
     " FROM manifest_chunks AS m JOIN chunks AS c ON c.chunk_id = m.chunk_id WHERE m.blob_id = manifests.blob_id)"),
    ("chunk list rows of a manifest dropped or lost",
     "DELETE FROM manifest_chunks WHERE blob_id NOT IN (SELECT blob_id FROM manifests)"),
    ("chunk reference counts corrected",
     "UPDATE chunks SET refs = (SELECT COUNT(*) FROM manifest_chunks AS m WHERE m.chunk_id = chunks.chunk_id)"
     " WHERE refs != (SELECT COUNT(*) FROM manifest_chunks AS m WHERE m.chunk_id = chunks.chunk_id)"),
    ("chunks no saved manifest uses", "DELETE FROM chunks WHERE refs = 0"),
    ("damage marks of chunks dropped",
     "DELETE FROM damaged_chunks WHERE chunk_id NOT IN (SELECT chunk_id FROM chunks)"),
)
