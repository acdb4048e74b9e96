"""generate_with_cache on a tiny random Llama (float32): same greedy tokens as plain generate."""

from __future__ import annotations

import pytest
import torch

from gpufeed.ai.kvcache import KVCacheStore, generate_with_cache, store_for_model
from gpufeed.client import Client

transformers = pytest.importorskip("transformers")

CT = 16


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg).eval()


def plain(model, ids, n=8):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, do_sample=False)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_same_tokens_cold_warm_and_after_eviction(model, node, transport):
    url = node.shm_url if transport == "shm" else node.tcp_url
    ids = torch.randint(0, 128, (1, 70), generator=torch.Generator().manual_seed(1))
    ref = plain(model, ids)
    with store_for_model(url, model, model_id=f"tiny-{transport}", chunk_tokens=CT,
                         bucket="kvt-hf", cpu_tier_bytes=0) as st, torch.no_grad():
        out, stats = generate_with_cache(model, ids, st, max_new_tokens=8, return_stats=True)
        assert torch.equal(out, ref) and stats["cached_tokens"] == 0
        # a full miss is counted: one lookup, every whole chunk of the prompt missed
        m = st.metrics.snapshot()
        assert (m["lookups"], m["hit_tokens"], m["miss_tokens"]) == (1, 0, 64)
        st.flush()
        out, stats = generate_with_cache(model, ids, st, max_new_tokens=8, return_stats=True)
        assert torch.equal(out, ref) and stats["cached_tokens"] == 64
        # a longer prompt sharing the prefix reuses it
        ids2 = torch.cat([ids, torch.tensor([[5, 6, 7]])], dim=1)
        out, stats = generate_with_cache(model, ids2, st, max_new_tokens=8, return_stats=True)
        assert torch.equal(out, plain(model, ids2)) and stats["cached_tokens"] == 64
        # chunk 2 evicted: the prefix before it is reused, the rest recomputed
        st.flush()
        with Client(url) as c:
            c.delete("kvt-hf", st.keys(ids[0])[2].key)
        out, stats = generate_with_cache(model, ids, st, max_new_tokens=8, return_stats=True,
                                         store_new=False)
        assert torch.equal(out, ref) and stats["cached_tokens"] == 2 * CT


def test_prompt_of_whole_chunks_keeps_one_token_to_compute(model, node):
    ids = torch.randint(0, 128, (1, 4 * CT), generator=torch.Generator().manual_seed(2))
    ref = plain(model, ids)
    with store_for_model(node.shm_url, model, model_id="tiny-whole", chunk_tokens=CT,
                         bucket="kvt-hf") as st, torch.no_grad():
        generate_with_cache(model, ids, st, max_new_tokens=8)
        st.flush()
        st.tier.clear()
        out, stats = generate_with_cache(model, ids, st, max_new_tokens=8, return_stats=True)
        assert torch.equal(out, ref) and stats["cached_tokens"] == 3 * CT


def test_node_down_still_generates(model):
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(3))
    with store_for_model("gpufeed+tcp://127.0.0.1:9", model, model_id="tiny-down",
                         chunk_tokens=CT, cpu_tier_bytes=0) as st, torch.no_grad():
        out = generate_with_cache(model, ids, st, max_new_tokens=8)
        assert torch.equal(out, plain(model, ids))
        assert st.metrics.node_errors >= 1


def test_mismatched_store_refused(model, node):
    with KVCacheStore(node.tcp_url, "x", num_layers=3, num_kv_heads=2, head_dim=16,
                      dtype="float32") as st:
        with pytest.raises(ValueError):
            generate_with_cache(model, torch.zeros((1, 4), dtype=torch.long), st)
    with pytest.raises(ValueError):
        store_for_model(node.tcp_url, model)  # a random model has no name


def test_bad_prompts_refused(model, node):
    with store_for_model(node.tcp_url, model, model_id="tiny-bad", chunk_tokens=CT,
                         bucket="kvt-hf") as st:
        for ids in (torch.zeros((1, 0), dtype=torch.long), torch.zeros(4, dtype=torch.long),
                    torch.zeros((2, 4), dtype=torch.long)):
            with pytest.raises(ValueError, match=r"\[1, T\]"):
                generate_with_cache(model, ids, st)
