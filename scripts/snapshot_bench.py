"""Time bucket snapshot operations on a catalog of N current objects.

    PYTHONPATH=src python scripts/snapshot_bench.py [--objects 100000] [--snapshots 8] [--json out.json]

Fills one bucket's catalog with N objects (rows only, no data files: a
snapshot copies catalog rows, never data), then times S snapshot creations
(each kept, so the last shows the cost with S - 1 snapshots already there),
a diff against the live bucket, a restore that finds nothing to do, and a
deletion, on a data folder with fsync on (the node's default).
Prints one line per step and, with --json, writes them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid

from gpufeed.engine import Engine
from gpufeed.engine.types import ObjectInfo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--snapshots", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d, Engine(d, fsync=True) as eng:
        eng.create_bucket("bench")
        with eng._cat.write() as w:  # rows straight into the catalog: the data is not what is measured
            for i in range(args.objects):
                w.put_object(ObjectInfo("bench", f"data/shard-{i:07d}.bin", 4096, "0" * 32, time.time(),
                                        metadata={"source": "bench"}, blob_id=uuid.uuid4().hex))
        steps = [(f"create_{n}_s", lambda n=n: eng.create_snapshot("bench", f"s{n}")) for n in range(args.snapshots)]
        steps += [("diff_s", lambda: eng.diff_snapshots("bench", "s0")),
                  ("restore_noop_s", lambda: eng.restore_snapshot("bench", "s0")),
                  ("delete_s", lambda: eng.delete_snapshot("bench", "s0"))]
        for name, step in steps:
            t = time.perf_counter()
            step()
            out[name] = round(time.perf_counter() - t, 3)
            print(f"{name:16} {out[name]:8.3f}  ({args.objects} objects)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"objects": args.objects, **out}, f, indent=1)


if __name__ == "__main__":
    main()
