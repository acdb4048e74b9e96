"""The write rows of ``gpufeed bench io``, and S3 GET beside the HTTP limit.

Rows (each with GB/s and CPU seconds per GB on the client and server side):

- ``local_write_fsync``: ``write`` + ``fsync`` of the bytes to a local file (the limit);
- ``shm_put``: the fast path's put from shared memory;
- ``s3_put``: boto3 ``put_object`` with its default checksum (CRC32; over http
  botocore also signs the payload's SHA-256), the node keeping an MD5 ETag;
- ``s3_put_multipart``: boto3 ``upload_fileobj`` in 8 MiB parts, 4 in flight
  (aws-cli's part size);
- ``boto3_put_40m_nochecksum`` and ``pyarrow_put_40m``: 40 MiB through boto3
  ``put_object`` with checksums off, and through pyarrow's
  ``S3FileSystem.open_output_stream`` with its default checksum (absent when
  pyarrow is not installed);
- ``s3_put_64m_etag_md5`` and ``s3_put_64m_etag_none``: 64 MiB objects PUT
  through presigned URLs (unsigned payload, no checksum: what the node hashes
  is only what its ETag policy asks) into a bucket of ETag policy ``md5`` and
  one of ``none``, runs of the two interleaved;
- ``http_fileresponse_get`` and ``s3_get``: the same 1 GiB read by one urllib3
  client into a preallocated buffer, from a plain aiohttp ``web.FileResponse``
  (the HTTP limit) and from the node's S3 GET (presigned URL).

Ratios (``ratios`` in the JSON) compare each with its limit. GB/s are 10^9
bytes per second.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["write_rows"]

#: aws-cli's multipart part size and the parts in flight of the multipart row.
MULTIPART_CHUNK = 8 << 20  # 8 MiB
MULTIPART_INFLIGHT = 4
#: Size of the pyarrow / boto3 small-object rows, bytes.
SMALL_PUT = 40 << 20  # 40 MiB
#: Size of the ETag-policy rows, bytes.
ETAG_PUT = 64 << 20  # 64 MiB
_READ_CHUNK = 16 << 20  # 16 MiB readinto calls of the GET rows
GB = 1e9

_FILE_SERVER = """
import sys
from aiohttp import web
path = sys.argv[1]
async def get(request):
    return web.FileResponse(path)
app = web.Application()
app.router.add_get("/f", get)
async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    import asyncio
    await asyncio.Event().wait()
import asyncio
asyncio.run(main())
"""


def _timed(fn: Callable[[], object], meter, repeat: int, before=None) -> tuple[float, float, float]:
    """Best of ``repeat`` runs: ``(seconds, client CPU s, server CPU s)`` of the fastest.

    ``meter``: a :class:`gpufeed.bench.io.CpuMeter` (this process and the server's)."""
    best = (float("inf"), 0.0, 0.0)
    for _ in range(repeat):
        if before is not None:
            before()
        c0, s0, t0 = meter.self_s(), meter.server_s(), time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if dt < best[0]:
            best = (dt, meter.self_s() - c0, meter.server_s() - s0)
    return best


def _row(path: str, nbytes: int, timing: tuple[float, float, float]) -> dict:
    dt, client, server = timing
    gb = nbytes / GB
    return {"path": path, "bytes": nbytes, "gbps": gb / dt, "seconds": dt,
            "client_cpu_s_per_gb": client / gb, "server_cpu_s_per_gb": server / gb}


def _read_url(http, url: str, buf: memoryview) -> int:
    """GET ``url`` into ``buf`` with ``readinto``; returns bytes read."""
    r = http.request("GET", url, preload_content=False)
    try:
        if r.status != 200:
            raise RuntimeError(f"GET {url} answered {r.status}")
        pos = 0
        while pos < len(buf):
            n = r.readinto(buf[pos:pos + _READ_CHUNK])
            if not n:
                break
            pos += n
        return pos
    finally:
        r.release_conn()


def _get_rows(s3, bucket: str, key: str, src_path: Path, size: int, meter, meter_of,
              repeat: int) -> list[dict]:
    """S3 GET and a plain aiohttp FileResponse of the same bytes, one client, side by side."""
    import urllib3

    proc = subprocess.Popen([sys.executable, "-c", _FILE_SERVER, str(src_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        file_meter = meter_of(proc.pid)
        http = urllib3.PoolManager(maxsize=2)
        buf = np.empty(size, dtype=np.uint8)
        buf[:] = 0
        mv = buf.data.cast("B")
        s3_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600)
        file_url = f"http://127.0.0.1:{port}/f"
        rows = []
        for path, url, m in (("http_fileresponse_get", file_url, file_meter), ("s3_get", s3_url, meter)):
            if _read_url(http, url, mv) != size:  # warm: connection, page cache
                raise RuntimeError(f"{path}: short read")
            rows.append(_row(path, size, _timed(functools.partial(_read_url, http, url, mv), m, repeat)))
        http.clear()
        return rows
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _small_put_rows(node, s3, bucket: str, meter, repeat: int) -> tuple[list[dict], str | None]:
    """40 MiB through boto3 (checksums off) and pyarrow (its default checksum)."""
    from urllib.parse import urlsplit

    data = np.random.default_rng(1).integers(0, 256, SMALL_PUT, dtype=np.uint8).tobytes()
    plain = node.boto3_client(request_checksum_calculation="when_required")
    rows = [_row("boto3_put_40m_nochecksum", SMALL_PUT, _timed(
        lambda: plain.put_object(Bucket=bucket, Key="small-boto3.bin", Body=data), meter, repeat))]
    plain.close()
    try:
        from pyarrow import fs as pafs
    except ImportError:
        return rows, "pyarrow is not installed: no pyarrow_put_40m row"
    url = urlsplit(node.s3_url)
    pa = pafs.S3FileSystem(access_key=node.access_key, secret_key=node.secret_key, region="us-east-1",
                           scheme=url.scheme, endpoint_override=url.netloc)

    def put():
        with pa.open_output_stream(f"{bucket}/small-pyarrow.bin") as out:
            out.write(data)

    rows.append(_row("pyarrow_put_40m", SMALL_PUT, _timed(put, meter, repeat)))
    return rows, None


def _etag_policy_rows(s3, meter, repeat: int) -> list[dict]:
    """64 MiB presigned PUTs into an ``md5`` and a ``none`` ETag-policy bucket, interleaved."""
    import urllib3

    data = np.random.default_rng(2).integers(0, 256, ETAG_PUT, dtype=np.uint8).tobytes()
    http = urllib3.PoolManager(maxsize=2)
    best: dict[str, tuple[float, float, float]] = {}
    buckets = {"md5": "bench-etag-md5", "none": "bench-etag-none"}

    def header(policy):
        def add(request, **_):
            request.headers["x-gpufeed-etag-policy"] = policy
        return add

    for policy, name in buckets.items():
        hook = header(policy)
        s3.meta.events.register("before-sign.s3.CreateBucket", hook)
        try:
            s3.create_bucket(Bucket=name)
        finally:
            s3.meta.events.unregister("before-sign.s3.CreateBucket", hook)
    urls = {p: s3.generate_presigned_url("put_object", Params={"Bucket": b, "Key": "k"}, ExpiresIn=3600)
            for p, b in buckets.items()}

    def put(url: str) -> None:
        r = http.request("PUT", url, body=data, headers={"Content-Length": str(len(data))})
        if r.status != 200:
            raise RuntimeError(f"PUT answered {r.status}: {r.data[:200]!r}")

    for _ in range(repeat):
        for policy, url in urls.items():
            t = _timed(functools.partial(put, url), meter, 1)
            if t[0] < best.get(policy, (float("inf"),))[0]:
                best[policy] = t
    for name in buckets.values():
        s3.delete_object(Bucket=name, Key="k")
        s3.delete_bucket(Bucket=name)
    http.clear()
    return [_row(f"s3_put_64m_etag_{p}", ETAG_PUT, best[p]) for p in buckets]


def write_rows(*, node, shm, s3, bucket: str, key: str, src: np.ndarray, region, src_path: Path, root: Path,
               repeat: int, console, meter_of) -> dict:
    """Measure the write rows and the GET pair; returns ``{"rows", "ratios", "notes"}``.

    Args:
        node: the running node (:class:`gpufeed.testing.node.NodeProcess`).
        shm: a fast-path client over shared memory.
        s3: a boto3 client of the node (default checksum settings).
        bucket: an existing bucket; ``key``: the object of ``src``'s bytes.
        src: the object's bytes (uint8).
        region: a shared-memory region of the ``shm`` client holding the same bytes.
        src_path: a local file of the same bytes (page-cached).
        root: a scratch folder.
        repeat: runs per row (the fastest is reported).
        console: a rich console for progress.
        meter_of: ``meter_of(pid | None)`` -> a :class:`gpufeed.bench.io.CpuMeter`.
    """
    from boto3.s3.transfer import TransferConfig

    size = int(src.nbytes)
    meter = meter_of(node.pid)
    local = meter_of(None)
    body = src.tobytes()
    scratch = root / "local-write.bin"
    rows: list[dict] = []
    notes: list[str] = []

    def local_write():
        with open(scratch, "wb") as f:
            f.write(memoryview(body))
            os.fsync(f.fileno())

    def unlink():
        scratch.unlink(missing_ok=True)

    console.print("  writes: local write+fsync, shm put, s3 put, s3 multipart ...")
    rows.append(_row("local_write_fsync", size, _timed(local_write, local, repeat, before=unlink)))
    unlink()
    rows.append(_row("shm_put", size, _timed(lambda: shm.put(bucket, "shm-put.bin", region), meter, repeat)))
    rows.append(_row("s3_put", size, _timed(
        lambda: s3.put_object(Bucket=bucket, Key="s3-put.bin", Body=body), meter, repeat)))
    cfg = TransferConfig(multipart_threshold=MULTIPART_CHUNK, multipart_chunksize=MULTIPART_CHUNK,
                         max_concurrency=MULTIPART_INFLIGHT, use_threads=True)
    rows.append(_row("s3_put_multipart", size, _timed(
        lambda: s3.upload_fileobj(io.BytesIO(body), bucket, "s3-mp.bin", Config=cfg), meter, repeat)))
    console.print("  small puts: boto3 without checksum, pyarrow ...")
    small, note = _small_put_rows(node, s3, bucket, meter, repeat)
    rows += small
    if note:
        notes.append(note)
    console.print("  ETag policy: 64 MiB puts, md5 vs none ...")
    rows += _etag_policy_rows(s3, meter, max(repeat, 3))
    console.print("  gets: aiohttp FileResponse vs S3 GET ...")
    rows += _get_rows(s3, bucket, key, src_path, size, meter, meter_of, repeat)
    for extra in ("shm-put.bin", "s3-put.bin", "s3-mp.bin", "small-boto3.bin", "small-pyarrow.bin"):
        try:
            shm.delete(bucket, extra)
        except FileNotFoundError:
            pass
    by = {r["path"]: r["gbps"] for r in rows}
    limit = by["local_write_fsync"]
    ratios = {
        "s3_put_vs_local_write_fsync": by["s3_put"] / limit,
        "s3_put_multipart_vs_local_write_fsync": by["s3_put_multipart"] / limit,
        "shm_put_vs_local_write_fsync": by["shm_put"] / limit,
        "s3_get_vs_http_fileresponse": by["s3_get"] / by["http_fileresponse_get"],
        "s3_put_64m_etag_none_vs_md5": by["s3_put_64m_etag_none"] / by["s3_put_64m_etag_md5"],
    }
    if "pyarrow_put_40m" in by:
        ratios["pyarrow_put_40m_vs_boto3_nochecksum"] = by["pyarrow_put_40m"] / by["boto3_put_40m_nochecksum"]
    return {"rows": rows, "ratios": ratios, "notes": notes}
