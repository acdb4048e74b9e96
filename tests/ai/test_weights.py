"""load_pretrained (a Hugging Face folder into an nn.Module, random or meta) and
iterate_weights (every tensor once, shard by shard, bounded memory), against the
live session node."""

from __future__ import annotations

import gc
import uuid
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpufeed.ai import (
    StateDictMismatch,
    TiedWeightsDiffer,
    empty_weights,
    iterate_weights,
    load_pretrained,
)
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument

CONFIG = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, vocab_size=500,
              num_attention_heads=4, num_key_value_heads=2)


def llama(seed: int = 0, **over):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**CONFIG, "tie_word_embeddings": False, **over})).eval()


@pytest.fixture(scope="module")
def bucket(node):
    name = "weights-" + uuid.uuid4().hex[:12]
    with Client(node.tcp_url) as c:
        c.create_bucket(name)
    return name


def upload_model(node, bucket: str, model, folder: Path, prefix: str) -> None:
    model.save_pretrained(folder, max_shard_size="60KB")
    assert len(list(folder.glob("*.safetensors"))) > 3
    with Client(node.tcp_url) as c:
        for f in folder.iterdir():
            c.put(bucket, f"{prefix}/{f.name}", f.read_bytes())


@pytest.fixture(scope="module")
def stored(node, bucket, tmp_path_factory):
    """A float32 tiny Llama (exact output comparisons) in many shards."""
    model = llama(0)
    folder = tmp_path_factory.mktemp("llama")
    upload_model(node, bucket, model, folder, "llama")
    ref = {}
    for f in sorted(folder.glob("*.safetensors")):
        ref.update(load_file(f))
    return model, ref, folder


@pytest.fixture(params=["shm", "tcp"])
def url(request, node):
    return node.shm_url if request.param == "shm" else node.tcp_url


TOKENS = torch.tensor([[1, 5, 42, 7, 300, 2]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS).logits


def test_load_pretrained_into_random_model(url, bucket, stored):
    reference, _ref, _ = stored
    model = llama(seed=123)  # other random weights
    assert not torch.equal(logits(model), logits(reference))
    with Client(url) as client:
        assert load_pretrained(client, bucket, "llama", model) is model
    assert torch.equal(logits(model), logits(reference))
    for (n, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), n


def test_load_pretrained_into_meta_model(url, bucket, stored):
    reference, _ref, _ = stored
    with empty_weights():
        model = llama(seed=5)
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())  # rotary inv_freq stays real
    load_pretrained(url, bucket, "llama", model)  # a URL: own client
    assert not any(p.is_meta for p in model.parameters())
    assert torch.equal(logits(model), logits(reference))


def test_load_pretrained_zero_copy_into_meta_model(node, bucket, stored):
    """zero_copy + assign: two models share the mapped weights; a fine-tuning write
    to one (copy-on-write) reaches neither the other nor the store."""
    reference, _ref, _ = stored
    with empty_weights():
        a, b = llama(seed=5), llama(seed=6)
    with Client(node.shm_url) as client:
        load_pretrained(client, bucket, "llama", a, zero_copy=True)
        load_pretrained(client, bucket, "llama", b, zero_copy=True)
    assert torch.equal(logits(a), logits(reference)) and torch.equal(logits(b), logits(reference))
    with torch.no_grad():
        a.lm_head.weight.mul_(2)
    assert not torch.equal(logits(a), logits(reference))
    assert torch.equal(logits(b), logits(reference))


def test_meta_buffers_left_are_an_error(node, bucket, stored):
    with torch.device("meta"):
        model = llama(seed=5)
    with pytest.raises(InvalidArgument, match="inv_freq"):
        load_pretrained(node.tcp_url, bucket, "llama", model)


def test_tied_embeddings(node, bucket, tmp_path):
    reference = llama(1, tie_word_embeddings=True)
    upload_model(node, bucket, reference, tmp_path, "tied")
    with empty_weights():
        model = llama(2, tie_word_embeddings=True)
    load_pretrained(node.shm_url, bucket, "tied", model)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(logits(model), logits(reference))


def test_name_mismatch_lists_missing_and_unexpected(node, bucket, stored):
    bigger = llama(0, num_hidden_layers=3)
    with pytest.raises(StateDictMismatch) as info:
        load_pretrained(node.tcp_url, bucket, "llama", bigger)
    assert info.value.missing and all(n.startswith("model.layers.2.") for n in info.value.missing)
    assert not info.value.unexpected
    assert "model.layers.2.mlp.up_proj.weight" in str(info.value)
    smaller = llama(0, num_hidden_layers=1)
    with pytest.raises(StateDictMismatch) as info:
        load_pretrained(node.tcp_url, bucket, "llama", smaller)
    assert not info.value.missing
    assert "model.layers.1.self_attn.q_proj.weight" in info.value.unexpected
    # strict=False loads what both have
    load_pretrained(node.tcp_url, bucket, "llama", smaller, strict=False)
    assert torch.equal(smaller.model.layers[0].mlp.up_proj.weight,
                       stored[0].model.layers[0].mlp.up_proj.weight)


def test_load_pretrained_casts_and_shards(node, bucket, stored):
    _model, ref, _ = stored
    model = llama(9).to(torch.bfloat16)
    load_pretrained(node.shm_url, bucket, "llama", model)  # copy: the model's dtype stays
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(model.lm_head.weight, ref["lm_head.weight"].to(torch.bfloat16))


class TrackingClient(Client):
    """Our real client, tracking the bytes of alloc() buffers still alive."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.live = self.peak = 0

    def alloc(self, nbytes: int) -> memoryview:
        view = super().alloc(nbytes)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(view.obj, self._gone, nbytes)
        return view

    def _gone(self, nbytes: int) -> None:
        self.live -= nbytes


@pytest.mark.parametrize("prefetch", [True, False])
def test_iterate_weights_streams_every_tensor_once(url, bucket, stored, prefetch):
    _model, ref, folder = stored
    shard_bytes = max(f.stat().st_size for f in folder.glob("*.safetensors"))
    total = sum(t.numel() * t.element_size() for t in ref.values())
    seen: dict[str, torch.Tensor] = {}
    with TrackingClient(url) as client:
        for name, tensor in iterate_weights(client, bucket, "llama", prefetch=prefetch):
            assert name not in seen
            seen[name] = tensor.clone()  # what a serving engine does: copy into its params
            del tensor
        # Each connection's receive loop keeps its last request (and so that
        # request's buffer) until its next reply: allow a shard or two here.
        gc.collect()
        assert client.live <= 2 * shard_bytes
        # Bounded by shards, not the model: the header probes (64 KiB per shard,
        # read at once), plus the shard being yielded, the next one (prefetch),
        # and one more the receive loop may still hold.
        probes = sum(min(64 << 10, f.stat().st_size) for f in folder.glob("*.safetensors"))
        assert client.peak <= probes + (3 if prefetch else 2) * shard_bytes
        assert 3 * shard_bytes < total
    assert set(seen) == set(ref)
    assert all(torch.equal(seen[k], ref[k]) for k in ref)


def test_iterate_weights_subset_and_shard(node, bucket, stored):
    _model, ref, _ = stored
    names = ["model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    got = dict(iterate_weights(node.tcp_url, bucket, "llama", keys=names, shard=(1, 2, 1)))
    assert set(got) == set(names)
    for k in names:
        assert torch.equal(got[k], ref[k].chunk(2, 1)[1])
    with pytest.raises(InvalidArgument, match="nope"):
        list(iterate_weights(node.tcp_url, bucket, "llama", keys=["nope"]))
    with pytest.raises(InvalidArgument, match="unexpected"):
        list(iterate_weights(node.tcp_url, bucket, "llama", colour="blue"))


def test_iterate_weights_staged(node, bucket, stored):
    """The CUDA pipeline (pinned staging) with its CPU fallback copier."""
    _model, ref, _ = stored
    got = dict(iterate_weights(node.shm_url, bucket, "llama", staging_bytes=4096))
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.mark.gpu
def test_load_pretrained_cuda(node, bucket, stored):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reference, _ref, _ = stored
    with empty_weights():
        model = llama(5)
    load_pretrained(node.shm_url, bucket, "llama", model, device="cuda:0")
    assert model.lm_head.weight.device.type == "cuda"
    with torch.no_grad():
        out = model(TOKENS.cuda()).logits.cpu()
    torch.testing.assert_close(out, logits(reference), rtol=1e-4, atol=1e-4)


# --- tied embeddings: the same parameters as transformers' from_pretrained ------------------
TIE_CASES = ["embed_only", "head_only", "both_equal", "both_differ", "untied_no_head"]


def _tie_case_folder(folder: Path, case: str) -> None:
    """A tiny Llama folder whose safetensors hold the case's embedding / head."""
    from safetensors.torch import save_file

    llama(1, tie_word_embeddings=case != "untied_no_head").save_pretrained(folder)
    files = list(folder.glob("*.safetensors"))
    sd = {}
    for f in files:
        sd.update(load_file(f))
        f.unlink()
    for f in folder.glob("*.index.json"):
        f.unlink()
    emb = sd["model.embed_tokens.weight"]
    head = torch.randn(emb.shape, generator=torch.Generator().manual_seed(9))
    sd.pop("lm_head.weight", None)
    if case == "head_only":
        sd["lm_head.weight"] = sd.pop("model.embed_tokens.weight")
    elif case == "both_equal":
        sd["lm_head.weight"] = emb.clone()
    elif case == "both_differ":
        sd["lm_head.weight"] = head
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("build", ["real", "meta"])
@pytest.mark.parametrize("case", TIE_CASES)
def test_tie_cases_match_transformers(node, bucket, tmp_path, case, build):
    import transformers
    from transformers import LlamaForCausalLM

    folder = tmp_path / case
    _tie_case_folder(folder, case)
    prefix = f"tie-{case}-{build}"
    with Client(node.tcp_url) as c:
        for f in folder.iterdir():
            c.put(bucket, f"{prefix}/{f.name}", f.read_bytes())
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # it logs the untie and the new head
    try:
        ref = LlamaForCausalLM.from_pretrained(folder).eval()
    finally:
        transformers.logging.set_verbosity(verbosity)
    tie = case != "untied_no_head"
    if build == "meta":
        with empty_weights():
            model = llama(2, tie_word_embeddings=tie)
    else:
        model = llama(2, tie_word_embeddings=tie)
    if case == "untied_no_head":  # transformers makes a random head; we name what is missing
        with pytest.raises(StateDictMismatch, match="lm_head.weight"):
            load_pretrained(node.tcp_url, bucket, prefix, model)
        if build == "real":
            own_head = model.lm_head.weight.detach().clone()
            load_pretrained(node.tcp_url, bucket, prefix, model, strict=False)
            assert torch.equal(model.lm_head.weight, own_head)
            assert torch.equal(model.model.embed_tokens.weight, ref.model.embed_tokens.weight)
        return
    if case == "both_differ":
        with pytest.warns(TiedWeightsDiffer, match="untied"):
            load_pretrained(node.tcp_url, bucket, prefix, model)
    else:
        load_pretrained(node.tcp_url, bucket, prefix, model)
    ours = dict(model.named_parameters(remove_duplicate=False))
    theirs = dict(ref.named_parameters(remove_duplicate=False))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name
    same = model.lm_head.weight is model.model.embed_tokens.weight
    assert same == (ref.lm_head.weight is ref.model.embed_tokens.weight) == (case != "both_differ")
    assert torch.equal(logits(model), logits(ref))
    if case == "both_differ":
        assert "lm_head.weight" not in model.all_tied_weights_keys
