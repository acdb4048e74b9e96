"""KVCacheStore against a live node: keys, round trips, tiers and every bad input of issue 4."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from gpufeed.ai.kvcache import ChunkHeader, ChunkUnavailable, KVCacheStore, KVLayout, chunk_keys
from gpufeed.client import Client

L, H, D = 3, 2, 8
CT = 16  # tokens per chunk: tiny so tests stay fast


def make_store(url, bucket, **kw) -> KVCacheStore:
    args = dict(num_layers=L, num_kv_heads=H, head_dim=D, dtype="float32", chunk_tokens=CT,
                bucket=bucket, cpu_tier_bytes=0)
    args.update(kw)
    model = args.pop("model", "tiny-llama")
    return KVCacheStore(url, model, **args)


def rand_kv(T: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((2, L, T, H, D), generator=g).to(dtype)


@pytest.fixture(params=["shm", "tcp"])
def url(request, node):
    return node.shm_url if request.param == "shm" else node.tcp_url


# --- keys -------------------------------------------------------------------------
def test_keys_chain_and_layout():
    lay = KVLayout("m", "bfloat16", 8, 8, 64, chunk_tokens=4)
    toks = list(range(10))
    ks = chunk_keys(toks, lay)
    assert [(k.start, k.end) for k in ks] == [(0, 4), (4, 8)]
    assert [(k.start, k.end) for k in chunk_keys(toks, lay, partial=True)][-1] == (8, 10)
    # a different first chunk changes every later key (chained)
    other = chunk_keys([99] + toks[1:], lay)
    assert all(a.key != b.key for a, b in zip(ks, other))
    # the same tokens as list, numpy int32 and torch int64 give the same keys
    assert chunk_keys(np.array(toks, np.int32), lay) == ks == chunk_keys(torch.tensor(toks), lay)
    # every layout field is in the key
    for change in [dict(model_id="n"), dict(dtype="float16"), dict(num_layers=7),
                   dict(num_kv_heads=4), dict(head_dim=32), dict(tp_rank=1, tp_size=2),
                   dict(tp_size=2)]:
        fields = dict(model_id="m", dtype="bfloat16", num_layers=8, num_kv_heads=8, head_dim=64,
                      chunk_tokens=4)
        fields.update(change)
        assert chunk_keys(toks, KVLayout(**fields))[0].key != ks[0].key, change


def test_keys_are_deterministic_across_processes():
    code = ("from gpufeed.ai.kvcache import KVLayout, chunk_keys;"
            "print(chunk_keys(list(range(600)), KVLayout('m', 'bfloat16', 8, 8, 64))[1].key)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.strip()
    assert out == chunk_keys(list(range(600)), KVLayout("m", "bfloat16", 8, 8, 64))[1].key
    # golden value: changing the hash scheme must be a conscious, documented decision
    assert out == "kv/e8351b80558c552888f1142f8ab2dea4"


def test_layout_rejects_bad_values():
    with pytest.raises(ValueError):
        KVLayout("m", "int7", 1, 1, 1)
    with pytest.raises(ValueError):
        KVLayout("m", "float32", 1, 1, 1, tp_rank=2, tp_size=2)
    with pytest.raises(ValueError):
        KVLayout("m", "float32", 0, 1, 1)


# --- round trips --------------------------------------------------------------------
def test_put_lookup_get_roundtrip(url):
    tokens = list(range(5 * CT + 3))
    kv = rand_kv(len(tokens))
    with make_store(url, "kvt-rt") as st:
        st.put(tokens, kv).result()
        assert st.metrics.chunks_written == 5
        assert st.lookup(tokens) == 5 * CT
        assert st.lookup(tokens[:2 * CT + 1]) == 2 * CT
        assert st.lookup([7] + tokens[1:]) == 0
        for out in (torch.zeros_like(kv), st.alloc_kv(len(tokens))):
            out.zero_()
            assert st.get_into(tokens, out) == 5 * CT
            assert torch.equal(out[:, :, :5 * CT], kv[:, :, :5 * CT])
        # a shorter destination loads only the chunks that fit
        small = torch.zeros((2, L, 2 * CT + 5, H, D))
        assert st.get_into(tokens, small) == 2 * CT
        assert torch.equal(small[:, :, :2 * CT], kv[:, :, :2 * CT])


def test_put_accepts_per_layer_pairs_any_strides(node):
    tokens = list(range(100, 100 + 2 * CT))
    kv = rand_kv(2 * CT, seed=3)
    # Hugging Face layout [batch, heads, seq, dim] viewed as [seq, heads, dim]
    hf = [(kv[0, i].permute(1, 0, 2).unsqueeze(0).contiguous()[0].transpose(0, 1),
           kv[1, i].permute(1, 0, 2).unsqueeze(0).contiguous()[0].transpose(0, 1)) for i in range(L)]
    with make_store(node.tcp_url, "kvt-pairs") as st:
        st.put(tokens, hf).result()
        out = torch.zeros_like(kv)
        assert st.get_into(tokens, out) == 2 * CT
        assert torch.equal(out, kv)


def test_partial_chunks_and_bf16(node):
    tokens = list(range(2 * CT + 5))
    kv = rand_kv(len(tokens), dtype=torch.bfloat16)
    with make_store(node.shm_url, "kvt-partial", dtype=torch.bfloat16, partial_chunks=True) as st:
        st.put(tokens, kv).result()
        assert st.lookup(tokens) == len(tokens)
        assert st.lookup(tokens[:-1]) == 2 * CT  # a different partial chunk is not found
        out = torch.zeros_like(kv)
        assert st.get_into(tokens, out) == len(tokens)
        assert torch.equal(out, kv)


def test_layers_stream_and_cpu_tier(node):
    tokens = list(range(3 * CT))
    kv = rand_kv(len(tokens), seed=5)
    with make_store(node.shm_url, "kvt-layers") as writer:
        writer.put(tokens, kv).result()
    with make_store(node.shm_url, "kvt-layers", cpu_tier_bytes=64 << 20) as st:
        stream = st.get_layers(tokens)
        assert stream.tokens == 3 * CT
        seen = []
        for layer, k, v in stream:
            assert torch.equal(k, kv[0, layer]) and torch.equal(v, kv[1, layer])
            seen.append(layer)
        assert seen == list(range(L))
        # prefetch fills the tier; later reads need no node
        assert st.prefetch(tokens).result() == 3 * CT
        assert len(st.tier) == 3
        before = st.metrics.chunks_read
        out = torch.zeros_like(kv)
        assert st.get_into(tokens, out) == 3 * CT and torch.equal(out, kv)
        assert st.metrics.chunks_read == before and st.metrics.tier_hits == 3
        # layers from the tier too
        assert [layer for layer, _k, _v in st.get_layers(tokens)] == list(range(L))


def test_tier_lru_capacity():
    from gpufeed.ai.kvcache import CpuTier

    tier = CpuTier(3 * 400)
    for i in range(5):
        assert tier.put(f"k{i}", torch.zeros(100))  # 400 bytes each
    assert len(tier) == 3 and tier.nbytes == 1200 and "k0" not in tier and tier.evictions == 2
    tier.get("k2")
    tier.put("k5", torch.zeros(100))
    assert "k2" in tier and "k3" not in tier
    assert not tier.put("huge", torch.zeros(1000))


def test_concurrent_loads(node):
    seqs = [[s] + list(range(1, 2 * CT)) for s in range(8)]
    kvs = [rand_kv(2 * CT, seed=s) for s in range(8)]
    with make_store(node.shm_url, "kvt-many") as st:
        for s, kv in zip(seqs, kvs):
            st.put(s, kv)
        st.flush()
        outs = [torch.zeros_like(kv) for kv in kvs]
        assert st.get_many_into(list(zip(seqs, outs))) == [2 * CT] * 8
        assert all(torch.equal(o, k) for o, k in zip(outs, kvs))


# --- bad input ------------------------------------------------------------------------
def test_chunk_evicted_between_lookup_and_get(url):
    tokens = list(range(1000, 1000 + 4 * CT))
    kv = rand_kv(len(tokens), seed=7)
    with make_store(url, "kvt-evict") as st, Client(url) as c:
        st.put(tokens, kv).result()
        assert st.lookup(tokens) == 4 * CT
        c.delete("kvt-evict", st.keys(tokens)[2].key)
        out = torch.zeros_like(kv)
        assert st.get_into(tokens, out) == 2 * CT
        assert torch.equal(out[:, :, :2 * CT], kv[:, :, :2 * CT])
        assert st.metrics.missing_chunks >= 1
        c.delete("kvt-evict", st.keys(tokens)[0].key)
        assert st.get_into(tokens, out) == 0
        assert st.lookup(tokens) == 0


def test_corrupted_chunk_is_a_miss(url):
    tokens = list(range(2000, 2000 + 3 * CT))
    kv = rand_kv(len(tokens), seed=8)
    with make_store(url, "kvt-corrupt") as st, Client(url) as c:
        st.put(tokens, kv).result()
        key = st.keys(tokens)[1].key
        raw = bytearray(c.get("kvt-corrupt", key))
        raw[-3] ^= 0xFF  # one flipped byte in the last block
        c.put("kvt-corrupt", key, raw)
        out = torch.zeros_like(kv)
        assert st.get_into(tokens, out) == CT
        assert st.metrics.corrupt_chunks == 1
        # the corrupt object was dropped, so the next writer can replace it
        assert st.lookup(tokens) == CT
        # truncated and garbage headers are misses as well
        st.put(tokens, kv, start=CT).result()
        assert st.lookup(tokens) == 3 * CT
        c.put("kvt-corrupt", key, raw[:10])
        assert st.lookup(tokens) == CT
        assert st.get_into(tokens, out) == CT


def test_colliding_prefix_from_other_layout_is_refused(node):
    tokens = list(range(3000, 3000 + 2 * CT))
    with make_store(node.tcp_url, "kvt-collide", model="model-a") as a, \
            make_store(node.tcp_url, "kvt-collide", model="model-b") as b, \
            make_store(node.tcp_url, "kvt-collide", dtype=torch.float16) as f16:
        a.put(tokens, rand_kv(len(tokens))).result()
        assert a.lookup(tokens) == 2 * CT
        assert b.lookup(tokens) == 0 and f16.lookup(tokens) == 0
        # even bytes planted under b's key are refused: the header names a's digest
        with Client(node.tcp_url) as c:
            raw = c.get("kvt-collide", a.keys(tokens)[0].key)
            c.put("kvt-collide", b.keys(tokens)[0].key, raw)
            assert ChunkHeader.unpack(raw).digest == a.keys(tokens)[0].digest
        assert b.lookup(tokens) == 0
        assert b.get_into(tokens, torch.zeros((2, L, 2 * CT, H, D))) == 0
        assert b.metrics.corrupt_chunks >= 1


def test_node_down_serves_misses_with_metric(fresh_node, caplog):
    tokens = list(range(2 * CT))
    kv = rand_kv(len(tokens))
    st = make_store(fresh_node.tcp_url, "kvt-down", retry_interval_s=0.0)
    try:
        st.put(tokens, kv).result()
        assert st.lookup(tokens) == 2 * CT
        fresh_node.kill()
        out = torch.zeros_like(kv)
        assert st.get_into(tokens, out) == 0
        assert st.lookup(tokens) == 0
        assert st.put(tokens, kv, start=0).result() == 0
        assert st.metrics.node_errors >= 1
        assert any("unavailable" in r.message for r in caplog.records)
    finally:
        st.close()
    # a node that never was there: construction succeeds, everything misses
    st = make_store("gpufeed+tcp://127.0.0.1:9", "kvt-down")
    with st:
        assert st.lookup(tokens) == 0 and st.metrics.node_errors == 1


def test_get_layers_reports_vanished_chunk(node):
    tokens = list(range(4000, 4000 + 2 * CT))
    kv = rand_kv(len(tokens), seed=9)
    with make_store(node.tcp_url, "kvt-lvanish") as st, Client(node.tcp_url) as c:
        st.put(tokens, kv).result()
        stream = st.get_layers(tokens, depth=1)
        assert stream.tokens == 2 * CT
        it = iter(stream)
        next(it)
        c.delete("kvt-lvanish", st.keys(tokens)[1].key)
        with pytest.raises(ChunkUnavailable):
            for _ in it:
                pass


def test_get_layers_detects_corruption(url):
    """A flipped byte in one block stops the layer stream at that layer (over shm the
    check uses the server's digests, over TCP the reader hashes)."""
    tokens = list(range(4500, 4500 + 2 * CT))
    kv = rand_kv(len(tokens), seed=10)
    with make_store(url, "kvt-lcorrupt") as st, Client(url) as c:
        st.put(tokens, kv).result()
        key = st.keys(tokens)[1].key
        raw = bytearray(c.get("kvt-lcorrupt", key))
        block = CT * H * D * 4
        raw[st.header_len + (L + 1) * block + 7] ^= 0x10  # values of layer 1
        c.put("kvt-lcorrupt", key, raw)
        got = []
        with pytest.raises(ChunkUnavailable, match="checksum"):
            for layer, k, v in st.get_layers(tokens, depth=2):
                assert torch.equal(k, kv[0, layer]) and torch.equal(v, kv[1, layer])
                got.append(layer)
        assert got == [0] and st.metrics.corrupt_chunks == 1


def test_get_layers_keeps_the_prefix_before_a_short_chunk(url):
    """A later chunk truncated under its key: the stream reports the chunks before
    it as valid (not 0 tokens), and drops the short object so a writer replaces it;
    get_into and get_chunks drop it too."""
    tokens = list(range(4700, 4700 + 3 * CT))
    kv = rand_kv(len(tokens), seed=12)
    with make_store(url, "kvt-lshort") as st, Client(url) as c:
        for cut in ("layers", "get_into", "get_chunks"):
            st.put(tokens, kv).result()
            key = st.keys(tokens)[2].key
            raw = bytes(c.get("kvt-lshort", key))
            c.put("kvt-lshort", key, raw[: len(raw) // 2])
            if cut == "layers":
                with pytest.raises(ChunkUnavailable) as err:
                    for layer, k, v in st.get_layers(tokens, depth=2):
                        assert torch.equal(k, kv[0, layer]) and torch.equal(v, kv[1, layer])
                assert err.value.tokens == 2 * CT
            elif cut == "get_into":
                assert st.get_into(tokens, torch.zeros_like(kv)) == 2 * CT
            else:
                with st.chunk_landing(len(tokens)) as buf:
                    assert len(st.get_chunks(tokens, buf)) == 2
            assert st.lookup(tokens) == 2 * CT  # the short object is gone
            assert key not in [e.key for e in c.list("kvt-lshort")]
        assert st.metrics.corrupt_chunks == 3


def test_stuck_node_is_a_miss_after_request_timeout(fresh_node):
    """A node that stops answering (SIGSTOP): reads give up after the store's
    request_timeout_s and serve misses, instead of waiting the client's 60 s."""
    import time

    tokens = list(range(2 * CT))
    kv = rand_kv(len(tokens), seed=13)
    st = make_store(fresh_node.tcp_url, "kvt-stuck", request_timeout_s=1.0, retry_interval_s=0.0)
    try:
        st.put(tokens, kv).result()
        fresh_node.pause()
        try:
            t0 = time.monotonic()
            assert st.get_into(tokens, torch.zeros_like(kv)) == 0
            assert time.monotonic() - t0 < 10
            assert st.metrics.node_errors >= 1
        finally:
            fresh_node.resume()
        out = torch.zeros_like(kv)
        assert st.get_into(tokens, out) == 2 * CT and torch.equal(out, kv)  # reconnected
    finally:
        st.close()


def test_bad_destination_rejected(node):
    with make_store(node.tcp_url, "kvt-bad") as st:
        with pytest.raises(ValueError):
            st.get_into([1, 2], torch.zeros((2, L, 4, H, D), dtype=torch.float16))
        with pytest.raises(ValueError):
            st.get_into([1, 2], torch.zeros((2, L + 1, 4, H, D)))
        with pytest.raises(ValueError):
            st.put(list(range(CT)), torch.zeros((2, L, CT, H + 1, D)))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("per_request", [2, None])
def test_get_chunks_whole_objects(node, transport, per_request):
    """get_chunks needs no lookup first: one batch per transport default (or 2 chunks
    per batch), and a missing, short or corrupt chunk ends the prefix."""
    url = node.shm_url if transport == "shm" else node.tcp_url
    tokens = list(range(5000, 5000 + 4 * CT))
    kv = rand_kv(len(tokens), seed=11)
    with make_store(url, "kvt-chunks", chunks_per_request=per_request) as st, Client(url) as c:
        st.put(tokens, kv).result()
        with st.chunk_landing(len(tokens)) as buf:
            chunks = st.get_chunks(tokens, buf)
            assert len(chunks) == 4
            assert torch.equal(torch.cat(chunks, dim=2), kv)
            assert len(st.get_chunks(tokens, buf[: buf.numel() // 2])) == 2  # only what fits
            raw = bytearray(c.get("kvt-chunks", st.keys(tokens)[2].key))
            raw[st.header_len + 5] ^= 1
            c.put("kvt-chunks", st.keys(tokens)[2].key, raw)
            assert len(st.get_chunks(tokens, buf)) == 2 and st.metrics.corrupt_chunks == 1
            c.delete("kvt-chunks", st.keys(tokens)[1].key)
            assert len(st.get_chunks(tokens, buf)) == 1 and st.metrics.missing_chunks == 1
            st.put(tokens, kv).result()
            c.put("kvt-chunks", st.keys(tokens)[1].key, raw[: st.header_len + 100])  # short
            st.tier.clear()
            assert len(st.get_chunks(tokens, buf)) == 1 and st.metrics.corrupt_chunks == 2
            # a prompt none of which is cached: nothing read, every chunk a miss
            other = list(range(90_000, 90_000 + 2 * CT))
            before = st.metrics.snapshot()
            assert st.get_chunks(other, buf) == []
            after = st.metrics.snapshot()
            assert after["miss_tokens"] - before["miss_tokens"] == 2 * CT
            assert after["missing_chunks"] - before["missing_chunks"] == 1
