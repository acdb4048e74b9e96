"""Which catalog a node opens: a registry of catalog URL schemes.

``""`` (the default) is the SQLite catalog in ``<data_dir>/catalog.sqlite3``;
``postgresql://...`` (or ``postgres://...``) a PostgreSQL database
(:mod:`._postgres`, needs the ``postgres`` extra). A data folder whose
catalog is in PostgreSQL says so in ``<data_dir>/catalog.postgresql`` (the
database's ``user@host:port/dbname``, no password), so that starting it
without ``--catalog`` is refused instead of starting an empty SQLite
catalog beside its data; and it holds its id in ``<data_dir>/node.id``
(random, made on first use), which the PostgreSQL catalog records as its
owner unless the node runs with a cluster name.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CatalogDamaged, InvalidArgument
from ._catalogcheck import require_catalog_beside_data
from ._private import FILE_MODE
from ._sqlite import SqliteCatalog
from .catalog import Catalog

__all__ = ["CatalogSettings", "open_catalog", "catalog_scheme", "POSTGRES_MARKER", "is_postgres", "node_id"]

log = logging.getLogger("gpufeed.catalog")

#: The file in a data folder that names the PostgreSQL database holding its catalog.
POSTGRES_MARKER = "catalog.postgresql"
_NODE_ID = "node.id"
#: A libpq connection string of ``key=value`` pairs (what it starts with).
_CONNINFO = re.compile(r"\s*[A-Za-z_]+\s*=")


@dataclass(frozen=True)
class CatalogSettings:
    """Where a node's catalog lives and how it is opened.

    Attributes:
        url: ``""`` for SQLite in the data folder, or ``postgresql://user:password@host:port/dbname``.
        pool_size: PostgreSQL: most connections the node opens (>= 2).
        pool_timeout_s: PostgreSQL: seconds a request waits for a connection
            (also while the database is unreachable), or a write for the
            catalog's writer lock, before failing with 503.
        idle_tx_s: PostgreSQL: seconds the server lets a session of the node sit
            idle in a transaction before ending it.
        cluster: PostgreSQL: the cluster name recorded as the catalog's owner;
            ``""`` records the data folder's id instead.
        check: SQLite: the integrity check on open (``"quick"``, ``"full"``, ``"off"``).
    """

    url: str = ""
    pool_size: int = 8
    pool_timeout_s: float = 5.0
    idle_tx_s: float = 120.0
    cluster: str = ""
    check: str = "quick"


def catalog_scheme(url: str) -> str:
    """``"sqlite"`` or ``"postgresql"``, the kind of catalog ``url`` names.

    Raises:
        InvalidArgument: a URL of another scheme.
    """
    if not url:
        return "sqlite"
    if "://" not in url:
        if _CONNINFO.match(url):  # libpq's key=value form ("host=... dbname=...")
            return "postgresql"
        # not echoed: a mistyped URL may hold a password
        raise InvalidArgument("the catalog setting is neither a URL nor key=value pairs (its text is not shown: "
                              "it may hold a password); the catalog is '' (SQLite in the data folder) or "
                              "postgresql://user:password@host:port/dbname")
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    raise InvalidArgument(f"unknown catalog URL {scheme!r}://...: the catalog is '' (SQLite in "
                          "the data folder) or postgresql://user:password@host:port/dbname")


def is_postgres(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL catalog."""
    return catalog_scheme(url) == "postgresql"


def node_id(data_dir: Path) -> str:
    """The data folder's id (``<data_dir>/node.id``), made (random, ``0600``) on first use:
    what the PostgreSQL catalog records as its owner without a cluster name, and
    a cluster member's id."""
    path = data_dir / _NODE_ID
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path.read_text().strip()


def _holds_files(folders: tuple[str, ...]) -> bool:
    return any(files for d in folders for _, _, files in os.walk(d))


def _open_sqlite(settings: CatalogSettings, data_dir: Path, blob_path: Callable[[str], str],
                 data_folders: tuple[str, ...], fsync: bool) -> Catalog:
    marker = data_dir / POSTGRES_MARKER
    if marker.exists():
        where = marker.read_text().strip()
        raise CatalogDamaged(f"the data folder {data_dir} keeps its catalog in PostgreSQL ({where}); start the "
                             "node with --catalog postgresql://... (env GPUFEED_CATALOG) naming that database")
    path = str(data_dir / "catalog.sqlite3")
    require_catalog_beside_data(path, data_folders)
    return SqliteCatalog(path, fsync=fsync, blob_path=blob_path, check=settings.check)


def _open_postgres(settings: CatalogSettings, data_dir: Path, blob_path: Callable[[str], str],
                   data_folders: tuple[str, ...], fsync: bool) -> Catalog:
    from ._postgres import PostgresCatalog

    marker = data_dir / POSTGRES_MARKER
    sqlite = data_dir / "catalog.sqlite3"
    if not marker.exists() and sqlite.exists() and sqlite.stat().st_size > 0:
        raise CatalogDamaged(f"the data folder {data_dir} keeps its catalog in {sqlite}; a node has one catalog. "
                             "Start it without --catalog, or give the PostgreSQL catalog a data folder of its own")
    owner = f"cluster:{settings.cluster}" if settings.cluster else f"node:{node_id(data_dir)}"
    cat = PostgresCatalog(settings.url, blob_path=blob_path, owner=owner,
                          data_present=lambda: _holds_files(data_folders),
                          pool_size=settings.pool_size, pool_timeout_s=settings.pool_timeout_s,
                          idle_tx_s=settings.idle_tx_s, holder=node_id(data_dir))
    if settings.check != CatalogSettings.check:
        log.warning("--catalog-check %s ignored: it checks a SQLite catalog (check a PostgreSQL "
                    "database with its own tools: docs/catalog-postgres.md)", settings.check)
    # the folder now belongs to this database (it held no data, or the database names it)
    if not marker.exists() or marker.read_text().strip() != cat.where:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(cat.where + "\n")
    return cat


_OPENERS: dict[str, Callable[[CatalogSettings, Path, Callable[[str], str], tuple[str, ...], bool], Catalog]] = {
    "sqlite": _open_sqlite,
    "postgresql": _open_postgres,
}


def open_catalog(settings: CatalogSettings, *, data_dir: Path, blob_path: Callable[[str], str],
                 data_folders: tuple[str, ...], fsync: bool) -> Catalog:
    """Open the catalog ``settings`` names for the node over ``data_dir``.

    Args:
        settings: where the catalog lives.
        data_dir: the node's data folder.
        blob_path: maps a blob id to its data file.
        data_folders: the folders of data files the catalog's rows name (a new
            catalog beside files in them is refused: the sweep would delete them).
        fsync: SQLite: every commit durable (PostgreSQL follows its server's settings).

    Raises:
        InvalidArgument: the URL's scheme is not a catalog's.
        CatalogDamaged: SQLite: the catalog fails its check, is missing beside
            data files, or the folder's catalog is in PostgreSQL.
        CatalogInUse, CatalogUnavailable, CatalogTooNew, InternalError: see
            :class:`~._postgres.PostgresCatalog`.
    """
    return _OPENERS[catalog_scheme(settings.url)](settings, data_dir, blob_path, data_folders, fsync)
