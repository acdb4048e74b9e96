"""The SQLite catalog: schema, connections and the single-writer transaction.

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
(:meth:`Catalog.write`). Statements are prepared once per connection by the
``sqlite3`` statement cache. Source: https://www.sqlite.org/wal.html
"""

from __future__ import annotations

import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import InternalError

__all__ = ["Catalog", "SCHEMA_VERSION"]

#: Bumped when the schema changes; stored in ``PRAGMA user_version``.
SCHEMA_VERSION = 1

_SCHEMA = """
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
)


def _add_columns(w: sqlite3.Connection) -> None:
    """Add the :data:`_ADDED_COLUMNS` a catalog lacks (inside the caller's transaction)."""
    have: dict[str, set[str]] = {}
    for table, column, decl in _ADDED_COLUMNS:
        if table not in have:
            have[table] = {row[1] for row in w.execute(f"PRAGMA table_info({table})")}
        if column not in have[table]:
            w.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            have[table].add(column)


_MMAP_BYTES = 256 << 20  # 256 MiB of the catalog file mapped per connection
_BUSY_TIMEOUT_S = 30.0


class Catalog:
    """Connections to ``catalog.sqlite3``.

    Args:
        path: the database file.
        fsync: ``synchronous=FULL`` (every commit is durable) when true,
            ``NORMAL`` otherwise (durable at checkpoints; still atomic).

    Raises:
        InternalError: the file is not a gpufeed catalog or cannot be opened.
    """

    def __init__(self, path: str, *, fsync: bool) -> None:
        self._path = path
        self._closed = False
        self._wlock = threading.Lock()
        self._on_commit: list | None = None  # hooks of the open write transaction
        self._rlock = threading.Lock()
        self._local = threading.local()
        self._readers: dict[int, tuple[weakref.ref[threading.Thread], sqlite3.Connection]] = {}
        try:
            w = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise InternalError(f"cannot open catalog {path}: {exc}") from exc
        try:
            mode = w.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise InternalError(f"catalog {path}: cannot enable WAL (got {mode!r})")
            w.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            w.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")
            version = w.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise InternalError(f"catalog {path} has schema version {version}; expected {SCHEMA_VERSION}")
            w.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version={SCHEMA_VERSION};")
            try:
                _add_columns(w)
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

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement inside sees one committed state."""
        c = self.reader()
        c.execute("BEGIN")
        try:
            yield c
        finally:
            c.execute("COMMIT")

    # writing ------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """The one write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``).

        Commits when the block ends normally, rolls back on an exception. Only
        one thread writes at a time.

        Raises:
            InternalError: SQLite failed (disk full, I/O error); translated
                from ``sqlite3.Error``.
        """
        with self._wlock:
            if self._closed:
                raise InternalError("the engine is closed")
            w = self._writer
            self._on_commit = hooks = []
            try:
                w.execute("BEGIN IMMEDIATE")
                try:
                    yield w
                except BaseException:
                    w.execute("ROLLBACK")
                    raise
                w.execute("COMMIT")
            except sqlite3.Error as exc:
                if w.in_transaction:
                    w.execute("ROLLBACK")
                raise InternalError(f"catalog write failed: {exc}") from exc
            finally:
                self._on_commit = None
            for fn in hooks:
                fn()

    def on_commit(self, fn) -> None:
        """Run ``fn()`` right after the current :meth:`write` transaction commits
        (not at all if it rolls back), still under the write lock, so in-memory
        state that mirrors the catalog changes in commit order. Call only
        inside :meth:`write`; ``fn`` must not raise.
        """
        hooks = self._on_commit
        if hooks is None:
            raise InternalError("on_commit called outside a write transaction")
        hooks.append(fn)

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

