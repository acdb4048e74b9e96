"""The ``gpufeed`` command line: parse, call the library, print.

Commands: ``serve``, ``put``, ``get``, ``ls``, ``rm``, ``mb``, ``checkpoint ls|scrub``,
``catalog check|recover``, ``admin ...``, ``scrub``, ``snapshot create|list|delete|restore|diff|schedule``,
``replicate add|status|pause|resume|sync|remove|failover``,
``bench io``, ``bench kv``, ``bench list``, ``bench codecs``, ``bench data``, ``bench integrity``,
``bench crash``, ``bench checkpoint``, ``bench model``, ``bench gpu``, ``bench report``, ``bench train``, ``demo``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import click

from ._cli_admin import admin, scrub
from ._cli_catalog import catalog
from ._cli_replicate import replicate
from ._cli_snapshot import snapshot
from ._cli_types import CATALOG_OPTION, CLUSTER_OPTION, SizeType
from ._version import __version__

__all__ = ["main", "SizeType"]


class _Group(click.Group):
    """Turns gpufeed's typed errors into one clear line and exit status 1."""

    def invoke(self, ctx):
        from .errors import GpufeedError

        try:
            return super().invoke(ctx)
        except GpufeedError as exc:
            click.echo(f"error: {exc.code}: {exc.message}", err=True)
            ctx.exit(1)
        except (OSError, ValueError, OverflowError) as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(1)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="gpufeed")
def main() -> None:
    """gpufeed: storage that keeps GPUs fed."""


main.add_command(admin)
main.add_command(scrub)
main.add_command(catalog)
main.add_command(snapshot)
main.add_command(replicate)


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Data folder (default $GPUFEED_DATA_DIR or ~/.local/share/gpufeed).")
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1).")
@click.option("--s3-port", type=int, default=None, help="S3 HTTP port (default 9000; 0 = free port).")
@click.option("--port", type=int, default=None, help="Fast-path TCP port (default 9400; 0 = free port).")
@click.option("--socket", "socket_path", default=None,
              help="Shared-memory Unix socket path (default <data-dir>/gpufeed.sock; '' disables).")
@click.option("--access-key", default=None, help="S3 access key id (env GPUFEED_ACCESS_KEY).")
@click.option("--secret-key", default=None, help="S3 secret key (env GPUFEED_SECRET_KEY).")
@click.option("--no-fsync", is_flag=True, help="Acknowledge writes before they are durable (faster, unsafe).")
@click.option("--region-pool", "region_pool", type=SizeType(), default=None,
              help="Shared memory kept for reuse by the next shm client (default 4GiB; 0 disables; "
                   "env GPUFEED_REGION_POOL_BYTES).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              default="WARNING", envvar="GPUFEED_LOG_LEVEL", show_default=True,
              help="Level of the node's log on stderr (env GPUFEED_LOG_LEVEL).")
@click.option("--access-log", default=None,
              help="S3 access log, one JSON line per request: a file path or '-' for stdout "
                   "(env GPUFEED_ACCESS_LOG; default none).")
@click.option("--metrics-port", type=int, default=None,
              help="Serve GET /metrics (Prometheus) and GET /health on this port of --host, "
                   "unauthenticated (0 = free port; default off; env GPUFEED_METRICS_PORT).")
@click.option("--capacity", type=SizeType(), default=None,
              help="Most bytes of data the folder may hold on disk; writes past it get 507 StorageFull "
                   "(default and 0: no limit; env GPUFEED_CAPACITY).")
@click.option("--scrub-interval", type=float, default=None,
              help="Seconds between background scrubs (default 7 days; 0 = off; env GPUFEED_SCRUB_INTERVAL_S).")
@click.option("--scrub-rate", type=SizeType(), default=None,
              help="Most bytes a background scrub reads per second (default 100MiB; env GPUFEED_SCRUB_RATE).")
@click.option("--catalog-check", type=click.Choice(["quick", "full", "off"]), default=None,
              help="Integrity check of the catalog at start (default quick; env GPUFEED_CATALOG_CHECK).")
@CATALOG_OPTION
@click.option("--catalog-pool", "catalog_pool", type=click.IntRange(min=2), default=None,
              help="PostgreSQL catalog: most database connections (default 8; env GPUFEED_CATALOG_POOL_SIZE).")
@CLUSTER_OPTION
@click.option("--replicas", type=click.IntRange(min=1), default=None,
              help="Cluster: copies of each data file a write stores before it is acknowledged, capped to the "
                   "live members (default 2; 1 = the writer's only; env GPUFEED_CLUSTER_REPLICAS).")
def serve(data_dir, host, s3_port, port, socket_path, access_key, secret_key, no_fsync,
          region_pool, log_level, access_log, metrics_port, capacity, scrub_interval, scrub_rate,
          catalog_check, catalog_url, catalog_pool, cluster, replicas) -> None:
    """Run a storage node: S3 endpoint plus the fast data path.

    Prints the endpoints as one JSON line on stdout, then serves until
    SIGINT/SIGTERM. The line shows the secret key only when it is the built-in
    default; one given by option or environment shows as null.
    """
    import logging

    from .config import DEFAULT_SECRET_KEY, NodeConfig
    from .node import Node

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = NodeConfig.from_env(
        data_dir=data_dir, host=host, s3_port=s3_port, port=port, socket_path=socket_path,
        access_key=access_key, secret_key=secret_key, fsync=False if no_fsync else None,
        region_pool_bytes=region_pool, access_log=access_log, metrics_port=metrics_port,
        capacity_bytes=capacity, scrub_interval_s=scrub_interval, scrub_rate_bytes=scrub_rate,
        catalog_check=catalog_check, catalog=catalog_url, catalog_pool_size=catalog_pool, cluster=cluster,
        cluster_replicas=replicas,
    )
    node = Node(cfg)
    endpoints = node.start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    started = endpoints.as_dict()
    if cfg.secret_key != DEFAULT_SECRET_KEY:
        started["secret_key"] = None  # the user's own secret never goes to stdout
    print(json.dumps(started), flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        node.stop()


def _client(url: str | None):
    from .client import Client

    url = url or os.environ.get("GPUFEED_URL")
    if not url:
        raise click.UsageError("give --url or set GPUFEED_URL (e.g. gpufeed+tcp://127.0.0.1:9400)")
    return Client(url)


def _split(path: str) -> tuple[str, str]:
    """``bucket/key/with/slashes`` -> (bucket, key)."""
    path = path.removeprefix("gf://").removeprefix("s3://")
    bucket, _, key = path.partition("/")
    return bucket, key


def _set_quiet(ctx, param, value) -> None:
    if value:
        from .bench._output import set_quiet

        set_quiet(True)
        ctx.call_on_close(lambda: set_quiet(False))  # for this command only


QUIET_OPTION = click.option("--quiet", "-q", is_flag=True, expose_value=False, is_eager=True,
                            callback=_set_quiet,
                            help="No progress bars or summary line on stderr (they are off anyway "
                                 "when stderr is not a terminal).")
URL_OPTION = click.option("--url", default=None,
                          help="Node URL (gpufeed+tcp://... or gpufeed+shm://...; env GPUFEED_URL).")


@main.command()
@URL_OPTION
@click.argument("bucket")
def mb(url, bucket) -> None:
    """Create a bucket."""
    with _client(url) as c:
        c.create_bucket(bucket)
    click.echo(f"make_bucket: {bucket}")


@main.command()
@URL_OPTION
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@click.argument("dest")
def put(url, src, dest) -> None:
    """Upload a local file to BUCKET/KEY (KEY defaults to the file name)."""
    bucket, key = _split(dest)
    key = key or Path(src).name
    with _client(url) as c, open(src, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = c.alloc(size)
        f.readinto(buf)
        meta = c.put(bucket, key, buf)
    click.echo(json.dumps({"bucket": bucket, "key": key, "size": meta.size, "etag": meta.etag}))


@main.command()
@URL_OPTION
@click.argument("src")
@click.argument("dest", type=click.Path(dir_okay=False), required=False)
def get(url, src, dest) -> None:
    """Download BUCKET/KEY to DEST (default: the key's last path element; '-' = stdout)."""
    bucket, key = _split(src)
    if not key:
        raise click.UsageError("give BUCKET/KEY")
    with _client(url) as c:
        data = c.get(bucket, key)
        if dest == "-":
            sys.stdout.buffer.write(data)
            return
        out = Path(dest or key.rsplit("/", 1)[-1])
        with open(out, "wb") as f:
            f.write(data)
    click.echo(f"download: {bucket}/{key} to {out}")


@main.command()
@URL_OPTION
@click.argument("path", required=False, default="")
@click.option("--recursive", "-r", is_flag=True, help="List every key, not one level.")
def ls(url, path, recursive) -> None:
    """List buckets, or keys under BUCKET/PREFIX."""
    with _client(url) as c:
        if not path:
            for b in c.list_buckets():
                click.echo(b)
            return
        bucket, prefix = _split(path)
        for entry in c.list(bucket, prefix=prefix, delimiter="" if recursive else "/"):
            if entry.is_prefix:
                click.echo(f"{'PRE':>12} {entry.key}")
            else:
                click.echo(f"{entry.size:>12} {entry.key}")


@main.command()
@URL_OPTION
@click.argument("path")
def rm(url, path) -> None:
    """Delete BUCKET/KEY."""
    bucket, key = _split(path)
    if not key:
        raise click.UsageError("give BUCKET/KEY (deleting buckets: not from this command)")
    with _client(url) as c:
        c.delete(bucket, key)
    click.echo(f"delete: {bucket}/{key}")


@main.group()
def checkpoint() -> None:
    """Checkpoint locations (gpufeed+tcp://HOST:PORT/BUCKET/PREFIX): list steps, scrub."""


@checkpoint.command("ls")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def checkpoint_ls(url, as_json) -> None:
    """The committed steps under URL."""
    from .ai.checkpoint import checkpoints

    steps = checkpoints(url).steps()
    click.echo(json.dumps({"steps": steps}) if as_json else "\n".join(map(str, steps)))


@checkpoint.command("scrub")
@click.argument("url")
@click.option("--repair", is_flag=True, help="Delete chunks whose bytes do not match their name.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def checkpoint_scrub(url, repair, as_json) -> None:
    """Read every chunk under URL and check it against its BLAKE3 name; exit 1 if
    any chunk is corrupt or missing."""
    import dataclasses

    from .ai.checkpoint import checkpoints

    report = checkpoints(url).scrub(repair=repair)
    if as_json:
        click.echo(json.dumps({**dataclasses.asdict(report), "ok": report.ok}))
    else:
        click.echo(f"checked {report.chunks_checked} chunks, {report.bytes_checked} bytes: "
                   f"{len(report.corrupt)} corrupt, {len(report.missing)} missing, "
                   f"damaged steps {report.damaged_steps or 'none'}"
                   + (f", removed {len(report.removed)}" if repair else ""))
        for key in report.corrupt:
            click.echo(f"corrupt: {key}")
        for key in report.missing:
            click.echo(f"missing: {key}")
    if not report.ok:
        sys.exit(1)


@main.group()
def bench() -> None:
    """Benchmarks; each prints a table and can write JSON."""


@bench.command("io")
@QUIET_OPTION
@click.option("--size", type=SizeType(), default="1GiB", help="Object size (e.g. 256MiB, 1GiB).")
@click.option("--cold", is_flag=True, help="Also measure with the object's pages dropped (posix_fadvise).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--paths", default="local,shm,tcp,s3", help="Comma-separated paths to measure.")
@click.option("--repeat", type=int, default=3, help="Large-read repetitions per path (best is kept).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Node data folder (default: a temp dir).")
def bench_io(size, cold, json_path, paths, repeat, data_dir) -> None:
    """Read/write GB/s, CPU s/GB, 4 KiB latency and IOPS per data path, side by side."""
    from .bench.io import run_io_bench

    run_io_bench(size=size, cold=cold, json_path=json_path, paths=paths.split(","),
                 repeat=repeat, data_dir=data_dir)


@bench.command("catalog")
@QUIET_OPTION
@click.option("--objects", type=click.IntRange(min=1), default=2000, show_default=True, help="Objects put and headed.")
@click.option("--size", type=SizeType(), default="1KiB", show_default=True, help="Bytes per object.")
@click.option("--threads", type=click.IntRange(min=1), default=4, show_default=True,
              help="Threads of the concurrent head pass.")
@click.option("--list-pages", type=click.IntRange(min=1), default=50, show_default=True,
              help="ListObjectsV2 pages of 1,000 keys timed.")
@click.option("--catalog", "catalog_url", default=None, metavar="URL",
              help="An empty PostgreSQL database to use (default: a throwaway server started for the run).")
@click.option("--durable", is_flag=True, help="fsync data and commits on both catalogs.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
def bench_catalog(objects, size, threads, list_pages, catalog_url, durable, json_path) -> None:
    """put / head / list operations per second with the catalog in SQLite and in PostgreSQL."""
    from .bench.catalog import run_catalog_bench

    run_catalog_bench(objects=objects, size=size, threads=threads, list_pages=list_pages,
                      catalog_url=catalog_url, durable=durable, json_path=json_path)


@bench.command("list")
@QUIET_OPTION
@click.option("--dirs", type=int, default=1000, help="Directories in the big buckets.")
@click.option("--per-dir", type=int, default=1000, help="Objects per directory (the listed page).")
@click.option("--repeat", type=int, default=20, help="Timed listings per row (the median is kept).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Engine data folder (default: a temp dir).")
def bench_list(dirs, per_dir, repeat, json_path, data_dir) -> None:
    """ListObjectsV2 of one directory: a directory bucket of dirs x per-dir objects vs one of per-dir."""
    from .bench.list import run_list_bench

    run_list_bench(dirs=dirs, per_dir=per_dir, repeat=repeat, json_path=json_path, data_dir=data_dir)


@bench.command("integrity")
@QUIET_OPTION
@click.option("--objects", type=int, default=1000, help="Objects written, then three quarters harmed.")
@click.option("--seed", type=int, default=0, help="Seed of sizes and harms.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the node's data (default: a temp dir).")
def bench_integrity(objects, seed, json_path, data_dir) -> None:
    """Damage stored data under a running node; read it back through S3, tcp, shm and map; scrub."""
    from .bench.integrity import run_integrity

    out = run_integrity(objects=objects, seed=seed, json_path=json_path, data_dir=data_dir)
    if not all(t["met"] for t in out["targets"]):
        raise SystemExit(1)


@bench.command("crash")
@QUIET_OPTION
@click.option("--cycles", type=int, default=100, help="kill -9 cycles.")
@click.option("--writers", type=int, default=4, help="Concurrent writer threads (tcp and shm).")
@click.option("--keys", type=int, default=40, help="Keys per bucket.")
@click.option("--seed", type=int, default=0, help="Seed of the workload and kill times.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the node's data (default: a temp dir).")
def bench_crash(cycles, writers, keys, seed, json_path, data_dir) -> None:
    """kill -9 a node under concurrent puts, overwrites and deletes; check nothing is lost or leaked."""
    from .bench.crash import run_crash

    out = run_crash(cycles=cycles, writers=writers, keys=keys, seed=seed, json_path=json_path, data_dir=data_dir)
    if not all(t["met"] for t in out["targets"]):
        raise SystemExit(1)


@bench.command("data")
@QUIET_OPTION
@click.option("--size", type=SizeType(), default="1GiB",
              help="Object and model size (compression rows: 256 MiB at most).")
@click.option("--versions", type=int, default=10, help="Checkpoint versions written into the dedup bucket.")
@click.option("--repeat", type=int, default=3, help="Timed repetitions per row (the best is kept).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the node's data (default: a temp dir).")
def bench_data(size, versions, repeat, json_path, data_dir) -> None:
    """Checked vs unchecked reads, compression (tokens, bf16) and dedup of checkpoint versions, via a node."""
    from .bench.data import run_data_bench

    run_data_bench(size=size, versions=versions, repeat=repeat, json_path=json_path, data_dir=data_dir)


@bench.command("codecs")
@QUIET_OPTION
@click.option("--size", type=SizeType(), default="256MiB", help="Bytes per data set (e.g. 64MiB, 256MiB).")
@click.option("--chunk", type=SizeType(), default="4MiB", help="Chunk size.")
@click.option("--codecs", default="lz4,zstd:1,zstd:3,zstd:9", help="Comma-separated compression settings.")
@click.option("--repeat", type=int, default=3, help="Passes per measurement (the fastest per chunk is kept).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
def bench_codecs(size, chunk, codecs, repeat, json_path) -> None:
    """Chunk compression ratio and GB/s, skip cost, digests and CDC cuts on text tokens and bf16 weights."""
    from .bench.codecs import run_codecs

    run_codecs(size, chunk=chunk, codecs=codecs.split(","), repeat=repeat, json_path=json_path)


@bench.command("kv")
@QUIET_OPTION
@click.option("--tokens", type=int, default=8192, help="Prompt length.")
@click.option("--cached", type=int, default=None, help="Tokens cached first (default: tokens - 256, whole chunks).")
@click.option("--layers", type=int, default=8, help="Llama layers.")
@click.option("--hidden", type=int, default=1024, help="Hidden size.")
@click.option("--heads", type=int, default=16, help="Attention heads.")
@click.option("--kv-heads", type=int, default=8, help="KV heads.")
@click.option("--dtype", default="float32", help="Model and KV dtype (float32 compares exactly).")
@click.option("--new-tokens", type=int, default=4, help="Greedy tokens generated and compared.")
@click.option("--io-size", type=SizeType(), default="1GiB", help="Large-read yardstick object (0 skips).")
@click.option("--clients", type=int, default=16, help="Concurrent clients (0 skips).")
@click.option("--rounds", type=int, default=4, help="Loads per concurrent client.")
@click.option("--concurrent-tokens", type=int, default=2048, help="Prefix length per concurrent client.")
@click.option("--repeat", type=int, default=3, help="Reload/io repetitions (best is kept).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
def bench_kv(tokens, cached, layers, hidden, heads, kv_heads, dtype, new_tokens, io_size, clients,
             rounds, concurrent_tokens, repeat, json_path) -> None:
    """KV cache: TTFT recompute vs reload over shm/tcp, reload GB/s vs io GB/s, concurrency."""
    from .bench.kv import run_kv_bench

    run_kv_bench(tokens=tokens, cached=cached, layers=layers, hidden=hidden, heads=heads,
                 kv_heads=kv_heads, dtype=dtype, new_tokens=new_tokens, io_size=io_size,
                 clients=clients, rounds=rounds, concurrent_tokens=concurrent_tokens,
                 repeat=repeat, json_path=json_path)


@bench.command("checkpoint")
@QUIET_OPTION
@click.option("--size", type=SizeType(), default="1GiB", help="State-dict bytes incl. AdamW state (e.g. 256MiB, 1GiB).")
@click.option("--versions", type=int, default=10, help="LoRA-style versions saved for the dedup figures.")
@click.option("--lora-rank", type=int, default=4, help="Adapter rank of the LoRA versions.")
@click.option("--repeat", type=int, default=2, help="Saves per path (best is kept).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--paths", default="gpufeed,gpufeed_tcp,dcp_fs", help="Comma-separated paths to measure.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Node data + FileSystemWriter folders (default: a temp dir).")
def bench_checkpoint(size, versions, lora_rank, repeat, json_path, paths, data_dir) -> None:
    """DCP save GB/s and async blocking vs FileSystemWriter; dedup over LoRA versions."""
    from .bench.checkpoint import run_checkpoint_bench

    run_checkpoint_bench(size=size, versions=versions, lora_rank=lora_rank, repeat=repeat,
                         json_path=json_path, paths=paths.split(","), data_dir=data_dir)


@bench.command("model")
@QUIET_OPTION
@click.option("--size", type=click.Choice(["small", "1gb"]), default="1gb",
              help="The demo's model: 1gb (~1 GB bf16 Llama) or small (~60 MB).")
@click.option("--workdir", type=click.Path(file_okay=False), default=".gpufeed-demo",
              help="The demo's work folder (model cached there; node data in a temp folder inside).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--paths", default=None, help="Comma-separated subset of shm,shm_map,tcp,s3,"
              "local_load_file,local_load_file_lazy,runai,runai_s3,fastsafetensors,readinto.")
@click.option("--repeat", type=int, default=3, help="Warm runs per path (best is kept).")
@click.option("--cold-repeat", type=int, default=2, help="Cold runs per path (pages dropped before each).")
@click.option("--no-cold", is_flag=True, help="Skip the cold rows.")
@click.option("--first-loads", type=int, default=3,
              help="Fresh-process loads per way (shm with/without the region pool, load_file); 0 skips.")
@click.option("--no-sweep", is_flag=True,
              help="Measure runai and fastsafetensors at their default concurrency only (no settings sweep).")
def bench_model(size, workdir, json_path, paths, repeat, cold_repeat, no_cold, first_loads, no_sweep) -> None:
    """Model load GB/s per path (gpufeed shm/tcp, S3, safetensors, runai, fastsafetensors), warm and cold."""
    from .bench.model import run_model_bench

    run_model_bench(size=size, workdir=workdir, json_path=json_path, repeat=repeat,
                    cold_repeat=cold_repeat, cold=not no_cold,
                    paths=paths.split(",") if paths else None, first_loads=first_loads,
                    sweep=not no_sweep)


@bench.command("gpu")
@QUIET_OPTION
@click.option("--device", default=None, help="cuda:N or cpu (default cuda:0; without CUDA: a message and exit 0).")
@click.option("--allow-cpu", is_flag=True, help="Without a CUDA device, run the CPU fallback instead.")
@click.option("--size", type=click.Choice(["small", "1gb"]), default="1gb",
              help="The demo's model: 1gb (~1 GB bf16 Llama) or small (~60 MB).")
@click.option("--workdir", type=click.Path(file_okay=False), default=".gpufeed-demo",
              help="The demo's work folder (model cached there; node data in a temp folder inside).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--paths", default=None, help="Comma-separated subset of shm,tcp,shm_map,s3,load_file,"
              "fastsafetensors,runai,host_to_device.")
@click.option("--repeat", type=int, default=3, help="Runs per path (best is kept).")
@click.option("--kv-tokens", type=int, default=8192, help="Tokens of KV stored and reloaded (0 skips).")
@click.option("--no-checkpoint", is_flag=True, help="Skip the checkpoint rows.")
def bench_gpu(device, allow_cpu, size, workdir, json_path, paths, repeat, kv_tokens, no_checkpoint) -> None:
    """Model, checkpoint and KV into one GPU through every path (GB/s, checked on the device)."""
    from .bench.gpu import resolve_device, run_gpu_bench

    dev, why = resolve_device(device, allow_cpu)
    if dev is None:
        click.echo(f"no CUDA device: {why}. Nothing measured; --device cpu (or --allow-cpu) "
                   f"runs the CPU fallback.")
        return
    if why:
        click.echo(why)
    report = run_gpu_bench(device=dev, size=size, workdir=workdir, json_path=json_path,
                           repeat=repeat, kv_tokens=kv_tokens,
                           paths=paths.split(",") if paths else None, checkpoint=not no_checkpoint)
    if report["failures"]:
        raise click.ClickException(f"{len(report['failures'])} failed: {'; '.join(report['failures'])}")


@bench.command("train")
@QUIET_OPTION
@click.option("--workloads", default="unet3d,resnet50,cosmoflow", help="Comma-separated MLPerf Storage workloads.")
@click.option("--paths", default="gpufeed,local,s3_boto3,s3fs,s3torchconnector", help="Comma-separated paths.")
@click.option("--scale", default="0.025,resnet50=0.25",
              help="Sample-size factor: one number, or workload=factor entries (e.g. 0.05,resnet50=1).")
@click.option("--compute-scale", default="1,cosmoflow=4",
              help="Compute-time factor, same syntax (1: H100 times; 'same': follow --scale, an H100's GB/s).")
@click.option("--steps", type=int, default=10, help="Window = max(--min-window, steps x compute time).")
@click.option("--warmup-steps", type=int, default=2, help="Steps per accelerator before the window opens.")
@click.option("--min-window", type=float, default=1.0, help="Shortest measurement window, seconds.")
@click.option("--workers", type=int, default=1, help="DataLoader workers per accelerator.")
@click.option("--prefetch", type=int, default=2, help="Batches prefetched per worker.")
@click.option("--max-accelerators", type=int, default=32, help="Largest number of accelerators tried.")
@click.option("--dataset-size", type=SizeType(), default="256MiB", help="Bytes of samples per workload.")
@click.option("--retries", type=int, default=1, help="Extra tries of an N that falls below the AU threshold.")
@click.option("--no-ceiling", is_flag=True, help="Skip the samples-from-memory (DataLoader ceiling) search.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Node data and local files (default: a temp dir).")
def bench_train(workloads, paths, scale, compute_scale, steps, warmup_steps, min_window, workers, prefetch,
                max_accelerators, dataset_size, retries, no_ceiling, json_path, data_dir) -> None:
    """MLPerf-Storage-style training: largest number of emulated accelerators kept busy, per path."""
    from .bench.train import run_train_bench

    run_train_bench(workloads=workloads.split(","), paths=paths.split(","), scale=scale,
                    compute_scale=None if compute_scale == "same" else compute_scale, steps=steps,
                    warmup_steps=warmup_steps, min_window_s=min_window, workers=workers, prefetch=prefetch,
                    max_accelerators=max_accelerators, dataset_bytes=dataset_size, retries=retries,
                    ceiling=not no_ceiling, json_path=json_path, data_dir=data_dir)


@main.command()
@QUIET_OPTION
@click.option("--size", type=click.Choice(["small", "1gb"]), default="1gb",
              help="Model size: 1gb (~1 GB bf16 Llama) or small (~60 MB, quick look).")
@click.option("--workdir", type=click.Path(file_okay=False), default=".gpufeed-demo",
              help="Where the model files and node data go.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
@click.option("--repeat", type=int, default=3, show_default=True, help="Runs per path (the fastest is kept).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="The HTML page of this run and docs/bench/*.json (default WORKDIR/report.html; '' skips).")
def demo(size, workdir, json_path, repeat, report_path) -> None:
    """Build a Llama model, store it in gpufeed, load it every way and compare; end with the HTML report."""
    from .bench.demo import run_demo

    result = run_demo(size=size, workdir=workdir, json_path=json_path, repeat=repeat)
    if report_path == "":
        return
    from .bench.report import Source, write_report

    try:
        out = write_report(report_path or Path(workdir) / "report.html", "docs/bench",
                           extra=[Source("demo (this run)", result)])
    except ImportError as exc:
        click.echo(f"report: skipped ({exc})", err=True)
        return
    click.echo(f"report: {out.resolve()}")


@bench.command("report")
@click.option("--in", "in_dir", type=click.Path(file_okay=False), default="docs/bench", show_default=True,
              help="Folder of benchmark JSON files.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="bench-out/report.html",
              show_default=True, help="The HTML page to write.")
def bench_report(in_dir, out_path) -> None:
    """Every benchmark's JSON on one self-contained HTML page: plots, ratios to baselines, commands."""
    from .bench.report import write_report

    if not sorted(Path(in_dir).glob("*.json")):
        raise click.ClickException(f"no benchmark JSON files in {in_dir!r} (run from the checkout, or pass --in)")
    try:
        out = write_report(out_path, in_dir)
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"report: {out.resolve()}")


if __name__ == "__main__":  # pragma: no cover
    main()
