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
     "notes": [...], "total_s"}

GB means 10**9 bytes.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .demo import (  # the demo's model, upload and loaders: one definition of each
    BUCKET,
    MODEL_SIZES,
    _bits_equal,
    _build_model,
    _load_local_clone,
    _load_local_pread,
    _load_s3,
    _Meter,
    _readinto,
    _same_tensors,
    _shard_files,
    _upload,
)
from .io import machine_info
from .model import _FastSafetensors, _missing, _peer_versions, _runai

__all__ = ["run_gpu_bench", "resolve_device", "PATHS"]

#: Load paths, in table order.
PATHS = ["shm", "tcp", "shm_map", "s3", "load_file", "fastsafetensors", "runai", "host_to_device"]
#: Host staging slot for the ``shm``/``tcp`` loads (what ``load_safetensors`` uses on CUDA).
STAGING_BYTES = 64 << 20  # 64 MiB
#: ``cudaHostRegisterPortable``.
_REGISTER_PORTABLE = 1
CKPT_BUCKET = "gpu-check"
KV_BUCKET = "gpu-check-kv"


def resolve_device(device: str | None, allow_cpu: bool = False) -> tuple[str | None, str]:
    """Pick the device to check, or say why there is none.

    Args:
        device: ``"cuda"``, ``"cuda:N"``, ``"cpu"`` or None (``cuda:0``).
        allow_cpu: without a usable CUDA device, fall back to ``"cpu"``.

    Returns:
        ``(device, why)``: ``device`` is None when a CUDA device was wanted and
        there is none (``why`` says why, e.g. a CPU build of torch); otherwise
        ``why`` is ``""`` or says that the CPU fallback was chosen.

    Raises:
        ValueError: ``device`` is neither ``cpu`` nor ``cuda[:N]``, or names a
            GPU this machine does not have.
    """
    wanted = device or "cuda:0"
    kind = wanted.split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], not {wanted!r}")
    if kind == "cpu":
        return "cpu", ""
    why = _cuda_missing()
    if why:
        return ("cpu", f"no CUDA device: {why}; running the CPU fallback") if allow_cpu else (None, why)
    import torch

    index = int(wanted.split(":", 1)[1]) if ":" in wanted else 0
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"--device {wanted}: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s)")
    return f"cuda:{index}", ""


def _cuda_missing() -> str:
    """Why CUDA cannot be used here ("" when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'gpufeed[ai]' with a CUDA build of torch)"
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU-only build (install a CUDA build of torch, "
                f"e.g. from https://download.pytorch.org/whl/)")
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU "
                f"(no device, no driver, or CUDA_VISIBLE_DEVICES hides them)")
    return ""


def _device_info(dev) -> dict:
    import torch

    info = {"device": str(dev), "torch": torch.__version__, "cuda": torch.version.cuda}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(name=props.name, memory_gib=round(props.total_memory / (1 << 30), 1),
                    capability=f"{props.major}.{props.minor}",
                    cudnn=torch.backends.cudnn.version(),
                    driver=_driver_version())
    else:
        info["name"] = "CPU fallback: every row lands in host memory"
    return info


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


# --- device helpers -------------------------------------------------------------------
def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _to(out: dict, dev) -> dict:
    """Every tensor of ``out`` on ``dev`` (the same tensors when already there)."""
    return {k: v.to(dev) for k, v in out.items()}


@contextlib.contextmanager
def _pinned(t, dev):
    """Page-lock ``t``'s memory (``cudaHostRegister``) for the block on CUDA, so a
    ``non_blocking`` copy to the GPU is one DMA; yields whether it is pinned."""
    import torch

    ok = False
    if dev.type == "cuda" and t.numel():
        ok = int(torch.cuda.cudart().cudaHostRegister(
            t.data_ptr(), t.numel() * t.element_size(), _REGISTER_PORTABLE)) == 0
    try:
        yield ok
    finally:
        if ok:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


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
        out.update(load_file(f, device=str(dev), backend=backend))
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
               paths: list[str], repeat: int, meter: _Meter, notes: list[str], say) -> list[dict]:
    """One row per load path in ``paths`` (see the module docstring)."""
    from ..ai import load_safetensors
    from ..client import Client

    def check(out: dict) -> bool:
        if not _same_tensors(reference, out):
            raise RuntimeError("tensors loaded into the device differ from the model files")
        return True

    def synced(fn):
        def run():
            out = fn()
            _sync(dev)
            return out
        return run

    cuda = dev.type == "cuda"
    staging = None if cuda else STAGING_BYTES  # CPU: the same staged code as CUDA
    where = "pinned host staging slots -> one device buffer" if cuda else \
        "two host staging slots -> one torch.empty buffer (the CUDA code path, on CPU)"
    rows: list[dict] = []
    fst = _FastSafetensorsTo(files, dev)
    clients = {"shm": Client(node.shm_url), "tcp": Client(node.tcp_url)}
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
            if path == "host_to_device":
                rows.append(_limit_row(nbytes, dev, repeat, meter))
                continue
            if path == "load_file":
                rows.append(_load_file_row(files, dev, nbytes, repeat, meter, check))
                continue
            method, run = loaders[path]
            try:
                res = meter.measure(path, method, nbytes, repeat, synced(run), check=check,
                                    cleanup=fst.close if path == "fastsafetensors" else None)
            except Exception as exc:  # a peer failing is a finding, not a crash
                if path in ("shm", "tcp", "shm_map", "s3"):
                    raise
                fst.close()
                notes.append(f"{path}: failed: {type(exc).__name__}: {exc}")
                continue
            rows.append(_rows_of(res, "load"))
    finally:
        fst.close()
        for c in clients.values():
            c.close()
        if s3 is not None:
            s3.close()
    return rows


def _load_file_row(files, dev, nbytes, repeat, meter, check) -> dict:
    """``load_file`` to the device, the faster of its two backends."""
    got = []
    for backend in ("mmap", "pread"):
        name = ("safetensors load_file (mmap) + .clone()" if dev.type == "cpu" and backend == "mmap"
                else f'safetensors load_file(device={str(dev)!r}, backend="{backend}")')

        def run(backend=backend):
            out = _load_file_to(files, dev, backend)
            _sync(dev)
            return out
        got.append(meter.measure("load_file", name, nbytes, repeat, run, check=check))
    best, other = sorted(got, key=lambda r: r.seconds)
    best.method += f" (faster than {other.method}: {other.gbps:.2f} GB/s)"
    return _rows_of(best, "load")


def _limit_row(nbytes: int, dev, repeat: int, meter: _Meter) -> dict:
    """One copy of the model's bytes from (pinned) host memory into the device."""
    import torch

    cuda = dev.type == "cuda"
    src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.zeros(nbytes, dtype=torch.uint8, device=dev)

    def run():
        dst.copy_(src, non_blocking=cuda)
        _sync(dev)

    method = ("one copy_ of a pinned host buffer into device memory (the host-to-device limit)"
              if cuda else "one copy_ between two touched host buffers (memcpy: the CPU limit)")
    res = meter.measure("host_to_device", method, nbytes, repeat, run, touch=False)
    del src, dst
    return _rows_of(res, "limit")


# --- checkpoint and KV -------------------------------------------------------------------
def _checkpoint_rows(node, reference: dict, nbytes: int, dev, repeat: int, meter: _Meter,
                     say) -> list[dict]:
    """Save a copy of the weights held on ``dev``, change them, save again
    asynchronously, and restore to ``dev`` (see the module docstring)."""
    import torch

    from ..ai import load, save

    url = f"{node.shm_url}/{CKPT_BUCKET}/run"
    with torch.no_grad():
        sd = {"model": {k: v.clone() for k, v in reference.items()}, "step": 0}
    _sync(dev)
    rows = []
    say("  checkpoint_save ...")
    t0 = time.perf_counter()
    res = save(sd, url, step=0, async_=False).result()
    rows.append(_row("checkpoint_save", "checkpoint", time.perf_counter() - t0, nbytes,
                     f"gpufeed.ai.save(async_=False) of a state dict on {dev} (read to host, "
                     f"chunked, BLAKE3-named, written over gpufeed+shm; the node fsyncs)",
                     bytes_written=res.bytes_written))

    say("  checkpoint_async_save ...")
    with torch.no_grad():
        for t in sd["model"].values():
            t.add_(1)  # every chunk new: nothing deduplicated
    sd["step"] = 1
    _sync(dev)
    t0 = time.perf_counter()
    fut = save(sd, url, step=1)
    block_s = time.perf_counter() - t0
    res = fut.result()
    rows.append(_row("checkpoint_async_save", "checkpoint", time.perf_counter() - t0, nbytes,
                     "gpufeed.ai.save (async): blocks for the copy to host, uploads in the "
                     "background; seconds until committed", bytes_written=res.bytes_written,
                     block_s=round(block_s, 4)))

    say("  checkpoint_load ...")

    def check(out) -> bool:
        ok = out["step"] == 1 and set(out["model"]) == set(sd["model"]) and all(
            _bits_equal(sd["model"][k], out["model"][k]) for k in sd["model"])
        if not ok:
            raise RuntimeError("the checkpoint restored to the device differs from the one saved")
        return True

    def run():
        out = load(url, step=1, device=dev)
        _sync(dev)
        return out

    first = load(url, step=0, device=dev)
    if not all(_bits_equal(reference[k], first["model"][k]) for k in reference):
        raise RuntimeError("checkpoint step 0 restored to the device differs from the one saved")
    del first
    res = meter.measure("checkpoint_load", f"gpufeed.ai.load(device={str(dev)!r}) of the async "
                        f"step: chunks read into host memory, BLAKE3-verified, moved to the device",
                        nbytes, repeat, run, check=check, touch=False)
    rows.append(_rows_of(res, "checkpoint"))
    del sd
    return rows


def _kv_rows(node, config: dict, tokens: int, dev, repeat: int, meter: _Meter,
             say) -> list[dict]:
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
    rows = []
    say("  kv_put ...")
    with KVCacheStore(node.shm_url, "gpu-check", **args) as store:
        _sync(dev)
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
                _pinned(land, dev) as pinned:
            out = torch.empty(land.shape, dtype=land.dtype, device=dev)

            def run():
                got = store.get_into(ids[:tokens], land)
                if got != tokens:
                    raise RuntimeError(f"KV reload found {got} of {tokens} tokens")
                out.copy_(land, non_blocking=pinned)
                _sync(dev)
                return out

            def check(got) -> bool:
                if not _bits_equal(kv[:, :, :tokens].contiguous(), got):
                    raise RuntimeError("KV reloaded into the device differs from the KV stored")
                return True

            res = meter.measure(
                f"kv_reload_{transport}",
                f"KVCacheStore.lookup'd prefix: get_into a landing buffer over gpufeed+{transport}"
                f" (checksums verified){', page-locked' if pinned else ''}, one copy_ into the "
                f"device", tokens * nbytes // kv.shape[2], repeat, run, check=check, touch=False)
            rows.append(_rows_of(res, "kv", tokens=tokens))
    return rows


# --- main --------------------------------------------------------------------------------
def _print_table(console, report: dict) -> None:
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
        The report (see the module docstring).

    Raises:
        ValueError: unknown size or path, a bad device, ``repeat < 1``.
        RuntimeError: data that reached the device differs from what was
            stored (model tensors, checkpoint or KV).
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"size must be one of {sorted(MODEL_SIZES)}, not {size!r}")
    if repeat < 1 or kv_tokens < 0:
        raise ValueError("repeat must be >= 1 and kv_tokens >= 0")
    paths = list(paths or PATHS)
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown paths {sorted(unknown)}; choose from {PATHS}")
    import torch
    from rich.console import Console

    from ..client import Client
    from ..testing.node import start_node

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    console = console or Console()
    say = console.print
    t_start = time.perf_counter()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    paths = _skipped_paths(paths, notes)
    spec = _build_model(size, workdir / f"model-{size}", say)
    files = _shard_files(workdir / f"model-{size}")
    from safetensors.torch import load_file

    reference: dict = {}
    for f in files:
        reference.update(load_file(f))  # mmap: read once below, for checking only
    reference = {k: v.to(dev) if dev.type == "cuda" else v for k, v in reference.items()}
    nbytes = sum(t.numel() * t.element_size() for t in reference.values())
    ntensors = len(reference)
    file_bytes = sum(f.stat().st_size for f in files)
    kv_tokens = kv_tokens // 256 * 256

    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-", dir=workdir))
    node = start_node(tmp / "node")
    rows: list[dict] = []
    try:
        prefix = f"llama-{size}/"
        with Client(node.shm_url) as up:
            _upload(up, workdir / f"model-{size}", prefix)
        scratch = memoryview(bytearray(file_bytes))  # page-cache the files and the node's copies
        _readinto(files, scratch)
        with Client(node.tcp_url) as c:
            for f in files:
                c.get_into(BUCKET, prefix + f.name, scratch[:f.stat().st_size])
        del scratch
        meter = _Meter(node.pid)
        say(f"[bold]gpufeed bench gpu[/]: {nbytes / 1e9:.2f} GB into {dev}")
        rows += _load_rows(node, prefix, files, reference, nbytes, dev, paths, repeat, meter,
                           notes, say)
        if checkpoint:
            rows += _checkpoint_rows(node, reference, nbytes, dev, repeat, meter, say)
        if kv_tokens:
            rows += _kv_rows(node, spec["config"], kv_tokens, dev, repeat, meter, say)
    finally:
        code = node.stop()
        if code != 0:
            notes.append(f"node exited with {code}")
        shutil.rmtree(tmp, ignore_errors=True)
    del reference
    gc.collect()

    base = next((r["gbps"] for r in rows if r["path"] == "load_file"), None)
    for r in rows:
        if base and r["kind"] == "load":
            r["vs_load_file"] = round(r["gbps"] / base, 2)
    total_s = time.perf_counter() - t_start
    report = {
        "benchmark": "gpu",
        "command": f"gpufeed bench gpu --device {dev} --size {size} --repeat {repeat} "
                   f"--kv-tokens {kv_tokens}" + ("" if checkpoint else " --no-checkpoint")
                   + (f" --paths {','.join(paths)}" if set(paths) != set(PATHS) else ""),
        "device": _device_info(dev),
        "machine": {**machine_info(), **_peer_versions()},
        "model": {"architecture": "LlamaForCausalLM", "size": size, "dtype": "bfloat16",
                  "config": spec["config"], "tensors": ntensors,
                  "bytes": nbytes, "file_bytes": file_bytes, "shards": len(files)},
        "params": {"repeat": repeat, "keep": "fastest run", "kv_tokens": kv_tokens,
                   "page_cache": "warm (files and node blobs read once first)"},
        "results": rows,
        "notes": notes,
        "total_s": round(total_s, 1),
    }
    _print_table(console, report)
    for n in notes:
        say(f"note: {n}", soft_wrap=True)
    say(f"total {total_s:.1f} s")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        say(f"wrote {json_path}")
    return report
