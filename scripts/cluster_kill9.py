"""kill -9 of one node of three while boto3 clients write and read: no acknowledged
write lost, reads go on, and the time until every chunk has its copies again.

    PYTHONPATH=src python scripts/cluster_kill9.py [--cycles 20] [--json docs/bench/cluster-kill9.json]

Starts a throwaway PostgreSQL (``gpufeed.testing.postgres``) and three
``gpufeed serve --cluster kill9`` nodes on 127.0.0.1 (replication factor 2,
each its own data folder). A writer thread puts objects (64-256 KiB of random
bytes) through the nodes in turn and remembers each acknowledged one (key and
SHA-256); a reader thread reads acknowledged objects back through the nodes in
turn and compares. Each cycle lets them run, sends SIGKILL to one node (the
next in turn), keeps them running on the two others, and polls the catalog
until no chunk has fewer than two copies on live nodes (the time from the
kill is the **time to full redundancy**: the expiry, then one re-replication
pass and the copying); then it restarts the killed node on its folder. The
clients use boto3's standard retries (3 attempts) against the node they ask;
a request that still fails is counted as an error seen by the client and the
client moves on to the next node (a request that was in flight on the node
being killed is counted apart, as cut by the kill: it was never
acknowledged, and the client's next try goes to another node). At the end every acknowledged object is
read through every node and compared.

Prints each cycle and a summary; with ``--json``, writes the settings, each
cycle and the summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.testing.node import NodeProcess, start_node
from gpufeed.testing.postgres import PostgresServer

_CLUSTER = "kill9"
_BUCKET = "kill9"
_SETTINGS = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.5", "GPUFEED_CLUSTER_EXPIRY_S": "3",
             "GPUFEED_CLUSTER_FETCH_TIMEOUT_S": "3", "GPUFEED_CLUSTER_COPY_TIMEOUT_S": "3",
             "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.5", "GPUFEED_CLUSTER_REPLICAS": "2"}


class Traffic:
    """The writer and reader threads over the nodes that are up."""

    def __init__(self, nodes: list[NodeProcess | None]) -> None:
        self.nodes = nodes
        self.acked: dict[str, str] = {}  # key -> sha256 of what was acknowledged
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.counts = {"writes": 0, "write_errors": 0, "reads": 0, "read_errors": 0, "read_mismatches": 0,
                       "writes_cut_by_the_kill": 0, "reads_cut_by_the_kill": 0}
        self.errors: list[str] = []
        self._clients: dict[str, object] = {}

    def _client(self, node: NodeProcess, role: str):
        """One boto3 client per node and thread (``role``), standard retries."""
        c = self._clients.get(role + node.s3_url)
        if c is None:
            c = self._clients[role + node.s3_url] = node.boto3_client(
                retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=2, read_timeout=20)
        return c

    def _up(self, i: int) -> NodeProcess | None:
        n = self.nodes[i % len(self.nodes)]
        return n if n is not None and n.proc.poll() is None else None

    def _note(self, what: str, exc: Exception, node: NodeProcess) -> None:
        """Count a request that failed after boto3's retries: one sent to the node
        that was killed meanwhile is cut by the kill (the client goes on with the
        next node); one to a live node is an error the client saw."""
        if node.proc.poll() is not None:
            with self.lock:
                self.counts[what.split("_")[0] + "s_cut_by_the_kill"] += 1
            return
        with self.lock:
            self.counts[what] += 1
            if len(self.errors) < 20:
                self.errors.append(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")

    def write_loop(self) -> None:
        rng, i = random.Random(1), 0
        while not self.stop.is_set():
            i += 1
            node = self._up(i)
            if node is None:
                continue
            key, data = f"obj-{i:06d}", os.urandom(rng.randrange(64 << 10, 256 << 10))
            try:
                self._client(node, "w").put_object(Bucket=_BUCKET, Key=key, Body=data)
            except Exception as exc:
                self._note("write_errors", exc, node)
                continue
            with self.lock:
                self.acked[key] = hashlib.sha256(data).hexdigest()
                self.counts["writes"] += 1

    def read_loop(self) -> None:
        rng, i = random.Random(2), 0
        while not self.stop.is_set():
            i += 1
            node = self._up(i)
            with self.lock:
                keys = list(self.acked)
            if node is None or not keys:
                time.sleep(0.01)
                continue
            key = rng.choice(keys)
            try:
                got = self._client(node, "r").get_object(Bucket=_BUCKET, Key=key)["Body"].read()
            except Exception as exc:
                self._note("read_errors", exc, node)
                continue
            with self.lock:
                self.counts["reads"] += 1
                if hashlib.sha256(got).hexdigest() != self.acked[key]:
                    self.counts["read_mismatches"] += 1


def _under(db: PostgresCatalog, expiry_s: float) -> tuple[int, int]:
    """(live members, chunks with fewer than min(2, live) copies on live members)."""
    live = [n.node_id for n in db.membership.nodes(_CLUSTER) if n.live(expiry_s)]
    return len(live), db.under_replicated(live, min(2, len(live))) if live else -1


def _wait(check, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def run(cycles: int, run_s: float, workdir: Path) -> dict:
    """Measure; returns the JSON document."""
    expiry_s = float(_SETTINGS["GPUFEED_CLUSTER_EXPIRY_S"])
    cycle_rows: list[dict] = []
    with PostgresServer() as pg:
        url = pg.create_database("kill9")
        args = ["--catalog", url, "--cluster", _CLUSTER]
        nodes: list[NodeProcess | None] = [start_node(workdir / f"n{i}", extra_args=args, env=_SETTINGS,
                                                      timeout_s=120) for i in range(3)]
        db = PostgresCatalog(url, pool_size=2)
        traffic = Traffic(nodes)
        threads = [threading.Thread(target=traffic.write_loop, daemon=True),
                   threading.Thread(target=traffic.read_loop, daemon=True)]
        try:
            assert nodes[0] is not None
            nodes[0].boto3_client().create_bucket(Bucket=_BUCKET)
            for t in threads:
                t.start()
            for c in range(cycles):
                _wait(lambda: _under(db, expiry_s)[0] == 3, 60, "three live members")
                time.sleep(run_s)
                victim = c % 3
                before = dict(traffic.counts)
                node = nodes[victim]
                assert node is not None
                node.kill()
                killed = time.monotonic()
                _wait(lambda: _under(db, expiry_s) == (2, 0), 120, "full redundancy on two nodes")
                took = time.monotonic() - killed
                during = {k: traffic.counts[k] - before[k] for k in before}
                cycle_rows.append({"cycle": c, "killed": f"n{victim}", "time_to_full_redundancy_s": round(took, 3),
                                   "while_down": during, "acked_so_far": len(traffic.acked),
                                   "load_average_1m": os.getloadavg()[0]})
                print(f"cycle {c}: n{victim} killed; full redundancy after {took:.2f} s; meanwhile {during}")
                nodes[victim] = start_node(workdir / f"n{victim}", extra_args=args, env=_SETTINGS, timeout_s=120)
            traffic.stop.set()
            for t in threads:
                t.join()
            _wait(lambda: _under(db, expiry_s) == (3, 0), 120, "full redundancy on three nodes")
            lost, mismatched = _verify(traffic, nodes)
        finally:
            traffic.stop.set()
            db.close()
            for n in nodes:
                if n is not None:
                    n.stop()
    took_all = [r["time_to_full_redundancy_s"] for r in cycle_rows]
    return {
        "command": f"PYTHONPATH=src python scripts/cluster_kill9.py --cycles {cycles} --run {run_s:g}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "nodes": 3, "replicas": 2, "settings": _SETTINGS, "cycles": cycle_rows,
        "totals": traffic.counts, "acknowledged_writes": len(traffic.acked),
        "acknowledged_lost": lost, "acknowledged_mismatched": mismatched,
        "first_client_errors": traffic.errors,
        "time_to_full_redundancy_s": {"min": min(took_all), "median": statistics.median(took_all),
                                      "max": max(took_all)} if took_all else None,
    }


def _verify(traffic: Traffic, nodes: list[NodeProcess | None]) -> tuple[int, int]:
    """Every acknowledged object through every node: (missing reads, wrong bytes)."""
    lost = mismatched = 0
    for node in nodes:
        assert node is not None
        s3 = node.boto3_client()
        for key, digest in traffic.acked.items():
            try:
                got = s3.get_object(Bucket=_BUCKET, Key=key)["Body"].read()
            except Exception:
                lost += 1
                continue
            mismatched += hashlib.sha256(got).hexdigest() != digest
    return lost, mismatched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--run", type=float, default=2.0, help="seconds of traffic on three nodes before each kill")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the nodes and the database on the way out
    with tempfile.TemporaryDirectory(prefix="gpufeed-kill9-") as d:
        doc = run(a.cycles, a.run, Path(d))
    print(json.dumps({k: doc[k] for k in ("totals", "acknowledged_writes", "acknowledged_lost",
                                          "acknowledged_mismatched", "time_to_full_redundancy_s")}))
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
