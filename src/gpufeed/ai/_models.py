"""Load safetensors models from a gpufeed node straight into tensor memory.

How a load goes (one model, one or many shards):

1. Find the shards: one ``.safetensors`` object, an index
   (``model.safetensors.index.json``), or a folder holding either.
2. Read every shard's header with one batched request (``get_many_into``),
   then validate it strictly (:func:`gpufeed.ai._safetensors.parse_header`).
3. Lay all selected tensors out in ONE buffer from ``Client.alloc`` (on the
   shared-memory transport the server writes into it directly: file to tensor
   memory in one copy), each tensor at a 64-byte aligned offset. Tensors that
   are adjacent in a shard and stay aligned form a *run*; a run is read with a
   few large requests, since it is one contiguous range of the object.
4. Read the runs in pieces of at most ``chunk_bytes``, grouped in batches of
   about ``batch_bytes``, with up to ``max_inflight_bytes`` in flight.
5. Wrap each tensor as a view of the buffer (no copy), then move to
   ``device`` and cast to ``dtype`` if asked.
"""

from __future__ import annotations

import json
import mmap
import threading
from collections import deque
from collections.abc import Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from ..client import Client, ReadRequest
from ..errors import InvalidArgument, NoSuchKey
from ._safetensors import (
    HEADER_PREFIX_BYTES,
    SafetensorsError,
    SafetensorsHeader,
    TensorInfo,
    header_length,
    parse_header,
)

__all__ = ["load_safetensors", "load_safetensors_url", "find_safetensors", "read_headers"]

#: Every tensor starts at a multiple of this inside the destination buffer.
ALIGN_BYTES = 64
#: First read of each shard; most headers fit (a 1 GB Llama shard's is ~10 KiB).
HEAD_PROBE_BYTES = 64 << 10  # 64 KiB
#: ``madvise`` advice that maps every page of a range writable (Linux >= 5.14).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
#: Name transformers gives the shard index.
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class _Range:
    key: str  # object key
    offset: int  # in the object
    dest: int  # in the destination buffer
    length: int


def _join(bucket: str, key: str) -> str:
    return f"{bucket}/{key}"


def _folder(key: str) -> str:
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""


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


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def _plan(headers: Sequence[SafetensorsHeader], keys: Sequence[str], wanted: set[str] | None
          ) -> tuple[int, list[_Range], list[tuple[TensorInfo, int]]]:
    """Place the wanted tensors in one buffer; returns ``(total_bytes, runs,
    [(tensor, buffer_offset), ...])``. Empty tensors get offset -1."""
    cursor = 0
    runs: list[_Range] = []
    placed: list[tuple[TensorInfo, int]] = []
    for key, header in zip(keys, headers):
        run: _Range | None = None  # the open run: object offset, buffer offset, length
        for t in header.tensors:
            if wanted is not None and t.name not in wanted:
                continue
            if t.nbytes == 0:
                placed.append((t, -1))
                continue
            start = header.data_start + t.begin
            if (run is not None and start == run.offset + run.length
                    and (run.dest + run.length) % ALIGN_BYTES == 0):
                run = _Range(key, run.offset, run.dest, run.length + t.nbytes)
                runs[-1] = run
            else:
                run = _Range(key, start, _align(cursor), t.nbytes)
                runs.append(run)
            placed.append((t, run.dest + start - run.offset))
            cursor = run.dest + run.length
    return cursor, runs, placed


def _pieces(runs: Sequence[_Range], chunk_bytes: int) -> list[_Range]:
    out = []
    for r in runs:
        for o in range(0, r.length, chunk_bytes):
            out.append(_Range(r.key, r.offset + o, r.dest + o, min(chunk_bytes, r.length - o)))
    return out


def _read_all(client: Client, bucket: str, buf: memoryview, pieces: Sequence[_Range], *,
              batch_bytes: int, max_inflight_bytes: int) -> None:
    """Read every piece into ``buf``, batches pipelined; raises on any short read."""
    batches: list[list[_Range]] = []
    size = 0
    for piece in pieces:
        if not batches or size + piece.length > batch_bytes:
            batches.append([])
            size = 0
        batches[-1].append(piece)
        size += piece.length
    inflight: deque[tuple[list[_Range], int, Future]] = deque()
    held = 0

    def finish() -> None:
        nonlocal held
        batch, nbytes, fut = inflight.popleft()
        got = fut.result()
        held -= nbytes
        for piece, n in zip(batch, got):
            if n != piece.length:
                raise SafetensorsError(_join(bucket, piece.key),
                                       f"short read at byte {piece.offset}: {n} of {piece.length} "
                                       f"bytes (the object changed during the load?)")

    try:
        for batch in batches:
            nbytes = sum(p.length for p in batch)
            while inflight and held + nbytes > max_inflight_bytes:
                finish()
            fut = client.submit_get_many_into(
                [ReadRequest(bucket, p.key, buf[p.dest:p.dest + p.length], p.offset) for p in batch])
            inflight.append((batch, nbytes, fut))
            held += nbytes
        while inflight:
            finish()
    finally:  # never leave the server writing into memory we hand out or drop
        for _batch, _n, fut in inflight:
            try:
                fut.result()
            except Exception:
                pass


def _start_prefault(buf: memoryview) -> threading.Thread | None:
    """Map the buffer's pages into this process while the server fills them.

    On the shm transport the server writes into pages this process has not
    mapped yet; without this, the first touch of the loaded tensors pays a
    minor fault per 4 KiB page (measured 0.2-0.3 s per GB on the 2-core VM),
    which would only move cost out of the load. Runs in a thread (``madvise``
    releases the GIL) concurrently with the reads. A no-op for other buffers.
    """
    owner = buf.obj
    if not isinstance(owner, mmap.mmap) or len(buf) != len(owner):
        return None

    def populate() -> None:
        try:
            owner.madvise(MADV_POPULATE_WRITE)
        except (OSError, ValueError):  # old kernel or closed map: faults happen on first use
            pass

    thread = threading.Thread(target=populate, name="gpufeed-prefault", daemon=True)
    thread.start()
    return thread


def load_safetensors(client: Client, bucket: str, key: str | Sequence[str], *,
                     tensors: Collection[str] | None = None, device: str | torch.device = "cpu",
                     dtype: torch.dtype | None = None, chunk_bytes: int = 16 << 20,
                     batch_bytes: int = 64 << 20, max_inflight_bytes: int = 256 << 20,
                     ) -> dict[str, torch.Tensor]:
    """Load safetensors object(s) from a gpufeed node into tensors.

    Every selected tensor lands in one buffer from :meth:`Client.alloc` (on
    ``gpufeed+shm://`` the server writes there directly: one copy, file to
    tensor memory; on ``gpufeed+tcp://`` the socket receives into it). Each
    tensor is a view of that buffer at a 64-byte aligned offset; the buffer is
    freed once the client is closed and every tensor is gone.

    Args:
        client: a connected :class:`~gpufeed.client.Client`.
        bucket: the bucket.
        key: a ``.safetensors`` key, an index key
            (``*.safetensors.index.json``), a folder holding an index or
            shards, or a list of shard keys (see :func:`find_safetensors`).
        tensors: load only these tensor names (default: all); only their
            bytes are read.
        device: ``"cpu"`` (default) or e.g. ``"cuda:0"``: loaded to CPU
            memory, then copied with ``Tensor.to``.
        dtype: cast floating-point tensors to this dtype (integer and bool
            tensors keep theirs), as transformers' ``torch_dtype`` does.
        chunk_bytes: largest single read, bytes (default 16 MiB).
        batch_bytes: bytes per batched request (default 64 MiB).
        max_inflight_bytes: bytes requested but not yet read (default 256 MiB).

    Returns:
        Tensor name -> tensor (shape and dtype from the header; 0-d tensors
        for shape ``[]``), in shard order, then file order.

    Raises:
        SafetensorsError: a malformed header or index, a tensor missing from
            the shard the index names, a tensor in two shards, or a dtype
            this torch build lacks; the message names the object and tensor.
        InvalidArgument: a name in ``tensors`` is in no shard; an unusable
            ``device``; bad sizes.
        NoSuchKey, NoSuchBucket: nothing there.
        TransportError: the node went away.
    """
    if min(chunk_bytes, batch_bytes, max_inflight_bytes) <= 0:
        raise InvalidArgument("chunk_bytes, batch_bytes and max_inflight_bytes must be > 0")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"device {device!r}: CUDA is not available in this torch build")
    keys, weight_map = find_safetensors(client, bucket, key)
    headers = read_headers(client, bucket, keys)
    _check_names(bucket, keys, headers, weight_map)
    wanted = None
    if tensors is not None:
        wanted = set(tensors)
        missing = wanted - {t.name for h in headers for t in h.tensors}
        if missing:
            raise InvalidArgument(f"tensors not in {_join(bucket, str(key))}: {sorted(missing)}")

    total, runs, placed = _plan(headers, keys, wanted)
    buf = client.alloc(total) if total else memoryview(bytearray(0))
    prefault = _start_prefault(buf) if client.transport == "shm" else None
    try:
        _read_all(client, bucket, buf, _pieces(runs, chunk_bytes), batch_bytes=batch_bytes,
                  max_inflight_bytes=max_inflight_bytes)
    finally:
        if prefault is not None:
            prefault.join()

    out: dict[str, torch.Tensor] = {}
    for t, off in placed:
        if off < 0:
            x = torch.empty(t.shape, dtype=t.torch_dtype)
        else:
            x = torch.frombuffer(buf, dtype=torch.uint8, count=t.nbytes, offset=off)
            x = x.view(t.torch_dtype).reshape(t.shape)
        if dtype is not None and x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
        if dev.type != "cpu":
            x = x.to(dev, non_blocking=True)
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
