"""``gpufeed catalog recover``: rebuild a damaged catalog from the rows it still holds.

Python's ``sqlite3`` has no ``.recover``, and the ``sqlite3`` command line may
be missing where a node runs, so the salvage is row by row with the module
itself, generic over tables (every table a fresh catalog has, columns matched
by name):

1. The damaged file (and its ``-wal``) is copied to ``tmp/``; the salvage reads
   only the copy. A copy whose 100-byte header is overwritten gets a rebuilt
   header (page size found by trial), so the pages behind it stay readable.
2. Each table is read in primary-key order until the first unreadable page,
   then in reverse order up to the same place. Rows between damaged pages are
   then reached key by key through a secondary index of the table (which also
   counts the rows the table held, so the loss is known), or, for a table with
   none, by reading both ways from keys halfway between the rows already saved.
   Rows go into a fresh catalog made with the current schema.
   :data:`~._schema.DERIVED_TABLES` are rebuilt from the saved rows instead;
   buckets that saved rows name but whose own row was lost are recreated with
   default settings, owned by the default tenant.
   Then :data:`~._schema.AFTER_SALVAGE` makes the chunk store agree with the
   versions saved (no manifest is kept with chunks missing).
3. The damaged files are kept as ``catalog.sqlite3.damaged-<UTC time>``
   (never deleted), and the new catalog takes the catalog's name.
4. Data files no saved chunk names (nor a version the next start gives a
   one-file manifest) are moved to ``lost+found/<UTC time>/`` (``blobs/<file>``,
   ``uploads/<upload_id>/...``), never deleted, so the start-up sweep finds
   nothing to remove.
"""

from __future__ import annotations

import collections
import dataclasses
import fcntl
import os
import shutil
import sqlite3
import struct
import time
from pathlib import Path

from ..errors import CatalogDamaged, CatalogTooNew, DataFolderInUse
from ._blobs import BlobFiles, fsync_dir
from ._catalogcheck import (
    SQLITE_MAGIC,
    CatalogCheck,
    check_catalog,
    expected_schema,
    require_catalog_beside_data,
)
from ._private import FILE_MODE, make_private_dirs
from ._schema import AFTER_SALVAGE, DERIVED_TABLES, SCHEMA_VERSION
from ._sqlite import SqliteCatalog

__all__ = ["TableSalvage", "CatalogRecovery", "recover_catalog", "check_data_dir", "CATALOG_NAME"]

#: The catalog's file name in a data folder.
CATALOG_NAME = "catalog.sqlite3"
#: The folders of data files that catalog rows name (as :class:`BlobFiles` lays them out).
_DATA_FOLDERS = ("blobs", "uploads")
#: Rows one statement of a scan reads.
_BATCH_ROWS = 1024
#: Most reads from keys between damaged pages, per table without a secondary index.
_PROBES = 256
_PAGE_SIZES = (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512)


@dataclasses.dataclass(frozen=True)
class TableSalvage:
    """What the salvage saved of one table.

    Attributes:
        table: its name.
        rows: rows copied into the new catalog.
        known: rows the damaged catalog's index of the table listed; ``None``
            when the table has no readable secondary index.
        damaged: part of the table could not be read.
        errors: what SQLite said about the unreadable parts (at most 5).
    """

    table: str
    rows: int
    known: int | None
    damaged: bool
    errors: tuple[str, ...] = ()

    @property
    def lost(self) -> int | None:
        """Rows known to be lost (``known - rows``); ``None`` when unknown."""
        return None if self.known is None else max(self.known - self.rows, 0)


@dataclasses.dataclass(frozen=True)
class CatalogRecovery:
    """What :func:`recover_catalog` did.

    Attributes:
        data_dir: the data folder.
        before: the check of the catalog before recovery.
        recovered: a new catalog was built (false when the catalog was healthy).
        kept: the damaged files, renamed (never deleted).
        header_rebuilt: the damaged file's header was overwritten and rebuilt in the copy read.
        schema_error: why the damaged catalog's table list could not be read (then nothing was saved).
        tables: per-table results.
        buckets_recreated: buckets recreated with default settings for saved rows.
        fixes: rows dropped or corrected so the chunk store agrees with the
            versions saved (:data:`~._schema.AFTER_SALVAGE`; only those that changed rows).
        lost_found: where unreferenced data files were moved, or ``None``.
        moved: counts of what was moved there: ``{"blobs": n, "uploads": n, "parts": n}``.
        missing_files: data files the saved rows name that do not exist.
        after: the full integrity check of the new catalog.
    """

    data_dir: str
    before: CatalogCheck
    recovered: bool
    kept: tuple[str, ...] = ()
    header_rebuilt: bool = False
    schema_error: str | None = None
    tables: tuple[TableSalvage, ...] = ()
    buckets_recreated: tuple[str, ...] = ()
    fixes: dict[str, int] = dataclasses.field(default_factory=dict)
    lost_found: str | None = None
    moved: dict[str, int] = dataclasses.field(default_factory=dict)
    missing_files: int = 0
    after: CatalogCheck | None = None

    def as_dict(self) -> dict:
        """The report as JSON-ready values."""
        d = dataclasses.asdict(self)
        d["before"] = self.before.as_dict()
        d["after"] = self.after.as_dict() if self.after else None
        d["tables"] = [{**dataclasses.asdict(t), "lost": t.lost} for t in self.tables]
        return d


def _rebuild_header(path: str) -> bool:
    """Write a plausible database header over a copy whose header is gone; keeps
    the first page size under which the schema reads. Returns whether one did."""
    with open(path, "r+b") as f:
        rest = f.read()[100:]
        for size in _PAGE_SIZES:
            header = (SQLITE_MAGIC + struct.pack(">HBBBBBB", size if size < 65536 else 1, 2, 2, 0, 64, 32, 32)
                      + struct.pack(">IIIIIIIIIIII", 1, 0, 0, 0, 1, 4, 0, 0, 1, 0, 0, 0)
                      + bytes(20) + struct.pack(">II", 0, 3040001))
            f.seek(0)
            f.write(header + rest)
            f.flush()
            try:
                db = sqlite3.connect(path)
                try:
                    names = [r[0] for r in db.execute("SELECT name FROM sqlite_schema WHERE type='table'")]
                finally:
                    db.close()
            except sqlite3.DatabaseError:
                continue
            if names:
                return True
    return False


def _columns(db: sqlite3.Connection, table: str) -> tuple[list[str], list[str]]:
    """``(columns, primary key columns)`` of ``table``; the key is ``["rowid"]`` when it declares none."""
    info = db.execute(f'PRAGMA table_info("{table}")').fetchall()
    cols = [r[1] for r in info]
    pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    return cols, pk or ["rowid"]


class _TableCopy:
    """Copies the readable rows of one table from ``src`` into ``dst``."""

    def __init__(self, src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> None:
        self.src, self.dst, self.table = src, dst, table
        src_cols, _ = _columns(src, table)
        dst_cols, self.pk = _columns(dst, table)
        self.cols = [c for c in dst_cols if c in src_cols]
        if self.pk == ["rowid"]:
            self.cols = ["rowid", *self.cols]
        names = ", ".join(f'"{c}"' for c in self.cols)
        self.select = f'SELECT {names} FROM "{table}"'
        self.insert = f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(self.cols))})'
        self.where_pk = " AND ".join(f'"{c}" IS ?' for c in self.pk)
        self.key_at = [self.cols.index(c) for c in self.pk]
        self.rows = 0
        self.errors: list[str] = []

    def _have(self, key: tuple) -> bool:
        return self.dst.execute(f'SELECT 1 FROM "{self.table}" WHERE {self.where_pk}', key).fetchone() is not None

    def _put(self, row: tuple) -> None:
        try:
            self.dst.execute(self.insert, row)
            self.rows += 1
        except sqlite3.IntegrityError as exc:  # a garbled row that decoded: refuse it
            self.errors.append(f"row refused: {exc}")

    def _rows_from(self, start: tuple | None, inclusive: bool, descending: bool, limit: int) -> list:
        """Up to ``limit`` rows from key ``start`` on, in key order (reverse order when ``descending``)."""
        cols = ", ".join(f'"{c}"' for c in self.pk)
        order = ", ".join(f'"{c}"{" DESC" if descending else ""}' for c in self.pk)
        where = ""
        if start is not None:
            op = ("<" if descending else ">") + ("=" if inclusive else "")
            where = f" WHERE ({cols}) {op} ({', '.join('?' * len(start))})"
        return self.src.execute(f"{self.select}{where} ORDER BY {order} LIMIT {limit}", start or ()).fetchall()

    def scan(self, descending: bool, start: tuple | None = None, bound: tuple | None = None,
             inclusive: bool = True) -> tuple[bool, tuple | None]:
        """Copy rows in key order from ``start`` (``None``: the first key) until
        the first unreadable one, a row at or past ``bound``, or (in reverse
        order without a bound) a row already copied.

        Rows are read in batches; after a batch that fails, one row at a time (a
        statement reads a step ahead of the row it returns, so only ``LIMIT 1``
        returns the last row before a damaged page).

        Returns:
            ``(reached_the_end_or_bound, last key copied or None)``.
        """
        last: tuple | None = None
        limit = _BATCH_ROWS
        while True:
            try:
                rows = self._rows_from(last or start, inclusive and last is None, descending, limit)
            except sqlite3.DatabaseError as exc:
                if limit == 1:
                    self.errors.append(str(exc))
                    return False, last
                limit = 1
                continue
            if not rows:
                return True, last
            for row in rows:
                key = tuple(row[i] for i in self.key_at)
                if bound is not None and (_order(key) <= _order(bound) if descending
                                          else _order(key) >= _order(bound)):
                    return True, last
                if bound is None and descending and self._have(key):
                    return True, last
                self._put(row)
                last = key

    def probe(self, lo: tuple, hi: tuple) -> None:
        """Look for readable rows between keys ``lo`` and ``hi`` (both copied), which
        lie between damaged pages: read both ways from a key halfway between them,
        and keep halving the stretches still unread (at most :data:`_PROBES` reads)."""
        gaps = collections.deque([(lo, hi)])
        probes = 0
        while gaps and probes < _PROBES:
            lo, hi = gaps.popleft()
            mid = _midpoint(lo, hi)
            if mid is None:
                continue
            probes += 1
            up_ok, up = self.scan(False, start=mid, bound=hi)
            down_ok, down = self.scan(True, start=mid, bound=lo, inclusive=False)
            if not down_ok:
                gaps.append((lo, down or mid))
            if not up_ok:
                gaps.append((up or mid, hi))

    def by_index(self) -> int | None:
        """Copy, key by key through the first readable secondary index, the rows
        the scans missed. Returns how many keys that index lists (``None``: none read)."""
        key_cols = ", ".join(f'"{c}"' for c in self.pk)
        indexes = [r[1] for r in self.src.execute(f'PRAGMA index_list("{self.table}")') if r[3] == "c"]
        for index in indexes:
            try:
                quoted = index.replace('"', '""')  # a name read from the damaged file: quoted as SQL says
                keys = self.src.execute(f'SELECT {key_cols} FROM "{self.table}" INDEXED BY "{quoted}"').fetchall()
            except sqlite3.DatabaseError as exc:
                self.errors.append(f"index {index}: {exc}")
                continue
            for key in keys:
                if not self._have(key):
                    row = self._lookup(key)
                    if row is not None:
                        self._put(row)
            return len(keys)
        return None

    def _lookup(self, key: tuple) -> tuple | None:
        """The row of ``key``, or ``None`` when it is unreadable. A WITHOUT ROWID
        table keeps rows in its interior pages too, and an equality seek of such a
        row descends into the child left of it: when that child is damaged, the
        row is reached from the right instead (the last row ``<= key``)."""
        try:
            return self.src.execute(f"{self.select} WHERE {self.where_pk}", key).fetchone()
        except sqlite3.DatabaseError:
            pass
        cols = ", ".join(f'"{c}"' for c in self.pk)
        desc = ", ".join(f'"{c}" DESC' for c in self.pk)
        try:
            row = self.src.execute(f"{self.select} WHERE ({cols}) <= ({', '.join('?' * len(key))})"
                                   f" ORDER BY {desc} LIMIT 1", key).fetchone()
        except sqlite3.DatabaseError:
            return None
        return row if row is not None and tuple(row[i] for i in self.key_at) == tuple(key) else None


def _order(key: tuple) -> tuple:
    """A key as SQLite orders it: NULL, then numbers, then text (by code point,
    which is UTF-8 byte order), then blobs."""
    return tuple((0, 0) if v is None else (1, v) if isinstance(v, (int, float))
                 else (2, v) if isinstance(v, str) else (3, bytes(v)) for v in key)


def _mid_text(a: str, b: str) -> str | None:
    """A string between ``a`` and ``b`` (code points as digits of one number, averaged)."""
    n, base = max(len(a), len(b)) + 1, 0x110001
    def value(s: str) -> int:
        v = 0
        for i in range(n):
            v = v * base + (ord(s[i]) + 1 if i < len(s) else 0)
        return v
    m = (value(a) + value(b)) // 2
    digits = []
    for _ in range(n):
        m, d = divmod(m, base)
        digits.append(d)
    chars = []
    for d in reversed(digits):
        if d == 0:
            break
        chars.append(chr(0xE000 if 0xD800 <= d - 1 <= 0xDFFF else d - 1))
    text = "".join(chars)
    return text if a < text < b else None


def _midpoint(lo: tuple, hi: tuple) -> tuple | None:
    """A key strictly between keys ``lo`` and ``hi`` (the columns after the first
    that differs are the least value, -inf), or ``None`` when none is found."""
    i = next((j for j, (x, y) in enumerate(zip(lo, hi)) if x != y), None)
    if i is None:
        return None
    a, b = lo[i], hi[i]
    m: object = None
    if isinstance(a, str) and isinstance(b, str):
        m = _mid_text(a, b)
    elif isinstance(a, int) and isinstance(b, int):
        m = (a + b) // 2
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        m = (a + b) / 2
    if m is None:
        return None
    key = (*lo[:i], m, *([float("-inf")] * (len(lo) - i - 1)))
    return key if _order(lo) < _order(key) < _order(hi) else None


def _salvage_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> TableSalvage:
    try:
        copy = _TableCopy(src, dst, table)
    except sqlite3.DatabaseError as exc:
        return TableSalvage(table, 0, None, True, (str(exc),))
    if not copy.cols or copy.cols == ["rowid"]:  # the damaged catalog predates this table
        return TableSalvage(table, 0, None, False)
    whole, lo = copy.scan(descending=False)
    known = None
    if not whole:
        _, hi = copy.scan(descending=True)
        known = copy.by_index()
        if known is None and lo is not None and hi is not None:
            copy.probe(lo, hi)
    damaged = not whole or bool(copy.errors)
    return TableSalvage(table, copy.rows, known, damaged, tuple(copy.errors[:5]))


def _recreate_buckets(dst: sqlite3.Connection, tables: list[str]) -> list[str]:
    """Insert a default row for every bucket a saved row names that ``buckets`` lacks."""
    named: set[str] = set()
    for t in tables:
        if t != "buckets" and "bucket" in _columns(dst, t)[0]:
            named.update(r[0] for r in dst.execute(f'SELECT DISTINCT bucket FROM "{t}"'))
    have = {r[0] for r in dst.execute("SELECT name FROM buckets")}
    missing = sorted(named - have)
    now = time.time()
    dst.executemany("INSERT INTO buckets (name, created) VALUES (?, ?)", [(b, now) for b in missing])
    return missing


def _copy_source(path: str, work: str) -> str:
    """Copy the damaged catalog and its WAL into ``work``; returns the copy's path."""
    make_private_dirs(work)
    src = os.path.join(work, CATALOG_NAME)
    for suffix in ("", "-wal"):
        if os.path.exists(path + suffix):
            shutil.copyfile(path + suffix, src + suffix)
    return src


def _salvage(source: str, dest: str) -> tuple[bool, str | None, list[TableSalvage], list[str], dict[str, int]]:
    """Copy what ``source`` holds into the fresh catalog ``dest``.

    Returns:
        ``(header_rebuilt, schema_error, tables, buckets_recreated, fixes)``;
        ``fixes``: rows each :data:`~._schema.AFTER_SALVAGE` statement changed.
    """
    SqliteCatalog(dest, fsync=True, check="off").close()
    dst = sqlite3.connect(dest, isolation_level=None)
    dst.execute("PRAGMA recursive_triggers=ON")  # as the catalog's writer: derived rows follow
    rebuilt = False
    if os.path.exists(source):
        with open(source, "rb") as f:
            head = f.read(16)
        if head and head != SQLITE_MAGIC:
            rebuilt = _rebuild_header(source)
    tables = [n for n, kind in expected_schema().items() if kind == "table" and n not in DERIVED_TABLES]
    results: list[TableSalvage] = []
    schema_error = None
    try:
        src = sqlite3.connect(source, isolation_level=None)
        try:
            have = {r[0] for r in src.execute("SELECT name FROM sqlite_schema WHERE type='table'")}
        except sqlite3.DatabaseError:
            try:  # a damaged schema entry: read the table list without parsing every entry
                src.execute("PRAGMA writable_schema=ON")
                have = {r[0] for r in src.execute("SELECT name FROM sqlite_schema WHERE type='table'")}
            except sqlite3.DatabaseError as exc:
                have, schema_error = set(), str(exc)
        dst.execute("BEGIN IMMEDIATE")
        for t in tables:
            results.append(_salvage_table(src, dst, t) if t in have else TableSalvage(t, 0, None, False))
        recreated = _recreate_buckets(dst, tables)
        dst.execute("COMMIT")
        dst.executescript("BEGIN; " + " ".join(DERIVED_TABLES.values()) + " COMMIT;")
        dst.execute("BEGIN IMMEDIATE")
        fixes = {what: dst.execute(sql).rowcount for what, sql in AFTER_SALVAGE}
        dst.execute("COMMIT")
        src.close()
    finally:
        dst.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        dst.close()
    return rebuilt, schema_error, results, recreated, fixes


def _keep_damaged(path: str, stamp: str) -> list[str]:
    """Give the damaged catalog and its WAL a name of their own (hard links; then
    the WAL leaves the catalog's name, and the ``-shm`` index, which SQLite
    rebuilds from the WAL, goes). Returns the new names."""
    kept = []
    for suffix in ("", "-wal"):
        if os.path.exists(path + suffix):
            new = f"{path}.damaged-{stamp}{suffix}"
            os.link(path + suffix, new)
            kept.append(new)
            if suffix:
                os.unlink(path + suffix)
    if os.path.exists(path + "-shm"):
        os.unlink(path + "-shm")
    return kept


def _stamp(root: Path) -> str:
    """The UTC time that names this recovery's kept files and lost+found folder,
    made unique among earlier recoveries of the folder."""
    stamp = base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    n = 1
    while (root / f"{CATALOG_NAME}.damaged-{stamp}").exists() or (root / "lost+found" / stamp).exists():
        n += 1
        stamp = f"{base}-{n}"
    return stamp


def _lock(data_dir: Path) -> int:
    fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise DataFolderInUse(f"data folder {data_dir} is in use by a running gpufeed node; stop it first") from exc
    return fd


def check_data_dir(data_dir: str | Path, level: str = "quick") -> CatalogCheck:
    """:func:`~._catalogcheck.check_catalog` of the catalog of ``data_dir``, which
    also reports a catalog missing beside data files. Changes nothing.

    Args:
        data_dir: the node's data folder.
        level: ``"quick"``, ``"full"`` or ``"off"``.

    Raises:
        FileNotFoundError: ``data_dir`` does not exist.
        ValueError: an unknown level.
    """
    root = Path(data_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder at {root}")
    path = str(root / CATALOG_NAME)
    report = check_catalog(path, level)
    try:
        require_catalog_beside_data(path, tuple(str(root / d) for d in _DATA_FOLDERS))
    except CatalogDamaged:
        problem = "the catalog is missing or empty, but the data folder holds data files"
        report = dataclasses.replace(report, problems=(*report.problems, problem))
    return report


def recover_catalog(data_dir: str | Path, *, force: bool = False) -> CatalogRecovery:
    """Rebuild the catalog of ``data_dir`` from what its damaged file still holds
    (the steps in the module docstring). The node must be stopped.

    Args:
        data_dir: the node's data folder.
        force: rebuild even when the catalog passes its check.

    Returns:
        The report; ``recovered`` is false when the catalog was healthy and
        ``force`` was not given (then nothing changed).

    Raises:
        DataFolderInUse: a node has the folder open.
        CatalogTooNew: a newer gpufeed wrote the catalog (recover it with that one).
        FileNotFoundError: ``data_dir`` does not exist.
    """
    root = Path(data_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder at {root}")
    fd = _lock(root)
    try:
        path = str(root / CATALOG_NAME)
        before = check_data_dir(root, "quick")
        if before.too_new:
            raise CatalogTooNew(f"catalog {path} has schema version {before.schema_version}, newer than this "
                                f"gpufeed's {SCHEMA_VERSION}; recover it with that gpufeed")
        if before.ok and not force:
            return CatalogRecovery(str(root), before, recovered=False)
        stamp = _stamp(root)
        work = str(root / "tmp" / f"salvage-{stamp}")
        new = f"{path}.recovering"
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(new + suffix):
                os.unlink(new + suffix)  # left by a recovery that was interrupted
        try:
            rebuilt, schema_error, tables, recreated, fixes = _salvage(_copy_source(path, work), new)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        kept = _keep_damaged(path, stamp)
        os.replace(new, path)
        fsync_dir(str(root))
        after_cat = SqliteCatalog(path, fsync=True, check="full")
        try:
            parts = after_cat.live_files().parts
            # Data files of saved chunks, and the one-file data of versions the next
            # start gives a manifest (ChunkStore.recover adopts them).
            named = after_cat.data_files() | {row[0] for row in after_cat.unmanifested_blobs()}
        finally:
            after_cat.close()
        lost_found = str(root / "lost+found" / stamp)
        files = BlobFiles(root, fsync=True)
        moved = files.sweep(named, parts, lost_found=lost_found)
        moved.pop("tmp", None)
        if any(moved.values()):
            os.sync()  # the moves are renames: make them durable before the next start's sweep
        missing = sum(1 for f in named if not os.path.exists(files.blob_path(f)))
        return CatalogRecovery(
            str(root), before, True, tuple(kept), rebuilt, schema_error, tuple(tables), tuple(recreated),
            {k: n for k, n in fixes.items() if n}, lost_found if any(moved.values()) else None, moved, missing,
            check_catalog(path, "full"))
    finally:
        os.close(fd)
