"""The read side of :class:`~gpufeed.engine.Engine`: open a version (its
manifest and shared, cached data-file descriptors) and read whole objects and
ranges into memory or into a caller's buffer, every byte checked against its
stored block sums (see :mod:`._chunkreads`).

A mixin so that ``Engine`` keeps one public API while its module stays one
concern: everything here needs only ``head_object`` (the catalog lookup) and
the chunk store.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..errors import DamagedObject, InternalError, InvalidArgument, InvalidRequestError, NoSuchKey
from ..store import ByteRequest, resolve_range
from ._blobs import BlobFiles
from ._chunkreads import ChunkDamage, Manifest
from ._chunks import ChunkStore
from ._fetched import FETCH_CACHE_BYTES, FetchedChunks
from ._handles import ObjectHandle
from ._remote import FetchChunk
from ._repair import QUEUE_FILES, RepairQueue, repair
from ._replicas import COPY_MAX_BYTES, PushFiles
from ._writes import as_bytes_view
from .catalog import Catalog
from .types import ChunkRecord, ObjectInfo

__all__ = ["ObjectReads"]

_READ_RETRIES = 64  # a version replaced between lookup and open is looked up again this often
#: Most data files :meth:`ObjectReads.object_holders` looks up the copies of for one version.
LOCATE_MAX_FILES = 16


class ObjectReads:
    """Reads of object versions, mixed into :class:`~gpufeed.engine.Engine`."""

    _files: BlobFiles
    _chunks: ChunkStore
    _cat: Catalog
    #: Repairs of data files here that reads found damaged (:meth:`use_peers`); ``None``: none are made.
    repairs: RepairQueue | None = None
    if TYPE_CHECKING:
        def head_object(self, bucket: str, key: str, version_id: str | None = None, *,
                        snapshot: str | None = None) -> ObjectInfo:
            """Engine's catalog lookup (:class:`~gpufeed.engine._versioning.VersionedObjects`)."""

    def open_version(self, bucket: str, key: str, version_id: str | None = None, *,
                     snapshot: str | None = None) -> ObjectHandle:
        """Look up the current version of an object (or the version
        ``version_id``, or the one snapshot ``snapshot`` recorded, see
        :meth:`head_object`) and open it for reading: its
        manifest (cached) and a shared, cached descriptor of its data file(s).
        A version replaced between the lookup and the open is looked up again.

        Returns:
            An :class:`ObjectHandle` the caller MUST close (``with`` works); its
            reads are checked (:meth:`ObjectHandle.read_into`,
            :meth:`ObjectHandle.extents`). It stays readable across overwrites
            and deletes; the old version's space returns when its last handle closes.

        Raises:
            NoSuchBucket, NoSuchKey: the bucket or key does not exist.
            NoSuchVersion, MethodNotAllowed, InvalidArgument: a version id as
                :meth:`head_object` refuses.
            DamagedObject: the version's data is missing or short.
            InternalError: the key was replaced on every one of many attempts.
        """
        last = None
        for _ in range(_READ_RETRIES):
            info = self.head_object(bucket, key, version_id, snapshot=snapshot)
            h = self.open_info(info)
            if h is not None:
                return h
            if info.blob_id == last:  # named twice with no data behind it: not a race
                raise DamagedObject(f"{bucket}/{key}: the version's data has no manifest (see gpufeed scrub)",
                                    bucket=bucket, key=key)
            last = info.blob_id
        raise InternalError(f"{bucket}/{key} kept changing while being opened")

    def open_info(self, info: ObjectInfo) -> ObjectHandle | None:
        """Open the version ``info`` names (from :meth:`head_object` or a
        listing) for reading; ``None`` when its data was freed meanwhile (the
        version was replaced or deleted: look it up again).

        Raises:
            DamagedObject: the data is missing or short.
        """
        store = self._chunks
        m = store.manifest(info.blob_id) if info.blob_id else Manifest.of("", 0, [])
        if m is None:
            return None
        verify = store.policy(info.bucket).verify
        if m.size != info.size:
            bad = ObjectHandle(info, Manifest.of(m.blob_id, 0, []), verify, self._files.open_files, store)
            raise bad.damaged(ChunkDamage(m.chunks[0] if m.chunks else ChunkRecord(m.blob_id, "", 0, 0, 0, "", b"",
                                                                                  b""),
                                          f"the data holds {m.size} bytes, the version {info.size}"))
        try:
            return ObjectHandle(info, m, verify, self._files.open_files, store)
        except FileNotFoundError:  # NoSuchKey: freed between the lookup and the open
            return None

    def use_peers(self, fetch: FetchChunk | None, push: PushFiles | None = None, *,
                  copy_max_bytes: int = COPY_MAX_BYTES, repair_queue: int = QUEUE_FILES,
                  fetch_cache_bytes: int = FETCH_CACHE_BYTES) -> None:
        """Read chunks that other nodes of the cluster hold through ``fetch``
        (:mod:`._remote`; ``None``: such reads fail with HolderUnavailable);
        copy every new data file to other nodes through ``push`` before a write
        commits (:mod:`._replicas`; ``None``: no copies); take copies other
        nodes push of at most ``copy_max_bytes`` bytes. With ``fetch``, a data
        file here that a read finds damaged is repaired from another node's
        good copy in the background (:mod:`._repair`), as scrub does, at most
        ``repair_queue`` files waiting (0: reads ask for no repair). Fetched
        chunks are kept for later reads, at most ``fetch_cache_bytes`` stored
        bytes (:class:`._fetched.FetchedChunks`; 0: none)."""
        self._chunks.remote = fetch
        if self._chunks.fetched is not None:
            self._chunks.fetched.close()
        self._chunks.fetched = FetchedChunks(fetch_cache_bytes) if fetch is not None else None
        self._chunks.push = push
        self._copy_max_bytes = copy_max_bytes
        if self.repairs is not None:
            self.repairs.stop()
        self.repairs = RepairQueue(functools.partial(repair, self._chunks, self._cat), repair_queue) \
            if fetch is not None and repair_queue > 0 else None
        self._chunks.repair = self.repairs.request if self.repairs is not None else None

    def fetch_cache_stats(self) -> dict:
        """Chunks fetched from other cluster nodes and kept for later reads:
        ``{"kept_bytes", "max_bytes", "hits", "misses", "fetched_bytes", "shared"}``
        (stored bytes kept; reads served from a kept chunk, and reads that
        found none kept, since start; stored bytes fetched since start, whole
        chunks and windows; reads that waited for the fetch of a chunk or
        window another read had under way, since start; zeros on a node that
        fetches from no other)."""
        f = self._chunks.fetched
        if f is None:
            return {"kept_bytes": 0, "max_bytes": 0, "hits": 0, "misses": 0, "fetched_bytes": 0, "shared": 0}
        return {"kept_bytes": f.kept_bytes, "max_bytes": f.max_bytes, "hits": f.hits, "misses": f.misses,
                "fetched_bytes": f.fetched_bytes, "shared": f.flights.shared}

    @contextmanager
    def held_chunk(self, chunk_id: str) -> Iterator[tuple[int, int, int]]:
        """The stored bytes of a chunk whose data file this node holds (as the
        chunks' holder, or a copy of it), as
        ``(fd, file_offset, stored)`` (the descriptor is this node's shared one:
        never close it; it stays valid until the block ends). Unchecked: the
        asker checks them against the block sums its catalog holds.

        Raises:
            NoSuchKey: no chunk ``chunk_id`` (freed meanwhile).
            InvalidArgument: another node holds it and this node has no copy.
            DamagedObject: its data file is missing or shorter than the chunk
                (marked damaged when this node is the holder).
        """
        store = self._chunks
        c = self._cat.chunk(chunk_id)
        if c is None:
            raise NoSuchKey(f"no chunk {chunk_id} (it was freed)")
        try:
            f = self._files.open_files.acquire(c.file, store.file_path(c.file))
        except FileNotFoundError:
            if store.held_elsewhere(c):  # a copy this node does not have (or no longer has)
                raise InvalidArgument(f"chunk {chunk_id} is held by node {c.holder}, and this node has no "
                                      "copy of it") from None
            store.report_damage(chunk_id, "data file is missing")
            raise DamagedObject(f"chunk {chunk_id}: its data file is missing on its holder",
                                chunk=chunk_id) from None
        try:
            size = os.fstat(f.fd).st_size
            if c.file_offset + c.stored > size:
                reason = f"data file has {size} bytes, the chunk needs {c.file_offset + c.stored}"
                if not store.held_elsewhere(c):  # a copy's holder judges the chunk
                    store.report_damage(chunk_id, reason)
                raise DamagedObject(f"chunk {chunk_id} on its holder: {reason}", chunk=chunk_id)
            yield f.fd, c.file_offset, c.stored
        finally:
            self._files.open_files.release(f)

    def open_files(self) -> int:
        """Data-file descriptors the engine holds open now (cached or in use)."""
        return self._files.open_files.open_count()

    def open_mappable(self, bucket: str, key: str, version_id: str | None = None, *,
                      snapshot: str | None = None) -> ObjectHandle:
        """Open a version for a zero-copy map: check its data (each chunk the
        first time this node maps it), then hand out its data files (see
        :meth:`ObjectHandle.file_extents`).

        Each chunk is checked the first time this node maps it after it
        started; later maps of it trust that check. What a map cannot check:
        the mapping shows the page cache, so a page the kernel drops and reads
        back later from a disk that changed meanwhile is not checked again
        (scrub finds such damage; reads through :meth:`ObjectHandle.read_into`
        always check).

        Returns:
            An open :class:`ObjectHandle` (the caller closes it once the
            descriptors are sent or mapped).

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as :meth:`open_version`.
            DamagedObject: the data failed its check.
            InvalidRequestError: the data is compressed or cut in chunks whose
                sizes are not page multiples (content-defined): read it instead.
        """
        h = self.open_version(bucket, key, version_id, snapshot=snapshot)
        try:
            if not h.manifest.mappable:
                raise InvalidRequestError(f"{bucket}/{key} is stored compressed or in content-defined chunks "
                                          "and cannot be mapped; read it instead")
            if h.verify and h.manifest.chunks:
                self._check_for_map(h)
            elif any(c.chunk_id in self._chunks.damaged for c in h.manifest.chunks):
                raise h.damaged(next(ChunkDamage(c, "the chunk is marked damaged (see gpufeed scrub)")
                                     for c in h.manifest.chunks if c.chunk_id in self._chunks.damaged))
            return h
        except BaseException:
            h.close()
            raise

    def _check_for_map(self, h: ObjectHandle) -> None:
        """Check the chunks of a version about to be mapped that this node has
        not checked for a map since it started (each whole chunk, through
        scratch); remember the ones that pass."""
        store, m = self._chunks, h.manifest
        for i, c in enumerate(m.chunks):
            if c.chunk_id not in store.mapped_ok:
                h.extents(m.starts[i], c.size)
                store.mapped_ok.add(c.chunk_id)

    def object_holders(self, bucket: str, key: str, version_id: str | None = None, *,
                       snapshot: str | None = None) -> tuple[ObjectInfo, list[str]]:
        """Which cluster nodes hold all of an object version's data in their
        folders: the nodes every chunk's data file is held by (as its holder or
        as a copy), the first chunk's holder first. Opens no data file.

        Args:
            bucket, key, version_id, snapshot: the version, as :meth:`head_object` names it.

        Returns:
            The version's metadata and the node ids; no ids when the node is in
            no cluster (its chunks name no holder), when no node holds every
            chunk, or when the chunks lie in more than :data:`LOCATE_MAX_FILES`
            data files (not worth the catalog lookups).

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed, InvalidArgument:
                as :meth:`head_object`.
        """
        info = self.head_object(bucket, key, version_id, snapshot=snapshot)
        store = self._chunks
        m = store.manifest(info.blob_id) if info.blob_id else None
        if m is None or not m.chunks or len({c.file for c in m.chunks}) > LOCATE_MAX_FILES:
            return info, []
        common: list[str] | None = None
        seen: set[str] = set()
        for c in m.chunks:
            if not c.holder:
                return info, []
            if c.file in seen:  # a data file lies in its holder's folder: one answer per file
                continue
            seen.add(c.file)
            nodes = store.holders(c)
            common = nodes if common is None else [n for n in common if n in nodes]
            if not common:
                return info, []
        return info, common or []

    def get_object(self, bucket: str, key: str, byte_range: ByteRequest | None = None,
                   version_id: str | None = None, *, snapshot: str | None = None) -> bytes:
        """Read an object (or a range) into memory, checked. Large reads should
        use :meth:`open_version` and read into a buffer instead.

        Args:
            byte_range: ``None`` for all of it, else a :mod:`gpufeed.store` byte request.
            version_id: a version, or ``None`` for the current one.
            snapshot: read the version snapshot ``snapshot`` recorded.

        Returns:
            The bytes.

        Raises:
            NoSuchBucket, NoSuchKey: missing bucket or key.
            InvalidRange: the range is unsatisfiable (see :func:`gpufeed.store.resolve_range`).
            DamagedObject: the data failed its check.
        """
        with self.open_version(bucket, key, version_id, snapshot=snapshot) as h:
            start, length = resolve_range(byte_range, h.info.size)
            buf = bytearray(length)
            h.read_into(buf, start)
            return bytes(buf)

    def read_into(self, info: ObjectInfo, buffer, offset: int = 0) -> int:
        """Read object version ``info`` from ``offset`` straight into ``buffer``, checked.

        Args:
            info: from :meth:`head_object` (identifies one immutable version).
            buffer: writable buffer; up to ``len(buffer)`` bytes are read.
            offset: byte offset in the object.

        Returns:
            Bytes read; short only at the end of the object.

        Raises:
            NoSuchKey: that version was overwritten or deleted meanwhile.
            InvalidArgument: negative offset.
            DamagedObject: the data failed its check.
        """
        if offset < 0:
            raise InvalidArgument("offset must be >= 0")
        h = self.open_info(info)
        if h is None:
            raise NoSuchKey(f"{info.bucket}/{info.key} (version {info.blob_id}) is gone",
                            bucket=info.bucket, key=info.key)
        with h:
            return h.read_into(as_bytes_view(buffer), offset)
