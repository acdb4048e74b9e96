"""Compare the fast path of two source trees side by side: one node of each up
at once, the same large (shm and tcp) and 4 KiB reads alternated in random
order from one client process, so load on the machine hits both alike.

Usage::

    PYTHONPATH=B/src python scripts/wire_ab.py A/src B/src [ROUNDS] [SIZE_MIB]

The client code is B's (a node of A without authentication is allowed). Prints a
Markdown table: median and best GB/s of each, the median of the per-round
ratios (B / A), and the p50 of 4 KiB reads. Run A against A for a control.
"""

from __future__ import annotations

import random
import statistics as st
import sys
import tempfile
from pathlib import Path
from time import perf_counter

import numpy as np

from gpufeed.client import Client
from gpufeed.testing.node import start_node


def main(a_src: str, b_src: str, rounds: int = 30, size_mib: int = 512) -> None:
    size = size_mib << 20
    root = Path(tempfile.mkdtemp(prefix="wire-ab-"))
    nodes = {"A": start_node(root / "a", env={"PYTHONPATH": a_src}),
             "B": start_node(root / "b", env={"PYTHONPATH": b_src})}
    data = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    clients: dict[tuple[str, str], Client] = {}
    try:
        for name, node in nodes.items():
            for t, url in (("shm", node.shm_url), ("tcp", node.tcp_url)):
                clients[name, t] = Client(url, allow_unauthenticated=True)
            clients[name, "shm"].create_bucket("wireab")
            clients[name, "shm"].put("wireab", "obj", data)
        dests = {k: (c.alloc(size) if k[1] == "shm" else np.zeros(size, np.uint8)) for k, c in clients.items()}
        for d in dests.values():
            np.frombuffer(d, np.uint8)[:] = 0
        small = {k: bytearray(4096) for k in clients}
        gbps: dict = {k: [] for k in clients}
        lat: dict = {k: [] for k in clients}
        rng = random.Random(5)
        for _ in range(rounds):
            order = list(clients.items())
            rng.shuffle(order)
            for k, c in order:
                t0 = perf_counter()
                assert c.get_into("wireab", "obj", dests[k]) == size
                gbps[k].append(size / (perf_counter() - t0) / 1e9)
                for i in range(200):
                    t0 = perf_counter()
                    c.get_into("wireab", "obj", small[k], offset=(i * 7919 % (size >> 12)) * 4096)
                    lat[k].append((perf_counter() - t0) * 1e6)
        print("| transport | A GB/s (median, best) | B GB/s (median, best) | median of ratios B/A "
              "| A 4 KiB p50 µs | B 4 KiB p50 µs |")
        print("|---|---|---|---|---|---|")
        for t in ("shm", "tcp"):
            a, b = gbps["A", t], gbps["B", t]
            ratio = st.median(y / x for x, y in zip(a, b))
            print(f"| {t} | {st.median(a):.2f}, {max(a):.2f} | {st.median(b):.2f}, {max(b):.2f} | {ratio:.3f} "
                  f"| {st.median(lat['A', t]):.0f} | {st.median(lat['B', t]):.0f} |")
    finally:
        for c in clients.values():
            c.close()
        for n in nodes.values():
            n.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:5]))
