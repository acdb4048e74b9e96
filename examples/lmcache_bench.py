"""LMCache plugin throughput: LMCache 0.5.6's CreateStorageBackends + RemoteBackend driving
GpufeedConnector against a fresh local node, over shm and TCP (numbers in docs/kvcache-lmcache.md).

    make install .lmcache/.installed   # or: make test
    GPUFEED_LMCACHE_PATH=.lmcache .venv/bin/python examples/lmcache_bench.py
"""
import asyncio, os, pathlib, sys, tempfile, threading, time
sys.path.append(os.environ.get("GPUFEED_LMCACHE_PATH", ".lmcache"))
import numpy as np, torch
from gpufeed.testing.node import start_node
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend import CreateStorageBackends
L, H, D, CT, N = 32, 8, 128, 256, 8
node = start_node(pathlib.Path(tempfile.mkdtemp(dir="/tmp")) / "data")
a = np.ones(1 << 30, np.uint8); b = np.empty_like(a); np.copyto(b, a); t=time.perf_counter(); np.copyto(b, a); print("memcpy GB/s %.1f" % (1.074/(time.perf_counter()-t))); del a, b
try:
  for url in (node.shm_url, node.tcp_url):
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CT, local_cpu=True, max_local_cpu_size=1.0,
        remote_storage_plugins=["gpufeed"], remote_serde="naive", blocking_timeout_secs=60,
        extra_config={"remote_storage_plugin.gpufeed.module_path": "gpufeed.ai.kvcache.lmcache",
                      "remote_storage_plugin.gpufeed.class_name": "GpufeedConnector",
                      "remote_storage_plugin.gpufeed.url": url,
                      "remote_storage_plugin.gpufeed.bucket": "bench-" + url[8:11],
                      "remote_storage_plugin.gpufeed.capacity_bytes": 4 << 30})
    md = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=torch.bfloat16, kv_shape=(L, 2, CT, H, D), chunk_size=CT)
    loop = asyncio.new_event_loop(); threading.Thread(target=loop.run_forever, daemon=True).start()
    bk = CreateStorageBackends(cfg, md, loop); cpu = bk["LocalCPUBackend"]; rb = bk["RemoteBackend-gpufeed"]
    conn = rb.connection
    objs = [cpu.allocate(md.get_shapes(), md.get_dtypes()) for _ in range(N)]
    for o in objs: np.frombuffer(memoryview(o.byte_array).cast("B"), np.uint8)[:] = np.random.default_rng(0).integers(0,256,o.get_size(),dtype=np.uint8)
    nbytes = N * objs[0].get_size()
    for rep in range(3):
        keys = [CacheEngineKey("m", 1, 0, rep * 100 + i, torch.bfloat16) for i in range(N)]
        for o in objs: o.ref_count_up()
        t = time.perf_counter(); asyncio.run_coroutine_threadsafe(conn.batched_put(keys, objs), loop).result(); tp = time.perf_counter() - t
        t = time.perf_counter(); got = rb.batched_get_blocking(keys); tg = time.perf_counter() - t
        ok = all(g is not None and bytes(memoryview(g.byte_array).cast("B")[:64]) == bytes(memoryview(objs[i].byte_array).cast("B")[:64]) for i, g in enumerate(got))
        for g in got:
            if g is not None: g.ref_count_down()
        print(f"{url[:11]} chunk {objs[0].get_size()>>20} MiB x {N}: put {nbytes/tp/1e9:.2f} GB/s  batched_get {nbytes/tg/1e9:.2f} GB/s ok={ok}")
    print(conn.getWrappedConnector().metrics.snapshot())
    rb.close()
finally:
  node.stop()
