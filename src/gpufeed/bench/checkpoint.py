"""``gpufeed bench checkpoint``: DCP saves through gpufeed vs DCP's own
``FileSystemWriter``, side by side in one run, then ten LoRA-style versions.

State dict: a stack of ``Linear(hidden, hidden)`` layers in fp32 plus AdamW's
``exp_avg`` / ``exp_avg_sq`` (about a third each), ``--size`` bytes in all.

Rows (``results``):

* ``gpufeed``: ``dcp.save`` with :class:`gpufeed.ai.dcp.Writer` to a fresh
  prefix of a local node (shared-memory transport; the node fsyncs every object
  before it acknowledges it), so every chunk is really written: no dedup help.
* ``gpufeed_tcp``: the same over the TCP transport.
* ``dcp_fs``: ``dcp.save`` with ``FileSystemWriter(dir, thread_count=T)`` to a
  fresh local folder (``sync_files=True``, its default, fsyncs each file), one
  row per ``T`` in :data:`FS_THREAD_COUNTS` (``thread_count=1`` is its default),
  then one row with the best ``T`` and DCP's own background staging
  (``async_save(..., async_stager=DefaultStager(...))`` without pinned or shared
  memory, which need CUDA; only its asynchronous steps, since ``dcp.save`` does
  not stage). Every row names its ``setting``.

The peer at its best (``peer_best``): the highest ``save_gbps`` and the least
``async_block_s`` over the ``dcp_fs`` rows, each with its setting. Every row's
``save_vs_peer_best`` and ``async_block_vs_peer_best`` compare with those (the
ratios that count); ``save_vs_peer_default`` with ``thread_count=1``.

``save_gbps`` = state-dict bytes / best synchronous save seconds (``sync_s``);
``async_block_s`` = how long one training step that checkpoints is stalled by
the save: ``async_save`` at the top of the step (``async_return_s``, until it
returns), forward and backward on a batch of 8 (``step_compute_s``), then the wait
for the staging copy before ``optimizer.step()`` may mutate the state dict
(``staging_wait_s``); best of the repetitions after a warm-up save. gpufeed's
Writer stages in a background thread (``background_staging=True``), so the copy
overlaps forward/backward; ``dcp_fs`` stages blocking inside ``async_save`` (its
default), so its stall is ``async_return_s``; with DCP's ``DefaultStager`` it stages in
a background thread too. The stall does not count how much
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

    {"benchmark": "checkpoint", "command": "...", "machine": {...},
     "params": {"size_bytes", "memcpy_gbps", ...},
     "results": [{"path": "gpufeed"|"gpufeed_tcp"|"dcp_fs", "setting", "threads",
                  "save_gbps", "sync_s",  # None in the async-stager row
                  "async_block_s", "async_return_s", "staging_wait_s", "step_compute_s",
                  "async_block_first_s", "background_staging", "sync_all_s",
                  "async_steps": [{"return_s", "compute_s", "wait_s", "stall_s", ...}],
                  "save_vs_peer_best", "save_vs_peer_default", "async_block_vs_peer_best"}],
     "peer_best": {"save": {"setting", "save_gbps"}, "async_stall": {"setting", "async_block_s"},
                   "default": {"setting", "save_gbps", "async_block_s"}},
     "dedup": {"versions", "physical_ratio", "last_save_written_ratio",
               "version_bytes", "physical_bytes", "written_bytes"}}

GB/s are 10^9 bytes per second.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from ._output import BenchProgress, summary_line, write_json
from .io import machine_info

__all__ = ["run_checkpoint_bench", "build_state", "FS_THREAD_COUNTS"]

GB = 1e9
BUCKET = "bench-ckpt"
#: ``FileSystemWriter(thread_count=...)`` settings swept (1 is its default).
FS_THREAD_COUNTS = (1, 2, 4, 8)
#: The ``dcp_fs`` async-stager row's stager, as its setting names it.
ASYNC_STAGER = ("DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, "
                "use_async_staging=True, use_non_blocking_copy=False))")


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
        repeat: synchronous saves per row (the best is reported); asynchronous
            steps per row are ``repeat + 1`` (the first is a warm-up).
        json_path: write the JSON here.
        data_dir: where the node data and the FileSystemWriter folders go
            (default: a fresh temporary folder, removed after).
        paths: subset of ``["gpufeed", "gpufeed_tcp", "dcp_fs"]`` (``dcp_fs``: every
            setting of :data:`FS_THREAD_COUNTS` and the async stager).
        quiet: print nothing.
    """
    import torch
    from rich.console import Console

    from ..client import Client
    from ..testing.node import start_node

    paths = paths or ["gpufeed", "gpufeed_tcp", "dcp_fs"]
    console = Console(quiet=quiet, width=max(Console().width, 150))
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpufeed-bench-ckpt-")
        data_dir = tmp.name
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    progress = BenchProgress("checkpoint", quiet=quiet or None).start()
    progress.step("start node")
    node = start_node(root / "node")
    results: list[dict] = []
    dedup: dict = {}
    load_avg = [round(os.getloadavg()[0], 2)]  # at the start and the end: other work on the machine
    try:
        clients = {"gpufeed": Client(node.shm_url, **node.credentials),
                   "gpufeed_tcp": Client(node.tcp_url, **node.credentials)}
        clients["gpufeed"].create_bucket(BUCKET)
        console.print(f"[bold]gpufeed bench checkpoint[/]: building a {size / GB:.2f} GB state dict ...")
        progress.step("build the state dict")
        model, opt = build_state(size)
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        total = _nbytes(sd)
        memcpy_gbps = _memcpy_gbps()
        x = torch.randn(8, model[0].in_features, generator=torch.Generator().manual_seed(2))
        bench = _Saves(root, node, clients, sd, model, opt, x, repeat, console)
        bench.step = progress.step
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            for path in paths:
                if path != "dcp_fs":
                    results.append(bench.row(path, "Writer; async: background_staging=True"))
                    continue
                fs_rows = [bench.row(path, f"thread_count={t}", threads=t) for t in FS_THREAD_COUNTS]
                results += fs_rows
                t_best = max(fs_rows, key=lambda r: r["save_gbps"])["threads"]
                results.append(bench.row(path, f"thread_count={t_best}, async_stager={ASYNC_STAGER}",
                                         threads=t_best, stager=True))

            console.print(f"  LoRA: {versions} versions, rank {lora_rank} ...")
            progress.step(f"LoRA: {versions} versions")
            dedup = _lora_versions(model, versions, lora_rank, f"{node.tcp_url}/{BUCKET}/lora",
                                   clients["gpufeed"])
        for c in clients.values():
            c.close()
    finally:
        progress.close()
        node.stop()
        if tmp is not None:
            tmp.cleanup()

    load_avg.append(round(os.getloadavg()[0], 2))
    peer_best = _peer_best(results)
    _add_ratios(results, peer_best)
    out = {"benchmark": "checkpoint",
           "command": f"gpufeed bench checkpoint --size {size} --versions {versions} "
                      f"--lora-rank {lora_rank} --repeat {repeat} --paths {','.join(paths)}",
           "machine": machine_info(),
           "params": {"size_bytes": total, "memcpy_gbps": memcpy_gbps, "repeat": repeat, "best_of": repeat,
                      "async_steps_per_row": repeat + 1, "fsync": True,
                      "chunk_bytes": 16 << 20, "lora_rank": lora_rank, "load_avg_1m": load_avg,
                      "fs_writer": "FileSystemWriter(sync_files=True, thread_count=T), T in "
                                   f"{list(FS_THREAD_COUNTS)} (1 is its default), each with its "
                                   "default blocking staging; then the best T with "
                                   f"async_stager={ASYNC_STAGER}"},
           "results": results, "peer_best": peer_best, "dedup": dedup}
    _print(console, out, memcpy_gbps, repeat)
    if json_path:
        write_json(json_path, out)
        console.print(f"wrote {json_path}")
    progress.done(summary_line("checkpoint", out, json_path))
    return out


class _Saves:
    """Measures one row: ``repeat`` synchronous saves and ``repeat + 1`` training
    steps that ``async_save``, for one path and setting."""

    def __init__(self, root: Path, node, clients: dict, sd, model, opt, x, repeat: int,
                 console) -> None:
        self.root, self.node, self.clients, self.sd = root, node, clients, sd
        self.model, self.opt, self.x, self.repeat, self.say = model, opt, x, repeat, console.print
        self.counter = iter(range(1 << 30))
        self.step = BenchProgress("checkpoint", enabled=False).step  # the run's progress, when it has one

    def writer(self, path: str, background: bool = False, threads: int = 1):
        """A fresh storage writer for ``path`` and a function that removes what it wrote."""
        import torch.distributed.checkpoint as dcp

        from ..ai.checkpoint import checkpoints
        from ..ai.dcp import Writer

        if path == "dcp_fs":
            folder = self.root / f"fs-{next(self.counter)}"
            w = dcp.FileSystemWriter(folder, thread_count=threads)
            assert w.sync_files, "FileSystemWriter must fsync (sync_files=True is its default)"
            return w, lambda: shutil.rmtree(folder, ignore_errors=True)
        client = self.clients[path]
        url = f"{self.node.tcp_url}/{BUCKET}/{path}-{next(self.counter)}"
        writer = Writer(url, client=client, step=0, background_staging=background)

        def cleanup() -> None:
            cps = checkpoints(url, client=client)
            for s in cps.steps():
                cps.delete(s)
        return writer, cleanup

    def row(self, path: str, setting: str, threads: int = 1, stager: bool = False) -> dict:
        """Measure ``path`` at ``setting``; with ``stager`` only the asynchronous steps
        (``dcp.save`` does not stage, so its synchronous saves equal the row without it)."""
        import torch.distributed.checkpoint as dcp

        sync: list[float] = []
        if not stager:
            self.say(f"  {path} ({setting}): synchronous saves ...")
            advance = self.step(f"{path} ({setting}): synchronous saves", total=self.repeat)
            for _ in range(self.repeat):
                w, cleanup = self.writer(path, threads=threads)
                t0 = time.perf_counter()
                dcp.save(self.sd, storage_writer=w, no_dist=True)
                sync.append(time.perf_counter() - t0)
                cleanup()
                advance(1)
        self.say(f"  {path} ({setting}): async saves inside training steps ...")
        self.step(f"{path} ({setting}): async saves in training steps")
        steps = []
        dcp_stager = _async_stager() if stager else None
        w, cleanup = self.writer(path, background=True, threads=threads)
        for i in range(self.repeat + 1):  # the first stages into new memory
            if path != "dcp_fs":
                w.reset(i)  # same Writer (keeps its staging buffers), next step
            else:
                cleanup()
                w, cleanup = self.writer(path, threads=threads)
            steps.append(_train_step_with_async_save(dcp, self.sd, w, self.model, self.opt, self.x,
                                                     stager=dcp_stager))
            if path != "dcp_fs":
                cleanup()  # a fresh prefix for the next one: all chunks are written again
        cleanup()
        if path != "dcp_fs":
            w.close()
        if dcp_stager is not None:
            dcp_stager.close()
        total = _nbytes(self.sd)
        steady = min(steps[1:], key=lambda r: r["stall_s"]) if len(steps) > 1 else steps[0]
        return {"path": path, "setting": setting, "threads": threads if path == "dcp_fs" else None,
                "save_gbps": total / min(sync) / GB if sync else None,
                "sync_s": min(sync) if sync else None,
                "async_block_s": steady["stall_s"], "async_return_s": steady["return_s"],
                "staging_wait_s": steady["wait_s"], "step_compute_s": steady["compute_s"],
                "async_block_first_s": steps[0]["stall_s"],
                "background_staging": steady["background"], "sync_all_s": sync, "async_steps": steps}


def _async_stager():
    """DCP's own background stager, as far as it runs without CUDA (no pinned or
    shared memory, no non-blocking copies); it keeps its staged copies between saves."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                        use_async_staging=True, use_non_blocking_copy=False))


def _peer_best(results: list[dict]) -> dict:
    """The ``dcp_fs`` rows' best save GB/s and least ``async_save`` stall, each with
    its setting, and the default setting's figures."""
    fs = [r for r in results if r["path"] == "dcp_fs"]
    if not fs:
        return {}
    saves = [r for r in fs if r["save_gbps"] is not None]
    best_save = max(saves, key=lambda r: r["save_gbps"])
    best_stall = min(fs, key=lambda r: r["async_block_s"])
    default = next(r for r in fs if r["setting"] == "thread_count=1")
    return {"save": {"setting": best_save["setting"], "save_gbps": best_save["save_gbps"]},
            "async_stall": {"setting": best_stall["setting"],
                            "async_block_s": best_stall["async_block_s"]},
            "default": {"setting": default["setting"], "save_gbps": default["save_gbps"],
                        "async_block_s": default["async_block_s"]}}


def _add_ratios(results: list[dict], best: dict) -> None:
    """Every row's save GB/s over the best peer setting's (``save_vs_peer_best``) and
    over the peer's default (``save_vs_peer_default``); its stall over the best
    peer stall (``async_block_vs_peer_best``: lower is better)."""
    if not best:
        return
    for r in results:
        r["save_vs_peer_best"] = (r["save_gbps"] / best["save"]["save_gbps"]
                                  if r["save_gbps"] is not None else None)
        r["save_vs_peer_default"] = (r["save_gbps"] / best["default"]["save_gbps"]
                                     if r["save_gbps"] is not None else None)
        r["async_block_vs_peer_best"] = r["async_block_s"] / best["async_stall"]["async_block_s"]


def _print(console, out: dict, memcpy_gbps: float, repeat: int) -> None:
    from rich.table import Table

    results, dedup, total = out["results"], out["dedup"], out["params"]["size_bytes"]
    table = Table(title=f"gpufeed bench checkpoint — {total / GB:.2f} GB state dict (best of {repeat})")
    for col in ("path", "setting", "save GB/s", "sync s", "stall s", "stall/sync",
                "× peer best", "stall × peer best"):
        table.add_column(col, justify="left" if col in ("path", "setting") else "right", no_wrap=True)

    def f(v, spec):
        return "—" if v is None else format(v, spec)

    for r in results:
        setting = r["setting"].replace(ASYNC_STAGER, "DefaultStager(async)")
        table.add_row(r["path"], setting, f(r["save_gbps"], ".2f"), f(r["sync_s"], ".2f"),
                      f(r["async_block_s"], ".3f"),
                      f(r["async_block_s"] / r["sync_s"] if r["sync_s"] else None, ".1%"),
                      f(r.get("save_vs_peer_best"), ".2f"), f(r.get("async_block_vs_peer_best"), ".3f"))
    console.print(table)
    best = out["peer_best"]
    if best:
        console.print(f"dcp_fs at its best: {best['save']['save_gbps']:.2f} GB/s ({best['save']['setting']}); "
                      f"least stall {best['async_stall']['async_block_s']:.3f} s "
                      f"({best['async_stall']['setting']})", soft_wrap=True)
    console.print(f"memcpy on this machine now: {memcpy_gbps:.1f} GB/s (blocking staging: async_save "
                  f"blocks for one copy of the state dict; background staging overlaps it with "
                  f"forward/backward)")
    if dedup:
        console.print(f"LoRA versions: {dedup['versions']}, one version {dedup['version_bytes'] / GB:.3f} GB; "
                      f"stored {dedup['physical_ratio']:.3f} × one version; "
                      f"the last save wrote {dedup['last_save_written_ratio']:.2%} of it")


def _train_step_with_async_save(dcp, sd, writer, model, opt, x, stager=None) -> dict:
    """One training step that checkpoints: ``async_save`` at the top (through
    ``stager`` when given), forward and backward, then (background staging) wait for
    the staging copy before ``optimizer.step()`` mutates the state dict; the upload
    is awaited after.

    ``stall_s`` = ``return_s`` (until ``async_save`` returns) + ``wait_s`` (waiting
    for staging before the step): the time the loop is held up by the save."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    t0 = time.perf_counter()
    kw = {"async_stager": stager} if stager is not None else {}
    resp = dcp.async_save(sd, storage_writer=writer, no_dist=True, **kw)
    t1 = time.perf_counter()
    model(x).square().mean().backward()
    t2 = time.perf_counter()
    background = isinstance(resp, AsyncSaveResponse)
    if background:
        resp.staging_completion.result()
        if hasattr(writer, "synchronize_staging"):  # gpufeed's Writer
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
        stats = writer.result
        assert stats is not None  # dcp.save returned: this writer finished a save
        written.append(stats.bytes_written)
        version_bytes = stats.bytes_total
    physical = checkpoints(url, client=client).physical_bytes()
    return {"versions": versions, "physical_ratio": physical / version_bytes,
            "last_save_written_ratio": written[-1] / version_bytes, "version_bytes": version_bytes,
            "physical_bytes": physical, "written_bytes": written,
            "adapter_fraction": (_nbytes(dict(adapters)) * 3) / version_bytes}
