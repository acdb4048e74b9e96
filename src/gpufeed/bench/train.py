"""``gpufeed bench train``: how many emulated accelerators can one node keep busy?

MLPerf Storage style (v1.0 rules, "Training" workloads): each emulated
accelerator repeatedly takes the next batch from its data loader, then sleeps
for the workload's compute time per batch. Accelerator utilization::

    AU = time spent computing / wall time

over a measurement window that starts once every accelerator has done its first
``warmup_steps`` steps (start-up, worker forks and first fetches excluded) and
lasts ``max(min_window_s, steps * compute_s)``. The time an accelerator waits
for a batch is the only thing that lowers it. For each data path (see
:mod:`gpufeed.bench._train_loaders`) the run searches the largest number ``N``
of accelerators, all reading at once from one node, for which AU stays at or
above the workload's threshold: ``N = 1, 2, 4, 8, ...`` until AU drops below it
(or ``max_accelerators``), then bisection between the last good and the first
bad ``N``.

Workloads (MLPerf Storage v1.0, H100 settings):

=========  ===================  ====================  =====  ==========  ======
workload   sample bytes         samples per file      batch  compute s   AU min
=========  ===================  ====================  =====  ==========  ======
unet3d     146,600,628          1                     7      0.323       0.90
resnet50   114,660              1,251 (tar shards)    400    0.224       0.90
cosmoflow  2,828,486            1                     1      0.00350     0.70
=========  ===================  ====================  =====  ==========  ======

``--scale`` multiplies sample sizes and compute times (so each accelerator asks
for the same GB/s as on an H100 while the data set fits a small machine);
``--compute-scale`` sets the compute times' factor apart (a slower accelerator
asks for fewer GB/s). Both take one number for every workload or
``workload=value`` entries (``"0.05,resnet50=1"``); the values used are
recorded.

Per measurement: ``au`` (mean over accelerators; ``au_min`` the lowest),
``samples_per_s`` and ``gbps`` (bytes of the batches delivered in the window /
window seconds), ``cpu_s_per_gb`` (CPU seconds of this process, its
DataLoader workers and the node over the window, per GB delivered;
``client_cpu_s_per_gb`` / ``server_cpu_s_per_gb`` split it; a summary's
``client_cpu_s_per_gb_over_memory`` is the loader's less the ``memory``
ceiling's, what the path adds to the DataLoader's own work). Compute time is
the time the accelerator actually slept (timer slack is not counted as waiting).

JSON::

    {"benchmark": "train", "command", "machine", "params": {"scale", "compute_scale", ...},
     "workloads": {name: {"sample_bytes", "batch", "compute_s", "au_min", "scale", ...}},
     "results": [{"workload", "path", "accelerators", "au", "max_accelerators_au_ok", "gbps",
                  "cpu_s_per_gb", "samples_per_s", "au_min", "at_max", ...}],
     "summary": [{"workload", "path", "max_accelerators_au_ok", "gbps", "cpu_s_per_gb", ...}],
     "ceiling": [rows of path "memory"], "ceiling_summary": [...],
     "skipped": [{"path", "reason"}], "targets": [...]}

Before the paths, the same search runs with samples served from memory (the
``memory`` loader: same DataLoader, collate and tar parsing, no storage):
``ceiling`` / ``ceiling_summary``, the most this machine's DataLoader
processes carry, which no path can pass. An ``N`` that falls below the
threshold is measured once more (``retries``) before the search moves on, so a
load spike from other work on the machine does not end it early.

GB/s are 10^9 bytes per second. Sources: MLPerf Storage v1.0 rules and the
DLIO workload configs (``unet3d_h100.yaml``, ``resnet50_h100.yaml``,
``cosmoflow_h100.yaml``).
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import psutil

from ._output import is_quiet

__all__ = ["run_train_bench", "summary_line", "Workload", "WORKLOADS", "parse_scale", "accelerator_utilization",
           "search_max_accelerators", "measure", "TreeCpu"]

GB = 1e9


@dataclass(frozen=True)
class Workload:
    """One MLPerf Storage training workload.

    Attributes:
        name: ``unet3d``, ``resnet50`` or ``cosmoflow``.
        sample_bytes: bytes per sample.
        samples_per_file: samples per stored file (more than 1: tar shards).
        batch: samples per batch (per accelerator step).
        compute_s: emulated compute time per batch, seconds.
        au_min: the AU a run must keep (fraction).
        scale: factor applied to ``sample_bytes``.
        compute_scale: factor applied to ``compute_s``.
    """

    name: str
    sample_bytes: int
    samples_per_file: int
    batch: int
    compute_s: float
    au_min: float
    scale: float = 1.0
    compute_scale: float = 1.0

    def scaled(self, scale: float, compute_scale: float | None = None) -> Workload:
        """This workload with sizes times ``scale`` and compute times times
        ``compute_scale`` (default: ``scale``)."""
        cs = scale if compute_scale is None else compute_scale
        return replace(self, sample_bytes=max(1, round(self.sample_bytes * scale)),
                       compute_s=self.compute_s * cs, scale=scale, compute_scale=cs)

    @property
    def demand_gbps(self) -> float:
        """GB/s one accelerator asks for at 100 % AU."""
        return self.batch * self.sample_bytes / self.compute_s / GB


#: MLPerf Storage v1.0 training workloads, H100 settings.
WORKLOADS: dict[str, Workload] = {
    "unet3d": Workload("unet3d", 146_600_628, 1, 7, 0.323, 0.90),
    "resnet50": Workload("resnet50", 114_660, 1251, 400, 0.224, 0.90),
    "cosmoflow": Workload("cosmoflow", 2_828_486, 1, 1, 0.00350, 0.70),
}


def parse_scale(spec: str | float | None, names: Sequence[str]) -> dict[str, float | None]:
    """``"0.05"`` or ``"0.05,resnet50=1"`` -> ``{workload: factor}`` for each of
    ``names`` (a bare number applies to every workload not named; ``None``: not given).

    Raises:
        ValueError: an unknown workload, or a factor that is not a positive number.
    """
    default: float | None = None
    named: dict[str, float] = {}
    for part in ([] if spec is None or spec == "" else str(spec).split(",")):
        name, _, value = part.rpartition("=")
        name = name.strip()
        try:
            factor = float(value)
        except ValueError as exc:
            raise ValueError(f"scale {part!r} is not a number") from exc
        if not factor > 0:
            raise ValueError(f"scale {part!r} must be > 0")
        if name and name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r} in scale (known: {', '.join(WORKLOADS)})")
        if name:
            named[name] = factor
        else:
            default = factor
    return {k: named.get(k, default) for k in names}


# --- the AU maths ---------------------------------------------------------------------------

def _overlap(a: float, b: float, t0: float, t1: float) -> float:
    return max(0.0, min(b, t1) - max(a, t0))


def accelerator_utilization(steps: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """AU of one accelerator over the window ``[t0, t1)``.

    Args:
        steps: its compute intervals ``(start_s, end_s)`` (perf_counter seconds).
        t0, t1: the window, seconds.

    Returns:
        Seconds of compute inside the window / window seconds (0 for an empty window).
    """
    if t1 <= t0:
        return 0.0
    return sum(_overlap(a, b, t0, t1) for a, b in steps) / (t1 - t0)


def search_max_accelerators(au_of: Callable[[int], float], threshold: float, n_max: int) -> tuple[int, list[int]]:
    """The largest ``N <= n_max`` with ``au_of(N) >= threshold``: ``N`` doubles from 1
    until AU falls below the threshold, then bisection between the last good and
    the first bad ``N`` (AU is taken to fall as ``N`` grows; each ``N`` is measured once).

    Returns:
        ``(N, the N measured in order)``; ``N`` is 0 when even one accelerator
        stays below the threshold.
    """
    seen: dict[int, bool] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            seen[n] = au_of(n) >= threshold
        return seen[n]

    if n_max < 1 or not ok(1):
        return 0, list(seen)
    lo, hi = 1, None
    while hi is None and lo < n_max:
        n = min(lo * 2, n_max)
        if ok(n):
            lo = n
        else:
            hi = n
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, list(seen)


class TreeCpu:
    """CPU seconds (user + system) of this process with its children (DataLoader
    workers), apart from the server process and its children."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.me = psutil.Process()
        self.server_pid = server_pid

    @staticmethod
    def _cpu(procs) -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass  # exited between the listing and the read
        return total

    def sample(self) -> tuple[float, float]:
        """``(client_s, server_s)`` now."""
        children = self.me.children(recursive=True)
        server = [p for p in children if p.pid == self.server_pid]
        if server:
            under = {p.pid for p in server[0].children(recursive=True)}
            server += [p for p in children if p.pid in under]
        client = [self.me] + [p for p in children if p not in server]
        return self._cpu(client), self._cpu(server)


# --- one measurement ------------------------------------------------------------------------

def _batch_size(batch) -> tuple[int, int]:
    return len(batch), int(batch.nbytes)


def measure(loaders: Sequence, compute_s: float, *, warmup_steps: int = 2, window_s: float = 2.0,
            cpu: TreeCpu | None = None, warmup_timeout_s: float = 120.0) -> dict:
    """Run ``len(loaders)`` emulated accelerators at once and measure them.

    ``iter()`` of every loader is taken here, in the calling thread (DataLoader
    workers fork from it); then one thread per accelerator loops "next batch,
    sleep ``compute_s``" until the window has passed.

    Args:
        loaders: one iterable of batches per accelerator (a batch has ``len()``
            samples and ``nbytes``).
        compute_s: emulated compute seconds per batch.
        warmup_steps: steps every accelerator does before the window opens.
        window_s: window length, seconds.
        cpu: CPU meter (default: this process tree, no server).
        warmup_timeout_s: open the window anyway after this long.

    Returns:
        ``{"accelerators", "au", "au_min", "gbps", "samples_per_s", "cpu_s_per_gb",
        "client_cpu_s_per_gb", "server_cpu_s_per_gb", "window_s", "steps"}``.

    Raises:
        The first error an accelerator's loader raised.
    """
    cpu = cpu or TreeCpu()
    iters = [iter(loader) for loader in loaders]
    n = len(iters)
    events: list[list[tuple[float, float, int, int]]] = [[] for _ in range(n)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def accelerator(i: int) -> None:
        it, ev = iters[i], events[i]
        try:
            while not stop.is_set():
                samples, nbytes = _batch_size(next(it))
                start = time.perf_counter()
                time.sleep(compute_s)
                ev.append((start, time.perf_counter(), samples, nbytes))
        except BaseException as exc:  # noqa: B036 (reported to the caller below)
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=accelerator, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + warmup_timeout_s
    while (not stop.is_set() and time.perf_counter() < deadline
           and min(len(ev) for ev in events) < warmup_steps):
        time.sleep(0.005)
    c0, t0 = cpu.sample(), time.perf_counter()
    stop.wait(window_s)
    c1, t1 = cpu.sample(), time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    iters.clear()
    gc.collect()  # shut the DataLoader workers down now, not in a later measurement
    if errors:
        raise errors[0]
    aus = [accelerator_utilization([(a, b) for a, b, _, _ in ev], t0, t1) for ev in events]
    got = [(s, nb) for ev in events for a, _, s, nb in ev if t0 <= a < t1]
    samples, nbytes = sum(s for s, _ in got), sum(nb for _, nb in got)
    wall = t1 - t0
    gb = nbytes / GB
    client_s, server_s = c1[0] - c0[0], c1[1] - c0[1]
    per_gb = (lambda s: s / gb) if gb else (lambda s: None)
    return {"accelerators": n, "au": sum(aus) / n, "au_min": min(aus), "gbps": gb / wall,
            "samples_per_s": samples / wall, "cpu_s_per_gb": per_gb(client_s + server_s),
            "client_cpu_s_per_gb": per_gb(client_s), "server_cpu_s_per_gb": per_gb(server_s),
            "window_s": wall, "steps": sum(1 for ev in events for a, _, _, _ in ev if t0 <= a < t1)}


# --- the whole run (node, data set, every path) -----------------------------------------------

def _workload_json(w: Workload) -> dict:
    """A workload's settings for the JSON (with the GB/s one accelerator asks for)."""
    return {**asdict(w), "demand_gbps_per_accelerator": round(w.demand_gbps, 4)}


def _command_line(p: dict) -> str:
    """The ``gpufeed bench train`` command that repeats a run with these parameters."""
    cs = "same" if p["compute_scale"] is None else p["compute_scale"]
    return (f"gpufeed bench train --workloads {','.join(p['workloads'])} --paths {','.join(p['paths'])} "
            f"--scale {p['scale']} --compute-scale {cs} --steps {p['steps']} "
            f"--warmup-steps {p['warmup_steps']} --min-window {p['min_window_s']:g} --workers {p['workers']} "
            f"--prefetch {p['prefetch']} --max-accelerators {p['max_accelerators']} "
            f"--dataset-size {p['dataset_bytes']} --retries {p['retries']}"
            + ("" if p["ceiling"] else " --no-ceiling") + (f" --json {p['json']}" if p.get("json") else ""))


def _load_avg() -> float:
    """The machine's 1-minute load average (other work sharing the cores)."""
    return round(os.getloadavg()[0], 2)


def _write_json(out: dict, json_path: str | None) -> None:
    if json_path:
        from pathlib import Path

        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")


def _files_for(w: Workload, dataset_bytes: int) -> int:
    """Files of the data set: about ``dataset_bytes``, at least one batch."""
    file_bytes = w.sample_bytes * w.samples_per_file
    at_least = -(-w.batch // w.samples_per_file)
    return max(at_least, dataset_bytes // file_bytes)


def _accelerator_cap(w: Workload, workers: int, prefetch: int, n_max: int, memory_budget: int) -> int:
    """``n_max``, lowered so the batches in flight (``workers * prefetch`` queued
    per accelerator, one being computed on, one being filled) fit ``memory_budget`` bytes."""
    per = w.batch * w.sample_bytes * (workers * prefetch + 2)
    return max(1, min(n_max, memory_budget // max(per, 1)))


def run_train_bench(*, workloads: Sequence[str] = ("unet3d", "resnet50", "cosmoflow"),
                    paths: Sequence[str] | None = None, scale: str | float | None = "0.025,resnet50=0.25",
                    compute_scale: str | float | None = "1,cosmoflow=4", steps: int = 10, warmup_steps: int = 2,
                    min_window_s: float = 1.0, workers: int = 1, prefetch: int = 2, max_accelerators: int = 32,
                    memory_budget: int = 4 << 30, dataset_bytes: int = 256 << 20, json_path: str | None = None,
                    data_dir: str | None = None, quiet: bool | None = None, retries: int = 1, ceiling: bool = True,
                    loaders: dict[str, Callable] | None = None, command: str | None = None) -> dict:
    """Run the benchmark (see the module docstring); print tables and a one-line
    summary, and return (and optionally write) the JSON.

    Args:
        workloads: names from :data:`WORKLOADS`.
        paths: subset of :data:`gpufeed.bench._train_loaders.PATHS` (default: all).
        scale: sample-size (and compute-time) factor: ``0.05`` or ``"0.05,resnet50=1"``.
        compute_scale: compute-time factor, same syntax (``None``: follow ``scale``,
            so each accelerator asks for an H100's GB/s).
        steps: the window is ``max(min_window_s, steps * compute_s)`` seconds.
        warmup_steps: steps each accelerator takes before the window opens.
        min_window_s: shortest window, seconds.
        workers: DataLoader workers per accelerator.
        prefetch: batches prefetched per worker.
        max_accelerators: the largest ``N`` tried.
        memory_budget: bytes the batches in flight may take; lowers the largest
            ``N`` tried for big samples.
        dataset_bytes: about this many bytes of samples per workload.
        json_path: write the JSON here.
        data_dir: node data and local files (default: a temporary folder).
        quiet: no progress lines (each ``N`` measured, on stderr) and no summary
            line (stderr); the tables still print on stdout. ``None``: as
            :func:`gpufeed.bench._output.is_quiet` (``--quiet``).
        retries: extra measurements of an ``N`` that falls below the threshold
            (the best is kept).
        ceiling: first search ``N`` for samples served from memory (the
            ``memory`` loader: the same DataLoader, collate and tar parsing, no
            storage), reported apart as ``ceiling`` / ``ceiling_summary``: the
            most this machine's DataLoader processes carry.
        loaders: path -> factory, replacing or adding to the built-in ones.
        command: the command recorded in the JSON (default: the ``gpufeed bench
            train`` command with these parameters).

    Raises:
        ValueError: an unknown workload or path, or a bad scale.
    """
    import tempfile
    from pathlib import Path

    from rich.console import Console

    from ..client import Client
    from ..testing.node import start_node
    from ._train_loaders import LOADERS, PATHS, Source, s3_environment, unavailable, write_dataset
    from .io import machine_info

    quiet = is_quiet() if quiet is None else quiet
    console = Console(width=max(Console().width, 120))  # the tables, on stdout
    log = Console(stderr=True, quiet=quiet, width=max(Console().width, 120))  # progress, on stderr
    unknown = [w for w in workloads if w not in WORKLOADS]
    registry = {**LOADERS, **(loaders or {})}
    paths = list(paths or PATHS)
    if unknown or any(p not in registry for p in paths):
        raise ValueError(f"unknown workloads {unknown} or paths {[p for p in paths if p not in registry]}")
    sc, cs = parse_scale(scale, workloads), parse_scale(compute_scale, workloads)
    wls = [WORKLOADS[n].scaled(sc[n] or 1.0, cs[n] if cs[n] is not None else sc[n] or 1.0) for n in workloads]
    skipped = [{"path": p, "reason": why} for p in paths
               if p not in (loaders or {}) and (why := unavailable(p)) is not None]
    run_paths = [p for p in paths if p not in {s["path"] for s in skipped}]
    params = {"workloads": list(workloads), "paths": paths, "scale": scale, "compute_scale": compute_scale,
              "steps": steps, "warmup_steps": warmup_steps, "min_window_s": min_window_s, "workers": workers,
              "prefetch": prefetch, "max_accelerators": max_accelerators, "memory_budget_bytes": memory_budget,
              "dataset_bytes": dataset_bytes, "retries": retries, "ceiling": ceiling, "node_fsync": False,
              "load_avg_1m": [_load_avg()]}
    out: dict = {"benchmark": "train", "command": command or _command_line({**params, "json": json_path}),
                 "machine": machine_info(), "params": params,
                 "workloads": {w.name: _workload_json(w) for w in wls}, "results": [], "summary": [],
                 "ceiling": [], "ceiling_summary": [], "skipped": skipped}
    log.print(f"[bold]gpufeed bench train[/]: workloads {[w.name for w in wls]}, paths {run_paths}; "
                  f"scale {scale} (compute {compute_scale if compute_scale is not None else 'same'})")
    for s in skipped:
        log.print(f"  [yellow]skipped {s['path']}[/]: {s['reason']}")
    tmp = tempfile.TemporaryDirectory(prefix="gpufeed-train-") if data_dir is None else None
    root = Path(tmp.name if tmp is not None else str(data_dir))
    node = start_node(root / "node", extra_args=["--no-fsync"])
    try:
        sources = {}
        with Client(node.shm_url, **node.credentials) as client:
            client.create_bucket("bench-train")
            for w in wls:
                files = _files_for(w, dataset_bytes)
                keys = _upload(log, client, w, files, root / "local", write_dataset)
                sources[w.name] = Source("bench-train", tuple(keys), str(root / "local"), w.sample_bytes,
                                         w.samples_per_file, w.batch, node.s3_url, node.shm_url,
                                         node.access_key, node.secret_key, workers, prefetch)
        os.sync()  # the data set's writeback now, not during a measurement
        with s3_environment(next(iter(sources.values()))):
            for w in wls:
                cap = _accelerator_cap(w, workers, prefetch, max_accelerators, memory_budget)
                window_s = max(min_window_s, steps * w.compute_s)
                log.print(f"[bold]{w.name}[/]: {w.sample_bytes:,} B samples x {w.samples_per_file} per file, "
                              f"batch {w.batch}, compute {w.compute_s * 1e3:.2f} ms, AU >= {w.au_min:.0%}, "
                              f"{w.demand_gbps:.3f} GB/s per accelerator; N <= {cap}, window {window_s:.2f} s")
                for path in (["memory"] if ceiling else []) + run_paths:
                    _search_path(out, log, w, path, registry[path], sources[w.name], cap, window_s,
                                 warmup_steps, TreeCpu(node.pid), retries)
    finally:
        node.stop()
        if tmp is not None:
            tmp.cleanup()
    for s in skipped:
        for w in wls:
            out["results"].append({"workload": w.name, "path": s["path"], "accelerators": None, "au": None,
                                   "max_accelerators_au_ok": None, "gbps": None, "cpu_s_per_gb": None,
                                   "skipped": s["reason"]})
    out["params"]["load_avg_1m"].append(_load_avg())
    _over_memory(out)
    out["targets"] = _targets(out)
    _print(console, out)
    _write_json(out, json_path)
    if not quiet:
        log.print(summary_line(out) + (f"; wrote {json_path}" if json_path else ""), soft_wrap=True)
    return out


def _upload(console, client, w: Workload, files: int, local_root, write_dataset) -> list[str]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    total = files * w.samples_per_file * w.sample_bytes
    with Progress("  {task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"{w.name}: {files} files", total=total)
        keys = write_dataset(client, "bench-train", f"{w.name}/", local_root / w.name, files=files,
                             sample_bytes=w.sample_bytes, samples_per_file=w.samples_per_file,
                             progress=lambda nb: bar.advance(task, nb))
    console.print(f"  {w.name}: {files} files, {total / GB:.3f} GB of samples written locally and to the node")
    return keys


def _search(console, w: Workload, label: str, factory, src, cap: int, window_s: float, warmup_steps: int,
            cpu: TreeCpu, retries: int) -> tuple[int, list[int], dict[int, dict]]:
    """:func:`search_max_accelerators` over ``measure``; an ``N`` below the
    threshold is measured up to ``retries`` more times (the best kept: a load
    spike from other work on the machine should not end the search)."""
    rows: dict[int, dict] = {}

    def au_of(n: int) -> float:
        row: dict | None = None
        for attempt in range(1 + retries):
            got = measure([factory(src, r, n) for r in range(n)], w.compute_s, warmup_steps=warmup_steps,
                          window_s=window_s, cpu=cpu, warmup_timeout_s=max(60.0, 10 * window_s))
            cpu_txt = "—" if got["cpu_s_per_gb"] is None else f"{got['cpu_s_per_gb']:.2f}"
            console.print(f"  {w.name} {label:<16} N={n:<3d} AU {got['au']:6.1%} (min {got['au_min']:6.1%})  "
                          f"{got['gbps']:7.3f} GB/s  {got['samples_per_s']:9,.0f} samples/s  CPU {cpu_txt} s/GB")
            if row is None or got["au"] > row["au"]:
                row = got
            row["tries"] = attempt + 1
            if row["au"] >= w.au_min:
                break
        assert row is not None  # 1 + retries >= 1 tries
        rows[n] = row
        return row["au"]

    best, order = search_max_accelerators(au_of, w.au_min, cap)
    return best, order, rows


def _search_path(out: dict, console, w: Workload, path: str, factory, src, cap: int, window_s: float,
                 warmup_steps: int, cpu: TreeCpu, retries: int) -> None:
    """Measure one path of one workload over ``N``; rows into ``out``."""
    try:
        best, order, rows = _search(console, w, path, factory, src, cap, window_s, warmup_steps, cpu, retries)
    except Exception as exc:  # a baseline that breaks must not lose the other paths' results
        lines = str(exc).strip().splitlines() or [""]
        reason = f"{type(exc).__name__}: {lines[-1]}"  # a worker's error: the last line of its traceback
        console.print(f"  [red]{path} failed[/]: {reason}")
        out["skipped"].append({"path": path, "workload": w.name, "reason": reason, "detail": str(exc)[-4000:]})
        out["results"].append({"workload": w.name, "path": path, "accelerators": None, "au": None,
                               "max_accelerators_au_ok": None, "gbps": None, "cpu_s_per_gb": None,
                               "skipped": reason})
        return
    key = "ceiling" if path == "memory" else "results"
    for n in order:
        out[key].append({"workload": w.name, "path": path, **rows[n], "max_accelerators_au_ok": best,
                         "at_max": n == best, "au_threshold": w.au_min})
    at = rows.get(best) or rows[1]
    out["summary" if key == "results" else "ceiling_summary"].append(
        {"workload": w.name, "path": path, "max_accelerators_au_ok": best, "accelerators_cap": cap,
         "au": at["au"], "gbps": at["gbps"], "samples_per_s": at["samples_per_s"],
         "cpu_s_per_gb": at["cpu_s_per_gb"], "client_cpu_s_per_gb": at["client_cpu_s_per_gb"],
         "at_accelerators": at["accelerators"], "measured": order})


def _over_memory(out: dict) -> None:
    """``client_cpu_s_per_gb_over_memory`` in each summary: the loader's CPU per GB
    less that of the same DataLoader serving samples from memory (what the path
    itself costs), where the ceiling was measured."""
    ceiling = {c["workload"]: c for c in out["ceiling_summary"]}
    for s in out["summary"]:
        c = ceiling.get(s["workload"])
        if c is not None and s["client_cpu_s_per_gb"] is not None and c["client_cpu_s_per_gb"] is not None:
            s["client_cpu_s_per_gb_over_memory"] = s["client_cpu_s_per_gb"] - c["client_cpu_s_per_gb"]


def _targets(out: dict) -> list[dict]:
    """The targets, from the summary (a missing path leaves its target out). An
    accelerator-count target not met where gpufeed reached the largest ``N`` tried
    (``accelerators_cap``) is also ``inconclusive``: a higher cap could meet it."""
    by = {(s["workload"], s["path"]): s for s in out["summary"]}
    targets = []

    def ratio(a, b):
        return None if a is None or not b else round(a / b, 3)

    def capped(t: dict, g: dict) -> dict:
        if not t["met"] and g.get("accelerators_cap") and g["max_accelerators_au_ok"] >= g["accelerators_cap"]:
            t["inconclusive"] = (f"gpufeed kept AU ok at the largest N tried ({g['accelerators_cap']}); "
                                 "raise --max-accelerators (or the memory budget) to measure it")
        return t

    for wl, want_boto in (("unet3d", 2.0), ("resnet50", 2.0), ("cosmoflow", 1.5)):
        g, b, loc = by.get((wl, "gpufeed")), by.get((wl, "s3_boto3")), by.get((wl, "local"))
        if g and b:
            got = ratio(g["max_accelerators_au_ok"], b["max_accelerators_au_ok"])
            met = g["max_accelerators_au_ok"] >= want_boto * b["max_accelerators_au_ok"] and g[
                "max_accelerators_au_ok"] > 0
            targets.append(capped({"target": f"{wl}: gpufeed accelerators at AU ok / s3_boto3's",
                                   "compare": ">=", "want": want_boto, "got": got, "met": met}, g))
        if g and loc and wl != "cosmoflow":
            met = g["max_accelerators_au_ok"] >= 0.95 * loc["max_accelerators_au_ok"]
            targets.append(capped({"target": f"{wl}: gpufeed accelerators at AU ok / local files'",
                                   "compare": ">=", "want": 0.95,
                                   "got": ratio(g["max_accelerators_au_ok"], loc["max_accelerators_au_ok"]),
                                   "met": met}, g))
        if g and b and wl != "cosmoflow":
            got = ratio(g["client_cpu_s_per_gb"], b["client_cpu_s_per_gb"])
            targets.append({"target": f"{wl}: gpufeed loader CPU s/GB / s3_boto3 loader's", "compare": "<=",
                            "want": 0.3, "got": got, "met": got is not None and got <= 0.3,
                            "got_over_memory": ratio(g.get("client_cpu_s_per_gb_over_memory"),
                                                     b.get("client_cpu_s_per_gb_over_memory"))})
    return targets


def _print(console, out: dict) -> None:
    from rich.table import Table

    table = Table(title="gpufeed bench train — largest N with AU at or above the threshold (one node)")
    for col in ("workload", "path", "max N", "× s3_boto3", "AU at max", "GB/s", "samples/s", "CPU s/GB",
                "loader CPU s/GB"):
        table.add_column(col, justify="left" if col in ("workload", "path") else "right", no_wrap=True)
    by = {(s["workload"], s["path"]): s for s in out["summary"]}

    def f(v, spec):
        return "—" if v is None else format(v, spec)

    for s in sorted(out["ceiling_summary"] + out["summary"], key=lambda s: list(out["workloads"]).index(s["workload"])):
        base = by.get((s["workload"], "s3_boto3"))
        ratio = (s["max_accelerators_au_ok"] / base["max_accelerators_au_ok"]
                 if base and base["max_accelerators_au_ok"] else None)
        label = "memory (ceiling)" if s["path"] == "memory" else s["path"]
        table.add_row(s["workload"], label, str(s["max_accelerators_au_ok"]), f(ratio, ".1f"),
                      f(s["au"], ".1%"), f(s["gbps"], ".3f"), f(s["samples_per_s"], ",.0f"),
                      f(s["cpu_s_per_gb"], ".2f"), f(s["client_cpu_s_per_gb"], ".2f"))
    console.print(table)
    for sk in out["skipped"]:
        console.print(f"  skipped {sk['path']}{' (' + sk['workload'] + ')' if 'workload' in sk else ''}: "
                      f"{sk['reason']}")
    for t in out["targets"]:
        verdict = "[green]met[/]" if t["met"] else "[yellow]inconclusive[/]" if t.get("inconclusive") else \
            "[red]NOT met[/]"
        console.print(f"  {verdict}: {t['target']} {t['compare']} {t['want']} (got {t['got']})"
                      + (f": {t['inconclusive']}" if t.get("inconclusive") else ""))


def summary_line(out: dict) -> str:
    """One line: the largest N per workload and path."""
    parts = []
    for wl in out["workloads"]:
        ns = [f"{s['path']} {s['max_accelerators_au_ok']}" for s in out["summary"] if s["workload"] == wl]
        parts.append(f"{wl} (scale {out['workloads'][wl]['scale']:g}): " + ", ".join(ns))
    met = sum(t["met"] for t in out["targets"])
    unsure = sum(bool(t.get("inconclusive")) for t in out["targets"])
    return ("train: largest N at AU ok: " + "; ".join(parts)
            + f"; targets met {met}/{len(out['targets'])}" + (f" ({unsure} inconclusive)" if unsure else ""))
