"""Node CPU seconds per GB of resnet50-like raw-tensor batches (400 ranges of
28 KB at 512-byte-aligned places of a 1,251-sample shard object, one
``get_ranges_into`` (GETR) each), with the node's native range loop and with
its Python loop (``GPUFEED_NATIVE=0``), side by side.

Each batch is what a raw-tensor DataLoader worker reads: a fresh
``Client.alloc_shared`` buffer (shm; the node writes each range into it), or
a plain ``bytearray`` over TCP, then closed. One node per variant runs at
once, from this tree; rounds alternate the variants in random order, so load
on the machine hits them alike. The node's CPU is ``utime + stime`` from
``/proc/PID/stat`` around each variant's turn; the client's wall time per
batch is reported too.

Usage::

    .venv/bin/python scripts/range_batches.py [ROUNDS] [BATCHES_PER_TURN] [--json PATH]
"""

from __future__ import annotations

import json
import os
import random
import statistics as st
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gpufeed.client import Client
from gpufeed.testing.node import start_node

VARIANTS = ("python", "native")
TRANSPORTS = ("shm", "tcp")
SIZE, COUNT, BATCH = 28_672, 1251, 400
STRIDE = SIZE + 512 + (-(SIZE + 512)) % 512  # a tar member: a 512-byte header, the data padded to 512


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _batch(c: Client, transport: str, offsets: list[int]) -> int:
    if transport == "shm":
        buf = c.alloc_shared(len(offsets) * SIZE)
        mem = buf.view
        got = c.get_ranges_into("ranges", "shard", mem, offsets, SIZE)
        del mem
        buf.close()
    else:
        got = c.get_ranges_into("ranges", "shard", bytearray(len(offsets) * SIZE), offsets, SIZE)
    assert (got == SIZE).all(), got
    return len(offsets) * SIZE


def main(rounds: int = 5, batches: int = 10, json_path: str | None = None) -> None:
    root = Path(tempfile.mkdtemp(prefix="range-batches-"))
    nodes = {v: start_node(root / v, extra_args=["--no-fsync", "--scrub-interval", "0"],
                           env={"GPUFEED_NATIVE": "1" if v == "native" else "0"}) for v in VARIANTS}
    shard = np.random.default_rng(1).integers(0, 255, COUNT * STRIDE, dtype=np.uint8)
    clients: dict = {}
    try:
        for v, node in nodes.items():
            for t in TRANSPORTS:
                clients[v, t] = Client(node.shm_url if t == "shm" else node.tcp_url, **node.credentials)
            clients[v, "shm"].create_bucket("ranges")
            clients[v, "shm"].put("ranges", "shard", shard)
        pick = random.Random(7)
        cpu: dict = {(t, v): [] for t in TRANSPORTS for v in VARIANTS}
        wall: dict = {(t, v): [] for t in TRANSPORTS for v in VARIANTS}
        for _ in range(rounds):
            for t in TRANSPORTS:
                order = list(VARIANTS)
                pick.shuffle(order)
                for v in order:
                    c, pid = clients[v, t], nodes[v].pid
                    t0, w0, nbytes = _cpu_s(pid), time.perf_counter(), 0
                    for _b in range(batches):  # shuffled samples, as a shuffle buffer hands them out
                        nbytes += _batch(c, t, [i * STRIDE + 512 for i in pick.sample(range(COUNT), BATCH)])
                    cpu[t, v].append((_cpu_s(pid) - t0) / (nbytes / 1e9))
                    wall[t, v].append((time.perf_counter() - w0) / batches * 1e3)
        _report(cpu, wall, rounds, batches, json_path)
    finally:
        for c in clients.values():
            c.close()
        for node in nodes.values():
            node.stop()


def _report(cpu: dict, wall: dict, rounds: int, batches: int, json_path: str | None) -> None:
    print(f"node CPU s/GB and ms per batch of {BATCH} x {SIZE} B ranges, {rounds} rounds of {batches} batches "
          f"per variant (load average {os.getloadavg()[0]:.1f})\n")
    print("| transport | loop | node CPU s/GB median (min-max) | ms per batch median | vs python (round ratios) |")
    print("|---|---|---:|---:|---:|")
    rows = []
    for (t, v), vals in cpu.items():
        ratio = st.median(x / b for x, b in zip(vals, cpu[t, "python"]))
        rows.append({"transport": t, "loop": v, "node_cpu_s_per_gb": vals, "ms_per_batch": wall[t, v],
                     "median_ratio_to_python": ratio})
        print(f"| {t} | {v} | {st.median(vals):.3f} ({min(vals):.3f}-{max(vals):.3f}) | "
              f"{st.median(wall[t, v]):.1f} | {ratio:.2f} |")
    if json_path:
        Path(json_path).write_text(json.dumps({"command": " ".join(sys.argv), "rounds": rounds,
                                               "batches_per_turn": batches, "cpus": os.cpu_count(),
                                               "load_average_1m": os.getloadavg()[0], "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    out = None
    if "--json" in args:
        k = args.index("--json")
        out = args[k + 1]
        del args[k:k + 2]
    main(*(int(a) for a in args), json_path=out)
