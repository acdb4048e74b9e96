"""``gpufeed bench checkpoint``: DCP saves through gpufeed vs DCP's own
``FileSystemWriter``, side by side in one run, then ten LoRA-style versions.

State dict: a stack of ``Linear(hidden, hidden)`` layers in fp32 plus AdamW's
``exp_avg`` / ``exp_avg_sq`` (about a third each), ``--size`` bytes in all.

Rows (``results``):

* ``gpufeed``: ``dcp.save`` with :class:`gpufeed.ai.dcp.Writer` to a fresh
  prefix of a local node (shared-memory transport; the node fsyncs every object
  before it acknowledges it), so every chunk is really written: no dedup help.
* ``gpufeed_tcp``: the same over the TCP transport.
* ``dcp_fs``: ``dcp.save`` with ``FileSystemWriter(dir)`` to a fresh local folder
  (defaults: ``sync_files=True`` fsyncs each file; ``thread_count=1``).

``save_gbps`` = state-dict bytes / best synchronous save seconds (``sync_s``);
``async_block_s`` = how long one training step that checkpoints is stalled by
the save: ``async_save`` at the top of the step (``async_return_s``, until it
returns), forward and backward on a batch of 8 (``step_compute_s``), then the wait
for the staging copy before ``optimizer.step()`` may mutate the state dict
(``staging_wait_s``); best of the repetitions after a warm-up save. gpufeed's
Writer stages in a background thread (``background_staging=True``), so the copy
overlaps forward/backward; ``dcp_fs`` stages blocking inside ``async_save`` (its
default), so its stall is ``async_return_s``. The stall does not count how much
the background copy and upload slow the step's compute on a small machine
(``step_compute_s``, per step in ``async_steps``). gpufeed's Writer keeps its
staging buffers between saves (``cache_staged_state_dict=True``);
``FileSystemWriter``'s cached staging pins memory and fails without CUDA, so it
stages into fresh memory each time (its default).

``dedup``: a frozen base (the same layers) with rank-``r`` LoRA adapters on every
layer; each version trains the adapters one AdamW step and saves through the
Writer to one prefix. ``physical_ratio`` = bytes stored under the prefix after
all versions / bytes of one version; ``last_save_written_ratio`` = bytes the
last save wrote / bytes of one version.

JSON::

    {"benchmark": "checkpoint", "machine": {...},
     "params": {"size_bytes", "memcpy_gbps", ...},
     "results": [{"path": "gpufeed"|"gpufeed_tcp"|"dcp_fs", "save_gbps", "sync_s",
                  "async_block_s", "async_return_s", "staging_wait_s", "step_compute_s",
                  "async_block_first_s", "background_staging", "sync_all_s",
                  "async_steps": [{"return_s", "compute_s", "wait_s", "stall_s", ...}]}],
     "dedup": {"versions", "physical_ratio", "last_save_written_ratio",
               "version_bytes", "physical_bytes", "written_bytes"}}

GB/s are 10^9 bytes per second.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from .io import machine_info

__all__ = ["run_checkpoint_bench", "build_state"]

GB = 1e9
BUCKET = "bench-ckpt"


def build_state(size: int, hidden: int = 2048):
    """A model + AdamW state of about ``size`` bytes (fp32).

    Returns:
        ``(model, optimizer)``; the optimizer has taken one step, so its
        ``exp_avg`` / ``exp_avg_sq`` exist and are non-zero.
    """
    import torch

    layer_bytes = (hidden * hidden + hidden) * 4 * 3  # weights + bias, and two AdamW moments
    layers = max(1, round(size / layer_bytes))
    torch.manual_seed(0)
    with torch.no_grad():
        model = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def _memcpy_gbps(nbytes: int = 256 << 20) -> float:
    """This machine's memcpy GB/s now (touched pages, best of 3): what staging for
    ``async_save`` can at best do, for reading ``async_block_s``."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / GB


def _nbytes(sd) -> int:
    import torch

    if isinstance(sd, torch.Tensor):
        return sd.numel() * sd.element_size()
    if isinstance(sd, dict):
        return sum(_nbytes(v) for v in sd.values())
    if isinstance(sd, (list, tuple)):
        return sum(_nbytes(v) for v in sd)
    return 0


def run_checkpoint_bench(*, size: int = 1 << 30, versions: int = 10, lora_rank: int = 4,
                         repeat: int = 2, json_path: str | None = None, data_dir: str | None = None,
                         paths: list[str] | None = None, quiet: bool = False) -> dict:
    """Run the checkpoint benchmark; print a table and return (and optionally write) the JSON.

    Args:
        size: state-dict bytes (model + AdamW state), default 1 GiB.
        versions: LoRA-style versions saved for the dedup figures.
        lora_rank: adapter rank ``r`` (adapters ``A: r x hidden``, ``B: hidden x r`` per layer).
        repeat: synchronous/asynchronous saves per path; the best is reported.
        json_path: write the JSON here.
        data_dir: where the node data and the FileSystemWriter folders go
            (default: a fresh temporary folder, removed after).
        paths: subset of ``["gpufeed", "gpufeed_tcp", "dcp_fs"]``.
        quiet: print nothing.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from rich.console import Console
    from rich.table import Table

    from ..ai.checkpoint import checkpoints
    from ..ai.dcp import Writer
    from ..client import Client
    from ..testing.node import start_node

    paths = paths or ["gpufeed", "gpufeed_tcp", "dcp_fs"]
    console = Console(quiet=quiet, width=max(Console().width, 110))
    tmp = tempfile.TemporaryDirectory(prefix="gpufeed-bench-ckpt-") if data_dir is None else None
    root = Path(tmp.name if tmp else data_dir)
    root.mkdir(parents=True, exist_ok=True)
    node = start_node(root / "node")
    results: list[dict] = []
    dedup: dict = {}
    try:
        clients = {"gpufeed": Client(node.shm_url), "gpufeed_tcp": Client(node.tcp_url)}
        clients["gpufeed"].create_bucket(BUCKET)
        console.print(f"[bold]gpufeed bench checkpoint[/]: building a {size / GB:.2f} GB state dict ...")
        model, opt = build_state(size)
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        total = _nbytes(sd)
        memcpy_gbps = _memcpy_gbps()
        counter = iter(range(1 << 30))

        x = torch.randn(8, model[0].in_features, generator=torch.Generator().manual_seed(2))

        def fresh_writer(path: str, background: bool = False):
            if path == "dcp_fs":
                folder = root / f"fs-{next(counter)}"
                w = dcp.FileSystemWriter(folder)
                assert w.sync_files, "FileSystemWriter must fsync (sync_files=True is its default)"
                return w, lambda: shutil.rmtree(folder, ignore_errors=True)
            client = clients[path]
            url = f"{node.tcp_url}/{BUCKET}/{path}-{next(counter)}"
            w = Writer(url, client=client, step=0, background_staging=background)

            def cleanup() -> None:
                cps = checkpoints(url, client=client)
                for s in cps.steps():
                    cps.delete(s)
            return w, cleanup

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            for path in paths:
                console.print(f"  {path}: synchronous saves ...")
                sync = []
                for _ in range(repeat):
                    w, cleanup = fresh_writer(path)
                    t0 = time.perf_counter()
                    dcp.save(sd, storage_writer=w, no_dist=True)
                    sync.append(time.perf_counter() - t0)
                    cleanup()
                console.print(f"  {path}: async saves inside training steps ...")
                rows = []
                w, cleanup = fresh_writer(path, background=True)
                for i in range(repeat + 1):  # the first stages into new memory
                    if path != "dcp_fs":
                        w.reset(i)  # same Writer (keeps its staging buffers), next step
                    else:
                        cleanup()
                        w, cleanup = fresh_writer(path)
                    rows.append(_train_step_with_async_save(dcp, sd, w, model, opt, x))
                    if path != "dcp_fs":
                        # a fresh prefix for the next one: all chunks are written again
                        cleanup()
                cleanup()
                if path != "dcp_fs":
                    w.close()
                best = min(sync)
                steady = min(rows[1:], key=lambda r: r["stall_s"]) if len(rows) > 1 else rows[0]
                results.append({"path": path, "save_gbps": total / best / GB, "sync_s": best,
                                "async_block_s": steady["stall_s"],
                                "async_return_s": steady["return_s"],
                                "staging_wait_s": steady["wait_s"],
                                "step_compute_s": steady["compute_s"],
                                "async_block_first_s": rows[0]["stall_s"],
                                "background_staging": steady["background"],
                                "sync_all_s": sync, "async_steps": rows})

            console.print(f"  LoRA: {versions} versions, rank {lora_rank} ...")
            dedup = _lora_versions(model, versions, lora_rank, f"{node.tcp_url}/{BUCKET}/lora",
                                   clients["gpufeed"])
        for c in clients.values():
            c.close()
    finally:
        node.stop()
        if tmp is not None:
            tmp.cleanup()

    out = {"benchmark": "checkpoint", "machine": machine_info(),
           "params": {"size_bytes": total, "memcpy_gbps": memcpy_gbps, "repeat": repeat, "best_of": repeat, "fsync": True,
                      "chunk_bytes": 16 << 20, "lora_rank": lora_rank,
                      "fs_writer": "FileSystemWriter(sync_files=True, thread_count=1)"},
           "results": results, "dedup": dedup}
    table = Table(title=f"gpufeed bench checkpoint — {total / GB:.2f} GB state dict (best of {repeat})")
    for col in ("path", "save GB/s", "sync s", "async blocks s", "block / sync", "× dcp_fs"):
        table.add_column(col, justify="right" if col != "path" else "left", no_wrap=True)
    fs = next((r for r in results if r["path"] == "dcp_fs"), None)
    for r in results:
        table.add_row(r["path"], f"{r['save_gbps']:.2f}", f"{r['sync_s']:.2f}", f"{r['async_block_s']:.3f}",
                      f"{r['async_block_s'] / r['sync_s']:.1%}",
                      f"{r['save_gbps'] / fs['save_gbps']:.2f}" if fs else "—")
    console.print(table)
    console.print(f"memcpy on this machine now: {memcpy_gbps:.1f} GB/s (blocking staging: async_save "
                  f"blocks for one copy of the state dict; background staging overlaps it with "
                  f"forward/backward)")
    if dedup:
        console.print(f"LoRA versions: {dedup['versions']}, one version {dedup['version_bytes'] / GB:.3f} GB; "
                      f"stored {dedup['physical_ratio']:.3f} × one version; "
                      f"the last save wrote {dedup['last_save_written_ratio']:.2%} of it")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=2))
        console.print(f"wrote {json_path}")
    return out


def _train_step_with_async_save(dcp, sd, writer, model, opt, x) -> dict:
    """One training step that checkpoints: ``async_save`` at the top, forward and
    backward, then (background staging) wait for the staging copy before
    ``optimizer.step()`` mutates the state dict; the upload is awaited after.

    ``stall_s`` = ``return_s`` (until ``async_save`` returns) + ``wait_s`` (waiting
    for staging before the step): the time the loop is held up by the save."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    t0 = time.perf_counter()
    resp = dcp.async_save(sd, storage_writer=writer, no_dist=True)
    t1 = time.perf_counter()
    model(x).square().mean().backward()
    t2 = time.perf_counter()
    background = isinstance(resp, AsyncSaveResponse)
    if background:
        resp.staging_completion.result()
        writer.synchronize_staging()  # re-raises a staging error torch's future may miss
    t3 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    (resp.upload_completion if background else resp).result()
    return {"return_s": t1 - t0, "compute_s": t2 - t1, "wait_s": t3 - t2,
            "stall_s": (t1 - t0) + (t3 - t2), "background": background}


def _lora_versions(base, versions: int, rank: int, url: str, client) -> dict:
    """Save ``versions`` LoRA-style versions (frozen base, adapters + AdamW changing)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from ..ai.checkpoint import checkpoints
    from ..ai.dcp import Writer

    for p in base.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    adapters = {}
    for name, mod in base.named_modules():
        if isinstance(mod, torch.nn.Linear):
            adapters[f"{name}.lora_A"] = torch.nn.Parameter(torch.randn(rank, mod.in_features, generator=g) * 0.01)
            adapters[f"{name}.lora_B"] = torch.nn.Parameter(torch.zeros(mod.out_features, rank))
    opt = torch.optim.AdamW(adapters.values(), lr=1e-3)
    writer = Writer(url, client=client)
    written, version_bytes = [], 0
    for v in range(versions):
        for p in adapters.values():
            p.grad = torch.randn(p.shape, generator=g) * 1e-3
        opt.step()
        opt.zero_grad(set_to_none=True)
        sd = {"base": base.state_dict(), "adapters": dict(adapters), "optim": opt.state_dict()}
        writer.reset(v)
        dcp.save(sd, storage_writer=writer, no_dist=True)
        written.append(writer.result.bytes_written)
        version_bytes = writer.result.bytes_total
    physical = checkpoints(url, client=client).physical_bytes()
    return {"versions": versions, "physical_ratio": physical / version_bytes,
            "last_save_written_ratio": written[-1] / version_bytes, "version_bytes": version_bytes,
            "physical_bytes": physical, "written_bytes": written,
            "adapter_fraction": (_nbytes(dict(adapters)) * 3) / version_bytes}
