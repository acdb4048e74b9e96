"""kill -9 of a node under concurrent puts, overwrites and deletes (raw,
compressed and dedup buckets) and snapshot creates and deletes: after every
restart each key holds its last acknowledged bytes (or those of a write in
flight at the kill), every acknowledged snapshot is there and reads back
written bytes, and the bytes of data files on disk equal the bytes the
catalog's chunks occupy."""

from __future__ import annotations

from rich.console import Console

from gpufeed.bench.crash import run_crash


def test_kill_9_cycles_lose_nothing_and_leak_nothing(tmp_path):
    out = run_crash(cycles=4, writers=4, keys=12, seed=3, data_dir=str(tmp_path), console=Console(quiet=True))
    r = out["results"]
    assert r["cycles"] == 4 and r["acknowledged_writes"] > 50 and r["checked_keys"] > 20
    assert r["snapshot_ops"] > 3 and r["snapshot_reads"] > 0
    assert [t for t in out["targets"] if not t["met"]] == [], out["problems"]
