"""``KVCacheStore``: attention KV by token prefix, in a CPU tier in front of a gpufeed node.

Reads go straight into the caller's ``[2, layers, tokens, kv_heads, head_dim]``
tensor: every ``[kv][layer]`` block of a chunk is one contiguous byte range of
the chunk object and of the destination, so a batch read (``GETV``) lands each
block in place; on the shared-memory transport with a destination from
:meth:`KVCacheStore.alloc_kv` the node writes it there itself (no copy in
this process). Many chunks are in flight at once (``chunks_per_request``
chunks per ``GETV``, all batches submitted before the first is awaited).

Failure rules (never wrong KV): a chunk that is missing (evicted between
lookup and read), whose header does not match the expected model/dtype/layout
and chunk digest, or whose block checksums do not match is a *miss*: the read
returns the prefix before it, and the caller recomputes the rest. A node
that cannot be reached is a miss too: it is counted in
``metrics.node_errors``, logged as a warning, and retried after
``retry_interval_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from ...client import Client
from ...errors import BucketAlreadyOwnedByYou, GpufeedError, InvalidRequestError
from .._session import NodeSession
from ._format import ChunkHeader, block_checksum, header_len
from ._keys import ChunkKey, KVLayout, chunk_keys
from ._layers import ChunkUnavailable, LayerStream
from ._metrics import Counters, KVMetrics
from ._reads import _ChunkReads, _u8
from ._tier import CpuTier

# Counters: the base of the LMCache plugin's counters too
__all__ = ["KVCacheStore", "KVMetrics", "ChunkUnavailable", "LayerStream", "Counters"]

log = logging.getLogger("gpufeed.kvcache")


class KVCacheStore(_ChunkReads):
    """KV cache of one model shard keyed by token prefix, on a gpufeed node.

    Args:
        url_or_client: ``gpufeed+shm:///...sock`` / ``gpufeed+tcp://h:p``, or a
            :class:`~gpufeed.client.Client` (then the caller owns it).
        model_id: model name and revision; part of every key.
        num_layers, num_kv_heads, head_dim: the KV shape of this shard.
        dtype: KV element type (``torch.bfloat16``, ``"float32"``, ...).
        tp_rank, tp_size: tensor-parallel shard; part of every key.
        bucket: node bucket (created if missing).
        key_prefix: key prefix inside the bucket.
        chunk_tokens: tokens per chunk (default 256).
        partial_chunks: also store/find a last chunk shorter than ``chunk_tokens``.
        cpu_tier_bytes: capacity of the local CPU tier (0 disables it).
        populate_tier: copy chunks read from the node into the CPU tier.
        chunks_per_request: chunks per batch read (each is ``1 + 2 * layers`` ranges);
            default: on shm as many as fit in ``SHM_BATCH_BYTES`` (256 MiB; the node
            checksums the blocks as they land, so the client has nothing to overlap
            and fewer round trips win: 31 chunks of 8 MiB read at 0.82 x the
            large-read GB/s in one batch, 0.75 x in batches of 8 or 16, measured
            side by side), on TCP 4 (the client verifies one batch while the next
            is still arriving).
        verify: check block checksums on reads from the node.
        bucket_kind, bucket_capacity_bytes, bucket_ttl_s: how the bucket is created
            when the node supports KV buckets (eviction by capacity / TTL).
        retry_interval_s: after a node failure, seconds before reconnecting.
        connections: fast-path connections when given a URL.
        request_timeout_s: when given a URL: a node request that makes no progress
            for this long fails (seconds), and the store serves misses (recompute)
            and reconnects after ``retry_interval_s``. A reload moves hundreds of MB
            in tens of ms, so a few seconds of silence means a stuck node; a TTFT
            would rather recompute than wait the client's default 60 s.

    Raises:
        ValueError: a bad layout (see :class:`KVLayout`).
        InvalidBucketName: a bad bucket name.

    A node that is down at construction is not an error: the store serves
    misses and retries later.
    """

    def __init__(self, url_or_client: str | Client, model_id: str, *, num_layers: int,
                 num_kv_heads: int, head_dim: int, dtype="bfloat16", tp_rank: int = 0,
                 tp_size: int = 1, bucket: str = "kvcache", key_prefix: str = "kv",
                 chunk_tokens: int = 256, partial_chunks: bool = False,
                 cpu_tier_bytes: int = 1 << 30, populate_tier: bool = True,
                 chunks_per_request: int | None = None, verify: bool = True, bucket_kind: str = "kv",
                 bucket_capacity_bytes: int = 0, bucket_ttl_s: float = 0.0,
                 retry_interval_s: float = 5.0, connections: int | None = None,
                 request_timeout_s: float = 5.0) -> None:
        self.layout = KVLayout(model_id, dtype, num_layers, num_kv_heads, head_dim, tp_rank,
                               tp_size, chunk_tokens)
        self.torch_dtype: torch.dtype = getattr(torch, self.layout.dtype)
        self.bucket, self.key_prefix = bucket, key_prefix
        self.partial_chunks = partial_chunks
        self.tier = CpuTier(cpu_tier_bytes)
        self.populate_tier = populate_tier
        self.chunks_per_request = None if chunks_per_request is None else max(1, chunks_per_request)
        self.verify = verify
        self.metrics = KVMetrics()
        self.header_len = header_len(num_layers)
        self._bucket_args = (bucket_kind, bucket_capacity_bytes, bucket_ttl_s)
        self._landing_lock = threading.Lock()
        self._readers_lock = threading.Lock()
        self._landing_buf: torch.Tensor | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-kv-put")
        self._pending: set[Future] = set()
        self._pending_lock = threading.Lock()
        connect_kw: dict = {"request_timeout_s": request_timeout_s}
        if connections:
            connect_kw["connections"] = connections
        self._session = NodeSession(url_or_client, connect_kw=connect_kw, prepare=self._create_bucket,
                                    fatal=(InvalidRequestError,), retry_interval_s=retry_interval_s,
                                    on_down=self._down)
        self.url = self._session.url
        self._node()  # connect now if we can (a failure is only counted)

    # --- node plumbing ------------------------------------------------------------
    def _node(self) -> Client | None:
        """The connected client with the bucket ready, or None while the node is down."""
        return self._session.client()

    def _create_bucket(self, client: Client) -> None:
        kind, capacity, ttl = self._bucket_args
        try:
            if kind == "kv" and not (capacity or ttl):
                client.create_bucket(self.bucket)  # no limits given: the node needs one for a kv bucket
                return
            try:
                client.create_bucket(self.bucket, kind=kind, capacity_bytes=capacity, ttl_s=ttl)
            except TypeError:  # an SDK without KV buckets
                client.create_bucket(self.bucket)
        except BucketAlreadyOwnedByYou:
            pass

    def _down(self, exc: BaseException) -> None:
        self.metrics.add(node_errors=1)
        log.warning("kvcache: node %s unavailable (%s: %s); serving by recompute",
                    self.url, type(exc).__name__, exc)

    def _failed(self, exc: BaseException) -> None:
        self._session.failed(exc)

    # --- keys and buffers ------------------------------------------------------------
    def keys(self, tokens) -> list[ChunkKey]:
        """Chunk keys of ``tokens`` (see :func:`chunk_keys`)."""
        return chunk_keys(tokens, self.layout, prefix=self.key_prefix, partial=self.partial_chunks)

    def alloc_kv(self, tokens: int) -> torch.Tensor:
        """A ``[2, layers, tokens, kv_heads, head_dim]`` tensor the node can write into
        directly (registered shared memory on ``gpufeed+shm``; plain memory otherwise)."""
        shape = self._chunk_shape(tokens)
        nbytes = int(np.prod(shape)) * self.layout.itemsize
        client = self._node()
        if client is None or not client.supports_registered_alloc or nbytes == 0:
            return torch.empty(shape, dtype=self.torch_dtype)
        mem = client.alloc(nbytes)
        return torch.frombuffer(mem, dtype=self.torch_dtype).view(shape)

    def landing(self, tokens: int) -> "_Landing":
        """A reusable :meth:`alloc_kv` buffer of at least ``tokens`` tokens, held while in
        the ``with`` block (one holder at a time): repeated reloads reuse the same
        registered memory instead of mapping a new region each time.

        Usage: ``with store.landing(n) as kv: store.get_into(tokens, kv[:, :, :n])``
        (the yielded tensor is exactly ``[2, layers, tokens, kv_heads, head_dim]``,
        contiguous only when ``tokens`` equals its capacity, so pass it whole).
        """
        shape = self._chunk_shape(tokens)
        return _Landing(self, int(np.prod(shape)) * self.layout.itemsize, shape, self.torch_dtype)

    def chunk_landing(self, tokens: int) -> "_Landing":
        """Like :meth:`landing`, for :meth:`get_chunks`: a ``uint8`` buffer with room for
        the whole chunk objects (headers included) of ``tokens`` tokens."""
        n = -(-tokens // self.layout.chunk_tokens)
        nbytes = n * self._object_bytes(self.layout.chunk_tokens)
        return _Landing(self, nbytes, (nbytes,), torch.uint8)

    def _alloc_bytes(self, nbytes: int) -> torch.Tensor:
        """Flat uint8 tensor in registered memory on shm (page-touched), else plain."""
        client = self._node()
        if client is None or not client.supports_registered_alloc or nbytes == 0:
            return torch.zeros(nbytes, dtype=torch.uint8)
        t = torch.frombuffer(client.alloc(nbytes), dtype=torch.uint8)
        t.zero_()  # fault the pages in once, here, rather than on the first reload
        return t

    def get_chunks(self, tokens, out: torch.Tensor) -> list[torch.Tensor]:
        """Load the cached prefix of ``tokens`` chunk by chunk: the fastest reload.

        Each chunk object is one read (header and payload) into its own slot of
        ``out`` (from :meth:`chunk_landing`), verified there; chunks in the CPU
        tier are returned as they are (no copy).

        Args:
            tokens: token ids, 1-D; chunks that do not fit in ``out`` are not read.
            out: flat ``uint8`` buffer, ``k * object_bytes`` long.

        Returns:
            Payload tensors ``[2, layers, chunk_tokens, kv_heads, head_dim]`` of the
            leading valid chunks, in order (views into ``out`` or tier buffers; valid
            until ``out`` is reused or the tier evicts, so copy before that).
        """
        cks = self.keys(tokens)
        slot = self._object_bytes(self.layout.chunk_tokens)
        cks = cks[: out.numel() // slot]
        self.metrics.add(lookups=1)
        result: list[torch.Tensor] = []
        i = 0
        while i < len(cks):
            t = self.tier.get(cks[i].key)
            if t is None:
                break
            result.append(t)
            i += 1
        self.metrics.add(tier_hits=i)
        rest = cks[i:]
        client = self._node() if rest else None
        if client is not None:
            for ck, payload in self._read_objects(client, out, [(ck, j * slot) for j, ck in enumerate(rest)]):
                result.append(payload)
                if self.populate_tier and self.tier.capacity_bytes:
                    buf = self.tier.empty(payload.shape, payload.dtype)
                    buf.copy_(payload)
                    self.tier.put(ck.key, buf)
        got = cks[len(result) - 1].end if result else 0
        self.metrics.add(hit_tokens=got, miss_tokens=(cks[-1].end if cks else 0) - got)
        return result

    # --- reads ------------------------------------------------------------------------
    def get_into(self, tokens, kv_out: torch.Tensor) -> int:
        """Load the longest cached prefix of ``tokens`` into ``kv_out``.

        Args:
            tokens: token ids, 1-D.
            kv_out: ``[2, layers, T, kv_heads, head_dim]`` contiguous tensor of the
                store's dtype, ``T >= len(tokens)`` (or ``>=`` the tokens you want
                loaded: only chunks that fit are read). Use :meth:`alloc_kv` for
                zero-copy reads on ``gpufeed+shm``.

        Returns:
            Leading tokens loaded (a chunk boundary, or ``len(tokens)`` with a
            partial last chunk). ``kv_out`` past that is unspecified.

        Raises:
            ValueError: ``kv_out`` of the wrong dtype, shape or layout.
        """
        self._check_out(kv_out)
        cks = [ck for ck in self.keys(tokens) if ck.end <= kv_out.shape[2]]
        return self._load(cks, lambda ck: kv_out[:, :, ck.start:ck.end])

    def _check_out(self, kv_out: torch.Tensor) -> None:
        lay = self.layout
        want = (2, lay.num_layers, lay.num_kv_heads, lay.head_dim)
        have = tuple(kv_out.shape[:2]) + tuple(kv_out.shape[3:]) if kv_out.dim() == 5 else None
        if have != want or kv_out.dtype != self.torch_dtype or not kv_out.is_contiguous():
            raise ValueError(f"kv_out must be a contiguous {self.torch_dtype} tensor "
                             f"[2, {lay.num_layers}, T, {lay.num_kv_heads}, {lay.head_dim}], "
                             f"not {kv_out.dtype} {tuple(kv_out.shape)}")
        if kv_out.device.type != "cpu":
            raise ValueError("kv_out must be in CPU memory (copy to the GPU afterwards)")

    def _load(self, cks: list[ChunkKey], dest) -> int:
        """Fill ``dest(ck)`` for each chunk, tier first then node; returns valid tokens."""
        self.metrics.add(lookups=1)
        done = 0
        node_jobs: list[tuple[ChunkKey, torch.Tensor]] = []
        for ck in cks:
            t = self.tier.get(ck.key)
            if t is not None and not node_jobs:
                dest(ck).copy_(t)
                self.metrics.add(tier_hits=1)
                done += 1
                continue
            node_jobs.append((ck, dest(ck)))
        if node_jobs:
            client = self._node()
            n = self._read_chunks(client, node_jobs) if client is not None else 0
            if self.populate_tier and self.tier.capacity_bytes:
                for ck, dst in node_jobs[:n]:
                    if ck.key not in self.tier:
                        buf = self.tier.empty(dst.shape, dst.dtype)
                        buf.copy_(dst)
                        self.tier.put(ck.key, buf)
            done += n
        tokens = cks[done - 1].end if done else 0
        total = cks[-1].end if cks else 0
        self.metrics.add(hit_tokens=tokens, miss_tokens=total - tokens)
        return tokens

    def submit_get_into(self, tokens, kv_out: torch.Tensor) -> Future:
        """:meth:`get_into` in a background thread; the Future resolves to the tokens loaded."""
        return self._reader().submit(self.get_into, tokens, kv_out)

    def get_many_into(self, requests: Sequence[tuple]) -> list[int]:
        """Many ``(tokens, kv_out)`` loads concurrently; tokens loaded per request."""
        return [f.result() for f in [self.submit_get_into(t, o) for t, o in requests]]

    def _reader(self) -> ThreadPoolExecutor:
        ex = getattr(self, "_readers", None)
        if ex is None:
            with self._readers_lock:
                ex = getattr(self, "_readers", None)
                if ex is None:
                    ex = self._readers = ThreadPoolExecutor(4, thread_name_prefix="gpufeed-kv-get")
        return ex

    def lookup(self, tokens) -> int:
        """Number of leading tokens whose KV is cached (CPU tier or node).

        One batch read of the chunk headers; a header that does not match the
        expected layout and digest counts as absent. Cheap, but a chunk can still
        disappear before :meth:`get_into` (which then returns fewer tokens).
        """
        cks = self.keys(tokens)
        i = 0
        while i < len(cks) and cks[i].key in self.tier:
            i += 1
        rest = cks[i:]
        if not rest:
            return cks[-1].end if cks else 0
        client = self._node()
        if client is None:
            return cks[i - 1].end if i else 0
        n = self._probe(client, rest)
        i += n
        return cks[i - 1].end if i else 0

    def prefetch(self, tokens) -> Future:
        """Start loading the cached prefix of ``tokens`` into the CPU tier; the Future
        resolves to the tokens now in the tier."""
        def run() -> int:
            cks = self.keys(tokens)
            jobs = [(ck, self.tier.empty(self._chunk_shape(ck.tokens), self.torch_dtype))
                    for ck in cks if ck.key not in self.tier]
            client = self._node()
            n = self._read_chunks(client, jobs) if client is not None and jobs else 0
            for ck, buf in jobs[:n]:
                self.tier.put(ck.key, buf)
            i = 0
            while i < len(cks) and cks[i].key in self.tier:
                i += 1
            return cks[i - 1].end if i else 0
        return self._reader().submit(run)

    def get_layers(self, tokens, *, depth: int = 2) -> "LayerStream":
        """Layer-wise load of the cached prefix of ``tokens``: iterate to get
        ``(layer, keys, values)`` with ``keys``/``values`` shaped
        ``[n, kv_heads, head_dim]`` (``n = stream.tokens``), while the next
        ``depth`` layers are already being read.

        Iteration raises :class:`ChunkUnavailable` (with the still-valid token
        count) if a chunk vanishes or fails its checksum after the stream began.
        """
        return LayerStream(self, tokens, depth)

    # --- writes -----------------------------------------------------------------------
    def put(self, tokens, kv, *, start: int = 0) -> Future:
        """Store the KV of ``tokens``: chunks go to the CPU tier now and to the node
        asynchronously.

        Args:
            tokens: token ids, 1-D.
            kv: ``[2, layers, T, kv_heads, head_dim]`` tensor, or a sequence of
                ``layers`` pairs ``(keys, values)`` each ``[T, kv_heads, head_dim]``
                (any strides); ``T >= len(tokens)``. Copied before this returns.
            start: skip chunks that begin before this token (already cached).

        Returns:
            A Future of the number of chunks the node accepted (errors are counted
            in ``metrics.put_errors``, never raised).
        """
        layers = self._as_layers(kv)
        objs = []
        for ck in self.keys(tokens):
            if ck.start < start or ck.key in self.tier:
                continue
            objs.append((ck, self._encode(ck, layers)))
        fut = self._writer.submit(self._write, objs)
        with self._pending_lock:
            self._pending.add(fut)
        fut.add_done_callback(self._forget)
        return fut

    def submit_put(self, tokens, kv, *, start: int = 0) -> Future:
        """Alias of :meth:`put` (which is already asynchronous towards the node)."""
        return self.put(tokens, kv, start=start)

    def _forget(self, fut: Future) -> None:
        with self._pending_lock:
            self._pending.discard(fut)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every put so far reached the node (or failed)."""
        with self._pending_lock:
            pending = list(self._pending)
        for f in pending:
            f.result(timeout=timeout_s)

    def _as_layers(self, kv) -> list[tuple[torch.Tensor, torch.Tensor]]:
        lay = self.layout
        if isinstance(kv, torch.Tensor):
            if kv.dim() != 5 or kv.shape[0] != 2 or kv.shape[1] != lay.num_layers:
                raise ValueError(f"kv must be [2, {lay.num_layers}, T, H, D], not {tuple(kv.shape)}")
            layers = [(kv[0, i], kv[1, i]) for i in range(lay.num_layers)]
        else:
            layers = list(kv)
        if len(layers) != lay.num_layers:
            raise ValueError(f"expected {lay.num_layers} layers, got {len(layers)}")
        for k, v in layers:
            for t in (k, v):
                if t.dim() != 3 or tuple(t.shape[1:]) != (lay.num_kv_heads, lay.head_dim):
                    raise ValueError(f"per-layer KV must be [T, {lay.num_kv_heads}, {lay.head_dim}],"
                                     f" not {tuple(t.shape)}")
        return layers

    def _encode(self, ck: ChunkKey, layers) -> tuple[np.ndarray, torch.Tensor]:
        """The chunk object (header + payload) and its payload tensor, in one buffer."""
        lay = self.layout
        shape = self._chunk_shape(ck.tokens)
        nbytes = int(np.prod(shape)) * lay.itemsize
        obj = self.tier.empty((self.header_len + nbytes,), torch.uint8)
        payload = obj[self.header_len:].view(self.torch_dtype).view(shape)
        for i, (k, v) in enumerate(layers):
            if k.shape[0] < ck.end or v.shape[0] < ck.end:
                raise ValueError(f"KV holds {k.shape[0]} tokens; chunk needs {ck.end}")
            payload[0, i].copy_(k[ck.start:ck.end])
            payload[1, i].copy_(v[ck.start:ck.end])
        sums = tuple(block_checksum(_u8(payload[kv, i])) for kv in range(2)
                     for i in range(lay.num_layers))
        hdr = ChunkHeader(lay.dtype, lay.num_layers, ck.tokens, lay.num_kv_heads, lay.head_dim,
                          ck.digest, sums).pack()
        arr = obj.numpy()
        arr[:self.header_len] = np.frombuffer(hdr, np.uint8)
        self.tier.put(ck.key, payload)
        return arr, payload

    def _write(self, objs) -> int:
        client = self._node()
        if client is None:
            if objs:
                self.metrics.add(put_errors=len(objs))
            return 0
        futs = []
        try:
            for ck, (arr, _payload) in objs:
                futs.append((ck, arr, client.submit_put(self.bucket, ck.key, arr)))
        except (GpufeedError, OSError) as exc:
            self._failed(exc)
        ok = 0
        for ck, arr, f in futs:
            try:
                f.result()
                ok += 1
                self.metrics.add(chunks_written=1, bytes_written=arr.nbytes)
            except (GpufeedError, OSError) as exc:
                self.metrics.add(put_errors=1)
                log.warning("kvcache: put %s failed: %s", ck.key, exc)
        self.metrics.add(put_errors=len(objs) - len(futs))
        return ok

    # --- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Wait for pending puts, stop threads, close the client if the store opened it."""
        try:
            self.flush()
        finally:
            self._writer.shutdown(wait=True)
            if getattr(self, "_readers", None) is not None:
                self._readers.shutdown(wait=True)
            self._session.close()

    def __enter__(self) -> "KVCacheStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Landing:
    """Holds the store's reusable registered buffer; yields a view of ``nbytes`` as ``shape``."""

    def __init__(self, store: KVCacheStore, nbytes: int, shape, dtype) -> None:
        self.store, self.nbytes, self.shape, self.dtype = store, nbytes, shape, dtype

    def __enter__(self) -> torch.Tensor:
        s = self.store
        s._landing_lock.acquire()
        try:
            buf = s._landing_buf
            if buf is None or buf.numel() < self.nbytes:
                buf = s._landing_buf = s._alloc_bytes(self.nbytes)
            return buf[:self.nbytes].view(self.dtype).view(self.shape)
        except BaseException:
            s._landing_lock.release()
            raise

    def __exit__(self, *exc) -> None:
        self.store._landing_lock.release()


