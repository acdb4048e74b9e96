"""Load safetensors models from a gpufeed node straight into tensor memory.

How a load goes (one model, one or many shards):

1. Find the shards: one ``.safetensors`` object, an index
   (``model.safetensors.index.json``), or a folder holding either.
2. Read every shard's header with one batched request (``get_many_into``),
   then validate it strictly (:func:`gpufeed.ai._safetensors.parse_header`).
3. Lay all selected tensors (or, under ``shard=``, this rank's slice of each)
   out in ONE buffer, each at a 64-byte aligned offset. Tensors that are
   adjacent in a shard and stay aligned form a *run*: one contiguous range of
   the object. A slice along dim 0 is one range; a slice along a later dim is
   one small range per index of the leading dims, batched
   (:mod:`gpufeed.ai._readplan`).
4. Read the ranges in pieces of at most ``chunk_bytes``, grouped in batches of
   about ``batch_bytes``, with up to ``max_inflight_bytes`` in flight
   (:mod:`gpufeed.ai._reads`):
   * CPU: into a ``Client.alloc`` buffer (on the shared-memory transport the
     server writes it directly: file to tensor memory in one copy; on
     ``gpufeed+tcp://`` the socket receives into it);
   * CUDA (or ``staging_bytes=``): through two pinned host staging slots
     into one device buffer, the copy of one slot overlapping the read of the
     next (``non_blocking`` copies on a side stream, :mod:`gpufeed.ai._device`).
     GPUDirect Storage is not used (see :func:`gds_status`).
5. Wrap each tensor as a view of the buffer (no copy), cast to ``dtype`` if
   asked. A CPU load's buffer goes back to the client's pool once every tensor
   is gone.

``zero_copy=True`` (``gpufeed+shm://``, CPU only) replaces steps 3-4: each shard
is mapped (:meth:`Client.map_object`, :mod:`gpufeed.ai._mapped`) and the
tensors view the mapping, every page mapped in before return. Nothing is
copied, and processes loading the same model share its pages (the node's page
cache). Tensors are writable copy-on-write (writes never reach the store).
They are not anonymous memory: under memory pressure the kernel may drop their
clean pages and read them back from disk later. A tensor whose offset in the
file is not a multiple of its element size is copied.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

import torch

from ..client import Client, ReadRequest
from ..errors import InvalidArgument, NoSuchKey
from ._device import _check_device, gds_status
from ._mapped import _load_mapped, _mapped_header
from ._readplan import ShardDim, _check_shard, _folder, _join, _pieces, _plan
from ._reads import (
    DEFAULT_STAGING_BYTES,
    _Progress,
    _read_all,
    _read_gathers,
    _read_staged,
    _want_progress,
)
from ._safetensors import (
    HEADER_PREFIX_BYTES,
    SafetensorsError,
    SafetensorsHeader,
    header_length,
    parse_header,
)

__all__ = ["load_safetensors", "load_safetensors_url", "find_safetensors", "read_headers",
           "gds_status", "ShardDim"]

#: First read of each shard; most headers fit (a 1 GB Llama shard's is ~10 KiB).
HEAD_PROBE_BYTES = 64 << 10  # 64 KiB
#: Name transformers gives the shard index.
INDEX_NAME = "model.safetensors.index.json"


def find_safetensors(client: Client, bucket: str, key: str | Sequence[str]
                     ) -> tuple[list[str], dict[str, str] | None]:
    """Resolve what to load into shard keys.

    Args:
        client: a connected :class:`~gpufeed.client.Client`.
        bucket: the bucket.
        key: one of
            * a ``.safetensors`` object key;
            * an index object key (``*.safetensors.index.json``);
            * a folder (``models/llama`` or ``models/llama/``; ``""`` is the
              bucket root) holding an index, or else ``*.safetensors`` objects
              directly (not in subfolders);
            * a sequence of ``.safetensors`` object keys.

    Returns:
        ``(shard_keys, weight_map)``: keys in load order, and the index's
        ``weight_map`` (tensor name -> shard key) or ``None`` without an index.

    Raises:
        NoSuchKey: nothing to load there.
        SafetensorsError: the index is not valid JSON with a ``weight_map``.
        NoSuchBucket, TransportError.
    """
    if not isinstance(key, str):
        keys = list(key)
        if not keys:
            raise InvalidArgument("no object keys given")
        return keys, None
    if key.endswith(".safetensors"):
        return [key], None
    if key.endswith(".json"):
        return _read_index(client, bucket, key)
    folder = key.rstrip("/") + "/" if key.rstrip("/") else ""
    found = [e for e in client.list(bucket, prefix=folder, delimiter="/") if not e.is_prefix]
    indexes = [e.key for e in found if e.key.endswith(".safetensors.index.json")]
    if len(indexes) > 1:
        preferred = folder + INDEX_NAME
        if preferred not in indexes:
            raise InvalidArgument(f"{_join(bucket, folder)} holds several indexes: {indexes}; "
                                  f"name one")
        indexes = [preferred]
    if indexes:
        return _read_index(client, bucket, indexes[0])
    shards = [e.key for e in found if e.key.endswith(".safetensors")]
    if not shards:
        raise NoSuchKey(f"no .safetensors objects or index under {_join(bucket, folder)}")
    return shards, None


def _read_index(client: Client, bucket: str, key: str) -> tuple[list[str], dict[str, str]]:
    name = _join(bucket, key)
    try:
        doc = json.loads(bytes(client.get(bucket, key)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(name, f"the index is not JSON: {exc}") from exc
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise SafetensorsError(name, "the index has no weight_map of tensor name -> file name")
    if not weight_map:
        raise SafetensorsError(name, "the index's weight_map is empty: it names no tensors")
    folder = _folder(key)
    shards = list(dict.fromkeys(folder + f for f in weight_map.values()))
    return shards, {t: folder + f for t, f in weight_map.items()}


def read_headers(client: Client, bucket: str, keys: Sequence[str]) -> list[SafetensorsHeader]:
    """Read and validate the headers of several safetensors objects, batched.

    One ``HEAD`` per object, one batched read of the first 64 KiB of every
    object, and a second batched read only for headers larger than that.

    Args:
        client: a connected client.
        bucket: the bucket.
        keys: object keys.

    Returns:
        One validated header per key, in order.

    Raises:
        SafetensorsError: a malformed header (names the object and tensor).
        NoSuchKey, NoSuchBucket, TransportError.
    """
    sizes = [client.head(bucket, k).size for k in keys]
    probes = [min(HEAD_PROBE_BYTES, s) for s in sizes]
    # Memory from client.alloc: on shm the server writes it directly. A bytearray
    # would go through the client's 64 MiB staging region, whose first use costs
    # ~70 ms to create and map (measured on the 2-core VM).
    area = client.alloc(sum(probes)) if sum(probes) else memoryview(bytearray(0))
    starts = [sum(probes[:i]) for i in range(len(probes))]
    client.get_many_into([ReadRequest(bucket, k, area[o:o + n], 0)
                          for k, o, n in zip(keys, starts, probes) if n])
    heads = [bytes(area[o:o + n]) for o, n in zip(starts, probes)]
    need: list[int] = []
    lengths: list[int] = []
    for i, k in enumerate(keys):
        n = header_length(_join(bucket, k), heads[i], sizes[i])
        lengths.append(n)
        if HEADER_PREFIX_BYTES + n > len(heads[i]):
            need.append(i)
    if need:
        more = [bytearray(HEADER_PREFIX_BYTES + lengths[i] - len(heads[i])) for i in need]
        client.get_many_into([ReadRequest(bucket, keys[i], m, len(heads[i]))
                              for i, m in zip(need, more)])
        for i, m in zip(need, more):
            heads[i] += bytes(m)
    return [parse_header(_join(bucket, k), h, s) for k, h, s in zip(keys, heads, sizes)]


def load_safetensors(client: Client, bucket: str, key: str | Sequence[str], *,
                     keys: Collection[str] | None = None, tensors: Collection[str] | None = None,
                     shard: tuple[int, int, ShardDim] | None = None,
                     device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                     progress: bool | None = None, staging_bytes: int | None = None,
                     strided: str = "auto", chunk_bytes: int = 16 << 20, batch_bytes: int = 64 << 20,
                     max_inflight_bytes: int = 256 << 20, zero_copy: bool = False
                     ) -> dict[str, torch.Tensor]:
    """Load safetensors object(s) from a gpufeed node into tensors.

    Every selected tensor is a view, at a 64-byte aligned offset, of one
    buffer: client memory on the CPU (on ``gpufeed+shm://`` the server writes
    it directly), or one device buffer on CUDA, filled through two pinned host
    staging slots (the module docstring has the steps; GPUDirect Storage is
    not used, see :func:`gds_status`).

    Args:
        client: a connected :class:`~gpufeed.client.Client`.
        bucket: the bucket.
        key: a ``.safetensors`` key, an index key
            (``*.safetensors.index.json``), a folder holding an index or
            shards, or a list of shard keys (see :func:`find_safetensors`).
        keys, tensors: load only these tensor names (default: all), reading only their
            bytes; the two are the same (give one or the other).
        shard: ``(rank, world_size, dim)``: load only this rank's part of each
            tensor along ``dim``, reading only its bytes (tensor parallelism).
            ``dim`` is an int (negative counts from the end), ``None`` (every
            tensor whole), or a callable ``name -> int | None`` (``None``:
            that tensor whole, e.g. norms; 0 for column-parallel weights, 1 for
            row-parallel ones, as vLLM does). Parts are equal:
            ``[rank * n / w, (rank + 1) * n / w)``, and a dim that does not
            divide evenly is an error, as in vLLM's ``divide``.
        device: ``"cpu"`` (default) or e.g. ``"cuda:0"``.
        dtype: cast floating-point tensors to this dtype (integer and bool
            tensors keep theirs), as transformers' ``torch_dtype`` does.
        progress: show a progress bar on stderr; default: when loading more
            than 1 GB and stderr is a terminal.
        staging_bytes: size of each host staging slot, bytes (default 64 MiB
            for CUDA). Given with ``device="cpu"``, the CPU load also goes
            through the staged path into ordinary torch memory (one
            ``torch.empty`` buffer) instead of client memory.
        strided: how a slice along a dim after the first is read: ``"ranges"`` (one range
            per row: only the slice's bytes), ``"rows"`` (whole rows in 16 MiB blocks, the
            slice gathered in memory), or ``"auto"`` (rows when a row is under 128 KiB: a
            range costs about as much as 100 KB of bytes).
        chunk_bytes: largest single read, bytes (default 16 MiB).
        batch_bytes: bytes per batched request (default 64 MiB).
        max_inflight_bytes: bytes requested but not yet read (default 256 MiB).
        zero_copy: ``gpufeed+shm://`` and ``device="cpu"`` only: return tensors
            viewing each shard mapped with :meth:`Client.map_object`, nothing
            copied (see the module docstring). A tensor misaligned for its
            dtype is copied; ``dtype`` casts copy as usual; ``shard=`` and
            ``staging_bytes`` are refused.

    Returns:
        Tensor name -> tensor (shape and dtype from the header, or the slice's shape under
        ``shard``; 0-d tensors for shape ``[]``), in shard order, then file order.

    Raises:
        SafetensorsError: a malformed header or index, a tensor missing from
            the shard the index names, a tensor in two shards, or a dtype
            this torch build lacks; the message names the object and tensor.
        InvalidArgument: a name in ``keys`` is in no shard; both ``keys`` and
            ``tensors``; a bad ``shard`` or a dim that does not divide evenly
            (names the tensor); an unusable ``device``; bad sizes.
        NoSuchKey, NoSuchBucket: nothing there.
        TransportError: the node went away.
    """
    dev, shard = _check_options(client, keys, tensors, shard, device, dtype, staging_bytes,
                                strided, (chunk_bytes, batch_bytes, max_inflight_bytes), zero_copy)
    shard_keys, weight_map = find_safetensors(client, bucket, key)
    headers, maps = _shard_headers(client, bucket, shard_keys, mapped=zero_copy)
    _check_names(bucket, shard_keys, headers, weight_map)
    wanted = _wanted(bucket, key, keys if keys is not None else tensors, headers)
    if zero_copy:
        return _load_mapped(maps, headers, wanted, dtype)
    return _load_planned(client, bucket, shard_keys, headers, wanted, shard, dev, dtype,
                         progress=progress, staging_bytes=staging_bytes, strided=strided,
                         chunk_bytes=chunk_bytes, batch_bytes=batch_bytes, max_inflight_bytes=max_inflight_bytes)


def _check_options(client: Client, keys: Collection[str] | None, tensors: Collection[str] | None,
                   shard: object, device: str | torch.device, dtype: torch.dtype | None,
                   staging_bytes: int | None, strided: str, sizes: tuple[int, int, int],
                   zero_copy: bool) -> tuple[torch.device, tuple[int, int, ShardDim] | None]:
    """Validate :func:`load_safetensors`' options; ``sizes`` is ``(chunk_bytes,
    batch_bytes, max_inflight_bytes)``. Returns ``(device, shard)``, checked."""
    if keys is not None and tensors is not None:
        raise InvalidArgument("give keys= or tensors= (the same thing), not both")
    if strided not in ("auto", "ranges", "rows"):
        raise InvalidArgument(f"strided must be 'auto', 'ranges' or 'rows', not {strided!r}")
    if min(sizes) <= 0 or (staging_bytes is not None and staging_bytes <= 0):
        raise InvalidArgument("chunk_bytes, batch_bytes, max_inflight_bytes and staging_bytes "
                              "must be > 0")
    dev = _check_device(device)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise InvalidArgument(f"dtype must be a torch.dtype (e.g. torch.bfloat16), not {dtype!r}")
    checked = _check_shard(shard) if shard is not None else None
    if zero_copy:
        if dev.type != "cpu" or checked is not None or staging_bytes is not None:
            raise InvalidArgument("zero_copy=True maps whole tensors into CPU memory: it takes no "
                                  "device other than 'cpu', no shard= and no staging_bytes")
        if not client.supports_map:
            raise InvalidArgument("zero_copy=True needs a client that supports_map "
                                  "(gpufeed+shm:// to a node with MAP)")
    return dev, checked


def _shard_headers(client: Client, bucket: str, shard_keys: Sequence[str], *, mapped: bool
                   ) -> tuple[list[SafetensorsHeader], list[memoryview]]:
    """``(headers, maps)``: read batched, or (``mapped``) parsed from each shard
    mapped with ``Client.map_object`` (``maps`` is empty unless ``mapped``)."""
    if not mapped:
        return read_headers(client, bucket, shard_keys), []
    maps = [client.map_object(bucket, k, populate=False) for k in shard_keys]
    return [_mapped_header(bucket, k, m) for k, m in zip(shard_keys, maps)], maps


def _wanted(bucket: str, key: str | Sequence[str], names: Collection[str] | None,
            headers: Sequence[SafetensorsHeader]) -> set[str] | None:
    """The tensor names to load (None: all); raises InvalidArgument for names in no shard."""
    if names is None:
        return None
    wanted = {names} if isinstance(names, str) else set(names)
    missing = wanted - {t.name for h in headers for t in h.tensors}
    if missing:
        raise InvalidArgument(f"tensors not in {_join(bucket, str(key))}: {sorted(missing)}")
    return wanted


def _load_planned(client: Client, bucket: str, shard_keys: Sequence[str],
                  headers: Sequence[SafetensorsHeader], wanted: set[str] | None,
                  shard: tuple[int, int, ShardDim] | None, dev: torch.device,
                  dtype: torch.dtype | None, *, progress: bool | None,
                  staging_bytes: int | None, strided: str, chunk_bytes: int, batch_bytes: int,
                  max_inflight_bytes: int) -> dict[str, torch.Tensor]:
    """The load after headers are read and checked (shared with iterate_weights)."""
    total, ranges, gathers, placed = _plan(headers, shard_keys, wanted, shard, bucket, strided)
    staged = dev.type != "cpu" or staging_bytes is not None
    bar = _Progress(_want_progress(progress, total), total,
                    f"{_join(bucket, _folder(shard_keys[0]))} -> {dev}")
    try:
        if staged:
            slot_bytes = staging_bytes or DEFAULT_STAGING_BYTES
            base = torch.empty(total, dtype=torch.uint8, device=dev)
            _read_staged(client, bucket, base, _pieces(ranges, min(chunk_bytes, slot_bytes)),
                         slot_bytes=slot_bytes, progress=bar)
            _read_gathers(client, bucket, base, gathers, progress=bar)
        else:
            buf = client.alloc(total) if total else memoryview(bytearray(0))
            # map the pages in while the node fills them (no faults on first use)
            prefault = client.map_ahead(buf) if total else None
            try:
                _read_all(client, bucket, buf, _pieces(ranges, chunk_bytes),
                          batch_bytes=batch_bytes, max_inflight_bytes=max_inflight_bytes,
                          progress=bar)
            finally:
                if prefault is not None:
                    prefault.join()
            if gathers:
                _read_gathers(client, bucket, torch.frombuffer(buf, dtype=torch.uint8), gathers,
                              progress=bar)
    finally:
        bar.close()

    out: dict[str, torch.Tensor] = {}
    for p in placed:
        t = p.info
        if p.offset < 0:
            x = torch.empty(p.shape, dtype=t.torch_dtype, device=dev)
        elif staged:  # views of one device buffer
            x = base[p.offset:p.offset + p.nbytes].view(t.torch_dtype).reshape(p.shape)
        else:  # each its own storage over the client buffer (safetensors' save_file accepts them)
            x = torch.frombuffer(buf, dtype=torch.uint8, count=p.nbytes, offset=p.offset)
            x = x.view(t.torch_dtype).reshape(p.shape)
        if dtype is not None and x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
        out[t.name] = x
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return out


def _check_names(bucket: str, keys: Sequence[str], headers: Sequence[SafetensorsHeader],
                 weight_map: dict[str, str] | None) -> None:
    where: dict[str, str] = {}
    for k, h in zip(keys, headers):
        for t in h.tensors:
            if t.name in where:
                raise SafetensorsError(_join(bucket, k), f"also in {_join(bucket, where[t.name])}",
                                       tensor=t.name)
            where[t.name] = k
    for name, k in (weight_map or {}).items():
        if where.get(name) != k:
            raise SafetensorsError(_join(bucket, k), "listed in the index but not in this shard",
                                   tensor=name)


def load_safetensors_url(url: str, path: str, **kwargs) -> dict[str, torch.Tensor]:
    """:func:`load_safetensors` with its own client: connect, load, close.

    Args:
        url: the node, ``gpufeed+shm:///path/gpufeed.sock`` or
            ``gpufeed+tcp://HOST:PORT``.
        path: ``BUCKET/KEY``, where KEY is as for :func:`load_safetensors`
            (``models/llama`` loads the folder's index or shards).
        **kwargs: passed to :func:`load_safetensors`.

    Returns:
        Tensor name -> tensor; the tensors stay valid after the client closes.

    Raises:
        InvalidArgument: ``path`` has no bucket; plus what
            :func:`load_safetensors` raises.
    """
    bucket, _, key = path.removeprefix("/").partition("/")
    if not bucket:
        raise InvalidArgument(f"{path!r}: expected BUCKET/KEY")
    with Client(url) as client:
        return load_safetensors(client, bucket, key, **kwargs)
