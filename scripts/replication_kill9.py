"""Replicate a bucket to a second node while killing either side with SIGKILL
at random points; check the end state.

    PYTHONPATH=src python scripts/replication_kill9.py [--size 1GiB] [--objects 16] [--cycles 10]
        [--seed 1] [--json out.json]

Starts a source and a target node (``gpufeed serve`` subprocesses on
127.0.0.1, replication worker off), writes ``--objects`` random objects of
``--size`` in all to the source with boto3, adds a rule, then runs
``--cycles`` cycles: start a round, wait a random 0-1.5 s, SIGKILL the source
or the target (alternately, starting with a random one), restart it on the
same data folder (and port, for the target), and resume. A last round runs
uncut. At the end it checks that every object reads back bit-identical on the
target and that the target received no chunk twice (``duplicate_chunks``).
Prints one line per cycle and, with ``--json``, writes the cycles and totals.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpufeed.admin import RemoteAdmin
from gpufeed.bench.io import machine_info
from gpufeed.replication import CHUNK_BYTES
from gpufeed.testing.node import NodeProcess, start_node

_ENV = {"GPUFEED_REPLICATION_INTERVAL_S": "0"}


def _size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, mult in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * mult)
    return int(text)


def _admin(node: NodeProcess) -> RemoteAdmin:
    return RemoteAdmin(node.s3_url, node.access_key, node.secret_key, timeout_s=600)


def _restart(node: NodeProcess, *, same_port: bool) -> NodeProcess:
    node.stop()
    extra = ["--s3-port", node.s3_url.rsplit(":", 1)[1]] if same_port else None
    return start_node(node.data_dir, env=_ENV, extra_args=extra)


def _cycle(nodes: dict, victim: str, delay_s: float) -> dict:
    """One round cut by a SIGKILL of ``victim`` after ``delay_s``; the victim restarted."""
    a = _admin(nodes["source"])
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = a.replication_sync("data")
        except Exception as exc:  # the victim died under it
            outcome["error"] = type(exc).__name__

    worker = threading.Thread(target=run)
    started = time.monotonic()
    worker.start()
    worker.join(delay_s)
    finished = not worker.is_alive()
    node = nodes[victim]
    node.proc.kill()
    node.proc.wait()
    worker.join(600)
    nodes[victim] = _restart(node, same_port=victim == "target")
    return {"victim": victim, "kill_after_s": round(delay_s, 3), "round_finished_first": finished,
            "round_s": round(time.monotonic() - started, 3), **outcome}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB", help="bytes in all (KiB/MiB/GiB suffixes)")
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    total = _size(args.size)
    with tempfile.TemporaryDirectory() as d:
        nodes = {"source": start_node(Path(d) / "source", env=_ENV), "target": start_node(Path(d) / "target", env=_ENV)}
        try:
            src = nodes["source"].boto3_client()
            src.create_bucket(Bucket="data")
            digests = {}
            for i in range(args.objects):
                body = os.urandom(total // args.objects)
                digests[f"obj-{i:03d}"] = hashlib.sha256(body).hexdigest()
                src.put_object(Bucket="data", Key=f"obj-{i:03d}", Body=body)
            src.close()
            t = nodes["target"]
            _admin(nodes["source"]).replication_add("data", t.s3_url, "data", t.access_key, t.secret_key)
            victims = ["source", "target"]
            rng.shuffle(victims)
            cycles = []
            for n in range(args.cycles):
                c = _cycle(nodes, victims[n % 2], rng.uniform(0.0, 1.5))
                cycles.append(c)
                print(json.dumps(c))
            last = _admin(nodes["source"]).replication_sync("data")
            status = _admin(nodes["source"]).replication_status("data")
            replica = _admin(nodes["target"]).replica_status("data")
            dst = nodes["target"].boto3_client()
            identical = all(hashlib.sha256(dst.get_object(Bucket="data", Key=k)["Body"].read()).hexdigest() == v
                            for k, v in digests.items())
            dst.close()
        finally:
            for node in nodes.values():
                node.stop()
    chunks = args.objects * -(-(total // args.objects) // CHUNK_BYTES)
    report = {"command": "python scripts/replication_kill9.py " + " ".join(sys.argv[1:]),
              "machine": machine_info(), "bytes": total, "objects": args.objects, "chunks": chunks,
              "cycles": cycles, "last_round": last,
              "chunks_sent": status["chunks_sent"], "chunks_received": replica["chunks_received"],
              "duplicate_chunks": replica["duplicate_chunks"], "bit_identical": identical}
    print(f"{total} bytes, {chunks} chunks, {args.cycles} kill -9 cycles: bit-identical {identical}, "
          f"chunks received {replica['chunks_received']}, received twice {replica['duplicate_chunks']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if not identical or replica["duplicate_chunks"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
