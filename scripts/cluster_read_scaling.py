"""Read scaling of a cluster through the SDK: aggregate GB/s of many readers
against one node, against three nodes through the cluster-routing client,
and against three nodes through a plain client of one of them.

    PYTHONPATH=src python scripts/cluster_read_scaling.py [--objects 160] [--seconds 5] [--rounds 3] \\
        [--json docs/bench/cluster-read-scaling.json]

Starts a throwaway PostgreSQL (``gpufeed.testing.postgres``) and two
clusters of ``gpufeed serve --cluster`` nodes on 127.0.0.1, each on a
database of its own (each node its own data folder and free ports;
replication factor 2, capped to 1 on the one-node cluster): one node, and
three nodes. Into each it writes ``--objects`` objects of random bytes,
sizes spread evenly over ``--min-size``..``--max-size``, through its nodes
in turn (so each node holds about as much as the others). Each round then
measures the three setups below, one after the other (alternated, so the
machine's other load hits each alike): ``--procs`` reader processes of
``--threads`` threads each; every reader reads each object once (untimed:
it warms the page cache, the connections and the client's location cache),
then reads objects picked at random with ``get_into`` into a buffer of its
own for ``--seconds`` seconds. The figure is the bytes all readers read
over the timed window. For every node process and the readers, the CPU
seconds they used in the window (``/proc/PID/stat`` utime + stime) are
recorded, with the cores the whole machine kept busy meanwhile
(``/proc/stat``: other work included), its load average and core count:
on a machine with fewer cores than processes, the cores are the limit, and
the CPU shares say who used them.

Setups:

* ``one_node``: one node, a plain TCP client (``gpufeed+tcp://``).
* ``three_nodes_routed``: three nodes, the routing client
  (``ClusterClient`` on the first node): each read goes to a node that holds
  the object.
* ``three_nodes_one_endpoint``: three nodes, a plain TCP client of the first
  node, which reads its own copies and fetches the rest from the others.

Prints a table and the medians over the rounds; with ``--json``, writes the
settings, every round, the medians and the ratio of medians
``three_nodes_routed / (3 x one_node)``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_CLUSTER = "scaling"
_BUCKET = "scaling"
_SETTINGS = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.5", "GPUFEED_CLUSTER_EXPIRY_S": "5",
             "GPUFEED_CLUSTER_REPLICAS": "2"}
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, every process's (``/proc/stat``)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return (sum(v) - idle) / _TICK, sum(v) / _TICK


def reader(args: argparse.Namespace) -> None:
    """One reader process: warm up, wait for the start file, read until the stop time; print JSON."""
    from gpufeed.client import Client, ClusterClient

    keys = json.loads(Path(args.keys).read_text())
    creds = {"access_key": args.access_key, "secret_key": args.secret_key}
    client = ClusterClient(args.url, **creds) if args.routed else Client(args.url, **creds)
    biggest = max(size for _, size in keys)
    counts = [0] * args.threads

    def warm(t: int) -> None:
        buf = bytearray(biggest)
        for k, size in keys[t::args.threads]:
            client.get_into(_BUCKET, k, memoryview(buf)[:size])

    def run(t: int, stop_at: float) -> None:
        buf = bytearray(biggest)
        rng = random.Random(t + 1000 * os.getpid())
        while time.monotonic() < stop_at:
            k, size = keys[rng.randrange(len(keys))]
            counts[t] += client.get_into(_BUCKET, k, memoryview(buf)[:size])

    threads = [threading.Thread(target=warm, args=(t,)) for t in range(args.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print("ready", flush=True)
    sys.stdin.readline()  # the go
    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(t, started + args.seconds)) for t in range(args.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.monotonic() - started
    stats = client.routing_stats() if args.routed else {}
    client.close()
    print(json.dumps({"bytes": sum(counts), "seconds": took, "routing": stats}), flush=True)


def _write(nodes, n: int, lo: int, hi: int) -> list[tuple[str, int]]:
    """Write ``n`` objects through the nodes in turn; returns (key, size) of each."""
    from gpufeed.client import Client

    clients = [Client(node.tcp_url, **node.credentials) for node in nodes]
    clients[0].create_bucket(_BUCKET)
    blob = os.urandom(hi)
    keys = []
    for i in range(n):
        size = lo + (hi - lo) * i // max(1, n - 1)
        key = f"obj-{i:05d}"
        data = bytearray(blob[:size])
        data[:8] = i.to_bytes(8, "little")
        clients[i % len(clients)].put(_BUCKET, key, data)
        keys.append((key, size))
    for c in clients:
        c.close()
    return keys


def measure(name: str, nodes, keys, opts: argparse.Namespace, routed: bool, folder: Path) -> dict:
    """Run the readers against ``nodes[0]``; returns the setup's figures."""
    kf = folder / f"{name}.keys.json"
    kf.write_text(json.dumps(keys))
    url = nodes[0].tcp_url
    cmd = [sys.executable, __file__, "--reader", "--url", url, "--keys", str(kf), "--threads", str(opts.threads),
           "--seconds", str(opts.seconds), "--access-key", nodes[0].access_key,
           "--secret-key", nodes[0].secret_key] + (["--routed"] if routed else [])
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")})
             for _ in range(opts.procs)]
    for pr in procs:
        assert pr.stdout is not None
        line = pr.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"a reader failed to warm up: {line!r}")
    pids = {f"node{i}": n.pid for i, n in enumerate(nodes)} | {f"reader{i}": pr.pid for i, pr in enumerate(procs)}
    before = {k: cpu_s(pid) for k, pid in pids.items()}
    machine_before = machine_busy_s()
    load_before = os.getloadavg()
    started = time.monotonic()
    for pr in procs:
        assert pr.stdin is not None
        pr.stdin.write("go\n")
        pr.stdin.flush()
    results = []
    mid_cpu: dict[str, float] = {}
    machine_after = machine_before
    for pr in procs:
        assert pr.stdout is not None
        line = pr.stdout.readline()
        if not mid_cpu:  # read the CPU counters right when the first reader is done
            mid_cpu = {k: cpu_s(pid) for k, pid in pids.items()}
            machine_after = machine_busy_s()
        results.append(json.loads(line))
        pr.wait()
    window = time.monotonic() - started
    total = sum(r["bytes"] for r in results)
    secs = max(r["seconds"] for r in results)
    cpu = {k: round(mid_cpu[k] - before[k], 2) for k in pids}
    routed_reads: dict[str, int] = {}
    for r in results:
        for node, count in r["routing"].get("reads", {}).items():
            routed_reads[node] = routed_reads.get(node, 0) + count
    return {"setup": name, "nodes": len(nodes), "routed": routed, "bytes": total, "seconds": round(secs, 3),
            "gb_s": round(total / secs / 1e9, 3), "reads_per_node_by_client": routed_reads,
            "cpu_s": cpu, "cpu_s_nodes": round(sum(v for k, v in cpu.items() if k.startswith("node")), 2),
            "cpu_s_readers": round(sum(v for k, v in cpu.items() if k.startswith("reader")), 2),
            "cores_busy": round(sum(cpu.values()) / secs, 2), "window_s": round(window, 2),
            "gb_per_cpu_s": round(total / 1e9 / max(sum(cpu.values()), 1e-9), 3),
            "node_cpu_s_per_gb": round(sum(v for k, v in cpu.items() if k.startswith("node")) / max(total / 1e9, 1e-9),
                                       3),
            "machine_cores_busy": round((machine_after[0] - machine_before[0]) / secs, 2),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def start(name: str, count: int, pg, folder: Path, opts: argparse.Namespace, nodes: list) -> list:
    """Start ``count`` nodes on a fresh database (appended to ``nodes`` as they start)
    and write the objects through them; returns (key, size) of each."""
    from gpufeed.testing.node import start_node

    url = pg.create_database(name)
    mine = []
    for i in range(count):
        mine.append(start_node(folder / f"{name}-{i}", extra_args=["--catalog", url, "--cluster", _CLUSTER],
                               env=_SETTINGS))
        nodes.append(mine[-1])
    began = time.monotonic()
    keys = _write(mine, opts.objects, opts.min_size, opts.max_size)
    print(f"{name}: wrote {len(keys)} objects ({sum(s for _, s in keys) / 1e6:.0f} MB) in "
          f"{time.monotonic() - began:.1f} s", flush=True)
    return keys


def summary(rows: list[dict]) -> dict:
    """Median GB/s and GB per CPU second of each setup over the rounds."""
    out = {}
    for name in dict.fromkeys(r["setup"] for r in rows):
        mine = [r for r in rows if r["setup"] == name]
        out[name] = {"gb_s_median": round(statistics.median(r["gb_s"] for r in mine), 3),
                     "gb_s_all": [r["gb_s"] for r in mine],
                     "gb_per_cpu_s_median": round(statistics.median(r["gb_per_cpu_s"] for r in mine), 3),
                     "node_cpu_s_per_gb_median": round(statistics.median(r["node_cpu_s_per_gb"] for r in mine), 3),
                     "cores_busy_median": round(statistics.median(r["cores_busy"] for r in mine), 2),
                     "machine_cores_busy_median": round(statistics.median(r["machine_cores_busy"] for r in mine),
                                                        2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=160)
    ap.add_argument("--min-size", type=int, default=1 << 20)
    ap.add_argument("--max-size", type=int, default=4 << 20)
    ap.add_argument("--procs", type=int, default=3, help="reader processes")
    ap.add_argument("--threads", type=int, default=4, help="reader threads per process")
    ap.add_argument("--seconds", type=float, default=5.0, help="timed window of each setup in each round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three setups, alternated")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--routed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--keys", help=argparse.SUPPRESS)
    ap.add_argument("--access-key", help=argparse.SUPPRESS)
    ap.add_argument("--secret-key", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.reader:
        reader(opts)
        return
    from gpufeed.testing.postgres import PostgresServer

    rows: list[dict] = []
    nodes: list = []
    with tempfile.TemporaryDirectory(prefix="gf-scaling-") as tmp, PostgresServer() as pg:
        folder = Path(tmp)
        try:
            one_keys = start("one", 1, pg, folder, opts, nodes)
            three_keys = start("three", 3, pg, folder, opts, nodes)
            for rnd in range(opts.rounds):  # the setups alternate: the machine's other load hits each alike
                for name, members, keys, routed in (("one_node", nodes[:1], one_keys, False),
                                                    ("three_nodes_routed", nodes[1:], three_keys, True),
                                                    ("three_nodes_one_endpoint", nodes[1:], three_keys, False)):
                    rows.append(measure(name, members, keys, opts, routed, folder) | {"round": rnd})
                    print(f"round {rnd} {name}: {rows[-1]['gb_s']:.2f} GB/s", flush=True)
        finally:
            for n in nodes:
                n.stop()
    med = summary(rows)
    one = med["one_node"]["gb_s_median"]
    ratio = round(med["three_nodes_routed"]["gb_s_median"] / (3 * one), 3) if one else None
    print(f"{'setup':<26} {'GB/s':>6} {'node CPU s':>10} {'reader CPU s':>12} {'cores busy':>10} "
          f"{'machine busy':>12}  per node CPU s")
    for r in rows:
        per = " ".join(f"{k}={v}" for k, v in r["cpu_s"].items() if k.startswith("node"))
        print(f"{r['setup']:<26} {r['gb_s']:>6.2f} {r['cpu_s_nodes']:>10.1f} {r['cpu_s_readers']:>12.1f} "
              f"{r['cores_busy']:>10.2f} {r['machine_cores_busy']:>12.2f}  {per}")
    for name, m in med.items():
        print(f"median {name:<26} {m['gb_s_median']:.2f} GB/s, {m['gb_per_cpu_s_median']:.2f} GB per CPU s, "
              f"node CPU {m['node_cpu_s_per_gb_median']:.2f} s/GB")
    print(f"three_nodes_routed / (3 x one_node), medians = {ratio}; cores on this machine: {os.cpu_count()}")
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps({
            "command": "PYTHONPATH=src python scripts/cluster_read_scaling.py " + " ".join(sys.argv[1:]),
            "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "settings": {k: v for k, v in vars(opts).items() if k in ("objects", "min_size", "max_size", "procs",
                                                                     "threads", "seconds", "rounds")},
            "medians": med, "routed_over_3x_one_node": ratio, "rounds": rows,
        }, indent=2) + "\n")
        print(f"wrote {opts.json}")


if __name__ == "__main__":
    main()
