"""``gpufeed replicate``: replication of a bucket to another gpufeed node, through
the admin API of a running node (``--endpoint``): the source node for
``add|status|pause|resume|sync|remove``, the target node for ``replica-status``
and ``failover``."""

from __future__ import annotations

import io
import json
import os

import click

from ._cli_admin import JSON_OPTION, _opener, _when

__all__ = ["replicate"]


@click.group()
@click.option("--endpoint", "--url", "url", default=None,
              help="S3 endpoint of the running node (env GPUFEED_S3_URL; default http://127.0.0.1:9000): "
                   "the source node, or the target for failover.")
@click.option("--access-key", default=None, help="The node's admin key id (env GPUFEED_ACCESS_KEY).")
@click.option("--secret-key", default=None, help="Its secret (env GPUFEED_SECRET_KEY).")
@click.pass_context
def replicate(ctx, url, access_key, secret_key) -> None:
    """Replicate buckets to a second site: asynchronous, snapshot-based rounds
    that send only the chunks the target lacks; the target bucket is read-only
    until failover."""
    ctx.obj = _opener(url, None, access_key, secret_key)


def _call(ctx, call):
    a = ctx.obj()
    try:
        return call(a)
    finally:
        a.close()


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _table(rules: list[dict]) -> str:
    from rich.console import Console
    from rich.table import Table

    t = Table("bucket", "target", "state", "last snapshot", "lag", "behind", "sent", "rounds", "errors",
              title="replication rules")
    for r in rules:
        behind = f"{r['behind_objects']} obj / {_size(r['behind_bytes'])}"
        sent = f"{_size(r['bytes_sent'])} ({r['chunks_sent']} chunks)"
        err = f"{r['errors']}" + (f": {r['last_error']}" if r["state"] == "error" else "")
        t.add_row(r["bucket"], f"{r['target']}/{r['target_bucket']}", r["state"],
                  f"{r['last_snapshot'] or '-'} {_when(r['last_snapshot_created'])}", f"{r['lag_s']:.0f} s",
                  behind, sent, str(r["rounds"]), err)
    out = io.StringIO()
    Console(file=out, width=160).print(t)
    return out.getvalue().rstrip()


@replicate.command("add")
@click.argument("bucket")
@click.option("--target", required=True, help="The target node's S3 endpoint, http://HOST:PORT.")
@click.option("--target-bucket", default=None, help="The bucket there (default: BUCKET); made when missing, "
                                                    "refused when it holds objects.")
@click.option("--target-access-key", default=None,
              help="A key of the target: its admin key, or a key of the tenant to own the target bucket "
                   "(env GPUFEED_TARGET_ACCESS_KEY).")
@click.option("--target-secret-key", default=None, help="Its secret (env GPUFEED_TARGET_SECRET_KEY); kept "
                                                        "in the source's data folder, mode 0600.")
@JSON_OPTION
@click.pass_context
def replicate_add(ctx, bucket, target, target_bucket, target_access_key, target_secret_key, as_json) -> None:
    """Replicate BUCKET to the node at --target (the first round runs with the node's next pass)."""
    ak = target_access_key or os.environ.get("GPUFEED_TARGET_ACCESS_KEY")
    sk = target_secret_key or os.environ.get("GPUFEED_TARGET_SECRET_KEY")
    if not ak or not sk:
        raise click.UsageError("give --target-access-key and --target-secret-key (or their env variables)")
    r = _call(ctx, lambda a: a.replication_add(bucket, target, target_bucket or bucket, ak, sk))
    click.echo(json.dumps(r) if as_json else f"replicating {bucket} to {r['target']}/{r['target_bucket']} "
                                             f"({r['behind_objects']} objects to send)")


@replicate.command("status")
@click.argument("bucket", required=False)
@JSON_OPTION
@click.pass_context
def replicate_status(ctx, bucket, as_json) -> None:
    """Every rule (or BUCKET's): state, last replicated snapshot, lag, what is behind, bytes sent, errors."""
    r = _call(ctx, lambda a: a.replication_status(bucket))
    rules = [r] if bucket else r["rules"]
    if as_json:
        click.echo(json.dumps(r))
    else:
        click.echo(_table(rules) if rules else "(no replication rules)")


@replicate.command("pause")
@click.argument("bucket")
@JSON_OPTION
@click.pass_context
def replicate_pause(ctx, bucket, as_json) -> None:
    """Stop BUCKET's rounds until resume (an open round resumes where it stopped)."""
    r = _call(ctx, lambda a: a.replication_pause(bucket, True))
    click.echo(json.dumps(r) if as_json else f"replication of {bucket} paused")


@replicate.command("resume")
@click.argument("bucket")
@JSON_OPTION
@click.pass_context
def replicate_resume(ctx, bucket, as_json) -> None:
    """Let BUCKET's rounds run again."""
    r = _call(ctx, lambda a: a.replication_pause(bucket, False))
    click.echo(json.dumps(r) if as_json else f"replication of {bucket} resumed")


@replicate.command("sync")
@click.argument("bucket")
@JSON_OPTION
@click.pass_context
def replicate_sync(ctx, bucket, as_json) -> None:
    """Run (or resume) one round of BUCKET now and wait for it."""
    r = _call(ctx, lambda a: a.replication_sync(bucket))
    click.echo(json.dumps(r) if as_json else
               f"{r['snapshot']}: {r['objects_sent']} objects, {r['chunks_sent']} chunks "
               f"({_size(r['bytes_sent'])}) sent, {r['chunks_skipped']} chunks the target had, "
               f"{r['deleted']} deleted, {r.get('retagged', 0)} retagged" + (" (resumed)" if r["resumed"] else ""))


@replicate.command("remove")
@click.argument("bucket")
@JSON_OPTION
@click.pass_context
def replicate_remove(ctx, bucket, as_json) -> None:
    """Remove BUCKET's rule and its snapshots (the target stays a read-only replica until failover)."""
    r = _call(ctx, lambda a: a.replication_remove(bucket))
    click.echo(json.dumps(r) if as_json else f"replication of {bucket} removed")


@replicate.command("replica-status")
@click.argument("bucket")
@JSON_OPTION
@click.pass_context
def replicate_replica_status(ctx, bucket, as_json) -> None:
    """On the TARGET node (--endpoint): what replica BUCKET holds: its source,
    the last source snapshot applied whole, rounds, chunks received and
    received twice, and the chunks staged for the open round; for a replica
    that failover promoted, when, and what it held then."""
    r = _call(ctx, lambda a: a.replica_status(bucket))
    if as_json:
        click.echo(json.dumps(r))
        return
    if r.get("promoted"):
        click.echo(f"{bucket}: promoted to a writable bucket {_when(r['promoted_at'])} (failover); it was the "
                   f"replica of {r['source']}, last snapshot {r['snapshot'] or '(none complete)'}")
        return
    click.echo(f"{bucket}: replica of {r['source']}, last snapshot {r['snapshot'] or '(none complete)'} "
               f"{_when(r['snapshot_created']) if r['snapshot'] else ''}".rstrip())
    click.echo(f"  {r['rounds']} rounds, {r['chunks_received']} chunks received "
               f"({r['duplicate_chunks']} received twice); open round: {r['staged_chunks']} chunks staged, "
               f"{r['round_chunks_received']} received")


@replicate.command("failover")
@click.argument("bucket")
@JSON_OPTION
@click.pass_context
def replicate_failover(ctx, bucket, as_json) -> None:
    """On the TARGET node (--endpoint): promote replica BUCKET to an ordinary,
    writable bucket. Pause or remove the source's rule first; its next round
    is refused."""
    r = _call(ctx, lambda a: a.replica_failover(bucket))
    click.echo(json.dumps(r) if as_json else
               f"{bucket} is writable; it held source snapshot {r['snapshot'] or '(none complete)'}")
