"""The PostgreSQL catalog: :class:`~gpufeed.engine.catalog.Catalog` over a
PostgreSQL database (psycopg 3 and its connection pool), for nodes whose
metadata lives in a database server rather than in ``catalog.sqlite3``.

Transactions, and why:

- Plain reads borrow a pooled connection (autocommit) per statement: each
  statement sees the latest commit, as with SQLite's autocommit readers.
- :meth:`PostgresCatalog.snapshot` is a ``REPEATABLE READ READ ONLY``
  transaction: every statement in it sees the state of its first statement.
- :meth:`PostgresCatalog.write` is a ``READ COMMITTED`` transaction whose first
  statement locks one row (``gpufeed_meta``'s ``writer`` row, ``SELECT ... FOR
  UPDATE``). Writers thus take turns, across threads, processes and hosts,
  and each statement of the one writer sees every earlier commit. A row lock
  rather than ``SERIALIZABLE`` with retries: the engine's write blocks do file
  work and queue commit hooks, so they cannot be replayed after a
  serialization failure; and rather than ``pg_advisory_xact_lock``: row locks
  work alike on PostgreSQL, CockroachDB and YugabyteDB. A thread lock in front
  of it keeps this process's writers from holding pooled connections while
  they wait.

Failures: every ``psycopg.Error`` becomes :class:`~gpufeed.errors.InternalError`
naming the database (``user@host:port/dbname``, never the password) and what
failed; a lost or refused connection, no pooled connection free within
``pool_timeout_s``, the writer row not locked within ``pool_timeout_s``
(``lock_timeout``: another session holds it), or a session the server ended
for sitting idle in its transaction (``idle_tx_s``) is
:class:`~gpufeed.errors.CatalogUnavailable` (S3 ``ServiceUnavailable``, 503).
The pool drops broken connections and opens new ones, so requests succeed
again once the database is back. A connection lost during ``COMMIT`` itself
leaves that write's outcome unknown to the node; it reports the write failed.

Source: https://www.psycopg.org/psycopg3/docs/advanced/pool.html,
https://www.postgresql.org/docs/15/transaction-iso.html
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from ..errors import CatalogUnavailable, InternalError

try:
    import psycopg
    from psycopg import conninfo as _conninfo
    from psycopg_pool import ConnectionPool
except ImportError as _exc:  # pragma: no cover - the extra is missing
    raise ImportError("the PostgreSQL catalog needs the 'postgres' extra: pip install 'gpufeed[postgres]'") from _exc

from ._membership import Membership, PgMembership
from ._pgreads import PgReads
from ._pgschema import META_TABLE, WRITER_LOCK_SQL, claim_owner, migrate, refuse_foreign_tables
from ._pgwrites import PgWrites
from .catalog import Catalog, CatalogReader, CatalogWriter

__all__ = ["PostgresCatalog", "redact", "URL_SCHEMES"]

log = logging.getLogger("gpufeed.catalog")

#: URL schemes that name a PostgreSQL catalog.
URL_SCHEMES = ("postgresql://", "postgres://")
_CONNECT_TIMEOUT_S = 5
_SETUP_TRIES = 10  # nodes that lost a race creating the tables retry, after a short random wait
_CREATE_RACES = (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable, psycopg.errors.DuplicateObject)
#: Seconds between the server's TCP keepalive probes to a node's sessions.
_KEEPALIVE_S = 30
_SERVER_ENCODINGS = ("UTF8", "SQL_ASCII")


def redact(dsn: str) -> str:
    """``user@host:port/dbname`` of a connection string or URL: what messages
    name (never the password)."""
    try:
        d = _conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparsable PostgreSQL URL>"
    user = f"{d['user']}@" if d.get("user") else ""
    port = f":{d['port']}" if d.get("port") else ""
    return f"{user}{d.get('host') or 'localhost'}{port}/{d.get('dbname') or ''}"


def _no_path(blob_id: str) -> str:
    return ""


class _View(PgReads, CatalogReader):
    """Reads over one connection (a snapshot's, or the write transaction's)."""

    def __init__(self, conn: psycopg.Connection, blob_path: Callable[[str], str], fail: Callable,
                 holder: str = "") -> None:
        self._c = conn
        self._blob_path = blob_path
        self._fail = fail
        self._holder = holder

    def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            cur = self._c.execute(sql, args)
            return cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise self._fail("a statement", exc) from exc


class _Writer(PgWrites, _View, CatalogWriter):
    """The open write transaction of a :class:`PostgresCatalog`."""

    def __init__(self, conn: psycopg.Connection, blob_path: Callable[[str], str], fail: Callable,
                 hooks: list[Callable[[], None]], holder: str = "") -> None:
        super().__init__(conn, blob_path, fail, holder)
        self._hooks = hooks

    def _count(self, sql: str, args: tuple = ()) -> int:
        try:
            return self._c.execute(sql, args).rowcount
        except psycopg.Error as exc:
            raise self._fail("a write", exc) from exc

    def _many(self, sql: str, args: list[tuple]) -> None:
        if not args:
            return
        try:
            with self._c.cursor() as cur:
                cur.executemany(sql, args)
        except psycopg.Error as exc:
            raise self._fail("a write", exc) from exc

    def on_commit(self, fn: Callable[[], None]) -> None:
        self._hooks.append(fn)


class PostgresCatalog(PgReads, Catalog):
    """The catalog in a PostgreSQL database.

    Opening it connects once, creates or upgrades the tables (the schema
    version is kept in the database; a newer one is refused) and, when
    ``owner`` is given, records it or checks it against the one recorded
    (:func:`~._pgschema.claim_owner`); then it opens a connection pool.

    Args:
        dsn: a libpq connection URL (``postgresql://user:password@host:port/dbname?...``)
            or key/value string. The database's encoding must be UTF8 (or SQL_ASCII).
        blob_path: maps a blob id to its data file (fills :attr:`ObjectInfo.path`).
        owner: the identity of the deployment using the catalog
            (``"cluster:NAME"`` or ``"node:<data folder id>"``); ``None`` skips the check.
        data_present: whether the node's data folder holds data files (asked
            only when the catalog has no owner yet, which is then refused; see
            :func:`~._pgschema.claim_owner`).
        pool_size: most connections the pool opens (>= 2: a snapshot and a
            writer may be open at once, and each nested read takes one more).
        pool_timeout_s: seconds a statement waits for a free pooled connection
            (also while the database is unreachable), and a write for the
            writer row's lock (``lock_timeout``), before failing with
            :class:`~gpufeed.errors.CatalogUnavailable`.
        idle_tx_s: the server ends a session of this catalog that sits idle
            inside a transaction this long (``idle_in_transaction_session_timeout``):
            a node cut off from the database mid-write leaves a session holding
            the writer lock, which the server would otherwise keep until its TCP
            keepalive gives up (hours by default). The sessions also ask the
            server for TCP keepalives every 30 s.
        holder: the node id of the data folder this process serves: new chunks
            are recorded as held by it, and :meth:`data_files` lists its files
            only. Rows with no holder (written before holders were recorded) are
            given ``holder`` at open when ``owner`` is ``"node:..."`` (one node holds
            everything); in a cluster, each node claims those whose files it finds
            (:meth:`claim_files`).

    Raises:
        CatalogUnavailable: the database cannot be reached (the message names
            it, without the password).
        CatalogInUse: another deployment owns the catalog.
        CatalogTooNew: a newer gpufeed wrote the catalog.
        InternalError: the database refused the schema, or its encoding is not
            UTF8, or the catalog is new while ``data_present``.
    """

    def __init__(self, dsn: str, *, blob_path: Callable[[str], str] = _no_path, owner: str | None = None,
                 data_present: Callable[[], bool] = lambda: False, pool_size: int = 8,
                 pool_timeout_s: float = 5.0, idle_tx_s: float = 120.0,
                 holder: str = "") -> None:
        if pool_size < 2:
            raise ValueError("the catalog's pool needs at least 2 connections")
        if pool_timeout_s <= 0 or idle_tx_s <= 0:
            raise ValueError("the catalog's timeouts must be > 0 seconds")
        self._blob_path = blob_path
        self._holder = holder
        self.where = redact(dsn)
        self._wlock = threading.Lock()
        self._lock_timeout_s = pool_timeout_s
        self._session = {"idle_in_transaction_session_timeout": max(1, round(idle_tx_s * 1000)),
                         "tcp_keepalives_idle": _KEEPALIVE_S, "tcp_keepalives_interval": _KEEPALIVE_S}
        self._setup(dsn, owner, data_present)
        # reconnect_timeout=0: a connection that cannot be replaced is given up at
        # once and the pool opens new ones when requests wait for one, so it
        # reconnects as soon as the database is back (rather than at the next step
        # of a back-off that reaches minutes).
        self._pool: ConnectionPool | None = ConnectionPool(
            dsn, min_size=1, max_size=pool_size, timeout=pool_timeout_s, open=False, name="gpufeed-catalog",
            kwargs={"autocommit": True, "connect_timeout": _CONNECT_TIMEOUT_S}, reconnect_timeout=0,
            configure=self._configure)
        self._pool.open(wait=False)

    def _configure(self, conn: psycopg.Connection) -> None:
        """Each new connection: the session's timeouts (see ``idle_tx_s``); a setting the
        server does not know (a PostgreSQL-compatible database without it) is skipped."""
        for name, value in self._session.items():
            try:
                conn.execute(f"SET {name} = {int(value)}")
            except (psycopg.errors.UndefinedObject, psycopg.errors.FeatureNotSupported,
                    psycopg.errors.CantChangeRuntimeParam) as exc:
                log.info("catalog database %s: session setting %s skipped: %s", self.where, name,
                         str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)

    def _fail(self, what: str, exc: BaseException) -> InternalError:
        """The error to raise for ``exc``, a failure of ``what``."""
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return CatalogUnavailable(
                f"the catalog database {self.where}: {what} waited {self._lock_timeout_s:g} s for the "
                "catalog's writer lock, which another session holds (a node cut off mid-write: the server "
                "ends that session once it has been idle in its transaction for GPUFEED_CATALOG_IDLE_TX_S)")
        if isinstance(exc, (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)):
            return CatalogUnavailable(f"the catalog database {self.where} is unavailable ({what} failed): {reason}")
        return InternalError(f"the catalog database {self.where}: {what} failed: {reason}")

    def _setup(self, dsn: str, owner: str | None, data_present: Callable[[], bool]) -> None:
        """Connect once: check the encoding, create or upgrade the tables, claim the catalog."""
        try:
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise self._fail("connecting", exc) from exc
        try:
            view = _View(conn, self._blob_path, self._fail)
            encoding = view._rows("SHOW server_encoding")[0][0]
            if encoding not in _SERVER_ENCODINGS:
                raise InternalError(f"the catalog database {self.where} has encoding {encoding}; gpufeed needs "
                                    "UTF8 (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)")
            self._configure(conn)
            # One transaction, so a refusal leaves the database as it was; nodes
            # creating the tables at once (CREATE ... IF NOT EXISTS races in
            # PostgreSQL's own catalog): the losers wait a moment and retry.
            for attempt in range(_SETUP_TRIES):
                try:
                    with conn.transaction():
                        refuse_foreign_tables(view._rows, self.where)
                        view._rows(META_TABLE)
                        view._rows("INSERT INTO gpufeed_meta (name, value) VALUES ('writer', '')"
                                   " ON CONFLICT (name) DO NOTHING")
                        view._rows(f"SET LOCAL lock_timeout = {max(1, round(self._lock_timeout_s * 1000))}")
                        view._rows(WRITER_LOCK_SQL)
                        migrate(view._rows, self.where)
                        if owner is not None:
                            claim_owner(view._rows, owner, self.where, data_present=data_present)
                        if owner is not None and owner.startswith("node:") and self._holder:
                            view._rows("UPDATE chunks SET holder = %s WHERE holder = ''", (self._holder,))
                    break
                except (psycopg.Error, InternalError) as exc:  # statements' errors come wrapped
                    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
                    if attempt == _SETUP_TRIES - 1 or not isinstance(cause, _CREATE_RACES):
                        raise
                    time.sleep(random.uniform(0.05, 0.25) * (attempt + 1))
        except psycopg.Error as exc:
            raise self._fail("creating the tables", exc) from exc
        finally:
            conn.close()

    def _live_pool(self) -> ConnectionPool:
        pool = self._pool
        if pool is None:
            raise InternalError(f"the engine is closed (its catalog {self.where} too)")
        return pool

    def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        for attempt in (0, 1):
            pool = self._live_pool()
            try:
                with pool.connection() as conn:
                    try:
                        cur = conn.execute(sql, args)
                        return cur.fetchall() if cur.description is not None else []
                    except psycopg.OperationalError:
                        if attempt or not conn.broken:
                            raise
            except psycopg.Error as exc:
                raise self._fail("a read", exc) from exc
            self._drop_broken(pool)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _drop_broken(pool: ConnectionPool) -> None:
        """After a pooled connection turned out broken (the server restarted, say),
        test the idle ones and replace those that are broken too, so the retry and
        the requests after it get working connections."""
        try:
            pool.check()
        except psycopg.Error:
            pass  # the retry reports the failure

    @contextmanager
    def _transaction(self, begin: str, what: str) -> Iterator[psycopg.Connection]:
        """A pooled connection inside ``begin`` ... ``COMMIT``; ``ROLLBACK`` on an exception.
        A connection found broken at ``begin`` (nothing done yet) is replaced once."""
        for attempt in (0, 1):
            pool = self._live_pool()
            try:
                with pool.connection() as conn:
                    began = False
                    try:
                        conn.execute(begin)
                        began = True
                    except psycopg.OperationalError:
                        if attempt or not conn.broken:
                            raise
                    if began:
                        with self._rollback_on_error(conn):
                            yield conn
                        conn.execute("COMMIT")
                        return
            except psycopg.Error as exc:
                raise self._fail(what, exc) from exc
            self._drop_broken(pool)

    @staticmethod
    @contextmanager
    def _rollback_on_error(conn: psycopg.Connection) -> Iterator[None]:
        try:
            yield
        except BaseException:
            if not conn.closed and not conn.broken:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    pass  # the pool drops a connection it cannot reset
            raise

    @contextmanager
    def snapshot(self) -> Iterator[CatalogReader]:
        """A ``REPEATABLE READ READ ONLY`` transaction: every read inside sees one committed state."""
        with self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "a snapshot") as conn:
            yield _View(conn, self._blob_path, self._fail, self._holder)

    @contextmanager
    def write(self) -> Iterator[CatalogWriter]:
        """The write transaction (``READ COMMITTED``, the writer row locked first).

        Commits when the block ends normally, rolls back on an exception.
        Hooks given to :meth:`CatalogWriter.on_commit` run after the commit
        (its connection back in the pool), still in this process's write lock.

        Raises:
            CatalogUnavailable: the database cannot be reached.
            InternalError: the database failed otherwise, or the catalog is closed.
        """
        with self._wlock:
            hooks: list[Callable[[], None]] = []
            # One round trip: BEGIN and the writer row's lock (no parameters: one simple query).
            with self._transaction(f"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = "
                                   f"{max(1, round(self._lock_timeout_s * 1000))}; {WRITER_LOCK_SQL}",
                                   "a write") as conn:
                yield _Writer(conn, self._blob_path, self._fail, hooks, self._holder)
            for fn in hooks:
                fn()

    @cached_property
    def membership(self) -> Membership:
        """The clusters' members, in the ``nodes`` table (:class:`~._membership.PgMembership`)."""
        return PgMembership(self._rows)

    @property
    def holder(self) -> str:
        """The node id this catalog records new chunks as held by (see ``holder`` above)."""
        return self._holder

    def claim_files(self, files: set[str]) -> int:
        """Record this node as the holder of the data files ``files`` whose chunks
        have no holder (it found them in its folder). Returns the chunks claimed."""
        if not files or not self._holder:
            return 0
        got = self._rows("UPDATE chunks SET holder = %s WHERE holder = '' AND file = ANY(%s) RETURNING chunk_id",
                         (self._holder, sorted(files)))
        return len(got)

    def drop_file_copies(self, files: set[str]) -> int:
        """Forget this node's copies of ``files`` (missing from its folder)."""
        if not files or not self._holder:
            return 0
        return len(self._rows("DELETE FROM file_copies WHERE node = %s AND file = ANY(%s) RETURNING file",
                              (self._holder, sorted(files))))

    def files_held(self, after: str, limit: int) -> list[str]:
        """Ids of the data files this node holds, as their chunks' holder or as a
        copy, after ``after`` in id order (at most ``limit``)."""
        return [r[0] for r in self._rows(
            "SELECT file FROM (SELECT DISTINCT file FROM chunks WHERE holder = %s AND file > %s"
            " UNION SELECT file FROM file_copies WHERE node = %s AND file > %s) h ORDER BY file LIMIT %s",
            (self._holder, after, self._holder, after, limit))]

    def give_up_file(self, file: str, live: list[str], factor: int, prefer: list[str]) -> bool:
        """Stop holding data file ``file`` on this node, in one write transaction (so
        two nodes never give up the same file's last copies at once), when at least
        ``factor`` other nodes of ``live`` hold it. As its chunks' holder, the first
        node of ``prefer`` with a copy becomes the holder (its ``file_copies`` row
        stays, so a node whose cached chunk record names the old holder still
        finds it); as a copy, this node's row goes. The caller deletes its file.

        Returns:
            Whether it gave the file up (False: too few other live copies, another
            holder, or it holds the file no longer).
        """
        if not self._holder:
            return False
        me = self._holder
        with self.write() as w:
            assert isinstance(w, _Writer)
            holders = {r[0] for r in w._rows("SELECT DISTINCT holder FROM chunks WHERE file = %s", (file,))}
            copies = {r[0] for r in w._rows("SELECT node FROM file_copies WHERE file = %s", (file,))}
            if len(holders) != 1 or me not in holders | copies:
                return False
            (holder,) = holders
            others = [n for n in (holders | copies) - {me} if n in set(live)]
            if len(others) < factor:
                return False
            if holder != me:
                w._count("DELETE FROM file_copies WHERE file = %s AND node = %s", (file, me))
                return True
            new = next((n for n in prefer if n in others and n in copies), None)
            if new is None:
                return False
            w._count("UPDATE chunks SET holder = %s WHERE file = %s AND holder = %s", (new, file, me))
            w._count("DELETE FROM file_copies WHERE file = %s AND node = %s", (file, me))
        return True

    def owner(self) -> str:
        """The deployment recorded as the catalog's owner (``"cluster:NAME"``,
        ``"node:<id>"``), ``""`` when none is yet."""
        rows = self._rows("SELECT value FROM gpufeed_meta WHERE name = 'owner'")
        return str(rows[0][0]) if rows else ""

    def pool_stats(self) -> dict[str, Any]:
        """The pool's counters (``pool_size``, ``pool_available``, ``requests_waiting``, ...)."""
        return dict(self._live_pool().get_stats())

    def close(self) -> None:
        """Close the pool; idempotent. Later calls raise InternalError."""
        with self._wlock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
