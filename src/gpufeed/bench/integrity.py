"""``gpufeed bench integrity``: damage stored data under a running node and read
everything back through every front.

A node serves three buckets: ``int-raw`` (the default policy: one raw chunk
per object), ``int-zstd`` (zstd, 256 KiB chunks) and ``int-dedup`` (dedup,
256 KiB chunks). ``objects`` objects of 1 KiB-512 KiB (random bytes; text in
the zstd bucket) are written through the SDK, then, while the node runs,
three quarters of them get one harm each, at random: a flipped bit in one of
their chunks, a data file truncated inside a chunk, or a data file deleted.
Every object is then read back through S3 (boto3), the fast path over TCP and
over shm (``get`` and ``get_into``) and, for objects stored as one raw file,
the zero-copy map; after every failed read over the fast path a good object
is read on the same connection, which must still work. Finally ``gpufeed
scrub`` (the engine's scrub, the node stopped) must report every harmed chunk.

A read counts as *detected* when it fails with an error (S3: an error status
or a body that breaks off; SDK: ``DamagedObject``); *wrong* when it returns
bytes that differ from what was written (the target: none, ever);
*false alarm* when an unharmed object fails.

JSON shape::

    {"benchmark": "integrity", "command", "machine", "params",
     "results": [{"path", "reads", "damaged", "detected", "wrong", "false_alarms", "seconds"}],
     "scrub": {"damaged_chunks", "found", "seconds"},
     "targets": [{"target", "compare", "want", "got", "met"}]}
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from ..client import Client
from ..engine import Engine
from ..errors import DamagedObject, GpufeedError
from ..testing.node import start_node
from ._output import BenchProgress, summary_line, write_json
from .io import machine_info

__all__ = ["run_integrity"]

BUCKETS: dict[str, dict] = {"int-raw": {}, "int-zstd": {"compression": "zstd", "chunk_bytes": 256 << 10},
           "int-dedup": {"dedup": True, "chunk_bytes": 256 << 10}}
HARMS = ("flip", "truncate", "delete")


def _data(bucket: str, seed: int, size: int) -> bytes:
    rng = np.random.default_rng(seed)
    if bucket == "int-zstd":
        words = np.array([b"token", b"gpufeed", b"chunk", b"the", b"of", b"tensor"], dtype=object)
        return b" ".join(words[rng.integers(0, len(words), size // 4 + 1)])[:size]
    return rng.integers(0, 256, size, dtype=np.uint8).tobytes()


def _chunks(catalog: Path, bucket: str, key: str) -> list[tuple[str, str, int, int]]:
    """``(chunk_id, file, offset, stored)`` of an object's chunks (read-only catalog query)."""
    db = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
    try:
        return db.execute(
            "SELECT c.chunk_id, c.file, c.file_offset, c.stored FROM objects o"
            " JOIN manifest_chunks m ON m.blob_id = o.blob_id JOIN chunks c ON c.chunk_id = m.chunk_id"
            " WHERE o.bucket=? AND o.key=? ORDER BY m.seq", (bucket, key)).fetchall()
    finally:
        db.close()


def _harm(data_dir: Path, chunk: tuple[str, str, int, int], harm: str, rng: random.Random) -> None:
    _, file, offset, stored = chunk
    path = data_dir / "blobs" / file[:2] / file[2:4] / file
    if harm == "delete":
        os.unlink(path)
    elif harm == "truncate":
        os.truncate(path, offset + rng.randrange(stored))
    else:
        pos = offset + rng.randrange(stored)
        with open(path, "r+b") as f:
            f.seek(pos)
            b = f.read(1)
            f.seek(pos)
            f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))


def run_integrity(*, objects: int = 1000, seed: int = 0, json_path: str | None = None,
                  data_dir: str | None = None, console: Console | None = None) -> dict:
    """Run the benchmark (see the module docstring); returns the JSON dict.

    Raises:
        RuntimeError: the node did not start.
    """
    console = console or Console()
    rng = random.Random(seed)
    tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="gpufeed-integrity-")
    root = Path(data_dir or tmp.name) / "data"  # type: ignore[union-attr]
    with Engine(root, fsync=False) as e:
        for b, policy in BUCKETS.items():
            e.create_bucket(b)
            if policy:
                e.set_bucket_data(b, **policy)
    plan = [(list(BUCKETS)[i % 3], f"obj-{i:05d}", rng.randrange(1 << 10, 512 << 10)) for i in range(objects)]
    progress = BenchProgress("integrity").start()
    progress.step("start node")
    node = start_node(root)
    results: list[dict] = []
    harmed_chunks: set[str] = set()
    harmed_files: set[str] = set()
    try:
        with Client(node.tcp_url) as tcp, Client(node.shm_url) as shm:
            for i, (b, k, size) in enumerate(progress.track(plan, f"write {objects} objects")):
                tcp.put(b, k, _data(b, i, size))
            progress.step("damage three quarters of them")
            good_key = "known-good"
            tcp.put("int-raw", good_key, b"still fine")
            damaged: set[int] = set()
            catalog = root / "catalog.sqlite3"
            for b, k, _size in plan:
                if rng.random() < 0.75:
                    chunks = _chunks(catalog, b, k)
                    c = rng.choice(chunks)
                    if c[0] in harmed_chunks:
                        continue
                    _harm(root, c, rng.choice(HARMS), rng)
                    harmed_chunks.add(c[0])
                    harmed_files.add(c[1])
            for i, (b, k, _size) in enumerate(plan):  # damaged: it uses a harmed chunk, or a chunk
                if any(c[0] in harmed_chunks or c[1] in harmed_files  # in a file cut short or deleted
                       for c in _chunks(catalog, b, k)):
                    damaged.add(i)
            chunk_files = {c[0]: c[1] for b, k, _ in plan for c in _chunks(catalog, b, k)}
            s3 = node.boto3_client(retries={"total_max_attempts": 1})  # a 500 is final here: count it once
            paths = {
                "s3": lambda b, k, n: s3.get_object(Bucket=b, Key=k)["Body"].read(),
                "tcp": lambda b, k, n: bytes(tcp.get(b, k)),
                "shm": lambda b, k, n: bytes(shm.get(b, k)),
                "shm_get_into": lambda b, k, n: _get_into(shm, b, k, n),
                "zero_copy_map": lambda b, k, n: bytes(shm.map_object(b, k)),
            }
            for name, read in paths.items():
                progress.step(f"read every object back via {name}")
                results.append(_read_all(name, read, plan, damaged, tcp if name == "tcp" else shm, good_key))
    finally:
        code = node.stop()
    if code != 0:
        raise RuntimeError(f"node exited with {code}: {node.log_path.read_text()[-2000:]}")
    progress.step("scrub")
    t0 = time.perf_counter()
    with Engine(root, fsync=False) as e:
        report = e.scrub()
    scrub_s = time.perf_counter() - t0
    found = {d["chunk"] for d in report.damaged}
    scrub = {"damaged_chunks": len(harmed_chunks), "found": len(found & harmed_chunks),
             "also_found": len(found - harmed_chunks),  # chunks sharing a file that was cut short or deleted
             "false_alarms": len({c for c in found - harmed_chunks if chunk_files.get(c) not in harmed_files}),
             "seconds": round(scrub_s, 3)}
    out = _report(objects, seed, results, scrub, console)
    if json_path:
        write_json(json_path, out)
    if tmp is not None:
        tmp.cleanup()
    progress.done(summary_line("integrity", out, json_path))
    return out


def _get_into(c: Client, b: str, k: str, n: int) -> bytes:
    buf = bytearray(n)
    got = c.get_into(b, k, buf)
    return bytes(buf[:got])


def _read_all(name: str, read, plan, damaged: set[int], conn: Client, good_key: str) -> dict:
    row: dict = {"path": name, "reads": 0, "damaged": 0, "detected": 0, "wrong": 0, "false_alarms": 0,
           "not_mappable": 0, "connection_lost": 0}
    t0 = time.perf_counter()
    for i, (b, k, size) in enumerate(plan):
        want = _data(b, i, size)
        bad = i in damaged
        try:
            got = read(b, k, size)
        except GpufeedError as exc:
            if name == "zero_copy_map" and not isinstance(exc, DamagedObject) and exc.code == "InvalidRequest":
                row["not_mappable"] += 1  # stored in chunks: this path refuses it whole
                continue
            ok = False
        except Exception:  # noqa: BLE001 - S3: an error status or a body that broke off
            ok = False
        else:
            ok = True
        row["reads"] += 1
        row["damaged"] += bad
        if not ok:
            row["detected" if bad else "false_alarms"] += 1
            if name != "s3":
                try:
                    assert bytes(conn.get("int-raw", good_key)) == b"still fine"
                except Exception:  # noqa: BLE001
                    row["connection_lost"] += 1
        elif got != want:
            row["wrong"] += 1
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def _report(objects: int, seed: int, results: list[dict], scrub: dict, console: Console) -> dict:
    table = Table(title=f"integrity: {objects} objects, 3/4 harmed (bit flip, truncation, deleted file)")
    for col in ("path", "reads", "damaged", "detected", "wrong", "false alarms", "conn. lost", "s"):
        table.add_column(col, justify="right" if col != "path" else "left")
    for r in results:
        table.add_row(r["path"], str(r["reads"]), str(r["damaged"]), str(r["detected"]), str(r["wrong"]),
                      str(r["false_alarms"]), str(r["connection_lost"]), f"{r['seconds']:.2f}")
    console.print(table)
    console.print(f"scrub: found {scrub['found']} of {scrub['damaged_chunks']} harmed chunks, "
                  f"{scrub['also_found']} more in the same cut or deleted files, "
                  f"{scrub['false_alarms']} false alarms, in {scrub['seconds']:.2f} s")
    detected = sum(r["detected"] for r in results)
    should = sum(r["damaged"] for r in results)
    targets = [
        {"target": "damaged reads detected", "compare": ">=", "want": should, "got": detected,
         "met": detected >= should},
        {"target": "wrong bytes served", "compare": "<=", "want": 0, "got": sum(r["wrong"] for r in results),
         "met": all(r["wrong"] == 0 for r in results)},
        {"target": "false alarms", "compare": "<=", "want": 0,
         "got": sum(r["false_alarms"] for r in results), "met": all(r["false_alarms"] == 0 for r in results)},
        {"target": "fast-path connections lost", "compare": "<=", "want": 0,
         "got": sum(r["connection_lost"] for r in results),
         "met": all(r["connection_lost"] == 0 for r in results)},
        {"target": "damaged chunks found by scrub", "compare": ">=", "want": scrub["damaged_chunks"],
         "got": scrub["found"], "met": scrub["found"] == scrub["damaged_chunks"]},
        {"target": "scrub false alarms", "compare": "<=", "want": 0, "got": scrub["false_alarms"],
         "met": scrub["false_alarms"] == 0},
    ]
    return {"benchmark": "integrity", "command": " ".join(["gpufeed", "bench", "integrity", *sys.argv[3:]]),
            "machine": machine_info(), "params": {"objects": objects, "seed": seed},
            "results": results, "scrub": scrub, "targets": targets}
