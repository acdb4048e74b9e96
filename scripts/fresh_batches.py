"""Node CPU seconds per GB of raw-tensor batches read into fresh memory, for
several ways the node can write into a client's fresh memfd, side by side.

Each batch is what a raw-tensor DataLoader worker reads: a fresh
``Client.alloc_shared`` buffer (a memfd registered with the node), rows read
straight into it through the public SDK, then closed (unregistered):

* ``unet3d``: 7 objects of 3.7 MB, one ``get_many_into`` (GETV) into the rows;
* ``resnet50``: 400 ranges of 28 KB (512-byte aligned, as tar members lie) of
  one 1,251-sample shard object, one ``get_ranges_into`` (GETR).

One node per variant runs at once, all from this tree; rounds alternate the
variants in random order, so load on the machine hits them alike. The node's
CPU is ``utime + stime`` from ``/proc/PID/stat`` around each variant's turn.
Variants (all but ``staged`` patch the node at start-up through a
``sitecustomize`` this script writes; the patches exist only here):

* ``populate``: the node maps the memfd with ``MAP_POPULATE`` and reads into
  the mapping (the code for memfds not registered fresh);
* ``nopopulate``: mapped without ``MAP_POPULATE`` (pages fault as written);
* ``madvise``: mapped without it; ``madvise(MADV_POPULATE_WRITE)`` on each
  range just before it is read into;
* ``staged``: the code for fresh memfds (``wire/_staged.py``): each piece read
  and checked in a 256 KiB reused buffer, then ``pwrite`` into the memfd.

Usage::

    .venv/bin/python scripts/fresh_batches.py [ROUNDS] [BATCHES_PER_TURN] [--json PATH]

Prints a Markdown table (median, min and max node CPU s/GB per variant and
workload, the median's change against ``populate``, and the median of each
round's ratio to ``populate``); ``--json`` writes every value.
"""

from __future__ import annotations

import json
import os
import random
import statistics as st
import sys
import tempfile
from pathlib import Path

import numpy as np

from gpufeed.client import Client, ReadRequest
from gpufeed.testing.node import start_node

VARIANTS = ("populate", "nopopulate", "madvise", "staged")

_SITECUSTOMIZE = '''
import os
variant = os.environ.get("FRESH_BATCHES_VARIANT", "staged")
if variant != "staged":
    import mmap as _mmap
    import types
    from gpufeed.wire import _lending

    class _Shim(types.ModuleType):
        def __getattr__(self, name):
            return getattr(_mmap, name)

    shim = _Shim("mmap")
    def _map(fd, size, flags=_mmap.MAP_SHARED, prot=_mmap.PROT_READ | _mmap.PROT_WRITE):
        if variant != "populate":
            flags &= ~getattr(_mmap, "MAP_POPULATE", 0)
        return _mmap.mmap(fd, size, flags=flags, prot=prot)
    shim.mmap = _map
    _lending.mmap = shim
    _register = _lending.Lending.register
    def register(self, mem, region_id, size, fd, *, fresh=False):
        return _register(self, mem, region_id, size, fd, fresh=False)
    _lending.Lending.register = register
    if variant == "madvise":
        _view = _lending.MappedRegion.view
        def view(self, offset, length):
            out = _view(self, offset, length)
            if self.owned is None and self.alias is None and length:
                lo = offset - offset % _mmap.PAGESIZE
                self.mm.madvise(23, lo, offset + length - lo)  # MADV_POPULATE_WRITE
            return out
        _lending.MappedRegion.view = view
'''


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _unet3d(c: Client, keys: list[str], size: int) -> int:
    buf = c.alloc_shared(len(keys) * size + 1)
    mem = buf.view
    errors: list = []
    got = c.get_many_into([ReadRequest("fresh", k, mem[i * size:(i + 1) * size + 1]) for i, k in enumerate(keys)],
                          errors_out=errors)
    assert got == [size] * len(keys), (got, errors)
    del mem
    buf.close()
    return len(keys) * size


def _resnet50(c: Client, offsets: list[int], size: int) -> int:
    buf = c.alloc_shared(len(offsets) * size)
    mem = buf.view
    got = c.get_ranges_into("fresh", "shard", mem, offsets, size)
    assert (got == size).all(), got
    del mem
    buf.close()
    return len(offsets) * size


def main(rounds: int = 5, batches: int = 12, json_path: str | None = None) -> None:
    root = Path(tempfile.mkdtemp(prefix="fresh-batches-"))
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    nodes = {v: start_node(root / v, extra_args=["--no-fsync", "--scrub-interval", "0"],
                           env={"PYTHONPATH": path, "FRESH_BATCHES_VARIANT": v}) for v in VARIANTS}
    rng = np.random.default_rng(1)
    u_size, r_size, r_count = 3_700_000, 28_672, 1251
    u_data = [rng.integers(0, 255, u_size, dtype=np.uint8) for _ in range(7 * 4)]
    r_stride = r_size + 512 + (-(r_size + 512)) % 512
    shard = rng.integers(0, 255, r_count * r_stride, dtype=np.uint8)
    clients = {}
    try:
        for v, node in nodes.items():
            c = clients[v] = Client(node.shm_url, **node.credentials)
            c.create_bucket("fresh")
            for i, d in enumerate(u_data):
                c.put("fresh", f"u{i}", d)
            c.put("fresh", "shard", shard)
        pick = random.Random(7)
        results: dict = {(w, v): [] for w in ("unet3d", "resnet50") for v in VARIANTS}
        for _ in range(rounds):
            for work in ("unet3d", "resnet50"):
                order = list(VARIANTS)
                pick.shuffle(order)
                for v in order:
                    c, pid = clients[v], nodes[v].pid
                    t0, nbytes = _cpu_s(pid), 0
                    for _b in range(batches):
                        if work == "unet3d":
                            keys = [f"u{k}" for k in pick.sample(range(len(u_data)), 7)]
                            nbytes += _unet3d(c, keys, u_size)
                        else:
                            idx = sorted(pick.sample(range(r_count), 400))
                            nbytes += _resnet50(c, [i * r_stride + 512 for i in idx], r_size)
                    results[work, v].append((_cpu_s(pid) - t0) / (nbytes / 1e9))
        _report(results, rounds, batches, json_path)
    finally:
        for c in clients.values():
            c.close()
        for node in nodes.values():
            node.stop()


def _report(results: dict, rounds: int, batches: int, json_path: str | None) -> None:
    print(f"node CPU s/GB, {rounds} rounds of {batches} batches per variant and workload "
          f"(load average {os.getloadavg()[0]:.1f})\n")
    print("| workload | variant | median | min | max | median vs populate | median of round ratios |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for (work, v), vals in results.items():
        base = st.median(results[work, "populate"])
        med = st.median(vals)
        paired = st.median(x / b for x, b in zip(vals, results[work, "populate"]))
        rows.append({"workload": work, "variant": v, "node_cpu_s_per_gb": vals, "median": med,
                     "vs_populate": med / base - 1, "median_round_ratio": paired})
        print(f"| {work} | {v} | {med:.3f} | {min(vals):.3f} | {max(vals):.3f} | {med / base - 1:+.0%} "
              f"| {paired:.2f} |")
    if json_path:
        Path(json_path).write_text(json.dumps({"command": " ".join(sys.argv), "rounds": rounds,
                                               "load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count(),
                                               "batches_per_turn": batches, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    out = None
    if "--json" in args:
        k = args.index("--json")
        out = args[k + 1]
        del args[k:k + 2]
    main(*(int(a) for a in args), json_path=out)
