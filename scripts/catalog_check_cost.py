"""What the catalog's integrity check costs, and how long a recovery takes, on a
catalog of many objects (default 1,000,000).

    PYTHONPATH=src python scripts/catalog_check_cost.py [--objects N] [--dir DIR] [--json PATH]

Builds a data folder whose catalog holds N raw 1 MiB objects in one bucket (rows
as the engine writes them: object, manifest, chunk; no data files), then measures: the engine's open with each
check level (warm page cache), ``check_catalog`` at each level with the file
dropped from the page cache and warm, and ``recover_catalog`` after a page of
garbage is written into the middle of the objects table. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import tempfile
import time

from gpufeed.engine import Engine, check_catalog, recover_catalog
from gpufeed.engine._sqlite import SqliteCatalog


def build(data_dir: str, objects: int) -> str:
    """A catalog of ``objects`` raw 1 MiB objects as the engine stores them: an
    object row, its manifest, and one chunk in a data file named after the blob."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    path = os.path.join(data_dir, "catalog.sqlite3")
    SqliteCatalog(path, fsync=False).close()
    w = sqlite3.connect(path, isolation_level=None)
    w.execute("PRAGMA synchronous=OFF")
    w.execute("PRAGMA recursive_triggers=ON")
    w.execute("INSERT INTO buckets (name, created) VALUES ('bench', 0)")
    w.execute("BEGIN")
    now, size = time.time(), 1 << 20
    for i in range(objects):
        blob = os.urandom(16).hex()
        w.execute("INSERT INTO objects (bucket, key, size, etag, last_modified, content_type, metadata,"
                  " checksums, blob_id, version_id) VALUES ('bench', ?, ?, ?, ?, 'application/octet-stream',"
                  " '', '{\"crc32\":\"AAAAAA==\"}', ?, 'null')",
                  (f"datasets/train/shard-{i // 1000:05d}/sample-{i:08d}.tar", size, os.urandom(16).hex(), now,
                   blob))
        w.execute("INSERT INTO manifests (blob_id, size, chunks) VALUES (?, ?, 1)", (blob, size))
        w.execute("INSERT INTO manifest_chunks (blob_id, seq, chunk_id) VALUES (?, 0, ?)", (blob, blob))
        w.execute("INSERT INTO chunks (chunk_id, file, file_offset, stored, size, codec, digest, sums, domain,"
                  " refs, bucket) VALUES (?, ?, 0, ?, ?, '', ?, ?, NULL, 1, 'bench')",
                  (blob, blob, size, size, os.urandom(16), os.urandom(8 * (size >> 16))))
    w.execute("COMMIT")
    w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    w.close()
    return path


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(data_dir: str, objects: int) -> dict:
    path = build(data_dir, objects)
    out: dict = {"objects": objects, "catalog_mb": round(os.path.getsize(path) / 1e6, 1)}
    for level in ("quick", "full"):
        drop_cache(path)
        out[f"check_{level}_cold_s"] = round(check_catalog(path, level).seconds, 2)
        out[f"check_{level}_warm_s"] = round(check_catalog(path, level).seconds, 2)
    # The first open marks the chunks of the absent data files damaged (a write
    # per chunk); the timed opens come after it.
    for level in ("off", "quick", "full"):
        with Engine(data_dir, fsync=False, catalog_check="off"):
            pass  # warm the page cache
        start = time.perf_counter()
        with Engine(data_dir, fsync=False, catalog_check=level):
            pass
        out[f"engine_open_{level}_s"] = round(time.perf_counter() - start, 2)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    leaves = [r[0] for r in db.execute(
        "SELECT pageno FROM dbstat WHERE name='objects' AND pagetype='leaf' ORDER BY path")]
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(path, "r+b") as f:
        f.seek((leaves[len(leaves) // 2] - 1) * page_size)
        f.write(os.urandom(page_size))
    start = time.perf_counter()
    report = recover_catalog(data_dir)
    out["recover_s"] = round(time.perf_counter() - start, 2)
    out["recover_objects_saved"] = next(t.rows for t in report.tables if t.table == "objects")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="Work folder (default: a temp dir, removed after).")
    ap.add_argument("--json", default=None, help="Also write the result here.")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="gpufeed-catalog-cost-")
    try:
        result = measure(os.path.join(work, "data"), args.objects)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
