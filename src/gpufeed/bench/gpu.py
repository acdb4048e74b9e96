"""``gpufeed bench gpu``: the demo model, a checkpoint and KV, loaded into one device.

A check to run on a machine with CUDA (``scripts/gpu-check.sh`` sets it up and
runs it). On ``cuda:N`` every row ends with the data in that GPU's memory and
a ``torch.cuda.synchronize``; with ``device="cpu"`` (the CPU fallback, run in
CI) the same code runs every row into CPU memory.

1. Build the demo's Llama (:mod:`gpufeed.bench.demo`: random bf16 weights,
   sharded safetensors plus index; cached in the work folder), start a node,
   upload it, page-cache the files and the node's copies.
2. Load every tensor into the device, ``repeat`` times per path, fastest kept;
   the first run of each path is compared bit for bit, on the device, with the
   files' tensors:

   * ``shm``: :func:`gpufeed.ai.load_safetensors` over ``gpufeed+shm://``, the
     node writing into two pinned host staging slots that are copied into one
     device buffer (on CPU the same staged code, into one ``torch.empty``);
   * ``tcp``: the same over ``gpufeed+tcp://``;
   * ``shm_map``: ``load_safetensors(zero_copy=True)`` (tensors map the node's
     page cache) then ``.to(device)`` per tensor (pageable memory; on CPU
     nothing is copied);
   * ``s3``: boto3 ``get_object`` per shard (4 at a time), ``safetensors.torch.load``,
     ``.to(device)`` (:func:`gpufeed.bench.demo._load_s3`);
   * ``load_file``: ``safetensors.torch.load_file(f, device=...)`` of the local
     files, the faster of ``backend="mmap"`` and ``"pread"`` (on CPU: ``pread``
     and mmap + ``.clone()``, as the demo, since mmap alone reads nothing);
   * ``fastsafetensors``: ``SafeTensorsFileLoader(device=..., nogds=True)``
     (where installed);
   * ``runai``: runai-model-streamer ``stream_files`` into CPU memory, then
     ``.to(device)``, as vLLM uses it (where installed);
   * ``host_to_device``: one copy of a pinned host buffer of the model's size
     into device memory (on CPU: a memcpy between touched buffers): the limit.

3. Checkpoint from device memory (:func:`gpufeed.ai.save` / :func:`gpufeed.ai.load`
   over shm): ``checkpoint_save`` (synchronous save of a copy of the weights
   held on the device), ``checkpoint_async_save`` (the weights changed in place,
   then an asynchronous save: ``block_s`` is how long the call held the caller,
   ``seconds`` until committed), ``checkpoint_load`` (the last step restored to
   the device, compared with the device tensors).
4. KV: a ``[2, layers, tokens, kv_heads, head_dim]`` bf16 tensor shaped for the
   model, random, on the device: ``kv_put`` (:class:`gpufeed.ai.kvcache.KVCacheStore`
   ``put`` + ``flush``), ``kv_reload_shm`` / ``kv_reload_tcp`` (``get_into`` a
   landing buffer, pinned on CUDA, then one copy into a device tensor),
   compared with the stored tensor.

JSON::

    {"benchmark": "gpu", "command": "...", "device": {"device", "name", "torch",
     "cuda", ...}, "machine": {...}, "model": {...}, "params": {...},
     "results": [{"path", "kind": "load"|"limit"|"checkpoint"|"kv", "seconds",
                  "gbps", "bytes", "runs_s", "verified", "method", ...}],
     "failures": [...], "notes": [...], "total_s"}

``failures`` is empty when every gpufeed row ran and put exactly the stored
bytes on the device; ``gpufeed bench gpu`` then exits 0, otherwise 1.

GB means 10**9 bytes.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._device import bits_equal, device_info, pinned, resolve_device, same_tensors, sync
from ._output import BenchProgress, summary_line, write_json
from .demo import (  # the demo's model, upload and loaders: one definition of each
    BUCKET,
    MODEL_SIZES,
    _build_model,
    _load_local_clone,
    _load_local_pread,
    _load_s3,
    _Meter,
    _readinto,
    _shard_files,
    _upload,
)
from .io import machine_info
from .model import _missing
from .peers import _FastSafetensors, _peer_versions, _runai

__all__ = ["run_gpu_bench", "resolve_device", "PATHS"]

#: Load paths, in table order.
PATHS = ["shm", "tcp", "shm_map", "s3", "load_file", "fastsafetensors", "runai", "host_to_device"]
#: The paths through gpufeed (a failure there fails the check).
OURS = ("shm", "tcp", "shm_map", "s3")
#: Host staging slot for the ``shm``/``tcp`` loads (what ``load_safetensors`` uses on CUDA).
STAGING_BYTES = 64 << 20  # 64 MiB
#: The whole check, model build included, should finish within this on one GPU.
BUDGET_S = 300
CKPT_BUCKET = "gpu-check"
KV_BUCKET = "gpu-check-kv"


def _to(out: dict, dev) -> dict:
    """Every tensor of ``out`` on ``dev`` (the same tensors when already there)."""
    return {k: v.to(dev) for k, v in out.items()}


class _FastSafetensorsTo(_FastSafetensors):
    """fastsafetensors straight into ``device`` without GDS (its own pinned bounce buffer)."""

    def __init__(self, files: list[Path], device) -> None:
        super().__init__(files)
        self.device = str(device)

    def __call__(self) -> dict:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        loader = SafeTensorsFileLoader(SingleGroup(), self.device, nogds=True)
        loader.add_filenames({0: self.files})
        fb = loader.copy_files_to_device()
        self.open.append((fb, loader))
        return {k: fb.get_tensor(k) for k in fb.key_to_rank_lidx}


def _load_file_to(files: list[Path], dev, backend: str) -> dict:
    """``load_file`` of every shard into ``dev``; on CPU ``mmap`` is read with a clone."""
    if dev.type == "cpu":
        return _load_local_pread(files) if backend == "pread" else _load_local_clone(files)
    from safetensors.torch import load_file

    out: dict = {}
    for f in files:
        # "mmap" is the default: not named, so a safetensors without backend= works too
        out.update(load_file(f, device=str(dev), **({} if backend == "mmap" else
                                                     {"backend": backend})))
    return out


def _rows_of(result, kind: str, **extra) -> dict:
    """A JSON row from a :class:`gpufeed.bench.demo.PathResult`."""
    return {"path": result.path, "kind": kind, "seconds": round(result.seconds, 4),
            "gbps": round(result.gbps, 3), "bytes": result.nbytes,
            "runs_s": [round(s, 4) for s in result.runs_s], "verified": result.verified,
            "cpu_s_per_gb": round(result.cpu_s_per_gb, 3), "method": result.method, **extra}


def _row(path: str, kind: str, seconds: float, nbytes: int, method: str, verified=None,
         **extra) -> dict:
    return {"path": path, "kind": kind, "seconds": round(seconds, 4),
            "gbps": round(nbytes / seconds / 1e9, 3), "bytes": nbytes, "runs_s": [round(seconds, 4)],
            "verified": verified, "method": method, **extra}


# --- the load paths --------------------------------------------------------------------
def _load_rows(node, prefix: str, files: list[Path], reference: dict, nbytes: int, dev,
               paths: list[str], repeat: int, meter: _Meter, notes: list[str],
               failures: list[str], say) -> list[dict]:
    """One row per load path in ``paths`` (see the module docstring); a gpufeed path
    that fails or loads wrong bytes goes to ``failures``, a peer that fails to ``notes``."""
    from ..ai import load_safetensors
    from ..client import Client

    def check(out: Any) -> bool:
        if not same_tensors(reference, out):
            raise RuntimeError("tensors loaded into the device differ from the model files")
        return True

    def synced(fn):
        def run():
            out = fn()
            sync(dev)
            return out
        return run

    cuda = dev.type == "cuda"
    staging = None if cuda else STAGING_BYTES  # CPU: the same staged code as CUDA
    where = "pinned host staging slots -> one device buffer" if cuda else \
        "two host staging slots -> one torch.empty buffer (the CUDA code path, on CPU)"
    rows: list[dict] = []
    fst = _FastSafetensorsTo(files, dev)
    clients = {"shm": Client(node.shm_url, **node.credentials), "tcp": Client(node.tcp_url, **node.credentials)}
    s3 = node.boto3_client() if "s3" in paths else None
    try:
        loaders = {
            "shm": (f"gpufeed.ai.load_safetensors(device={str(dev)!r}) over gpufeed+shm: {where}",
                    lambda: load_safetensors(clients["shm"], BUCKET, prefix, device=dev,
                                             staging_bytes=staging)),
            "tcp": (f"gpufeed.ai.load_safetensors(device={str(dev)!r}) over gpufeed+tcp: {where}",
                    lambda: load_safetensors(clients["tcp"], BUCKET, prefix, device=dev,
                                             staging_bytes=staging)),
            "shm_map": ("gpufeed.ai.load_safetensors(zero_copy=True) over gpufeed+shm (maps the "
                        "node's page cache), then .to(device) per tensor"
                        + ("" if cuda else " (a no-op on CPU: nothing copied)"),
                        lambda: _to(load_safetensors(clients["shm"], BUCKET, prefix,
                                                     zero_copy=True), dev)),
            "s3": ("boto3 get_object().read() per shard (4 at a time) + safetensors.torch.load, "
                   "then .to(device)", lambda: _to(_load_s3(s3, prefix), dev)),
            "fastsafetensors": (f"fastsafetensors SafeTensorsFileLoader(device={str(dev)!r}, "
                                f"nogds=True) of the local files", fst),
            "runai": ('runai-model-streamer SafetensorsStreamer.stream_files(device="cpu") of the '
                      'local files, then .to(device)',
                      lambda: _to(_runai([str(f) for f in files]), dev)),
        }
        for path in paths:
            say(f"  {path} ...")
            try:
                if path == "host_to_device":
                    rows.append(_limit_row(nbytes, dev, repeat, meter))
                elif path == "load_file":
                    rows.append(_load_file_row(files, dev, nbytes, repeat, meter, check, notes))
                else:
                    method, run = loaders[path]
                    rows.append(_rows_of(meter.measure(
                        path, method, nbytes, repeat, synced(run), check=check,
                        cleanup=fst.close if path == "fastsafetensors" else None), "load"))
            except Exception as exc:  # recorded; the other paths still run
                fst.close()
                if path in OURS:
                    failures.append(f"{path}: {type(exc).__name__}: {exc}")
                else:  # a peer failing is a finding about the peer
                    notes.append(f"{path}: failed: {type(exc).__name__}: {exc}")
    finally:
        fst.close()
        for c in clients.values():
            c.close()
        if s3 is not None:
            s3.close()
    return rows


def _load_file_row(files, dev, nbytes, repeat, meter, check, notes: list[str]) -> dict:
    """``load_file`` to the device, the faster of its two backends (mmap only where
    this safetensors has no ``backend=``)."""
    import inspect

    from safetensors.torch import load_file

    backends = ["mmap", "pread"]
    if "backend" not in inspect.signature(load_file).parameters:
        backends = ["mmap"]
        notes.append("load_file: this safetensors has no backend=; mmap only")
    got = []
    for backend in backends:
        name = ("safetensors load_file (mmap) + .clone()" if dev.type == "cpu" and backend == "mmap"
                else f'safetensors load_file(device={str(dev)!r}, backend="{backend}")')

        def run(backend=backend):
            out = _load_file_to(files, dev, backend)
            sync(dev)
            return out
        got.append(meter.measure("load_file", name, nbytes, repeat, run, check=check))
    best, *other = sorted(got, key=lambda r: r.seconds)
    if other:
        best.method += f" (faster than {other[0].method}: {other[0].gbps:.2f} GB/s)"
    return _rows_of(best, "load")


def _limit_row(nbytes: int, dev, repeat: int, meter: _Meter) -> dict:
    """One copy of the model's bytes from (pinned) host memory into the device."""
    import torch

    cuda = dev.type == "cuda"
    src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.zeros(nbytes, dtype=torch.uint8, device=dev)

    def run():
        dst.copy_(src, non_blocking=cuda)
        sync(dev)

    method = ("one copy_ of a pinned host buffer into device memory (the host-to-device limit)"
              if cuda else "one copy_ between two touched host buffers (memcpy: the CPU limit)")
    return _rows_of(meter.measure("host_to_device", method, nbytes, repeat, run, touch=False),
                    "limit")


# --- checkpoint and KV -------------------------------------------------------------------
def _checkpoint_rows(rows: list[dict], node, reference: dict, nbytes: int, dev, repeat: int,
                     meter: _Meter, say) -> None:
    """Save a copy of the weights held on ``dev``, change them, save again
    asynchronously, and restore each step to ``dev`` (see the module docstring)."""
    import torch

    from ..ai import load, save

    url = f"{node.shm_url}/{CKPT_BUCKET}/run"
    with torch.no_grad():
        sd: dict[str, Any] = {"model": {k: v.clone() for k, v in reference.items()}, "step": 0}

    def check(out) -> bool:  # the step restored to the device is the one saved
        if not (out["step"] == sd["step"] and same_tensors(sd["model"], out["model"])):
            raise RuntimeError(f"checkpoint step {sd['step']} restored to the device differs "
                               f"from the one saved")
        return True

    def run():
        out = load(url, step=sd["step"], device=dev)
        sync(dev)
        return out

    sync(dev)
    say("  checkpoint_save ...")
    t0 = time.perf_counter()
    res = save(sd, url, step=0, async_=False).result()
    seconds = time.perf_counter() - t0
    rows.append(_row("checkpoint_save", "checkpoint", seconds, nbytes,
                     f"gpufeed.ai.save(async_=False) of a state dict on {dev} (read to host, "
                     f"chunked, BLAKE3-named, written over gpufeed+shm; the node fsyncs)",
                     verified=check(run()), bytes_written=res.bytes_written))

    say("  checkpoint_async_save ...")
    with torch.no_grad():
        for t in sd["model"].values():
            t.add_(1)  # every chunk new: nothing deduplicated
    sd["step"] = 1
    sync(dev)
    t0 = time.perf_counter()
    fut = save(sd, url, step=1)
    block_s = time.perf_counter() - t0
    res = fut.result()
    rows.append(_row("checkpoint_async_save", "checkpoint", time.perf_counter() - t0, nbytes,
                     "gpufeed.ai.save (async): blocks for the copy to host, uploads in the "
                     "background; seconds until committed", bytes_written=res.bytes_written,
                     block_s=round(block_s, 4)))

    say("  checkpoint_load ...")
    res = meter.measure("checkpoint_load", f"gpufeed.ai.load(device={str(dev)!r}) of the async "
                        f"step: chunks read into host memory, BLAKE3-verified, moved to the device",
                        nbytes, repeat, run, check=check, touch=False)
    rows.append(_rows_of(res, "checkpoint"))


def _kv_rows(rows: list[dict], node, config: dict, tokens: int, dev, repeat: int, meter: _Meter,
             say) -> None:
    """Store a device KV tensor and reload it into the device over shm and tcp."""
    import torch

    from ..ai.kvcache import KVCacheStore

    layers, kv_heads = config["num_hidden_layers"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    shape = (2, layers, tokens, kv_heads, head_dim)
    gen = torch.Generator(device=dev).manual_seed(3)
    kv = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(torch.bfloat16)
    ids = torch.randint(0, config["vocab_size"], (tokens,), generator=torch.Generator().manual_seed(4))
    nbytes = kv.numel() * kv.element_size()
    args = dict(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, dtype="bfloat16",
                bucket=KV_BUCKET, cpu_tier_bytes=0)
    say("  kv_put ...")
    with KVCacheStore(node.shm_url, "gpu-check", **args) as store:
        sync(dev)
        t0 = time.perf_counter()
        store.put(ids, kv)
        store.flush()
        rows.append(_row("kv_put", "kv", time.perf_counter() - t0, nbytes,
                         f"KVCacheStore.put of a {list(shape)} bf16 tensor on {dev} + flush, "
                         f"over gpufeed+shm"))
        tokens = store.lookup(ids)
    for transport, url in (("shm", node.shm_url), ("tcp", node.tcp_url)):
        say(f"  kv_reload_{transport} ...")
        with KVCacheStore(url, "gpu-check", **args) as store, store.landing(tokens) as land, \
                pinned(land, dev) as is_pinned:
            out = torch.empty(land.shape, dtype=land.dtype, device=dev)

            def run(out: torch.Tensor = out):
                got = store.get_into(ids[:tokens], land)
                if got != tokens:
                    raise RuntimeError(f"KV reload found {got} of {tokens} tokens")
                out.copy_(land, non_blocking=is_pinned)
                sync(dev)
                return out

            def check(got) -> bool:
                if not bits_equal(kv[:, :, :tokens].contiguous(), got):
                    raise RuntimeError("KV reloaded into the device differs from the KV stored")
                return True

            res = meter.measure(
                f"kv_reload_{transport}",
                f"KVCacheStore.lookup'd prefix: get_into a landing buffer over gpufeed+{transport}"
                f" (checksums verified){', page-locked' if is_pinned else ''}, one copy_ into the "
                f"device", tokens * nbytes // kv.shape[2], repeat, run, check=check, touch=False)
            rows.append(_rows_of(res, "kv", tokens=tokens))


# --- main --------------------------------------------------------------------------------
def _print_report(console, report: dict) -> None:
    from rich.table import Table

    m, d = report["model"], report["device"]
    table = Table(title=f"gpufeed bench gpu: {m['bytes'] / 1e9:.2f} GB bf16 Llama ({m['shards']} "
                        f"shards) into {d['device']} ({d['name']}); best of "
                        f"{report['params']['repeat']}")
    for col in ("path", "kind", "seconds", "GB/s", "vs load_file", "identical"):
        table.add_column(col, justify="left" if col in ("path", "kind") else "right")
    for r in report["results"]:
        ok = "n/a" if r["verified"] is None else ("yes" if r["verified"] else "NO")
        ratio = r.get("vs_load_file")
        table.add_row(r["path"], r["kind"], f"{r['seconds']:.3f}", f"{r['gbps']:.2f}",
                      "-" if ratio is None else f"{ratio:.2f}x", ok)
    console.print(table)
    for r in report["results"]:
        extra = f"; blocked {r['block_s']:.3f} s" if "block_s" in r else ""
        console.print(f"  {r['path']}: {r['method']}{extra}", soft_wrap=True)
    for n in report["notes"]:
        console.print(f"note: {n}", soft_wrap=True)
    for f in report["failures"]:
        console.print(f"[red]FAILED[/] {f}", soft_wrap=True)
    console.print(f"total {report['total_s']:.1f} s")


def _import_all(paths: list[str]) -> None:
    """Import what the rows use before the first is timed (and before ``gc.freeze``)."""
    import importlib

    for path, module in (("checkpoint", "gpufeed.ai.dcp"), ("kv", "gpufeed.ai.kvcache"),
                         ("fastsafetensors", "fastsafetensors"), ("runai", "runai_model_streamer"),
                         ("s3", "boto3")):
        if path in ("checkpoint", "kv") or path in paths:
            importlib.import_module(module)


def _skipped_paths(paths: list[str], notes: list[str]) -> list[str]:
    """``paths`` less the peers that are not installed (each noted)."""
    keep = []
    for path in paths:
        module = {"fastsafetensors": "fastsafetensors", "runai": "runai_model_streamer",
                  "s3": "boto3"}.get(path)
        if module and _missing(module):
            notes.append(f"{path}: skipped, {module} is not installed (pip install 'gpufeed[bench]')")
            continue
        keep.append(path)
    return keep


def run_gpu_bench(device: str = "cuda:0", size: str = "1gb",
                  workdir: str | os.PathLike = ".gpufeed-demo",
                  json_path: str | os.PathLike | None = None, *, repeat: int = 3,
                  kv_tokens: int = 8192, paths: list[str] | None = None,
                  checkpoint: bool = True, console=None) -> dict:
    """Load the demo model, a checkpoint and KV into ``device`` every way; print, return JSON.

    Args:
        device: ``"cuda:N"`` or ``"cpu"`` (the CPU fallback); see :func:`resolve_device`.
        size: the demo's model size, ``"1gb"`` (~1.02 GB) or ``"small"`` (~57 MB).
        workdir: the demo's work folder (the model is built there once and
            reused); the node's data goes to a temporary folder inside it, removed after.
        json_path: also write the report here.
        repeat: runs per load path, checkpoint load and KV reload (the fastest is kept).
        kv_tokens: tokens of KV stored and reloaded (rounded down to whole
            256-token chunks; 0 skips the KV rows).
        paths: a subset of :data:`PATHS` (default all; peers not installed are
            skipped with a note).
        checkpoint: measure the checkpoint rows.
        console: a ``rich.console.Console`` (default: a new one).

    Returns:
        The report (see the module docstring). ``failures`` lists every gpufeed
        path or section that raised or put different bytes on the device than
        were stored (model tensors, checkpoint, KV); the other rows still run.
        A peer (load_file, fastsafetensors, runai) that fails is a note.

    Raises:
        ValueError: unknown size or path, a bad device, ``repeat < 1``.
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"size must be one of {sorted(MODEL_SIZES)}, not {size!r}")
    if repeat < 1 or kv_tokens < 0:
        raise ValueError("repeat must be >= 1 and kv_tokens >= 0")
    asked = list(paths or PATHS)
    unknown = set(asked) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown paths {sorted(unknown)}; choose from {PATHS}")
    import torch
    from rich.console import Console

    from ..ai import gds_status

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    console = console or Console()
    t_start = time.perf_counter()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = [f"GPUDirect Storage: {gds_status()}"]
    failures: list[str] = []
    paths = _skipped_paths(asked, notes)
    kv_tokens = kv_tokens // 256 * 256
    progress = BenchProgress("gpu").start()
    say = progress.announcing(console.print)  # each "  <row> ..." line is a phase
    try:
        progress.step(f"model ({size})")
        model, files, reference = _model(size, workdir, dev, say)
        progress.step("start node, upload, warm the page cache")
        rows = _measure(model, files, reference, dev, workdir, paths, repeat, kv_tokens, checkpoint,
                        notes, failures, say)
    finally:
        progress.close()
    del reference
    base = next((r["gbps"] for r in rows if r["path"] == "load_file"), None)
    for r in rows:
        if base and r["kind"] == "load":
            r["vs_load_file"] = round(r["gbps"] / base, 2)
    total_s = time.perf_counter() - t_start
    if total_s > BUDGET_S:
        notes.append(f"took {total_s:.0f} s: over the check's {BUDGET_S} s budget")
    report = {
        "benchmark": "gpu",
        "command": f"gpufeed bench gpu --device {dev} --size {size} --repeat {repeat} "
                   f"--kv-tokens {kv_tokens}" + ("" if checkpoint else " --no-checkpoint")
                   + (f" --paths {','.join(asked)}" if set(asked) != set(PATHS) else ""),
        "device": device_info(dev),
        "machine": {**machine_info(), **_peer_versions()},
        "model": model,
        "params": {"repeat": repeat, "keep": "fastest run", "kv_tokens": kv_tokens,
                   "page_cache": "warm (files and node blobs read once first)"},
        "results": rows,
        "failures": failures,
        "notes": notes,
        "total_s": round(total_s, 1),
    }
    _print_report(console, report)
    if json_path:
        write_json(json_path, report)
        console.print(f"wrote {json_path}")
    progress.done(summary_line("gpu", report, json_path) + (f", {len(failures)} failed" if failures else ""))
    return report


def _model(size: str, workdir: Path, dev, say) -> tuple[dict, list[Path], dict]:
    """Build (or reuse) the demo model; its description, shard files, and its
    tensors on ``dev`` to check against (on CPU: mapped from the files)."""
    from safetensors.torch import load_file

    spec = _build_model(size, workdir / f"model-{size}", say)
    files = _shard_files(workdir / f"model-{size}")
    reference: dict = {}
    for f in files:
        reference.update(load_file(f))  # mmap
    if dev.type != "cpu":
        reference = {k: v.to(dev) for k, v in reference.items()}
    model = {"architecture": "LlamaForCausalLM", "size": size, "dtype": "bfloat16",
             "config": spec["config"], "tensors": len(reference),
             "bytes": sum(t.numel() * t.element_size() for t in reference.values()),
             "file_bytes": sum(f.stat().st_size for f in files), "shards": len(files)}
    return model, files, reference


def _measure(model: dict, files: list[Path], reference: dict, dev, workdir: Path,
             paths: list[str], repeat: int, kv_tokens: int, checkpoint: bool,
             notes: list[str], failures: list[str], say) -> list[dict]:
    """Start a node, store the model, and measure every row (see the module docstring)."""
    from ..client import Client
    from ..testing.node import start_node

    nbytes, prefix = model["bytes"], f"llama-{model['size']}/"
    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-", dir=workdir))
    node = start_node(tmp / "node")
    rows: list[dict] = []
    # The meter collects garbage around every run (untimed); with torch and
    # transformers loaded one full collection takes 0.2-0.3 s here. Objects alive
    # now are not the garbage it is after: leave them out of those collections.
    _import_all(paths)
    gc.collect()
    gc.freeze()
    try:
        with Client(node.shm_url, **node.credentials) as up:
            _upload(up, files[0].parent, prefix)
        scratch = memoryview(bytearray(model["file_bytes"]))  # page-cache files and node copies
        _readinto(files, scratch)
        with Client(node.tcp_url, **node.credentials) as c:
            for f in files:
                c.get_into(BUCKET, prefix + f.name, scratch[:f.stat().st_size])
        del scratch
        meter = _Meter(node.pid)
        say(f"[bold]gpufeed bench gpu[/]: {nbytes / 1e9:.2f} GB into {dev}")
        rows += _load_rows(node, prefix, files, reference, nbytes, dev, paths, repeat, meter,
                           notes, failures, say)
        sections: list[tuple[str, object, Callable[..., None], tuple]] = [
            ("checkpoint", checkpoint, _checkpoint_rows, (reference, nbytes)),
            ("kv", kv_tokens, _kv_rows, (model["config"], kv_tokens))]
        for name, wanted, section, args in sections:
            try:
                if wanted:
                    section(rows, node, *args, dev, repeat, meter, say)
            except Exception as exc:  # recorded; the other sections still run
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        gc.unfreeze()
        code = node.stop()
        if code != 0:
            notes.append(f"node exited with {code}")
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
