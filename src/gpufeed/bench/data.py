"""``gpufeed bench data``: the data services through a node, each beside its
baseline in the same run.

* **verify**: shm ``get_into`` of one page-cached object from a bucket that
  checks every read (the default), from one that opted out (``verify``
  off), and as of a snapshot, taking turns, best of ``repeat``; targets:
  checked ≥ 0.8 × unchecked, snapshot ≥ 0.9 × live.
* **compression**: three kinds of data written through shm into buckets with
  compression off, lz4 and zstd: a tokenized text corpus (uint16 token ids
  of the ``.py`` files shipped with Python, :func:`gpufeed.bench.codecs.token_corpus`),
  bf16 weights drawn from N(0, 0.02), and uniformly random bf16 bits. Per row: stored/logical
  ratio, put and read GB/s. Target: data that does not shrink (random bits)
  is written at ≥ 0.95 × the speed of compression off (the skip is cheap).
* **dedup**: ``versions`` checkpoints of a model of ``size`` bytes
  (safetensors layout, 100 bf16 tensors; each version rewrites a tenth of
  them with new values) written into a dedup bucket with 1 MiB chunks. The
  bytes that are new anywhere are one version plus every rewritten tensor
  (``floor_bytes``: ten versions each rewriting a tenth cannot be kept in less
  than 1.9 × one version without compression). Target: stored bytes ≤ 1.3 ×
  that floor (what chunking costs on top); ``stored_vs_one_version`` is
  reported too.

JSON shape::

    {"benchmark": "data", "command", "machine", "params",
     "verify": {...}, "compression": [...], "dedup": {...}, "targets": [...]}
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from ..admin import RemoteAdmin
from ..client import Client
from ..testing.node import start_node
from ._output import BenchProgress, summary_line, write_json
from .codecs import bf16_weights, token_corpus
from .io import machine_info

__all__ = ["run_data_bench"]

GB = 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_data_bench(*, size: int = 1 << 30, versions: int = 10, repeat: int = 3, json_path: str | None = None,
                   data_dir: str | None = None, console: Console | None = None) -> dict:
    """Run the benchmark (see the module docstring); returns the JSON dict."""
    console = console or Console()
    tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="gpufeed-data-")
    root = Path(data_dir or tmp.name)  # type: ignore[union-attr]
    progress = BenchProgress("data").start()
    progress.step("start node")
    node = start_node(root / "data", extra_args=["--no-fsync", "--scrub-interval", "0"])
    out: dict = {"benchmark": "data", "command": " ".join(["gpufeed", "bench", "data", *sys.argv[3:]]),
                 "machine": machine_info(), "params": {"size_bytes": size, "versions": versions, "repeat": repeat,
                                                       "fsync": False}}
    try:
        admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
        with Client(node.shm_url, **node.credentials) as c:
            progress.step("checked and unchecked reads")
            out["verify"] = _verify_rows(c, admin, size, repeat, console)
            progress.step("compression: 3 data sets x 3 codecs")
            out["compression"] = _compression_rows(c, admin, min(size, 256 << 20), repeat, console)
            progress.step(f"dedup: {versions} checkpoint versions")
            out["dedup"] = _dedup_row(c, admin, size, versions, console)
        admin.close()
    finally:
        progress.close()
        node.stop()
        if tmp is not None:
            tmp.cleanup()
    out["targets"] = _targets(out)
    _print(out, console)
    if json_path:
        write_json(json_path, out)
    progress.done(summary_line("data", out, json_path))
    return out


def _verify_rows(c: Client, admin: RemoteAdmin, size: int, repeat: int, console: Console) -> dict:
    console.print(f"  verify: {size / GB:.2f} GB object, checked and unchecked ...")
    for b in ("data-checked", "data-unchecked"):
        c.create_bucket(b)
    admin.bucket_data("data-unchecked", verify=False)
    src = c.alloc(size)
    np.frombuffer(src, np.uint8)[:] = np.resize(np.random.default_rng(0).integers(0, 256, 1 << 20,
                                                                                  dtype=np.uint8), size)
    for b in ("data-checked", "data-unchecked"):
        c.put(b, "o", src)
    dest = c.alloc(size)
    admin.snapshot_create("data-checked", "bench")
    reads = {"checked": lambda: c.get_into("data-checked", "o", dest),
             "unchecked": lambda: c.get_into("data-unchecked", "o", dest),
             "snapshot": lambda: c.get_into("data-checked", "o", dest, snapshot="bench")}
    best = dict.fromkeys(reads, 1e9)
    for _ in range(repeat + 1):  # the first round warms them all
        for name, fn in reads.items():
            best[name] = min(best[name], _timed(fn))
    gbps = {name: size / s / GB for name, s in best.items()}
    admin.snapshot_delete("data-checked", "bench")
    for b in ("data-checked", "data-unchecked"):
        c.delete(b, "o")
    return {"checked_gbps": round(gbps["checked"], 3), "unchecked_gbps": round(gbps["unchecked"], 3),
            "ratio": round(gbps["checked"] / gbps["unchecked"], 3), "snapshot_gbps": round(gbps["snapshot"], 3),
            "snapshot_vs_live": round(gbps["snapshot"] / gbps["checked"], 3)}


def _compression_rows(c: Client, admin: RemoteAdmin, size: int, repeat: int, console: Console) -> list[dict]:
    data = {"tokens": token_corpus(size), "bf16_normal": bf16_weights(size, "normal"),
            "bf16_uniform": bf16_weights(size, "random")}
    rows = []
    for codec in ("off", "lz4", "zstd"):
        b = f"data-{codec}"
        c.create_bucket(b)
        if codec != "off":
            admin.bucket_data(b, compression=codec)
    for kind, arr in data.items():
        src = c.alloc(arr.nbytes)
        np.frombuffer(src, np.uint8)[:] = arr.view(np.uint8)
        dest = c.alloc(arr.nbytes)
        for codec in ("off", "lz4", "zstd"):
            console.print(f"  compression: {kind} with {codec} ...")
            b = f"data-{codec}"
            put_s = min(_timed(lambda b=b, k=kind, s=src: c.put(b, k, s)) for _ in range(repeat))
            get_s = min(_timed(lambda b=b, k=kind, d=dest: c.get_into(b, k, d)) for _ in range(repeat))
            stats = admin.bucket_stats(b)["data"]
            stored = stats["stored_bytes"]
            rows.append({"data": kind, "codec": codec, "logical_bytes": arr.nbytes, "stored_bytes": stored,
                         "ratio": round(arr.nbytes / stored, 3) if stored else None,
                         "put_gbps": round(arr.nbytes / put_s / GB, 3), "get_gbps": round(arr.nbytes / get_s / GB, 3)})
            assert bytes(dest[:4096]) == arr.view(np.uint8)[:4096].tobytes()
            c.delete(b, kind)
    return rows


def _dedup_row(c: Client, admin: RemoteAdmin, size: int, versions: int, console: Console) -> dict:
    from safetensors.numpy import save

    b = "data-ckpt"
    c.create_bucket(b)
    admin.bucket_data(b, dedup=True, chunk_bytes=1 << 20)  # checkpoints: 1 MiB chunks (tensors of ~10 MB)
    n_tensors = 100
    per = size // n_tensors // 2
    rng = np.random.default_rng(5)
    tensors = {f"layer.{i:03d}.weight": bf16_weights(2 * per, "normal", seed=i) for i in range(n_tensors)}
    put_s = 0.0
    one = changed = 0
    for v in range(versions):
        if v:
            for i in rng.choice(n_tensors, n_tensors // 10, replace=False):
                tensors[f"layer.{i:03d}.weight"] = bf16_weights(2 * per, "normal", seed=1000 * v + int(i))
                changed += tensors[f"layer.{i:03d}.weight"].nbytes
        blob = save(tensors)
        one = len(blob)
        console.print(f"  dedup: checkpoint version {v + 1}/{versions} ({one / GB:.2f} GB) ...")
        put_s += _timed(lambda blob=blob, v=v: c.put(b, f"ckpt/step-{v:03d}.safetensors", blob))
    stats = admin.bucket_stats(b)["data"]
    floor = one + changed  # bytes that are new somewhere: no store can keep less without compression
    return {"versions": versions, "version_bytes": one, "changed_bytes": changed, "floor_bytes": floor,
            "logical_bytes": stats["logical_bytes"], "stored_bytes": stats["stored_bytes"],
            "stored_vs_one_version": round(stats["stored_bytes"] / one, 3),
            "stored_vs_floor": round(stats["stored_bytes"] / floor, 3),
            "chunk_bytes": stats["chunk_bytes"], "put_gbps": round(versions * one / put_s / GB, 3)}


def _targets(out: dict) -> list[dict]:
    comp = {(r["data"], r["codec"]): r for r in out["compression"]}
    off = comp[("bf16_uniform", "off")]["put_gbps"]
    skip = min(comp[("bf16_uniform", k)]["put_gbps"] for k in ("lz4", "zstd")) / off
    return [
        {"target": "checked shm read GB/s vs unchecked", "compare": ">=", "want": 0.8,
         "got": out["verify"]["ratio"], "met": out["verify"]["ratio"] >= 0.8},
        {"target": "shm read as of a snapshot vs the live read", "compare": ">=", "want": 0.9,
         "got": out["verify"]["snapshot_vs_live"], "met": out["verify"]["snapshot_vs_live"] >= 0.9},
        {"target": "put GB/s of incompressible data, compression on vs off", "compare": ">=", "want": 0.95,
         "got": round(skip, 3), "met": skip >= 0.95},
        {"target": "dedup: stored bytes vs the new bytes of all versions (one version + every changed tensor)",
         "compare": "<=", "want": 1.3, "got": out["dedup"]["stored_vs_floor"],
         "met": out["dedup"]["stored_vs_floor"] <= 1.3},
    ]


def _print(out: dict, console: Console) -> None:
    v = out["verify"]
    console.print(f"verify: checked {v['checked_gbps']:.2f} GB/s, unchecked {v['unchecked_gbps']:.2f} GB/s "
                  f"(ratio {v['ratio']:.2f}); as of a snapshot {v['snapshot_gbps']:.2f} GB/s "
                  f"({v['snapshot_vs_live']:.2f} x live)")
    t = Table(title="compression (stored = logical / ratio)")
    for col in ("data", "codec", "ratio", "put GB/s", "get GB/s"):
        t.add_column(col, justify="left" if col in ("data", "codec") else "right")
    for r in out["compression"]:
        t.add_row(r["data"], r["codec"], f"{r['ratio']:.3f}", f"{r['put_gbps']:.2f}", f"{r['get_gbps']:.2f}")
    console.print(t)
    d = out["dedup"]
    console.print(f"dedup: {d['versions']} versions of {d['version_bytes'] / GB:.2f} GB stored in "
                  f"{d['stored_bytes'] / GB:.2f} GB ({d['stored_vs_one_version']:.2f} x one version; "
                  f"{d['stored_vs_floor']:.2f} x the {d['floor_bytes'] / GB:.2f} GB that are new anywhere), "
                  f"put {d['put_gbps']:.2f} GB/s")
    for tg in out["targets"]:
        console.print(f"  {'met' if tg['met'] else 'NOT met'}: {tg['target']} {tg['compare']} {tg['want']} "
                      f"(got {tg['got']})")
