"""The write path: pending writes, ETag hashing, and the object commit.

An object or part is written into a temp file under ``tmp/`` by a
:class:`PendingWrite`, hashed as the bytes go (MD5 for S3 ETags, xxh3-128 for
the fast path), and made visible by its ``commit``, which hands the finished
file to a *finish* function (for objects, :meth:`WritePath.publish_object`:
rename the file into ``blobs/``, then commit its catalog row, with the kv
bucket policy's eviction in the same transaction; for parts, the multipart
module's equivalent). :class:`WritePath` is what every pending write of one
engine shares: the data folder, the catalog, the kv policy and the hashing
thread pool.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import xxhash

from ..errors import (
    BadDigest,
    GpufeedError,
    IncompleteBody,
    InternalError,
    InvalidArgument,
    NoSuchBucket,
    NoSuchKey,
    PreconditionFailed,
    StorageFull,
)
from ._blobs import BlobFiles, copy_range, remove_quietly, start_writeback, write_all_v
from ._blocksums import SUM_BLOCK, BlockSummer
from ._chunks import ChunkStore
from ._kvpolicy import KVBucketPolicy
from ._names import check_str_map
from ._release import releasable
from ._replicas import record_copies, replicate_staged
from ._tenants import check_quota
from ._versions import check_tags, place_version
from .catalog import Catalog, CatalogWriter, require_bucket
from .types import DEFAULT_TENANT, ObjectInfo, Retention

__all__ = ["PendingWrite", "WritePath", "feed", "as_bytes_view", "check_hash_kind", "check_preconditions",
           "etag_kind"]

_CHUNK_BYTES = 8 << 20  # 8 MiB: read size for file-object puts and hash catch-up
_OVERLAP_BYTES = 1 << 20  # 1 MiB: from here, MD5 runs on a helper thread while the data is written
#: With ``fsync`` on, writeback of the temp file is started every this many new bytes,
#: so the commit's fsync finds little left to write.
_WRITEBACK_BYTES = 16 << 20  # 16 MiB
_DEFAULT_TYPE = "application/octet-stream"
#: A write that grows is checked against the data folder's capacity this often.
_ROOM_CHECK_BYTES = 64 << 20  # 64 MiB


def _io_error(what: str, exc: OSError) -> GpufeedError:
    """The error for a failed file-system call: StorageFull when the disk is full."""
    if exc.errno == errno.ENOSPC:
        return StorageFull(f"the disk of the data folder is full ({what})")
    return InternalError(f"{what}: {exc}")

#: ``finish(pw, tmp_path, etag, md5_digest, **commit_kw)``: publishes the file
#: and commits the catalog row; returns what ``commit`` returns.
Finish = Callable[..., Any]


class WritePath:
    """The write path of one engine: what its pending writes share (the data
    folder, the hashing threads) and the commit that publishes an object.

    Args:
        files: the engine's data folder (its ``fsync`` setting applies to temp files too).
        catalog: the engine's catalog.
        kv: the engine's kv bucket policy, asked on every object commit.
        chunks: the engine's chunk store, which turns a finished temp file into
            the version's chunks (see :mod:`._chunks`).
    """

    def __init__(self, files: BlobFiles, catalog: Catalog, kv: KVBucketPolicy, chunks: ChunkStore) -> None:
        self.files = files
        self._cat = catalog
        self._kv = kv
        self._chunks = chunks
        #: The chunk store (capacity checks of growing writes).
        self.chunks = chunks
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def begin(self, hash_kind: str | None, finish: Finish) -> "PendingWrite":
        """A new :class:`PendingWrite` hashing with ``hash_kind`` (``"md5"``,
        ``"xxh3"`` or ``None``) and published by ``finish``."""
        return PendingWrite(self, hash_kind, finish)

    def hash_pool(self) -> ThreadPoolExecutor:
        """The helper threads that hash large buffers while they are written (made on first use)."""
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="gpufeed-hash"
                    )
                pool = self._pool
        return pool

    def close(self) -> None:
        """Stop the hashing threads (waiting for running hashes)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def publish_object(
        self, bucket: str, key: str, tmp: str, size: int, etag: str | None, *,
        content_type: str | None, metadata: dict[str, str] | None, checksums: dict[str, str] | None,
        headers: dict[str, str] | None = None, if_match: str | None = None,
        if_none_match: str | None = None, extra: Callable[[CatalogWriter, ObjectInfo], None] | None = None,
        tags: dict[str, str] | None = None, retention: Retention | None = None,
        block_sums: bytes | None = None,
    ) -> ObjectInfo:
        """Store a finished temp file as the new version's chunks (by the bucket's
        data policy, see :meth:`ChunkStore.stage`) and commit its catalog row and
        manifest in one transaction. ``block_sums``: the file's block sums when
        the write computed them as the data passed (:attr:`PendingWrite.block_sums`).

        ``extra(w, info)``, when given, runs inside the same transaction first with
        the new version's record (multipart completion uses it to check and drop
        the upload and to remember the completion). ``if_match`` /
        ``if_none_match`` are checked against the current row inside the
        transaction (see :meth:`PendingWrite.commit`). In a kv bucket the same
        transaction evicts what the new version needs room for (see
        :meth:`gpufeed.engine.Engine.create_bucket`); the evicted blobs are
        unlinked after the commit. The new version's id, order and lock come
        from the bucket's versioning and object lock settings
        (:func:`~gpufeed.engine._versions.place_version`), with ``tags`` and
        ``retention`` as asked.

        Returns:
            The new object's :class:`ObjectInfo`.

        Raises:
            NoSuchBucket: the bucket was deleted meanwhile.
            PreconditionFailed, NoSuchKey: a condition does not hold.
            EntityTooLarge: (kv) the object alone exceeds the bucket's capacity.
            InvalidArgument: metadata, checksums or headers not ``str -> str``;
                lock settings as :func:`~gpufeed.engine._versions.lock_of_new` refuses.
            InvalidTag: tags over S3's limits.
            InvalidRequestError: lock settings in a bucket without object lock.
            AccessDenied: the version it would replace is protected by object lock.
            QuotaExceeded: the bucket or its tenant would go past its quota.
            StorageFull: the data folder is at its capacity (or the disk is full).
        """
        for d in (metadata, checksums, headers):
            check_str_map(d)
        tags = check_tags(tags) if tags else {}
        policy = self._chunks.policy(bucket)
        domain = DEFAULT_TENANT
        if policy.dedup:  # the tenant's dedup domain
            b0 = self._cat.bucket(bucket)
            if b0 is None:
                remove_quietly(tmp)
                raise NoSuchBucket(f"bucket {bucket!r} does not exist", bucket=bucket)
            domain = b0.owner or DEFAULT_TENANT
        staged = self._chunks.stage(tmp, size, policy, domain, sums=block_sums, bucket=bucket)
        copies = replicate_staged(self._chunks, staged, getattr(self, "_room", None))  # before anything is visible
        blob_id = staged.blob_id
        etag = etag if etag is not None else "n" + blob_id  # a bucket with ETag policy "none"
        info = ObjectInfo(bucket, key, size, etag, time.time(), content_type or _DEFAULT_TYPE,
                          dict(metadata or {}), dict(checksums or {}), blob_id, self.files.blob_path(blob_id),
                          dict(headers or {}), tags=tags)
        try:
            with self._cat.write() as w:
                self._chunks.commit(w, staged)
                record_copies(w, copies)
                if extra is not None:
                    extra(w, info)
                b = require_bucket(w, bucket)
                old = w.object(bucket, key)
                if if_match is not None or if_none_match is not None:
                    check_preconditions(bucket, key, old.etag if old else None, if_match, if_none_match)
                evicted = self._kv.on_commit(w, bucket, key, size, blob_id, info.last_modified,
                                             old.size if old else 0)
                info, freed = place_version(w, b, info, old, retention)
                w.put_object(info)
                check_quota(w, b)
                freed = releasable(w, freed + evicted)
        except BaseException:
            self._chunks.discard(staged)
            raise
        self._chunks.finish(staged)
        self.files.remove_blobs(freed)
        return info


_MD5_ETAG = re.compile(r"[0-9a-f]{32}(-[0-9]+)?")


def etag_kind(etag: str) -> str:
    """The ETag policy an ETag was made under: ``"md5"`` (hex MD5, or S3's
    multipart ``<hex>-N``), ``"fast"`` (``x<hex xxh3-128>``) or ``"none"``."""
    return "md5" if _MD5_ETAG.fullmatch(etag) else "fast" if etag.startswith("x") else "none"


def check_preconditions(bucket: str, key: str, current: str | None,
                        if_match: str | None, if_none_match: str | None) -> None:
    """Conditional write (S3 PutObject ``If-Match`` / ``If-None-Match``) against the
    ``current`` ETag (``None``: no such key). Called inside the write transaction.

    Source: "Add preconditions to S3 operations with conditional requests",
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html
    """
    if if_match is not None:
        if current is None:
            raise NoSuchKey("The specified key does not exist.", bucket=bucket, key=key)
        if if_match != "*" and if_match != current:
            raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                     condition="If-Match")
    if if_none_match is not None and current is not None and if_none_match in ("*", current):
        raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                 condition="If-None-Match")


def as_bytes_view(data) -> memoryview:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
    return mv


def check_hash_kind(kind: str | None) -> None:
    """Refuse an unknown ETag kind.

    Raises:
        InvalidArgument: ``kind`` is not ``"md5"``, ``"xxh3"`` or ``None``.
    """
    _new_hasher(kind)


def _update_all(h, views: list[memoryview]) -> None:
    """Feed ``views`` to hasher ``h`` in order."""
    for v in views:
        h.update(v)


def _hash_views(h, summer: BlockSummer | None, views: list[memoryview]) -> None:
    """Feed ``views`` to the ETag hasher ``h`` and the block ``summer`` (either may be None)."""
    if h is not None:
        _update_all(h, views)
    if summer is not None:
        summer.feed_all(views)


def _new_hasher(kind: str | None):
    if kind == "md5":
        return hashlib.md5()
    if kind == "xxh3":
        return xxhash.xxh3_128()
    if kind is None:
        return None
    raise InvalidArgument(f"etag must be 'md5' or 'xxh3', not {kind!r}")


def _decode_md5(content_md5: str) -> bytes:
    try:
        raw = base64.b64decode(content_md5, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument("Content-MD5 is not valid base64") from exc
    if len(raw) != 16:
        raise InvalidArgument("Content-MD5 must be 16 bytes of base64")
    return raw


class PendingWrite:
    """An object (or part) being written; invisible until :meth:`commit`.

    Obtain from :meth:`gpufeed.engine.Engine.begin_put` or
    :meth:`gpufeed.engine.Engine.begin_part`. Use as a
    context manager: leaving the block with an exception aborts (the temp file
    is removed). A PendingWrite is not thread-safe: one writer at a time.

    Data is appended at offset :attr:`size` of a temp file in ``tmp/``; with
    ``fsync`` on, writeback of every new 16 MiB is started as it is written
    (``sync_file_range``), so the commit's ``fsync`` waits for the tail only. The
    ETag hash follows the data: buffers passed to :meth:`write` (or to
    :meth:`wrote`) are hashed as they go; bytes that reached the file without
    passing through Python (:meth:`write_from_fd`, :meth:`wrote` without
    ``data``) are read back from the file and hashed at the next opportunity,
    so the ETag is always that of the file's bytes.

    Attributes:
        size: bytes written so far.
    """

    def __init__(self, write_path: WritePath, hash_kind: str | None, finish: Finish) -> None:
        # Private: made by WritePath.begin. ``finish`` (see :data:`Finish`)
        # publishes the file and commits the catalog row.
        self._wp = write_path
        self._hasher = _new_hasher(hash_kind)
        self._hash_kind = hash_kind
        self._finish = finish
        self._fd, self._tmp = write_path.files.new_temp()
        self._hashed = 0  # bytes at the start of the file the hasher has seen
        self._room_checked = 0  # size at the last capacity check
        # Block sums of the data as it passes (None once a byte got by without it:
        # the chunk store then reads the file back).
        self._summer: BlockSummer | None = BlockSummer(SUM_BLOCK)
        #: The data's block sums once committed (``None``: not all of it passed through Python).
        self.block_sums: bytes | None = None
        self._flushed = 0  # bytes at the start of the file whose writeback was started
        self._done = False
        self.size = 0

    def _check_open(self) -> None:
        if self._done:
            raise InvalidArgument("this write was already committed or aborted")

    def _catch_up(self) -> None:
        """Feed the hasher the file bytes it has not seen (read back from the temp file)."""
        if self._hasher is None:
            return
        while self._hashed < self.size:
            chunk = os.pread(self._fd, min(_CHUNK_BYTES, self.size - self._hashed), self._hashed)
            if not chunk:
                raise InternalError(f"temp file {self._tmp} is shorter than the bytes written")
            self._hasher.update(chunk)
            self._hashed += len(chunk)

    def write(self, data) -> int:
        """Append a buffer (bytes, bytearray, memoryview, mmap slice, numpy array).

        Written at offset :attr:`size`, looping over short writes (as
        :meth:`write_many` of one buffer). For MD5 ETags and buffers of 1 MiB
        or more, hashing runs on a helper thread while the data is written
        (both release the GIL).

        Args:
            data: any C-contiguous buffer.

        Returns:
            Bytes written (the buffer's length in bytes).

        Raises:
            InvalidArgument: the write was already committed or aborted.
            InternalError: the file system failed (disk full, I/O error).
        """
        return self.write_many((data,))

    def write_many(self, buffers) -> int:
        """Append several buffers in one ``os.pwritev``, as if written one after another.

        The MD5 of an ``md5`` write of 1 MiB or more runs on a helper thread
        while the buffers are written (both release the GIL); nothing is joined
        or copied in Python.

        Args:
            buffers: a list of C-contiguous buffers.

        Returns:
            Bytes written (the buffers' total length).

        Raises:
            InvalidArgument: the write was already committed or aborted.
            InternalError: the file system failed (disk full, I/O error).
        """
        self._check_open()
        views = [v for v in (as_bytes_view(b) for b in buffers) if v.nbytes]
        n = sum(v.nbytes for v in views)
        if n == 0:
            return 0
        h = self._hasher
        summer = self._summer
        try:
            if h is not None and self._hashed != self.size:
                self._catch_up()
            if n >= _OVERLAP_BYTES and (summer is not None or self._hash_kind == "md5"):
                # hash (GIL held) on a helper while pwritev (GIL released) writes
                fut = self._wp.hash_pool().submit(_hash_views, h, summer, views)
                try:
                    write_all_v(self._fd, views, self.size)
                finally:
                    fut.result()
            else:
                _hash_views(h, summer, views)
                write_all_v(self._fd, views, self.size)
        except OSError as exc:
            self.abort()
            raise _io_error(f"writing {self._tmp} failed", exc) from exc
        self.size += n
        self._check_room()
        if h is not None:
            self._hashed += n
        self._start_writeback()
        return n

    def _check_room(self) -> None:
        """Refuse a write that has grown past the data folder's capacity (every
        64 MiB; the commit checks the exact stored size)."""
        if self.size - self._room_checked >= _ROOM_CHECK_BYTES:
            self._room_checked = self.size
            try:
                self._wp.chunks.check_room(self.size)
            except StorageFull:
                self.abort()
                raise

    def _start_writeback(self) -> None:
        """Start writing the newest bytes to disk when ``fsync`` is on and enough piled up."""
        if self._wp.files.fsync and self.size - self._flushed >= _WRITEBACK_BYTES:
            start_writeback(self._fd, self._flushed, self.size - self._flushed)
            self._flushed = self.size

    def write_from_fd(self, fd: int, offset: int, length: int) -> int:
        """Append ``length`` bytes read from file descriptor ``fd`` at ``offset``.

        Uses ``os.copy_file_range`` (a kernel-side copy; a reflink on file
        systems that support it), falling back to ``pread`` + ``pwrite`` when
        the kernel cannot copy between these files.

        Args:
            fd: a readable descriptor (regular file, memfd).
            offset: where to start reading in ``fd``, bytes.
            length: bytes to copy.

        Returns:
            Bytes written; fewer than ``length`` only when ``fd`` ended first.

        Raises:
            InvalidArgument: negative offset/length, or the write is finished.
            InternalError: the file system failed.
        """
        self._check_open()
        if offset < 0 or length < 0:
            raise InvalidArgument("offset and length must be >= 0")
        try:
            n = copy_range(fd, offset, self._fd, self.size, length)
        except OSError as exc:
            self.abort()
            raise _io_error(f"copying into {self._tmp} failed", exc) from exc
        if n:
            self._summer = None  # these bytes never passed through Python
        self.size += n
        self._start_writeback()
        return n

    def fileno(self) -> int:
        """The temp file's descriptor (read-write), for callers that write with
        ``os.pwrite``/``os.pwritev`` themselves at offset :attr:`size`; they
        must then call :meth:`wrote`."""
        self._check_open()
        return self._fd

    def wrote(self, nbytes: int, data=None) -> None:
        """Account ``nbytes`` written directly through :meth:`fileno` at offset :attr:`size`.

        Args:
            nbytes: bytes the caller wrote.
            data: the same buffer (or list of buffers, as given to ``pwritev``),
                so the hash sees it without reading the file back; optional.

        Raises:
            InvalidArgument: negative ``nbytes``, or the write is finished.
        """
        self._check_open()
        if nbytes < 0:
            raise InvalidArgument("nbytes must be >= 0")
        h = self._hasher
        views = None
        if data is not None:
            views = [as_bytes_view(b) for b in data] if isinstance(data, (list, tuple)) else [as_bytes_view(data)]
            if sum(v.nbytes for v in views) != nbytes:
                views = None
        if h is not None and views is not None and self._hashed == self.size:
            for v in views:
                h.update(v)
            self._hashed += nbytes
        if self._summer is not None and views is not None and self._summer.nbytes == self.size:
            self._summer.feed_all(views)
        elif nbytes:
            self._summer = None
        self.size += nbytes
        self._start_writeback()

    def commit(
        self,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        checksums: dict[str, str] | None = None,
        content_md5: str | None = None,
        expected_size: int | None = None,
        headers: dict[str, str] | None = None,
        if_match: str | None = None,
        if_none_match: str | None = None,
        tags: dict[str, str] | None = None,
        retention: Retention | None = None,
    ):
        """Make the object visible atomically (as the bucket's versioning says:
        replacing the current version, or adding a version).

        The temp file is fsynced (when the engine has ``fsync=True``), renamed
        into ``blobs/``, the directory fsynced, then the catalog row committed.
        On any error the data is discarded.

        Args:
            content_type: the ``Content-Type``; default ``application/octet-stream``.
            metadata: user metadata (names without ``x-amz-meta-``).
            checksums: ``{"crc32c": b64, ...}`` as sent by the client; stored, not checked.
            content_md5: base64 MD5 the client sent (``Content-MD5``); checked.
            expected_size: when given, the bytes written must equal it.
            headers: standard HTTP headers to return on reads (see
                :attr:`ObjectInfo.headers`); ignored for parts.
            if_match: commit only if the key's current ETag (no quotes) is this
                (``"*"``: only if the key exists). Checked inside the catalog
                write transaction, so atomic with respect to concurrent writers.
            if_none_match: ``"*"``: commit only if the key does not exist (an
                ETag: only if the current version does not have it). Atomic too.
            tags: the version's tag set (S3 ``x-amz-tagging``); ignored for parts.
            retention: object lock settings of the version (the bucket's
                default retention applies when it names no mode); ignored for parts.

        Returns:
            The new :class:`ObjectInfo` (a :class:`PartInfo` for a part).

        Raises:
            PreconditionFailed: ``if_match`` / ``if_none_match`` does not hold.
            NoSuchKey: ``if_match`` given and the key does not exist.
            BadDigest: ``content_md5`` does not match the data.
            IncompleteBody: fewer bytes than ``expected_size`` arrived.
            InvalidArgument: more bytes than ``expected_size``, a malformed
                ``content_md5``, or the write was already finished.
            NoSuchBucket: the bucket was deleted meanwhile.
            NoSuchUpload: (parts) the upload was completed or aborted meanwhile.
            InvalidTag, InvalidRequestError, AccessDenied: see
                :meth:`WritePath.publish_object`.
        """
        self._check_open()
        try:
            if expected_size is not None and self.size != expected_size:
                if self.size < expected_size:
                    raise IncompleteBody(f"got {self.size} bytes of {expected_size}", size=self.size)
                raise InvalidArgument(f"got {self.size} bytes, more than the {expected_size} announced")
            etag, md5_digest = self._seal(content_md5)
            os.close(self._fd)
            self._fd = -1
            result = self._finish(
                self, self._tmp, etag, md5_digest,
                content_type=content_type, metadata=metadata, checksums=checksums,
                headers=headers, if_match=if_match, if_none_match=if_none_match,
                tags=tags, retention=retention,
            )
        except BaseException:
            self.abort()
            raise
        self._done = True
        return result

    def _seal(self, content_md5: str | None) -> tuple[str | None, bytes | None]:
        """Finish hashing, check ``content_md5``, fsync the file (when the engine fsyncs).

        Returns:
            ``(etag, md5_digest)``: the ETag (``None`` without a hasher) and the
            binary MD5 when it was computed.

        Raises:
            BadDigest: ``content_md5`` does not match the data.
            InvalidArgument: ``content_md5`` is malformed.
            InternalError: the file system failed.
        """
        md5_digest = None
        try:
            self._catch_up()
            etag = None
            if self._hasher is not None:
                digest = self._hasher.hexdigest()
                etag = digest if self._hash_kind == "md5" else "x" + digest
                if self._hash_kind == "md5":
                    md5_digest = self._hasher.digest()
            if content_md5 is not None:
                want = _decode_md5(content_md5)
                if md5_digest is None:
                    md5_digest = self._file_md5()
                if want != md5_digest:
                    raise BadDigest("the Content-MD5 you specified did not match what we received")
            if self._wp.files.fsync:
                os.fsync(self._fd)
        except OSError as exc:
            raise _io_error(f"finishing {self._tmp} failed", exc) from exc
        if self._summer is not None and self._summer.nbytes == self.size:
            self.block_sums = self._summer.finish()
        return etag, md5_digest

    def _file_md5(self) -> bytes:
        h = hashlib.md5()
        pos = 0
        while pos < self.size:
            chunk = os.pread(self._fd, min(_CHUNK_BYTES, self.size - pos), pos)
            if not chunk:
                break
            h.update(chunk)
            pos += len(chunk)
        return h.digest()

    def abort(self) -> None:
        """Discard the data; idempotent (also safe after :meth:`commit`)."""
        if self._done:
            return
        self._done = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        remove_quietly(self._tmp)

    def __enter__(self) -> "PendingWrite":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def __del__(self) -> None:
        # A write dropped without commit or abort must not leak its descriptor or temp file.
        if not getattr(self, "_done", True):
            try:
                self.abort()
            except OSError:
                pass


def feed(pw: PendingWrite, data) -> None:
    """Write ``data`` (buffer, binary file, or iterable of buffers) into ``pw``.

    Binary files are read with ``readinto`` in 8 MiB chunks into one reused
    buffer (or ``read`` when they lack it).

    Raises:
        TypeError: ``data`` (or one of its chunks) is a ``str`` or not bytes-like.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        pw.write(data)
        return
    if isinstance(data, str):
        raise TypeError("object data must be bytes-like, not str")
    readinto = getattr(data, "readinto", None)
    if readinto is not None:
        buf = bytearray(_CHUNK_BYTES)
        mv = memoryview(buf)
        while True:
            n = readinto(mv)
            if not n:
                break
            pw.write(mv[:n])
        return
    read = getattr(data, "read", None)
    if read is not None:
        while chunk := read(_CHUNK_BYTES):
            pw.write(chunk)
        return
    try:
        mv = memoryview(data)
    except TypeError:
        pass
    else:
        pw.write(mv)
        return
    for chunk in data:
        if isinstance(chunk, str):
            raise TypeError("object data must be bytes-like, not str")
        pw.write(chunk)
