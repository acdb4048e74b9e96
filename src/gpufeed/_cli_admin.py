"""``gpufeed admin``: tenants, access keys, bucket stats and data services, and ``gpufeed
scrub``, on a running node (its admin API on the S3 port, signed with the admin key) or on a
stopped node's data folder."""

from __future__ import annotations

import datetime
import json
import math
import os
import time

import click

from ._cli_types import CATALOG_OPTION, SizeType
from .admin import Admin, LocalAdmin, RemoteAdmin

__all__ = ["admin", "scrub"]


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else "-"


@click.group()
@click.option("--url", default=None,
              help="S3 endpoint of a running node (env GPUFEED_S3_URL; default http://127.0.0.1:9000).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Work on a stopped node's data folder instead of a running node.")
@click.option("--access-key", default=None, help="The node's admin key id (env GPUFEED_ACCESS_KEY).")
@click.option("--secret-key", default=None, help="The node's admin secret (env GPUFEED_SECRET_KEY).")
@CATALOG_OPTION
@click.pass_context
def admin(ctx, url, data_dir, access_key, secret_key, catalog_url) -> None:
    """Manage tenants and their access keys; inspect buckets and their data services."""
    ctx.obj = _opener(url, data_dir, access_key, secret_key, catalog_url)
    ctx.meta["gpufeed.admin.catalog_only"] = catalog_url if data_dir is None and url is None else None


def _opener(url, data_dir, access_key, secret_key, catalog_url=None):
    """A function that opens the Admin the options name (local data folder, with its
    catalog where ``--catalog`` / ``GPUFEED_CATALOG`` says, or remote node)."""
    from .config import DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY, NodeConfig

    def open_admin() -> Admin:
        if data_dir is not None:
            from .engine import CatalogSettings

            cfg = NodeConfig.from_env(catalog=catalog_url)
            settings = CatalogSettings(url=cfg.catalog, pool_size=cfg.catalog_pool_size,
                                       pool_timeout_s=cfg.catalog_timeout_s, idle_tx_s=cfg.catalog_idle_tx_s,
                                       cluster=cfg.cluster)
            return LocalAdmin(data_dir, master_key=cfg.master_key, catalog=settings)
        return RemoteAdmin(url or os.environ.get("GPUFEED_S3_URL") or "http://127.0.0.1:9000",
                           access_key or os.environ.get("GPUFEED_ACCESS_KEY") or DEFAULT_ACCESS_KEY,
                           secret_key or os.environ.get("GPUFEED_SECRET_KEY") or DEFAULT_SECRET_KEY)

    return open_admin


def _run(ctx, call, as_json: bool, show) -> None:
    a = ctx.obj()
    try:
        result = call(a)
    finally:
        a.close()
    click.echo(json.dumps(result) if as_json else show(result))


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")


@admin.group()
def tenant() -> None:
    """Tenants: each owns its buckets and keys."""


@tenant.command("create")
@click.argument("name")
@JSON_OPTION
@click.pass_context
def tenant_create(ctx, name, as_json) -> None:
    """Make tenant NAME (1-63 of a-z, 0-9, '_' and '-')."""
    _run(ctx, lambda a: a.tenant_create(name), as_json, lambda r: f"tenant {r['name']} created")


@tenant.command("list")
@JSON_OPTION
@click.pass_context
def tenant_list(ctx, as_json) -> None:
    """List tenants."""
    _run(ctx, lambda a: a.tenant_list(), as_json,
         lambda r: "\n".join(f"{t['name']}\t{_when(t['created'])}" for t in r["tenants"]))


@tenant.command("delete")
@click.argument("name")
@JSON_OPTION
@click.pass_context
def tenant_delete(ctx, name, as_json) -> None:
    """Delete tenant NAME, which must own no bucket; its keys stop working."""
    _run(ctx, lambda a: a.tenant_delete(name), as_json, lambda r: f"tenant {name} deleted")


@tenant.command("stats")
@click.argument("name")
@JSON_OPTION
@click.pass_context
def tenant_stats(ctx, name, as_json) -> None:
    """Buckets, bytes and objects tenant NAME holds."""
    _run(ctx, lambda a: a.tenant_stats(name), as_json,
         lambda r: f"{r['name']}: {r['buckets']} buckets, {r['objects']} objects, {r['bytes']} bytes; "
                   f"{_quota_line(r)}")


def _quota_line(r: dict) -> str:
    def limit(n: int) -> str:
        return str(n) if n else "no limit"
    return (f"stored {r['stored_bytes']} bytes in {r['stored_versions']} versions; quota "
            f"{limit(r['quota_bytes'])} bytes, {limit(r['quota_objects'])} versions")


@admin.group()
def quota() -> None:
    """Quotas: the most bytes and object versions a tenant (all its buckets) or one bucket holds."""


SCOPE_ARGUMENT = click.argument("scope", type=click.Choice(["tenant", "bucket"]))


@quota.command("set")
@SCOPE_ARGUMENT
@click.argument("name")
@click.option("--bytes", "max_bytes", type=SizeType(), default=None,
              help="Most bytes (e.g. 10GiB); 0 = no limit; left out: unchanged.")
@click.option("--objects", "max_objects", type=int, default=None,
              help="Most object versions; 0 = no limit; left out: unchanged.")
@JSON_OPTION
@click.pass_context
def quota_set(ctx, scope, name, max_bytes, max_objects, as_json) -> None:
    """Set the quota of tenant or bucket NAME (a limit left out stays as it is; both 0 removes it)."""
    _run(ctx, lambda a: a.quota_set(scope, name, max_bytes, max_objects), as_json,
         lambda r: f"{r['scope']} {r['name']}: {_quota_line(r)}")


@quota.command("show")
@SCOPE_ARGUMENT
@click.argument("name")
@JSON_OPTION
@click.pass_context
def quota_show(ctx, scope, name, as_json) -> None:
    """The quota of tenant or bucket NAME and what it holds now."""
    _run(ctx, lambda a: a.quota_get(scope, name), as_json, lambda r: f"{r['scope']} {r['name']}: {_quota_line(r)}")


@admin.group()
def key() -> None:
    """Access keys: several per tenant; the secret is shown once, at creation."""


@key.command("create")
@click.argument("tenant_name", metavar="TENANT")
@JSON_OPTION
@click.pass_context
def key_create(ctx, tenant_name, as_json) -> None:
    """Make an access key for TENANT; prints its id and secret."""
    _run(ctx, lambda a: a.key_create(tenant_name), as_json,
         lambda r: f"access_key {r['access_key']}\nsecret_key {r['secret_key']}\ntenant {r['tenant']}")


@key.command("list")
@click.option("--tenant", "tenant_name", default=None, help="Only this tenant's keys.")
@JSON_OPTION
@click.pass_context
def key_list(ctx, tenant_name, as_json) -> None:
    """List access keys (never their secrets)."""
    _run(ctx, lambda a: a.key_list(tenant_name), as_json,
         lambda r: "\n".join(f"{k['access_key']}\t{k['tenant']}\t{_when(k['created'])}\t"
                             f"{'revoked ' + _when(k['revoked']) if k['revoked'] else 'valid'}" for k in r["keys"]))


@key.command("revoke")
@click.argument("access_key")
@JSON_OPTION
@click.pass_context
def key_revoke(ctx, access_key, as_json) -> None:
    """Revoke ACCESS_KEY: requests signed with it are refused from now on."""
    _run(ctx, lambda a: a.key_revoke(access_key), as_json, lambda r: f"access key {access_key} revoked")


@admin.group()
def bucket() -> None:
    """Buckets, as the node's operator sees them (any tenant's)."""


def _show_bucket(r: dict) -> str:
    lock = r["object_lock"]
    retention = (f", default {lock['mode']} {lock['days'] or lock['years']} "
                 f"{'days' if lock['days'] else 'years'}" if lock["mode"] else "")
    lines = [
        f"bucket      {r['name']}",
        f"owner       {r['owner']}",
        f"created     {_when(r['created'])}",
        f"kind        {r['kind']}" + (f" (capacity {r['capacity_bytes']} bytes, ttl {r['ttl_s']} s)"
                                      if r["kind"] == "kv" else ""),
        f"objects     {r['objects']}",
        f"bytes       {r['bytes']}",
        f"etag        {r.get('etag_policy', 'md5')}",
        f"versioning  {r['versioning'] or 'never enabled'}",
        f"object lock {'enabled' + retention if lock['enabled'] else 'off'}",
        f"quota       {r['quota']['bytes'] or 'no'} bytes, {r['quota']['objects'] or 'no'} objects limit",
    ]
    if r["kind"] == "kv":
        lines.append(f"evictions   {r['evictions']}, expirations {r['expirations']}")
    d = r.get("data")
    if d:
        lines.append(f"data        {d['stored_bytes']} bytes stored for {d['logical_bytes']} "
                     f"(ratio {d['ratio']}), {d['chunks']} chunks; compression {d['compression']}, "
                     f"dedup {'on' if d['dedup'] else 'off'}, {d['chunking']} chunks of {d['chunk_bytes']} bytes, "
                     f"reads {'checked' if d['verify'] else 'NOT checked'}")
    return "\n".join(lines)


@bucket.command("stats")
@click.argument("name")
@JSON_OPTION
@click.pass_context
def bucket_stats(ctx, name, as_json) -> None:
    """Objects, bytes, owner, versioning and object lock of bucket NAME."""
    _run(ctx, lambda a: a.bucket_stats(name), as_json, _show_bucket)


def _show_policy(r: dict) -> str:
    comp = r["compression"] + (f":{r['level']}" if r["compression"] == "zstd" else "")
    return (f"compression {comp}\ndedup       {'on' if r['dedup'] else 'off'} (digest {r['digest']})\n"
            f"chunks      {r['chunking']}, {r['chunk_bytes']} bytes\n"
            f"verify      {'every read' if r['verify'] else 'off (raw speed, reads not checked)'}")


@bucket.command("data")
@click.argument("name")
@click.option("--compression", default=None, help="off, lz4, zstd or zstd:LEVEL (1-19), per chunk.")
@click.option("--dedup/--no-dedup", default=None, help="Store identical chunks once (per tenant).")
@click.option("--chunking", type=click.Choice(["fixed", "cdc"]), default=None,
              help="Fixed-size or content-defined (FastCDC) chunks.")
@click.option("--chunk-size", type=SizeType(), default=None, help="Chunk size (cdc: average), e.g. 4MiB.")
@click.option("--digest", type=click.Choice(["blake3", "xxh3"]), default=None, help="Digest dedup finds chunks by.")
@click.option("--verify/--no-verify", default=None, help="Check every read against the stored sums.")
@JSON_OPTION
@click.pass_context
def bucket_data(ctx, name, compression, dedup, chunking, chunk_size, digest, verify, as_json) -> None:
    """Show or set how bucket NAME stores data written from now on."""
    changes: dict = {k: v for k, v in (("dedup", dedup), ("chunking", chunking), ("chunk_bytes", chunk_size),
                                       ("digest", digest), ("verify", verify)) if v is not None}
    if compression is not None:
        codec, _, level = compression.partition(":")
        changes["compression"] = codec
        if level:
            if not level.isdigit():
                raise click.BadParameter("zstd level must be a number", param_hint="--compression")
            changes["level"] = int(level)
    _run(ctx, lambda a: a.bucket_data(name, **changes), as_json, _show_policy)


@admin.command("data")
@JSON_OPTION
@click.pass_context
def node_data(ctx, as_json) -> None:
    """The node's stored data: chunks, bytes on disk, capacity, damaged chunks."""
    def show(r: dict) -> str:
        cap = f"{r['capacity_bytes']} bytes" if r["capacity_bytes"] else "no limit"
        return (f"chunks          {r['chunks']}\nstored bytes    {r['stored_bytes']} (data {r['data_bytes']})\n"
                f"capacity        {cap}\ndamaged chunks  {r['damaged_chunks']} "
                f"(failed reads since start: {r['damaged_reads']})")
    _run(ctx, lambda a: a.node_data(), as_json, show)


@admin.command("damaged")
@JSON_OPTION
@click.pass_context
def damaged(ctx, as_json) -> None:
    """Chunks marked damaged (by a read or a scrub) and the objects that use them."""
    def show(r: dict) -> str:
        if not r["chunks"]:
            return "no damaged chunks"
        return "\n".join(f"{c['chunk']}  {c['reason']}  ({_when(c['found'])}) used by "
                         + (", ".join("/".join(o[:2]) + (f"?versionId={o[2]}" if o[2] != "null" else "")
                                      for o in c["objects"]) or "nothing") for c in r["chunks"])
    _run(ctx, lambda a: a.damaged(), as_json, show)


@click.command()
@click.option("--endpoint", "url", default=None,
              help="S3 endpoint of a running node (env GPUFEED_S3_URL; default http://127.0.0.1:9000).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Scrub a stopped node's data folder instead of a running node.")
@click.option("--access-key", default=None, help="The node's admin key id (env GPUFEED_ACCESS_KEY).")
@click.option("--secret-key", default=None, help="The node's admin secret (env GPUFEED_SECRET_KEY).")
@click.option("--rate", type=SizeType(), default="0", help="Most bytes read per second (0: no limit).")
@click.option("--no-wait", is_flag=True, help="Start the scrub on the node and return at once.")
@click.option("--stop", "stop", is_flag=True, help="End the scrub running on the node.")
@CATALOG_OPTION
@JSON_OPTION
def scrub(url, data_dir, access_key, secret_key, rate, no_wait, stop, catalog_url, as_json) -> None:
    """Read and check every stored chunk; report damaged, missing and orphaned ones.

    Damaged chunks are marked (reads of them fail with DamagedObject) until a
    later scrub finds them good again; on a cluster node, a damaged data file
    is first rebuilt from another node's good copy (docs/cluster.md). A scrub
    already running on the node is waited for (with progress on stderr), not
    started twice; ``--stop`` ends it. Exits 1 when damage remains.
    """
    a = _opener(url, data_dir, access_key, secret_key, catalog_url)()
    shown = [0.0]

    def progress(st: dict) -> None:
        if not as_json and time.monotonic() - shown[0] >= 5.0:
            shown[0] = time.monotonic()
            who = "a scrub started earlier" if not st["started"] else "scrub"
            click.echo(f"{who}: {st['chunks']} chunks, {st['bytes']} bytes checked so far", err=True)
    try:
        if stop:
            status = a.scrub_stop()
        else:
            status = a.scrub(rate, wait=not no_wait, progress=progress)
    finally:
        a.close()
    _print_scrub(status, as_json, stop)
    if not status["running"] and not stop and (status["last"] or {}).get("damaged"):
        raise SystemExit(1)


#: Words for the counts of :attr:`gpufeed.engine.Engine.recovered`.
_RECOVERED = {"tmp": "temp files removed", "blobs": "orphaned data files removed",
              "uploads": "orphaned upload folders removed", "parts": "orphaned part files removed",
              "adopted": "versions given manifests", "missing": "versions without data",
              "orphan_manifests": "unused manifests released", "missing_files": "data files missing"}


def _print_scrub(status: dict, as_json: bool, stop: bool) -> None:
    if as_json:
        click.echo(json.dumps(status))
        return
    if stop:
        click.echo("scrub stopped" if status["stopped"] else "no scrub was running")
        return
    swept = {k: v for k, v in (status.get("recovered") or {}).items() if v}
    if swept:  # a stopped node's folder: opening it ran the start-up recovery first
        click.echo("start-up recovery first: " + ", ".join(f"{v} {_RECOVERED.get(k, k)}"
                                                           for k, v in sorted(swept.items())))
    if status["running"]:
        click.echo(f"scrub running: {status['chunks']} chunks, {status['bytes']} bytes checked so far")
        return
    rep = status["last"] or {}
    click.echo(f"scrub: {rep.get('chunks', 0)} chunks, {rep.get('bytes', 0)} bytes checked in "
               f"{rep.get('seconds', 0)} s; {len(rep.get('damaged', []))} damaged, "
               f"{len(rep.get('cleared', []))} cleared, {len(rep.get('repaired', []))} repaired from other nodes, "
               f"{len(rep.get('dropped_copies', []))} damaged copies dropped, "
               f"{len(rep.get('orphan_files', []))} orphaned files")
    for d in rep.get("repaired", []):
        what = "copy of data file" if d["copy"] else "data file"
        click.echo(f"  repaired {d['chunk']} ({what} {d['file']}: {d['reason']}) from node {d['from']}")
    for d in rep.get("dropped_copies", []):
        click.echo(f"  dropped the copy of data file {d['file']}: chunk {d['chunk']} {d['reason']}; "
                   f"not repaired: {d['repair']}")
    for d in rep.get("damaged", []):
        users = ", ".join("/".join(o[:2]) for o in d["objects"]) or "no object"
        why = f"; not repaired: {d['repair']}" if d.get("repair") else ""
        click.echo(f"  damaged {d['chunk']}: {d['reason']} (used by {users}){why}")


@admin.group()
def cluster() -> None:
    """The cluster of nodes this node belongs to (docs/cluster.md)."""


@cluster.command("status")
@click.option("--cluster", "cluster_name", default=None, metavar="NAME",
              help="With --catalog: the cluster to show (default: the one that owns the catalog; "
                   "env GPUFEED_CLUSTER).")
@click.option("--expiry", "expiry_s", type=click.FloatRange(min=0, min_open=True), default=None,
              callback=lambda _ctx, _param, v: _finite(v, "--expiry"),
              help="With --catalog or --data-dir: seconds without a heartbeat after which a node counts as "
                   "expired (default 10; env GPUFEED_CLUSTER_EXPIRY_S). A running node uses its own setting.")
@JSON_OPTION
@click.pass_context
def cluster_status(ctx, cluster_name, expiry_s, as_json) -> None:
    """Nodes, their health (live or expired, seconds since the last heartbeat) and bytes.

    Asks a running node (--url), a stopped node's folder (--data-dir), or,
    with only --catalog postgresql://..., the cluster's database itself.
    """
    from .config import NodeConfig

    cfg = NodeConfig.from_env()
    expiry = expiry_s if expiry_s is not None else cfg.cluster_expiry_s
    catalog_url = ctx.meta.get("gpufeed.admin.catalog_only")
    if catalog_url:
        from .admin import catalog_cluster_status

        result = catalog_cluster_status(catalog_url, cluster_name or cfg.cluster, expiry_s=expiry,
                                        timeout_s=cfg.catalog_timeout_s, replicas=cfg.cluster_replicas)
        click.echo(json.dumps(result) if as_json else _cluster_table(result))
        return
    _run(ctx, lambda a: a.cluster_status(expiry, cfg.cluster_replicas), as_json, _cluster_table)


def _finite(value: float | None, name: str) -> float | None:
    """``value`` unless it is not a finite number (``nan``, ``inf``).

    Raises:
        click.BadParameter: it is not finite.
    """
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds", param_hint=name)
    return value


def _cluster_table(r: dict) -> str:
    """The report as a rich table, rendered to text."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cluster {r['cluster']}: {r['live']} of {len(r['nodes'])} nodes live "
                        f"(expiry {r['expiry_s']:g} s)")
    figures = ("used", "capacity", "free", "to move")
    for column in ("node", "address", "health", "since heartbeat", *figures, "started"):
        table.add_column(column, justify="right" if column in ("since heartbeat", *figures) else "left")
    style = {"live": "green", "expired": "red", "left": "dim"}
    for n in r["nodes"]:
        free = "n/a" if n.get("free_bytes") is None else f"{n['free_bytes']:,}" + (" [red]full[/]" if n["full"] else "")
        table.add_row(n["node_id"], f"{n['host']}:{n['s3_port']}", f"[{style[n['health']]}]{n['health']}[/]",
                      f"{n['since_heartbeat_s']:.1f} s", f"{n['bytes_stored']:,}",
                      f"{n['capacity_bytes']:,}" if n.get("capacity_bytes") else "n/a", free,
                      f"{n['moving_bytes']:,} [yellow]draining[/]" if n.get("draining") else "-",
                      _when(n["started_at"]))
    under = r["under_replicated_chunks"]
    out = io.StringIO()
    console = Console(file=out, width=170, force_terminal=False)
    console.print(table)
    if not r["nodes"]:
        console.print(f"no node of cluster {r['cluster']!r} has registered in this catalog (check --cluster)")
    console.print(f"bytes stored on live nodes: {r['bytes_stored']:,}")
    console.print(f"under-replicated chunks: {'n/a' if under is None else under} (replication factor "
                  f"{r.get('replicas', 'n/a')}: {r['under_replicated_note']})")
    parts = r.get("under_replicated_parts")
    console.print(f"under-replicated parts: {'n/a' if parts is None else parts} "
                  f"({r.get('under_replicated_parts_note', 'not counted')})")
    return out.getvalue().rstrip("\n")
