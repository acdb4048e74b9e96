"""``gpufeed admin``: tenants, access keys and bucket stats, on a running node (its admin API
on the S3 port, signed with the admin key) or on a stopped node's data folder."""

from __future__ import annotations

import datetime
import json
import os

import click

from ._cli_types import SizeType
from .admin import Admin, LocalAdmin, RemoteAdmin

__all__ = ["admin"]


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else "-"


@click.group()
@click.option("--url", default=None,
              help="S3 endpoint of a running node (env GPUFEED_S3_URL; default http://127.0.0.1:9000).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Work on a stopped node's data folder instead of a running node.")
@click.option("--access-key", default=None, help="The node's admin key id (env GPUFEED_ACCESS_KEY).")
@click.option("--secret-key", default=None, help="The node's admin secret (env GPUFEED_SECRET_KEY).")
@click.pass_context
def admin(ctx, url, data_dir, access_key, secret_key) -> None:
    """Manage tenants and their access keys; inspect buckets."""
    from .config import DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY, NodeConfig

    def open_admin() -> Admin:
        if data_dir is not None:
            return LocalAdmin(data_dir, master_key=NodeConfig.from_env().master_key)
        return RemoteAdmin(url or os.environ.get("GPUFEED_S3_URL") or "http://127.0.0.1:9000",
                           access_key or os.environ.get("GPUFEED_ACCESS_KEY") or DEFAULT_ACCESS_KEY,
                           secret_key or os.environ.get("GPUFEED_SECRET_KEY") or DEFAULT_SECRET_KEY)

    ctx.obj = open_admin


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
    return "\n".join(lines)


@bucket.command("stats")
@click.argument("name")
@JSON_OPTION
@click.pass_context
def bucket_stats(ctx, name, as_json) -> None:
    """Objects, bytes, owner, versioning and object lock of bucket NAME."""
    _run(ctx, lambda a: a.bucket_stats(name), as_json, _show_bucket)
