"""``gpufeed snapshot``: bucket snapshots on a running node (its admin API on the
S3 port, ``--endpoint``) or on a stopped node's data folder (``--data-dir``)."""

from __future__ import annotations

import click

from ._cli_admin import JSON_OPTION, _opener, _run, _when
from ._cli_types import CATALOG_OPTION

__all__ = ["snapshot"]


@click.group()
@click.option("--endpoint", "--url", "url", default=None,
              help="S3 endpoint of a running node (env GPUFEED_S3_URL; default http://127.0.0.1:9000).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Work on a stopped node's data folder instead of a running node.")
@click.option("--access-key", default=None,
              help="The admin key id, or a key of the bucket's tenant (env GPUFEED_ACCESS_KEY).")
@click.option("--secret-key", default=None, help="Its secret (env GPUFEED_SECRET_KEY).")
@CATALOG_OPTION
@click.pass_context
def snapshot(ctx, url, data_dir, access_key, secret_key, catalog_url) -> None:
    """Bucket snapshots: instant, read-only, pinning their data (no copy).

    Read one with S3 '?snapshot=NAME' or the SDK's snapshot= argument.
    """
    ctx.obj = _opener(url, data_dir, access_key, secret_key, catalog_url)




def _line(s: dict) -> str:
    return f"{s['name']}\t{_when(s['created'])}\t{s['kind']}\t{s['objects']} objects\t{s['bytes']} bytes"


@snapshot.command("create")
@click.argument("bucket")
@click.argument("name")
@JSON_OPTION
@click.pass_context
def snapshot_create(ctx, bucket, name, as_json) -> None:
    """Snapshot BUCKET as NAME (letters, digits, '.', '_', '-'; at most 128)."""
    _run(ctx, lambda a: a.snapshot_create(bucket, name), as_json,
         lambda r: f"snapshot {r['name']} of {r['bucket']}: {r['objects']} objects, {r['bytes']} bytes")


@snapshot.command("list")
@click.argument("bucket")
@JSON_OPTION
@click.pass_context
def snapshot_list(ctx, bucket, as_json) -> None:
    """List BUCKET's snapshots, oldest first: name, created (UTC), kind, objects, logical bytes."""
    _run(ctx, lambda a: a.snapshot_list(bucket), as_json,
         lambda r: "\n".join(_line(s) for s in r["snapshots"]) or "(no snapshots)")


@snapshot.command("delete")
@click.argument("bucket")
@click.argument("name")
@click.option("--bypass-governance", is_flag=True,
              help="Delete even if it holds versions under GOVERNANCE retention.")
@JSON_OPTION
@click.pass_context
def snapshot_delete(ctx, bucket, name, bypass_governance, as_json) -> None:
    """Delete snapshot NAME of BUCKET (the data only it held is freed)."""
    _run(ctx, lambda a: a.snapshot_delete(bucket, name, bypass_governance=bypass_governance), as_json,
         lambda r: f"snapshot {name} of {bucket} deleted")


@snapshot.command("restore")
@click.argument("bucket")
@click.argument("name")
@click.option("--prefix", default="", help="Restore only the keys under this prefix.")
@JSON_OPTION
@click.pass_context
def snapshot_restore(ctx, bucket, name, prefix, as_json) -> None:
    """Roll BUCKET (or --prefix) back to snapshot NAME: its keys become current
    again (same data, no copy); keys it lacks are deleted (delete markers when
    versioned). Refused whole when a version to replace is locked."""
    _run(ctx, lambda a: a.snapshot_restore(bucket, name, prefix=prefix), as_json,
         lambda r: f"restored {r['restored']}, deleted {r['deleted']}, unchanged {r['unchanged']}")


@snapshot.command("diff")
@click.argument("bucket")
@click.argument("name")
@click.argument("target", required=False)
@click.option("--prefix", default="", help="Compare only the keys under this prefix.")
@JSON_OPTION
@click.pass_context
def snapshot_diff(ctx, bucket, name, target, prefix, as_json) -> None:
    """Keys added (+), changed (~), removed (-) and retagged (t: same data,
    another tag set) from snapshot NAME to snapshot TARGET (default: the live
    bucket)."""
    def show(r: dict) -> str:
        lines = ([f"+ {_shown(k)}" for k in r["added"]] + [f"~ {_shown(k)}" for k in r["changed"]]
                 + [f"- {_shown(k)}" for k in r["removed"]] + [f"t {_shown(k)}" for k in r.get("retagged", [])])
        return "\n".join(lines) or "(no differences)"

    _run(ctx, lambda a: a.snapshot_diff(bucket, name, target, prefix=prefix), as_json, show)


@snapshot.command("schedule")
@click.argument("bucket")
@click.option("--hourly", type=click.IntRange(0), default=None, help="Keep this many hourly snapshots (0: none).")
@click.option("--daily", type=click.IntRange(0), default=None, help="Keep this many daily snapshots (0: none).")
@JSON_OPTION
@click.pass_context
def snapshot_schedule(ctx, bucket, hourly, daily, as_json) -> None:
    """Show, or set with --hourly/--daily, BUCKET's schedule; the node makes
    auto-hourly-YYYY-MM-DDTHH / auto-daily-YYYY-MM-DD snapshots and prunes the oldest."""
    _run(ctx, lambda a: a.snapshot_schedule(bucket, hourly=hourly, daily=daily), as_json,
         lambda r: f"hourly: keep {r['hourly']}, daily: keep {r['daily']}")


def _shown(key: str) -> str:
    """A key on one line: one with control characters (a newline, a tab) is
    printed as a quoted Python string literal."""
    return repr(key) if any(c < " " or c == "\x7f" for c in key) else key
