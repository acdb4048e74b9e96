"""One storage node in one process: the engine, the S3 endpoint and the fast path.

``gpufeed serve`` builds a :class:`Node` from a :class:`~gpufeed.config.NodeConfig`,
starts it, prints the endpoints as one JSON line and waits for SIGINT/SIGTERM.
Tests and benchmarks start nodes the same way (in a subprocess).

Besides the endpoints a node runs three background threads: the lifecycle worker
(:class:`LifecycleWorker`): every ``lifecycle_interval_s`` it applies the
buckets' lifecycle rules and aborts multipart uploads idle for
``abort_idle_uploads_s`` (:meth:`gpufeed.engine.Engine.apply_lifecycle`); and
the snapshot worker (:class:`SnapshotWorker`): every ``snapshot_interval_s`` it
makes and prunes the buckets' scheduled snapshots
(:meth:`gpufeed.engine.Engine.run_snapshot_schedules`); and the replication
worker (:class:`~gpufeed.replication.ReplicationWorker`): every
``replication_interval_s`` it runs a round of every replication rule
(:mod:`gpufeed.replication`). A node with a
cluster name (``--cluster``) also runs a :class:`~gpufeed._cluster.ClusterMember`:
it registers the node before :meth:`Node.start` returns, heartbeats, and
leaves on :meth:`Node.stop`.

Every node counts its requests in a :class:`~gpufeed._metrics.NodeMetrics` of
its own (``Node.metrics``); with ``metrics_port`` >= 0 it also serves them, with
a health answer, on a listener of their own (:mod:`gpufeed._monitor`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._cluster import ClusterMember, advertised_host
from ._drain import Drainer
from ._metrics import NodeMetrics
from ._partcopies import PartCopies
from ._partrepair import PartRestorer
from ._peers import PeerLink
from ._replicas import Replicas, ReReplicator
from .config import DEFAULT_SECRET_KEY, NodeConfig
from .engine import CatalogSettings, Engine
from .engine._catalogs import node_id
from .engine._private import make_private_dirs
from .engine._room import NodeRoom
from .errors import CatalogUnavailable
from .replication import ReplicationWorker, Replicator

if TYPE_CHECKING:
    from aiohttp import web

    from .wire.server import WireServer

__all__ = ["Node", "Endpoints", "LifecycleWorker", "SnapshotWorker"]

log = logging.getLogger("gpufeed.node")


@dataclass(frozen=True)
class Endpoints:
    """Where a running node listens (what ``gpufeed serve`` prints)."""

    s3: str
    tcp: str | None
    shm: str | None
    access_key: str
    secret_key: str
    data_dir: str
    #: Problems found at start that the operator should fix (a data folder other
    #: users can read); also logged.
    warnings: tuple[str, ...] = ()
    #: ``http://host:port/metrics`` when the metrics port is on, else ``None``.
    metrics: str | None = None

    def as_dict(self) -> dict:
        return {
            "s3": self.s3,
            "tcp": self.tcp,
            "shm": self.shm,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "data_dir": self.data_dir,
            "warnings": list(self.warnings),
            "metrics": self.metrics,
        }


class LifecycleWorker:
    """A daemon thread that calls ``engine.apply_lifecycle`` every ``interval_s``
    seconds (first at start) until :meth:`stop`. A failed pass is logged and the
    next one runs on time.

    Args:
        engine: the node's engine.
        interval_s: seconds between passes (> 0).
        idle_upload_s: passed on as ``idle_upload_s`` (0: no idle-upload default).
        metrics: where each pass is counted (``None``: nowhere).
    """

    def __init__(self, engine: Engine, interval_s: float, idle_upload_s: float,
                 metrics: NodeMetrics | None = None) -> None:
        self._engine = engine
        self._metrics = metrics
        self._interval_s = interval_s
        self._idle_upload_s = idle_upload_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufeed-lifecycle", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self._engine.apply_lifecycle(idle_upload_s=self._idle_upload_s)
                if self._metrics is not None:
                    self._metrics.lifecycle_pass(dataclasses.asdict(done))
                if any(dataclasses.astuple(done)):
                    log.info("lifecycle: %s", ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(done).items()))
            except CatalogUnavailable as exc:  # the database is away: one line, no traceback
                log.warning("lifecycle pass skipped: %s", exc.message)
                if self._metrics is not None:
                    self._metrics.lifecycle_pass(None)
            except Exception:
                if self._stop.is_set():
                    return  # the engine closed under a pass that was ending anyway
                log.exception("lifecycle pass failed")
                if self._metrics is not None:
                    self._metrics.lifecycle_pass(None)
            self._stop.wait(self._interval_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to end and wait up to ``timeout_s`` for a pass in progress."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


class SnapshotWorker:
    """A daemon thread that runs ``engine.run_snapshot_schedules`` every
    ``interval_s`` seconds (first at start) until :meth:`stop`; a failed pass is
    logged and the next one runs on time.

    Args:
        engine: the node's engine.
        interval_s: seconds between passes (> 0).
    """

    def __init__(self, engine: Engine, interval_s: float) -> None:
        self._engine = engine
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufeed-snapshots", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self._engine.run_snapshot_schedules()
                if done:
                    log.info("scheduled snapshots: %s", " ".join(done))
            except CatalogUnavailable as exc:  # the database is away: one line, no traceback
                log.warning("snapshot schedule pass skipped: %s", exc.message)
            except Exception:
                if self._stop.is_set():
                    return  # the engine closed under a pass that was ending anyway
                log.exception("snapshot schedule pass failed")
            self._stop.wait(self._interval_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to end and wait up to ``timeout_s`` for a pass in progress."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


async def _stop_s3(runner: web.AppRunner) -> None:
    """Clean the S3 runner up, then cancel what aiohttp leaves behind: a connection
    whose client left while aiohttp drained its unread body keeps a task that the
    runner's shutdown does not reach (it would be destroyed pending with the loop)."""
    await runner.cleanup()
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


class Node:
    """A running storage node.

    Args:
        config: node settings; ports 0 pick free ports.

    Usage::

        node = Node(NodeConfig.from_env(data_dir="/tmp/d", s3_port=0, port=0))
        endpoints = node.start()
        ...
        node.stop()
    """

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._monitor: web.AppRunner | None = None
        #: this node's metrics (its own registry)
        self.metrics = NodeMetrics(tenant_labels=config.metrics_tenant_labels)
        self._wire: WireServer | None = None
        self._lifecycle: LifecycleWorker | None = None
        self._snapshots: SnapshotWorker | None = None
        #: the node's cluster membership (``None``: not in a cluster)
        self.member: ClusterMember | None = None
        #: copies of data files on other members, and the job that restores their factor (``None``: none)
        self.replicas: Replicas | None = None
        self.rereplicator: ReReplicator | None = None
        #: The node's replication rules (``None`` until started).
        self.replicator: Replicator | None = None
        self._replication: ReplicationWorker | None = None
        self.endpoints: Endpoints | None = None

    def start(self) -> Endpoints:
        """Open the engine and start every endpoint; returns where they listen.

        A start that fails stops what it started, and removes the data
        folder when this start created it (a mistyped port leaves nothing behind).

        Raises:
            OSError: a port or socket path is taken (the message names which).
            DataFolderInUse: another node has the data folder open.
            CatalogDamaged: the catalog fails its check at start (nothing was changed).
            CatalogInUse: the PostgreSQL catalog belongs to another cluster or node.
            NodeIdInUse: a live member of the cluster holds this data folder's id.
            ValueError: the cluster's heartbeat and expiry do not fit (expiry <= heartbeat), or
                a copy or re-replication setting is out of range (factor < 1, a timeout,
                interval or rate <= 0).
        """
        cfg = self.config
        data_dir = Path(cfg.data_dir).resolve()
        created = not data_dir.exists()
        try:
            return self._start(data_dir)
        except BaseException:
            self.stop()
            if created:
                shutil.rmtree(data_dir, ignore_errors=True)
            raise

    def _start(self, data_dir: Path) -> Endpoints:
        from ._monitor import add_node_sources
        from .wire.server import WireServer

        cfg = self.config
        make_private_dirs(data_dir)
        sock = cfg.resolved_socket_path
        if sock and Path(sock).resolve().parent.is_relative_to(data_dir):
            make_private_dirs(Path(sock).resolve().parent)  # the socket's folder is private too
        catalog = CatalogSettings(url=cfg.catalog, pool_size=cfg.catalog_pool_size,
                                  pool_timeout_s=cfg.catalog_timeout_s, idle_tx_s=cfg.catalog_idle_tx_s,
                                  cluster=cfg.cluster, check=cfg.catalog_check)
        self.engine = engine = Engine(cfg.data_dir, fsync=cfg.fsync, master_key=cfg.master_key,
                                      capacity_bytes=cfg.capacity_bytes, catalog=catalog)
        if cfg.scrub_interval_s > 0:
            engine.scrubber.schedule(cfg.scrub_interval_s, cfg.scrub_rate_bytes)
        self.replicator = Replicator(engine, timeout_s=cfg.replication_timeout_s)
        self._wire = wire = WireServer(engine, cfg, self.metrics)
        add_node_sources(self.metrics, engine, wire)
        try:
            tcp_port = wire.start()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen for the fast path on {cfg.host}:{cfg.port} "
                                     f"or {sock or 'no socket'}: {exc.strerror}") from exc

        self._loop = loop = asyncio.new_event_loop()
        started = threading.Event()
        result: dict[str, Any] = {}

        def run_loop() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_http(engine, result))
            except BaseException as exc:  # reported to start()
                result["error"] = exc
            started.set()
            if "error" not in result:
                loop.run_forever()

        self._loop_thread = threading.Thread(target=run_loop, name="gpufeed-s3", daemon=True)
        self._loop_thread.start()
        started.wait()
        if "error" in result:
            err = result["error"]
            if isinstance(err, OSError):
                where = (f"metrics on {cfg.host}:{cfg.metrics_port}" if "port" in result
                         else f"S3 on {cfg.host}:{cfg.s3_port}")
                raise OSError(err.errno, f"cannot listen for {where}: {err.strerror}") from err
            raise err
        self._runner = result["runner"]
        self._monitor = result.get("monitor")
        if cfg.lifecycle_interval_s > 0:
            self._lifecycle = LifecycleWorker(engine, cfg.lifecycle_interval_s, cfg.abort_idle_uploads_s,
                                              self.metrics)
            self._lifecycle.start()
        if cfg.snapshot_interval_s > 0:
            self._snapshots = SnapshotWorker(engine, cfg.snapshot_interval_s)
            self._snapshots.start()
        warnings = list(engine.permission_warnings) + list(
            engine.key_warnings(default_admin_secret=cfg.secret_key == DEFAULT_SECRET_KEY))
        if cfg.cluster:
            warnings += self._join(engine, data_dir, result["port"], tcp_port or 0)
        if cfg.replication_interval_s > 0:
            self._replication = ReplicationWorker(self.replicator, cfg.replication_interval_s)
            self._replication.start()
        self.endpoints = Endpoints(
            s3=f"http://{cfg.host}:{result['port']}",
            tcp=f"gpufeed+tcp://{cfg.host}:{tcp_port}" if tcp_port else None,
            shm=f"gpufeed+shm://{sock}" if sock else None,
            access_key=cfg.access_key,
            secret_key=cfg.secret_key,
            data_dir=str(data_dir),
            warnings=tuple(warnings),
            metrics=f"http://{cfg.host}:{result['metrics_port']}/metrics" if self._monitor else None,
        )
        return self.endpoints

    def _join(self, engine: Engine, data_dir: Path, s3_port: int, wire_port: int) -> list[str]:
        """Register in the cluster (refused: the start fails) and start heartbeating;
        returns what the operator should know (also logged)."""
        cfg = self.config
        room = NodeRoom(data_dir, capacity_bytes=cfg.capacity_bytes, reserve_bytes=cfg.cluster_reserve_bytes,
                        count_interval_s=cfg.cluster_bytes_interval_s, placing=cfg.cluster_replicas > 1,
                        high_water=cfg.cluster_drain_high, low_water=cfg.cluster_drain_low)
        self.member = ClusterMember(
            engine.membership, cluster=cfg.cluster, node_id=node_id(data_dir),
            host=advertised_host(cfg.host, cfg.cluster_advertise_host), s3_port=s3_port, wire_port=wire_port,
            data_dir=data_dir, heartbeat_s=cfg.cluster_heartbeat_s, expiry_s=cfg.cluster_expiry_s,
            bytes_interval_s=cfg.cluster_bytes_interval_s, room=room if engine.catalog_is_shared else None)
        try:
            me = self.member.join()
        except BaseException:
            self.member = None
            raise
        if engine.catalog_is_shared:  # members read each other's chunks (docs/cluster.md)
            link = PeerLink(engine.membership, cluster=cfg.cluster, node_id=me.node_id,
                            expiry_s=cfg.cluster_expiry_s, timeout_s=cfg.cluster_fetch_timeout_s,
                            fetches=cfg.cluster_fetches)
            if self._wire is not None:
                self._wire.auth.peers = link.secret_for
                self._wire.ops.cluster = link  # LOCATE names members (cluster-routing clients)
            self.replicas = Replicas(engine, link, engine.membership, cluster=cfg.cluster, node_id=me.node_id,
                                     factor=cfg.cluster_replicas, expiry_s=cfg.cluster_expiry_s,
                                     timeout_s=cfg.cluster_copy_timeout_s, room=room)
            engine.use_room(room)  # this node's own bytes against its capacity (docs/cluster.md)
            engine.use_peers(link.fetch, self.replicas.push if cfg.cluster_replicas > 1 else None,
                             copy_max_bytes=cfg.cluster_copy_max_bytes, repair_queue=cfg.cluster_repair_queue,
                             fetch_cache_bytes=cfg.cluster_fetch_cache_bytes)
            part_copies = PartCopies(self.replicas, link, cfg.cluster_fetch_timeout_s, cfg.cluster_part_fetches)
            engine.use_part_peers(part_copies)
            from ._monitor import add_cluster_source

            add_cluster_source(self.metrics, engine, cfg.cluster, cfg.cluster_expiry_s, cfg.cluster_replicas)
            self.rereplicator = ReReplicator(engine, self.replicas, interval_s=cfg.cluster_rereplicate_interval_s,
                                             rate_bytes_s=cfg.cluster_rereplicate_bytes_s,
                                             orphan_grace_s=cfg.cluster_orphan_grace_s,
                                             rebalance=cfg.cluster_rebalance,
                                             parts=PartRestorer(engine, part_copies, self.replicas),
                                             drain=Drainer(engine, self.replicas) if cfg.cluster_replicas > 1
                                             else None)
            self.rereplicator.start()
        warnings = []
        if not engine.catalog_is_shared:
            warnings.append(f"cluster {cfg.cluster!r} on the SQLite catalog has this node as its only member; "
                            "nodes of one cluster share a PostgreSQL catalog (--catalog postgresql://...)")
        others = [n for n in engine.membership.nodes(cfg.cluster)
                  if n.node_id != me.node_id and n.live(cfg.cluster_expiry_s)]
        if others and engine.catalog_is_shared and cfg.cluster_replicas < 2:
            warnings.append(f"cluster {cfg.cluster!r} has {len(others)} other live node(s) and replication factor "
                            f"{cfg.cluster_replicas}: each chunk is stored on the node that wrote it only, so an "
                            "object is readable while that node is live (docs/cluster.md)")
        for w in warnings:
            log.warning(w)
        return warnings

    async def _start_http(self, engine: Engine, result: dict[str, Any]) -> None:
        """Start the S3 endpoint, then the metrics port if it is on (the S3 endpoint
        is cleaned up again when that fails); fills ``result``."""
        from ._monitor import start_monitor
        from .s3 import serve_s3

        cfg = self.config
        runner, result["port"] = await serve_s3(engine, cfg, self.metrics, replication=self.replicator)
        if cfg.metrics_port >= 0:
            try:
                result["monitor"], result["metrics_port"] = await start_monitor(
                    self.metrics, engine, cfg.host, cfg.metrics_port)
            except BaseException:
                await runner.cleanup()
                raise
        result["runner"] = runner

    def stop(self) -> None:
        """Leave the cluster, stop every endpoint and the background workers, and close the engine. Idempotent."""
        if self.rereplicator is not None:
            self.rereplicator.stop()
        if self.member is not None:
            self.member.stop()
            self.member = None
        if self.replicator is not None:
            self.replicator.close()  # a round in progress stops at its next chunk, left open
        if self._replication is not None:
            self._replication.stop()
            self._replication = None
        if self._lifecycle is not None:
            self._lifecycle.stop()
            self._lifecycle = None
        if self._snapshots is not None:
            self._snapshots.stop()
            self._snapshots = None
        if self._wire is not None:
            self._wire.stop()
            self._wire = None
        if self._loop is not None:
            loop = self._loop
            if self._monitor is not None:
                try:
                    asyncio.run_coroutine_threadsafe(self._monitor.cleanup(), loop).result(timeout=10)
                except Exception:  # pragma: no cover - best effort on shutdown
                    log.exception("metrics endpoint cleanup failed")
                self._monitor = None
            if self._runner is not None:
                fut = asyncio.run_coroutine_threadsafe(_stop_s3(self._runner), loop)
                try:
                    fut.result(timeout=10)
                except Exception:  # pragma: no cover - best effort on shutdown
                    log.exception("S3 endpoint cleanup failed")
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=10)
            loop.close()
            self._loop = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
