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
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields

import numpy as np
import torch

from ...client import Client
from ...errors import (
    BucketAlreadyOwnedByYou,
    GpufeedError,
    InvalidRange,
    InvalidRequestError,
    NotFoundError,
)
from .._session import NodeSession
from ._format import ChunkFormatError, ChunkHeader, block_checksum, header_len
from ._keys import ChunkKey, KVLayout, chunk_keys
from ._tier import CpuTier

__all__ = ["KVCacheStore", "KVMetrics", "ChunkUnavailable", "LayerStream"]

log = logging.getLogger("gpufeed.kvcache")

#: Default bytes of chunks per batch read on shm (see ``chunks_per_request``).
SHM_BATCH_BYTES = 256 << 20  # 256 MiB
#: Default chunks per batch read on TCP.
TCP_BATCH_CHUNKS = 4


class ChunkUnavailable(LookupError):
    """A chunk became unavailable (evicted, corrupt, node down) during a layer-wise read.

    Attributes:
        tokens: leading tokens whose KV is still valid for every layer.
    """

    def __init__(self, msg: str, tokens: int) -> None:
        super().__init__(msg)
        self.tokens = tokens


class Counters:
    """Base of a ``@dataclass`` of ``int`` counters: thread-safe :meth:`add` and a
    consistent :meth:`snapshot`."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class KVMetrics(Counters):
    """Counters of one store (monotonic; read with :meth:`snapshot`).

    ``node_errors`` is the warning metric: node calls that failed because the
    node was unreachable or broken (serving continued by recompute).
    """

    lookups: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    tier_hits: int = 0
    chunks_read: int = 0
    bytes_read: int = 0
    chunks_written: int = 0
    bytes_written: int = 0
    missing_chunks: int = 0
    corrupt_chunks: int = 0
    node_errors: int = 0
    put_errors: int = 0


def _u8(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's bytes as a writable numpy uint8 array (no copy)."""
    if not t.is_contiguous():
        raise ValueError("expected a contiguous block")
    return t.reshape(-1).view(torch.uint8).numpy()


class _Miss(Exception):
    """Internal: chunk unusable (missing, corrupt)."""


class KVCacheStore:
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
            default: on shm as many as fit in :data:`SHM_BATCH_BYTES` (the node
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

    def _chunk_shape(self, ntok: int) -> tuple[int, ...]:
        lay = self.layout
        return (2, lay.num_layers, ntok, lay.num_kv_heads, lay.head_dim)

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

    def _object_bytes(self, ntok: int) -> int:
        return self.header_len + ntok * self.layout.token_bytes()

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

    def _per_request(self, client: Client, ntok: int) -> int:
        """Chunks of ``ntok`` tokens per batch read on ``client``'s transport."""
        if self.chunks_per_request is not None:
            return self.chunks_per_request
        if client.supports_server_digests:  # nothing to overlap: fewer, larger batches
            return max(1, SHM_BATCH_BYTES // self._object_bytes(ntok))
        return TCP_BATCH_CHUNKS

    def _read_objects(self, client: Client, out: torch.Tensor, jobs: list[tuple[ChunkKey, int]]):
        """Whole-object reads into ``out`` (flat ``uint8``; chunk ``ck`` at byte ``at``
        for each ``(ck, at)`` of ``jobs``), ``chunks_per_request`` per batch, all
        batches in flight; yields ``(ck, payload)`` of the leading valid chunks
        (``payload`` a view of ``out``), verifying each batch while the next ones are
        still arriving. Each chunk is two ranges (header, payload); with ``verify`` the
        payload asks for per-block server digests. A chunk that is gone, short or
        corrupt ends the prefix (the batch still returns the others: no lookup round
        trip is needed first). Waits for every read it started."""
        per = self._per_request(client, self.layout.chunk_tokens)
        groups = [jobs[i:i + per] for i in range(0, len(jobs), per)]
        raw = _u8(out)  # numpy slices are cheaper than torch views, item by item
        hl = self.header_len
        futs = []
        sums_of: list[list] = []
        errs_of: list[list] = []
        try:
            for g in groups:
                items = []
                for ck, at in g:
                    n = self._object_bytes(ck.tokens)
                    items.append((self.bucket, ck.key, raw[at:at + hl], 0, hl))
                    items.append((self.bucket, ck.key, raw[at + hl:at + n], hl, n - hl,
                                  self._block_bytes(ck.tokens) if self.verify else 0))
                sums_of.append([])
                errs_of.append([])
                futs.append(client.submit_get_many_into(items, digests_out=sums_of[-1],
                                                        errors_out=errs_of[-1]))
        except (GpufeedError, OSError) as exc:
            self._failed(exc)
        chunks = nbytes = 0
        try:
            for g, fut, sums, errs in zip(groups, futs, sums_of, errs_of):
                try:
                    ns = fut.result()
                except (GpufeedError, OSError) as exc:
                    self._failed(exc)
                    return
                for j, (ck, at) in enumerate(g):
                    n = self._object_bytes(ck.tokens)
                    if not self._complete(ck, errs[2 * j:2 * j + 2], ns[2 * j:2 * j + 2], [hl, n - hl]):
                        return
                    payload = out[at + hl:at + n].view(self.torch_dtype).view(self._chunk_shape(ck.tokens))
                    try:
                        self._check(ck, payload, raw[at:at + hl].data, sums=sums[2 * j + 1])
                    except _Miss as exc:
                        self._corrupt(ck, exc)
                        return
                    chunks, nbytes = chunks + 1, nbytes + n
                    yield ck, payload
        finally:
            self.metrics.add(chunks_read=chunks, bytes_read=nbytes)
            for f in futs:
                try:
                    f.result()
                except Exception:
                    pass

    def _complete(self, ck: ChunkKey, errs: list, ns: list[int], want: list[int]) -> bool:
        """Whether the items of chunk ``ck`` all arrived whole. Otherwise counts the
        miss: a missing object, a short one (dropped as corrupt, so the next writer
        replaces it), or a node failure."""
        for e in errs:
            if e is None:
                continue
            if isinstance(e, NotFoundError):
                self.metrics.add(missing_chunks=1)
            elif isinstance(e, InvalidRange):
                self._corrupt(ck, f"{ck.key} is shorter than its layout")
            else:
                self._failed(e)
            return False
        if ns != want:
            self._corrupt(ck, f"{ck.key} is {sum(want) - sum(ns)} bytes short")
            return False
        return True

    def _corrupt(self, ck: ChunkKey, why) -> None:
        """Count and log a corrupt chunk (``why``: an exception or a message) and
        delete it, so the next writer replaces it."""
        log.warning("kvcache: %s; treated as a miss", why)
        self.metrics.add(corrupt_chunks=1)
        client = self._node()
        if client is not None:
            self._drop_corrupt(client, ck.key)

    # --- reads ------------------------------------------------------------------------
    def _block_bytes(self, ntok: int) -> int:
        """Bytes of one ``[kv][layer]`` block of a chunk of ``ntok`` tokens."""
        lay = self.layout
        return ntok * lay.num_kv_heads * lay.head_dim * lay.itemsize

    def _items(self, ck: ChunkKey, dst: torch.Tensor, hdr: memoryview) -> list[tuple]:
        """Batch-read items of one chunk: its header into ``hdr``, each block into
        ``dst[kv, l]`` (asking for the block's server digest when verifying)."""
        lay = self.layout
        block = self._block_bytes(ck.tokens)
        items = [(self.bucket, ck.key, hdr, 0, self.header_len)]
        for kv in range(2):
            for layer in range(lay.num_layers):
                off = self.header_len + (kv * lay.num_layers + layer) * block
                items.append((self.bucket, ck.key, _u8(dst[kv, layer]), off, block,
                              block if self.verify else 0))
        return items

    @staticmethod
    def _block_sums(digests: list, at: int, count: int) -> list[int] | None:
        """Server digests of ``count`` one-block items from ``digests[at]`` (one piece
        each), or None if any is missing (the caller then hashes the blocks itself)."""
        out = []
        for d in digests[at:at + count]:
            if not d or len(d) != 1:
                return None
            out.append(d[0])
        return out

    def _check(self, ck: ChunkKey, dst: torch.Tensor, hdr: memoryview, layers=None,
               sums: list[int] | None = None) -> None:
        """Raise _Miss unless ``hdr`` is chunk ``ck``'s header and the blocks match it.

        ``sums``: XXH3-64 of blocks ``[kv][layer]`` (kv-major, all layers) as the
        server computed them when it delivered the bytes; None hashes ``dst`` here."""
        try:
            h = ChunkHeader.unpack(hdr)
            h.check(self.layout, ck.digest, ck.tokens)
        except ChunkFormatError as exc:
            raise _Miss(str(exc)) from exc
        if not self.verify:
            return
        L = self.layout.num_layers
        if sums is not None and len(sums) != 2 * L:
            sums = None
        for kv in range(2):
            for layer in (range(L) if layers is None else layers):
                got = sums[kv * L + layer] if sums is not None else block_checksum(_u8(dst[kv, layer]))
                if got != h.checksums[kv * L + layer]:
                    raise _Miss(f"checksum mismatch in {ck.key} block [{kv}][{layer}]")

    def _read_chunks(self, client: Client, jobs: list[tuple[ChunkKey, torch.Tensor]]) -> int:
        """Read chunks from the node into their destinations, pipelined; returns how many
        leading jobs are valid. Waits for every read it started before returning."""
        if not jobs:
            return 0
        hdrs = memoryview(bytearray(self.header_len * len(jobs)))
        hv = [hdrs[i * self.header_len:(i + 1) * self.header_len] for i in range(len(jobs))]
        per = self._per_request(client, self.layout.chunk_tokens)
        groups = [list(range(i, min(i + per, len(jobs)))) for i in range(0, len(jobs), per)]
        futs: list[Future] = []
        digests: list[list] = []
        errors: list[list] = []
        try:
            for g in groups:
                items = [it for j in g for it in self._items(jobs[j][0], jobs[j][1], hv[j])]
                digests.append([])
                errors.append([])
                futs.append(client.submit_get_many_into(items, digests_out=digests[-1],
                                                        errors_out=errors[-1]))
        except (GpufeedError, OSError) as exc:
            self._failed(exc)
        valid = 0
        stop = False
        per_chunk = 1 + 2 * self.layout.num_layers
        for g, fut, sums, errs in zip(groups, futs, digests, errors):
            try:
                ns = fut.result()
            except (GpufeedError, OSError) as exc:
                if not stop:
                    self._failed(exc)
                stop = True
                continue
            if stop:
                continue
            for pos, j in enumerate(g):
                ck, dst = jobs[j]
                at = pos * per_chunk
                good = self._complete(ck, errs[at:at + per_chunk], ns[at:at + per_chunk],
                                      [it[4] for it in self._items_len(ck)])
                if good:
                    try:
                        self._check(ck, dst, hv[j], sums=self._block_sums(sums, at + 1, per_chunk - 1))
                    except _Miss as exc:
                        self._corrupt(ck, exc)
                        good = False
                if not good:
                    stop = True
                    break
                valid += 1
                self.metrics.add(chunks_read=1, bytes_read=dst.numel() * dst.element_size())
        return valid

    def _items_len(self, ck: ChunkKey) -> list[tuple]:
        """The ``(.., length)`` shape of :meth:`_items` without destinations (expected byte counts)."""
        block = self._block_bytes(ck.tokens)
        return [(None,) * 4 + (self.header_len,)] + [(None,) * 4 + (block,)] * (2 * self.layout.num_layers)

    def _drop_corrupt(self, client: Client, key: str) -> None:
        try:
            client.delete(self.bucket, key)
        except (GpufeedError, OSError):
            pass

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

    def _probe(self, client: Client, cks: list[ChunkKey]) -> int:
        """Leading chunks of ``cks`` present on the node with a matching header."""
        return len(self._probe_headers(client, cks))

    def _probe_headers(self, client: Client, cks: list[ChunkKey]) -> list[ChunkHeader]:
        """Headers of the leading chunks of ``cks`` present on the node with a matching
        header: one batch read of every header (a missing one ends the prefix)."""
        H = self.header_len
        hdrs = memoryview(bytearray(H * len(cks)))
        views = [hdrs[j * H:(j + 1) * H] for j in range(len(cks))]
        errs: list = []
        try:
            ns = client.get_many_into([(self.bucket, ck.key, v, 0, H) for ck, v in zip(cks, views)],
                                      errors_out=errs)
        except (GpufeedError, OSError) as exc:
            self._failed(exc)
            return []
        out: list[ChunkHeader] = []
        for ck, v, n, e in zip(cks, views, ns, errs):
            if not self._complete(ck, [e], [n], [H]):
                break
            try:
                h = ChunkHeader.unpack(v)
                h.check(self.layout, ck.digest, ck.tokens)
            except ChunkFormatError:
                self.metrics.add(corrupt_chunks=1)
                break
            out.append(h)
        return out

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


class LayerStream:
    """Iterator of ``(layer, keys [n, H, D], values [n, H, D])`` from :meth:`KVCacheStore.get_layers`.

    Attributes:
        tokens: ``n``, the leading tokens found (chunk headers present and matching).
    """

    def __init__(self, store: KVCacheStore, tokens, depth: int) -> None:
        self._s = store
        self._depth = max(1, depth)
        cks = store.keys(tokens)
        i = 0
        while i < len(cks) and cks[i].key in store.tier:
            i += 1
        self._tier_cks = cks[:i]
        self._client = store._node() if i < len(cks) else None
        self._node_cks: list[ChunkKey] = []
        self._hdrs: list[ChunkHeader] = []
        if self._client is not None:
            self._node_cks, self._hdrs = self._headers(cks[i:])
        found = self._tier_cks + self._node_cks
        self.tokens = found[-1].end if found else 0

    def _headers(self, cks):
        hdrs = self._s._probe_headers(self._client, cks)
        return cks[:len(hdrs)], hdrs

    def _submit(self, layer: int):
        s, lay = self._s, self._s.layout
        out = torch.empty((2, self.tokens, lay.num_kv_heads, lay.head_dim), dtype=s.torch_dtype)
        for ck in self._tier_cks:
            out[:, ck.start:ck.end].copy_(s.tier.get(ck.key)[:, layer])
        items = []
        for ck in self._node_cks:
            block = s._block_bytes(ck.tokens)
            for kv in range(2):
                off = s.header_len + (kv * lay.num_layers + layer) * block
                items.append((s.bucket, ck.key, _u8(out[kv, ck.start:ck.end]), off, block,
                              block if s.verify else 0))
        sums: list = []
        errs: list = []
        fut = self._client.submit_get_many_into(items, digests_out=sums, errors_out=errs) if items else None
        return out, (fut, sums, errs)

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        s, L = self._s, self._s.layout.num_layers
        if self.tokens == 0:
            return
        inflight = []
        nxt = 0
        try:
            while nxt < L or inflight:
                while nxt < L and len(inflight) < self._depth:
                    inflight.append((nxt, *self._submit(nxt)))
                    nxt += 1
                layer, out, (fut, sums, errs) = inflight.pop(0)
                if fut is not None:
                    try:
                        ns = fut.result()
                    except (GpufeedError, OSError) as exc:
                        s._failed(exc)
                        raise ChunkUnavailable(f"layer {layer}: {exc}", self._valid(layer, out)) from exc
                    for j, (ck, h) in enumerate(zip(self._node_cks, self._hdrs)):
                        # chunks before this one are whole in every layer read so far
                        block = s._block_bytes(ck.tokens)
                        if not s._complete(ck, errs[2 * j:2 * j + 2], ns[2 * j:2 * j + 2], [block, block]):
                            raise ChunkUnavailable(f"{ck.key} is gone or short at layer {layer}", ck.start)
                        if not s.verify:
                            continue
                        for kv in range(2):
                            d = s._block_sums(sums, 2 * j + kv, 1)
                            got = d[0] if d else block_checksum(_u8(out[kv, ck.start:ck.end]))
                            if got != h.checksums[kv * L + layer]:
                                s._corrupt(ck, f"checksum mismatch in {ck.key} layer {layer}")
                                raise ChunkUnavailable(
                                    f"checksum mismatch in {ck.key} layer {layer}", ck.start)
                s.metrics.add(bytes_read=out.numel() * out.element_size())
                yield layer, out[0], out[1]
        finally:
            for _l, _o, (f, _s, _e) in inflight:
                if f is not None:
                    try:
                        f.result()
                    except Exception:
                        pass

    def _valid(self, layer: int, out) -> int:
        return self._tier_cks[-1].end if self._tier_cks else 0
