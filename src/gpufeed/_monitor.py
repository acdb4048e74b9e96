"""The node's metrics port: ``GET /metrics`` (Prometheus text format) and
``GET /health`` (JSON), and the scrape-time metric families.

A listener of its own (``NodeConfig.metrics_port``, bound to ``NodeConfig.host``)
served on the S3 front's event loop. Unauthenticated, because Prometheus and
health probes do not sign requests; it serves no object data. What it does
reveal: request counts, latencies and error codes, and, unless
``NodeConfig.metrics_tenant_labels`` is off, tenant names with their bucket and
object counts and bytes stored. Keep it on a loopback or management address
(``--host``) where that matters.

Scrape-time families (read when scraped, never updated on the hot path):

=============================================== ======== =============================================
name                                             labels   meaning
=============================================== ======== =============================================
``gpufeed_connections_open``                     front    open connections (``s3``, ``tcp``, ``shm``)
``gpufeed_wire_refused_connections``             -        fast-path connections refused at a cap
``gpufeed_shm_clients``                          -        fast-path connections attached to lending
``gpufeed_shm_regions_lent``                     -        server regions lent and not back in the pool
``gpufeed_shm_lent_bytes``                       -        their bytes
``gpufeed_shm_mapped_bytes``                     -        all client shared memory the node maps
``gpufeed_shm_pool_bytes`` / ``_pool_regions``   -        zeroed regions kept for reuse
``gpufeed_shm_pool_hits`` / ``_pool_misses``     -        lends served from the pool / fresh
``gpufeed_tenants``                              -        tenants
``gpufeed_buckets`` / ``_objects`` / ``_stored_bytes``  -  totals over every tenant
``gpufeed_tenant_buckets`` / ``_objects`` / ``_bytes``  tenant  per tenant (unless tenant labels are off)
``gpufeed_data_chunks`` / ``_stored_bytes`` / ``_logical_bytes`` / ``_capacity_bytes``  -  the data folder
``gpufeed_node_used_bytes`` / ``_capacity_bytes`` / ``_free_bytes`` / ``_full``  -  a cluster node's own figures
``gpufeed_node_draining`` / ``_moving_bytes``    -        whether it drains, the bytes it still moves off
``gpufeed_node_moved_files`` / ``_moved_bytes``  -        data files it moved off while draining, since start
``gpufeed_damaged_chunks``                       -        chunks marked damaged (by a read or a scrub)
``gpufeed_damaged_reads``                        -        reads refused since start: data failed its check
``gpufeed_scrub_last_finished_seconds``          -        when the last complete scrub ended (0: never)
``gpufeed_scrub_last_damaged_chunks``            -        damaged chunks it found (and did not repair)
``gpufeed_scrub_last_repaired_chunks``           -        damaged chunks it repaired from other nodes
``gpufeed_fetch_cache_bytes``                    -        chunks fetched from other cluster nodes kept
``gpufeed_fetch_cache_hits`` / ``_misses``        -        reads of such chunks served kept / fetched
``gpufeed_fetched_bytes``                        -        stored bytes fetched from other nodes since start
``gpufeed_fetch_shared``                         -        reads that waited for another read's fetch, since start
``gpufeed_cluster_under_replicated_parts``       -        a cluster's open uploads' parts with too few live copies
``gpufeed_start_time_seconds``                   -        Unix time the node started
``gpufeed_build_info``                           version  always 1
=============================================== ======== =============================================

Usage figures come from ``Engine.tenant_stats`` for each of
``Engine.list_tenants()``, computed at most once per :data:`USAGE_CACHE_S`;
so is the cluster's count of under-replicated parts (a node of a cluster on a
shared catalog, :func:`add_cluster_source`: the count of ``gpufeed admin
cluster status``; absent while no member is live).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.core import Metric

from ._metrics import CONTENT_TYPE, CachedSource, NodeMetrics, gauge
from ._version import __version__
from .s3._health import health_report, health_response

if TYPE_CHECKING:
    from .engine import Engine
    from .wire.server import WireServer

__all__ = ["start_monitor", "add_node_sources", "add_cluster_source", "USAGE_CACHE_S"]

#: Seconds a pass over the tenants' usage is reused by later scrapes.
USAGE_CACHE_S = 5.0


def _usage_families(engine: Engine, tenant_labels: bool) -> list[Metric]:
    """One pass over every tenant's usage."""
    stats = [engine.tenant_stats(t.name) for t in engine.list_tenants()]
    out: list[Metric] = [gauge("gpufeed_tenants", "Tenants.", len(stats))]
    for field, name in (("buckets", "buckets"), ("objects", "objects"), ("bytes", "stored_bytes")):
        out.append(gauge(f"gpufeed_{name}", f"Current {field} over every tenant.",
                         sum(s[field] for s in stats)))
        if tenant_labels:
            out.append(gauge(f"gpufeed_tenant_{field}", f"Current {field} of each tenant.", labels=("tenant",),
                             samples=[((s["name"],), s[field]) for s in stats]))
    return out


def _data_families(engine: Engine) -> list[Metric]:
    """The data folder: chunks, bytes on disk and capacity, damage found, the last scrub."""
    d = engine.node_data_stats()
    last = engine.scrubber.status()["last"] or {}
    room = engine.room_usage()
    node: list[Metric] = [] if room is None else [
        gauge("gpufeed_node_used_bytes", "Bytes of the files in this cluster node's data folder.", room.used_bytes),
        gauge("gpufeed_node_capacity_bytes", "This cluster node's capacity (--capacity, else its file system's "
              "size).", room.capacity_bytes),
        gauge("gpufeed_node_free_bytes", "Bytes this cluster node can still take (capacity and disk reserve).",
              room.free_bytes),
        gauge("gpufeed_node_full", "1 when less than 1 % of this cluster node's capacity, or 1 MiB, is free.",
              int(room.full)),
        gauge("gpufeed_node_draining", "1 while this cluster node's used bytes are past its high-water mark and "
              "not yet back under its low-water mark (it moves data files to other members).", int(room.draining)),
        gauge("gpufeed_node_moving_bytes", "Bytes this cluster node still moves off while it drains (its used "
              "bytes less its low-water mark).", room.moving_bytes),
        gauge("gpufeed_node_moved_files", "Data files this cluster node moved to other members while draining, "
              "since start.", engine.room_moved()[0]),
        gauge("gpufeed_node_moved_bytes", "Bytes of the data files this cluster node moved to other members while "
              "draining, since start.", engine.room_moved()[1]),
    ]
    return node + [
        gauge("gpufeed_data_chunks", "Chunks stored.", d["chunks"]),
        gauge("gpufeed_data_stored_bytes", "Bytes of data files on disk (after compression and dedup).",
              d["stored_bytes"]),
        gauge("gpufeed_data_logical_bytes", "Bytes the stored chunks hold before compression.", d["data_bytes"]),
        gauge("gpufeed_data_capacity_bytes", "Configured capacity of the data folder (0: no limit).",
              d["capacity_bytes"]),
        gauge("gpufeed_damaged_chunks", "Chunks marked damaged (by a read or a scrub).", d["damaged_chunks"]),
        gauge("gpufeed_damaged_reads", "Reads refused since start because stored data failed its check.",
              d["damaged_reads"]),
        gauge("gpufeed_scrub_last_finished_seconds", "Unix time the last complete scrub ended (0: never).",
              last.get("finished", 0.0)),
        gauge("gpufeed_scrub_last_damaged_chunks", "Damaged chunks the last complete scrub found.",
              len(last.get("damaged", []))),
        gauge("gpufeed_scrub_last_repaired_chunks", "Damaged chunks the last complete scrub repaired from "
              "other nodes' copies.", len(last.get("repaired", []))),
    ]


def _fetch_cache_families(engine: Engine) -> list[Metric]:
    s = engine.fetch_cache_stats()
    return [
        gauge("gpufeed_fetch_cache_bytes", "Stored bytes of chunks fetched from other cluster nodes, kept for "
              "later reads.", s["kept_bytes"]),
        gauge("gpufeed_fetch_cache_hits", "Reads of other nodes' chunks served from kept ones since start.",
              s["hits"]),
        gauge("gpufeed_fetch_cache_misses", "Reads of other nodes' chunks that fetched them since start.",
              s["misses"]),
        gauge("gpufeed_fetched_bytes", "Stored bytes fetched from other cluster nodes since start (whole "
              "chunks and windows of large ones).", s["fetched_bytes"]),
        gauge("gpufeed_fetch_shared", "Reads that needed a chunk or window another read was fetching, and "
              "waited for that fetch instead of their own, since start.", s["shared"]),
    ]


def _wire_families(wire: WireServer) -> list[Metric]:
    s = wire.stats()
    return [
        gauge("gpufeed_wire_refused_connections", "Fast-path connections refused at a cap since start.",
              s["refused"]),
        gauge("gpufeed_shm_clients", "Fast-path connections attached to memory lending.", s["clients"]),
        gauge("gpufeed_shm_regions_lent", "Server shared-memory regions lent, not back in the pool.",
              s["regions_lent"]),
        gauge("gpufeed_shm_lent_bytes", "Bytes of those regions.", s["lent_bytes"]),
        gauge("gpufeed_shm_mapped_bytes", "Client shared memory the node maps, bytes.", s["mapped_bytes"]),
        gauge("gpufeed_shm_pool_bytes", "Zeroed regions kept for reuse, bytes.", s["pool_bytes"]),
        gauge("gpufeed_shm_pool_regions", "Zeroed regions kept for reuse.", s["pool_regions"]),
        gauge("gpufeed_shm_pool_hits", "Region lends served from the pool since start.", s["pool_hits"]),
        gauge("gpufeed_shm_pool_misses", "Region lends that needed a fresh region since start.",
              s["pool_misses"]),
    ]


def add_node_sources(metrics: NodeMetrics, engine: Engine, wire: WireServer | None) -> CachedSource:
    """Register the scrape-time families of a node (see the module docstring).

    Returns:
        The cached usage source (its ``passes`` counts passes over the tenants).
    """
    usage = CachedSource(lambda: _usage_families(engine, metrics.tenant_labels), USAGE_CACHE_S)
    metrics.add_source(usage)
    metrics.add_source(lambda: [
        gauge("gpufeed_start_time_seconds", "Unix time the node started.", metrics.started_s),
        gauge("gpufeed_build_info", "The node's version.", labels=("version",), samples=[((__version__,), 1)]),
    ])
    data = CachedSource(lambda: _data_families(engine), USAGE_CACHE_S)
    metrics.add_source(data)
    metrics.add_source(lambda: _fetch_cache_families(engine))
    if wire is not None:
        metrics.count_connections("tcp", lambda: wire.stats()["tcp"])
        metrics.count_connections("shm", lambda: wire.stats()["shm"])
        metrics.add_source(lambda: _wire_families(wire))
    return usage


def add_cluster_source(metrics: NodeMetrics, engine: Engine, cluster: str, expiry_s: float, replicas: int) -> None:
    """Register the under-replicated parts of cluster ``cluster`` (members live by
    ``expiry_s``, replication factor ``replicas`` capped to them) as a scrape-time
    family: the count ``gpufeed admin cluster status`` shows (one query over the
    open uploads' parts; the chunks' count, a scan of every chunk, is left to the
    status)."""

    def families() -> list[Metric]:
        live = [n.node_id for n in engine.membership.nodes(cluster) if n.live(expiry_s)]
        if not live:
            return []
        return [gauge("gpufeed_cluster_under_replicated_parts", "Parts of open multipart uploads with fewer copies "
                      "on live cluster nodes than the replication factor.",
                      engine.under_replicated_parts(live, min(replicas, len(live))))]

    metrics.add_source(CachedSource(families, USAGE_CACHE_S))


def _monitor_app(metrics: NodeMetrics, engine: Engine) -> web.Application:
    loop_pool = None  # the loop's default executor: scrapes are rare and short

    async def get_metrics(request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(loop_pool, metrics.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def get_health(request: web.Request) -> web.Response:
        status, body = await asyncio.get_running_loop().run_in_executor(
            loop_pool, health_report, engine, metrics.started_s)
        return health_response(request.method, status, body)

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/health", get_health)
    return app


async def start_monitor(metrics: NodeMetrics, engine: Engine, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``/metrics`` and ``/health`` on ``host:port`` (0 picks a free port).

    Returns:
        ``(runner, port)``: ``await runner.cleanup()`` stops it.

    Raises:
        OSError: the port is taken.
    """
    runner = web.AppRunner(_monitor_app(metrics, engine), access_log=None, handle_signals=False,
                           shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]
