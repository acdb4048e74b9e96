"""The catalog's integrity check: run on every open and by ``gpufeed catalog check``.

What it checks, in order, each step only when the one before passed:

1. the file's header: at least 100 bytes beginning ``SQLite format 3\\0``
   (https://www.sqlite.org/fileformat2.html#the_database_header);
2. the schema version (``PRAGMA user_version``): one newer than this gpufeed's
   is refused (:class:`~gpufeed.errors.CatalogTooNew`), a negative one is damage;
3. level ``"quick"``: ``PRAGMA quick_check`` (every b-tree page of every table
   and index is well formed, records fit their pages, no page is used twice or
   lost); level ``"full"``: ``PRAGMA integrity_check`` (the same, plus every
   index holds exactly its table's rows and constraints hold);
   https://www.sqlite.org/pragma.html#pragma_quick_check
4. ``PRAGMA foreign_key_check`` (nothing while no table declares a foreign key);
5. a catalog of the current schema version has every table and index a fresh
   one has (a damaged schema page can drop them silently).

Level ``"off"`` runs steps 1, 2 and 5 only. Cost on a catalog of 1,000,000
objects (893 MB with their manifests and chunks; ``scripts/catalog_check_cost.py``,
``docs/catalog.md``): ``quick_check`` 4.3 s with the file in the page cache, 11 s
from a cold cache, on a 2-core VM shared with other jobs.

The check only reads: it opens the file read-only (``mode=ro``), so SQLite
neither writes nor checkpoints it, even when it finds damage.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sqlite3
import time

from ..errors import CatalogDamaged, CatalogTooNew
from ._schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, add_columns

__all__ = ["CHECK_LEVELS", "CatalogCheck", "check_catalog", "require_healthy", "expected_schema",
           "SQLITE_MAGIC", "recover_hint", "require_catalog_beside_data"]

#: The levels of :func:`check_catalog`.
CHECK_LEVELS = ("quick", "full", "off")
#: The first 16 bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_BYTES = 100
#: Most problems a check reports (SQLite stops listing there too).
_MAX_PROBLEMS = 100


@dataclasses.dataclass(frozen=True)
class CatalogCheck:
    """What :func:`check_catalog` found.

    Attributes:
        path: the catalog file.
        level: ``"quick"``, ``"full"`` or ``"off"``.
        problems: one line per problem found, as SQLite words them; empty when healthy.
        schema_version: ``PRAGMA user_version``, ``None`` when it could not be read.
        too_new: the schema version is newer than this gpufeed's.
        seconds: how long the check took, s.
    """

    path: str
    level: str
    problems: tuple[str, ...]
    schema_version: int | None
    too_new: bool
    seconds: float

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.problems

    def as_dict(self) -> dict:
        """The report as JSON-ready values (``ok`` included)."""
        return {**dataclasses.asdict(self), "problems": list(self.problems), "ok": self.ok}


@functools.cache
def expected_schema() -> dict[str, str]:
    """``name -> type`` of every table, index and trigger a fresh catalog has
    (``type`` as in ``sqlite_schema``: ``"table"``, ``"index"``, ``"trigger"``)."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        steps = " ".join(MIGRATIONS[v] for v in range(1, SCHEMA_VERSION))
        db.executescript(f"BEGIN; {SCHEMA} {steps} COMMIT;")
        add_columns(db)
        rows = db.execute("SELECT name, type FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'").fetchall()
    finally:
        db.close()
    return dict(rows)


def _header_problem(path: str) -> str | None:
    with open(path, "rb") as f:
        head = f.read(_HEADER_BYTES)
    if len(head) < _HEADER_BYTES:
        return f"the file is {len(head)} bytes, shorter than a database header ({_HEADER_BYTES} bytes)"
    if not head.startswith(SQLITE_MAGIC):
        return "the file does not begin with the SQLite header (not a database, or its first page is overwritten)"
    return None


def _check_rows(db: sqlite3.Connection, level: str, version: int) -> list[str]:
    """Steps 3 to 5 of the module docstring on an open read-only connection."""
    problems: list[str] = []
    if level != "off":
        pragma = "quick_check" if level == "quick" else "integrity_check"
        for (row,) in db.execute(f"PRAGMA {pragma}({_MAX_PROBLEMS})"):
            # One problem per line; SQLite heads the first with "*** in database main ***".
            problems += [line for line in row.splitlines()
                         if line.strip() and line != "ok" and not line.startswith("*** in database")]
        for table, rowid, parent, _ in db.execute("PRAGMA foreign_key_check").fetchmany(_MAX_PROBLEMS):
            problems.append(f"table {table} row {rowid}: refers to a missing row of {parent}")
    if version == SCHEMA_VERSION:
        have = dict(db.execute("SELECT name, type FROM sqlite_schema"))
        problems += [f"{kind} {name} is missing" for name, kind in expected_schema().items()
                     if have.get(name) != kind]
    return problems


def check_catalog(path: str, level: str = "quick") -> CatalogCheck:
    """Check the catalog file at ``path`` without changing it.

    A missing or empty file passes (a fresh catalog is made there).

    Args:
        path: the catalog file (``<data_dir>/catalog.sqlite3``).
        level: ``"quick"``, ``"full"`` or ``"off"`` (see the module docstring).

    Returns:
        The report; ``ok`` is false when anything was found.

    Raises:
        ValueError: an unknown level.
        OSError: the file exists but cannot be read.
    """
    if level not in CHECK_LEVELS:
        raise ValueError(f"catalog check level {level!r} is not one of {', '.join(CHECK_LEVELS)}")
    start = time.perf_counter()
    version: int | None = None
    too_new = False
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        problems: list[str] = []
    elif (header := _header_problem(path)) is not None:
        problems = [header]
    else:
        problems = []
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            raise OSError(f"cannot open catalog {path} to check it: {exc}") from exc
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                too_new = True
                problems = [f"schema version {version} is newer than this gpufeed's {SCHEMA_VERSION}"]
            elif version < 0:
                problems = [f"schema version {version} is negative"]
            else:
                problems = _check_rows(db, level, version)
        except sqlite3.DatabaseError as exc:  # the schema or a page SQLite needed is unreadable
            problems.append(str(exc))
        finally:
            db.close()
    return CatalogCheck(path, level, tuple(problems), version, too_new, time.perf_counter() - start)


def recover_hint(data_dir: str) -> str:
    """The sentence that tells an operator how to recover the catalog of ``data_dir``."""
    return (f"To recover, with no node running on the folder, run `gpufeed catalog recover --data-dir {data_dir}`: "
            f"it keeps the damaged file beside the new one (renamed with the time, never deleted), rebuilds the "
            f"catalog from every row it can still read, moves data files no saved row names into "
            f"{os.path.join(data_dir, 'lost+found')} and reports what it saved and what was lost "
            f"(`gpufeed catalog check --data-dir {data_dir}` lists the problems).")


def require_healthy(path: str, level: str = "quick") -> CatalogCheck:
    """:func:`check_catalog`, raising when it finds anything.

    Returns:
        The (healthy) report.

    Raises:
        CatalogTooNew: a newer gpufeed wrote the catalog.
        CatalogDamaged: anything else was found; the message is one paragraph
            naming the problems and the recovery command.
        ValueError: an unknown level.
    """
    report = check_catalog(path, level)
    if report.too_new:
        raise CatalogTooNew(f"catalog {path} has schema version {report.schema_version}, newer than this "
                            f"gpufeed's {SCHEMA_VERSION}; open it with a newer gpufeed")
    if not report.ok:
        shown = "; ".join(report.problems[:3])
        more = f" (and {len(report.problems) - 3} more)" if len(report.problems) > 3 else ""
        data_dir = os.path.dirname(os.path.abspath(path))
        raise CatalogDamaged(f"the catalog {path} is damaged: {shown}{more}. The node did not start and did "
                             f"not change the file. {recover_hint(data_dir)}", problems=report.problems)
    return report


def _holds_a_file(folder: str) -> bool:
    for _, _, files in os.walk(folder):
        if files:
            return True
    return False


def require_catalog_beside_data(path: str, data_folders: tuple[str, ...]) -> None:
    """Refuse a missing (or empty) catalog beside data files: opening it would make
    a fresh, empty catalog, and the start-up sweep would delete every data file.

    Args:
        path: the catalog file.
        data_folders: the folders of data files the catalog's rows name.

    Raises:
        CatalogDamaged: the catalog is missing or empty while a data folder holds files.
    """
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return
    if any(_holds_a_file(d) for d in data_folders):
        data_dir = os.path.dirname(os.path.abspath(path))
        raise CatalogDamaged(f"the catalog {path} is missing or empty, but the data folder holds object data "
                             f"files; starting would forget them. The node did not start and changed nothing. "
                             f"Put the catalog back if you have it, or: {recover_hint(data_dir)}")
