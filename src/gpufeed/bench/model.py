"""``gpufeed bench model``: load the demo's Llama every way, page-cached and cold.

The model is the demo's (``gpufeed demo``: a random bf16 Llama saved by
transformers as sharded safetensors plus an index, cached in the work folder),
stored in a fresh node. Every path loads every tensor into CPU memory:

* ``shm`` / ``tcp``: :func:`gpufeed.ai.load_safetensors` over
  ``gpufeed+shm://`` / ``gpufeed+tcp://`` (one client per path, as a serving
  process keeps);
* ``shm_map``: the same with ``zero_copy=True``: tensors view the node's data
  files mapped copy-on-write (its page cache), every page mapped in before the
  call returns (read from disk first when cold): resident and nothing copied,
  but page-cache pages, not the process's own memory;
* ``s3``: boto3 ``get_object().read()`` per shard, 4 at a time, then
  ``safetensors.torch.load`` (the demo's S3 path);
* ``local_load_file``: ``safetensors.torch.load_file`` of the local files with
  every tensor resident (the faster of ``backend="pread"`` and mmap +
  ``.clone()``); ``local_load_file_lazy``: plain ``load_file`` (mmap: returns
  before reading anything, listed for reference, not a peer);
* ``runai``: runai-model-streamer ``SafetensorsStreamer().stream_files(files,
  device="cpu")`` over the local files, one row per setting of
  :data:`RUNAI_SETTINGS`: ``RUNAI_STREAMER_CONCURRENCY`` (read when a streamer
  is created; 16 is its default) under each read strategy
  (``RUNAI_STREAMER_FS_STRATEGY``: unset, which resolves to ``O_DIRECT`` reads
  that bypass the page cache where the file system allows them, and
  ``sync_buffered``). The strategy is fixed once per process, so each strategy
  runs in a fresh interpreter (after one untimed first call: ~1 s of setup);
  ``runai_s3``: the library's defaults against the node's S3 endpoint
  (``s3://`` paths, custom endpoint, path-style);
* ``fastsafetensors``: ``SafeTensorsFileLoader(device="cpu", nogds=True,
  max_threads=N)``, one row per ``N`` of :data:`FST_THREADS` (copier threads;
  16 is its default). ``nogds=False`` is not swept: without GDS it falls back
  to the same copier.
* ``readinto``: plain ``readinto`` of the files into a preallocated, touched
  buffer (the physical limit of the host).

``warm``: every file page-cached first; best of ``repeat``, all in this
process. ``cold``: before each run the pages of the local files and of the
node's blob files are dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)``;
best of ``cold_repeat``. A peer's settings other than its default are
measured fewer times (``params.sweep_repeat`` / ``sweep_cold_repeat``); every
row names its ``setting`` (``None`` for paths without one) and ``runs_s`` lists
its runs. The targets compare with the fastest row of any local peer at any
setting. The first warm run of each path and setting is checked bit for
bit against the files. Every timed run of a resident path ends with a read of
one byte per 4 KiB page of every tensor (``bench.demo._touch``): a loader
that leaves page faults to its caller pays them here.

Repeated loads in one process are a best case for the copying peers: their
allocator hands back memory the previous run already faulted in, so they and
the shm path alike are one memory copy from the page cache (about 12-17 GB/s
on the 2-core VM: memory bandwidth). ``first_load`` rows measure what a
serving process pays instead: ``first_loads`` fresh interpreters per way, each
loading the model once into memory it has never touched (imports and the
gpufeed connection before the clock): shm with and without the node's region
pool, tcp, and every local peer (runai and fastsafetensors at their fastest
warm setting, named in ``setting``). ``targets`` compares shm with the fastest
local peer there too (medians).

JSON (the shape of ``bench io``)::

    {"benchmark": "model", "machine": {...}, "model": {...}, "params": {...},
     "results": [{"path", "cache": "warm"|"cold", "setting", "best_setting", "seconds",
                  "gbps", "cpu_s_per_gb", "runs_s", "verified", "method"}],  # warm first
     "first_load": [{"path", "region_pool": "on"|"off"|None, "process", "seconds",
                     "gbps", "bytes", "regions_reused", "way", "setting", "method"}],
     "targets": [{"target", "want", "got", "met"}], "notes": [...]}

GB means 10**9 bytes (of tensor data).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ._device import same_tensors
from ._output import BenchProgress, summary_line, write_json
from .demo import (  # the demo's model, upload and loaders: one definition of each
    BUCKET,
    MODEL_SIZES,
    PathResult,
    _build_model,
    _load_local_clone,
    _load_local_pread,
    _load_s3,
    _Meter,
    _readinto,
    _shard_files,
    _upload,
)
from .io import drop_cache, machine_info
from .peers import (  # the peers' loaders and settings sweeps
    FST_THREADS,
    RUNAI_SETTINGS,
    _best_peer_settings,
    _FastSafetensors,
    _mark_best_settings,
    _peer_versions,
    _ResultRow,
    _runai,
    _runai_sweep,
)

__all__ = ["run_model_bench", "PATHS"]

#: Every path, in table order.
PATHS = ["shm", "shm_map", "tcp", "s3", "local_load_file", "local_load_file_lazy", "runai", "runai_s3",
         "fastsafetensors", "readinto"]
#: Paths compared with shm for the "fastest local peer" target.
LOCAL_PEERS = ("local_load_file", "runai", "fastsafetensors")


def _load_lazy(files: list[Path]) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in files:
        out.update(load_file(f))
    return out


def _missing(module: str) -> str | None:
    import importlib.util

    return None if importlib.util.find_spec(module) else module


# One load in a fresh interpreter: what a serving process that starts and loads its
# model once pays (fresh memory included). Libraries are imported and gpufeed's
# client connected before the clock starts; the clock stops after a first touch of
# every page (bench.demo._touch). Prints seconds, bytes, regions reused.
_FRESH = r"""
import sys, time
from gpufeed.bench.demo import _touch
mode, args = sys.argv[1], sys.argv[2:]
reused = 0
if mode in ("shm", "shm_map", "tcp"):
    from gpufeed.ai import load_safetensors
    from gpufeed.client import Client
    c = Client(args[0])
    load = lambda: load_safetensors(c, args[1], args[2], zero_copy=mode == "shm_map")
elif mode == "runai":
    import runai_model_streamer  # noqa: F401
    from gpufeed.bench.peers import _runai
    load = lambda: _runai(args)
elif mode == "fastsafetensors":
    import os
    import fastsafetensors  # noqa: F401
    from gpufeed.bench.peers import _FastSafetensors
    load = _FastSafetensors(args, int(os.environ.get("GPUFEED_BENCH_FST_THREADS", "16")))
else:
    import safetensors.torch  # noqa: F401
    from gpufeed.bench import demo
    load = lambda: (demo._load_local_clone if mode == "local_clone" else demo._load_local_pread)(args)
t0 = time.perf_counter()
out = load()
_touch(out)
dt = time.perf_counter() - t0
if mode in ("shm", "shm_map", "tcp"):
    reused = c.regions_reused
n = sum(t.numel() * t.element_size() for t in out.values())
print(dt, n, reused)
"""

#: Fresh-process ways: (path, region pool, _FRESH mode, short label, method).
FRESH_WAYS = [
    ("shm", "on", "shm", "shm, region pool on",
     "gpufeed.ai.load_safetensors over gpufeed+shm; the node's region pool holds memory "
     "earlier processes left"),
    ("shm", "off", "shm", "shm, region pool off",
     "gpufeed.ai.load_safetensors over gpufeed+shm from a node started with --region-pool 0 "
     "(fresh shared memory)"),
    ("shm_map", None, "shm_map", "shm zero-copy",
     "gpufeed.ai.load_safetensors(zero_copy=True) over gpufeed+shm (maps the page cache)"),
    ("tcp", None, "tcp", "tcp", "gpufeed.ai.load_safetensors over gpufeed+tcp"),
    ("local_load_file", None, "local_clone", "load_file + clone",
     "safetensors load_file (mmap) + .clone()"),
    ("local_load_file", None, "local_pread", "load_file pread", 'safetensors load_file(backend="pread")'),
    ("runai", None, "runai", "runai", 'runai-model-streamer SafetensorsStreamer.stream_files(device="cpu")'),
    ("fastsafetensors", None, "fastsafetensors", "fastsafetensors",
     'fastsafetensors SafeTensorsFileLoader(device="cpu", nogds=True)'),
]


def _fresh_load(args: list[str], env: dict | None = None) -> tuple[float, int, int]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FRESH, *args], capture_output=True, text=True,
                         timeout=600, check=True,
                         env={**os.environ, **env} if env else None).stdout.split()
    return float(out[0]), int(out[1]), int(out[2])


def _first_loads(files: list[Path], model_dir: Path, prefix: str, tmp: Path, node, runs: int,
                 paths: list[str], say, peer_settings: dict | None = None) -> list[dict]:
    """``runs`` fresh-process loads per way of :data:`FRESH_WAYS` whose path is in
    ``paths`` (shm with and without the node's region pool, tcp, and the local
    peers reading the files into fresh anonymous memory), page cache warm.
    ``peer_settings`` maps a peer's path to ``(environment, setting)`` for its
    loads (its fastest warm setting)."""
    from ..client import Client
    from ..testing.node import start_node

    rows = []
    local = [str(f) for f in files]

    def warm(blob_dir: Path) -> None:  # page-cache the local files and a node's blobs
        for f in [*files, *(p for p in blob_dir.rglob("*") if p.is_file())]:
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass

    def run(path: str, pool: str | None, mode: str, label: str, method: str,
            args: list[str]) -> None:
        env, setting = (peer_settings or {}).get(path, (None, None))
        say(f"  first load in a fresh process: {label} ...")
        for i in range(runs):
            seconds, n, reused = _fresh_load([mode, *args], env)
            rows.append({"path": path, "region_pool": pool, "process": i + 1,
                         "seconds": round(seconds, 4), "gbps": round(n / seconds / 1e9, 3),
                         "bytes": n, "regions_reused": reused, "way": label, "setting": setting,
                         "method": method + (f", {setting}" if setting else "")})

    warm(tmp / "node" / "blobs")  # once: nothing below evicts them (the model is ~1 GB)
    nopool = None
    try:
        for path, pool, mode, label, method in FRESH_WAYS:
            if path not in paths:
                continue
            if pool == "off":
                nopool = start_node(tmp / "node-nopool", extra_args=["--region-pool", "0", "--no-fsync"])
                with Client(nopool.shm_url, **nopool.credentials) as up:
                    _upload(up, model_dir, prefix)
                warm(tmp / "node-nopool" / "blobs")
                url = nopool.shm_url
            else:
                url = node.tcp_url if path == "tcp" else node.shm_url
            run(path, pool, mode, label, method,
                [url, BUCKET, prefix] if path in ("shm", "shm_map", "tcp") else local)
            if nopool is not None:
                nopool.stop()
                nopool = None
    finally:
        if nopool is not None:
            nopool.stop()
    return rows


def _fresh_targets(first: list[dict]) -> list[dict]:
    """shm (each region-pool setting) against the fastest local peer, medians of the
    fresh-process loads."""
    import statistics

    def key(r: dict) -> tuple:
        return r["path"], r["region_pool"], r["way"], r.get("setting")

    med: dict[tuple, float] = {}
    for k in {key(r) for r in first}:
        med[k] = statistics.median(r["gbps"] for r in first if key(r) == k)
    peers = [(g, k) for k, g in med.items() if k[0] in LOCAL_PEERS]
    out: list[dict] = []
    if not peers:
        return out
    best, (_peer, _pool, way, setting) = max(peers)
    way += f" at {setting}" if setting else ""
    for (path, _pool, label, _setting), g in sorted(med.items(), key=lambda kv: str(kv[0])):
        if path in ("shm", "shm_map"):
            got = g / best
            out.append({"target": f"{label} vs fastest local peer ({way}), first load in a fresh "
                                  f"process, median",
                        "want": 1.5, "got": round(got, 2), "met": got >= 1.5})
    return out


def run_model_bench(size: str = "1gb", workdir: str | os.PathLike = ".gpufeed-demo",
                    json_path: str | os.PathLike | None = None, *, repeat: int = 3,
                    cold_repeat: int = 2, cold: bool = True, paths: list[str] | None = None,
                    first_loads: int = 3, sweep: bool = True, console=None) -> dict:
    """Load the demo model through every path, warm and cold; print a table, return JSON.

    Args:
        size: the demo's model size, ``"1gb"`` or ``"small"``.
        workdir: the demo's work folder (the model is built there once and
            reused); the node's data goes to a temporary folder inside it.
        json_path: also write the report here.
        repeat: warm runs per path (the fastest is kept).
        cold_repeat: cold runs per path, each after dropping the pages.
        cold: measure the cold rows.
        paths: a subset of :data:`PATHS`.
        first_loads: fresh-process loads per way for the ``first_load`` rows (0 skips).
        sweep: measure runai and fastsafetensors at every setting of
            :data:`RUNAI_SETTINGS` and :data:`FST_THREADS`; ``False``: at each
            one's default concurrency only (runai still under both strategies).
        console: a ``rich.console.Console`` (default: a new one).

    Returns:
        The report (see the module docstring).

    Raises:
        ValueError: unknown size or path.
        RuntimeError: a path returned tensors that differ from the files.
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"size must be one of {sorted(MODEL_SIZES)}, not {size!r}")
    paths = list(paths or PATHS)
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown paths {sorted(unknown)}; choose from {PATHS}")
    from rich.console import Console
    from rich.table import Table

    from ..ai import gds_status, load_safetensors
    from ..client import Client
    from ..testing.node import start_node

    console = console or Console()
    say = console.print
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = workdir / f"model-{size}"
    progress = BenchProgress("model").start()
    progress.step(f"model ({size})")
    spec = _build_model(size, model_dir, say)
    files = _shard_files(model_dir)
    from safetensors.torch import load_file

    reference: dict = {}
    for f in files:
        reference.update(load_file(f))  # mmap: for checking only
    nbytes = sum(t.numel() * t.element_size() for t in reference.values())
    file_bytes = sum(f.stat().st_size for f in files)
    notes: list[str] = [f"GPUDirect Storage: {gds_status()}"]
    for path, module in (("runai", "runai_model_streamer"), ("runai_s3", "runai_model_streamer_s3"),
                         ("fastsafetensors", "fastsafetensors")):
        gone = _missing(module) or (_missing("runai_model_streamer") if path == "runai_s3" else None)
        if path in paths and gone:
            paths.remove(path)
            notes.append(f"{path}: skipped, {gone} is not installed (pip install 'gpufeed[bench]')")

    tmp = Path(tempfile.mkdtemp(prefix="bench-model-", dir=workdir))
    progress.step("start node")
    node = start_node(tmp / "node")
    results: list[PathResult] = []
    tags: list[tuple[str, str | None]] = []  # (cache, setting) of each result
    sweep_repeat, sweep_cold_repeat = min(repeat, 2), min(cold_repeat, 1)
    runai_settings = RUNAI_SETTINGS if sweep else tuple((st, cs[:1]) for st, cs in RUNAI_SETTINGS)
    fst_threads = FST_THREADS if sweep else FST_THREADS[:1]
    fst = _FastSafetensors(files)
    try:
        prefix = f"llama-{size}/"
        with Client(node.shm_url, **node.credentials) as up:
            _upload(up, model_dir, prefix, progress)
        blobs = [str(p) for p in (tmp / "node" / "blobs").rglob("*") if p.is_file()]
        meter = _Meter(node.pid)
        scratch = memoryview(bytearray(file_bytes))
        clients = {"shm": Client(node.shm_url, **node.credentials), "tcp": Client(node.tcp_url, **node.credentials)}
        s3 = node.boto3_client()
        s3_paths = [f"s3://{BUCKET}/{prefix}{f.name}" for f in files]
        runai_creds = None
        if "runai_s3" in paths:
            # path-style addressing and no instance metadata: a local endpoint
            os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
            os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
            from runai_model_streamer.s3_utils.s3_utils import S3Credentials

            runai_creds = S3Credentials(access_key_id=node.access_key,
                                        secret_access_key=node.secret_key,
                                        endpoint=node.s3_url, region_name="us-east-1")

        def check(out: dict) -> bool:
            if not same_tensors(reference, out):
                raise RuntimeError("loaded tensors differ from the model files")
            return True

        # (method, loader, bytes) per path; local_load_file (two variants, the faster
        # kept), runai and fastsafetensors (setting sweeps) are measured apart
        loaders: dict[str, tuple[str, Callable[[], object], int]] = {
            "shm": ("gpufeed.ai.load_safetensors over gpufeed+shm, one client",
                    lambda: load_safetensors(clients["shm"], BUCKET, prefix), nbytes),
            "shm_map": ("gpufeed.ai.load_safetensors(zero_copy=True) over gpufeed+shm: tensors map "
                        "the node's page cache copy-on-write, every page mapped in",
                        lambda: load_safetensors(clients["shm"], BUCKET, prefix, zero_copy=True),
                        nbytes),
            "tcp": ("gpufeed.ai.load_safetensors over gpufeed+tcp, one client",
                    lambda: load_safetensors(clients["tcp"], BUCKET, prefix), nbytes),
            "s3": ("boto3 get_object().read() per shard (4 at a time) + safetensors.torch.load",
                   lambda: _load_s3(s3, prefix), nbytes),
            "local_load_file_lazy": ("safetensors load_file (mmap; reads nothing until used)",
                                     lambda: _load_lazy(files), nbytes),
            "runai_s3": ("runai-model-streamer from the node's S3 endpoint (s3:// paths)",
                         lambda: _runai(s3_paths, runai_creds), nbytes),
            "readinto": ("readinto into one preallocated touched buffer, 64 MiB calls",
                         lambda: _readinto(files, scratch), file_bytes),
        }

        def measure(path: str, cache: str) -> None:
            runs = repeat if cache == "warm" else cold_repeat
            prepare = (lambda: drop_cache([*map(str, files), *blobs])) if cache == "cold" else None
            verify = check if cache == "warm" and path != "readinto" else None
            cleanup = fst.close if path == "fastsafetensors" else None
            say(f"  {cache} {path} ...")
            progress.step(f"{cache} {path}")
            if path == "runai":
                for res, setting in _runai_sweep(files, cache, nbytes, runs,
                                                 sweep_repeat if cache == "warm" else sweep_cold_repeat,
                                                 runai_settings):
                    results.append(res)
                    tags.append((cache, setting))
                return
            if path == "fastsafetensors":
                for n in fst_threads:
                    fst.max_threads = n
                    setting = f"max_threads={n}"
                    results.append(meter.measure(
                        path, f'fastsafetensors SafeTensorsFileLoader(device="cpu", nogds=True, '
                              f'{setting})', nbytes,
                        runs if n == fst_threads[0] else
                        (sweep_repeat if cache == "warm" else sweep_cold_repeat),
                        fst, check=verify, prepare=prepare, cleanup=cleanup))
                    tags.append((cache, setting))
                return
            if path == "local_load_file":
                a = meter.measure(path, 'safetensors load_file(backend="pread")', nbytes, runs,
                                  lambda: _load_local_pread(files), check=verify, prepare=prepare)
                b = meter.measure(path, "safetensors load_file (mmap) + .clone()", nbytes, runs,
                                  lambda: _load_local_clone(files), check=verify, prepare=prepare)
                best, other = (a, b) if a.seconds <= b.seconds else (b, a)
                best.method += f" (faster than {other.method}: {other.gbps:.2f} GB/s)"
                results.append(best)
            else:
                method, run, n = loaders[path]
                results.append(meter.measure(path, method, n, runs, run, check=verify,
                                             prepare=prepare, cleanup=cleanup,
                                             touch=path != "local_load_file_lazy"))
            tags.append((cache, None))

        # warm-up: every file and blob page-cached, clients connected
        progress.step("warm the page cache")
        _readinto(files, scratch)
        for f in files:
            clients["tcp"].get_into(BUCKET, prefix + f.name, scratch[:f.stat().st_size])
        say(f"[bold]gpufeed bench model[/]: {nbytes / 1e9:.2f} GB, {len(files)} shards")
        ntensors = len(reference)
        for cache in ("warm", "cold") if cold else ("warm",):
            if cache == "cold":
                # the reference maps the files: pages still mapped cannot be dropped
                reference.clear()
                gc.collect()
            for path in paths:
                try:
                    measure(path, cache)
                except Exception as exc:  # a peer failing is a finding, not a crash
                    if path in ("shm", "tcp", "s3"):
                        raise
                    notes.append(f"{path} ({cache}): failed: {type(exc).__name__}: {exc}")
                    fst.close()
        for c in clients.values():
            c.close()
        s3.close()
        scratch = memoryview(b"")  # release the buffer (the loaders that used it are done)
        if first_loads:
            progress.step(f"first loads in fresh processes ({first_loads} per way)")
        first = (_first_loads(files, model_dir, prefix, tmp, node, first_loads, paths, say,
                              _best_peer_settings(results, tags))
                 if first_loads else [])
    finally:
        progress.close()
        fst.close()
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    rows = [_ResultRow(path=r.path, cache=c, setting=setting, best_setting=None,
                       seconds=round(r.seconds, 4), gbps=round(r.gbps, 3),
                       cpu_s_per_gb=round(r.cpu_s_per_gb, 3), runs_s=[round(s, 4) for s in r.runs_s],
                       verified=r.verified, method=r.method)
            for r, (c, setting) in zip(results, tags)]
    _mark_best_settings(rows)
    targets = []
    for cache in ("warm", "cold") if cold else ("warm",):
        by: dict[str, _ResultRow] = {}  # each path's fastest row (a peer's best setting)
        for r in rows:
            if r["cache"] == cache and (r["path"] not in by or r["gbps"] > by[r["path"]]["gbps"]):
                by[r["path"]] = r
        peers = [by[p] for p in LOCAL_PEERS if p in by]
        for ours in ("shm", "shm_map"):
            if ours not in by:
                continue
            if peers:
                fastest = max(peers, key=lambda r: r["gbps"])
                at = f" at {fastest['setting']}" if fastest["setting"] else ""
                got = by[ours]["gbps"] / fastest["gbps"]
                targets.append({"target": f"{ours} vs fastest local peer ({fastest['path']}{at}), "
                                          f"{cache}", "want": 1.5, "got": round(got, 2),
                                "met": got >= 1.5})
            if "s3" in by:
                got = by[ours]["gbps"] / by["s3"]["gbps"]
                targets.append({"target": f"{ours} vs s3, {cache}", "want": 3.0,
                                "got": round(got, 2), "met": got >= 3.0})
    targets += _fresh_targets(first)

    table = Table(title=f"gpufeed bench model: {nbytes / 1e9:.2f} GB bf16 Llama, {len(files)} "
                        f"shards (warm best of {repeat}"
                        + (f", cold best of {cold_repeat})" if cold else ")"))
    for col in ("path", "cache", "setting", "seconds", "GB/s", "CPU s/GB", "identical"):
        table.add_column(col, justify="left" if col in ("path", "cache", "setting") else "right")
    for r in rows:
        ok = "n/a" if r["verified"] is None else ("yes" if r["verified"] else "NO")
        setting = (r["setting"] or "") + (" (best)" if r["best_setting"] else "")
        table.add_row(r["path"], r["cache"], setting, f"{r['seconds']:.3f}", f"{r['gbps']:.2f}",
                      f"{r['cpu_s_per_gb']:.2f}", ok)
    console.print(table)
    if first:
        ft = Table(title="first load in a fresh process (page cache warm; fresh memory and a "
                         "first touch of every page included)")
        for col in ("way", "process", "seconds", "GB/s", "regions reused"):
            ft.add_column(col, justify="left" if col == "way" else "right")
        for load in first:
            ft.add_row(load["way"], str(load["process"]), f"{load['seconds']:.3f}",
                       f"{load['gbps']:.2f}", str(load["regions_reused"]))
        console.print(ft)
    for t in targets:
        say(f"target {t['target']}: want >= {t['want']}x, got {t['got']}x: "
            f"{'[green]met[/]' if t['met'] else '[red]not met[/]'}")
    for n in notes:
        say(f"note: {n}", soft_wrap=True)
    report = {
        "benchmark": "model",
        "command": f"gpufeed bench model --size {size} --repeat {repeat}"
                   + (f" --cold-repeat {cold_repeat}" if cold else " --no-cold")
                   + f" --first-loads {first_loads}" + ("" if sweep else " --no-sweep")
                   + (f" --paths {','.join(paths)}" if set(paths) != set(PATHS) else ""),
        "machine": {**machine_info(), **_peer_versions()},
        "model": {"architecture": "LlamaForCausalLM", "size": size, "dtype": "bfloat16",
                  "config": spec["config"], "tensors": ntensors, "bytes": nbytes,
                  "file_bytes": file_bytes, "shards": len(files)},
        "params": {"repeat": repeat, "cold_repeat": cold_repeat, "keep": "fastest run",
                   "sweep_repeat": sweep_repeat, "sweep_cold_repeat": sweep_cold_repeat,
                   "sweeps": {"runai": [{"RUNAI_STREAMER_FS_STRATEGY": st or "unset",
                                         "RUNAI_STREAMER_CONCURRENCY": list(cs)}
                                        for st, cs in runai_settings],
                              "fastsafetensors": {"max_threads": list(fst_threads)},
                              "default_settings": "measured repeat / cold_repeat times; the "
                                                  "other settings sweep_repeat / "
                                                  "sweep_cold_repeat times"},
                   "cold": "posix_fadvise(DONTNEED) of the local files and node blobs before "
                           "each run"},
        "results": rows,
        "first_load": first,
        "targets": targets,
        "notes": notes,
    }
    if json_path:
        write_json(json_path, report)
        say(f"wrote {json_path}")
    gc.collect()
    progress.done(summary_line("model", report, json_path))
    return report
