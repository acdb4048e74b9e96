"""The storage engine: buckets and objects on a local data folder, catalog in SQLite.

No network here; the S3 front (``gpufeed.s3``) and the fast path
(``gpufeed.wire``) both call this.

On-disk layout under ``data_dir``::

    catalog.sqlite3          buckets, objects, uploads, parts (WAL mode)
    blobs/ab/cd/<blob_id>    one immutable file per object version (blob_id = uuid4 hex)
    uploads/<upload_id>/<part_number:05d>   multipart parts
    tmp/                     files being written; emptied on start

Write protocol (atomic, durable): data goes to a file in ``tmp/``, is fsynced,
renamed into ``blobs/``, the directory is fsynced, then the catalog row is
committed (``synchronous=FULL``). Only the commit makes an object visible. On
start, ``tmp/`` is emptied and blob files that no catalog row references are
deleted, so a crash at any point leaves no visible partial object and no
leaked file. Object keys never become file names, so no key can escape
the data folder.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from ..store import ByteRequest
from .types import BucketInfo, ListResult, ObjectInfo, PartInfo, UploadInfo

__all__ = ["Engine", "PendingWrite"]

#: Largest key S3 accepts, bytes of UTF-8.
MAX_KEY_BYTES = 1024
#: Smallest part other than the last one (S3: 5 MiB).
MIN_PART_BYTES = 5 << 20


class PendingWrite:
    """An object (or part) being written; invisible until :meth:`commit`.

    Obtain from :meth:`Engine.begin_put`. Use as a context manager: leaving the
    block with an exception aborts (the temp file is removed).

    Attributes:
        size: bytes written so far.
    """

    def write(self, data) -> int:
        """Append a buffer (bytes, memoryview, mmap slice); returns bytes written."""
        raise NotImplementedError

    def write_from_fd(self, fd: int, offset: int, length: int) -> int:
        """Append ``length`` bytes read from file descriptor ``fd`` at ``offset``
        (kernel-side copy where possible). Returns bytes written."""
        raise NotImplementedError

    def fileno(self) -> int:
        """The temp file's descriptor, for callers that write with ``os.pwritev``
        themselves; they must then call :meth:`wrote`."""
        raise NotImplementedError

    def wrote(self, nbytes: int, data=None) -> None:
        """Account ``nbytes`` written directly through :meth:`fileno`; pass the
        same ``data`` buffer when the ETag hash must see it."""
        raise NotImplementedError

    def commit(
        self,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        checksums: dict[str, str] | None = None,
        content_md5: str | None = None,
        expected_size: int | None = None,
    ) -> ObjectInfo:
        """Make the object visible atomically (replacing any previous version).

        Args:
            content_md5: base64 MD5 the client sent (``Content-MD5``); checked.
            expected_size: when given, the bytes written must equal it.

        Raises:
            BadDigest: ``content_md5`` does not match the data.
            IncompleteBody: fewer bytes than ``expected_size`` arrived.
            NoSuchBucket: the bucket was deleted meanwhile.
        """
        raise NotImplementedError

    def abort(self) -> None:
        """Discard the data; idempotent."""
        raise NotImplementedError

    def __enter__(self) -> "PendingWrite":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


class Engine:
    """A storage node's engine over ``data_dir``. Thread-safe.

    Args:
        data_dir: folder for catalog and data (created if missing).
        fsync: fsync data, directories and catalog before a write returns.

    All methods raise the typed errors of :mod:`gpufeed.errors`.
    """

    def __init__(self, data_dir: str | Path, *, fsync: bool = True) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # buckets -----------------------------------------------------------
    def create_bucket(self, name: str) -> BucketInfo:
        """Raises InvalidBucketName (S3 naming rules), BucketAlreadyOwnedByYou."""
        raise NotImplementedError

    def delete_bucket(self, name: str) -> None:
        """Raises NoSuchBucket, BucketNotEmpty (objects or open multipart uploads)."""
        raise NotImplementedError

    def head_bucket(self, name: str) -> BucketInfo:
        """Raises NoSuchBucket."""
        raise NotImplementedError

    def list_buckets(self) -> list[BucketInfo]:
        raise NotImplementedError

    # objects -----------------------------------------------------------
    def begin_put(self, bucket: str, key: str, *, etag: str = "md5") -> PendingWrite:
        """Start writing an object.

        Args:
            etag: ``"md5"`` (S3 compatible, ~0.6 GB/s of CPU) or ``"xxh3"``
                (fast path; ETag ``x<hex xxh3-128>``).

        Raises:
            NoSuchBucket, KeyTooLong (> 1,024 UTF-8 bytes), InvalidArgument (empty key).
        """
        raise NotImplementedError

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
    ) -> ObjectInfo:
        """Write a whole object from a buffer, an iterable of buffers or a binary file."""
        raise NotImplementedError

    def head_object(self, bucket: str, key: str) -> ObjectInfo:
        """Raises NoSuchBucket, NoSuchKey."""
        raise NotImplementedError

    def get_object(self, bucket: str, key: str, byte_range: ByteRequest | None = None) -> bytes:
        """Read an object (or a range) into memory. Large reads should use
        ``open(info.path)`` / :meth:`read_into` instead.

        Raises NoSuchBucket, NoSuchKey, InvalidRange."""
        raise NotImplementedError

    def read_into(self, info: ObjectInfo, buffer, offset: int = 0) -> int:
        """Read ``len(buffer)`` bytes of the object version ``info`` starting at
        ``offset`` straight into ``buffer`` (writable buffer). Returns bytes read
        (short only at end of object). Raises NoSuchKey if that version is gone."""
        raise NotImplementedError

    def delete_object(self, bucket: str, key: str) -> None:
        """Delete; a missing key is not an error. Raises NoSuchBucket."""
        raise NotImplementedError

    def copy_object(
        self,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        *,
        metadata: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """Copy (kernel-side). ``metadata``/``content_type`` None keeps the source's
        (S3 ``x-amz-metadata-directive: COPY``)."""
        raise NotImplementedError

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
        """List keys in UTF-8 byte order (S3 ListObjectsV2 semantics; ``start_after``
        is also the v1 ``marker``). Raises NoSuchBucket, InvalidArgument (bad token)."""
        raise NotImplementedError

    # multipart ---------------------------------------------------------
    def create_multipart_upload(
        self, bucket: str, key: str, *, content_type: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> UploadInfo:
        raise NotImplementedError

    def begin_part(self, bucket: str, key: str, upload_id: str, part_number: int) -> PendingWrite:
        """Like :meth:`begin_put` for a part; ``commit()`` returns a PartInfo.
        Raises NoSuchUpload, InvalidArgument (part number outside 1..10000)."""
        raise NotImplementedError

    def upload_part(self, bucket: str, key: str, upload_id: str, part_number: int, data,
                    *, content_md5: str | None = None) -> PartInfo:
        raise NotImplementedError

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        raise NotImplementedError

    def complete_multipart_upload(
        self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> ObjectInfo:
        """Join parts ``[(part_number, etag), ...]`` into the object; ETag
        ``<md5 of the binary part md5s>-N``.

        Raises NoSuchUpload, InvalidPart (unknown part or ETag mismatch),
        InvalidPartOrder (not ascending), EntityTooSmall (a non-last part < 5 MiB).
        """
        raise NotImplementedError

    def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        raise NotImplementedError

    def list_multipart_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        raise NotImplementedError
