"""Server-side copies of :class:`~gpufeed.engine.Engine` (S3 CopyObject): the
source read through its checked handle, the destination written as a new
version under its own bucket's policies. A mixin, like :mod:`._versioning`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InternalError
from ._handles import ObjectHandle
from ._names import check_key
from ._writes import WritePath, etag_kind
from .catalog import Catalog, require_bucket
from .types import ObjectInfo, Retention

__all__ = ["ObjectCopies"]


class ObjectCopies:
    """CopyObject, mixed into the Engine."""

    _cat: Catalog
    _writes: WritePath
    if TYPE_CHECKING:
        def open_version(self, bucket: str, key: str, version_id: str | None = None,
                         snapshot: str | None = None) -> ObjectHandle:
            """The engine's checked open (:class:`~gpufeed.engine._reads.ObjectReads`)."""

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
        src_version_id: str | None = None,
        tags: dict[str, str] | None = None,
        retention: Retention | None = None,
        if_match: str | None = None,
        if_none_match: str | None = None,
    ) -> ObjectInfo:
        """Copy (kernel-side ``copy_file_range`` into a new blob).

        ``metadata``/``content_type``/``headers`` all None keeps the source's
        (S3 ``x-amz-metadata-directive: COPY``); giving any replaces all three
        (``REPLACE``). The checksums are the source's; the ETag is too when it
        is of the kind the destination's ETag policy makes (else it is computed
        from the copied bytes, or ``n<blob id>`` under ``none``). Copying a key
        onto itself with new metadata works. ``src_version_id`` copies that
        version of the source; ``tags`` ``None`` keeps the source's tags;
        ``retention``, ``if_match`` and ``if_none_match`` (on the destination)
        as for :meth:`PendingWrite.commit`.

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion: missing source or
                destination bucket, missing source key or version.
            MethodNotAllowed: the source version is a delete marker.
            KeyTooLong, InvalidArgument: bad destination key.
            InvalidTag, InvalidRequestError, AccessDenied: as for :meth:`PendingWrite.commit`.
        """
        check_key(dst_key)
        policy = require_bucket(self._cat, dst_bucket).etag_policy
        sh = self.open_version(src_bucket, src_key, src_version_id)
        src = sh.info
        # The destination's ETag policy decides: a source ETag of the same kind
        # is kept (same bytes), another kind is computed from the copied bytes.
        keep = src.etag if etag_kind(src.etag) == policy != "none" else None
        kind = None if keep is not None or policy == "none" else "md5" if policy == "md5" else "xxh3"
        ct: str | None
        if metadata is None and content_type is None and headers is None:
            md, ct, hd = src.metadata, src.content_type, src.headers
        else:
            md, ct, hd = metadata or {}, content_type, headers or {}

        def finish(pw, tmp, computed, _md5, **_kw):
            return self._writes.publish_object(
                dst_bucket, dst_key, tmp, pw.size, keep if keep is not None else computed,
                content_type=ct, metadata=md, checksums=src.checksums, headers=hd,
                tags=src.tags if tags is None else tags, retention=retention,
                if_match=if_match, if_none_match=if_none_match, block_sums=pw.block_sums,
            )

        try:
            pw = self._writes.begin(kind, finish)
            with pw:
                sh.copy_to(pw, 0, src.size)
                if pw.size != src.size:
                    raise InternalError(f"data of {src_bucket}/{src_key} is shorter than its catalog size")
        finally:
            sh.close()
        return pw.commit()

