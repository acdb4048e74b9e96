"""The chunk store: an object version's data as chunks in data files.

Layers: an object version row names a *blob id*; the blob id names a manifest
(its chunks, in order); a chunk is a run of the data, stored raw or compressed
at an offset of a data file (``blobs/ab/cd/<file>``), with the running CRC32C
at the end of each 4 KiB block of what is stored (checked on every read, see
:mod:`._blocksums` and :mod:`._chunkreads`) and a digest of its data (BLAKE3 or
xxh3-128).

How a version is cut into chunks depends on its bucket's
:class:`~gpufeed.engine.DataPolicy`:

- raw, no dedup (the default): one chunk, the whole object, in one data file
  named after the blob id: the file is the object, byte for byte, so reads
  are one ``preadv`` and the zero-copy map is one mapping;
- compressed, no dedup: fixed-size chunks, each compressed (or kept raw when
  it does not shrink), back to back in one data file per version; when a
  probe of every chunk says none would shrink, the version is stored raw;
- dedup: fixed-size or content-defined (FastCDC) chunks, each found by
  ``(domain, digest)`` (the domain is the bucket's tenant, so no tenant learns
  another's content) and stored once, one data file per chunk.

Crash safety: data files are written and fsynced before the catalog
transaction that makes them part of a manifest; a version's data is released
in a transaction of its own after the version row is gone (its files unlinked
after that commit). A crash between any two steps leaves either files no
chunk names or manifests no version names; :meth:`ChunkStore.recover` frees
both on start, so bytes on disk end equal to the bytes referenced.

A chunk shared by dedup is never freed under a writer that found it: a write
looks up shared chunks before its transaction and takes its references
inside it; a chunk that was freed in between is written again from the
writer's own copy of the data (its temp file is kept until the commit).

This is the engine's own code (the product's storage core); hashing and
compression are native (xxhash, blake3, lz4, zstandard through :mod:`._codecs`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import xxhash

from ..errors import InternalError, InvalidArgument, StorageFull
from ._blobs import BlobFiles, new_id, pread_full, remove_quietly, write_all
from ._blocksums import SUM_BLOCK, BlockSummer, block_sums
from ._chunkreads import STEP_ALIGN, Manifest, ManifestCache
from ._codecs import PROBE_BYTES, cdc_cuts, chunk_digest, compress_chunk, probe_pays
from ._fetched import FetchedChunks
from .catalog import Catalog, CatalogWriter
from .types import ChunkRecord, DataPolicy, FetchChunk

__all__ = ["ChunkStore", "Staged", "parse_policy", "policy_json", "CDC_DEFAULT_BYTES", "POLICY_CONFIG"]

log = logging.getLogger("gpufeed.engine")

_READ_BYTES = 8 << 20  # read size when summing or cutting a temp file
#: Most chunk ids remembered as checked for maps.
_MAPPED_OK_MAX = 1 << 20
#: Chunks compressed at once when a version is packed (on as many threads).
_PACK_THREADS = max(2, min(4, os.cpu_count() or 2))
_MIN_CHUNK, _MAX_CHUNK = 64 << 10, 64 << 20
_MAX_CDC_AVG = 1 << 20
#: Average chunk size of content-defined chunking when none is given, bytes.
CDC_DEFAULT_BYTES = 256 << 10
#: Name of the bucket configuration that holds a bucket's DataPolicy (JSON).
POLICY_CONFIG = "data"


def parse_policy(doc: dict) -> DataPolicy:
    """A :class:`DataPolicy` from its JSON form (unknown or bad fields refused).

    Raises:
        InvalidArgument: a field is unknown or out of range.
    """
    known = set(DataPolicy.__dataclass_fields__)
    extra = set(doc) - known
    if extra:
        raise InvalidArgument(f"unknown data settings: {', '.join(sorted(extra))}")
    p = DataPolicy(**doc)
    if p.compression not in ("off", "lz4", "zstd"):
        raise InvalidArgument(f"compression must be off, lz4 or zstd, not {p.compression!r}")
    if not isinstance(p.level, int) or not 1 <= p.level <= 19:
        raise InvalidArgument("zstd level must be 1-19")
    if p.chunking not in ("fixed", "cdc"):
        raise InvalidArgument(f"chunking must be fixed or cdc, not {p.chunking!r}")
    if p.chunking == "cdc" and not p.dedup:
        raise InvalidArgument("content-defined chunking only applies to a bucket that deduplicates "
                              "(set dedup too)")
    hi = _MAX_CDC_AVG if p.chunking == "cdc" else _MAX_CHUNK
    if not isinstance(p.chunk_bytes, int) or not _MIN_CHUNK <= p.chunk_bytes <= hi:
        raise InvalidArgument(f"chunk size must be {_MIN_CHUNK} to {hi} bytes for {p.chunking} chunking")
    if p.chunk_bytes % STEP_ALIGN and p.chunking == "fixed":
        raise InvalidArgument(f"a fixed chunk size must be a multiple of {STEP_ALIGN} bytes")
    if p.digest not in ("blake3", "xxh3"):
        raise InvalidArgument(f"digest must be blake3 or xxh3, not {p.digest!r}")
    if not isinstance(p.dedup, bool) or not isinstance(p.verify, bool):
        raise InvalidArgument("dedup and verify are true or false")
    return p


def policy_json(p: DataPolicy) -> str:
    """The JSON form of a :class:`DataPolicy` (what the catalog stores)."""
    return json.dumps(asdict(p), sort_keys=True)


def _sums_digest(sums: bytes) -> bytes:
    """Digest of a chunk that belongs to one manifest: xxh3-128 of its block sums."""
    return xxhash.xxh3_128_digest(sums)


@dataclass
class Staged:
    """The data of one new version, in data files, not yet in the catalog.

    Attributes:
        blob_id: the version's blob (manifest) id.
        size: data bytes.
        chunk_ids: the manifest, in order.
        new: chunks to add: ``chunk_id -> (record, references)``.
        reused: shared chunks found before the commit: ``chunk_id -> references``.
        spans: where each reused chunk's bytes are in ``tmp`` (to write it again
            if it was freed before the commit): ``chunk_id -> (offset, length)``.
        repairs: reused chunks found damaged or missing, and the good copy this
            write stored for each (the chunk is pointed at it in the commit).
        paths: data files written (removed if the write is abandoned).
        tmp: the temp file still kept (dedup), removed after the commit.
        domain: dedup domain.
        policy: the bucket's data policy.
        bucket: the bucket written to (new chunks' stored bytes count there).
    """

    blob_id: str
    size: int
    chunk_ids: list[str] = field(default_factory=list)
    new: dict[str, tuple[ChunkRecord, int]] = field(default_factory=dict)
    reused: Counter = field(default_factory=Counter)
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    repairs: dict[str, ChunkRecord] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    tmp: str | None = None
    domain: str | None = None
    policy: DataPolicy = field(default_factory=DataPolicy)
    bucket: str = ""


class ChunkStore:
    """Chunks, manifests and data files of one engine.

    Args:
        files: the data folder.
        catalog: the catalog.
        capacity_bytes: most bytes of data files the folder may hold (0: no
            limit but the disk's); writes past it raise StorageFull.
    """

    def __init__(self, files: BlobFiles, catalog: Catalog, capacity_bytes: int = 0) -> None:
        self.files = files
        self._cat = catalog
        self.capacity_bytes = capacity_bytes
        self.manifests = ManifestCache()
        self._policies: dict[str, DataPolicy] = {}
        self._lock = threading.Lock()
        _, stored, _ = catalog.chunk_totals()
        #: Bytes of data files the catalog's chunks occupy (kept current by writes and frees).
        self.stored_bytes = stored
        self._compress_pool: ThreadPoolExecutor | None = None
        self.damaged_reads = 0  # reads that failed their check since start (a metric)
        #: Ids of chunks marked damaged (reads of them fail without reading).
        self.damaged: set[str] = set(catalog.damaged_chunks())
        #: Ids of chunks checked whole for a zero-copy map since start (later maps
        #: trust that check; a chunk found damaged leaves it). Bounded.
        self.mapped_ok = _BoundedSet(_MAPPED_OK_MAX)
        #: How chunks held by other cluster nodes are fetched (:mod:`._remote`); ``None``: they are not.
        self.remote: FetchChunk | None = None
        self.fetched: FetchedChunks | None = None  # fetched chunks kept for later reads (:mod:`._remote`)
        #: How new data files are copied to other cluster nodes (:mod:`._replicas`); ``None``: they are not.
        self.push: Callable[[list[tuple[str, list[ChunkRecord]]]], dict[str, list[str]]] | None = None
        #: Asks for a repair of a data file here that a read found damaged (:mod:`._repair`); ``None``: none.
        self.repair: Callable[[str], bool] | None = None
        self.room: Callable[[int], None] | None = None  # a cluster node's own room check (._room), not the capacity

    def _pool(self) -> ThreadPoolExecutor:
        """Threads that compress chunks (made on first use)."""
        with self._lock:
            if self._compress_pool is None:
                self._compress_pool = ThreadPoolExecutor(_PACK_THREADS, thread_name_prefix="gpufeed-compress")
            return self._compress_pool

    def close(self) -> None:
        """Stop the compression threads."""
        if self._compress_pool is not None:
            self._compress_pool.shutdown(wait=True)

    # policies -------------------------------------------------------------------
    def policy(self, bucket: str) -> DataPolicy:
        """The data policy of ``bucket`` (default when it has none)."""
        p = self._policies.get(bucket)
        if p is None:
            doc = self._cat.bucket_config(bucket, POLICY_CONFIG)
            p = parse_policy(json.loads(doc)) if doc else DataPolicy()
            self._policies[bucket] = p
        return p

    def forget_policy(self, bucket: str) -> None:
        """Drop the cached policy of ``bucket`` (it changed, or the bucket went)."""
        self._policies.pop(bucket, None)

    # names ----------------------------------------------------------------------
    @property
    def holder(self) -> str:
        """This node's id as the catalog records chunk holders (``""``: one node holds all)."""
        return self._cat.holder

    def held_elsewhere(self, c: ChunkRecord) -> bool:
        """Whether another cluster node's data folder holds chunk ``c``'s data file
        (it is then never looked for, nor marked missing or damaged, here)."""
        return bool(c.holder) and c.holder != self._cat.holder

    def holders(self, c: ChunkRecord) -> list[str]:
        """Nodes holding chunk ``c``'s data file: its holder, then the copies the catalog records."""
        return [c.holder] + [n for n in self._cat.file_copies(c.file) if n != c.holder]

    def file_path(self, file_id: str) -> str:
        """Absolute path of data file ``file_id``."""
        return self.files.blob_path(file_id)

    def manifest(self, blob_id: str) -> Manifest | None:
        """The manifest of ``blob_id`` (cached), or ``None`` when it has none."""
        m = self.manifests.get(blob_id)
        if m is None:
            got = self._cat.manifest(blob_id)
            if got is None:
                return None
            m = Manifest.of(blob_id, got[0], got[1])
            self.manifests.put(m)
        return m

    def manifest_alive(self, blob_id: str) -> bool:
        """Whether the catalog still has the manifest ``blob_id``."""
        return self._cat.manifest(blob_id) is not None

    # writing --------------------------------------------------------------------
    def check_room(self, nbytes: int) -> None:
        """Refuse a write of ``nbytes`` more bytes when it would pass the capacity
        (chunks stored plus the parts of multipart uploads in progress; :attr:`room` when set).

        Raises:
            StorageFull: it would.
        """
        if self.room is not None or not self.capacity_bytes:
            return self.room(nbytes) if self.room is not None else None
        used = self.stored_bytes + self._cat.parts_total()
        if used + nbytes > self.capacity_bytes:
            raise StorageFull(f"the data folder is full: {used} of {self.capacity_bytes} bytes used "
                              f"(multipart parts included), {nbytes} more needed")

    def stage(self, tmp: str, size: int, policy: DataPolicy, domain: str, *, sums: bytes | None = None,
              bucket: str = "") -> Staged:
        """Turn a finished (fsynced) temp file of ``size`` bytes into data files.

        ``sums``: the file's block sums when the writer computed them as the
        data passed (a raw object then needs no second pass over its file).

        The temp file is consumed: renamed into place (raw), or removed (or kept
        in :attr:`Staged.tmp` until the commit, for dedup).

        Raises:
            StorageFull: the data would pass the capacity (or the disk is full).
            InternalError: the file system failed.
        """
        st = Staged(new_id(), size, policy=policy, domain=domain if policy.dedup else None, bucket=bucket)
        try:
            if size == 0:
                remove_quietly(tmp)
            elif policy.dedup:
                self._stage_dedup(st, tmp)
            elif policy.compression != "off" and self._any_chunk_pays(tmp, size, policy):
                self._stage_packed(st, tmp)
            else:
                self._stage_raw(st, tmp, sums)
        except OSError as exc:
            self.discard(st)
            remove_quietly(tmp)
            if exc.errno == 28:  # ENOSPC
                raise StorageFull(f"the disk of the data folder is full: {exc}") from exc
            raise InternalError(f"storing the data failed: {exc}") from exc
        except BaseException:
            self.discard(st)
            remove_quietly(tmp)
            raise
        return st

    def _stage_raw(self, st: Staged, tmp: str, sums: bytes | None) -> None:
        self.check_room(st.size)
        if sums is None or len(sums) != 4 * -(-st.size // SUM_BLOCK):
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                sums = _file_sums(fd, 0, st.size)
            finally:
                os.close(fd)
        st.paths.append(self.files.publish_blob(tmp, st.blob_id))
        rec = ChunkRecord(st.blob_id, st.blob_id, 0, st.size, st.size, "", _sums_digest(sums), sums)
        st.new[rec.chunk_id] = (rec, 1)
        st.chunk_ids.append(rec.chunk_id)

    @staticmethod
    def _any_chunk_pays(tmp: str, size: int, p: DataPolicy) -> bool:
        """Whether compressing any chunk of the file pays, by the codec's probe of
        a sample from each chunk's middle. When none does (random bf16 weights,
        JPEGs) the object is stored raw, as one file, without a second write."""
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            buf = memoryview(bytearray(PROBE_BYTES))
            for pos in range(0, size, p.chunk_bytes):
                n = min(p.chunk_bytes, size - pos)
                k = min(n, PROBE_BYTES)
                got = pread_full(fd, buf[:k], pos + (n - k) // 2)
                if probe_pays(buf[:got], p.compression, p.level):
                    return True
            return False
        finally:
            os.close(fd)

    def _stage_packed(self, st: Staged, tmp: str) -> None:
        """Compressed chunks back to back in one data file named after the blob id."""
        p = st.policy
        src = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        out_fd, out_tmp = self.files.new_temp()
        st.paths.append(out_tmp)
        try:
            # a few chunks at a time, compressed on the pool (the codecs release the GIL)
            bufs = [memoryview(bytearray(p.chunk_bytes)) for _ in range(min(_PACK_THREADS, -(-st.size //
                                                                                             p.chunk_bytes)))]
            pos = written = 0
            while pos < st.size:
                views = []
                for buf in bufs:
                    n = min(p.chunk_bytes, st.size - pos)
                    if n <= 0:
                        break
                    if pread_full(src, buf[:n], pos) < n:
                        raise InternalError("temp file is shorter than the bytes written")
                    views.append(buf[:n])
                    pos += n
                packed_all = self._pool().map(lambda v: compress_chunk(v, p.compression, p.level), views)
                for view, packed in zip(views, packed_all):
                    stored = memoryview(packed) if packed is not None else view
                    self.check_room(written + len(stored))
                    write_all(out_fd, stored, written)
                    sums = block_sums(stored)
                    cid = f"{st.blob_id}.{len(st.chunk_ids)}"
                    rec = ChunkRecord(cid, st.blob_id, written, len(stored), len(view),
                                      p.compression if packed else "", _sums_digest(sums), sums)
                    st.new[cid] = (rec, 1)
                    st.chunk_ids.append(cid)
                    written += len(stored)
            if self.files.fsync:
                os.fsync(out_fd)
        finally:
            os.close(src)
            os.close(out_fd)
        st.paths[-1] = self.files.publish_blob(out_tmp, st.blob_id)
        remove_quietly(tmp)

    def _stage_dedup(self, st: Staged, tmp: str) -> None:
        """Shared chunks: each found by digest, or written to a data file of its own.
        Cuts are found over a mapping of the temp file (closed before any chunk
        is stored); each chunk is then read into one reused buffer."""
        p = st.policy
        st.tmp = tmp
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if p.chunking == "cdc":
                cuts = _cdc_cuts_of_file(fd, st.size, p.chunk_bytes)
            else:
                cuts = list(range(p.chunk_bytes, st.size, p.chunk_bytes)) + [st.size]
            buf = memoryview(bytearray(max(b - a for a, b in zip([0, *cuts], cuts))))
            pos = 0
            local: dict[bytes, str] = {}
            for cut in cuts:
                view = buf[:cut - pos]
                if pread_full(fd, view, pos) < len(view):
                    raise InternalError("temp file is shorter than the bytes written")
                self._stage_shared(st, view, pos, local)
                pos = cut
        finally:
            os.close(fd)

    def _stage_shared(self, st: Staged, view: memoryview, pos: int, local: dict[bytes, str]) -> None:
        p = st.policy
        assert st.domain is not None
        digest = chunk_digest(view, p.digest)
        cid = local.get(digest)
        if cid is None:
            found = self._cat.find_chunk(st.domain, digest)
            if found is not None:
                cid = found.chunk_id
                st.spans[cid] = (pos, len(view))
                if not self._sound(found):  # never link to data known bad: store a good copy for it
                    st.repairs[cid] = self._write_chunk(st, view, digest)
            else:
                rec = self._write_chunk(st, view, digest)
                cid = rec.chunk_id
                st.new[cid] = (rec, 0)
            local[digest] = cid
        if cid in st.new:
            rec, refs = st.new[cid]
            st.new[cid] = (rec, refs + 1)
        else:
            st.reused[cid] += 1
        st.chunk_ids.append(cid)

    def _sound(self, c: ChunkRecord) -> bool:
        """A shared chunk a new write may link to: not marked damaged, and its
        data file is there and long enough (a stat, not a read)."""
        if c.chunk_id in self.damaged:
            return False
        if self.held_elsewhere(c):
            return True  # its holder checks it (start-up, scrub, reads)
        try:
            return os.stat(self.file_path(c.file)).st_size >= c.file_offset + c.stored
        except OSError:
            return False

    def _write_chunk(self, st: Staged, view: memoryview, digest: bytes) -> ChunkRecord:
        """Write one shared chunk to a new data file of its own."""
        p = st.policy
        packed = compress_chunk(view, p.compression, p.level) if p.compression != "off" else None
        stored = memoryview(packed) if packed is not None else view
        self.check_room(sum(r.stored for r, _ in st.new.values()) + len(stored))
        fd, tmp = self.files.new_temp()
        try:
            write_all(fd, stored, 0)
            if self.files.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        file_id = new_id()
        st.paths.append(tmp)
        st.paths[-1] = self.files.publish_blob(tmp, file_id)
        return ChunkRecord(file_id, file_id, 0, len(stored), len(view), p.compression if packed else "",
                           digest, block_sums(stored), st.domain)

    def commit(self, w: CatalogWriter, st: Staged) -> None:
        """Record a staged version's chunks and manifest inside the write
        transaction ``w`` (call :meth:`finish` after it commits).

        Raises:
            StorageFull: the data would pass the capacity.
        """
        added = 0
        for cid, (rec, refs) in list(st.new.items()):
            if rec.domain is not None:
                other = w.find_chunk(rec.domain, rec.digest)
                if other is not None:  # a concurrent write stored the same chunk first
                    w.add_chunk_refs(other.chunk_id, refs)
                    st.chunk_ids = [other.chunk_id if c == cid else c for c in st.chunk_ids]
                    w.on_commit(functools.partial(remove_quietly, self.file_path(rec.file)))
                    continue
            w.insert_chunk(rec, refs, st.bucket)
            added += rec.stored
        for cid, n in st.reused.items():
            fresh = st.repairs.get(cid)
            if not w.add_chunk_refs(cid, n):  # freed since it was found: store it again
                rec = fresh if fresh is not None else self._rewrite(st, cid)
                w.insert_chunk(rec, n, st.bucket)
                added += rec.stored
                st.chunk_ids = [rec.chunk_id if c == cid else c for c in st.chunk_ids]
            elif fresh is not None:
                added += self._repair(w, cid, fresh)
        self.check_room(added)
        w.insert_manifest(st.blob_id, st.size, st.chunk_ids)

        def done() -> None:
            with self._lock:
                self.stored_bytes += added
        w.on_commit(done)

    def _repair(self, w: CatalogWriter, cid: str, fresh: ChunkRecord) -> int:
        """Point damaged shared chunk ``cid`` at the good copy a write just stored;
        returns the stored bytes added."""
        before = w.chunk(cid)
        old_file = w.repair_chunk(cid, fresh)

        def done() -> None:
            with self._lock:
                self.damaged.discard(cid)
            self.manifests.clear()  # cached manifests hold the old record
            if old_file is not None and old_file != fresh.file:
                self._unlink([old_file])
            log.warning("chunk %s repaired from a write of the same data", cid)
        w.on_commit(done)
        return fresh.stored - (before.stored if before is not None else 0)

    def _rewrite(self, st: Staged, cid: str) -> ChunkRecord:
        off, n = st.spans[cid]
        assert st.tmp is not None
        fd = os.open(st.tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            view = memoryview(bytearray(n))
            pread_full(fd, view, off)
        finally:
            os.close(fd)
        return self._write_chunk(st, view, chunk_digest(view, st.policy.digest))

    def finish(self, st: Staged) -> None:
        """After the commit: drop the temp file a dedup write kept."""
        if st.tmp is not None:
            remove_quietly(st.tmp)
            st.tmp = None

    def discard(self, st: Staged) -> None:
        """Remove the data files of a write that was not committed."""
        for path in st.paths:
            remove_quietly(path)
        st.paths = []
        self.finish(st)

    # freeing --------------------------------------------------------------------
    def release(self, blob_ids: list[str]) -> None:
        """Free the data of versions whose rows are gone: each manifest no row
        names any more is dropped with its references; chunks left without
        references are deleted and their data files unlinked after the commit
        (open descriptors keep them readable to readers that hold them)."""
        if not blob_ids:
            return
        with self._cat.write() as w:
            files: list[str] = []
            gone: list[str] = []
            freed = 0
            for b in blob_ids:
                if b and not w.blob_referenced(b):
                    f, n = w.release_manifest(b)
                    files += f
                    freed += n
                    gone.append(b)

            def done() -> None:
                self.manifests.forget(gone)
                self._unlink(files)
                with self._lock:
                    self.stored_bytes = max(0, self.stored_bytes - freed)
            w.on_commit(done)

    def _unlink(self, files: list[str]) -> None:
        for f in files:
            remove_quietly(self.file_path(f))
        self.files.open_files.forget(files)

    def report_damage(self, chunk_id: str, reason: str, *, counted: bool = True) -> None:
        """Mark a chunk damaged in the catalog, count the failed read
        (``counted``; scrub's findings are not reads) and log it (once per chunk)."""
        with self._lock:
            if counted:
                self.damaged_reads += 1
            first = chunk_id not in self.damaged
            self.damaged.add(chunk_id)
            self.mapped_ok.discard(chunk_id)
        if first:
            if counted:  # scrub logs one summary of what it found
                log.error("chunk %s is damaged: %s", chunk_id, reason)
            try:
                with self._cat.write() as w:
                    w.mark_damaged(chunk_id, reason, time.time())
            except InternalError as exc:
                log.error("could not record damaged chunk %s: %s", chunk_id, exc.message)

    def clear_damage(self, chunk_id: str) -> None:
        """A chunk marked damaged checks out again (or was repaired): clear the mark."""
        with self._cat.write() as w:
            w.clear_damaged(chunk_id)
        with self._lock:
            self.damaged.discard(chunk_id)

    # recovery -------------------------------------------------------------------
    def mark_missing(self, files: set[str]) -> int:
        """Mark the chunks of data files that are not on disk damaged (start-up
        finds them) and log them. Returns how many files were missing."""
        if not files:
            return 0
        when = time.time()
        with self._cat.write() as w:
            for f in sorted(files):
                for cid in w.file_chunks(f):
                    w.mark_damaged(cid, "data file is missing", when)
                    self.damaged.add(cid)
        log.error("%d data files named by the catalog are missing (%s); their chunks are marked damaged, "
                  "see gpufeed admin damaged", len(files), ", ".join(sorted(files)[:5]))
        return len(files)

    def recover(self) -> dict[str, int]:
        """On start: give data written one file per version a manifest (summing
        its file), free manifests no version names, then delete data files no
        chunk names.

        Returns:
            Counts: ``{"adopted": n, "missing": n, "orphan_manifests": n}``.
        """
        counts = {"adopted": 0, "missing": 0, "orphan_manifests": 0}
        legacy = self._cat.unmanifested_blobs()
        if legacy:
            counts.update(self._adopt(legacy))
        orphans = self._cat.orphan_manifests()
        if orphans:
            counts["orphan_manifests"] = len(orphans)
            self.release(orphans)
        return counts

    def _adopt(self, blobs: list[tuple[str, int, str]]) -> dict[str, int]:
        """Manifests for versions stored one plain file each: one raw chunk of the
        catalog's size over the file (a missing or short file then reads as damaged)."""
        adopted = missing = 0
        with self._cat.write() as w:
            for b, want, bucket in blobs:
                path = self.file_path(b)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    fd = -1
                if fd < 0:
                    missing += 1
                    rec = ChunkRecord(b, b, 0, want, want, "", b"", b"")
                    w.insert_chunk(rec, 1, bucket)
                    w.insert_manifest(b, want, [b] if want else [])
                    w.mark_damaged(b, "data file is missing", time.time())
                    continue
                try:
                    size = os.fstat(fd).st_size
                    sums = _file_sums(fd, 0, size)
                finally:
                    os.close(fd)
                rec = ChunkRecord(b, b, 0, want, want, "", _sums_digest(sums), sums)
                w.insert_chunk(rec, 1, bucket)
                w.insert_manifest(b, want, [b] if want else [])
                adopted += 1
        if missing:
            log.error("%d object versions have no data file (marked damaged; see gpufeed scrub)", missing)
        return {"adopted": adopted, "missing": missing}


def _file_sums(fd: int, offset: int, size: int) -> bytes:
    """Block sums of ``size`` bytes of ``fd`` from ``offset`` (read in 8 MiB steps;
    a file that ends early gives the sums of the bytes it has)."""
    buf = memoryview(bytearray(min(size, _READ_BYTES) or 1))
    summer = BlockSummer()
    pos = 0
    while pos < size:
        n = min(len(buf), size - pos)
        got = pread_full(fd, buf[:n], offset + pos)
        summer.feed(buf[:got])
        if got < n:
            break
        pos += n
    return summer.finish()


def _cdc_cuts_of_file(fd: int, size: int, avg: int) -> list[int]:
    """Content-defined cut points (end offsets) of a file, over a read-only
    mapping closed before returning."""
    import mmap

    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mm:
        whole = memoryview(mm)
        try:
            return cdc_cuts(whole, max(_MIN_CHUNK // 4, avg // 4), avg, avg * 4)
        finally:
            whole.release()


class _BoundedSet:
    """A set of strings that forgets its oldest members past ``capacity`` (thread-safe)."""

    def __init__(self, capacity: int) -> None:
        self._items: dict[str, None] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def __contains__(self, item: str) -> bool:
        return item in self._items

    def add(self, item: str) -> None:
        with self._lock:
            self._items[item] = None
            while len(self._items) > self._capacity:
                del self._items[next(iter(self._items))]

    def discard(self, item: str) -> None:
        with self._lock:
            self._items.pop(item, None)
