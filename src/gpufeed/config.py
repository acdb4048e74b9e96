"""Typed settings for a gpufeed node and its clients.

One dataclass per section. Every field names its unit and the environment
variable that overrides it; :func:`NodeConfig.from_env` applies them. The CLI
builds one of these and hands it to the library; nothing else reads the
environment.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

__all__ = ["NodeConfig", "WireLimits", "DEFAULT_ACCESS_KEY", "DEFAULT_SECRET_KEY", "default_data_dir",
           "parse_size", "host_memory_bytes", "master_key_from_text"]

#: Credentials a fresh node accepts when none are configured (printed on start).
DEFAULT_ACCESS_KEY = "gpufeed"
DEFAULT_SECRET_KEY = "gpufeed-secret-key"


def default_data_dir() -> Path:
    """``$GPUFEED_DATA_DIR`` or ``~/.local/share/gpufeed`` (the embedded default)."""
    env = os.environ.get("GPUFEED_DATA_DIR")
    if env:
        return Path(env)
    return Path.home() / ".local" / "share" / "gpufeed"


def host_memory_bytes() -> int:
    """Physical memory of this host, bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_size(text: str) -> int:
    """``"1GiB"``, ``"256MiB"``, ``"4k"``, ``"1000000"`` -> bytes. Raises ValueError."""
    s = str(text).strip().lower().replace(" ", "")
    units = {
        "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
        "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
        "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "b": 1,
    }
    for unit in sorted(units, key=len, reverse=True):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * units[unit])
    return int(s)


def _size(text: str) -> int:
    size = parse_size(text)
    if size < 0:
        raise ValueError("a size cannot be negative")
    return size


def _seconds(text: str) -> float:
    seconds = float(text)
    if not 0 <= seconds < float("inf"):  # also refuses nan
        raise ValueError("a duration must be a finite number of seconds >= 0")
    return seconds


def _share(text: str) -> float:
    share = float(text)
    if not 0 <= share <= 1:  # also refuses nan
        raise ValueError("a share of the capacity is a number from 0 to 1")
    return share


def _flag(text: str) -> bool:
    return text not in ("0", "false", "no")


def _lease_seconds(text: str) -> float:
    seconds = _seconds(text)
    if seconds > 60:
        raise ValueError("a read lease may last at most 60 s")
    return seconds


def _count(text: str) -> int:
    count = int(text)
    if count < 0:
        raise ValueError("a count cannot be negative")
    return count


def _cache_entries(text: str) -> int:
    count = _count(text)
    if count > 4096:
        raise ValueError("a connection keeps at most 4096 object versions open")
    return count


def master_key_from_text(text: str) -> bytes:
    """A master key as given in ``GPUFEED_MASTER_KEY``: base64 of 32 bytes.

    Raises:
        ValueError: not base64 of exactly 32 bytes.
    """
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("GPUFEED_MASTER_KEY is not base64") from exc
    if len(key) != 32:
        raise ValueError(f"GPUFEED_MASTER_KEY must be base64 of 32 bytes, not {len(key)}")
    return key


def _env(name: str, cast, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r}: {exc}") from None


def _check_level(text: str) -> str:
    level = text.strip().lower()
    if level not in ("quick", "full", "off"):
        raise ValueError("the catalog check is one of quick, full, off")
    return level


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("a count must be >= 1")
    return value


def _pool_size(text: str) -> int:
    value = int(text)
    if value < 2:
        raise ValueError("the catalog's pool needs at least 2 connections")
    return value


@dataclass
class WireLimits:
    """Limits of the fast path (``NodeConfig.wire``): what one node gives clients
    it has not vetted, so that hostile or broken clients cannot wear it down.
    Each refusal is an error frame, never a silent hang (``docs/wire-protocol.md``).

    Attributes:
        max_connections: fast-path connections open at once, TCP and shm together;
            a connection past it gets a ``SlowDown`` error frame and is closed.
            One reader thread serves each connection, so this also bounds threads.
            Env ``GPUFEED_WIRE_MAX_CONNECTIONS``.
        max_connections_per_client: connections open at once from one client: one
            remote address (TCP) or one process (shm, ``SO_PEERCRED``); past it,
            ``SlowDown`` and close. Env ``GPUFEED_WIRE_MAX_CONNECTIONS_PER_CLIENT``.
        max_meta_bytes: largest metadata section of a request frame, bytes (the
            protocol's ceiling is 16 MiB, a get_many of ~100k items); checked on the
            header, and metadata is buffered only as its bytes arrive.
            Env ``GPUFEED_WIRE_MAX_META_BYTES``.
        header_timeout_s: seconds a frame's header and metadata may take once its
            first byte arrived, the seconds a new connection has to send its first
            frame, and the seconds a PUT payload may make no progress; past it,
            ``RequestTimeout`` and close. 0 never times out.
            Env ``GPUFEED_WIRE_HEADER_TIMEOUT_S``.
        idle_timeout_s: seconds a connection with no request in flight and nothing
            received may stay open; then ``RequestTimeout`` and close. 0 (the
            default) never closes idle connections: the Python SDK keeps its
            connections for a ``Client``'s lifetime and does not reconnect (a closed
            one fails its next request with ``TransportError``), and a shm
            connection holds the client's registered regions.
            Env ``GPUFEED_WIRE_IDLE_TIMEOUT_S``.
        client_memory_bytes: shared memory one client process may have mapped into
            the node (regions it registered, each memfd counted once, plus regions
            lent to it), bytes; past it, ``InvalidArgument``. Default: half the
            host's memory. Env ``GPUFEED_WIRE_CLIENT_MEMORY_BYTES``.
        node_memory_bytes: the same for all clients together, plus lent regions
            waiting for their process to exit, bytes. Default: 3/4 of the host's
            memory. Env ``GPUFEED_WIRE_NODE_MEMORY_BYTES``.
        lease_s: longest life of a read lease (op LEASE, shm only), seconds:
            a client reads a leased object version in its own process until
            the node's catalog commits anything or this time passes, whichever
            comes first (``docs/wire-protocol.md``). 0 offers no leases; at most 60.
            Env ``GPUFEED_WIRE_LEASE_S``.
        read_cache_entries: object versions each connection keeps open, with
            their access decision, for its small GETs, until the node's catalog
            commits anything (``gpufeed.wire._cachedgets``); 0 keeps none.
            Env ``GPUFEED_WIRE_READ_CACHE_ENTRIES``.
    """

    max_connections: int = 1024
    max_connections_per_client: int = 256
    max_meta_bytes: int = 16 << 20  # 16 MiB
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 0.0
    client_memory_bytes: int = field(default_factory=lambda: host_memory_bytes() // 2)
    node_memory_bytes: int = field(default_factory=lambda: host_memory_bytes() * 3 // 4)
    lease_s: float = 1.0
    read_cache_entries: int = 16

    @classmethod
    def from_env(cls) -> "WireLimits":
        """Defaults, then the ``GPUFEED_WIRE_*`` environment variables.

        Raises:
            ValueError: a variable does not parse (the message names it).
        """
        d = cls()
        return cls(
            max_connections=_env("GPUFEED_WIRE_MAX_CONNECTIONS", _at_least_one, d.max_connections),
            max_connections_per_client=_env("GPUFEED_WIRE_MAX_CONNECTIONS_PER_CLIENT", _at_least_one,
                                            d.max_connections_per_client),
            max_meta_bytes=_env("GPUFEED_WIRE_MAX_META_BYTES", _size, d.max_meta_bytes),
            header_timeout_s=_env("GPUFEED_WIRE_HEADER_TIMEOUT_S", _seconds, d.header_timeout_s),
            idle_timeout_s=_env("GPUFEED_WIRE_IDLE_TIMEOUT_S", _seconds, d.idle_timeout_s),
            client_memory_bytes=_env("GPUFEED_WIRE_CLIENT_MEMORY_BYTES", _size, d.client_memory_bytes),
            node_memory_bytes=_env("GPUFEED_WIRE_NODE_MEMORY_BYTES", _size, d.node_memory_bytes),
            lease_s=_env("GPUFEED_WIRE_LEASE_S", _lease_seconds, d.lease_s),
            read_cache_entries=_env("GPUFEED_WIRE_READ_CACHE_ENTRIES", _cache_entries, d.read_cache_entries),
        )


@dataclass
class NodeConfig:
    """Settings of one storage node (``gpufeed serve``).

    Attributes:
        data_dir: folder holding the catalog and object data. Env ``GPUFEED_DATA_DIR``.
        host: address every endpoint binds to. Env ``GPUFEED_HOST``.
        s3_port: TCP port of the S3 HTTP endpoint; 0 picks a free one. Env ``GPUFEED_S3_PORT``.
        port: TCP port of the fast data path; 0 picks a free one. Env ``GPUFEED_PORT``.
        socket_path: Unix socket of the same-host shared-memory path; ``None`` means
            ``<data_dir>/gpufeed.sock``; empty string disables it. Env ``GPUFEED_SOCKET``.
        access_key: the S3 access key id accepted. Env ``GPUFEED_ACCESS_KEY``.
        secret_key: the S3 secret access key. Env ``GPUFEED_SECRET_KEY``.
        region: the SigV4 region the node answers for. Env ``GPUFEED_REGION``.
        fsync: fsync data and metadata before acknowledging a write (durability).
            Env ``GPUFEED_FSYNC`` (``0``/``1``).
        io_threads: worker threads of the fast-path server. Env ``GPUFEED_IO_THREADS``.
        region_pool_bytes: shared memory the shm path keeps for reuse, bytes: regions
            the server handed to clients that have since exited (or unmapped them)
            are zeroed and kept, already populated, for the next client's ``alloc``
            (fresh shared memory costs ~0.5-1.3 s/GB to populate on small VMs).
            0 disables the pool. Env ``GPUFEED_REGION_POOL_BYTES`` (bytes or a size
            like ``4GiB``).
        max_object_bytes: largest single object accepted, bytes (5 TiB like S3).
        send_timeout_s: seconds a fast-path reply may make no progress (the client
            stopped reading) before the server closes that connection, so one stuck
            client cannot hold the worker threads; 0 never times out. Env
            ``GPUFEED_SEND_TIMEOUT_S``.
        lifecycle_interval_s: seconds between two passes of the lifecycle worker,
            which applies every bucket's lifecycle rules and aborts idle multipart
            uploads (the first pass runs at start); 0 turns the worker off. Env
            ``GPUFEED_LIFECYCLE_INTERVAL_S``.
        snapshot_interval_s: seconds between two passes of the snapshot worker,
            which makes and prunes the buckets' scheduled snapshots (hourly /
            daily, :mod:`gpufeed.engine._snapshot_schedule`; the first pass runs at
            start); 0 turns it off. Env ``GPUFEED_SNAPSHOT_INTERVAL_S``.
        replication_interval_s: seconds between two passes of the replication
            worker, which runs one round of every replication rule that is not
            paused (:mod:`gpufeed.replication`; the first pass runs at start); 0
            turns it off (rounds then run only when asked, ``gpufeed replicate
            sync``). Env ``GPUFEED_REPLICATION_INTERVAL_S``.
        replication_timeout_s: seconds one request to a replication target may
            take. Env ``GPUFEED_REPLICATION_TIMEOUT_S``.
        abort_idle_uploads_s: seconds after which a multipart upload nobody has
            touched (no start or part upload since) is aborted and its parts
            deleted, whatever the bucket's rules; default 7 days; 0 never. Env
            ``GPUFEED_ABORT_IDLE_UPLOADS_S``.
        s3_header_timeout_s: seconds an S3 connection may take to deliver a request's
            headers (from its opening, or from the first byte of a later request);
            past it the connection is answered 400 RequestTimeout (if it sent
            anything) and closed. 0 never times out. Env ``GPUFEED_S3_HEADER_TIMEOUT_S``.
        s3_body_timeout_s: seconds an S3 request body may make no progress while the
            node waits for it; past it the request is answered 400 RequestTimeout and
            the connection closed. 0 never times out. Env ``GPUFEED_S3_BODY_TIMEOUT_S``.
        s3_keepalive_timeout_s: seconds an idle keep-alive S3 connection is kept open
            between requests. Env ``GPUFEED_S3_KEEPALIVE_TIMEOUT_S``.
        s3_max_connections_per_address: open S3 connections one client IP address may
            hold; a connection past it is answered 503 SlowDown and closed. 0 means no
            limit. Env ``GPUFEED_S3_MAX_CONNECTIONS_PER_ADDRESS``.
        access_log: where the S3 access log goes, one JSON line per request: a file
            path (appended to), ``"-"`` for stdout, or ``None`` for none. Env
            ``GPUFEED_ACCESS_LOG``.
        wire: the fast path's limits on connections, frames, timeouts and shared
            memory (:class:`WireLimits`; env ``GPUFEED_WIRE_*``).
        master_key: 32 bytes that seal the secrets of tenants' access keys at
            rest; ``None`` keeps them in ``<data_dir>/master.key`` (made on first
            use). Env ``GPUFEED_MASTER_KEY`` (base64 of 32 bytes).
        metrics_port: TCP port, on ``host``, of the metrics listener: ``GET /metrics``
            (Prometheus text format) and ``GET /health`` (JSON; 503 when unhealthy);
            0 picks a free port, negative (the default) serves none. Unauthenticated
            (scrapers do not sign): it holds no object data but shows request counts,
            error codes and, with ``metrics_tenant_labels``, tenant names and usage;
            bind ``host`` to a loopback or management address where that matters.
            The S3 port answers ``GET /_gpufeed/health`` unauthenticated either way.
            Env ``GPUFEED_METRICS_PORT``.
        capacity_bytes: most bytes of object data the data folder may hold on disk
            (after compression and dedup); writes past it are refused with
            ``StorageFull`` (507) and nothing of them is kept, reads go on; 0: no
            limit but the disk's (a full disk is refused the same way). Env
            ``GPUFEED_CAPACITY`` (bytes or a size like ``500GiB``).
        scrub_interval_s: seconds between background scrubs (each reads and checks
            every stored chunk, see ``gpufeed scrub``), counted from the last
            complete one; 0 turns them off. Env ``GPUFEED_SCRUB_INTERVAL_S``.
        scrub_rate_bytes: most bytes a background scrub reads per second (0: no
            limit). Env ``GPUFEED_SCRUB_RATE`` (bytes or a size like ``100MiB``).
        metrics_tenant_labels: export per-tenant usage gauges with a ``tenant``
            label (tenant names); off, only node totals. Env
            ``GPUFEED_METRICS_TENANT_LABELS`` (``0``/``1``).
        catalog_check: the catalog's integrity check at start: ``"quick"``
            (``PRAGMA quick_check``: every page of every table and index is well
            formed; about 4 s per million objects with the file cached, 11 s
            cold, on a loaded 2-core VM), ``"full"`` (``PRAGMA integrity_check``:
            also every index against its table) or ``"off"`` (header and schema
            version only). A damaged catalog stops the start with a message
            naming ``gpufeed catalog recover`` (docs/catalog.md). SQLite only.
            Env ``GPUFEED_CATALOG_CHECK``.
        catalog: where the catalog lives: ``""`` (the default) for SQLite in
            ``<data_dir>/catalog.sqlite3``, or a PostgreSQL URL
            ``postgresql://user:password@host:port/dbname`` (docs/catalog-postgres.md;
            needs the ``postgres`` extra). Not shown by ``repr`` (it may hold a
            password). Env ``GPUFEED_CATALOG``.
        catalog_pool_size: PostgreSQL: most database connections the node opens
            (>= 2). Env ``GPUFEED_CATALOG_POOL_SIZE``.
        catalog_timeout_s: PostgreSQL: seconds a request waits for a database
            connection (also while the database is unreachable) before it is
            answered 503 ServiceUnavailable; also how long a write waits for the
            catalog's writer lock. Env ``GPUFEED_CATALOG_TIMEOUT_S``.
        catalog_idle_tx_s: PostgreSQL: seconds the database server lets one of
            the node's sessions sit idle inside a transaction before it ends the
            session (``idle_in_transaction_session_timeout``), so a node cut off
            mid-write does not hold the writer lock for ever.
            Env ``GPUFEED_CATALOG_IDLE_TX_S``.
        cluster: PostgreSQL: the name recorded as the catalog's owner, so that
            a node with another data folder may open the catalog under the same
            name; ``""`` records the data folder's id (``<data_dir>/node.id``).
            With a cluster name the node is a member of that cluster
            (docs/cluster.md): it registers in the catalog and heartbeats.
            Env ``GPUFEED_CLUSTER``.
        cluster_heartbeat_s: seconds between a cluster member's heartbeats
            (> 0). Env ``GPUFEED_CLUSTER_HEARTBEAT_S``.
        cluster_expiry_s: seconds after its last heartbeat at which a member
            counts as expired (not live), by the database's clock; more than
            ``cluster_heartbeat_s``. Env ``GPUFEED_CLUSTER_EXPIRY_S``.
        cluster_advertise_host: the address a member registers for others to
            reach it at; ``""`` registers ``host``, or the machine's host name
            when ``host`` is a wildcard (``0.0.0.0``, ``::``). Env
            ``GPUFEED_CLUSTER_ADVERTISE_HOST``.
        cluster_bytes_interval_s: seconds between a member's counts of the
            bytes of files in its data folder (a walk of the folder; each
            heartbeat sends the latest count). Env
            ``GPUFEED_CLUSTER_BYTES_INTERVAL_S``.
        cluster_fetch_timeout_s: seconds a read may wait for another node
            that holds a chunk (connecting, and each wait for its bytes); past
            it the read fails with ``ServiceUnavailable`` (> 0). Env
            ``GPUFEED_CLUSTER_FETCH_TIMEOUT_S``.
        cluster_fetches: most chunks fetched from other nodes at once; a read
            that finds them all busy waits up to ``cluster_fetch_timeout_s``
            (>= 1). Env ``GPUFEED_CLUSTER_FETCHES``.
        cluster_part_fetches: most part files a multipart completion fetches
            from other nodes at once (those of its parts this node lacks; each
            holds 1 MiB of memory while it streams) (>= 1). Env
            ``GPUFEED_CLUSTER_PART_FETCHES``.
        cluster_replicas: copies of each data file a write stores before it is
            acknowledged, the writer's included (>= 1; capped to the live
            members; 1: only the writer's). Env ``GPUFEED_CLUSTER_REPLICAS``.
        cluster_copy_timeout_s: seconds any one wait of a push of a copy to
            another node may take (connecting, each send, its reply); past it
            the next-ranked node is tried (> 0). Env ``GPUFEED_CLUSTER_COPY_TIMEOUT_S``.
        cluster_copy_max_bytes: largest data file a node takes as a copy from
            another, bytes (its block sums, 1/1024 of it, sit in memory while it
            is checked). Env ``GPUFEED_CLUSTER_COPY_MAX_BYTES``.
        cluster_rereplicate_interval_s: seconds between a node's passes that
            restore the replication factor of data files it holds (> 0). Env
            ``GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S``.
        cluster_rereplicate_bytes_s: most bytes per second a node sends when
            it restores the factor (> 0). Env ``GPUFEED_CLUSTER_REREPLICATE_RATE``.
        cluster_orphan_grace_s: data files in a member's folder that no chunk
            names (copies of data deleted through another node, copies a
            refused write left) are deleted once this many seconds old, by a
            sweep about every quarter of it; longer than any write takes
            (0: only at the next start). Env ``GPUFEED_CLUSTER_ORPHAN_GRACE_S``.
        cluster_rebalance: move data files to the nodes their placement ranks
            first when the live members change (a node joins or returns), at
            the re-replication rate. Env ``GPUFEED_CLUSTER_REBALANCE`` (``0`` off).
        cluster_repair_queue: most data files waiting for a repair from another
            node's copy after a read found them damaged (more are left to the
            next scrub; 0: reads ask for none). Env ``GPUFEED_CLUSTER_REPAIR_QUEUE``.
        cluster_fetch_cache_bytes: most stored bytes of chunks fetched from
            other nodes that a node keeps for later reads (unlinked files in
            its ``tmp/``; 0: none). Env ``GPUFEED_CLUSTER_FETCH_CACHE`` (bytes or
            a size like ``4GiB``).
        cluster_reserve_bytes: bytes of a member's file system kept free: a
            node whose disk has less free above it takes no new data file (as
            when it reaches ``capacity_bytes``). Env ``GPUFEED_CLUSTER_RESERVE``
            (bytes or a size like ``10GiB``).
        cluster_drain_high: share of a member's capacity past which its used
            bytes make it drain: it moves copies of its data files to members
            with room, at the re-replication rate, and placement ranks it after
            every member that does not drain (``0 < low < high <= 1``; with a
            replication factor of 2 or more). Env ``GPUFEED_CLUSTER_DRAIN_HIGH``.
        cluster_drain_low: share of its capacity at or under which a draining
            member stops. Env ``GPUFEED_CLUSTER_DRAIN_LOW``.
    """

    data_dir: Path = field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    s3_port: int = 9000
    port: int = 9400
    socket_path: str | None = None
    access_key: str = DEFAULT_ACCESS_KEY
    secret_key: str = DEFAULT_SECRET_KEY
    region: str = "us-east-1"
    fsync: bool = True
    io_threads: int = 8
    region_pool_bytes: int = 4 << 30  # 4 GiB
    max_object_bytes: int = 5 << 40  # 5 TiB
    send_timeout_s: float = 30.0
    lifecycle_interval_s: float = 3600.0  # 1 hour
    snapshot_interval_s: float = 60.0  # 1 minute
    replication_interval_s: float = 60.0  # 1 minute
    replication_timeout_s: float = 60.0
    abort_idle_uploads_s: float = 7 * 86400.0  # 7 days
    s3_header_timeout_s: float = 15.0
    s3_body_timeout_s: float = 30.0
    s3_keepalive_timeout_s: float = 75.0
    s3_max_connections_per_address: int = 256
    access_log: str | None = None
    wire: WireLimits = field(default_factory=WireLimits)
    master_key: bytes | None = field(default=None, repr=False)
    metrics_port: int = -1
    metrics_tenant_labels: bool = True
    capacity_bytes: int = 0
    scrub_interval_s: float = 7 * 86400.0  # 7 days
    scrub_rate_bytes: int = 100 << 20  # 100 MiB/s
    catalog_check: str = "quick"
    catalog: str = field(default="", repr=False)
    catalog_pool_size: int = 8
    catalog_timeout_s: float = 5.0
    catalog_idle_tx_s: float = 120.0
    cluster: str = ""
    cluster_heartbeat_s: float = 2.0
    cluster_expiry_s: float = 10.0
    cluster_advertise_host: str = ""
    cluster_bytes_interval_s: float = 60.0  # 1 minute
    cluster_fetch_timeout_s: float = 10.0
    cluster_fetches: int = 8
    cluster_part_fetches: int = 4
    cluster_replicas: int = 2
    cluster_copy_timeout_s: float = 30.0
    cluster_copy_max_bytes: int = 64 << 30  # 64 GiB
    cluster_rereplicate_interval_s: float = 10.0
    cluster_rereplicate_bytes_s: int = 100 << 20  # 100 MiB/s
    cluster_orphan_grace_s: float = 3600.0  # 1 hour
    cluster_rebalance: bool = True
    cluster_repair_queue: int = 1024
    cluster_fetch_cache_bytes: int = 1 << 30  # 1 GiB
    cluster_reserve_bytes: int = 0
    cluster_drain_high: float = 0.9
    cluster_drain_low: float = 0.8

    @classmethod
    def from_env(cls, **overrides) -> "NodeConfig":
        """Defaults, then ``GPUFEED_*`` environment variables, then ``overrides``
        (keyword arguments whose value is ``None`` are ignored)."""
        cfg = cls(
            data_dir=default_data_dir(),
            host=_env("GPUFEED_HOST", str, cls.host),
            s3_port=_env("GPUFEED_S3_PORT", int, cls.s3_port),
            port=_env("GPUFEED_PORT", int, cls.port),
            socket_path=_env("GPUFEED_SOCKET", str, None),
            access_key=_env("GPUFEED_ACCESS_KEY", str, cls.access_key),
            secret_key=_env("GPUFEED_SECRET_KEY", str, cls.secret_key),
            region=_env("GPUFEED_REGION", str, cls.region),
            fsync=_env("GPUFEED_FSYNC", _flag, True),
            io_threads=_env("GPUFEED_IO_THREADS", int, cls.io_threads),
            region_pool_bytes=_env("GPUFEED_REGION_POOL_BYTES", _size, cls.region_pool_bytes),
            send_timeout_s=_env("GPUFEED_SEND_TIMEOUT_S", _seconds, cls.send_timeout_s),
            lifecycle_interval_s=_env("GPUFEED_LIFECYCLE_INTERVAL_S", _seconds, cls.lifecycle_interval_s),
            snapshot_interval_s=_env("GPUFEED_SNAPSHOT_INTERVAL_S", _seconds, cls.snapshot_interval_s),
            replication_interval_s=_env("GPUFEED_REPLICATION_INTERVAL_S", _seconds, cls.replication_interval_s),
            replication_timeout_s=_env("GPUFEED_REPLICATION_TIMEOUT_S", _seconds, cls.replication_timeout_s),
            abort_idle_uploads_s=_env("GPUFEED_ABORT_IDLE_UPLOADS_S", _seconds, cls.abort_idle_uploads_s),
            s3_header_timeout_s=_env("GPUFEED_S3_HEADER_TIMEOUT_S", _seconds, cls.s3_header_timeout_s),
            s3_body_timeout_s=_env("GPUFEED_S3_BODY_TIMEOUT_S", _seconds, cls.s3_body_timeout_s),
            s3_keepalive_timeout_s=_env("GPUFEED_S3_KEEPALIVE_TIMEOUT_S", _seconds,
                                        cls.s3_keepalive_timeout_s),
            s3_max_connections_per_address=_env("GPUFEED_S3_MAX_CONNECTIONS_PER_ADDRESS", _count,
                                                cls.s3_max_connections_per_address),
            access_log=_env("GPUFEED_ACCESS_LOG", str, None),
            wire=WireLimits.from_env(),
            master_key=_env("GPUFEED_MASTER_KEY", master_key_from_text, None),
            metrics_port=_env("GPUFEED_METRICS_PORT", int, cls.metrics_port),
            metrics_tenant_labels=_env("GPUFEED_METRICS_TENANT_LABELS", _flag, cls.metrics_tenant_labels),
            capacity_bytes=_env("GPUFEED_CAPACITY", _size, cls.capacity_bytes),
            scrub_interval_s=_env("GPUFEED_SCRUB_INTERVAL_S", _seconds, cls.scrub_interval_s),
            scrub_rate_bytes=_env("GPUFEED_SCRUB_RATE", _size, cls.scrub_rate_bytes),
            catalog_check=_env("GPUFEED_CATALOG_CHECK", _check_level, cls.catalog_check),
            catalog=_env("GPUFEED_CATALOG", str, ""),
            catalog_pool_size=_env("GPUFEED_CATALOG_POOL_SIZE", _pool_size, cls.catalog_pool_size),
            catalog_timeout_s=_env("GPUFEED_CATALOG_TIMEOUT_S", _seconds, cls.catalog_timeout_s),
            catalog_idle_tx_s=_env("GPUFEED_CATALOG_IDLE_TX_S", _seconds, cls.catalog_idle_tx_s),
            cluster=_env("GPUFEED_CLUSTER", str, cls.cluster),
            cluster_heartbeat_s=_env("GPUFEED_CLUSTER_HEARTBEAT_S", _seconds, cls.cluster_heartbeat_s),
            cluster_expiry_s=_env("GPUFEED_CLUSTER_EXPIRY_S", _seconds, cls.cluster_expiry_s),
            cluster_advertise_host=_env("GPUFEED_CLUSTER_ADVERTISE_HOST", str, cls.cluster_advertise_host),
            cluster_bytes_interval_s=_env("GPUFEED_CLUSTER_BYTES_INTERVAL_S", _seconds,
                                          cls.cluster_bytes_interval_s),
            cluster_fetch_timeout_s=_env("GPUFEED_CLUSTER_FETCH_TIMEOUT_S", _seconds, cls.cluster_fetch_timeout_s),
            cluster_fetches=_env("GPUFEED_CLUSTER_FETCHES", _count, cls.cluster_fetches),
            cluster_part_fetches=_env("GPUFEED_CLUSTER_PART_FETCHES", _count, cls.cluster_part_fetches),
            cluster_replicas=_env("GPUFEED_CLUSTER_REPLICAS", _count, cls.cluster_replicas),
            cluster_copy_timeout_s=_env("GPUFEED_CLUSTER_COPY_TIMEOUT_S", _seconds, cls.cluster_copy_timeout_s),
            cluster_copy_max_bytes=_env("GPUFEED_CLUSTER_COPY_MAX_BYTES", _size, cls.cluster_copy_max_bytes),
            cluster_rereplicate_interval_s=_env("GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S", _seconds,
                                                cls.cluster_rereplicate_interval_s),
            cluster_rereplicate_bytes_s=_env("GPUFEED_CLUSTER_REREPLICATE_RATE", _size,
                                             cls.cluster_rereplicate_bytes_s),
            cluster_orphan_grace_s=_env("GPUFEED_CLUSTER_ORPHAN_GRACE_S", _seconds, cls.cluster_orphan_grace_s),
            cluster_rebalance=_env("GPUFEED_CLUSTER_REBALANCE", _flag, cls.cluster_rebalance),
            cluster_repair_queue=_env("GPUFEED_CLUSTER_REPAIR_QUEUE", _count, cls.cluster_repair_queue),
            cluster_fetch_cache_bytes=_env("GPUFEED_CLUSTER_FETCH_CACHE", _size, cls.cluster_fetch_cache_bytes),
            cluster_reserve_bytes=_env("GPUFEED_CLUSTER_RESERVE", _size, cls.cluster_reserve_bytes),
            cluster_drain_high=_env("GPUFEED_CLUSTER_DRAIN_HIGH", _share, cls.cluster_drain_high),
            cluster_drain_low=_env("GPUFEED_CLUSTER_DRAIN_LOW", _share, cls.cluster_drain_low),
        )
        names = {f.name for f in fields(cls)}
        for k, v in overrides.items():
            if k not in names:
                raise TypeError(f"unknown NodeConfig field {k!r}")
            if v is not None:
                setattr(cfg, k, Path(v) if k == "data_dir" else v)
        return cfg

    @property
    def resolved_socket_path(self) -> str | None:
        """The shared-memory socket path, or ``None`` when disabled."""
        if self.socket_path == "":
            return None
        return self.socket_path or str(Path(self.data_dir) / "gpufeed.sock")
