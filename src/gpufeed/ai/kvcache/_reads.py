"""Batched chunk reads of :class:`~gpufeed.ai.kvcache.KVCacheStore` (the
``_ChunkReads`` base it inherits): whole chunk objects (:meth:`get_chunks`),
chunks block by block into the caller's tensor (:meth:`get_into`), and header
probes (:meth:`lookup`), each a few batch reads (``GETV``) in flight at once,
verified as they arrive.

A chunk that is missing, short, or whose header or block checksums do not
match ends the valid prefix (a *miss*, counted and, when corrupt, deleted so
the next writer replaces it); a node failure is reported to the store's
session and is a miss too.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import numpy as np
import torch

from ...client import Client, ReadRequest
from ...errors import GpufeedError, InvalidRange, NotFoundError
from ._format import ChunkFormatError, ChunkHeader, block_checksum
from ._keys import ChunkKey, KVLayout
from ._metrics import KVMetrics

__all__ = ["SHM_BATCH_BYTES", "TCP_BATCH_CHUNKS"]

log = logging.getLogger("gpufeed.kvcache")

#: Default bytes of chunks per batch read on shm (see ``chunks_per_request``).
SHM_BATCH_BYTES = 256 << 20  # 256 MiB
#: Default chunks per batch read on TCP.
TCP_BATCH_CHUNKS = 4


def _u8(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's bytes as a writable numpy uint8 array (no copy)."""
    if not t.is_contiguous():
        raise ValueError("expected a contiguous block")
    return t.reshape(-1).view(torch.uint8).numpy()


class _Miss(Exception):
    """Internal: chunk unusable (missing, corrupt)."""


class _ChunkReads:
    """The read machinery of :class:`~gpufeed.ai.kvcache.KVCacheStore`, which sets
    these attributes and provides the node plumbing (``_node``, ``_failed``)."""

    layout: KVLayout
    torch_dtype: torch.dtype
    bucket: str
    header_len: int
    verify: bool
    chunks_per_request: int | None
    metrics: KVMetrics

    def _node(self) -> Client | None:
        raise NotImplementedError

    def _failed(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _chunk_shape(self, ntok: int) -> tuple[int, ...]:
        lay = self.layout
        return (2, lay.num_layers, ntok, lay.num_kv_heads, lay.head_dim)

    def _object_bytes(self, ntok: int) -> int:
        return self.header_len + ntok * self.layout.token_bytes()

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
                items: list[ReadRequest] = []
                for ck, at in g:
                    n = self._object_bytes(ck.tokens)
                    items.append(ReadRequest(self.bucket, ck.key, raw[at:at + hl], 0, hl))
                    items.append(ReadRequest(self.bucket, ck.key, raw[at + hl:at + n], hl, n - hl,
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

    def _block_bytes(self, ntok: int) -> int:
        """Bytes of one ``[kv][layer]`` block of a chunk of ``ntok`` tokens."""
        lay = self.layout
        return ntok * lay.num_kv_heads * lay.head_dim * lay.itemsize

    def _items(self, ck: ChunkKey, dst: torch.Tensor, hdr: memoryview) -> list[ReadRequest]:
        """Batch-read items of one chunk: its header into ``hdr``, each block into
        ``dst[kv, l]`` (asking for the block's server digest when verifying)."""
        lay = self.layout
        block = self._block_bytes(ck.tokens)
        items = [ReadRequest(self.bucket, ck.key, hdr, 0, self.header_len)]
        for kv in range(2):
            for layer in range(lay.num_layers):
                off = self.header_len + (kv * lay.num_layers + layer) * block
                items.append(ReadRequest(self.bucket, ck.key, _u8(dst[kv, layer]), off, block,
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
                                      self._item_lengths(ck))
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

    def _item_lengths(self, ck: ChunkKey) -> list[int]:
        """The ``length`` of each item of :meth:`_items` (expected byte counts)."""
        block = self._block_bytes(ck.tokens)
        return [self.header_len] + [block] * (2 * self.layout.num_layers)

    def _drop_corrupt(self, client: Client, key: str) -> None:
        try:
            client.delete(self.bucket, key)
        except (GpufeedError, OSError):
            pass

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
