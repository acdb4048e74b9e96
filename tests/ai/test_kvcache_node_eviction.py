"""KVCacheStore over a kv bucket of the node: the bucket evicts instead of refusing
puts, and prefixes that lost chunks are shorter hits, never wrong KV."""

from __future__ import annotations

import uuid

import pytest
import torch

from gpufeed.ai.kvcache import KVCacheStore
from gpufeed.client import Client

L, H, D, CT = 3, 2, 8, 16


@pytest.fixture(params=["shm", "tcp"])
def url(request, node):
    return node.shm_url if request.param == "shm" else node.tcp_url


def test_full_kv_bucket_evicts_and_reads_stay_correct(url):
    bucket = "kvt-node-" + uuid.uuid4().hex[:8]
    chunk_bytes = 128 + 2 * L * CT * H * D * 4  # header (48 + 16 L rounded up to 64) + payload
    cap = 5 * chunk_bytes
    g = torch.Generator().manual_seed(3)
    a, b = list(range(4 * CT)), list(range(10_000, 10_000 + 4 * CT))
    kv_a = torch.randn((2, L, 4 * CT, H, D), generator=g)
    kv_b = torch.randn((2, L, 4 * CT, H, D), generator=g)
    with KVCacheStore(url, "tiny", num_layers=L, num_kv_heads=H, head_dim=D, dtype="float32",
                      chunk_tokens=CT, bucket=bucket, cpu_tier_bytes=0,
                      bucket_capacity_bytes=cap) as st, Client(url) as c:
        st.put(a, kv_a).result()
        assert st.lookup(a) == 4 * CT
        st.put(b, kv_b).result()  # 8 chunks into room for 5: never refused, the oldest go
        stats = c.bucket_stats(bucket)
        assert stats["kind"] == "kv" and stats["bytes"] <= cap and stats["evictions"] >= 3
        assert st.lookup(b) == 4 * CT
        out = torch.zeros_like(kv_b)
        assert st.get_into(b, out) == 4 * CT and torch.equal(out, kv_b)
        n = st.lookup(a)
        assert n < 4 * CT
        out = torch.zeros_like(kv_a)
        got = st.get_into(a, out)
        assert got <= n and torch.equal(out[:, :, :got], kv_a[:, :, :got])
