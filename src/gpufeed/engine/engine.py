"""The storage engine: buckets and objects on a local data folder, catalog in SQLite.

No network here; the S3 front (``gpufeed.s3``) and the fast path
(``gpufeed.wire``) both call this.

On-disk layout under ``data_dir``::

    catalog.sqlite3          buckets, objects, uploads, parts (WAL mode)
    blobs/ab/cd/<blob_id>    one immutable file per object version (blob_id = uuid4 hex)
    uploads/<upload_id>/<part_number:05d>.<id>   multipart parts (a fresh <id>
                             per upload of a part, so a re-upload never overwrites
                             a file a catalog row still names)
    tmp/                     files being written; emptied on start
    lock                     flock'ed by the one Engine that has the folder open

Write protocol (atomic, durable): data goes to a file in ``tmp/``, is fsynced,
renamed into ``blobs/``, the directory is fsynced, then the catalog row is
committed (``synchronous=FULL``). Only the commit makes an object visible. On
start, ``tmp/`` is emptied and blob files that no catalog row references are
deleted, so a crash at any point leaves no visible partial object and no
leaked file. Object keys never become file names, so no key can escape
the data folder. The old blob of an overwritten or deleted object is unlinked
after the commit (a crash in between leaves it unreferenced, so the next start
deletes it). Multipart part files follow the same protocol under ``uploads/``.

Why our own engine rather than a library: this is the product core. The fast
path needs what generic object stores hide: one immutable file per version
whose path it can ``preadv``/``sendfile`` from directly, writes straight into
a temp file descriptor from shared memory, kernel-side copies for multipart
and copy, and a point lookup in microseconds. The implementation is split
into :mod:`._names` (S3 naming rules, key-space arithmetic),
:mod:`._blobs` (files, renames, fsyncs, the start-up sweep) and
:mod:`._catalog` (SQLite connections and the single writer).
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import json
import math
import operator
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import xxhash

from ..errors import (
    BadDigest,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    EntityTooLarge,
    EntityTooSmall,
    GpufeedError,
    IncompleteBody,
    InternalError,
    InvalidArgument,
    InvalidPart,
    InvalidPartOrder,
    KeyTooLong,
    MalformedXML,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
    PreconditionFailed,
)
from ..checksums import COMPOSITE_ALGORITHMS, composite_checksum
from ..store import ByteRequest, resolve_range
from ._blobs import BlobFiles, copy_range, new_id, remove_quietly, write_all
from ._catalog import Catalog
from ._names import (
    MAX_KEY_BYTES,
    check_bucket_name,
    check_key,
    check_text,
    decode_token,
    encode_token,
    successor,
)
from .types import BucketInfo, ListResult, ObjectInfo, PartInfo, UploadInfo

__all__ = ["Engine", "PendingWrite", "MAX_KEY_BYTES", "MIN_PART_BYTES", "MAX_PARTS"]

#: Smallest part other than the last one (S3: 5 MiB).
MIN_PART_BYTES = 5 << 20
#: Highest part number S3 accepts.
MAX_PARTS = 10_000

_CHUNK_BYTES = 8 << 20  # 8 MiB: read size for file-object puts and hash catch-up
_OVERLAP_BYTES = 1 << 20  # 1 MiB: from here, MD5 runs on a helper thread while the data is written
_DEFAULT_TYPE = "application/octet-stream"
_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC
_READ_RETRIES = 64  # a version replaced between lookup and open is looked up again this often

_OBJ_COLS = "key, size, etag, last_modified, content_type, metadata, checksums, blob_id, headers"
_SQL_HEAD = (
    "SELECT size, etag, last_modified, content_type, metadata, checksums, blob_id, headers"
    " FROM objects WHERE bucket=? AND key=?"
)
_SQL_BUCKET = "SELECT created FROM buckets WHERE name=?"
_SQL_BUCKET_INFO = "SELECT name, created, kind, capacity_bytes, ttl_s FROM buckets"
_KINDS = ("standard", "kv")
_FLUSH_TOUCHED = 4096  # a kv bucket's unflushed read times are written to the catalog past this many


def _dumps(d: dict[str, str] | None) -> str:
    if not d:
        return ""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise InvalidArgument("metadata, checksums and headers must map str to str")
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False)


def _loads(s: str) -> dict[str, str]:
    return json.loads(s) if s else {}


def _check_preconditions(bucket: str, key: str, current: str | None,
                         if_match: str | None, if_none_match: str | None) -> None:
    """Conditional write (S3 PutObject ``If-Match`` / ``If-None-Match``) against the
    ``current`` ETag (``None``: no such key). Called inside the write transaction.

    Source: "Add preconditions to S3 operations with conditional requests",
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html
    """
    if if_match is not None:
        if current is None:
            raise NoSuchKey(f"{bucket}/{key} does not exist", bucket=bucket, key=key)
        if if_match != "*" and if_match != current:
            raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                     condition="If-Match")
    if if_none_match is not None and current is not None and if_none_match in ("*", current):
        raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                 condition="If-None-Match")


def _check_policy(kind: str, capacity_bytes, ttl_s) -> tuple[int, float]:
    """Validate a bucket policy; returns ``(capacity_bytes, ttl_s)`` as int and float."""
    if kind not in _KINDS:
        raise InvalidArgument(f"bucket kind must be one of {_KINDS}, not {kind!r}")
    try:
        if isinstance(capacity_bytes, bool):
            raise TypeError
        capacity_bytes = operator.index(capacity_bytes)
    except TypeError:
        raise InvalidArgument(f"capacity_bytes must be an int, not {capacity_bytes!r}") from None
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s):
        raise InvalidArgument(f"ttl_s must be a finite number of seconds, not {ttl_s!r}")
    if capacity_bytes < 0 or ttl_s < 0:
        raise InvalidArgument("capacity_bytes and ttl_s must be >= 0")
    if kind == "kv" and not (capacity_bytes or ttl_s):
        raise InvalidArgument("a kv bucket needs capacity_bytes > 0 or ttl_s > 0")
    if kind == "standard" and (capacity_bytes or ttl_s):
        raise InvalidArgument("standard buckets are never evicted; capacity_bytes and ttl_s need kind='kv'")
    return capacity_bytes, float(ttl_s)


class _KVBucket:
    """In-memory mirror of one kv bucket's committed objects, for eviction.

    Rows and totals change only in catalog commit hooks (under the catalog
    write lock, so in commit order); reads reorder :attr:`lru` and fill
    :attr:`touched`. Everything here is guarded by ``Engine._kv_lock``.

    Attributes:
        capacity_bytes: byte budget of object data; 0 = unlimited.
        ttl_s: seconds an object is visible after its last write; 0 = forever.
        bytes: sum of the sizes of the objects in :attr:`lru`.
        lru: ``key -> (size, blob_id)``, least recently read or written first.
        writes: ``key -> last_modified``, oldest write first (TTL sweeps pop its front).
        touched: ``key -> Unix s`` of reads not yet written to ``objects.last_access``.
        evictions, expirations: objects dropped for room / by TTL since the engine started.
    """

    __slots__ = ("capacity_bytes", "ttl_s", "bytes", "lru", "writes", "touched", "evictions", "expirations")

    def __init__(self, capacity_bytes: int, ttl_s: float) -> None:
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.bytes = 0
        self.lru: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self.writes: OrderedDict[str, float] = OrderedDict()
        self.touched: dict[str, float] = {}
        self.evictions = 0
        self.expirations = 0

    def add(self, key: str, size: int, blob_id: str, written: float) -> None:
        """A new version of ``key`` (replacing any): most recently used, newest write."""
        self.drop(key)
        self.lru[key] = (size, blob_id)
        self.writes[key] = written
        self.bytes += size

    def drop(self, key: str) -> None:
        ent = self.lru.pop(key, None)
        if ent is not None:
            self.bytes -= ent[0]
        self.writes.pop(key, None)
        self.touched.pop(key, None)


def _as_bytes_view(data) -> memoryview:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
    return mv


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

    Obtain from :meth:`Engine.begin_put` or :meth:`Engine.begin_part`. Use as a
    context manager: leaving the block with an exception aborts (the temp file
    is removed). A PendingWrite is not thread-safe: one writer at a time.

    Data is appended at offset :attr:`size` of a temp file in ``tmp/``. The
    ETag hash follows the data: buffers passed to :meth:`write` (or to
    :meth:`wrote`) are hashed as they go; bytes that reached the file without
    passing through Python (:meth:`write_from_fd`, :meth:`wrote` without
    ``data``) are read back from the file and hashed at the next opportunity,
    so the ETag is always that of the file's bytes.

    Attributes:
        size: bytes written so far.
    """

    def __init__(self, engine: "Engine", hash_kind: str | None, finish) -> None:
        # Private: made by Engine. ``finish(pw, tmp_path, etag, md5_digest, **commit_kw)``
        # publishes the file and commits the catalog row.
        self._engine = engine
        self._hasher = _new_hasher(hash_kind)
        self._hash_kind = hash_kind
        self._finish = finish
        self._fd, self._tmp = engine._files.new_temp()
        self._hashed = 0  # bytes at the start of the file the hasher has seen
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

        Written with ``os.pwrite`` at offset :attr:`size`, looping over short
        writes. For MD5 ETags and buffers of 1 MiB or more, hashing runs on a
        helper thread while the data is written (both release the GIL).

        Args:
            data: any C-contiguous buffer.

        Returns:
            Bytes written (the buffer's length in bytes).

        Raises:
            InvalidArgument: the write was already committed or aborted.
            InternalError: the file system failed (disk full, I/O error).
        """
        self._check_open()
        mv = _as_bytes_view(data)
        n = mv.nbytes
        if n == 0:
            return 0
        h = self._hasher
        try:
            if h is not None and self._hashed != self.size:
                self._catch_up()
            if h is not None and n >= _OVERLAP_BYTES and self._hash_kind == "md5":
                fut = self._engine._hash_pool().submit(h.update, mv)
                try:
                    write_all(self._fd, mv, self.size)
                finally:
                    fut.result()
            else:
                if h is not None:
                    h.update(mv)
                write_all(self._fd, mv, self.size)
        except OSError as exc:
            self.abort()
            raise InternalError(f"writing {self._tmp} failed: {exc}") from exc
        self.size += n
        if h is not None:
            self._hashed += n
        return n

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
            raise InternalError(f"copying into {self._tmp} failed: {exc}") from exc
        self.size += n
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
        if h is not None and data is not None and self._hashed == self.size:
            views = [_as_bytes_view(b) for b in data] if isinstance(data, (list, tuple)) else [_as_bytes_view(data)]
            if sum(v.nbytes for v in views) == nbytes:
                for v in views:
                    h.update(v)
                self._hashed += nbytes
        self.size += nbytes

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
    ):
        """Make the object visible atomically (replacing any previous version).

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
        """
        self._check_open()
        try:
            if expected_size is not None and self.size != expected_size:
                if self.size < expected_size:
                    raise IncompleteBody(f"got {self.size} bytes of {expected_size}", size=self.size)
                raise InvalidArgument(f"got {self.size} bytes, more than the {expected_size} announced")
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
                if self._engine._fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                raise InternalError(f"finishing {self._tmp} failed: {exc}") from exc
            os.close(self._fd)
            self._fd = -1
            result = self._finish(
                self, self._tmp, etag, md5_digest,
                content_type=content_type, metadata=metadata, checksums=checksums,
                headers=headers, if_match=if_match, if_none_match=if_none_match,
            )
        except BaseException:
            self.abort()
            raise
        self._done = True
        return result

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


class Engine:
    """A storage node's engine over ``data_dir``. Thread-safe.

    Args:
        data_dir: folder for catalog and data (created if missing).
        fsync: fsync data, directories and catalog before a write returns
            (``synchronous=FULL``); with ``False`` writes are still atomic and
            survive a process crash, but not a power loss.

    Raises:
        InternalError: ``data_dir`` is in use by another open Engine (an
            exclusive ``flock`` on ``data_dir/lock``), or the catalog cannot
            be opened.

    All methods raise the typed errors of :mod:`gpufeed.errors`. Usable as a
    context manager (closes on exit).
    """

    def __init__(self, data_dir: str | Path, *, fsync: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._fsync = fsync
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise InternalError(f"{self.data_dir} is in use by another Engine") from exc
        try:
            self._files = BlobFiles(self.data_dir, fsync=fsync)
            self._cat = Catalog(str(self.data_dir / "catalog.sqlite3"), fsync=fsync)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._closed = False
        #: What the start-up sweep removed: ``{"tmp": n, "blobs": n, "uploads": n, "parts": n}``.
        self.recovered = self._recover()
        # kv buckets by name; the dict changes only in commit hooks (under the catalog write lock).
        self._kv: dict[str, _KVBucket] = {}
        self._kv_lock = threading.Lock()
        c = self._cat.reader()
        for name, cap, ttl in c.execute("SELECT name, capacity_bytes, ttl_s FROM buckets WHERE kind='kv'").fetchall():
            self._kv[name] = self._load_kv(c, name, cap, ttl)

    def _recover(self) -> dict[str, int]:
        c = self._cat.reader()
        live_blobs = {r[0] for r in c.execute("SELECT blob_id FROM objects")}
        live_parts: dict[str, set[str]] = {r[0]: set() for r in c.execute("SELECT upload_id FROM uploads")}
        for upload_id, file in c.execute("SELECT upload_id, file FROM parts"):
            live_parts.setdefault(upload_id, set()).add(file)
        return self._files.sweep(live_blobs, live_parts)

    @staticmethod
    def _load_kv(conn, bucket: str, capacity_bytes: int, ttl_s: float) -> _KVBucket:
        """A kv bucket's state from its catalog rows: totals recounted, LRU order from
        the last flushed read (or write) time."""
        st = _KVBucket(capacity_bytes, ttl_s)
        rows = conn.execute(
            "SELECT key, size, blob_id, last_modified, MAX(last_access, last_modified) AS used"
            " FROM objects WHERE bucket=? ORDER BY used, key", (bucket,),
        ).fetchall()
        for key, size, blob_id, _, _ in rows:
            st.lru[key] = (size, blob_id)
            st.bytes += size
        for key, _, _, lm, _ in sorted(rows, key=lambda r: r[3]):
            st.writes[key] = lm
        return st

    def _hash_pool(self) -> ThreadPoolExecutor:
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
        """Close the catalog connections, stop helper threads, release ``data_dir``; idempotent.

        Writes still pending are not committed; their temp files are removed at the next start.
        """
        if self._closed:
            return
        self._closed = True
        if any(st.touched for st in self._kv.values()):
            try:
                with self._cat.write() as w:
                    for bucket, st in self._kv.items():
                        self._flush_touched(w, bucket, st)
            except GpufeedError:
                pass  # only LRU order after a restart is lost
        self._cat.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        os.close(self._lock_fd)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    # helpers -------------------------------------------------------------
    def _info(self, bucket: str, key: str, row) -> ObjectInfo:
        size, etag, lm, ct, md, ck, blob, hd = row
        return ObjectInfo(
            bucket, key, size, etag, lm, ct,
            json.loads(md) if md else {},
            json.loads(ck) if ck else {},
            blob, self._files.blob_path(blob),
            json.loads(hd) if hd else {},
        )

    def _require_bucket(self, conn, bucket: str) -> None:
        if not conn.execute(_SQL_BUCKET, (bucket,)).fetchall():
            raise NoSuchBucket(f"bucket {bucket!r} does not exist", bucket=bucket)

    # buckets -----------------------------------------------------------
    def create_bucket(self, name: str, *, kind: str = "standard", capacity_bytes: int = 0,
                      ttl_s: float = 0.0) -> BucketInfo:
        """Create a bucket.

        A ``"kv"`` bucket is a cache: a put never fails for lack of room.
        When a put commits and the bucket's object bytes would exceed
        ``capacity_bytes``, objects are evicted in the same catalog
        transaction, expired ones first, then least recently used (LRU:
        the last read, i.e. :meth:`head_object`, which every read path
        calls, or write); the only put it refuses is one larger than the
        whole capacity. Objects written more than ``ttl_s`` seconds ago are
        invisible (head, get and list treat them as missing) and are deleted
        when next looked up or at the next put's eviction pass. Standard
        buckets never lose an object. The kind is fixed at creation; see
        :meth:`set_bucket_policy` for the limits.

        Args:
            name: bucket name (S3 general-purpose naming rules).
            kind: ``"standard"`` or ``"kv"``.
            capacity_bytes: kv: the most bytes of object data kept; 0 = unlimited.
            ttl_s: kv: seconds an object lives after its last write; 0 = forever.

        Returns:
            The new bucket.

        Raises:
            InvalidBucketName: the name breaks an S3 naming rule.
            BucketAlreadyOwnedByYou: it exists already.
            InvalidArgument: an unknown kind, negative limits, a kv bucket with
                neither limit, or a standard bucket with one.
        """
        check_bucket_name(name)
        capacity_bytes, ttl_s = _check_policy(kind, capacity_bytes, ttl_s)
        now = time.time()
        with self._cat.write() as w:
            if w.execute(_SQL_BUCKET, (name,)).fetchall():
                raise BucketAlreadyOwnedByYou(f"bucket {name!r} exists", bucket=name)
            w.execute("INSERT INTO buckets (name, created, kind, capacity_bytes, ttl_s) VALUES (?, ?, ?, ?, ?)",
                      (name, now, kind, capacity_bytes, ttl_s))
            if kind == "kv":
                self._cat.on_commit(lambda: self._kv.__setitem__(name, _KVBucket(capacity_bytes, ttl_s)))
        return BucketInfo(name, now, kind, capacity_bytes, ttl_s)

    def set_bucket_policy(self, name: str, *, capacity_bytes: int | None = None,
                          ttl_s: float | None = None) -> BucketInfo:
        """Change a kv bucket's limits (``None`` keeps one). Shrinking the capacity
        evicts (LRU) in the same transaction; a shorter TTL hides older objects at once.

        Returns:
            The bucket with its new limits.

        Raises:
            NoSuchBucket: it does not exist.
            InvalidArgument: not a kv bucket, or limits as for :meth:`create_bucket`.
        """
        with self._cat.write() as w:
            rows = w.execute(_SQL_BUCKET_INFO + " WHERE name=?", (name,)).fetchall()
            if not rows:
                raise NoSuchBucket(f"bucket {name!r} does not exist", bucket=name)
            _, created, kind, cap, ttl = rows[0]
            if kind != "kv":
                raise InvalidArgument(f"bucket {name!r} is {kind!r}; only kv buckets have an eviction policy")
            cap, ttl = _check_policy(kind, cap if capacity_bytes is None else capacity_bytes,
                                     ttl if ttl_s is None else ttl_s)
            w.execute("UPDATE buckets SET capacity_bytes=?, ttl_s=? WHERE name=?", (cap, ttl, name))
            st = self._kv[name]
            # Plan against the new limits on a stand-in, so a rollback leaves ``st`` untouched.
            probe = _KVBucket(cap, ttl)
            probe.lru, probe.writes, probe.bytes = st.lru, st.writes, st.bytes
            blobs = self._evict(w, name, st, self._plan(probe, time.time()))

            def apply() -> None:
                st.capacity_bytes, st.ttl_s = cap, ttl
            self._cat.on_commit(apply)
        self._unlink_blobs(blobs)
        return BucketInfo(name, created, kind, cap, ttl)

    def bucket_stats(self, name: str) -> dict:
        """Counters of a bucket (first dropping expired objects of a kv bucket).

        Returns:
            ``{"kind", "capacity_bytes", "ttl_s", "bytes", "objects", "evictions",
            "expirations"}``: ``bytes``/``objects`` are the live object data;
            ``evictions``/``expirations`` count objects dropped for room / by TTL
            since this engine started (always 0 for standard buckets).

        Raises:
            NoSuchBucket: it does not exist.
        """
        info = self.head_bucket(name)
        out = {"kind": info.kind, "capacity_bytes": info.capacity_bytes, "ttl_s": info.ttl_s}
        if info.kind != "kv":
            size, count = self._cat.reader().execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM objects WHERE bucket=?", (name,)).fetchone()
            return out | {"bytes": size, "objects": count, "evictions": 0, "expirations": 0}
        blobs: list[str] = []
        with self._cat.write() as w:
            st = self._kv.get(name)
            if st is None:
                raise NoSuchBucket(f"bucket {name!r} does not exist", bucket=name)
            if st.ttl_s:
                blobs = self._evict(w, name, st, self._plan(st, time.time()))
        self._unlink_blobs(blobs)
        with self._kv_lock:
            return out | {"bytes": st.bytes, "objects": len(st.lru), "evictions": st.evictions,
                          "expirations": st.expirations}

    # kv eviction ------------------------------------------------------------
    def _plan(self, st: _KVBucket, now: float, key: str | None = None,
              need: int = 0) -> tuple[list[str], list[str]]:
        """What to drop from kv bucket ``st`` so that ``need`` more bytes fit:
        ``(expired keys, evicted keys)``. Expired objects go first (oldest write
        first), then least recently used ones; ``key`` (being written) is spared.
        Caller holds the catalog write lock, so ``st`` matches the catalog.
        """
        expired: list[str] = []
        evicted: list[str] = []
        with self._kv_lock:
            total = st.bytes + need
            if st.ttl_s:
                cutoff = now - st.ttl_s
                for k, written in st.writes.items():
                    if written > cutoff:
                        break
                    if k != key:
                        expired.append(k)
                        total -= st.lru[k][0]
            cap = st.capacity_bytes
            if cap and total > cap:
                skip = set(expired)
                skip.add(key)
                for k, (size, _) in st.lru.items():
                    if total <= cap:
                        break
                    if k not in skip:
                        evicted.append(k)
                        total -= size
        return expired, evicted

    def _evict(self, w, bucket: str, st: _KVBucket, plan: tuple[list[str], list[str]]) -> list[str]:
        """Delete the planned rows in write transaction ``w``; on commit, drop them from
        ``st`` and count them. Returns the blob ids to unlink once committed."""
        expired, evicted = plan
        if not expired and not evicted:
            return []
        with self._kv_lock:
            victims = [(k, st.lru[k][1]) for k in (*expired, *evicted)]
        w.executemany("DELETE FROM objects WHERE bucket=? AND key=? AND blob_id=?",
                      [(bucket, k, b) for k, b in victims])
        if evicted:
            self._flush_touched(w, bucket, st)  # LRU order survives a restart when it matters

        def apply() -> None:
            with self._kv_lock:
                for k, _ in victims:
                    st.drop(k)
                st.expirations += len(expired)
                st.evictions += len(evicted)
        self._cat.on_commit(apply)
        return [b for _, b in victims]

    def _flush_touched(self, w, bucket: str, st: _KVBucket) -> None:
        """Write a kv bucket's pending read times to ``objects.last_access`` (in ``w``)."""
        with self._kv_lock:
            touched, st.touched = st.touched, {}
        if touched:
            w.executemany("UPDATE objects SET last_access=? WHERE bucket=? AND key=?",
                          [(t, bucket, k) for k, t in touched.items()])

    def _unlink_blobs(self, blob_ids: list[str]) -> None:
        for b in blob_ids:
            remove_quietly(self._files.blob_path(b))

    def _expire(self, bucket: str, key: str, blob_id: str) -> None:
        """Delete one expired version found by a read (if it is still the current one)."""
        with self._cat.write() as w:
            n = w.execute("DELETE FROM objects WHERE bucket=? AND key=? AND blob_id=?",
                          (bucket, key, blob_id)).rowcount
            st = self._kv.get(bucket)
            if n and st is not None:
                def apply() -> None:
                    with self._kv_lock:
                        st.drop(key)
                        st.expirations += 1
                self._cat.on_commit(apply)
        if n:
            remove_quietly(self._files.blob_path(blob_id))

    def delete_bucket(self, name: str) -> None:
        """Delete an empty bucket.

        Raises:
            NoSuchBucket: it does not exist.
            BucketNotEmpty: it holds objects or open multipart uploads.
        """
        with self._cat.write() as w:
            self._require_bucket(w, name)
            if w.execute("SELECT 1 FROM objects WHERE bucket=? LIMIT 1", (name,)).fetchall():
                raise BucketNotEmpty(f"bucket {name!r} holds objects", bucket=name)
            if w.execute("SELECT 1 FROM uploads WHERE bucket=? LIMIT 1", (name,)).fetchall():
                raise BucketNotEmpty(f"bucket {name!r} has multipart uploads in progress", bucket=name)
            w.execute("DELETE FROM buckets WHERE name=?", (name,))
            if name in self._kv:
                self._cat.on_commit(lambda: self._kv.pop(name, None))

    def head_bucket(self, name: str) -> BucketInfo:
        """Look a bucket up.

        Raises:
            NoSuchBucket: it does not exist.
        """
        rows = self._cat.reader().execute(_SQL_BUCKET_INFO + " WHERE name=?", (name,)).fetchall()
        if not rows:
            raise NoSuchBucket(f"bucket {name!r} does not exist", bucket=name)
        return BucketInfo(*rows[0])

    def list_buckets(self) -> list[BucketInfo]:
        """All buckets, sorted by name."""
        rows = self._cat.reader().execute(_SQL_BUCKET_INFO + " ORDER BY name").fetchall()
        return [BucketInfo(*r) for r in rows]

    # objects -----------------------------------------------------------
    def begin_put(self, bucket: str, key: str, *, etag: str = "md5") -> PendingWrite:
        """Start writing an object.

        Args:
            bucket: bucket name.
            key: object key.
            etag: ``"md5"`` (S3 compatible, ~0.6 GB/s of CPU) or ``"xxh3"``
                (fast path; ETag ``x<hex xxh3-128>``, tens of GB/s).

        Returns:
            A :class:`PendingWrite`; nothing is visible until its ``commit()``.

        Raises:
            NoSuchBucket: the bucket does not exist.
            KeyTooLong: key over 1,024 UTF-8 bytes.
            InvalidArgument: empty or non-UTF-8 key, unknown ``etag`` kind.
        """
        check_key(key)
        _new_hasher(etag)
        self._require_bucket(self._cat.reader(), bucket)

        def finish(pw, tmp, etag_value, md5_digest, *, content_type, metadata, checksums, headers,
                   if_match, if_none_match):
            return self._publish_object(
                bucket, key, tmp, pw.size, etag_value,
                content_type=content_type, metadata=metadata, checksums=checksums, headers=headers,
                if_match=if_match, if_none_match=if_none_match,
            )

        return PendingWrite(self, etag, finish)

    def _publish_object(
        self, bucket: str, key: str, tmp: str, size: int, etag: str, *,
        content_type: str | None, metadata: dict[str, str] | None, checksums: dict[str, str] | None,
        headers: dict[str, str] | None = None, if_match: str | None = None,
        if_none_match: str | None = None, extra=None,
    ) -> ObjectInfo:
        """Rename a finished temp file into ``blobs/`` and commit its catalog row.

        ``extra(w)``, when given, runs inside the same transaction first (multipart
        completion uses it to check and drop the upload). ``if_match`` /
        ``if_none_match`` are checked against the current row inside the
        transaction (see :meth:`PendingWrite.commit`). In a kv bucket the same
        transaction evicts what the new version needs room for (see
        :meth:`create_bucket`); the evicted blobs are unlinked after the commit.
        """
        ct = content_type or _DEFAULT_TYPE
        md, ck, hd = _dumps(metadata), _dumps(checksums), _dumps(headers)
        blob_id = new_id()
        path = self._files.publish_blob(tmp, blob_id)
        now = time.time()
        evicted: list[str] = []
        try:
            with self._cat.write() as w:
                if extra is not None:
                    extra(w)
                self._require_bucket(w, bucket)
                old = w.execute(
                    "SELECT blob_id, etag, size FROM objects WHERE bucket=? AND key=?", (bucket, key)
                ).fetchall()
                if if_match is not None or if_none_match is not None:
                    _check_preconditions(bucket, key, old[0][1] if old else None, if_match, if_none_match)
                st = self._kv.get(bucket)
                if st is not None:
                    if st.capacity_bytes and size > st.capacity_bytes:
                        raise EntityTooLarge(
                            f"{size} bytes do not fit kv bucket {bucket!r} of {st.capacity_bytes} bytes",
                            size=size,
                        )
                    need = size - (old[0][2] if old else 0)
                    evicted = self._evict(w, bucket, st, self._plan(st, now, key, need))
                    if len(st.touched) > _FLUSH_TOUCHED:
                        self._flush_touched(w, bucket, st)

                    def added(st=st) -> None:
                        with self._kv_lock:
                            st.add(key, size, blob_id, now)
                    self._cat.on_commit(added)
                w.execute(
                    "INSERT OR REPLACE INTO objects (bucket, key, size, etag, last_modified, content_type,"
                    " metadata, checksums, blob_id, headers, last_access) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (bucket, key, size, etag, now, ct, md, ck, blob_id, hd, now),
                )
        except BaseException:
            remove_quietly(path)
            raise
        if old:
            remove_quietly(self._files.blob_path(old[0][0]))
        self._unlink_blobs(evicted)
        return ObjectInfo(bucket, key, size, etag, now, ct, dict(metadata or {}), dict(checksums or {}), blob_id, path,
                          dict(headers or {}))

    def put_object(
        self,
        bucket: str,
        key: str,
        data: bytes | bytearray | memoryview | Iterable | BinaryIO,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        checksums: dict[str, str] | None = None,
        content_md5: str | None = None,
        etag: str = "md5",
        headers: dict[str, str] | None = None,
        if_match: str | None = None,
        if_none_match: str | None = None,
    ) -> ObjectInfo:
        """Write a whole object from a buffer, an iterable of buffers or a binary file.

        Atomic: either the whole object is written, or nothing is visible.

        Args:
            data: a buffer; an iterable of buffers; or a binary file object
                (read with ``readinto`` in 8 MiB chunks into one reused buffer).
            content_type, metadata, checksums, content_md5, headers, if_match,
                if_none_match: as for :meth:`PendingWrite.commit`.
            etag: ``"md5"`` or ``"xxh3"`` (see :meth:`begin_put`).

        Returns:
            The new object's :class:`ObjectInfo`.

        Raises:
            NoSuchBucket, KeyTooLong, InvalidArgument, BadDigest, PreconditionFailed:
                see :meth:`begin_put` and :meth:`PendingWrite.commit`.
            TypeError: ``data`` is a ``str`` or not bytes-like.
        """
        pw = self.begin_put(bucket, key, etag=etag)
        with pw:
            _feed(pw, data)
            return pw.commit(
                content_type=content_type, metadata=metadata, checksums=checksums, content_md5=content_md5,
                headers=headers, if_match=if_match, if_none_match=if_none_match,
            )

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        """Look an object up (one indexed catalog read; the hot path).

        Every read path calls this, so in a kv bucket it is the "use" that
        LRU eviction orders by: the key moves to the recent end of an
        in-memory list (a dict move under a lock, no catalog write; read
        times reach the catalog at eviction passes and on close). An object
        past its bucket's TTL is deleted here and reported missing.

        Raises:
            NoSuchBucket: the bucket does not exist.
            NoSuchKey: the key does not exist (or has expired).
            InvalidArgument: the key is not valid UTF-8.
        """
        try:
            rows = self._cat.lookup_cursor().execute(_SQL_HEAD, (bucket, key)).fetchall()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"object key {key!r} is not valid UTF-8") from exc
        if rows:
            st = self._kv.get(bucket)
            if st is not None:
                row = rows[0]
                now = time.time()
                if st.ttl_s and now - row[2] >= st.ttl_s:
                    self._expire(bucket, key, row[6])
                    raise NoSuchKey(f"{bucket}/{key} does not exist (expired)", bucket=bucket, key=key)
                with self._kv_lock:
                    try:
                        st.lru.move_to_end(key)
                        st.touched[key] = now
                    except KeyError:
                        pass  # dropped since the lookup
            return self._info(bucket, key, rows[0])
        self._require_bucket(self._cat.reader(), bucket)
        raise NoSuchKey(f"{bucket}/{key} does not exist", bucket=bucket, key=key)

    def open_object(self, bucket: str, key: str) -> tuple[ObjectInfo, int]:
        """Look up the current version of an object and open its immutable data file.

        A version replaced between the lookup and the open is looked up again, so
        a reader racing overwriters gets the old or the new version, never a
        spurious NoSuchKey. The file stays readable after later overwrites or
        deletes (POSIX keeps an open file's data).

        Returns:
            ``(info, fd)``: the version's metadata and a read-only descriptor the
            caller must ``os.close``.

        Raises:
            NoSuchBucket, NoSuchKey: the bucket or key does not exist.
            InternalError: the key was replaced on every one of many attempts.
        """
        for _ in range(_READ_RETRIES):
            info = self.head_object(bucket, key)
            try:
                return info, os.open(info.path, _OPEN_READ)
            except FileNotFoundError:
                continue  # replaced between lookup and open: look it up again
        raise InternalError(f"{bucket}/{key} kept changing while being opened")

    def get_object(self, bucket: str, key: str, byte_range: ByteRequest | None = None) -> bytes:
        """Read an object (or a range) into memory. Large reads should use
        ``open(info.path)`` / :meth:`read_into` instead.

        Args:
            byte_range: ``None`` for all of it, else a :mod:`gpufeed.store` byte request.

        Returns:
            The bytes.

        Raises:
            NoSuchBucket, NoSuchKey: missing bucket or key.
            InvalidRange: the range is unsatisfiable (see :func:`gpufeed.store.resolve_range`).
        """
        info, fd = self.open_object(bucket, key)
        try:
            start, length = resolve_range(byte_range, info.size)
            data = os.pread(fd, length, start)
            if len(data) < length:  # only on reads over ~2 GiB
                parts = [data]
                got = len(data)
                while got < length:
                    more = os.pread(fd, length - got, start + got)
                    if not more:
                        raise InternalError(f"blob of {bucket}/{key} is shorter than its catalog size")
                    parts.append(more)
                    got += len(more)
                data = b"".join(parts)
            return data
        finally:
            os.close(fd)

    def read_into(self, info: ObjectInfo, buffer, offset: int = 0) -> int:
        """Read object version ``info`` from ``offset`` straight into ``buffer``.

        Args:
            info: from :meth:`head_object` (identifies one immutable version).
            buffer: writable buffer; up to ``len(buffer)`` bytes are read (``os.preadv``).
            offset: byte offset in the object.

        Returns:
            Bytes read; short only at the end of the object.

        Raises:
            NoSuchKey: that version was overwritten or deleted meanwhile.
            InvalidArgument: negative offset.
        """
        if offset < 0:
            raise InvalidArgument("offset must be >= 0")
        mv = _as_bytes_view(buffer)
        want = min(mv.nbytes, max(0, info.size - offset))
        try:
            fd = os.open(info.path, _OPEN_READ)
        except FileNotFoundError as exc:
            raise NoSuchKey(f"{info.bucket}/{info.key} (version {info.blob_id}) is gone",
                            bucket=info.bucket, key=info.key) from exc
        try:
            done = 0
            while done < want:
                n = os.preadv(fd, [mv[done:want]], offset + done)
                if n == 0:
                    break
                done += n
            return done
        finally:
            os.close(fd)

    def delete_object(self, bucket: str, key: str) -> None:
        """Delete; a missing key is not an error.

        Raises:
            NoSuchBucket: the bucket does not exist.
            KeyTooLong: key over 1,024 UTF-8 bytes (S3 refuses it rather than
                answering 204 for a key that cannot exist).
            InvalidArgument: not a ``str``, or not valid UTF-8.
        """
        try:
            n = len(key.encode("utf-8"))
        except (AttributeError, UnicodeEncodeError) as exc:
            raise InvalidArgument(f"object key {key!r} is not a valid UTF-8 str") from exc
        if n > MAX_KEY_BYTES:
            raise KeyTooLong(f"object key is {n} bytes of UTF-8; the limit is {MAX_KEY_BYTES}", size=n)
        with self._cat.write() as w:
            self._require_bucket(w, bucket)
            old = w.execute("SELECT blob_id FROM objects WHERE bucket=? AND key=?", (bucket, key)).fetchall()
            if old:
                w.execute("DELETE FROM objects WHERE bucket=? AND key=?", (bucket, key))
                st = self._kv.get(bucket)
                if st is not None:
                    def dropped() -> None:
                        with self._kv_lock:
                            st.drop(key)
                    self._cat.on_commit(dropped)
        if old:
            remove_quietly(self._files.blob_path(old[0][0]))

    def copy_object(
        self,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        *,
        metadata: dict[str, str] | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> ObjectInfo:
        """Copy (kernel-side ``copy_file_range`` into a new blob).

        ``metadata``/``content_type``/``headers`` all None keeps the source's
        (S3 ``x-amz-metadata-directive: COPY``); giving any replaces all three
        (``REPLACE``). The ETag and checksums are the source's. Copying a key
        onto itself with new metadata works.

        Raises:
            NoSuchBucket, NoSuchKey: missing source or destination bucket, missing source key.
            KeyTooLong, InvalidArgument: bad destination key.
        """
        check_key(dst_key)
        self._require_bucket(self._cat.reader(), dst_bucket)
        src, sfd = self.open_object(src_bucket, src_key)
        try:
            pw = PendingWrite(self, None, None)
            with pw:
                pw.write_from_fd(sfd, 0, src.size)
                if pw.size != src.size:
                    raise InternalError(f"blob of {src_bucket}/{src_key} is shorter than its catalog size")
        finally:
            os.close(sfd)
        if metadata is None and content_type is None and headers is None:
            md, ct, hd = src.metadata, src.content_type, src.headers
        else:
            md, ct, hd = metadata or {}, content_type, headers or {}

        def finish(pw, tmp, _etag, _md5, **_kw):
            return self._publish_object(
                dst_bucket, dst_key, tmp, pw.size, src.etag,
                content_type=ct, metadata=md, checksums=src.checksums, headers=hd,
            )

        pw._finish = finish
        return pw.commit()

    def list_objects(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        continuation_token: str | None = None,
        max_keys: int = 1000,
    ) -> ListResult:
        """List keys in UTF-8 byte order (S3 ListObjectsV2 semantics).

        With a delimiter, keys whose remainder after ``prefix`` contains it are
        rolled up into one common prefix (up to and including the first
        delimiter); each common prefix counts as one entry towards
        ``max_keys``, and the listing seeks past all keys under it instead of
        reading them. One page is read in one catalog snapshot.

        Args:
            bucket: bucket name.
            prefix: only keys starting with this.
            delimiter: any non-empty string rolls keys up; ``""`` for none.
            start_after: only entries after this one (also the v1 ``marker``).
                When it is itself a common prefix under ``delimiter`` (a v1
                ``NextMarker`` such as ``"b/"``), every key under it is skipped
                too, so the prefix is not rolled up and returned again.
            continuation_token: ``next_token`` of the previous page; takes
                precedence over ``start_after``.
            max_keys: page size, 0..1000 (larger values are clipped to 1000; 0
                returns an empty, non-truncated page).

        Returns:
            One :class:`ListResult` page.

        Raises:
            NoSuchBucket: the bucket does not exist.
            InvalidArgument: negative ``max_keys``, a token we did not make,
                non-UTF-8 arguments.

        Source: "ListObjectsV2", Amazon S3 API Reference,
        https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html
        """
        check_text(prefix, "prefix")
        check_text(delimiter, "delimiter")
        check_text(start_after, "start_after")
        if not isinstance(max_keys, int) or max_keys < 0:
            raise InvalidArgument(f"max_keys must be an int >= 0, not {max_keys!r}")
        max_keys = min(max_keys, 1000)
        # Position: (value, inclusive); None means "past the end".
        pos: tuple[str, bool] | None
        if continuation_token is not None:
            kind, value = decode_token(continuation_token)
            if kind == "k":
                pos = (value, False)
            else:
                s = successor(value)
                pos = None if s is None else (s, True)
        elif start_after:
            pos = (start_after, False)
            if delimiter and start_after.startswith(prefix):
                i = start_after.find(delimiter, len(prefix))
                if i >= 0 and i + len(delimiter) == len(start_after):
                    s = successor(start_after)  # past every key that rolls up into it
                    pos = None if s is None else (s, True)
        else:
            pos = (prefix, True)
        if pos is not None and pos[0] < prefix:
            pos = (prefix, True)
        hi = successor(prefix) if prefix else None
        plen, dlen = len(prefix), len(delimiter)
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        last: tuple[str, str] | None = None
        truncated = False
        st = self._kv.get(bucket)
        cutoff = time.time() - st.ttl_s if st is not None and st.ttl_s else None
        with self._cat.snapshot() as c:
            self._require_bucket(c, bucket)
            if max_keys == 0:
                return ListResult([], [], False)
            while pos is not None:
                need = max_keys - len(objects) - len(prefixes)
                if need <= 0:
                    truncated = bool(_scan(c, bucket, pos, hi, 1, cols="key").fetchall())
                    break
                cur = _scan(c, bucket, pos, hi, need, cols=_OBJ_COLS)
                seen = 0
                try:
                    for row in cur:
                        seen += 1
                        key = row[0]
                        if cutoff is not None and row[3] <= cutoff:
                            last = ("k", key)  # expired: invisible (deleted at the next eviction pass)
                            continue
                        if dlen:
                            i = key.find(delimiter, plen)
                            if i >= 0:
                                cp = key[: i + dlen]
                                prefixes.append(cp)
                                last = ("p", cp)
                                s = successor(cp)
                                pos = None if s is None else (s, True)
                                break
                        objects.append(self._info(bucket, key, row[1:]))
                        last = ("k", key)
                    else:
                        if seen < need:
                            pos = None  # exhausted
                        else:
                            pos = (last[1], False)
                finally:
                    cur.close()
        next_token = next_marker = None
        if truncated and last is not None:
            next_token = encode_token(*last)
            next_marker = last[1]
        return ListResult(objects, prefixes, truncated, next_token, next_marker)

    # multipart ---------------------------------------------------------
    def create_multipart_upload(
        self, bucket: str, key: str, *, content_type: str | None = None,
        metadata: dict[str, str] | None = None, headers: dict[str, str] | None = None,
    ) -> UploadInfo:
        """Start a multipart upload.

        ``content_type``, ``metadata`` and ``headers`` (as for
        :meth:`PendingWrite.commit`) are those of the object it completes into.

        Returns:
            The upload (its ``upload_id`` is 32 hex digits).

        Raises:
            NoSuchBucket, KeyTooLong, InvalidArgument: as for :meth:`begin_put`.
        """
        check_key(key)
        ct = content_type or _DEFAULT_TYPE
        md, hd = _dumps(metadata), _dumps(headers)
        self._require_bucket(self._cat.reader(), bucket)
        upload_id = new_id()
        self._files.new_upload_dir(upload_id)
        now = time.time()
        try:
            with self._cat.write() as w:
                self._require_bucket(w, bucket)
                w.execute(
                    "INSERT INTO uploads (upload_id, bucket, key, initiated, content_type, metadata, headers)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (upload_id, bucket, key, now, ct, md, hd),
                )
        except BaseException:
            self._files.remove_upload_dir(upload_id)
            raise
        return UploadInfo(bucket, key, upload_id, now, ct, dict(metadata or {}), dict(headers or {}))

    def _get_upload(self, conn, bucket: str, key: str, upload_id: str):
        if not isinstance(upload_id, str) or not _UPLOAD_ID_RE.fullmatch(upload_id):
            raise NoSuchUpload(f"no upload {upload_id!r}", upload_id=upload_id)
        rows = conn.execute(
            "SELECT initiated, content_type, metadata, headers FROM uploads"
            " WHERE upload_id=? AND bucket=? AND key=?",
            (upload_id, bucket, key),
        ).fetchall()
        if not rows:
            raise NoSuchUpload(f"no upload {upload_id!r} for {bucket}/{key}", upload_id=upload_id)
        return rows[0]

    def begin_part(self, bucket: str, key: str, upload_id: str, part_number: int) -> PendingWrite:
        """Like :meth:`begin_put` for a part; ``commit()`` returns a :class:`PartInfo`.

        A part's ETag is always the hex MD5 of its bytes. Uploading a part
        number again replaces that part. ``commit(checksums=...)`` stores the
        part's ``x-amz-checksum-*`` values (the caller has checked them);
        completion combines them (see :meth:`complete_multipart_upload`).

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
            InvalidArgument: part number outside 1..10000.
        """
        if not isinstance(part_number, int) or not 1 <= part_number <= MAX_PARTS:
            raise InvalidArgument(f"part number must be 1..{MAX_PARTS}, not {part_number!r}")
        self._get_upload(self._cat.reader(), bucket, key, upload_id)

        def finish(pw, tmp, etag, md5_digest, *, checksums, **_kw):
            return self._publish_part(bucket, key, upload_id, part_number, tmp, pw.size, etag, checksums)

        return PendingWrite(self, "md5", finish)

    def _publish_part(self, bucket, key, upload_id, part_number, tmp, size, etag, checksums) -> PartInfo:
        ck = _dumps(checksums)
        file = f"{part_number:05d}.{new_id()}"
        try:
            path = self._files.publish_part(tmp, upload_id, file)
        except FileNotFoundError as exc:
            raise NoSuchUpload(f"upload {upload_id} was completed or aborted", upload_id=upload_id) from exc
        now = time.time()
        try:
            with self._cat.write() as w:
                self._get_upload(w, bucket, key, upload_id)
                old = w.execute(
                    "SELECT file FROM parts WHERE upload_id=? AND part_number=?", (upload_id, part_number)
                ).fetchall()
                w.execute(
                    "INSERT OR REPLACE INTO parts (upload_id, part_number, etag, size, last_modified, file,"
                    " checksums) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (upload_id, part_number, etag, size, now, file, ck),
                )
        except BaseException:
            remove_quietly(path)
            raise
        if old:
            remove_quietly(self._files.part_path(upload_id, old[0][0]))
        return PartInfo(part_number, etag, size, now, dict(checksums or {}))

    def upload_part(self, bucket: str, key: str, upload_id: str, part_number: int, data,
                    *, content_md5: str | None = None, checksums: dict[str, str] | None = None) -> PartInfo:
        """Upload one part from a buffer, an iterable of buffers or a binary file.

        ``checksums``: the part's ``{"crc32": b64, ...}``, stored as given.

        Raises:
            NoSuchUpload, InvalidArgument: as for :meth:`begin_part`.
            BadDigest: ``content_md5`` does not match.
        """
        pw = self.begin_part(bucket, key, upload_id, part_number)
        with pw:
            _feed(pw, data)
            return pw.commit(content_md5=content_md5, checksums=checksums)

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        """The parts uploaded so far, by part number.

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
        """
        with self._cat.snapshot() as c:
            self._get_upload(c, bucket, key, upload_id)
            rows = c.execute(
                "SELECT part_number, etag, size, last_modified, checksums FROM parts"
                " WHERE upload_id=? ORDER BY part_number",
                (upload_id,),
            ).fetchall()
        return [PartInfo(n, e, sz, lm, _loads(ck)) for n, e, sz, lm, ck in rows]

    def complete_multipart_upload(
        self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]], *,
        if_match: str | None = None, if_none_match: str | None = None,
    ) -> ObjectInfo:
        """Join parts ``[(part_number, etag), ...]`` into the object.

        The object file is built by kernel copies (``copy_file_range``) of the
        part files, then published like any put; the upload and its part files
        are then removed. The ETag is ``<hex md5 of the concatenated binary
        part MD5s>-N``. Part ETags may be given with or without quotes.

        Checksums: for each algorithm of :data:`gpufeed.checksums.COMPOSITE_ALGORITHMS`
        that every chosen part was uploaded with, the object gets S3's
        composite checksum ``<b64 of H(part digests)>-N`` (S3 "checksum of
        checksums"); algorithms only some parts have are dropped.
        ``if_match`` / ``if_none_match``: as for :meth:`PendingWrite.commit`.

        Returns:
            The new object's :class:`ObjectInfo`.

        Raises:
            NoSuchUpload: no such upload (or it completed/aborted meanwhile).
            MalformedXML: ``parts`` is empty.
            InvalidPart: an unknown part, or an ETag that does not match.
            InvalidPartOrder: part numbers not strictly ascending.
            EntityTooSmall: a part other than the last is under 5 MiB.
            PreconditionFailed, NoSuchKey: a condition does not hold (the
                upload stays open, as in S3).

        Source: "CompleteMultipartUpload", Amazon S3 API Reference,
        https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html
        """
        if not parts:
            raise MalformedXML("CompleteMultipartUpload needs at least one part")
        with self._cat.snapshot() as c:
            _, ct, md, hd = self._get_upload(c, bucket, key, upload_id)
            have = {
                n: (e, s, f, ck)
                for n, e, s, f, ck in c.execute(
                    "SELECT part_number, etag, size, file, checksums FROM parts WHERE upload_id=?", (upload_id,)
                )
            }
        prev = 0
        chosen: list[tuple[int, str, int, str]] = []
        part_checksums: list[dict[str, str]] = []
        for number, given in parts:
            if not isinstance(number, int) or number <= prev:
                raise InvalidPartOrder(f"part numbers must ascend; {number!r} follows {prev}")
            prev = number
            etag = given.strip().strip('"') if isinstance(given, str) else ""
            found = have.get(number)
            if found is None or found[0] != etag:
                raise InvalidPart(f"part {number} with ETag {given!r} was not uploaded", part_number=number)
            chosen.append((number, found[0], found[1], found[2]))
            part_checksums.append(_loads(found[3]))
        for number, _, size, _ in chosen[:-1]:
            if size < MIN_PART_BYTES:
                raise EntityTooSmall(
                    f"part {number} is {size} bytes; all but the last must be >= {MIN_PART_BYTES}",
                    part_number=number, size=size,
                )
        joined = hashlib.md5(b"".join(bytes.fromhex(e) for _, e, _, _ in chosen)).hexdigest()
        etag = f"{joined}-{len(chosen)}"
        # The part rows read above are the ones committed with (drop_upload checks
        # each part's file is unchanged), so these checksums describe its bytes.
        composite = {
            alg: composite_checksum(alg, [ck[alg] for ck in part_checksums])
            for alg in COMPOSITE_ALGORITHMS
            if all(alg in ck for ck in part_checksums)
        }

        pw = PendingWrite(self, None, None)
        with pw:
            for number, _, size, file in chosen:
                try:
                    sfd = os.open(self._files.part_path(upload_id, file), _OPEN_READ)
                except FileNotFoundError as exc:
                    raise InvalidPart(f"part {number} was replaced or removed meanwhile",
                                      part_number=number) from exc
                try:
                    if pw.write_from_fd(sfd, 0, size) != size:
                        raise InternalError(f"part file {file} of upload {upload_id} is short")
                finally:
                    os.close(sfd)
            files = {number: file for number, _, _, file in chosen}

            def drop_upload(w) -> None:
                self._get_upload(w, bucket, key, upload_id)
                for number, file in files.items():
                    row = w.execute(
                        "SELECT file FROM parts WHERE upload_id=? AND part_number=?", (upload_id, number)
                    ).fetchall()
                    if not row or row[0][0] != file:
                        raise InvalidPart(f"part {number} was replaced meanwhile", part_number=number)
                w.execute("DELETE FROM parts WHERE upload_id=?", (upload_id,))
                w.execute("DELETE FROM uploads WHERE upload_id=?", (upload_id,))

            def finish(pw, tmp, _etag, _md5, **_kw):
                return self._publish_object(
                    bucket, key, tmp, pw.size, etag,
                    content_type=ct, metadata=_loads(md), checksums=composite, headers=_loads(hd),
                    if_match=if_match, if_none_match=if_none_match, extra=drop_upload,
                )

            pw._finish = finish
            info = pw.commit()
        self._files.remove_upload_dir(upload_id)
        return info

    def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        """Drop an upload and its parts.

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
        """
        with self._cat.write() as w:
            self._get_upload(w, bucket, key, upload_id)
            w.execute("DELETE FROM parts WHERE upload_id=?", (upload_id,))
            w.execute("DELETE FROM uploads WHERE upload_id=?", (upload_id,))
        self._files.remove_upload_dir(upload_id)

    def list_multipart_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        """Uploads in progress whose key starts with ``prefix``, by key then start time.

        Raises:
            NoSuchBucket: the bucket does not exist.
        """
        check_text(prefix, "prefix")
        with self._cat.snapshot() as c:
            self._require_bucket(c, bucket)
            rows = c.execute(
                "SELECT key, upload_id, initiated, content_type, metadata, headers FROM uploads"
                " WHERE bucket=? ORDER BY key, initiated",
                (bucket,),
            ).fetchall()
        return [
            UploadInfo(bucket, k, u, i, ct, _loads(md), _loads(hd))
            for k, u, i, ct, md, hd in rows if k.startswith(prefix)
        ]


_SCAN_SQL: dict[tuple[bool, bool, str], str] = {}


def _scan(conn, bucket: str, pos: tuple[str, bool], hi: str | None, limit: int, *, cols: str):
    """Cursor over keys of ``bucket`` from ``pos`` (value, inclusive) below ``hi``, in order."""
    sig = (pos[1], hi is None, cols)
    sql = _SCAN_SQL.get(sig)
    if sql is None:
        lo = "key >= ?" if pos[1] else "key > ?"
        up = "" if hi is None else " AND key < ?"
        sql = _SCAN_SQL[sig] = f"SELECT {cols} FROM objects WHERE bucket=? AND {lo}{up} ORDER BY key LIMIT ?"
    args = (bucket, pos[0], limit) if hi is None else (bucket, pos[0], hi, limit)
    return conn.execute(sql, args)


def _feed(pw: PendingWrite, data) -> None:
    """Write ``data`` (buffer, binary file, or iterable of buffers) into ``pw``."""
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
