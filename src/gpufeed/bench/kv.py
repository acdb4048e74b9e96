"""``gpufeed bench kv``: time to first token, recomputing a long prompt vs reloading its KV.

One run, one node, side by side:

* ``recompute``: plain ``model.generate`` over the whole prompt.
* ``in_memory``: the limit the cached rows chase: the same ``cached``-token
  prefix KV already in this process's memory (a ``DynamicCache`` of contiguous
  ``[1, H, n, D]`` tensors, as the reload builds, made before the clock starts),
  so only the suffix prefill is timed.
* ``cached_shm`` / ``cached_tcp``: the first ``cached`` tokens' KV (31 chunks
  of 256 of an 8,192-token prompt by default) reloaded from the node through
  :func:`gpufeed.ai.kvcache.generate_with_cache`'s path, the rest prefilled.
  ``reload_gbps`` is KV bytes / seconds of that path's read: one ``get_chunks``
  batch of every chunk the prompt could have (no separate lookup), checksums
  verified (CPU tier off, so every byte comes from the node), best of
  ``repeat``; ``reload_noverify_gbps`` the same without verification,
  ``reload_lookup_gbps`` with a ``lookup`` round trip first (how an engine that
  asks before it loads, such as a vLLM scheduler, would use it), and
  ``reload_scatter_gbps`` of ``get_into`` into one ``[2, L, T, H, D]`` tensor.
  ``ttft_vs_in_memory`` is the row's TTFT / ``in_memory_ttft_s``, the best
  in-memory TTFT of runs made alternately with the row's own (so that both see
  the same load on a shared machine; the ``targets`` entry wants at most 1.1),
  beside ``speedup`` (recompute TTFT / the row's TTFT). A cached row's TTFT is
  the best of ``repeat + 1`` runs (the first also warms up); the ``in_memory``
  row's is the best of all its runs (``runs``: its own ``repeat + 1`` and the
  alternating ones). ``node_cpu_s``: the node's CPU seconds during the row's
  best TTFT run (work that competes with the prefill on a small machine).
  ``params.load_avg_1m``: the machine's 1-minute load average at the start and
  the end.
* ``io_shm`` / ``io_tcp``: large-read GB/s of one ``io_size`` object on the
  same node (``Client.get_into``, best of ``repeat``): the yardstick for
  ``reload_gbps`` (``reload_vs_io`` in the cached rows).
* ``concurrent_shm`` / ``concurrent_tcp``: ``clients`` threads, each with its own
  client, doing ``lookup`` + ``get_into`` of its own ``concurrent_tokens``-token
  prefix ``rounds`` times: p50/p99 seconds to KV-ready and aggregate GB/s.

The model is a random-weight Llama from a ``LlamaConfig`` (default 8 layers,
hidden 1024, 16 heads / 8 KV heads), float32 so that token comparisons are
exact; a near-tie flip is reported by ``max_logit_diff`` of the first token.

JSON shape (as ``bench io``)::

    {"benchmark": "kv", "machine": {...}, "params": {...},
     "results": [{"path": "recompute"|"in_memory"|"cached_shm"|"cached_tcp", "ttft_s",
                  "reload_gbps", "same_output", "ttft_vs_in_memory", ...},
                 {"path": "io_shm"|..., "gbps"},
                 {"path": "concurrent_shm"|..., "p50_s", "p99_s", "aggregate_gbps"}],
     "targets": [{"target", "compare": "<=", "want", "got", "met"}]}

GB/s are 10^9 bytes per second.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from ._output import BenchProgress, summary_line, write_json
from .io import CpuMeter, machine_info

__all__ = ["run_kv_bench"]

GB = 1e9
BUCKET = "bench-kv"


class _FirstToken:
    """A generate streamer that records when the first new token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.t_first: float | None = None  # perf_counter() seconds

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.t_first is None:  # call 1 is the prompt
            self.t_first = time.perf_counter()

    def end(self) -> None:
        pass


def _generate(model, ids, new_tokens, cache=None):
    from transformers import DynamicCache  # noqa: F401 (the cache type generate expects)

    streamer = _FirstToken()
    kw = {"cache": cache} if cache is not None else {}
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, streamer=streamer,
                         return_dict_in_generate=True, output_logits=True, **kw)
    return out, streamer.t_first


def _prefix_cache(model, full_cache, n: int):
    """A ``DynamicCache`` of the first ``n`` tokens of ``full_cache`` (contiguous copies)."""
    from transformers import DynamicCache

    from ..ai.kvcache._hf import _fill_layer

    cache = DynamicCache(config=model.config)
    for i, lyr in enumerate(full_cache.layers):
        _fill_layer(cache, i, lyr.keys[:, :, :n].clone(), lyr.values[:, :, :n].clone())
    return cache


def _in_memory_ttft(model, ids, ref, n: int, new_tokens: int, runs: int) -> tuple[float, bool]:
    """Best TTFT (s) of ``runs`` generates with the first ``n`` tokens' KV already in
    memory (the cache is built before each clock starts), and whether the greedy
    tokens equal ``ref``'s."""
    best, same = float("inf"), True
    for _ in range(runs):
        cache = _prefix_cache(model, ref.cache, n)
        t0 = time.perf_counter()
        out, t_first = _generate(model, ids, new_tokens, cache)
        best = min(best, t_first - t0)
        same = same and bool(torch.equal(out.sequences, ref.sequences))
        del cache, out
    return best, same


def _io_gbps(client, size: int, repeat: int, region) -> float:
    dest = client.alloc(size) if client.transport == "shm" else np.zeros(size, np.uint8)
    best = float("inf")
    for _ in range(repeat + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        client.get_into(BUCKET, "io.bin", dest)
        best = min(best, time.perf_counter() - t0)
    return size / best / GB


def run_kv_bench(*, tokens: int = 8192, cached: int | None = None, layers: int = 8,
                 hidden: int = 1024, heads: int = 16, kv_heads: int = 8,
                 intermediate: int = 2816, vocab: int = 32000, new_tokens: int = 4,
                 dtype: str = "float32", repeat: int = 3, io_size: int = 1 << 30,
                 clients: int = 16, rounds: int = 4, concurrent_tokens: int = 2048,
                 chunk_tokens: int = 256, json_path: str | None = None,
                 data_dir: str | None = None, quiet: bool = False) -> dict:
    """Run the KV benchmark; print a table and return (optionally write) the JSON.

    Args:
        tokens: prompt length.
        cached: tokens whose KV is stored first (default: ``tokens - chunk_tokens``,
            rounded down to whole chunks).
        layers, hidden, heads, kv_heads, intermediate, vocab: the Llama config.
        new_tokens: greedy tokens generated and compared.
        dtype: model and KV dtype (``float32`` compares exactly).
        repeat: repetitions of reload and io reads (best kept).
        io_size: bytes of the large-read yardstick object (0 skips it).
        clients, rounds, concurrent_tokens: the concurrency test (clients 0 skips it).
        chunk_tokens: tokens per KV chunk.
        json_path: write the JSON here.
        data_dir: node data folder (default: a temporary folder).
    """
    from rich.console import Console
    from rich.table import Table
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..ai.kvcache import store_for_model
    from ..ai.kvcache._hf import _load_cache
    from ..client import Client
    from ..testing.node import start_node

    console = Console(quiet=quiet, width=max(Console().width, 140))
    cached = (tokens - chunk_tokens) // chunk_tokens * chunk_tokens if cached is None else cached
    tdtype = getattr(torch, dtype)
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpufeed-bench-kv-")
        data_dir = tmp.name
    root = Path(data_dir)
    progress = BenchProgress("kv", quiet=quiet or None).start()
    progress.step("start node, build the model")
    node = start_node(root / "node", extra_args=["--no-fsync"])
    results: list[dict] = []
    load_avg = [round(os.getloadavg()[0], 2)]  # at the start and the end: other work on the machine
    try:
        console.print(f"[bold]gpufeed bench kv[/]: {tokens} tokens, {cached} cached, "
                      f"{layers} layers, hidden {hidden}, {heads}/{kv_heads} heads, {dtype}, "
                      f"{torch.get_num_threads()} threads")
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                          num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, max_position_embeddings=max(tokens * 2, 4096))
        model = LlamaForCausalLM(cfg).to(tdtype).eval()
        ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(1))
        mid = f"bench-llama-{layers}x{hidden}-{dtype}"

        console.print("  recompute ...")
        progress.step("recompute (no cache)")
        with torch.no_grad():
            t0 = time.perf_counter()
            ref, t_first = _generate(model, ids, new_tokens)
        ttft_recompute = t_first - t0
        results.append({"path": "recompute", "ttft_s": ttft_recompute, "reload_gbps": None,
                        "same_output": True, "cached_tokens": 0})

        console.print("  in_memory (prefix KV already in this process) ...")
        progress.step("in_memory (prefix KV in this process)")
        with torch.no_grad():
            ttft_mem, same_mem = _in_memory_ttft(model, ids, ref, cached, new_tokens, repeat + 1)
        mem_row = {"path": "in_memory", "ttft_s": ttft_mem, "reload_gbps": None,
                   "same_output": same_mem, "cached_tokens": cached,
                   "speedup": ttft_recompute / ttft_mem, "ttft_vs_in_memory": 1.0,
                   "runs": repeat + 1}
        results.append(mem_row)

        # store the first `cached` tokens' KV (from the recompute's cache)
        progress.step(f"store the KV of {cached} tokens")
        with store_for_model(node.shm_url, model, model_id=mid, bucket=BUCKET,
                             chunk_tokens=chunk_tokens, cpu_tier_bytes=0) as writer:
            kv_layers = [(lyr.keys[0, :, :cached].transpose(0, 1), lyr.values[0, :, :cached].transpose(0, 1))
                         for lyr in ref.cache.layers]
            writer.put(ids[0, :cached], kv_layers).result()
            kv_bytes = cached * writer.layout.token_bytes()
        del kv_layers

        io = {}
        if io_size:
            with Client(node.shm_url, **node.credentials) as c:
                region = c.alloc(io_size)
                np.frombuffer(region, np.uint8)[:] = 7
                c.put(BUCKET, "io.bin", region)
                del region
        # Flush the setup's dirty pages now: background writeback would otherwise
        # take CPU from whichever measurement it overlaps (2 cores here).
        os.sync()
        if io_size:
            for transport, url in (("shm", node.shm_url), ("tcp", node.tcp_url)):
                console.print(f"  io large read via {transport} ...")
                progress.step(f"io large read via {transport}")
                with Client(url, **node.credentials) as c:
                    io[transport] = _io_gbps(c, io_size, repeat, None)
                results.append({"path": f"io_{transport}", "gbps": io[transport], "size_bytes": io_size})

        cpu = CpuMeter(node.pid)
        for transport, url in (("shm", node.shm_url), ("tcp", node.tcp_url)):
            console.print(f"  cached via {transport} ...")
            progress.step(f"cached via {transport}")
            with store_for_model(url, model, model_id=mid, bucket=BUCKET, chunk_tokens=chunk_tokens,
                                 cpu_tier_bytes=0) as st, torch.no_grad():
                # reload bandwidth: lookup + get_chunks (the generate path), best of repeat;
                # also without checksum verification, and get_into's scatter into [2, L, T, H, D]
                def best_of(fn) -> float:
                    best = float("inf")
                    for _ in range(repeat + 1):
                        t0 = time.perf_counter()
                        got = fn()
                        best = min(best, time.perf_counter() - t0)
                    assert got == cached, (got, cached)
                    return best

                def chunks() -> int:  # what generate_with_cache reads (_load_cache)
                    return sum(c.shape[2] for c in st.get_chunks(ids[0, :tokens - 1], buf))

                def lookup_chunks() -> int:
                    n = st.lookup(ids[0, :tokens - 1])
                    return sum(c.shape[2] for c in st.get_chunks(ids[0, :n], buf))

                with st.chunk_landing(tokens - 1) as buf:
                    best = best_of(chunks)
                    best_lk = best_of(lookup_chunks)
                    st.verify = False
                    best_nv = best_of(chunks)
                    st.verify = True
                with st.landing(cached) as kv:
                    best_scatter = best_of(lambda: st.get_into(ids[0, :st.lookup(ids[0, :tokens - 1])], kv))
                reload_gbps = kv_bytes / best / GB
                ttfts, mem_ttfts, node_cpu, outs = [], [], [], None
                for _ in range(repeat + 1):  # the first also warms up (landing buffer faulted in)
                    c0, t0 = cpu.server_s(), time.perf_counter()
                    cache, n = _load_cache(model, ids, st)
                    outs, t_first = _generate(model, ids, new_tokens, cache)
                    ttfts.append(t_first - t0)
                    node_cpu.append(cpu.server_s() - c0)
                    del cache
                    # the limit, alternately with the cached runs: both see the same machine load
                    mem, same_mem = _in_memory_ttft(model, ids, ref, cached, new_tokens, 1)
                    mem_ttfts.append(mem)
                    mem_row["same_output"] = mem_row["same_output"] and same_mem
                assert outs is not None  # the loop above runs repeat + 1 >= 1 times
                same = bool(torch.equal(outs.sequences, ref.sequences))
                diff = float((outs.logits[0].float() - ref.logits[0].float()).abs().max())
                results.append({
                    "path": f"cached_{transport}", "ttft_s": min(ttfts), "reload_gbps": reload_gbps,
                    "same_output": same, "cached_tokens": n, "kv_bytes": kv_bytes,
                    "reload_s": best, "reload_noverify_gbps": kv_bytes / best_nv / GB,
                    "reload_lookup_gbps": kv_bytes / best_lk / GB,
                    "reload_scatter_gbps": kv_bytes / best_scatter / GB, "speedup": ttft_recompute / min(ttfts),
                    "reload_vs_io": reload_gbps / io[transport] if transport in io else None,
                    "in_memory_ttft_s": min(mem_ttfts),
                    "node_cpu_s": node_cpu[ttfts.index(min(ttfts))],
                    "ttft_vs_in_memory": min(ttfts) / min(mem_ttfts),
                    "max_logit_diff": diff,
                })

        all_mem = [ttft_mem] + [r["in_memory_ttft_s"] for r in results if "in_memory_ttft_s" in r]
        mem_row.update(ttft_s=min(all_mem), speedup=ttft_recompute / min(all_mem),
                       runs=(repeat + 1) * len(all_mem))
        if clients:
            progress.step(f"{clients} concurrent clients")
            results += _concurrency(node, model, mid, clients, rounds, concurrent_tokens,
                                    chunk_tokens, vocab, tdtype, console)
    finally:
        progress.close()
        node.stop()
        if tmp is not None:
            tmp.cleanup()

    load_avg.append(round(os.getloadavg()[0], 2))
    out = {"benchmark": "kv",
           "command": f"gpufeed bench kv --tokens {tokens} --cached {cached} --layers {layers} "
                      f"--hidden {hidden} --heads {heads} --kv-heads {kv_heads} --dtype {dtype} "
                      f"--new-tokens {new_tokens} --io-size {io_size} --clients {clients} "
                      f"--rounds {rounds} --concurrent-tokens {concurrent_tokens} --repeat {repeat}",
           "machine": machine_info(),
           "params": {"tokens": tokens, "cached_tokens": cached, "layers": layers, "hidden": hidden,
                      "heads": heads, "kv_heads": kv_heads, "intermediate": intermediate,
                      "vocab": vocab, "dtype": dtype, "new_tokens": new_tokens, "repeat": repeat,
                      "io_size_bytes": io_size, "clients": clients, "rounds": rounds,
                      "concurrent_tokens": concurrent_tokens, "chunk_tokens": chunk_tokens,
                      "torch_threads": torch.get_num_threads(), "node_fsync": False,
                      "load_avg_1m": load_avg},
           "results": results,
           "targets": [{"target": f"{r['path']} TTFT / in_memory TTFT", "compare": "<=",
                        "want": 1.1, "got": round(r["ttft_vs_in_memory"], 3),
                        "met": r["ttft_vs_in_memory"] <= 1.1}
                       for r in results if r["path"].startswith("cached_")]}
    _print(console, out, Table)
    if json_path:
        write_json(json_path, out)
        console.print(f"wrote {json_path}")
    progress.done(summary_line("kv", out, json_path))
    return out


def _concurrency(node, model, mid, clients, rounds, ntok, chunk_tokens, vocab, tdtype, console):
    """``clients`` threads, own client each, lookup + get_into of their own prefix."""
    from ..ai.kvcache import store_for_model

    rows = []
    prompts = [torch.randint(0, vocab, (ntok,), generator=torch.Generator().manual_seed(100 + i))
               for i in range(clients)]
    with store_for_model(node.shm_url, model, model_id=mid, bucket=BUCKET, chunk_tokens=chunk_tokens,
                         cpu_tier_bytes=0) as writer:
        lay = writer.layout
        for i, p in enumerate(prompts):  # synthetic KV: the store does not care what it holds
            kv = torch.randn((2, lay.num_layers, ntok, lay.num_kv_heads, lay.head_dim),
                             generator=torch.Generator().manual_seed(i)).to(tdtype)
            writer.put(p, kv)
        writer.flush()
        nbytes = ntok // chunk_tokens * chunk_tokens * lay.token_bytes()
    for transport, url in (("shm", node.shm_url), ("tcp", node.tcp_url)):
        console.print(f"  {clients} concurrent clients via {transport} ...")
        stores = [store_for_model(url, model, model_id=mid, bucket=BUCKET, chunk_tokens=chunk_tokens,
                                  cpu_tier_bytes=0) for _ in range(clients)]
        lat: list[float] = []
        lock = threading.Lock()
        start = threading.Barrier(clients + 1)
        bad = []

        def work(i: int, stores=stores, start=start, bad=bad, lock=lock, lat=lat) -> None:
            st = stores[i]
            with st.landing(ntok) as kv:
                st.get_into(prompts[i], kv)  # warm the landing buffer
                start.wait()
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    n = st.lookup(prompts[i])
                    got = st.get_into(prompts[i][:n], kv)
                    dt = time.perf_counter() - t0
                    if got != n or n == 0:
                        bad.append((i, n, got))
                    with lock:
                        lat.append(dt)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        for st in stores:
            st.close()
        lat.sort()
        rows.append({"path": f"concurrent_{transport}", "clients": clients, "rounds": rounds,
                     "prefix_tokens": ntok, "p50_s": lat[len(lat) // 2],
                     "p99_s": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
                     "aggregate_gbps": clients * rounds * nbytes / wall / GB, "errors": len(bad)})
    return rows


def _print(console, out: dict, Table) -> None:
    table = Table(title=f"gpufeed bench kv — {out['params']['tokens']} tokens, "
                        f"{out['params']['cached_tokens']} cached ({out['params']['dtype']})")
    for col in ("path", "TTFT s", "× recompute", "× in_memory", "reload GB/s", "io GB/s", "reload/io",
                "same output", "p50 s", "p99 s", "aggr GB/s"):
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=True)

    def f(v, spec):
        return "—" if v is None else format(v, spec)

    for r in out["results"]:
        table.add_row(r["path"], f(r.get("ttft_s"), ".3f"), f(r.get("speedup"), ".1f"),
                      f(r.get("ttft_vs_in_memory"), ".2f"),
                      f(r.get("reload_gbps"), ".2f"), f(r.get("gbps"), ".2f"),
                      f(r.get("reload_vs_io"), ".2f"),
                      "—" if "same_output" not in r else str(r["same_output"]),
                      f(r.get("p50_s"), ".4f"), f(r.get("p99_s"), ".4f"),
                      f(r.get("aggregate_gbps"), ".2f"))
    console.print(table)
    for t in out["targets"]:
        console.print(f"target {t['target']}: want <= {t['want']}x, got {t['got']}x: "
                      f"{'[green]met[/]' if t['met'] else '[red]not met[/]'}")
