"""Chunk I/O: hash tensors' bytes into content-addressed chunks and put the ones
the node lacks; read chunks straight into destination memory and check them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ...client import Client, ReadRequest
from ...errors import (
    ConflictError,
    GpufeedError,
    InvalidArgument,
    NoSuchBucket,
    NoSuchKey,
)
from ._format import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_WORKERS,
    CheckpointError,
    Chunk,
    CorruptCheckpoint,
    Location,
    MissingChunk,
    chunk_hash,
)

__all__ = ["UploadStats", "ChunkUploader", "ChunkRead", "read_chunks"]

#: A GETV batch carries at most this many chunks / bytes.
_BATCH_ITEMS = 64
_BATCH_BYTES = 256 << 20  # 256 MiB


# --- writing chunks ----------------------------------------------------------------------
@dataclass
class UploadStats:
    """Bytes and chunks of one save: all of them, and those actually written."""

    chunks_total: int = 0
    chunks_written: int = 0
    bytes_total: int = 0
    bytes_written: int = 0


class ChunkUploader:
    """Hashes buffers chunk by chunk and puts the chunks the node lacks.

    Existing chunks are learned from one listing of ``chunks/`` at the start;
    hashing runs in ``workers`` threads (BLAKE3 releases the GIL) and every put
    goes out at once as a ``submit_put`` future, so many are in flight.

    Args:
        client: the node.
        loc: the checkpoint prefix.
        chunk_bytes: chunk size in bytes.
        workers: hashing/sending threads.
    """

    def __init__(self, client: Client, loc: Location, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 workers: int = DEFAULT_WORKERS) -> None:
        if chunk_bytes <= 0:
            raise InvalidArgument("chunk_bytes must be > 0")
        self.client, self.loc, self.chunk_bytes = client, loc, chunk_bytes
        self._known: dict[str, int] = {}
        try:
            for e in client.list(loc.bucket, prefix=loc.key("chunks/")):
                self._known[e.key.rsplit("/", 1)[-1]] = e.size
        except NoSuchBucket:
            try:
                client.create_bucket(loc.bucket)
            except ConflictError:
                pass  # another rank created it first
        self._sent: set[str] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gpufeed-ckpt")
        self.stats = UploadStats()

    def _one(self, mv: memoryview) -> tuple[Chunk, Future | None]:
        digest = chunk_hash(mv)
        n = len(mv)
        with self._lock:
            if self._known.get(digest) == n or digest in self._sent:
                return Chunk(digest, n), None
            self._sent.add(digest)
        return Chunk(digest, n), self.client.submit_put(self.loc.bucket, self.loc.chunk_key(digest), mv)

    def submit(self, mv: memoryview) -> list[Future]:
        """Start storing ``mv``; one Future per chunk resolving to ``(Chunk, put Future|None)``."""
        step = self.chunk_bytes
        return [self._pool.submit(self._one, mv[o:o + step]) for o in range(0, len(mv), step)]

    def collect(self, futs: list[Future]) -> tuple[list[Chunk], int]:
        """Wait for :meth:`submit`'s futures; returns the chunks and the bytes written."""
        chunks, written = [], 0
        for f in futs:
            chunk, put = f.result()
            if put is not None:
                put.result()
                written += chunk.size
                with self._lock:
                    self._known[chunk.hash] = chunk.size
                self.stats.chunks_written += 1
                self.stats.bytes_written += chunk.size
            self.stats.chunks_total += 1
            self.stats.bytes_total += chunk.size
            chunks.append(chunk)
        return chunks, written

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# --- reading chunks ----------------------------------------------------------------------
@dataclass
class ChunkRead:
    chunk: Chunk
    dest: memoryview
    fqn: str


def read_chunks(client: Client, loc: Location, reads: Sequence[ChunkRead], *,
                verify: bool = True, workers: int = DEFAULT_WORKERS) -> None:
    """Read chunks straight into their destinations, batched into GETV requests
    that are all in flight at once, then check each chunk's size and hash.

    Raises:
        MissingChunk: a chunk object does not exist (names the key and tensor).
        CorruptCheckpoint: a chunk is shorter or its BLAKE3 differs.
    """
    batches: list[list[ChunkRead]] = []
    cur: list[ChunkRead] = []
    cur_bytes = 0
    for r in reads:
        if cur and (len(cur) >= _BATCH_ITEMS or cur_bytes + r.chunk.size > _BATCH_BYTES):
            batches.append(cur)
            cur, cur_bytes = [], 0
        cur.append(r)
        cur_bytes += r.chunk.size
    if cur:
        batches.append(cur)
    futs = [client.submit_get_many_into([ReadRequest(loc.bucket, loc.chunk_key(r.chunk.hash), r.dest)
                                         for r in b]) for b in batches]
    errors: list[BaseException] = []
    done: list[tuple[list[ChunkRead], list[int]]] = []
    for b, f in zip(batches, futs):
        try:
            done.append((b, f.result()))
        except NoSuchKey as exc:
            errors.append(_missing(client, loc, b, exc))
        except GpufeedError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]

    def check(r: ChunkRead, n: int) -> None:
        key = loc.chunk_key(r.chunk.hash)
        if n != r.chunk.size:
            raise CorruptCheckpoint(f"{loc.bucket}/{key} (tensor {r.fqn!r}): {n} bytes, the manifest "
                                    f"says {r.chunk.size}", key=key, fqn=r.fqn)
        if verify and chunk_hash(r.dest) != r.chunk.hash:
            raise CorruptCheckpoint(f"{loc.bucket}/{key} (tensor {r.fqn!r}): BLAKE3 of the bytes read "
                                    f"differs from the chunk's name", key=key, fqn=r.fqn)

    with ThreadPoolExecutor(workers) as pool:
        for fut in [pool.submit(check, r, n) for b, ns in done for r, n in zip(b, ns)]:
            fut.result()


def _missing(client: Client, loc: Location, batch: list[ChunkRead], exc: NoSuchKey) -> CheckpointError:
    for r in batch:
        key = loc.chunk_key(r.chunk.hash)
        try:
            client.head(loc.bucket, key)
        except NoSuchKey:
            return MissingChunk(f"{loc.bucket}/{key} (tensor {r.fqn!r}) is missing", key=key, fqn=r.fqn)
    return MissingChunk(f"a chunk of the batch is missing: {exc}")
