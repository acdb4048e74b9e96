"""Model weights for frameworks: a Hugging Face folder into an ``nn.Module``
(:func:`load_pretrained`), and a vLLM-style weight iterator
(:func:`iterate_weights`) that streams shard by shard.

Both sit on :func:`gpufeed.ai.load_safetensors` (same planning, batching,
``shard=`` slicing and CUDA staging) and take a connected
:class:`~gpufeed.client.Client` or a node URL.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import nn

from ..client import Client
from ..errors import InvalidArgument
from ._device import _check_device
from ._models import _check_names, _load_planned, _wanted, find_safetensors, read_headers
from ._readplan import ShardDim, _check_shard, _join

__all__ = ["load_pretrained", "iterate_weights", "empty_weights", "StateDictMismatch", "TiedWeightsDiffer"]


class StateDictMismatch(InvalidArgument):
    """The checkpoint's tensor names are not the model's.

    Attributes:
        missing: names the model has and the checkpoint lacks (sorted).
        unexpected: names the checkpoint has and the model lacks (sorted).
    """

    def __init__(self, where: str, missing: Sequence[str], unexpected: Sequence[str]) -> None:
        def show(names: Sequence[str]) -> str:
            return ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")

        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {show(missing)}")
        if unexpected:
            parts.append(f"not in the model: {show(unexpected)}")
        super().__init__(f"{where}: tensor names differ from the model's; " + "; ".join(parts),
                         missing=list(missing), unexpected=list(unexpected))
        self.missing = list(missing)
        self.unexpected = list(unexpected)


@contextlib.contextmanager
def _client_of(client_or_url: Client | str) -> Iterator[Client]:
    if isinstance(client_or_url, Client):
        yield client_or_url
        return
    if not isinstance(client_or_url, str):
        raise InvalidArgument(f"expected a Client or a node URL, not {type(client_or_url).__name__}")
    with Client(client_or_url) as client:
        yield client


def iterate_weights(client_or_url: Client | str, bucket: str, prefix: str | Sequence[str], *,
                    keys: Collection[str] | None = None,
                    shard: tuple[int, int, ShardDim] | None = None,
                    device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    prefetch: bool = True, **kwargs) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor of a model, one shard at a time.

    The shape of vLLM's ``safetensors_weights_iterator`` (a model's
    ``load_weights(weights)`` consumes it), so a serving engine can load from
    gpufeed unchanged. Headers are read once; each shard is then loaded with
    one :func:`load_safetensors` plan. Memory stays bounded: at most the shard
    being yielded plus (with ``prefetch``) the next one being read. Tensors
    are views of their shard's buffer, which lives while any of them does:
    copy what you keep (as ``param.data.copy_(w)`` does) so it can be reused.

    Args:
        client_or_url: a connected client, or a node URL (a client is opened
            for the iteration and closed at its end).
        bucket: the bucket.
        prefix: the model as :func:`find_safetensors` takes it (a folder with
            an index or shards, an index key, a shard key or a list of them).
        keys: only these tensor names.
        shard: ``(rank, world_size, dim)`` as for :func:`load_safetensors`.
        device: where the tensors go (``"cuda:N"``: pinned staging).
        dtype: cast floating-point tensors to this dtype.
        prefetch: read the next shard while the consumer handles this one.
        **kwargs: ``staging_bytes``, ``strided``, ``chunk_bytes``,
            ``batch_bytes``, ``max_inflight_bytes``, as for
            :func:`load_safetensors` (no progress bar: one per shard would
            be noise).

    Yields:
        ``(name, tensor)`` in shard order, then file order; every tensor once.

    Raises:
        What :func:`load_safetensors` raises; header errors before the first
        tensor is yielded.
    """
    dev = _check_device(device)
    shard = _check_shard(shard) if shard is not None else None
    opts = _read_options(kwargs)
    with _client_of(client_or_url) as client:
        shard_keys, weight_map = find_safetensors(client, bucket, prefix)
        headers = read_headers(client, bucket, shard_keys)
        _check_names(bucket, shard_keys, headers, weight_map)
        wanted = _wanted(bucket, prefix, keys, headers)
        todo = [(k, h) for k, h in zip(shard_keys, headers)
                if wanted is None or any(t.name in wanted for t in h.tensors)]

        def load(i: int) -> dict[str, torch.Tensor]:
            k, h = todo[i]
            return _load_planned(client, bucket, [k], [h], wanted, shard, dev, dtype,
                                 progress=False, **opts)

        yield from _shard_by_shard(len(todo), load, prefetch)


def _read_options(kwargs: dict) -> dict:
    """:func:`iterate_weights`' ``**kwargs`` over the defaults of the read options;
    raises InvalidArgument for any other name."""
    opts = {"staging_bytes": None, "strided": "auto", "chunk_bytes": 16 << 20,
            "batch_bytes": 64 << 20, "max_inflight_bytes": 256 << 20}
    unknown = set(kwargs) - set(opts)
    if unknown:
        raise InvalidArgument(f"iterate_weights got unexpected arguments: {sorted(unknown)}")
    opts.update(kwargs)
    return opts


def _shard_by_shard(count: int, load: Callable[[int], dict[str, torch.Tensor]], prefetch: bool
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the tensors of ``load(0)``, ..., ``load(count - 1)``, each shard's
    dict emptied as it is yielded; with ``prefetch`` the next shard is read in a
    background thread."""
    # The next shard is read once the consumer holds this shard's first
    # tensor (so no longer the previous shard's last one): at most two
    # shards' buffers are alive at a time, if the consumer copies.
    pool = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-weights") if prefetch else None
    try:
        nxt: Future | None = pool.submit(load, 0) if pool and count else None
        for i in range(count):
            part = nxt.result() if nxt is not None else load(i)
            nxt = None
            for name in list(part):
                yield name, part.pop(name)
                if pool is not None and nxt is None and i + 1 < count:
                    nxt = pool.submit(load, i + 1)
            del part
            # The SDK's batch futures hold their destination views in reference
            # cycles (a future's callbacks close over the future), so a shard's
            # buffer returns to the client's pool only when the cycle collector
            # runs; run it here, or memory grows with the model, not the shard.
            gc.collect(1)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def load_pretrained(client_or_url: Client | str, bucket: str, prefix: str | Sequence[str],
                    model: nn.Module, *, strict: bool = True, assign: bool | None = None,
                    device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                    shard: tuple[int, int, ShardDim] | None = None, **kwargs) -> nn.Module:
    """Load a Hugging Face model folder (sharded safetensors + index) into ``model``.

    ``model`` may hold random weights or be built with its parameters on the
    meta device (:func:`empty_weights`). Names are checked first: with
    ``strict``, any name the model has and the checkpoint lacks, or the other
    way round, is a :class:`StateDictMismatch` listing them, before any weight
    is read.

    Weights the model ties (one parameter under several names, e.g.
    ``lm_head.weight`` and ``model.embed_tokens.weight`` with
    ``tie_word_embeddings``) end up as transformers' ``from_pretrained`` leaves
    them: stored under one name (either one), every name shares it; stored under
    several names with equal values, they stay tied; stored with different
    values, the names are untied, each with its own values (a
    :class:`TiedWeightsDiffer` warning says so, and the model's
    ``all_tied_weights_keys`` forgets the pair, as transformers does).

    Args:
        client_or_url: a connected client or a node URL.
        bucket: the bucket.
        prefix: the model folder (or what :func:`find_safetensors` takes).
        model: the module to fill.
        strict: names must match exactly (else only common names load).
        assign: ``load_state_dict(assign=...)``: the loaded tensors become the
            parameters (no copy; their dtype and device win). Default: True
            when the model has parameters on the meta device, else False
            (copy into the existing parameters, keeping their dtype/device).
        device: where to load (default: the device of the model's first
            non-meta parameter, else CPU).
        dtype: cast floating-point tensors while loading.
        shard: ``(rank, world_size, dim)`` as for :func:`load_safetensors`
            (the model's parameters must then have the slices' shapes).
        **kwargs: ``progress``, ``staging_bytes``, ``strided``,
            ``chunk_bytes``, ``batch_bytes``, ``max_inflight_bytes``,
            ``zero_copy`` (with ``assign=True`` the parameters then view the
            node's page cache, shared by every process that loads the model).

    Returns:
        ``model``, loaded; names holding equal values share one parameter.

    Raises:
        StateDictMismatch: names differ (``strict``).
        InvalidArgument: a parameter or buffer is still on the meta device
            after loading (a buffer that is not in checkpoints, such as
            rotary ``inv_freq``: build with :func:`empty_weights`, which
            keeps buffers real).
        SafetensorsError, NoSuchKey, TransportError: as
            :func:`load_safetensors`.
    """
    from ._models import load_safetensors

    expected = model.state_dict(keep_vars=True)
    groups = _tied_groups(model)  # the names of each parameter registered under several
    aliases = {n: [o for o in g if o != n] for g in groups for n in g}
    if assign is None:
        assign = any(t.is_meta for t in expected.values())
    if device is None:
        device = next((t.device for t in expected.values() if not t.is_meta), torch.device("cpu"))
    where = _join(bucket, str(prefix))
    with _client_of(client_or_url) as client:
        shard_keys, weight_map = find_safetensors(client, bucket, prefix)
        headers = read_headers(client, bucket, shard_keys)
        stored = {t.name for h in headers for t in h.tensors}
        wanted = _names_to_load(where, expected, aliases, stored, strict)
        sd = load_safetensors(client, bucket, shard_keys, keys=wanted, shard=shard,
                              device=device, dtype=dtype, **kwargs)
    ties = [_tie_classes(g, sd, where) for g in groups]
    if not assign:
        _untie(model, ties)
    model.load_state_dict(sd, strict=strict, assign=assign)
    _retie(model, ties)
    _check_not_meta(model, where)
    return model


def _check_not_meta(model: nn.Module, where: str) -> None:
    """Raise InvalidArgument naming the parameters and buffers still on the meta device."""
    still = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if still:
        raise InvalidArgument(
            f"still on the meta device after loading {where}: "
            f"{still[:20]} (not in the checkpoint: build the model with "
            f"gpufeed.ai.empty_weights(), which keeps buffers real)")


def _names_to_load(where: str, expected: Collection[str], aliases: dict[str, list[str]],
                   stored: set[str], strict: bool) -> set[str]:
    """The stored names the model has; with ``strict``, raises StateDictMismatch when a
    name is missing from either side (a tied name is present if one of its aliases is)."""
    missing = sorted(n for n in expected if n not in stored
                     and not any(a in stored for a in aliases.get(n, ())))
    unexpected = sorted(stored - set(expected))
    if strict and (missing or unexpected):
        raise StateDictMismatch(where, missing, unexpected)
    return stored & set(expected)


def _untie(model: nn.Module, ties: list[list[list[str]]]) -> None:
    """Before a copying load: names to be untied get parameters of their own to copy into."""
    for classes in ties:
        for names in classes[1:]:
            old = model.get_parameter(names[0])
            fresh = nn.Parameter(torch.empty_like(old), requires_grad=old.requires_grad)
            for n in names:
                _set_parameter(model, n, fresh)


def _retie(model: nn.Module, ties: list[list[list[str]]]) -> None:
    """After the load: names holding equal values share one parameter; untied
    groups are dropped from the model's tied-weight keys."""
    for classes in ties:
        for names in classes:
            first = model.get_parameter(names[0])
            for n in names[1:]:
                _set_parameter(model, n, first)
        if len(classes) > 1:
            _forget_ties(model, classes)


class TiedWeightsDiffer(UserWarning):
    """A model ties parameters that the checkpoint stores with different values;
    they were loaded untied (as transformers' ``from_pretrained`` does)."""


def _tied_groups(model: nn.Module) -> list[list[str]]:
    """The names of each parameter registered under several, in registration order."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _tie_classes(group: list[str], sd: dict[str, torch.Tensor], where: str) -> list[list[str]]:
    """Split one tied group into classes of names that end up sharing a tensor.

    Stored names with equal values form one class; names the checkpoint lacks
    join the first class and take its tensor in ``sd``. More than one class
    means the checkpoint unties the group (warned)."""
    classes: list[list[str]] = []
    for n in (n for n in group if n in sd):
        same = next((c for c in classes if sd[c[0]].shape == sd[n].shape
                     and torch.equal(sd[c[0]], sd[n])), None)
        if same is None:
            classes.append([n])
        else:
            same.append(n)
    if not classes:
        return []  # none stored: the strict name check reported it
    for n in group:
        if n not in sd:
            classes[0].append(n)
            sd[n] = sd[classes[0][0]]
    if len(classes) > 1:
        warnings.warn(f"{where}: the model ties {group}, but the checkpoint stores them with "
                      f"different values; loaded untied, as transformers does (set "
                      f"tie_word_embeddings=False in the config to silence this)",
                      TiedWeightsDiffer, stacklevel=3)
    return classes


def _set_parameter(model: nn.Module, name: str, param: nn.Parameter) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, param)


def _forget_ties(model: nn.Module, classes: list[list[str]]) -> None:
    """Drop untied pairs from a transformers model's ``all_tied_weights_keys``
    (so its own bookkeeping agrees with the parameters)."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if not isinstance(tied, dict):
        return
    cls_of = {n: i for i, names in enumerate(classes) for n in names}
    for target, source in list(tied.items()):
        if target in cls_of and source in cls_of and cls_of[target] != cls_of[source]:
            tied.pop(target)


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Build modules with their parameters on the meta device (no memory, no
    init cost) and their buffers real, ready for :func:`load_pretrained`.

    The same idea as accelerate's ``init_empty_weights(include_buffers=False)``:
    buffers that checkpoints do not hold (rotary ``inv_freq``) keep the
    values the module computed. Not thread-safe (patches
    ``nn.Module.register_parameter`` for the duration).

    Example::

        with gpufeed.ai.empty_weights():
            model = LlamaForCausalLM(config)
        gpufeed.ai.load_pretrained(url, "models", "llama-1gb", model)
    """
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        if param is not None and not param.is_meta:
            self._parameters[name] = nn.Parameter(param.to("meta"),
                                                  requires_grad=param.requires_grad)

    # the stubs declare a method, which mypy refuses to reassign; patching it is the point
    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
