"""Cluster membership: which nodes are members of a cluster, where they listen,
and when each last said it is alive.

A node of a cluster (``gpufeed serve --catalog postgresql://... --cluster
NAME``) registers in the catalog when it starts, heartbeats every few
seconds, and leaves when it stops (the worker is :mod:`gpufeed._cluster`).
The catalog keeps one row per ``(cluster, node id)``:

=============== =========================================================
``host``        the address the node advertises (S3 and fast-path ports)
``started_at``  when this process registered (Unix s, the database's clock)
``heartbeat_at`` its last heartbeat (Unix s, the database's clock)
``bytes_stored`` its used bytes (files in its data folder) at its last heartbeat
``capacity_bytes`` its capacity at its last heartbeat (0: not reported)
``free_bytes``  what it could still take then (-1: not reported)
``moving_bytes`` bytes it was moving off to other members then (0: it does not drain)
``state``       ``"up"`` (registered) or ``"left"`` (stopped cleanly)
=============== =========================================================

(The figures are :mod:`._room`'s; ``capacity_bytes`` and ``free_bytes`` are
schema version 5 of the PostgreSQL catalog, ``moving_bytes`` version 6.)

Every time is taken and compared by the database (``statement_timestamp()``
and ``clock_timestamp()`` on the PostgreSQL server), never by the node: a
node whose own clock is far off is still judged by when its heartbeats
arrived. A member is *live*
while its state is ``"up"`` and its last heartbeat is younger than the
reader's expiry (:meth:`NodeInfo.live`).

A node id is held by one process at a time. Each start makes a fresh
``incarnation`` token; a registration takes the row over only when the row
is not live, or when it was written from the same machine and data folder
(that folder's lock file proves the earlier process has ended). A heartbeat
or leave names its incarnation, so a process whose row was taken over
learns it (``heartbeat`` returns ``False``) instead of overwriting the new
holder.

:class:`Membership` is the interface; :class:`LocalMembership` keeps the
rows in the process (the default of every catalog: a SQLite catalog is one
node's, so its only member is that node); the PostgreSQL catalog's is
:class:`PgMembership`. Both pass the membership cases of
:class:`gpufeed.testing.catalog.CatalogTests`.
"""

from __future__ import annotations

import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..errors import NodeIdInUse
from ._room import is_full

__all__ = ["NodeClaim", "NodeInfo", "Membership", "LocalMembership", "PgMembership", "NODES_TABLE",
           "NODES_ROOM_COLUMNS", "NODES_MOVING_COLUMNS", "cluster_report", "UNDER_REPLICATED_NOTE",
           "UNDER_REPLICATED_PARTS_NOTE"]


@dataclass(frozen=True, slots=True)
class NodeClaim:
    """Who a running node is: what it registers, and what its heartbeats name.

    Attributes:
        cluster: the cluster's name (``--cluster``).
        node_id: the data folder's id (``<data_dir>/node.id``), stable across restarts.
        host: the address other nodes and clients reach it at.
        s3_port: its S3 port.
        wire_port: its fast-path TCP port (0: none).
        incarnation: a random token made at each start of the process.
        machine: the host name of the machine it runs on (``""``: unknown, never
            matches; a restart is then judged by expiry alone).
        data_dir: the absolute path of its data folder.
    """

    cluster: str
    node_id: str
    host: str
    s3_port: int
    wire_port: int
    incarnation: str
    machine: str = ""
    data_dir: str = ""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A member as the catalog holds it.

    Attributes:
        cluster, node_id, host, s3_port, wire_port: as registered (:class:`NodeClaim`).
        started_at: when its process registered, Unix s (the database's clock).
        heartbeat_at: its last heartbeat, Unix s (the database's clock).
        age_s: seconds from its last heartbeat to when this record was read
            (both by the database's clock).
        bytes_stored: its used bytes (files in its data folder), as of its last heartbeat.
        state: ``"up"`` or ``"left"``.
        capacity_bytes: its capacity as of its last heartbeat (0: not reported).
        free_bytes: what it could still take then (-1: not reported).
        moving_bytes: bytes it was moving off to other members then (0: it does not drain).
    """

    cluster: str
    node_id: str
    host: str
    s3_port: int
    wire_port: int
    started_at: float
    heartbeat_at: float
    age_s: float
    bytes_stored: int
    state: str
    capacity_bytes: int = 0
    free_bytes: int = -1
    moving_bytes: int = 0

    def live(self, expiry_s: float) -> bool:
        """Whether it is up and heard from within the last ``expiry_s`` seconds."""
        return self.state == "up" and self.age_s < expiry_s


def _in_use(held: NodeInfo) -> NodeIdInUse:
    return NodeIdInUse(
        f"node id {held.node_id} of cluster {held.cluster!r} is held by a live member at "
        f"{held.host}:{held.s3_port} (last heartbeat {held.age_s:.1f} s ago): this data folder is a copy of "
        "that node's, or that node runs elsewhere. Give each node its own data folder (a copied folder keeps "
        "the id in its node.id), or, if that member has stopped, start again once it has expired")


class Membership(ABC):
    """The members of clusters, kept in a catalog (see the module docstring)."""

    @abstractmethod
    def register(self, claim: NodeClaim, *, expiry_s: float, bytes_stored: int = 0,
                 room: tuple[int, int] = (0, -1), moving_bytes: int = 0) -> NodeInfo:
        """Record ``claim`` as up, its start and heartbeat now.

        Args:
            claim: the node.
            expiry_s: seconds after its last heartbeat at which a member of the
                same id stops counting as live (and may be taken over).
            bytes_stored: its used bytes (files in its data folder).
            room: ``(capacity bytes, free bytes)`` (``(0, -1)``: not reported).
            moving_bytes: bytes it moves off to other members while it drains (0: it does not).

        Returns:
            The member's record.

        Raises:
            NodeIdInUse: a live member with another incarnation holds the id,
                from another machine or data folder.
            CatalogUnavailable: the database cannot be reached.
        """

    @abstractmethod
    def heartbeat(self, claim: NodeClaim, bytes_stored: int, *, room: tuple[int, int] = (0, -1),
                  moving_bytes: int = 0) -> bool:
        """Record that ``claim`` is alive now, using ``bytes_stored`` bytes, with
        ``room = (capacity bytes, free bytes)`` (``(0, -1)``: not reported) and
        ``moving_bytes`` to move off (0: it does not drain).

        Returns:
            ``False`` when the row is no longer this incarnation's (taken
            over, or left): nothing was changed.

        Raises:
            CatalogUnavailable: the database cannot be reached.
        """

    @abstractmethod
    def leave(self, claim: NodeClaim) -> bool:
        """Mark ``claim``'s row ``"left"`` (a clean stop); ``False`` when it is not this incarnation's.

        Raises:
            CatalogUnavailable: the database cannot be reached.
        """

    @abstractmethod
    def nodes(self, cluster: str) -> list[NodeInfo]:
        """Every member ``cluster`` has had (up or left), by node id.

        Raises:
            CatalogUnavailable: the database cannot be reached.
        """

    @abstractmethod
    def cluster_key(self, cluster: str) -> bytes:
        """The cluster's 32-byte secret, made (random) on first use: what its members
        derive the keys they authenticate to each other with (:mod:`gpufeed._peers`).

        Raises:
            CatalogUnavailable: the database cannot be reached.
        """


class LocalMembership(Membership):
    """Members kept in this process, timed by its clock: the membership of a
    catalog that only this process opens."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], tuple[NodeClaim, NodeInfo]] = {}
        self._keys: dict[str, bytes] = {}

    def _aged(self, info: NodeInfo) -> NodeInfo:
        return replace(info, age_s=max(0.0, self._clock() - info.heartbeat_at))

    def register(self, claim: NodeClaim, *, expiry_s: float, bytes_stored: int = 0,
                 room: tuple[int, int] = (0, -1), moving_bytes: int = 0) -> NodeInfo:
        with self._lock:
            old = self._rows.get((claim.cluster, claim.node_id))
            if old is not None:
                held, info = old
                same_place = bool(held.machine) and (held.machine, held.data_dir) == (claim.machine, claim.data_dir)
                if self._aged(info).live(expiry_s) and held.incarnation != claim.incarnation and not same_place:
                    raise _in_use(self._aged(info))
            now = self._clock()
            info = NodeInfo(claim.cluster, claim.node_id, claim.host, claim.s3_port, claim.wire_port, now, now,
                            0.0, bytes_stored, "up", *room, moving_bytes)
            self._rows[(claim.cluster, claim.node_id)] = (claim, info)
            return info

    def _update(self, claim: NodeClaim, **changes: object) -> bool:
        with self._lock:
            old = self._rows.get((claim.cluster, claim.node_id))
            if old is None or old[0].incarnation != claim.incarnation or old[1].state != "up":
                return False
            self._rows[(claim.cluster, claim.node_id)] = (old[0], replace(old[1], **changes))  # type: ignore[arg-type]
            return True

    def heartbeat(self, claim: NodeClaim, bytes_stored: int, *, room: tuple[int, int] = (0, -1),
                  moving_bytes: int = 0) -> bool:
        return self._update(claim, heartbeat_at=self._clock(), bytes_stored=bytes_stored,
                            capacity_bytes=room[0], free_bytes=room[1], moving_bytes=moving_bytes)

    def leave(self, claim: NodeClaim) -> bool:
        return self._update(claim, state="left")

    def nodes(self, cluster: str) -> list[NodeInfo]:
        with self._lock:
            return [self._aged(info) for (c, _), (_, info) in sorted(self._rows.items()) if c == cluster]

    def cluster_key(self, cluster: str) -> bytes:
        with self._lock:
            return self._keys.setdefault(cluster, secrets.token_bytes(32))


#: The PostgreSQL table (created by schema version 2 of :mod:`._pgschema`).
NODES_TABLE = """CREATE TABLE IF NOT EXISTS nodes (
    cluster      TEXT COLLATE "C" NOT NULL,
    node_id      TEXT COLLATE "C" NOT NULL,
    host         TEXT COLLATE "C" NOT NULL,
    s3_port      INTEGER NOT NULL,
    wire_port    INTEGER NOT NULL,
    machine      TEXT COLLATE "C" NOT NULL,
    data_dir     TEXT COLLATE "C" NOT NULL,
    incarnation  TEXT COLLATE "C" NOT NULL,
    started_at   DOUBLE PRECISION NOT NULL,   -- Unix s, the database's clock
    heartbeat_at DOUBLE PRECISION NOT NULL,   -- Unix s, the database's clock
    bytes_stored BIGINT NOT NULL,
    state        TEXT COLLATE "C" NOT NULL,   -- 'up' | 'left'
    PRIMARY KEY (cluster, node_id))"""

#: Schema version 5 of the PostgreSQL catalog: the figures of :mod:`._room`.
NODES_ROOM_COLUMNS = [
    "ALTER TABLE nodes ADD COLUMN IF NOT EXISTS capacity_bytes BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN IF NOT EXISTS free_bytes BIGINT NOT NULL DEFAULT -1",
]

#: Schema version 6 of the PostgreSQL catalog: the bytes a draining member moves off (:mod:`._room`).
NODES_MOVING_COLUMNS = [
    "ALTER TABLE nodes ADD COLUMN IF NOT EXISTS moving_bytes BIGINT NOT NULL DEFAULT 0",
]

# The statement's start time (one value however often a statement names it);
# ages are taken against the clock at the moment they are read.
_NOW = "extract(epoch from statement_timestamp())::double precision"
_COLS = ("cluster, node_id, host, s3_port, wire_port, started_at, heartbeat_at, "
         "greatest(0, extract(epoch from clock_timestamp())::double precision - heartbeat_at), bytes_stored, state,"
         " capacity_bytes, free_bytes, moving_bytes")
_REGISTER = f"""
INSERT INTO nodes AS n (cluster, node_id, host, s3_port, wire_port, machine, data_dir, incarnation,
                        started_at, heartbeat_at, bytes_stored, state, capacity_bytes, free_bytes,
                        moving_bytes)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, {_NOW}, {_NOW}, %s, 'up', %s, %s, %s)
ON CONFLICT (cluster, node_id) DO UPDATE SET
    host = excluded.host, s3_port = excluded.s3_port, wire_port = excluded.wire_port,
    machine = excluded.machine, data_dir = excluded.data_dir, incarnation = excluded.incarnation,
    started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
    bytes_stored = excluded.bytes_stored, state = 'up', capacity_bytes = excluded.capacity_bytes,
    free_bytes = excluded.free_bytes, moving_bytes = excluded.moving_bytes
WHERE n.state <> 'up' OR n.incarnation = excluded.incarnation
   OR n.heartbeat_at <= excluded.heartbeat_at - %s
   OR (n.machine <> '' AND n.machine = excluded.machine AND n.data_dir = excluded.data_dir)
RETURNING {_COLS}"""

#: ``(sql, args) -> rows``: one autocommit statement on the catalog's database.
Execute = Callable[[str, tuple], list[tuple]]


class PgMembership(Membership):
    """Members in the PostgreSQL catalog's ``nodes`` table; each call is one
    autocommit statement (no writer lock: heartbeats never wait for object writes).

    Args:
        execute: runs one statement on a pooled connection (the catalog's
            ``_rows``: database failures raise ``CatalogUnavailable`` / ``InternalError``).
    """

    def __init__(self, execute: Execute) -> None:
        self._x = execute

    def register(self, claim: NodeClaim, *, expiry_s: float, bytes_stored: int = 0,
                 room: tuple[int, int] = (0, -1), moving_bytes: int = 0) -> NodeInfo:
        c = claim
        rows = self._x(_REGISTER, (c.cluster, c.node_id, c.host, c.s3_port, c.wire_port, c.machine, c.data_dir,
                                   c.incarnation, bytes_stored, room[0], room[1], moving_bytes,
                                   float(expiry_s)))
        if rows:
            return NodeInfo(*rows[0])
        held = self._x(f"SELECT {_COLS} FROM nodes WHERE cluster = %s AND node_id = %s", (c.cluster, c.node_id))
        if not held:  # pragma: no cover - the row was there a statement ago and rows are never deleted
            return self.register(claim, expiry_s=expiry_s, bytes_stored=bytes_stored, room=room,
                                 moving_bytes=moving_bytes)
        raise _in_use(NodeInfo(*held[0]))

    def heartbeat(self, claim: NodeClaim, bytes_stored: int, *, room: tuple[int, int] = (0, -1),
                  moving_bytes: int = 0) -> bool:
        return bool(self._x(
            f"UPDATE nodes SET heartbeat_at = {_NOW}, bytes_stored = %s, capacity_bytes = %s, free_bytes = %s,"
            " moving_bytes = %s WHERE cluster = %s AND node_id = %s AND incarnation = %s AND state = 'up'"
            " RETURNING 1", (bytes_stored, room[0], room[1], moving_bytes, claim.cluster, claim.node_id,
                             claim.incarnation)))

    def leave(self, claim: NodeClaim) -> bool:
        return bool(self._x(
            "UPDATE nodes SET state = 'left' WHERE cluster = %s AND node_id = %s AND incarnation = %s"
            " AND state = 'up' RETURNING 1", (claim.cluster, claim.node_id, claim.incarnation)))

    def cluster_key(self, cluster: str) -> bytes:
        name = f"cluster_key:{cluster}"
        self._x("INSERT INTO gpufeed_meta (name, value) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
                (name, secrets.token_hex(32)))
        return bytes.fromhex(self._x("SELECT value FROM gpufeed_meta WHERE name = %s", (name,))[0][0])

    def nodes(self, cluster: str) -> list[NodeInfo]:
        return [NodeInfo(*r) for r in self._x(f"SELECT {_COLS} FROM nodes WHERE cluster = %s ORDER BY node_id",
                                               (cluster,))]


#: What ``under_replicated_chunks`` counts, as the report states it.
UNDER_REPLICATED_NOTE = ("chunks with fewer copies on live nodes than the replication factor (capped to the live "
                         "nodes), as the catalog records the copies: a copy whose bytes went bad counts until "
                         "scrub finds it")
_NOT_COUNTED_NOTE = "not counted: no live node, or no catalog to count in"
#: What ``under_replicated_parts`` counts, as the report states it.
UNDER_REPLICATED_PARTS_NOTE = ("parts of open multipart uploads with fewer copies of their file on live nodes than "
                               "the replication factor (capped to the live nodes), as the catalog records them")


def cluster_report(membership: Membership, cluster: str, expiry_s: float, *,
                   count_under: Callable[[list[str], int], int] | None = None, replicas: int = 2,
                   count_under_parts: Callable[[list[str], int], int] | None = None) -> dict:
    """What ``gpufeed admin cluster status`` shows.

    Args:
        membership: the catalog's membership.
        cluster: the cluster's name.
        expiry_s: seconds without a heartbeat after which a member is expired.
        count_under: ``count_under(live node ids, factor)``: chunks with fewer
            copies on those nodes (the catalog's ``under_replicated``); ``None``: not counted.
        replicas: the replication factor the count is against (capped to the live members).
        count_under_parts: ``count_under_parts(live node ids, factor)``: parts of open
            multipart uploads with fewer copies on those nodes (the catalog's
            ``under_replicated_parts``); ``None``: not counted.

    Returns:
        ``{"cluster", "expiry_s", "live", "nodes", "bytes_stored", "replicas",
        "under_replicated_chunks", "under_replicated_note", "under_replicated_parts",
        "under_replicated_parts_note"}``: ``nodes`` one
        ``{"node_id", "host", "s3_port", "wire_port", "health"
        ("live"|"expired"|"left"), "since_heartbeat_s", "started_at",
        "heartbeat_at", "bytes_stored" (its used bytes), "capacity_bytes",
        "free_bytes" (``None``: not reported), "full", "moving_bytes" (bytes it
        moves off to other members), "draining"}`` per member (times by the
        database's clock; figures as of its last heartbeat, :mod:`._room`);
        ``bytes_stored`` the live members' total;
        ``under_replicated_chunks`` ``None`` when not counted (see :data:`UNDER_REPLICATED_NOTE`),
        ``under_replicated_parts`` likewise (:data:`UNDER_REPLICATED_PARTS_NOTE`).

    Raises:
        CatalogUnavailable: the catalog's database cannot be reached.
    """
    nodes = []
    for n in membership.nodes(cluster):
        health = "left" if n.state == "left" else "live" if n.live(expiry_s) else "expired"
        nodes.append({"node_id": n.node_id, "host": n.host, "s3_port": n.s3_port, "wire_port": n.wire_port,
                      "health": health, "since_heartbeat_s": round(n.age_s, 3), "started_at": n.started_at,
                      "heartbeat_at": n.heartbeat_at, "bytes_stored": n.bytes_stored,
                      "capacity_bytes": n.capacity_bytes, "free_bytes": n.free_bytes if n.free_bytes >= 0 else None,
                      "full": is_full(n.capacity_bytes, n.free_bytes), "moving_bytes": n.moving_bytes,
                      "draining": n.moving_bytes > 0})
    live = [n for n in nodes if n["health"] == "live"]
    ids, factor = [str(n["node_id"]) for n in live], min(replicas, len(live))
    under = count_under(ids, factor) if count_under is not None and live else None
    parts = count_under_parts(ids, factor) if count_under_parts is not None and live else None
    return {"cluster": cluster, "expiry_s": expiry_s, "live": len(live), "nodes": nodes,
            "bytes_stored": sum(n["bytes_stored"] for n in live), "replicas": replicas,
            "under_replicated_chunks": under,
            "under_replicated_note": UNDER_REPLICATED_NOTE if under is not None else _NOT_COUNTED_NOTE,
            "under_replicated_parts": parts,
            "under_replicated_parts_note": UNDER_REPLICATED_PARTS_NOTE if parts is not None else _NOT_COUNTED_NOTE}
