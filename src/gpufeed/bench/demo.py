"""``gpufeed demo``: store a Llama model in gpufeed and load it every way.

What it does, end to end:

1. Build a Llama-architecture model with random bf16 weights from a
   ``transformers.LlamaConfig`` and ``save_pretrained`` it as sharded
   safetensors plus an index (cached in the work folder for reruns).
2. Start a node on a fresh data folder, upload the model folder through the
   fast-path client (the same objects are then readable over S3).
3. With every file page-cached (one warm-up read first), load every tensor:

   * ``shm``: :func:`gpufeed.ai.load_safetensors` over ``gpufeed+shm://``
     (server ``preadv`` straight into the client's tensor memory);
   * ``tcp``: the same over ``gpufeed+tcp://`` (``sendfile`` -> ``recv_into``);
   * ``shm_map``: ``load_safetensors(..., zero_copy=True)``: tensors map the
     node's page cache copy-on-write, every page mapped in before return;
   * ``s3``: boto3 ``get_object().read()`` per shard (4 shards at a time),
     then ``safetensors.torch.load`` of the bytes;
   * ``local_load_file``: ``safetensors.torch.load_file`` of the local files
     with every tensor resident: ``backend="pread"`` and ``load_file`` +
     ``.clone()``; the faster is reported (``load_file`` alone maps the file
     and reads nothing);
   * ``readinto``: plain ``readinto`` of the same files into a preallocated,
     already-touched buffer in 64 MiB calls: the physical limit of this host.

   Each is run ``repeat`` times and the fastest run is kept; each timed run
   ends with a read of one byte per 4 KiB page of every tensor. Every path's
   tensors are checked bit for bit against the local files.
4. Print one table (seconds, GB/s, CPU seconds per GB for client + node,
   speed-up over S3) and write JSON.

GB means 10**9 bytes. CPU time: the client is this process
(``getrusage(RUSAGE_SELF)``, all threads), the node its subprocess
(``psutil.Process.cpu_times``).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ._device import same_tensors
from ._output import BenchProgress, summary_line, write_json
from .io import CpuMeter, machine_info

__all__ = ["run_demo", "MODEL_SIZES", "PathResult"]

#: LlamaConfig arguments and shard size per ``--size``.
MODEL_SIZES: dict[str, dict] = {
    "1gb": {  # 1.02 GB of bf16 weights, 6 shards
        "config": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                       vocab_size=32000, num_attention_heads=16, num_key_value_heads=8,
                       max_position_embeddings=2048, tie_word_embeddings=False),
        "max_shard_size": "200MB",
    },
    "small": {  # ~57 MB, 3 shards
        "config": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                       vocab_size=16000, num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=2048, tie_word_embeddings=False),
        "max_shard_size": "20MB",
    },
}

BUCKET = "models"
READ_CALL_BYTES = 64 << 20  # 64 MiB per readinto call
S3_CONCURRENCY = 4  # shards downloaded at once over S3


@dataclass
class PathResult:
    """One loading path's best run.

    Attributes:
        path: ``shm``, ``tcp``, ``s3``, ``local_load_file`` or ``readinto``.
        method: what exactly was timed.
        seconds: wall time of the fastest run, s.
        gbps: bytes / seconds / 1e9.
        cpu_s_per_gb: (client + node) CPU seconds of that run per GB.
        client_cpu_s, server_cpu_s: CPU seconds of that run.
        runs_s: wall time of every run, s.
        nbytes: bytes loaded per run.
        verified: tensors bit-identical to the local files (None: not applicable).
        ratio_vs_s3: GB/s divided by the S3 path's GB/s.
    """

    path: str
    method: str
    seconds: float
    gbps: float
    cpu_s_per_gb: float
    client_cpu_s: float
    server_cpu_s: float
    runs_s: list[float]
    nbytes: int
    verified: bool | None = None
    ratio_vs_s3: float | None = None
    extra: dict = field(default_factory=dict)


def _touch(out: object) -> None:
    """Read one byte of every 4 KiB page of every tensor in ``out`` (a dict of CPU
    tensors; anything else is left alone).

    Loaders differ in when a process first maps the pages it was given: a copy
    into fresh memory maps them during the load, memory the node shares is
    mapped on first use unless the loader prefaults it. Timing the load plus
    this touch charges every path for a result that is ready to use, so no
    loader looks faster by leaving page faults to the caller. Costs ~1 ms per
    GB when every page is already mapped.
    """
    if not isinstance(out, dict):
        return
    import torch

    for t in out.values():
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
            t.detach().reshape(-1).view(torch.uint8)[::4096].sum()


class _Meter:
    """Times runs of a loader and keeps the fastest with its CPU seconds."""

    def __init__(self, server_pid: int | None) -> None:
        self._cpu = CpuMeter(server_pid)

    def measure(self, name: str, method: str, nbytes: int, repeat: int, run: Callable[[], object],
                check: Callable[[Any], bool] | None = None,
                prepare: Callable[[], None] | None = None,
                cleanup: Callable[[], None] | None = None, touch: bool = True) -> PathResult:
        """Run ``run`` ``repeat`` times (``prepare``/``cleanup`` around each,
        untimed); ``check`` sees the first run's output. With ``touch`` the
        timed window includes :func:`_touch` of the output (one read per page)."""
        best: tuple[float, float, float] | None = None  # (seconds, client CPU s, server CPU s)
        runs = []
        verified = None
        for i in range(repeat):
            if prepare:
                prepare()
            gc.collect()
            c0, s0, t0 = self._cpu.self_s(), self._cpu.server_s(), time.perf_counter()
            out = run()
            if touch:
                _touch(out)
            t1, c1, s1 = time.perf_counter(), self._cpu.self_s(), self._cpu.server_s()
            if i == 0 and check is not None:
                verified = check(out)
            del out
            if cleanup:
                cleanup()
            gc.collect()
            runs.append(t1 - t0)
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, c1 - c0, s1 - s0)
        if best is None:
            raise ValueError(f"repeat must be >= 1, not {repeat}")
        seconds, client_s, server_s = best
        gb = nbytes / 1e9
        return PathResult(name, method, seconds, gb / seconds, (client_s + server_s) / gb,
                          client_s, server_s, runs, nbytes, verified)


# --- model -------------------------------------------------------------------------
def _build_model(size: str, model_dir: Path, say) -> dict:
    """Build and save the model unless ``model_dir`` already holds this exact one."""
    spec = MODEL_SIZES[size]
    stamp = model_dir / ".gpufeed-demo.json"
    want = {"size": size, **spec}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        say(f"model: reusing {model_dir}")
        return want
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if model_dir.exists():
        shutil.rmtree(model_dir)
    say(f"model: building a random bf16 Llama ({size}) ...")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = LlamaForCausalLM(LlamaConfig(**spec["config"]))
    finally:
        torch.set_default_dtype(old)
    model.save_pretrained(model_dir, max_shard_size=spec["max_shard_size"])
    del model
    gc.collect()
    stamp.write_text(json.dumps(want))
    say(f"model: built and saved to {model_dir} in {time.perf_counter() - t0:.1f} s")
    return want


def _shard_files(model_dir: Path) -> list[Path]:
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    return [model_dir / f for f in dict.fromkeys(index["weight_map"].values())]


def _upload(client, model_dir: Path, prefix: str, progress: BenchProgress | None = None) -> float:
    """Put every file of ``model_dir`` under ``prefix`` (a byte bar on ``progress``); returns seconds."""
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    try:
        client.create_bucket(BUCKET)
    except Exception as exc:  # BucketAlreadyOwnedByYou on a reused node
        if getattr(exc, "code", "") != "BucketAlreadyOwnedByYou":
            raise
    buf = client.alloc(max(p.stat().st_size for p in files))
    advance = (progress or BenchProgress("demo", enabled=False)).step(
        f"upload {len(files)} files", total=sum(p.stat().st_size for p in files), bytes_=True)
    t0 = time.perf_counter()
    for p in files:
        n = p.stat().st_size
        with open(p, "rb", buffering=0) as f:
            got = f.readinto(buf[:n])
        assert got == n, f"{p}: read {got} of {n} bytes"
        client.put(BUCKET, prefix + p.name, buf[:n])
        advance(n)
    return time.perf_counter() - t0


# --- loaders -------------------------------------------------------------------------
def _load_s3(s3, prefix: str) -> dict:
    from safetensors.torch import load

    index = json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + "model.safetensors.index.json")
                       ["Body"].read())
    keys = [prefix + f for f in dict.fromkeys(index["weight_map"].values())]

    def one(key: str) -> dict:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return load(body)

    out: dict = {}
    with ThreadPoolExecutor(S3_CONCURRENCY) as pool:
        for part in pool.map(one, keys):
            out.update(part)
    return out


def _load_local_pread(files: list[Path]) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in files:
        out.update(load_file(f, backend="pread"))
    return out


def _load_local_clone(files: list[Path]) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in files:
        out.update({k: v.clone() for k, v in load_file(f).items()})
    return out


def _readinto(files: list[Path], buf: memoryview) -> int:
    pos = 0
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while True:
                got = f.readinto(buf[pos:pos + READ_CALL_BYTES])
                if not got:
                    break
                pos += got
    return pos


# --- report --------------------------------------------------------------------------
def _print_table(console, results: list[PathResult], repeat: int, model: dict) -> None:
    from rich.table import Table

    table = Table(title=f"Loading {model['tensors']} tensors, {model['bytes'] / 1e9:.2f} GB "
                        f"({model['shards']} shards), page-cached; best of {repeat} runs")
    table.add_column("path")
    table.add_column("seconds", justify="right")
    table.add_column("GB/s", justify="right")
    table.add_column("CPU s/GB", justify="right")
    table.add_column("vs S3", justify="right")
    table.add_column("identical")
    for r in results:
        ratio = f"{r.ratio_vs_s3:.1f}x" if r.ratio_vs_s3 else "-"
        check = "n/a" if r.verified is None else ("[green]yes[/]" if r.verified else "[red]NO[/]")
        table.add_row(r.path, f"{r.seconds:.3f}", f"{r.gbps:.2f}", f"{r.cpu_s_per_gb:.2f}", ratio,
                      check)
    console.print(table)
    console.print("Best of the runs. CPU s/GB: client + node CPU seconds per GB loaded. Every "
                  "run returns new tensors; memory freed by earlier runs is reused (by the "
                  "allocator for local paths, by the client's pool for gpufeed). How each "
                  "path loads:")
    for r in results:
        runs = " ".join(f"{s:.2f}" for s in r.runs_s)
        console.print(f"  {r.path}: {r.method}; runs {runs} s", soft_wrap=True)


def _targets(by: dict[str, PathResult]) -> list[dict]:
    out = []
    for name, ours, other, want in (("shm vs local load_file", "shm", "local_load_file", 1.5),
                                    ("shm vs raw readinto", "shm", "readinto", 0.7),
                                    ("shm vs S3/HTTP", "shm", "s3", 3.0),
                                    ("shm zero-copy vs local load_file", "shm_map",
                                     "local_load_file", 1.5)):
        got = by[ours].gbps / by[other].gbps
        out.append({"target": name, "want": want, "got": round(got, 2), "met": got >= want})
    return out


def _next_steps(console, node, prefix: str) -> None:
    console.print(
        "\n[bold]Try it yourself[/]\n"
        "  gpufeed serve --data-dir ./gpufeed-data          "
        "# S3 on :9000, fast path on :9400 and a Unix socket\n"
        "  python -c \"import boto3; s3 = boto3.client('s3', endpoint_url='http://127.0.0.1:9000', "
        "aws_access_key_id='<key>', aws_secret_access_key='<secret>'); "
        "print(s3.list_buckets()['Buckets'])\"\n"
        "  python -c \"from gpufeed.ai import load_safetensors_url; "
        f"sd = load_safetensors_url('gpufeed+shm://./gpufeed-data/gpufeed.sock', '{BUCKET}/{prefix}')\"\n"
        "  gpufeed bench io --size 1GiB --cold             # raw read/write GB/s per data path\n"
        "  (keys: gpufeed serve prints them; env GPUFEED_ACCESS_KEY / GPUFEED_SECRET_KEY)"
    )


# --- main ------------------------------------------------------------------------------
def run_demo(size: str = "1gb", workdir: str | os.PathLike = ".gpufeed-demo",
             json_path: str | os.PathLike | None = None, *, repeat: int = 3,
             console=None) -> dict:
    """Build a Llama model, store it in gpufeed, load it every way and compare.

    Args:
        size: ``"1gb"`` (~1.02 GB bf16, 6 shards) or ``"small"`` (~57 MB, 3 shards).
        workdir: folder for the cached model files and the node's data (the
            node's data folder is recreated on each run).
        json_path: write the report here as JSON (see module docstring).
        repeat: runs per loading path; the fastest is kept.
        console: a ``rich.console.Console`` (default: a new one on stdout).

    Returns:
        The report (what the JSON file holds): ``benchmark``, ``machine``,
        ``model``, ``results`` (one dict per path: ``path``, ``seconds``,
        ``gbps``, ``cpu_s_per_gb``, ``ratio_vs_s3``, ``method``, ...), ``targets``.

    Raises:
        ValueError: unknown ``size``.
        RuntimeError: a path returned tensors that differ from the files, or
            the node failed to start.
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"size must be one of {sorted(MODEL_SIZES)}, not {size!r}")
    from rich.console import Console

    from ..ai import load_safetensors
    from ..client import Client
    from ..testing.node import start_node

    console = console or Console()
    t_start = time.perf_counter()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = workdir / f"model-{size}"
    say = console.print
    progress = BenchProgress("demo").start()
    try:
        progress.step(f"model ({size})")
        spec = _build_model(size, model_dir, say)
    except BaseException:
        progress.close()
        raise
    files = _shard_files(model_dir)
    from safetensors.torch import load_file

    reference: dict = {}
    for f in files:
        reference.update(load_file(f))  # mmap: lazy, for checking only
    nbytes = sum(t.numel() * t.element_size() for t in reference.values())
    file_bytes = sum(f.stat().st_size for f in files)
    model = {"architecture": "LlamaForCausalLM", "size": size, "dtype": "bfloat16",
             "config": spec["config"], "max_shard_size": spec["max_shard_size"],
             "tensors": len(reference), "bytes": nbytes, "file_bytes": file_bytes,
             "shards": len(files)}

    data_dir = workdir / f"node-{size}"
    if data_dir.exists():
        shutil.rmtree(data_dir)
    say(f"node: starting on {data_dir}")
    progress.step("start node")
    node = start_node(data_dir)
    results: list[PathResult] = []
    try:
        prefix = f"llama-{size}/"
        with Client(node.shm_url, **node.credentials) as up:
            upload_s = _upload(up, model_dir, prefix, progress)
        say(f"upload: {file_bytes / 1e9:.2f} GB through gpufeed+shm in {upload_s:.1f} s "
            f"({file_bytes / 1e9 / upload_s:.2f} GB/s)")

        # warm-up: local files and the node's copies into the page cache
        progress.step("warm the page cache")
        scratch = memoryview(bytearray(file_bytes))
        _readinto(files, scratch)
        with Client(node.tcp_url, **node.credentials) as c:
            for f in files:
                c.get_into(BUCKET, prefix + f.name, scratch[:f.stat().st_size])
        meter = _Meter(node.pid)

        def check(out: dict) -> bool:
            ok = same_tensors(reference, out)
            if not ok:
                raise RuntimeError("loaded tensors differ from the model files")
            return ok

        for path, url in (("shm", node.shm_url), ("tcp", node.tcp_url)):
            # One client for all runs, as in a serving process that loads (or swaps)
            # models: the first run pays for registering fresh shared memory
            # (~0.6 s/GB here); later runs reuse the pooled memory of the tensors
            # the previous run dropped, just as the local baseline reuses the
            # memory its allocator already holds. Every run is listed in "runs".
            client = Client(url, **node.credentials)
            try:
                say(f"measuring {path} ...")
                progress.step(f"measure {path}")
                results.append(meter.measure(
                    path, f"gpufeed.ai.load_safetensors over gpufeed+{path}, one client "
                          f"(first run includes registering fresh memory)", nbytes, repeat,
                    partial(load_safetensors, client, BUCKET, prefix),
                    check=check))
            finally:
                client.close()

        # Zero-copy: the tensors map the node's page cache (copy-on-write); every
        # page is mapped in before the call returns.
        client = Client(node.shm_url, **node.credentials)
        try:
            say("measuring shm_map (zero-copy) ...")
            progress.step("measure shm_map")
            results.append(meter.measure(
                "shm_map", "gpufeed.ai.load_safetensors(zero_copy=True) over gpufeed+shm: "
                           "tensors map the node's page cache copy-on-write", nbytes, repeat,
                partial(load_safetensors, client, BUCKET, prefix, zero_copy=True),
                check=check))
        finally:
            client.close()

        say("measuring s3 ...")
        progress.step("measure s3")
        s3 = node.boto3_client()
        try:
            results.append(meter.measure(
                "s3", f"boto3 get_object().read() per shard ({S3_CONCURRENCY} at a time) + "
                      f"safetensors.torch.load(bytes)", nbytes, repeat,
                lambda: _load_s3(s3, prefix), check=check))
        finally:
            s3.close()

        say("measuring local load_file ...")
        progress.step("measure local load_file")
        pread = meter.measure("local_load_file", 'safetensors load_file(backend="pread")', nbytes,
                              repeat, lambda: _load_local_pread(files), check=check)
        clone = meter.measure("local_load_file", "safetensors load_file (mmap) + .clone()", nbytes,
                              repeat, lambda: _load_local_clone(files), check=check)
        local, other = (pread, clone) if pread.seconds <= clone.seconds else (clone, pread)
        local.method += f" (faster than {other.method}: {other.gbps:.2f} GB/s)"
        local.extra["alternative"] = {"method": other.method, "seconds": other.seconds,
                                      "gbps": other.gbps, "cpu_s_per_gb": other.cpu_s_per_gb}
        results.append(local)

        say("measuring raw readinto ...")
        progress.step("measure raw readinto")
        # scratch was filled by the warm-up, so its pages are already touched
        results.append(meter.measure(
            "readinto", f"readinto of the files into one preallocated buffer, "
                        f"{READ_CALL_BYTES >> 20} MiB calls (physical limit)",
            file_bytes, repeat, lambda: _readinto(files, scratch)))
        scratch = memoryview(b"")  # release the buffer (the loaders that used it are done)
    finally:
        progress.close()
        code = node.stop()
        if code != 0:
            console.print(f"[yellow]node exited with {code}; log: {node.log_path}[/]")

    by = {r.path: r for r in results}
    s3_gbps = by["s3"].gbps
    for r in results:
        r.ratio_vs_s3 = r.gbps / s3_gbps
    _print_table(console, results, repeat, model)
    targets = _targets(by)
    for t in targets:
        mark = "[green]met[/]" if t["met"] else "[red]not met[/]"
        say(f"target {t['target']}: want >= {t['want']}x, got {t['got']}x: {mark}")
    _next_steps(console, node, prefix)
    report = {
        "benchmark": "demo",
        "command": f"gpufeed demo --size {size}",
        "machine": machine_info(),
        "model": model,
        "repeat": repeat,
        "keep": "fastest run per path",
        "upload_s": upload_s,
        "total_s": time.perf_counter() - t_start,
        "results": [{**asdict(r), "gbps": round(r.gbps, 3), "seconds": round(r.seconds, 4),
                     "cpu_s_per_gb": round(r.cpu_s_per_gb, 3),
                     "ratio_vs_s3": round(r.gbps / s3_gbps, 2)} for r in results],
        "targets": targets,
    }
    if json_path:
        write_json(json_path, report)
        say(f"wrote {json_path}")
    progress.done(summary_line("demo", report, json_path))
    return report


if __name__ == "__main__":  # pragma: no cover
    run_demo(sys.argv[1] if len(sys.argv) > 1 else "small", ".gpufeed-demo")
