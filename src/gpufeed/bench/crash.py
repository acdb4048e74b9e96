"""``gpufeed bench crash``: kill -9 a node again and again under concurrent
writes, and check that nothing acknowledged is lost and nothing is leaked.

Each cycle starts the node on the same data folder (``fsync`` on), runs
``writers`` threads of puts, overwrites and deletes for a random 0.3-1.5 s
over three buckets (raw; zstd; dedup with 256 KiB chunks, where values share
chunks with each other), beside a thread that makes snapshots of random
buckets and deletes the oldest past three (so pinned data is released
too), then kills the node with SIGKILL in the middle of it all. After the
restart:

* every key's bytes are its last acknowledged value, or the value of a write
  still in flight when the node died (either is correct: it was never
  acknowledged); a key last acknowledged as deleted reads 404 (or the value in
  flight);
* every snapshot acknowledged as made and not deleted is there, and each of
  its objects reads as a version once written to that key;
* bytes of data files on disk equal the bytes the catalog's chunks occupy
  (no orphaned chunk, no leaked file), checked on the data folder between
  cycles with the engine's own recovery done.

JSON shape::

    {"benchmark": "crash", "command", "machine", "params",
     "results": {"cycles", "acknowledged_writes", "lost", "wrong", "in_flight_resolved",
                 "leaked_bytes_max", "recovery_s_max"},
     "targets": [...]}
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from ..client import Client
from ..engine import Engine
from ..errors import GpufeedError, NoSuchKey
from ..testing.node import start_node
from ._output import BenchProgress, summary_line, write_json
from .io import machine_info

__all__ = ["run_crash", "object_value"]

BUCKETS: dict[str, dict] = {"crash-raw": {}, "crash-zstd": {"compression": "zstd", "chunk_bytes": 256 << 10},
           "crash-dedup": {"dedup": True, "chunk_bytes": 256 << 10}}
_BASE = np.random.default_rng(99).integers(0, 256, 2 << 20, dtype=np.uint8).tobytes()


def object_value(bucket: str, version: int) -> bytes:
    """The bytes written as ``version`` of a key: dedup values share most of
    their chunks; zstd ones compress; raw ones are random."""
    rng = np.random.default_rng(version)
    n = int(rng.integers(1, 600_000))
    if bucket == "crash-dedup":
        start = int(rng.integers(0, 4)) * (256 << 10)
        return _BASE[start:start + n] + version.to_bytes(8, "little")
    if bucket == "crash-zstd":
        return (b"crash %d " % version) * (n // 12 + 1)
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


class _Ledger:
    """What the node acknowledged: ``(bucket, key) -> version`` (0: deleted), the
    writes in flight (sets of possible versions), every version ever written
    to a key (what a snapshot may hold), and the snapshots acknowledged as made
    (``bucket -> names``) and those whose delete was in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[tuple[str, str], int] = {}
        self.pending: dict[tuple[str, str], set[int]] = {}
        self.history: dict[tuple[str, str], set[int]] = {}
        self.snapshots: dict[str, list[str]] = {b: [] for b in BUCKETS}
        self.snapshot_maybe: set[tuple[str, str]] = set()
        self.writes = 0
        self.snapshot_ops = 0


def _writer(url: str, creds: dict, ledger: _Ledger, stop: threading.Event, seed: int, keys: int) -> None:
    rng = random.Random(seed)
    try:
        c = Client(url, **creds)
    except (GpufeedError, OSError):
        return
    try:
        while not stop.is_set():
            bucket = rng.choice(list(BUCKETS))
            name = (bucket, f"k{rng.randrange(keys):03d}")
            version = 0 if rng.random() < 0.2 else rng.randrange(1, 1 << 40)
            with ledger.lock:
                if name in ledger.pending:
                    continue  # one write at a time per key keeps the ledger exact
                ledger.pending[name] = {version}
                ledger.history.setdefault(name, set()).add(version)
            try:
                if version:
                    c.put(bucket, name[1], object_value(bucket, version))
                else:
                    c.delete(bucket, name[1])
            except (GpufeedError, OSError):
                return  # the node died: this write stays in flight
            with ledger.lock:
                ledger.acked[name] = version
                ledger.writes += 1
                del ledger.pending[name]
    finally:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - the node is gone
            pass


def _snapshotter(node, ledger: _Ledger, stop: threading.Event, seed: int) -> None:
    """Make snapshots of random buckets and delete the oldest past three, until the node dies."""
    from ..admin import RemoteAdmin

    rng = random.Random(seed)
    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    n = 0
    try:
        while not stop.is_set():
            bucket = rng.choice(list(BUCKETS))
            snaps = ledger.snapshots[bucket]
            if len(snaps) > 3:
                name, op = snaps[0], "delete"
                ledger.snapshot_maybe.add((bucket, name))
            else:
                name, op = f"s{seed % 100000:05d}-{n}", "create"
                n += 1
                ledger.snapshot_maybe.add((bucket, name))
            try:
                if op == "create":
                    admin.snapshot_create(bucket, name)
                    snaps.append(name)
                else:
                    admin.snapshot_delete(bucket, name)
                    snaps.remove(name)
            except (GpufeedError, OSError):
                return  # the node died: this one stays in doubt
            ledger.snapshot_maybe.discard((bucket, name))
            ledger.snapshot_ops += 1
            stop.wait(rng.uniform(0.05, 0.2))
    finally:
        admin.close()


def _check_snapshots(node, creds: dict, ledger: _Ledger, res: dict, problems: list[str]) -> None:
    """Every snapshot acknowledged as made (and not deleted) is there, and each of
    its objects reads as some version ever written to that key."""
    from ..admin import RemoteAdmin

    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    try:
        with Client(node.tcp_url, **creds) as c:
            for bucket, acked in ledger.snapshots.items():
                found = [s["name"] for s in admin.snapshot_list(bucket)["snapshots"]]
                for name in acked:
                    if name not in found and (bucket, name) not in ledger.snapshot_maybe:
                        res["lost"] += 1
                        problems.append(f"snapshot {bucket}@{name} was acknowledged and is gone")
                for name in found:
                    for e in c.list(bucket, snapshot=name):
                        got = bytes(c.get(bucket, e.key, snapshot=name))
                        res["snapshot_reads"] += 1
                        if not any(v and got == object_value(bucket, v)
                                   for v in ledger.history.get((bucket, e.key), ())):
                            res["wrong"] += 1
                            problems.append(f"snapshot {bucket}@{name}: {e.key} holds bytes never written")
                ledger.snapshots[bucket] = found
            ledger.snapshot_maybe.clear()
    finally:
        admin.close()


def _disk_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root / "blobs"):
        total += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names)
    return total


def run_crash(*, cycles: int = 100, writers: int = 4, keys: int = 40, seed: int = 0, json_path: str | None = None,
              data_dir: str | None = None, console: Console | None = None) -> dict:
    """Run the benchmark (see the module docstring); returns the JSON dict."""
    console = console or Console()
    rng = random.Random(seed)
    tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="gpufeed-crash-")
    root = Path(data_dir or tmp.name) / "data"  # type: ignore[union-attr]
    with Engine(root) as e:
        for b, policy in BUCKETS.items():
            e.create_bucket(b)
            if policy:
                e.set_bucket_data(b, **policy)
    ledger = _Ledger()
    res = {"cycles": 0, "acknowledged_writes": 0, "lost": 0, "wrong": 0, "in_flight_resolved": 0,
           "leaked_bytes_max": 0, "recovery_s_max": 0.0, "checked_keys": 0, "snapshot_ops": 0,
           "snapshot_reads": 0}
    problems: list[str] = []
    progress = BenchProgress("crash").start()
    for cycle in progress.track(range(cycles), f"kill -9 cycles ({writers} writers)"):
        t0 = time.perf_counter()
        node = start_node(root)
        res["recovery_s_max"] = max(res["recovery_s_max"], time.perf_counter() - t0)
        creds = dict(node.credentials)
        _check(node, creds, ledger, res, problems)
        _check_snapshots(node, creds, ledger, res, problems)
        stop = threading.Event()
        threads = [threading.Thread(target=_writer, args=(node.shm_url if i % 2 else node.tcp_url, creds, ledger,
                                                          stop, rng.randrange(1 << 30), keys))
                   for i in range(writers)]
        threads.append(threading.Thread(target=_snapshotter, args=(node, ledger, stop, rng.randrange(1 << 30))))
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.3, 1.5))
        node.kill()
        stop.set()
        for t in threads:
            t.join(30)
        res["cycles"] = cycle + 1
        with Engine(root) as e:  # recovery as the next start does it, then compare disk and catalog
            leaked = _disk_bytes(root) - e.node_data_stats()["stored_bytes"]
        res["leaked_bytes_max"] = max(res["leaked_bytes_max"], abs(leaked))
        if leaked:
            problems.append(f"cycle {cycle}: {leaked} bytes on disk that no chunk accounts for")
        console.print(f"  cycle {cycle + 1}/{cycles}: {ledger.writes} writes acknowledged so far, "
                      f"{len(ledger.pending)} in flight at the kill", soft_wrap=True)
    progress.step("final check")
    node = start_node(root)
    try:
        _check(node, dict(node.credentials), ledger, res, problems)
        _check_snapshots(node, dict(node.credentials), ledger, res, problems)
    finally:
        progress.close()
        node.stop()
    res["acknowledged_writes"] = ledger.writes
    res["snapshot_ops"] = ledger.snapshot_ops
    targets = [
        {"target": "acknowledged writes lost", "compare": "<=", "want": 0, "got": res["lost"], "met": res["lost"] == 0},
        {"target": "wrong bytes read", "compare": "<=", "want": 0, "got": res["wrong"], "met": res["wrong"] == 0},
        {"target": "bytes on disk - bytes referenced", "compare": "<=", "want": 0, "got": res["leaked_bytes_max"],
         "met": res["leaked_bytes_max"] == 0},
    ]
    out = {"benchmark": "crash", "command": " ".join(["gpufeed", "bench", "crash", *sys.argv[3:]]),
           "machine": machine_info(), "params": {"cycles": cycles, "writers": writers, "keys": keys, "seed": seed,
                                                  "fsync": True},
           "results": res, "problems": problems[:50], "targets": targets}
    console.print(f"crash: {res['cycles']} kill -9 cycles, {res['acknowledged_writes']} acknowledged writes, "
                  f"{res['lost']} lost, {res['wrong']} wrong, {res['in_flight_resolved']} in-flight writes "
                  f"resolved either way, {res['snapshot_ops']} snapshot creates and deletes, "
                  f"{res['snapshot_reads']} snapshot reads checked, leaked bytes max {res['leaked_bytes_max']}, "
                  f"restart max {res['recovery_s_max']:.2f} s")
    if json_path:
        write_json(json_path, out)
    if tmp is not None:
        tmp.cleanup()
    progress.done(summary_line("crash", out, json_path))
    return out


def _check(node, creds: dict, ledger: _Ledger, res: dict, problems: list[str]) -> None:
    """Read every key the ledger knows and settle writes left in flight."""
    with Client(node.tcp_url, **creds) as c:
        for name in sorted(set(ledger.acked) | set(ledger.pending)):
            allowed = {ledger.acked.get(name, 0)} | ledger.pending.get(name, set())
            try:
                got = bytes(c.get(*name))
            except NoSuchKey:
                got = None
            match = [v for v in allowed if (got is None and v == 0) or (v and got == object_value(name[0], v))]
            res["checked_keys"] += 1
            if not match:
                if got is None:
                    res["lost"] += 1
                    problems.append(f"{name}: acknowledged version {ledger.acked.get(name)} is gone")
                else:
                    res["wrong"] += 1
                    problems.append(f"{name}: bytes match none of versions {sorted(allowed)}")
                continue
            if name in ledger.pending:
                res["in_flight_resolved"] += 1
            ledger.acked[name] = match[0]
        ledger.pending.clear()
