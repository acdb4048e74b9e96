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
and copy, and a point lookup in microseconds.

The engine is split by concern; this module holds :class:`Engine`, the API
the fronts call, which delegates to:

- :mod:`.catalog`: the interface to the metadata store, every operation the
  engine performs; :mod:`._sqlite` implements it over SQLite.
- :mod:`._blobs`: data files, renames, fsyncs, the start-up sweep.
- :mod:`._writes`: the write path: :class:`PendingWrite` (temp file, ETag
  hashing) and the object commit (publish the blob, commit its row).
- :mod:`._kvpolicy`: capacity, LRU and TTL of kv buckets, as hooks the
  engine calls on read, commit and delete.
- :mod:`._multipart`: uploads, parts and their completion.
- :mod:`._listing`: paging through keys.
- :mod:`._names`: S3 naming rules, key-space arithmetic.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from ..errors import (
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    InternalError,
    InvalidArgument,
    KeyTooLong,
    NoSuchKey,
)
from ..store import ByteRequest, resolve_range
from ._blobs import BlobFiles
from ._kvpolicy import KVBucketPolicy, check_policy
from ._listing import read_page, start_position
from ._multipart import MAX_PARTS, MIN_PART_BYTES, Multipart
from ._names import MAX_KEY_BYTES, check_bucket_name, check_key, check_text
from ._openfiles import ObjectHandle
from ._sqlite import SqliteCatalog
from ._writes import PendingWrite, WritePath, as_bytes_view, check_hash_kind, feed
from .catalog import Catalog, require_bucket
from .types import BucketInfo, ListResult, ObjectInfo, PartInfo, UploadInfo

__all__ = ["Engine", "PendingWrite", "MAX_KEY_BYTES", "MIN_PART_BYTES", "MAX_PARTS"]

_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC
_READ_RETRIES = 64  # a version replaced between lookup and open is looked up again this often


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
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise InternalError(f"{self.data_dir} is in use by another Engine") from exc
        try:
            self._files = BlobFiles(self.data_dir, fsync=fsync)
            # Every metadata operation below goes through the Catalog interface.
            self._cat: Catalog = SqliteCatalog(str(self.data_dir / "catalog.sqlite3"), fsync=fsync,
                                               blob_path=self._files.blob_path)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._closed = False
        #: What the start-up sweep removed: ``{"tmp": n, "blobs": n, "uploads": n, "parts": n}``.
        self.recovered = self._recover()
        self._kv = KVBucketPolicy(self._cat, self._files)
        self._writes = WritePath(self._files, self._cat, self._kv)
        self._multipart = Multipart(self._cat, self._files, self._writes)

    def _recover(self) -> dict[str, int]:
        live = self._cat.live_files()
        return self._files.sweep(live.blobs, live.parts)

    def close(self) -> None:
        """Close the catalog connections, stop helper threads, release ``data_dir``; idempotent.

        Writes still pending are not committed; their temp files are removed at the next start.
        """
        if self._closed:
            return
        self._closed = True
        self._kv.flush()
        self._cat.close()
        self._writes.close()
        self._files.open_files.close()
        os.close(self._lock_fd)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

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
        capacity_bytes, ttl_s = check_policy(kind, capacity_bytes, ttl_s)
        info = BucketInfo(name, time.time(), kind, capacity_bytes, ttl_s)
        with self._cat.write() as w:
            if w.bucket(name) is not None:
                raise BucketAlreadyOwnedByYou(f"bucket {name!r} exists", bucket=name)
            w.insert_bucket(info)
            self._kv.on_create_bucket(w, info)
        return info

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
            b = require_bucket(w, name)
            if b.kind != "kv":
                raise InvalidArgument(f"bucket {name!r} is {b.kind!r}; only kv buckets have an eviction policy")
            cap, ttl = check_policy(b.kind, b.capacity_bytes if capacity_bytes is None else capacity_bytes,
                                    b.ttl_s if ttl_s is None else ttl_s)
            blobs = self._kv.set_limits(w, name, cap, ttl)
        self._files.remove_blobs(blobs)
        return BucketInfo(name, b.created, b.kind, cap, ttl)

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
            size, count = self._cat.bucket_usage(name)
            return out | {"bytes": size, "objects": count, "evictions": 0, "expirations": 0}
        return out | self._kv.stats(name)

    def delete_bucket(self, name: str) -> None:
        """Delete an empty bucket.

        Raises:
            NoSuchBucket: it does not exist.
            BucketNotEmpty: it holds objects or open multipart uploads.
        """
        with self._cat.write() as w:
            require_bucket(w, name)
            if w.bucket_has_objects(name):
                raise BucketNotEmpty(f"bucket {name!r} holds objects", bucket=name)
            if w.bucket_has_uploads(name):
                raise BucketNotEmpty(f"bucket {name!r} has multipart uploads in progress", bucket=name)
            w.delete_bucket(name)
            self._kv.on_delete_bucket(w, name)

    def head_bucket(self, name: str) -> BucketInfo:
        """Look a bucket up.

        Raises:
            NoSuchBucket: it does not exist.
        """
        return require_bucket(self._cat, name)

    def list_buckets(self) -> list[BucketInfo]:
        """All buckets, sorted by name."""
        return self._cat.buckets()

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
        check_hash_kind(etag)
        require_bucket(self._cat, bucket)

        def finish(pw, tmp, etag_value, md5_digest, *, content_type, metadata, checksums, headers,
                   if_match, if_none_match):
            return self._writes.publish_object(
                bucket, key, tmp, pw.size, etag_value,
                content_type=content_type, metadata=metadata, checksums=checksums, headers=headers,
                if_match=if_match, if_none_match=if_none_match,
            )

        return self._writes.begin(etag, finish)

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
            feed(pw, data)
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
        info = self._cat.object(bucket, key)
        if info is not None:
            if self._kv.on_read(info):
                return info
            raise NoSuchKey(f"{bucket}/{key} does not exist (expired)", bucket=bucket, key=key)
        require_bucket(self._cat, bucket)
        raise NoSuchKey(f"{bucket}/{key} does not exist", bucket=bucket, key=key)

    def open_version(self, bucket: str, key: str) -> ObjectHandle:
        """Look up the current version of an object and take a shared, cached
        descriptor of its data file (one catalog lookup; the open is skipped when
        another reader has the version open). A version replaced between the
        lookup and the open is looked up again.

        Returns:
            An :class:`ObjectHandle` the caller MUST close (``with`` works). The
            descriptor stays valid until then, across overwrites and deletes;
            the old version's space returns when its last handle is closed.

        Raises:
            NoSuchBucket, NoSuchKey: the bucket or key does not exist.
            InternalError: the key was replaced on every one of many attempts.
        """
        files = self._files.open_files
        for _ in range(_READ_RETRIES):
            info = self.head_object(bucket, key)
            try:
                return ObjectHandle(info, files.acquire(info.blob_id, info.path), files)
            except FileNotFoundError:
                continue  # replaced between lookup and open: look it up again
        raise InternalError(f"{bucket}/{key} kept changing while being opened")

    def open_files(self) -> int:
        """Data-file descriptors the engine holds open now (cached or in use)."""
        return self._files.open_files.open_count()

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
        mv = as_bytes_view(buffer)
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
            require_bucket(w, bucket)
            old = w.object(bucket, key)
            if old is not None:
                w.delete_object(bucket, key)
                self._kv.on_delete(w, bucket, key)
        if old is not None:
            self._files.remove_blobs([old.blob_id])

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
        require_bucket(self._cat, dst_bucket)
        src, sfd = self.open_object(src_bucket, src_key)
        ct: str | None
        if metadata is None and content_type is None and headers is None:
            md, ct, hd = src.metadata, src.content_type, src.headers
        else:
            md, ct, hd = metadata or {}, content_type, headers or {}

        def finish(pw, tmp, _etag, _md5, **_kw):
            return self._writes.publish_object(
                dst_bucket, dst_key, tmp, pw.size, src.etag,
                content_type=ct, metadata=md, checksums=src.checksums, headers=hd,
            )

        try:
            pw = self._writes.begin(None, finish)
            with pw:
                pw.write_from_fd(sfd, 0, src.size)
                if pw.size != src.size:
                    raise InternalError(f"blob of {src_bucket}/{src_key} is shorter than its catalog size")
        finally:
            os.close(sfd)
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
        pos = start_position(prefix, delimiter, start_after, continuation_token)
        hidden_before = self._kv.hidden_before(bucket, time.time())
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            if max_keys == 0:
                return ListResult([], [], False)
            return read_page(c, bucket, pos, prefix=prefix, delimiter=delimiter, max_keys=max_keys,
                             hidden_before=hidden_before)

    # multipart (see ._multipart) ----------------------------------------------
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
        return self._multipart.create(bucket, key, content_type, metadata, headers)

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
        return self._multipart.begin_part(bucket, key, upload_id, part_number)

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
            feed(pw, data)
            return pw.commit(content_md5=content_md5, checksums=checksums)

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        """The parts uploaded so far, by part number.

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
        """
        return self._multipart.list_parts(bucket, key, upload_id)

    def complete_multipart_upload(
        self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]], *,
        if_match: str | None = None, if_none_match: str | None = None,
    ) -> ObjectInfo:
        """Join parts ``[(part_number, etag), ...]`` into the object.

        The object file is built by kernel copies (``copy_file_range``) of the
        part files, then published like any put; the upload and its part files
        are then removed. The ETag is ``<hex md5 of the concatenated binary
        part MD5s>-N``. Part ETags may be given with or without quotes.

        Checksums: for each algorithm every chosen part was uploaded with, the
        object gets S3's composite checksum ``<b64 of H(part digests)>-N``
        (S3 "checksum of checksums") or, for the CRCs of an upload whose
        headers name the ``FULL_OBJECT`` type under
        :data:`gpufeed.checksums.UPLOAD_CHECKSUM_TYPE` (and always for
        CRC64NVME), the CRC of the whole object combined from the part CRCs
        (:func:`gpufeed.checksums.multipart_checksums`); algorithms only some
        parts have are dropped.
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
        return self._multipart.complete(bucket, key, upload_id, parts, if_match=if_match,
                                        if_none_match=if_none_match)

    def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        """Drop an upload and its parts.

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
        """
        self._multipart.abort(bucket, key, upload_id)

    def list_multipart_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        """Uploads in progress whose key starts with ``prefix``, by key then start time.

        Raises:
            NoSuchBucket: the bucket does not exist.
        """
        return self._multipart.list_uploads(bucket, prefix)
