"""``gpufeed bench io``: one object, every data path, side by side in one run.

Paths: ``local`` (the same bytes read from a local file with ``readinto``: the
physical limit), ``shm`` (fast path, shared memory), ``tcp`` (fast path, TCP)
and ``s3`` (boto3 against the node's own S3 endpoint). For each: large-read
GB/s, put GB/s, client+server CPU seconds per GB, p50/p99 latency of single
4 KiB gets, and 4 KiB random-read IOPS with batched requests (S3 has no batch
call: 16 threads of ranged GETs; shm and tcp also as one GETR of 256 ranges
per request, ``iops_4k_ranges``). Every read is checked against the stored
block sums (the default); the ``shm_unchecked`` row reads the same object from
a bucket with checks off, in turns with the checked ``shm`` read (its
``gbps_side_by_side``): ``checked_vs_unchecked`` is the price of checking
(target ≥ 0.8). The floors (:mod:`._io_floors`), measured in the same run: a
bare Python round trip under the single-get p50 (over a Unix socket for the
shm row, over loopback TCP for the tcp row) and a bare ``os.preadv`` loop
under the batched 4 KiB IOPS (``p50_vs_floor``, ``iops_vs_floor`` on the shm
and tcp rows). With ``--cold`` the object's pages are dropped
with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before each cold measurement (rows
``local_cold``, ``shm_cold``, ...).

JSON shape (reused by every benchmark)::

    {"benchmark": "io", "machine": {...}, "params": {...},
     "results": [{"path": "local"|"shm"|"tcp"|"s3"|"shm_unchecked"|"<path>_cold", "gbps": float,
                  "put_gbps": float|None, "cpu_s_per_gb": float, "p50_us": float|None,
                  "p99_us": float|None, "iops_4k": float|None,
                  "iops_4k_ranges": float (shm, tcp: the same reads as GETR columns)}],
     "floors": {"unix_round_trip_p50_us", "unix_round_trip_p99_us", "tcp_round_trip_p50_us",
                "tcp_round_trip_p99_us", "preadv_4k_iops", "targets": {...}}}

GB/s are 10^9 bytes per second.
"""

from __future__ import annotations

import os
import platform
import random
import resource
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil

from ._output import summary_line, write_json

__all__ = ["run_io_bench", "machine_info", "CpuMeter", "drop_cache"]

GB = 1e9
CHUNK = 64 << 20  # 64 MiB readinto calls for the local baseline
BUCKET = "bench-io"
UNCHECKED_BUCKET = "bench-unchecked"  # the same object, read checks off


def machine_info() -> dict:
    """CPU, memory, OS and library versions, for every benchmark's JSON."""
    import sys

    from .._version import __version__

    info = {
        "cpus": os.cpu_count(),
        "cpu_model": platform.processor() or platform.machine(),
        "mem_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "gpufeed": __version__,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for lib in ("torch", "safetensors", "transformers"):  # versions of those loaded
        mod = sys.modules.get(lib)
        if mod is not None:
            info[lib] = getattr(mod, "__version__", "?")
    return info


class CpuMeter:
    """CPU seconds (user + system) of this process and optionally a server process."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server = psutil.Process(server_pid) if server_pid else None

    def self_s(self) -> float:
        """CPU seconds of this process (all threads)."""
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def server_s(self) -> float:
        """CPU seconds of the server process (0 without one)."""
        if self.server is None:
            return 0.0
        t = self.server.cpu_times()
        return t.user + t.system

    def sample(self) -> float:
        """Client + server CPU seconds."""
        return self.self_s() + self.server_s()


def drop_cache(paths) -> None:
    """Drop the page-cache pages of each file (``POSIX_FADV_DONTNEED``)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _blob_files(data_dir: Path) -> list[str]:
    files = [str(p) for p in (data_dir / "blobs").rglob("*") if p.is_file()]
    if not files:
        raise RuntimeError(f"no blob files under {data_dir}: cannot drop the object's pages")
    return files


def _best(fn, repeat: int, before=None) -> tuple[float, float]:
    """Run ``fn`` ``repeat`` times; returns (best seconds, CPU seconds of that run)."""
    best = (float("inf"), 0.0)
    for _ in range(repeat):
        if before:
            before()
        c0, t0 = fn.meter.sample(), time.perf_counter()
        fn()
        dt, dc = time.perf_counter() - t0, fn.meter.sample() - c0
        if dt < best[0]:
            best = (dt, dc)
    return best


class _Timed:
    def __init__(self, fn, meter: CpuMeter) -> None:
        self.fn, self.meter = fn, meter

    def __call__(self):
        return self.fn()


def _latency(fn, offsets: list[int]) -> tuple[float, float]:
    lat = []
    for off in offsets:
        t0 = time.perf_counter()
        fn(off)
        lat.append(time.perf_counter() - t0)
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


def _lease_row(node, key: str, offsets: list[int], seconds: float) -> dict:
    """Single 4 KiB gets of the same offsets through a client with read leases
    (``Client(leases=True)``: reads in this process, checked, while the lease
    holds): ``p50_us_lease``, ``p99_us_lease`` and ``iops_4k_lease`` (one thread,
    one read at a time); ``{}`` when the node offers no leases."""
    from ..client import Client

    with Client(node.shm_url, leases=True, **node.credentials) as c:
        if c.leases is None:  # the node offers none
            return {}
        buf = bytearray(4096)
        c.get_into(BUCKET, key, buf)  # the first read takes the lease
        p50, p99 = _latency(lambda off: c.get_into(BUCKET, key, buf, offset=off), offsets)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for off in offsets[:256]:
                c.get_into(BUCKET, key, buf, offset=off)
            done += 256
        return {"p50_us_lease": p50, "p99_us_lease": p99, "iops_4k_lease": done / (time.perf_counter() - t0),
                "lease_hits": c.leases.hits}


def _unchecked_row(node, shm, region, dest, size: int, repeat: int, meter, *, by_path: list[dict]) -> dict:
    """``shm_unchecked``: the shm read of the same object from a bucket with read
    checks off (``verify`` off), timed in turns with the checked ``shm`` read;
    the ``shm`` row's ``gbps`` is replaced by the best of its turns here, so the
    two are measured side by side."""
    from ..admin import RemoteAdmin

    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    try:
        shm.create_bucket(UNCHECKED_BUCKET)
        admin.bucket_data(UNCHECKED_BUCKET, verify=False)
    finally:
        admin.close()
    shm.put(UNCHECKED_BUCKET, "object.bin", region)
    timed = {b: _Timed(lambda b=b: shm.get_into(b, "object.bin", dest), meter) for b in (BUCKET, UNCHECKED_BUCKET)}
    best = {b: (1e9, 0.0) for b in timed}
    for _ in range(repeat + 1):  # turns; the first warms
        for b, fn in timed.items():
            dt, dc = _best(fn, 1)
            if dt < best[b][0]:
                best[b] = (dt, dc)
    shm.delete(UNCHECKED_BUCKET, "object.bin")
    checked = next(r for r in by_path if r["path"] == "shm")
    checked["gbps_side_by_side"] = size / best[BUCKET][0] / GB
    dt, dc = best[UNCHECKED_BUCKET]
    return {"path": "shm_unchecked", "gbps": size / dt / GB, "put_gbps": None, "cpu_s_per_gb": dc / (size / GB),
            "p50_us": None, "p99_us": None, "iops_4k": None, "seconds": dt,
            "checked_vs_unchecked": round(checked["gbps_side_by_side"] / (size / dt / GB), 3)}


def run_io_bench(*, size: int = 1 << 30, cold: bool = False, json_path: str | None = None,
                 paths: list[str] | None = None, repeat: int = 3, data_dir: str | None = None,
                 lat_samples: int = 2000, iops_seconds: float = 2.0, quiet: bool = False,
                 writes: bool = True) -> dict:
    """Run the I/O benchmark; print a table and return (and optionally write) the JSON.

    Args:
        size: object size in bytes.
        cold: add rows measured after dropping the object's pages.
        json_path: write the JSON here.
        paths: subset of ``["local", "shm", "tcp", "s3"]``.
        repeat: large-read repetitions per path (the fastest is reported).
        data_dir: node data folder (default: a fresh temporary folder, removed after).
        lat_samples: single 4 KiB gets per latency measurement.
        iops_seconds: duration of each IOPS measurement, seconds.
        writes: with the s3 path, add the write rows and the S3 GET / HTTP-limit
            pair (see :mod:`gpufeed.bench._io_writes`; best of ``repeat - 1``).
    """
    from rich.console import Console
    from rich.table import Table

    from ..client import Client
    from ..testing.node import start_node

    paths = paths or ["local", "shm", "tcp", "s3"]
    console = Console(quiet=quiet, width=max(Console().width, 110))
    tmp = tempfile.TemporaryDirectory(prefix="gpufeed-bench-") if data_dir is None else None
    root = Path(tmp.name if tmp is not None else str(data_dir))
    node = start_node(root / "node")
    results: list[dict] = []
    write_out: dict | None = None
    try:
        meter = CpuMeter(node.pid)
        local_meter = CpuMeter()
        rng = np.random.default_rng(0)
        console.print(f"[bold]gpufeed bench io[/]: {size / GB:.2f} GB object, paths {paths}")
        src = np.empty(size, dtype=np.uint8)
        if size:  # a random 1 MiB pattern, repeated (no size-long index array)
            src[:] = np.resize(rng.integers(0, 256, size=min(size, 1 << 20), dtype=np.uint8), size)
        src_path = root / "local.bin"
        with open(src_path, "wb") as f:
            f.write(src.data)
        shm = Client(node.shm_url, **node.credentials)
        tcp = Client(node.tcp_url, **node.credentials)
        s3 = node.boto3_client()
        shm.create_bucket(BUCKET)
        key = "object.bin"
        # the shared object everyone reads, written through the shm path
        region = shm.alloc(size)
        np.frombuffer(region, np.uint8)[:] = src
        offsets = [random.Random(1).randrange(0, max(size - 4096, 1)) // 4096 * 4096
                   for _ in range(lat_samples)]

        def put_rate(path: str) -> float | None:
            def do():
                if path == "local":
                    with open(root / "local-put.bin", "wb") as f:
                        f.write(memoryview(src))
                        os.fsync(f.fileno())
                elif path == "shm":
                    shm.put(BUCKET, key, region)
                elif path == "tcp":
                    tcp.put(BUCKET, "tcp-put.bin", src)
                elif path == "s3":
                    s3.put_object(Bucket=BUCKET, Key="s3-put.bin", Body=src.tobytes())
            m = local_meter if path == "local" else meter
            dt, _ = _best(_Timed(do, m), 1)
            return size / dt / GB

        put = {}
        for path in ["shm"] + [x for x in paths if x != "shm"]:
            console.print(f"  put via {path} ...")
            put[path] = put_rate(path)
        for extra in ("tcp-put.bin", "s3-put.bin"):
            shm.delete(BUCKET, extra)
        (root / "local-put.bin").unlink(missing_ok=True)
        if writes and "s3" in paths:
            from ._io_writes import write_rows

            write_out = write_rows(node=node, shm=shm, s3=s3, bucket=BUCKET, key=key, src=src, region=region,
                                   src_path=src_path, root=root, repeat=max(1, repeat - 1), console=console,
                                   meter_of=CpuMeter)

        tcp_buf = np.empty(size, dtype=np.uint8)
        tcp_buf[:] = 0
        local_buf = np.empty(size, dtype=np.uint8)
        local_buf[:] = 0
        dest = shm.alloc(size)
        np.frombuffer(dest, np.uint8)[:] = 0

        def read_fn(path: str):
            if path == "local":
                def do():
                    mv = memoryview(local_buf)
                    with open(src_path, "rb", buffering=0) as f:
                        pos = 0
                        while pos < size:
                            n = f.readinto(mv[pos:pos + CHUNK])
                            if not n:
                                break
                            pos += n
                return do
            if path == "shm":
                return lambda: shm.get_into(BUCKET, key, dest)
            if path == "tcp":
                return lambda: tcp.get_into(BUCKET, key, tcp_buf)
            return lambda: s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

        small_shm = shm.alloc(4096)
        small_tcp = bytearray(4096)
        small_local = bytearray(4096)
        local_fd = os.open(src_path, os.O_RDONLY)

        def single_get(path: str):
            if path == "local":
                return lambda off: os.preadv(local_fd, [small_local], off)
            if path == "shm":
                return lambda off: shm.get_into(BUCKET, key, small_shm, offset=off)
            if path == "tcp":
                return lambda off: tcp.get_into(BUCKET, key, small_tcp, offset=off)
            return lambda off: s3.get_object(Bucket=BUCKET, Key=key,
                                             Range=f"bytes={off}-{off + 4095}")["Body"].read()

        def iops(path: str, ranges: bool = False) -> float:
            r = random.Random(2)
            np_rng = np.random.default_rng(2)
            limit = max(size - 4096, 1)
            done, t_end = 0, time.perf_counter() + iops_seconds
            t0 = time.perf_counter()
            if path == "local":
                while time.perf_counter() < t_end:
                    for _ in range(256):
                        os.preadv(local_fd, [small_local], r.randrange(0, limit) // 4096 * 4096)
                    done += 256
            elif path in ("shm", "tcp"):
                client = shm if path == "shm" else tcp
                batch = 256
                bufs = client.alloc(4096 * batch * 4)
                inflight: list = []
                k = 0
                while time.perf_counter() < t_end or inflight:
                    if time.perf_counter() < t_end and len(inflight) < 4:
                        base = (k % 4) * batch * 4096
                        k += 1
                        if ranges:  # one GETR of 256 offsets (columns), packed into the batch's slot
                            offsets = np_rng.integers(0, limit // 4096, batch) * 4096
                            inflight.append(client.submit_get_ranges_into(
                                BUCKET, key, bufs[base:base + batch * 4096], offsets, 4096))
                            continue
                        reqs = [(BUCKET, key, bufs[base + i * 4096: base + (i + 1) * 4096],
                                 r.randrange(0, limit) // 4096 * 4096) for i in range(batch)]
                        inflight.append(client.submit_get_many_into(reqs))
                        continue
                    inflight.pop(0).result()
                    done += batch
            else:
                def one(_):
                    off = r.randrange(0, limit) // 4096 * 4096
                    s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={off}-{off + 4095}")["Body"].read()
                with ThreadPoolExecutor(16) as ex:
                    while time.perf_counter() < t_end:
                        list(ex.map(one, range(64)))
                        done += 64
            return done / (time.perf_counter() - t0)

        blobs = _blob_files(root / "node")
        for path in paths:
            console.print(f"  reads via {path} ...")
            m = local_meter if path == "local" else meter
            fn = _Timed(read_fn(path), m)
            fn()  # warm: page cache, mappings, connections
            dt, dc = _best(fn, repeat)
            p50, p99 = _latency(single_get(path), offsets)
            results.append({
                "path": path, "gbps": size / dt / GB, "put_gbps": put.get(path),
                "cpu_s_per_gb": dc / (size / GB), "p50_us": p50, "p99_us": p99,
                "iops_4k": iops(path), "seconds": dt,
            })
            if path in ("shm", "tcp"):
                results[-1]["iops_4k_ranges"] = iops(path, ranges=True)
            if path == "shm":
                results[-1].update(_lease_row(node, key, offsets, iops_seconds))
        floors = None
        if {"shm", "tcp"} & set(paths):
            console.print("  floors: bare Unix-socket and TCP round trips, bare preadv loop ...")
            floors = _floors(results, max(blobs, key=os.path.getsize), size, iops_seconds)
        if "shm" in paths:
            console.print("  shm reads from a bucket that does not check them ...")
            results.append(_unchecked_row(node, shm, region, dest, size, repeat, meter, by_path=results))
        if cold:
            for path in paths:
                console.print(f"  cold reads via {path} ...")
                m = local_meter if path == "local" else meter
                fn = _Timed(read_fn(path), m)
                dt, dc = _best(fn, max(1, repeat - 1),
                               before=lambda: drop_cache([src_path, *blobs]))
                results.append({
                    "path": f"{path}_cold", "gbps": size / dt / GB, "put_gbps": None,
                    "cpu_s_per_gb": dc / (size / GB), "p50_us": None, "p99_us": None,
                    "iops_4k": None, "seconds": dt,
                })
        os.close(local_fd)
        shm.close()
        tcp.close()
        s3.close()
    finally:
        node.stop()
        if tmp is not None:
            tmp.cleanup()

    out = {"benchmark": "io", "machine": machine_info(),
           "params": {"size_bytes": size, "repeat": repeat, "best_of": repeat,
                      "lat_samples": lat_samples, "iops_batch": 256, "fsync": True},
           "results": results}
    if write_out is not None:
        out["writes"] = write_out["rows"]
        out["ratios"] = write_out["ratios"]
        out["notes"] = write_out["notes"]
    if floors is not None:
        out["floors"] = floors
    by = {r["path"]: r for r in results}
    if "shm_unchecked" in by:
        out["checked_vs_unchecked"] = {"shm_gbps": round(by["shm"]["gbps_side_by_side"], 3),
                                       "shm_unchecked_gbps": round(by["shm_unchecked"]["gbps"], 3),
                                       "ratio": by["shm_unchecked"]["checked_vs_unchecked"], "target": 0.8}
    table = Table(title=f"gpufeed bench io — {size / GB:.2f} GB object (best of {repeat})")
    for col in ("path", "read GB/s", "put GB/s", "CPU s/GB", "p50 µs", "p99 µs", "4K IOPS", "× s3"):
        table.add_column(col, justify="right" if col != "path" else "left", no_wrap=True)

    def fmt(v, spec):
        return "—" if v is None else format(v, spec)

    for r in results:
        base = by.get("s3_cold" if r["path"].endswith("_cold") else "s3")
        ratio = r["gbps"] / base["gbps"] if base else None
        table.add_row(r["path"], fmt(r["gbps"], ".2f"), fmt(r["put_gbps"], ".2f"),
                      fmt(r["cpu_s_per_gb"], ".3f"), fmt(r["p50_us"], ".0f"),
                      fmt(r["p99_us"], ".0f"), fmt(r["iops_4k"], ",.0f"), fmt(ratio, ".1f"))
    console.print(table)
    if floors is not None:
        console.print(f"  floors: Unix-socket round trip p50 {floors['unix_round_trip_p50_us']:.0f} µs, "
                      f"TCP round trip p50 {floors['tcp_round_trip_p50_us']:.0f} µs, "
                      f"bare preadv {floors['preadv_4k_iops']:,} 4 KiB reads/s")
    for r in results:
        if r.get("iops_4k_ranges"):
            vs = f" ({r['iops_ranges_vs_floor']:.2f} x the preadv floor)" if "iops_ranges_vs_floor" in r else ""
            console.print(f"  {r['path']}: 4 KiB reads as one GETR of 256 ranges per request: "
                          f"{r['iops_4k_ranges']:,.0f}/s{vs}")
        if r.get("p50_us_lease"):
            console.print(f"  {r['path']} with read leases: single 4 KiB get p50 {r['p50_us_lease']:.1f} µs, "
                          f"p99 {r['p99_us_lease']:.1f} µs, {r['iops_4k_lease']:,.0f} gets/s on one thread")
    if write_out is not None:
        _print_writes(console, write_out)
    if json_path:
        write_json(json_path, out)
    console.print(summary_line("io", out, json_path))
    return out


def _floors(results: list[dict], data_file: str, size: int, iops_seconds: float) -> dict:
    """Measure the floors (:mod:`._io_floors`) and state the shm and tcp rows
    against them (``p50_vs_floor``, ``iops_vs_floor``)."""
    from ._io_floors import echo_floor, preadv_floor

    p50, p99 = (round(v, 1) for v in echo_floor())
    tcp_p50, tcp_p99 = (round(v, 1) for v in echo_floor(tcp=True))
    iops = round(preadv_floor(data_file, size, iops_seconds))
    for r in results:
        if r["path"] in ("shm", "tcp"):
            trip = tcp_p50 if r["path"] == "tcp" else p50  # each path against its own socket's floor
            r["p50_vs_floor"] = round(r["p50_us"] / trip, 2)
            r["iops_vs_floor"] = round(r["iops_4k"] / iops, 3)
            if "p50_us_lease" in r:
                r["p50_lease_vs_floor"] = round(r["p50_us_lease"] / p50, 2)
            if r.get("iops_4k_ranges"):
                r["iops_ranges_vs_floor"] = round(r["iops_4k_ranges"] / iops, 3)
    return {"unix_round_trip_p50_us": p50, "unix_round_trip_p99_us": p99,
            "tcp_round_trip_p50_us": tcp_p50, "tcp_round_trip_p99_us": tcp_p99, "preadv_4k_iops": iops,
            "targets": {"shm_p50_us": 50, "tcp_p50_us": 80, "p50_vs_floor": 1.5,
                        "iops_4k": 200_000, "iops_vs_floor": 0.7}}


def _print_writes(console, write_out: dict) -> None:
    """The write rows and their ratios as a second table."""
    from rich.table import Table

    table = Table(title="writes, and S3 GET beside the HTTP limit (best of repeat - 1)")
    for col in ("row", "GB/s", "client CPU s/GB", "server CPU s/GB"):
        table.add_column(col, justify="right" if col != "row" else "left", no_wrap=True)
    for r in write_out["rows"]:
        table.add_row(r["path"], f"{r['gbps']:.3f}", f"{r['client_cpu_s_per_gb']:.2f}",
                      f"{r['server_cpu_s_per_gb']:.2f}")
    console.print(table)
    for name, value in write_out["ratios"].items():
        console.print(f"  {name}: {value:.2f} x")
    for note in write_out["notes"]:
        console.print(f"  note: {note}")
