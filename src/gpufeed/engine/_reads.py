"""The read side of :class:`~gpufeed.engine.Engine`: open a version's data file
(shared, cached descriptors), read whole objects and ranges into memory or into
a caller's buffer.

A mixin so that ``Engine`` keeps one public API while its module stays one
concern: everything here needs only ``head_object`` (the catalog lookup) and
the data folder.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import InternalError, InvalidArgument, NoSuchKey
from ..store import ByteRequest, resolve_range
from ._blobs import BlobFiles
from ._openfiles import ObjectHandle
from ._writes import as_bytes_view
from .types import ObjectInfo

__all__ = ["ObjectReads"]

_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC
_READ_RETRIES = 64  # a version replaced between lookup and open is looked up again this often


class ObjectReads:
    """Reads of object versions, mixed into :class:`~gpufeed.engine.Engine`."""

    _files: BlobFiles
    if TYPE_CHECKING:
        def head_object(self, bucket: str, key: str, version_id: str | None = None, *,
                        snapshot: str | None = None) -> ObjectInfo:
            """Engine's catalog lookup (:class:`~gpufeed.engine._versioning.VersionedObjects`)."""

    def open_info(self, info: ObjectInfo) -> ObjectHandle:
        """Take a shared, cached descriptor of the data of version ``info`` (the
        one place a looked-up version becomes readable data).

        Returns:
            An :class:`ObjectHandle` the caller MUST close.

        Raises:
            FileNotFoundError: its data is gone (the version was replaced and freed).
        """
        files = self._files.open_files
        return ObjectHandle(info, files.acquire(info.blob_id, info.path), files)

    def open_version(self, bucket: str, key: str, version_id: str | None = None, *,
                     snapshot: str | None = None) -> ObjectHandle:
        """Look up the current version of an object (or the version
        ``version_id``, or the one snapshot ``snapshot`` recorded, see
        :meth:`head_object`) and take a shared, cached
        descriptor of its data file (one catalog lookup; the open is skipped when
        another reader has the version open). A version replaced between the
        lookup and the open is looked up again.

        Returns:
            An :class:`ObjectHandle` the caller MUST close (``with`` works). The
            descriptor stays valid until then, across overwrites and deletes;
            the old version's space returns when its last handle is closed.

        Raises:
            NoSuchBucket, NoSuchKey: the bucket or key does not exist.
            NoSuchVersion, MethodNotAllowed, InvalidArgument: a version id as
                :meth:`head_object` refuses.
            InternalError: the key was replaced on every one of many attempts.
        """
        for _ in range(_READ_RETRIES):
            info = self.head_object(bucket, key, version_id, snapshot=snapshot)
            try:
                return self.open_info(info)
            except FileNotFoundError:
                continue  # replaced between lookup and open: look it up again
        raise InternalError(f"{bucket}/{key} kept changing while being opened")

    def open_files(self) -> int:
        """Data-file descriptors the engine holds open now (cached or in use)."""
        return self._files.open_files.open_count()

    def open_object(self, bucket: str, key: str, version_id: str | None = None, *,
                    snapshot: str | None = None) -> tuple[ObjectInfo, int]:
        """Look up the current version of an object (or the version
        ``version_id``, or the one snapshot ``snapshot`` recorded) and open its
        immutable data file.

        A version replaced between the lookup and the open is looked up again, so
        a reader racing overwriters gets the old or the new version, never a
        spurious NoSuchKey. The file stays readable after later overwrites or
        deletes (POSIX keeps an open file's data).

        Returns:
            ``(info, fd)``: the version's metadata and a read-only descriptor the
            caller must ``os.close``.

        Raises:
            NoSuchBucket, NoSuchKey: the bucket or key does not exist.
            NoSuchVersion, MethodNotAllowed, InvalidArgument: as for :meth:`open_version`.
            InternalError: the key was replaced on every one of many attempts.
        """
        for _ in range(_READ_RETRIES):
            info = self.head_object(bucket, key, version_id, snapshot=snapshot)
            try:
                return info, os.open(info.path, _OPEN_READ)
            except FileNotFoundError:
                continue  # replaced between lookup and open: look it up again
        raise InternalError(f"{bucket}/{key} kept changing while being opened")

    def get_object(self, bucket: str, key: str, byte_range: ByteRequest | None = None,
                   version_id: str | None = None, *, snapshot: str | None = None) -> bytes:
        """Read an object (or a range) into memory. Large reads should use
        ``open(info.path)`` / :meth:`read_into` instead.

        Args:
            byte_range: ``None`` for all of it, else a :mod:`gpufeed.store` byte request.
            version_id: a version, or ``None`` for the current one.
            snapshot: read the version snapshot ``snapshot`` recorded.

        Returns:
            The bytes.

        Raises:
            NoSuchBucket, NoSuchKey: missing bucket or key.
            InvalidRange: the range is unsatisfiable (see :func:`gpufeed.store.resolve_range`).
        """
        info, fd = self.open_object(bucket, key, version_id, snapshot=snapshot)
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
