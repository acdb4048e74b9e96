"""The peer loaders of ``gpufeed bench model`` and their settings sweeps.

runai-model-streamer (``SafetensorsStreamer``) and fastsafetensors
(``SafeTensorsFileLoader``), each measured at every setting that changes how it
reads on a CPU host: runai's ``RUNAI_STREAMER_CONCURRENCY`` (read when a
streamer is created) under each ``RUNAI_STREAMER_FS_STRATEGY`` (fixed once per
process, so one fresh interpreter per strategy), fastsafetensors'
``max_threads`` (copier threads). The model benchmark reports every setting as
a row and compares with the fastest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypedDict

from .demo import PathResult

__all__ = ["RUNAI_SETTINGS", "RUNAI_DEFAULT_CONCURRENCY", "FST_THREADS"]

#: runai-model-streamer settings: (RUNAI_STREAMER_FS_STRATEGY or None for unset,
#: RUNAI_STREAMER_CONCURRENCY values); the library's default is (None, 16).
RUNAI_SETTINGS = ((None, (16, 1, 2, 4, 8)), ("sync_buffered", (16, 1, 2, 4, 8)))
RUNAI_DEFAULT_CONCURRENCY = 16
#: fastsafetensors ``max_threads`` values (16, its default, first).
FST_THREADS = (16, 1, 2, 4, 8)


def _runai(paths: list[str], credentials=None) -> dict:
    from runai_model_streamer import SafetensorsStreamer

    out: dict = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(paths, s3_credentials=credentials, device="cpu")
        for name, tensor in streamer.get_tensors():
            out[name] = tensor
    return out


class _FastSafetensors:
    """fastsafetensors on CPU without GDS; tensors view its buffer until close()."""

    def __init__(self, files: list[Path], max_threads: int = 16) -> None:
        self.files = [str(f) for f in files]
        self.max_threads = max_threads
        self.open: list = []

    def __call__(self) -> dict:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True, max_threads=self.max_threads)
        loader.add_filenames({0: self.files})
        fb = loader.copy_files_to_device()
        self.open.append((fb, loader))
        return {k: fb.get_tensor(k) for k in fb.key_to_rank_lidx}

    def close(self) -> None:
        for fb, loader in self.open:
            fb.close()
            loader.close()
        self.open.clear()


def _peer_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in ("runai-model-streamer", "fastsafetensors", "boto3"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


# runai-model-streamer at several concurrencies under one read strategy (fixed
# once per process, so one interpreter per strategy). Prints one JSON line:
# [{"concurrency", "runs": [[wall s, CPU s], ...], "verified"}].
_RUNAI_SWEEP = r"""
import gc, json, os, sys, time
from gpufeed.bench._device import same_tensors
from gpufeed.bench.demo import _touch
from gpufeed.bench.io import drop_cache
from gpufeed.bench.peers import _runai
spec = json.loads(sys.argv[1])
files = spec["files"]
for f in files:  # page-cache the files (cold runs drop them before each run)
    with open(f, "rb") as fh:
        while fh.read(64 << 20):
            pass
_runai(files)  # the first call in a process sets the library up (~1 s): untimed
ref = {}
if spec["cache"] == "warm":
    from safetensors.torch import load_file
    for f in files:
        ref.update(load_file(f))
rows = []
for conc, runs in spec["concurrency"]:
    os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(conc)
    times, verified = [], None
    for i in range(runs):
        if spec["cache"] == "cold":
            drop_cache(files)
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        out = _runai(files)
        _touch(out)
        t1, c1 = time.perf_counter(), time.process_time()
        if i == 0 and ref:
            verified = same_tensors(ref, out)
        del out
        times.append([t1 - t0, c1 - c0])
    rows.append({"concurrency": conc, "runs": times, "verified": verified})
print("\n" + json.dumps(rows))
"""


def _runai_sweep(files: list[Path], cache: str, nbytes: int, runs: int,
                 sweep_runs: int, settings=RUNAI_SETTINGS) -> list[tuple[PathResult, str]]:
    """runai over the local files at every setting of ``settings`` (shaped as
    :data:`RUNAI_SETTINGS`), in one fresh interpreter per read strategy; the
    default setting gets ``runs`` runs, the others ``sweep_runs``.

    Returns:
        ``(result, setting)`` per setting, ``setting`` naming the strategy asked
        for, the one the library resolved (from its log) and the concurrency.

    Raises:
        RuntimeError: the subprocess failed, or a load differed from the files.
    """
    import re
    import subprocess
    import sys

    out = []
    for strategy, concurrencies in settings:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RUNAI_STREAMER_FS_STRATEGY", "RUNAI_STREAMER_CONCURRENCY")}
        if strategy:
            env["RUNAI_STREAMER_FS_STRATEGY"] = strategy
        env.update(RUNAI_STREAMER_LOG_TO_STDERR="1", RUNAI_STREAMER_LOG_LEVEL="INFO")
        spec = {"files": [str(f) for f in files], "cache": cache,
                "concurrency": [(c, runs if strategy is None and c == RUNAI_DEFAULT_CONCURRENCY
                                 else sweep_runs) for c in concurrencies]}
        proc = subprocess.run([sys.executable, "-c", _RUNAI_SWEEP, json.dumps(spec)],
                              capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode:
            raise RuntimeError(f"runai sweep ({strategy or 'default strategy'}) failed: "
                               f"{proc.stderr[-2000:]}")
        found = re.search(r"Filesystem strategy: (\S+)", proc.stderr)
        resolved = found.group(1) if found else "not logged"
        for r in json.loads(proc.stdout.strip().splitlines()[-1]):
            if r["verified"] is False:
                raise RuntimeError("runai loaded tensors that differ from the model files")
            wall, cpu = min(r["runs"])
            setting = (f"RUNAI_STREAMER_FS_STRATEGY={strategy or 'unset'} (resolved: {resolved}), "
                       f"RUNAI_STREAMER_CONCURRENCY={r['concurrency']}")
            method = ('runai-model-streamer SafetensorsStreamer.stream_files(device="cpu"), '
                      f"{setting}; a fresh interpreter per strategy, first call untimed")
            out.append((PathResult("runai", method, wall, nbytes / 1e9 / wall, cpu / (nbytes / 1e9),
                                   cpu, 0.0, [t for t, _ in r["runs"]], nbytes, r["verified"]),
                        setting))
    return out


class _ResultRow(TypedDict):
    """One row of ``gpufeed bench model``'s ``results`` (see :mod:`gpufeed.bench.model`)."""

    path: str
    cache: str  # "warm" or "cold"
    setting: str | None  # a swept peer's setting; None where the path has none
    best_setting: bool | None
    seconds: float
    gbps: float
    cpu_s_per_gb: float
    runs_s: list[float]
    verified: bool | None
    method: str


def _mark_best_settings(rows: list[_ResultRow]) -> None:
    """``best_setting`` = True on each swept path's fastest row per cache, False on
    its other rows (None where a path has no settings)."""
    for r in rows:
        if r["setting"] is not None:
            same = [o for o in rows if o["path"] == r["path"] and o["cache"] == r["cache"]]
            r["best_setting"] = r is max(same, key=lambda o: o["gbps"])


def _best_peer_settings(results: list[PathResult], tags: list) -> dict:
    """Each swept peer's fastest warm setting as ``{path: (environment, setting)}``
    for the fresh-process loads."""
    out: dict = {}
    for path in ("runai", "fastsafetensors"):
        warm = [(r, t[1]) for r, t in zip(results, tags) if r.path == path and t[0] == "warm"]
        if not warm:
            continue
        best, setting = max(warm, key=lambda rs: rs[0].gbps)
        if path == "fastsafetensors":
            env = {"GPUFEED_BENCH_FST_THREADS": setting.split("=")[1]}
        else:  # "RUNAI_STREAMER_FS_STRATEGY=X (resolved: Y), RUNAI_STREAMER_CONCURRENCY=N"
            strategy = setting.split(",")[0].split("=")[1].split(" ")[0]
            env = {"RUNAI_STREAMER_CONCURRENCY": setting.rsplit("=", 1)[1]}
            if strategy != "unset":
                env["RUNAI_STREAMER_FS_STRATEGY"] = strategy
        out[path] = (env, setting)
    return out
