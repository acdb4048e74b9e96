"""The PostgreSQL catalog's schema: its tables, the steps that bring an older
catalog up to date, and the check of who owns a database.

The tables hold the same records as the SQLite catalog's (:mod:`._schema`)
with three differences that keep S3's semantics on PostgreSQL:

- Object keys are ``BYTEA`` holding the key's UTF-8 bytes: ``BYTEA`` compares
  as ``memcmp`` (S3 listing order, whatever the database's collation) and,
  unlike ``TEXT``, holds U+0000. Other names (buckets, tenants, ids) are
  ``TEXT COLLATE "C"``, also byte order.
- No triggers: PostgreSQL triggers need PL/pgSQL functions, which the
  distributed PostgreSQL-wire databases (CockroachDB, YugabyteDB) treat
  differently or not at all, so the running totals (``usage``,
  ``chunk_usage``) are kept by the writer's own statements (:mod:`._pgwrites`).
- Cluster membership (``nodes``, :mod:`._membership`), which the SQLite
  catalog keeps in the node's memory (it has one member).
- One more table, ``gpufeed_meta`` (``name -> value``): the schema version,
  the catalog's owner (:func:`claim_owner`), and the row every write
  transaction locks (``SELECT ... FOR UPDATE``) so that writers, in any
  process on any host, take turns.

Only ``CREATE TABLE / INDEX IF NOT EXISTS``, ``INSERT ... ON CONFLICT``,
``SELECT ... FOR UPDATE`` and plain DML are used: no PL/pgSQL, no
``LISTEN/NOTIFY``, no advisory locks, no sequences.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..errors import CatalogInUse, CatalogTooNew, InternalError, InvalidArgument
from ._membership import NODES_MOVING_COLUMNS, NODES_ROOM_COLUMNS, NODES_TABLE

__all__ = ["SCHEMA_VERSION", "MIGRATIONS", "META_TABLE", "migrate", "claim_owner", "WRITER_LOCK_SQL",
           "refuse_foreign_tables"]

#: Bumped when the schema changes; stored in ``gpufeed_meta`` as
#: ``schema_version``. An older catalog is brought up to this one on open
#: (:data:`MIGRATIONS`); a newer one is refused.
SCHEMA_VERSION = 7

META_TABLE = """
CREATE TABLE IF NOT EXISTS gpufeed_meta (
    name  TEXT COLLATE "C" PRIMARY KEY,   -- 'schema_version' | 'owner' | 'writer'
    value TEXT NOT NULL
)"""

#: Locks the writer row; every write transaction runs it first.
WRITER_LOCK_SQL = "SELECT value FROM gpufeed_meta WHERE name = 'writer' FOR UPDATE"

_T = 'TEXT COLLATE "C" NOT NULL'
_VERSION_COLS = f"""
    size          BIGINT NOT NULL,
    etag          {_T},
    last_modified DOUBLE PRECISION NOT NULL,
    content_type  {_T},
    metadata      {_T},     -- JSON object, '' when empty
    checksums     {_T},
    blob_id       {_T},     -- '' for a delete marker
    headers       {_T},
    version_id    {_T},
    seq           BIGINT NOT NULL,
    lock_mode     {_T},
    lock_until    DOUBLE PRECISION NOT NULL,
    legal_hold    INTEGER NOT NULL,
    tags          {_T}"""

_VERSION_1 = [
    f"""CREATE TABLE IF NOT EXISTS buckets (
    name           TEXT COLLATE "C" PRIMARY KEY,
    created        DOUBLE PRECISION NOT NULL,
    kind           {_T},
    capacity_bytes BIGINT NOT NULL,
    ttl_s          DOUBLE PRECISION NOT NULL,
    versioning     {_T},
    object_lock    INTEGER NOT NULL,
    lock_mode      {_T},
    lock_days      INTEGER NOT NULL,
    lock_years     INTEGER NOT NULL,
    owner          {_T},
    etag_policy    {_T})""",
    f"""CREATE TABLE IF NOT EXISTS objects (
    bucket      {_T},
    key         BYTEA NOT NULL,   -- UTF-8 of the key
    {_VERSION_COLS},
    last_access DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (bucket, key))""",
    "CREATE INDEX IF NOT EXISTS objects_by_blob ON objects (blob_id)",
    f"""CREATE TABLE IF NOT EXISTS versions (
    bucket        {_T},
    key           BYTEA NOT NULL,
    {_VERSION_COLS},
    delete_marker INTEGER NOT NULL,
    latest        INTEGER NOT NULL,
    PRIMARY KEY (bucket, key, seq))""",
    "CREATE UNIQUE INDEX IF NOT EXISTS versions_by_id ON versions (bucket, key, version_id)",
    "CREATE INDEX IF NOT EXISTS versions_by_blob ON versions (blob_id)",
    f"""CREATE TABLE IF NOT EXISTS uploads (
    upload_id    TEXT COLLATE "C" PRIMARY KEY,
    bucket       {_T},
    key          BYTEA NOT NULL,
    initiated    DOUBLE PRECISION NOT NULL,
    content_type {_T},
    metadata     {_T},
    headers      {_T},
    tags         {_T},
    lock         {_T})""",
    "CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (bucket, key, initiated)",
    f"""CREATE TABLE IF NOT EXISTS parts (
    upload_id     {_T},
    part_number   INTEGER NOT NULL,
    etag          {_T},
    size          BIGINT NOT NULL,
    last_modified DOUBLE PRECISION NOT NULL,
    file          {_T},
    checksums     {_T},
    PRIMARY KEY (upload_id, part_number))""",
    f"""CREATE TABLE IF NOT EXISTS lifecycle (
    bucket TEXT COLLATE "C" PRIMARY KEY,
    rules  {_T})""",
    f"""CREATE TABLE IF NOT EXISTS completed_uploads (
    upload_id TEXT COLLATE "C" PRIMARY KEY,
    bucket    {_T},
    key       BYTEA NOT NULL,
    etag      {_T},
    blob_id   {_T},
    completed DOUBLE PRECISION NOT NULL,
    parts     {_T})""",
    "CREATE INDEX IF NOT EXISTS completed_uploads_by_blob ON completed_uploads (blob_id)",
    "CREATE INDEX IF NOT EXISTS completed_uploads_by_time ON completed_uploads (completed)",
    f"""CREATE TABLE IF NOT EXISTS bucket_configs (
    bucket {_T},
    name   {_T},
    value  {_T},
    PRIMARY KEY (bucket, name))""",
    """CREATE TABLE IF NOT EXISTS tenants (
    name    TEXT COLLATE "C" PRIMARY KEY,
    created DOUBLE PRECISION NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS access_keys (
    access_key TEXT COLLATE "C" PRIMARY KEY,
    tenant     {_T},
    secret     {_T},
    created    DOUBLE PRECISION NOT NULL,
    revoked    DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS access_keys_by_tenant ON access_keys (tenant, created)",
    f"""CREATE TABLE IF NOT EXISTS quotas (
    scope   {_T},
    name    {_T},
    bytes   BIGINT NOT NULL,
    objects BIGINT NOT NULL,
    PRIMARY KEY (scope, name))""",
    """CREATE TABLE IF NOT EXISTS usage (
    bucket  TEXT COLLATE "C" PRIMARY KEY,
    bytes   BIGINT NOT NULL,
    objects BIGINT NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS chunks (
    chunk_id    TEXT COLLATE "C" PRIMARY KEY,
    file        {_T},
    file_offset BIGINT NOT NULL,
    stored      BIGINT NOT NULL,
    size        BIGINT NOT NULL,
    codec       {_T},
    digest      BYTEA NOT NULL,
    sums        BYTEA NOT NULL,
    domain      TEXT COLLATE "C",
    refs        BIGINT NOT NULL,
    bucket      {_T},
    sum_kind    INTEGER NOT NULL)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS chunks_by_digest ON chunks (domain, digest) WHERE domain IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks (file)",
    """CREATE TABLE IF NOT EXISTS manifests (
    blob_id TEXT COLLATE "C" PRIMARY KEY,
    size    BIGINT NOT NULL,
    chunks  BIGINT NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS manifest_chunks (
    blob_id  {_T},
    seq      BIGINT NOT NULL,
    chunk_id {_T},
    PRIMARY KEY (blob_id, seq))""",
    "CREATE INDEX IF NOT EXISTS manifest_chunks_by_chunk ON manifest_chunks (chunk_id)",
    f"""CREATE TABLE IF NOT EXISTS damaged_chunks (
    chunk_id TEXT COLLATE "C" PRIMARY KEY,
    reason   {_T},
    found    DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS chunk_usage (
    bucket TEXT COLLATE "C" PRIMARY KEY,
    stored BIGINT NOT NULL,
    chunks BIGINT NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS snapshots (
    bucket  {_T},
    name    {_T},
    created DOUBLE PRECISION NOT NULL,
    kind    {_T},
    objects BIGINT NOT NULL,
    bytes   BIGINT NOT NULL,
    PRIMARY KEY (bucket, name))""",
    f"""CREATE TABLE IF NOT EXISTS snapshot_objects (
    bucket   {_T},
    snapshot {_T},
    key      BYTEA NOT NULL,
    {_VERSION_COLS},
    PRIMARY KEY (bucket, snapshot, key))""",
    """CREATE TABLE IF NOT EXISTS snapshot_blobs (
    blob_id TEXT COLLATE "C" PRIMARY KEY,
    refs    BIGINT NOT NULL)""",
]

#: Version 3: ``chunks.holder``, the node id whose data folder holds the
#: chunk's data file (``''``: not recorded; see :class:`~._postgres.PostgresCatalog`).
_VERSION_3 = [
    "ALTER TABLE chunks ADD COLUMN IF NOT EXISTS holder TEXT COLLATE \"C\" NOT NULL DEFAULT ''",
    "CREATE INDEX IF NOT EXISTS chunks_by_holder ON chunks (holder, file)",
]

#: Version 4: ``file_copies``, the other nodes that hold a copy of a data file
#: (a cluster's replicas, :mod:`._pgcopies`); the chunks' holder is not listed.
_VERSION_4 = [
    """CREATE TABLE IF NOT EXISTS file_copies (
    file TEXT COLLATE "C" NOT NULL,
    node TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (file, node))""",
    "CREATE INDEX IF NOT EXISTS file_copies_by_node ON file_copies (node, file)",
]

#: Version 7: ``part_copies``, the nodes that hold a copy of a part file of an
#: open multipart upload (the node that received the part among them;
#: :mod:`gpufeed._partcopies`).
_VERSION_7 = [
    """CREATE TABLE IF NOT EXISTS part_copies (
    upload_id TEXT COLLATE "C" NOT NULL,
    file      TEXT COLLATE "C" NOT NULL,
    node      TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (upload_id, file, node))""",
]

#: ``version -> statements`` that take a catalog of version ``version - 1`` to
#: ``version``. Each statement is idempotent (``IF NOT EXISTS``). Append a step
#: when bumping :data:`SCHEMA_VERSION`.
MIGRATIONS: dict[int, list[str]] = {
    1: _VERSION_1,
    2: [NODES_TABLE],  # cluster membership (:mod:`._membership`)
    3: _VERSION_3,  # which node holds each chunk's data file
    4: _VERSION_4,  # which other nodes hold a copy of each data file
    5: NODES_ROOM_COLUMNS,  # each member's capacity and free bytes (:mod:`._room`)
    6: NODES_MOVING_COLUMNS,  # the bytes a draining member moves off (:mod:`._room`)
    7: _VERSION_7,  # which nodes hold each part file of an open upload
}

#: ``(sql, args) -> rows``: how these functions run a statement (the caller's
#: connection, inside the caller's transaction).
Execute = Callable[[str, tuple], list[tuple]]


def refuse_foreign_tables(execute: Execute, where: str) -> None:
    """Refuse a database whose schema has none of gpufeed's catalog yet but tables
    with the names gpufeed would create (another application's ``objects``, say).

    Raises:
        InvalidArgument: naming the clashing tables.
    """
    names = sorted({m.group(1) for sqls in MIGRATIONS.values() for sql in sqls
                    for m in re.finditer(r"CREATE TABLE IF NOT EXISTS (\w+)", sql)})
    rows = execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
                   " AND table_name = ANY(%s)", (["gpufeed_meta", *names],))
    found = sorted(str(r[0]) for r in rows)
    if found and "gpufeed_meta" not in found:
        raise InvalidArgument(f"the database {where} already holds tables gpufeed would create "
                              f"({', '.join(found)}), not made by gpufeed; give gpufeed a database of its own, "
                              "or a schema of its own (options=-csearch_path%3DNAME in the URL)")


def migrate(execute: Execute, where: str) -> int:
    """Bring the catalog to :data:`SCHEMA_VERSION`, inside the caller's
    transaction, which has created ``gpufeed_meta`` and locked its writer row
    (so two nodes starting at once migrate one after the other).

    Args:
        execute: runs one statement, returns its rows.
        where: the database, for messages (``host:port/db``, no password).

    Returns:
        The schema version found (0: a fresh database).

    Raises:
        CatalogTooNew: a newer gpufeed wrote the catalog.
    """
    rows = execute("SELECT value FROM gpufeed_meta WHERE name = 'schema_version'", ())
    found = int(rows[0][0]) if rows else 0
    if found > SCHEMA_VERSION:
        raise CatalogTooNew(f"the catalog at {where} has schema version {found}, newer than this gpufeed's "
                            f"{SCHEMA_VERSION}; open it with a newer gpufeed")
    for version in range(found + 1, SCHEMA_VERSION + 1):
        for sql in MIGRATIONS[version]:
            execute(sql, ())
    if found != SCHEMA_VERSION:
        execute("INSERT INTO gpufeed_meta (name, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value", (str(SCHEMA_VERSION),))
    return found


def claim_owner(execute: Execute, owner: str, where: str, *,
                data_present: Callable[[], bool] = lambda: False) -> None:
    """Record ``owner`` as the catalog's owner on first use, or check it is the one recorded.

    A catalog describes the data of one node (its data folder) or of one
    cluster: a second deployment pointed at the same database would read rows
    naming data it does not hold, and its start-up sweep would delete files
    the first one's rows name. So the first node records its identity (the
    cluster name, or the data folder's id when it runs alone) and any other
    identity is refused.

    Args:
        execute: runs one statement inside the caller's transaction.
        owner: ``"cluster:NAME"`` or ``"node:<data folder id>"``.
        where: the database, for messages.
        data_present: whether the node's data folder already holds data files
            (asked only on first use): a catalog nobody owns yet is then refused (its rows would name none
            of them, and the start-up sweep would delete them all).

    Raises:
        CatalogInUse: another deployment owns the catalog.
        InternalError: the catalog is unowned while the data folder holds data.
    """
    rows = execute("SELECT value FROM gpufeed_meta WHERE name = 'owner'", ())
    if not rows:
        if data_present():
            raise InternalError(
                f"the catalog at {where} is new, but the node's data folder holds object data files that it "
                "does not name (their catalog is elsewhere: the folder's catalog.sqlite3, or another database); "
                "starting would delete them. The node did not start and changed nothing. Start it with the "
                "catalog that names them; gpufeed does not copy a catalog from SQLite into PostgreSQL")
        execute("INSERT INTO gpufeed_meta (name, value) VALUES ('owner', %s)", (owner,))
        return
    if rows[0][0] != owner:
        raise CatalogInUse(
            f"the catalog at {where} belongs to {rows[0][0]!r}, not to this node ({owner!r}): two deployments "
            "cannot share one catalog. Give this node its own database, or start every node of one cluster "
            "with the same --cluster NAME (env GPUFEED_CLUSTER; docs/cluster.md)")
