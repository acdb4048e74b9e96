"""How long a killed cluster node takes to show as expired.

    PYTHONPATH=src python scripts/cluster_liveness.py [--rounds 5] [--heartbeat 2] [--expiry 10] [--json PATH]

Starts a throwaway PostgreSQL (``gpufeed.testing.postgres``) and three
``gpufeed serve --cluster liveness`` nodes on 127.0.0.1, each with its own
data folder. Each round waits until all three are live, sends SIGKILL to one
(no leave is recorded), then reads the cluster status straight from the
database (``cluster_report`` over one open catalog, what ``gpufeed admin --catalog
URL cluster status`` shows) every 50 ms until that node shows ``expired``, and
records the time from the kill; the node is then restarted on its folder
for the next round. A last step stops one node with SIGTERM and times until
it shows ``left``. A kill lands at a random point between two heartbeats,
so the time to expiry lies between ``expiry - heartbeat`` and ``expiry``
seconds (plus the poll interval and the read itself).

Prints each round, the status table at the last detection and how many
heartbeat failures the nodes logged; with ``--json``, writes the settings,
each round and their summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from gpufeed._cli_admin import _cluster_table
from gpufeed.engine._membership import cluster_report
from gpufeed.engine._postgres import PostgresCatalog
from gpufeed.testing.node import NodeProcess, start_node
from gpufeed.testing.postgres import PostgresServer

_POLL_S = 0.05
_CLUSTER = "liveness"


def _health(catalog: PostgresCatalog, expiry_s: float) -> tuple[dict, dict[int, str]]:
    report = cluster_report(catalog.membership, _CLUSTER, expiry_s)
    return report, {n["s3_port"]: n["health"] for n in report["nodes"]}


def _port(node: NodeProcess) -> int:
    return int(node.s3_url.rsplit(":", 1)[1])


def _until(db: PostgresCatalog, expiry_s: float, port: int, health: str, timeout_s: float) -> tuple[float, dict]:
    """Seconds until the node on ``port`` shows ``health``, and the report that showed it
    (with ``"slowest_read_s"``, the longest status read while waiting, added)."""
    t0 = time.monotonic()
    slowest = 0.0
    while True:
        before = time.monotonic()
        report, seen = _health(db, expiry_s)
        slowest = max(slowest, time.monotonic() - before)
        if seen.get(port) == health:
            return time.monotonic() - t0, {**report, "slowest_read_s": slowest}
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"node on port {port} not {health} after {timeout_s} s: {seen}")
        time.sleep(_POLL_S)


def _all_live(db: PostgresCatalog, expiry_s: float, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _health(db, expiry_s)[0]["live"] < n:
        if time.monotonic() > deadline:
            raise TimeoutError("the nodes did not all become live")
        time.sleep(_POLL_S)


def run(rounds: int, heartbeat_s: float, expiry_s: float, workdir: Path) -> dict:
    """Measure; returns the JSON document."""
    env = {"GPUFEED_CLUSTER_HEARTBEAT_S": str(heartbeat_s), "GPUFEED_CLUSTER_EXPIRY_S": str(expiry_s)}
    results: list[dict] = []
    with PostgresServer() as pg:  # started by the with
        url = pg.create_database("liveness")
        args = ["--catalog", url, "--cluster", _CLUSTER]
        nodes = [start_node(workdir / f"n{i}", extra_args=args, env=env, timeout_s=120) for i in range(3)]
        db = PostgresCatalog(url, pool_size=2)
        try:
            report: dict = {}
            for r in range(rounds):
                _all_live(db, expiry_s, 3)
                victim = r % 3
                port = _port(nodes[victim])
                time.sleep(heartbeat_s * (0.3 + 0.2 * r))  # a different point between heartbeats each round
                nodes[victim].kill()
                took, report = _until(db, expiry_s, port, "expired", timeout_s=expiry_s * 3)
                [gone] = [n for n in report["nodes"] if n["s3_port"] == port]
                if r == rounds - 1:  # the table shown: as gpufeed admin cluster status shows it, counts and all
                    report = {**cluster_report(db.membership, _CLUSTER, expiry_s, count_under=db.under_replicated,
                                               count_under_parts=db.under_replicated_parts),
                              "slowest_read_s": report["slowest_read_s"]}
                results.append({"round": r, "killed": f"n{victim}", "kill_to_expired_s": round(took, 3),
                                "since_heartbeat_at_detection_s": gone["since_heartbeat_s"],
                                "slowest_status_read_s": round(report["slowest_read_s"], 3),
                                "load_average_1m": os.getloadavg()[0]})
                print(f"round {r}: n{victim} killed, shown expired after {took:.2f} s "
                      f"(last heartbeat {gone['since_heartbeat_s']:.2f} s before; slowest status read "
                      f"{report['slowest_read_s']:.2f} s; load {os.getloadavg()[0]:.1f})")
                nodes[victim] = start_node(workdir / f"n{victim}", extra_args=args, env=env, timeout_s=120)
            print(_cluster_table(report))
            _all_live(db, expiry_s, 3)
            nodes[0].stop()
            left_s, _ = _until(db, expiry_s, _port(nodes[0]), "left", timeout_s=expiry_s * 3)
            print(f"n0 stopped with SIGTERM, shown left after {left_s:.2f} s")
        finally:
            db.close()
            for n in nodes:
                n.stop()
        logs = [p.read_text(errors="replace") for p in sorted(workdir.glob("*.node.log"))]
    failures = sum(log.count("heartbeat failed") for log in logs)
    print(f"heartbeat failures the nodes logged: {failures}")
    took_all = [r["kill_to_expired_s"] for r in results]
    return {
        "command": "PYTHONPATH=src python scripts/cluster_liveness.py "
                   f"--rounds {rounds} --heartbeat {heartbeat_s:g} --expiry {expiry_s:g}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "nodes": 3, "heartbeat_s": heartbeat_s, "expiry_s": expiry_s, "poll_s": _POLL_S,
        "expected_range_s": [expiry_s - heartbeat_s, expiry_s + _POLL_S],
        "rounds": results,
        "kill_to_expired_s": {"min": min(took_all), "median": statistics.median(took_all), "max": max(took_all)},
        "sigterm_to_left_s": round(left_s, 3),
        "heartbeat_failures_logged": failures,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heartbeat", type=float, default=2.0, help="seconds between heartbeats")
    ap.add_argument("--expiry", type=float, default=10.0, help="seconds without a heartbeat before expiry")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufeed-liveness-") as d:
        doc = run(a.rounds, a.heartbeat, a.expiry, Path(d))
    print(json.dumps(doc["kill_to_expired_s"]))
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
