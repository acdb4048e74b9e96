"""``gpufeed bench list``: listing one directory of a huge directory bucket vs of a small one.

One engine, one in-process S3 front, four buckets holding the same target
directory (``per_dir`` objects under ``dir{middle}/``):

* ``general_small`` (baseline): a general purpose bucket holding only the
  target directory;
* ``directory_small``: a directory bucket holding only the target directory;
* ``directory_big``: a directory bucket of ``dirs × per_dir`` objects in
  ``dirs`` sibling directories (1,000,000 by default), the target among them;
* ``general_big``: the same in a general purpose bucket.

Each row times ListObjectsV2 of the target directory (``prefix`` the
directory, delimiter ``/``, one page of ``per_dir`` keys): ``engine_s`` is the
median of ``repeat`` calls of :meth:`gpufeed.engine.Engine.list_objects`,
``s3_s`` the median of ``repeat`` stock-boto3 ``list_objects_v2`` calls
through the S3 front (client and front share the process); the rows take turns
in every round, after one warm-up round (for directory buckets boto3 makes one CreateSession
first and signs the listings with it). ``vs_baseline`` is a row's time over
``general_small``'s, and ``big_vs_small`` (the target, at most 2) compares the
big directory bucket with the small one.

The target directory's objects are real puts; the other directories' rows are
inserted straight into the catalog in batches (``batch`` rows per
transaction), all naming one shared blob: the listing reads catalog rows only,
so the rows are what matters, and a million S3 PUTs would take an hour here.

JSON shape (as ``bench io``)::

    {"benchmark": "list", "command": "...", "machine": {...}, "params": {...},
     "build_s": {...},
     "results": [{"bucket", "kind", "objects", "listed", "engine_s", "s3_s",
                  "engine_vs_baseline", "s3_vs_baseline"}],
     "targets": [{"target", "compare": "<=", "want", "got", "met"}]}
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..config import NodeConfig
from ..engine import Engine
from ._output import BenchProgress, summary_line, write_json
from .io import machine_info

__all__ = ["run_list_bench"]

_ZONE = "use1-az1"
_BUCKETS = {  # row name -> (bucket name, kind, big)
    "general_small": ("list-general-small", "standard", False),
    "directory_small": (f"list-small--{_ZONE}--x-s3", "directory", False),
    "directory_big": (f"list-big--{_ZONE}--x-s3", "directory", True),
    "general_big": ("list-general-big", "standard", True),
}


def _dir(i: int) -> str:
    return f"dir{i:05d}/"


def _fill(engine: Engine, bucket: str, *, dirs: int, per_dir: int, target: int, batch: int) -> None:
    """Real puts of the target directory, then catalog rows for every other directory."""
    first = None
    for j in range(per_dir):
        info = engine.put_object(bucket, f"{_dir(target)}obj{j:06d}", b"x")
        first = first or info
    if dirs <= 1 or first is None:
        return
    rows = (dataclasses.replace(first, key=f"{_dir(i)}obj{j:06d}")
            for i in range(dirs) if i != target for j in range(per_dir))
    cat = engine._cat  # bulk rows for the bench only; every real write goes through the write path
    done = False
    while not done:
        with cat.write() as w:
            n = 0
            for info in rows:
                w.put_object(info)
                n += 1
                if n == batch:
                    break
            else:
                done = True


def _serve(engine: Engine, cfg: NodeConfig):
    """Start the S3 front on a thread's event loop; returns ``(port, stop)``."""
    from ..s3 import start_s3

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["runner"], box["port"] = loop.run_until_complete(start_s3(engine, cfg))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="bench-list-s3", daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("S3 front did not start")

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()

    return box["port"], stop


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _measure(engine: Engine, s3, buckets: dict[str, str], prefix: str, per_dir: int,
             repeat: int) -> dict[str, dict]:
    """Median seconds per row, engine and S3, the rows taken in turn in every
    round (so a busy moment of a shared machine falls on all of them alike)."""
    calls = {}
    for row, bucket in buckets.items():
        calls[row] = (
            lambda b=bucket: engine.list_objects(b, prefix=prefix, delimiter="/", max_keys=per_dir).objects,
            lambda b=bucket: s3.list_objects_v2(Bucket=b, Prefix=prefix, Delimiter="/",
                                                MaxKeys=per_dir).get("Contents", []),
        )
    times: dict[str, tuple[list[float], list[float]]] = {row: ([], []) for row in buckets}
    for rnd in range(repeat + 1):  # round 0 warms up (caches, boto3's CreateSession)
        for row, (engine_call, s3_call) in calls.items():
            for i, call in enumerate((engine_call, s3_call)):
                took, listed = _timed(call)
                if len(listed) != per_dir:  # type: ignore[arg-type]
                    raise RuntimeError(f"{buckets[row]}: listed {len(listed)} keys, expected {per_dir}")  # type: ignore[arg-type]
                if rnd:
                    times[row][i].append(took)
    return {row: {"engine_s": statistics.median(e), "s3_s": statistics.median(s), "listed": per_dir}
            for row, (e, s) in times.items()}


def run_list_bench(*, dirs: int = 1000, per_dir: int = 1000, repeat: int = 20, batch: int = 50_000,
                   json_path: str | None = None, data_dir: str | None = None,
                   general_big: bool = True, console: Console | None = None) -> dict:
    """Run the listing benchmark and print its table.

    Args:
        dirs: directories in the big buckets (each of ``per_dir`` objects).
        per_dir: objects in each directory, the target's included (≤ 1000: one page).
        repeat: timed listings per row and front (the median is kept).
        batch: catalog rows per transaction while filling the big buckets.
        json_path: write the JSON here.
        data_dir: engine folder (default: a temp dir, removed after).
        general_big: also build and time the big general purpose bucket.
        console: where the table goes.

    Returns:
        The JSON document (see the module docstring).

    Raises:
        ValueError: ``per_dir`` outside 1..1000 or ``dirs`` < 1.
    """
    import boto3

    if not 1 <= per_dir <= 1000 or dirs < 1:
        raise ValueError("per_dir must be 1..1000 and dirs >= 1")
    console = console or Console()
    target = dirs // 2
    prefix = _dir(target)
    rows = {k: v for k, v in _BUCKETS.items() if general_big or k != "general_big"}
    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-list-") as tmp:
        root = Path(data_dir or tmp)
        engine = Engine(root / "data", fsync=False)
        build_s = {}
        progress = BenchProgress("list").start()
        try:
            for row, (bucket, kind, big) in rows.items():
                progress.step(f"build {row} ({(dirs if big else 1) * per_dir:,} objects)")
                t0 = time.perf_counter()
                engine.create_bucket(bucket, kind=kind)
                _fill(engine, bucket, dirs=dirs if big else 1, per_dir=per_dir, target=target, batch=batch)
                build_s[row] = round(time.perf_counter() - t0, 3)
                console.print(f"built {row}: {build_s[row]:.1f} s")
            cfg = NodeConfig(data_dir=root / "data", host="127.0.0.1", s3_port=0, fsync=False,
                             access_key="bench-access", secret_key="bench-secret", region="us-east-1")
            port, stop = _serve(engine, cfg)
            s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id=cfg.access_key,
                              aws_secret_access_key=cfg.secret_key, region_name="us-east-1")
            progress.step(f"list one directory, {repeat} times per bucket")
            try:
                timed = _measure(engine, s3, {row: v[0] for row, v in rows.items()}, prefix, per_dir, repeat)
                results = [{"bucket": row, "kind": kind, "objects": (dirs if big else 1) * per_dir, **timed[row]}
                           for row, (_bucket, kind, big) in rows.items()]
            finally:
                s3.close()
                stop()
        finally:
            progress.close()
            engine.close()
    base = results[0]
    for r in results:
        r["engine_vs_baseline"] = r["engine_s"] / base["engine_s"]
        r["s3_vs_baseline"] = r["s3_s"] / base["s3_s"]
    by = {r["bucket"]: r for r in results}
    got = by["directory_big"]["s3_s"] / by["directory_small"]["s3_s"]
    got_engine = by["directory_big"]["engine_s"] / by["directory_small"]["engine_s"]
    out = {
        "benchmark": "list",
        "command": f"gpufeed bench list --dirs {dirs} --per-dir {per_dir} --repeat {repeat} --json PATH",
        "machine": machine_info(),
        "params": {"dirs": dirs, "per_dir": per_dir, "repeat": repeat, "batch": batch, "target_prefix": prefix},
        "build_s": build_s,
        "results": results,
        "targets": [
            {"target": "directory_big / directory_small, S3 ListObjectsV2", "compare": "<=", "want": 2.0,
             "got": round(got, 3), "met": got <= 2.0},
            {"target": "directory_big / directory_small, engine list_objects", "compare": "<=", "want": 2.0,
             "got": round(got_engine, 3), "met": got_engine <= 2.0},
        ],
    }
    _print(console, out)
    if json_path:
        write_json(json_path, out)
        console.print(f"wrote {json_path}")
    progress.done(summary_line("list", out, json_path))
    return out


def _print(console: Console, out: dict) -> None:
    table = Table(title=f"ListObjectsV2 of {out['params']['target_prefix']} ({out['params']['per_dir']} keys)")
    for col in ("bucket", "kind", "objects", "engine ms", "S3 ms", "engine ×base", "S3 ×base"):
        table.add_column(col, justify="left" if col in ("bucket", "kind") else "right")
    for r in out["results"]:
        table.add_row(r["bucket"], r["kind"], f"{r['objects']:,}", f"{r['engine_s'] * 1e3:.2f}",
                      f"{r['s3_s'] * 1e3:.2f}", f"{r['engine_vs_baseline']:.2f}", f"{r['s3_vs_baseline']:.2f}")
    console.print(table)
    for t in out["targets"]:
        console.print(f"{t['target']}: {t['got']} (want {t['compare']} {t['want']}): "
                      f"{'met' if t['met'] else 'NOT met'}")
