"""Hugging Face transformers (5.x) integration: generate with KV reloaded by prefix.

transformers 5.x cache API (checked against the installed 5.24): the forward
argument is ``cache=`` (``past_key_values=`` is deprecated), a
``DynamicCache`` holds ``cache.layers[i].keys`` / ``.values`` shaped
``[batch, kv_heads, seq, head_dim]``, and ``generate`` given a non-empty cache
only runs the model on the tokens past ``cache.get_seq_length()``.
"""

from __future__ import annotations

import torch

from ._store import KVCacheStore

__all__ = ["generate_with_cache", "store_for_model", "kv_shape_of"]


def kv_shape_of(config) -> tuple[int, int, int]:
    """``(num_layers, num_kv_heads, head_dim)`` of a decoder config (``model.config``)."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


def store_for_model(url_or_client, model, *, model_id: str | None = None, **kw) -> KVCacheStore:
    """A :class:`KVCacheStore` shaped for ``model`` (layers, KV heads, head size, dtype).

    Args:
        url_or_client: node URL or client.
        model: a transformers causal LM.
        model_id: name + revision identifying the weights (default: the config's
            ``_name_or_path``). Two models with the same id MUST have the same weights.
        **kw: passed to :class:`KVCacheStore`.

    Raises:
        ValueError: no ``model_id`` given and the config has no name.
    """
    model_id = model_id or getattr(model.config, "_name_or_path", "") or None
    if not model_id:
        raise ValueError("model_id is required for a model without a name (random weights?)")
    layers, kv_heads, head_dim = kv_shape_of(model.config)
    kw.setdefault("dtype", model.dtype)
    return KVCacheStore(url_or_client, model_id, num_layers=layers, num_kv_heads=kv_heads,
                        head_dim=head_dim, **kw)


def _load_cache(model, input_ids: torch.Tensor, store: KVCacheStore):
    """A DynamicCache holding the longest cached prefix (at most ``T - 1`` tokens), and its length."""
    from transformers import DynamicCache

    tokens = input_ids[0]
    T = tokens.shape[0]
    cks = store.keys(tokens[: T - 1]) if T > 1 else []
    if not cks:  # nothing cacheable still counts: one lookup, every token missed
        store.metrics.add(lookups=1, miss_tokens=0)
        return None, 0
    with store.chunk_landing(cks[-1].end) as buf:
        # No separate lookup: one batch read of every chunk object the prompt could
        # have, straight into registered memory, doubles as the existence check (a
        # missing or corrupt chunk ends the prefix). Saves a round trip per prompt.
        chunks = store.get_chunks(tokens[: T - 1], buf)
        if not chunks:
            return None, 0
        n = sum(c.shape[2] for c in chunks)
        cache = DynamicCache(config=model.config)
        dev, dt = input_ids.device, model.dtype
        H, D = store.layout.num_kv_heads, store.layout.head_dim
        for i in range(store.layout.num_layers):
            kv = []
            for j in range(2):  # [1, H, n, D], one copy out of the chunk slots
                t = torch.empty((1, H, n, D), dtype=dt, device=dev)
                at = 0
                for c in chunks:
                    t[0, :, at:at + c.shape[2]].copy_(c[j, i].transpose(0, 1))
                    at += c.shape[2]
                kv.append(t)
            _fill_layer(cache, i, kv[0], kv[1])
    return cache, n


def _fill_layer(cache, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Put ``k``/``v`` ``[1, H, n, D]`` into an empty layer ``i`` without another copy
    (``update`` would ``torch.cat`` them onto an empty tensor)."""
    from transformers.cache_utils import DynamicLayer

    layer = cache.layers[i]
    if type(layer) is DynamicLayer and not layer.is_initialized:
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
    else:
        cache.update(k, v, i)


def generate_with_cache(model, input_ids: torch.Tensor, store: KVCacheStore, *,
                        max_new_tokens: int = 20, store_new: bool = True,
                        return_stats: bool = False, **generate_kwargs):
    """``model.generate`` with the prompt's cached prefix reloaded from ``store``.

    Looks up the longest cached prefix of the prompt (whole chunks, at most
    ``T - 1`` tokens so at least one token is computed), loads it into a
    ``DynamicCache``, lets ``generate`` prefill only the rest, then stores the
    prompt's chunks that were not cached (asynchronously). With greedy decoding
    the output equals plain ``model.generate`` up to floating-point
    reassociation of the shorter prefill (bit-identical tokens in float32 in
    our tests).

    Args:
        model: a transformers causal LM (5.x cache API).
        input_ids: ``[1, T]`` int64 prompt (batch size 1).
        store: a store shaped for ``model`` (see :func:`store_for_model`).
        max_new_tokens: tokens to generate.
        store_new: store the prompt chunks that were computed.
        return_stats: also return ``{"cached_tokens", "prompt_tokens"}``.
        **generate_kwargs: passed to ``generate`` (default ``do_sample=False``).

    Returns:
        ``[1, T + new]`` token ids (and the stats dict if asked).

    Raises:
        ValueError: a batch larger than 1, an empty prompt, or a store whose layout does
            not fit the model.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [1, T] with T >= 1, not {tuple(input_ids.shape)}")
    if kv_shape_of(model.config) != (store.layout.num_layers, store.layout.num_kv_heads,
                                     store.layout.head_dim):
        raise ValueError(f"store layout {store.layout} does not fit the model's config")
    cache, n = _load_cache(model, input_ids, store)
    generate_kwargs.setdefault("do_sample", False)
    if cache is not None:
        generate_kwargs["cache"] = cache
    generate_kwargs.setdefault("return_dict_in_generate", True)
    out = model.generate(input_ids, max_new_tokens=max_new_tokens, **generate_kwargs)
    if store_new:
        T = input_ids.shape[1]
        full = out.cache
        layers = [(lyr.keys[0, :, :T].transpose(0, 1), lyr.values[0, :, :T].transpose(0, 1))
                  for lyr in full.layers]
        if layers and layers[0][0].shape[0] == T:
            store.put(input_ids[0], [(k.to(store.torch_dtype).cpu(), v.to(store.torch_dtype).cpu())
                                     for k, v in layers], start=n)
    seq = out.sequences
    if return_stats:
        return seq, {"cached_tokens": n, "prompt_tokens": int(input_ids.shape[1])}
    return seq
