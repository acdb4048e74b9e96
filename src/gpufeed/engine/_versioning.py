"""The part of :class:`~gpufeed.engine.Engine`'s API that names versions:
looking up and deleting versions, bucket versioning, object lock (bucket
configuration, retention, legal hold), object tags, listing versions, and
bucket configuration documents.

A mixin so that ``Engine`` keeps one public API while each module stays one
concern; the rules themselves live in :mod:`._versions`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from ..errors import (
    AccessDenied,
    InvalidArgument,
    InvalidBucketState,
    InvalidRequestError,
    KeyTooLong,
    MethodNotAllowed,
    NoSuchKey,
    NoSuchObjectLockConfiguration,
    NoSuchVersion,
    ObjectLockConfigurationNotFoundError,
)
from ._blobs import BlobFiles
from ._kvpolicy import KVBucketPolicy
from ._names import MAX_KEY_BYTES
from ._release import releasable
from ._versions import check_retention, check_tags, check_version_id, delete_version, list_versions
from .catalog import Catalog, CatalogReader, require_bucket
from .types import LOCK_MODES, BucketInfo, DeleteConditions, DeleteResult, ObjectInfo, VersionListResult

__all__ = ["VersionedObjects"]

_NOT_LOCKED = "Bucket is missing Object Lock Configuration"


def _check_key_arg(key: str) -> None:
    try:
        n = len(key.encode("utf-8"))
    except (AttributeError, UnicodeEncodeError) as exc:
        raise InvalidArgument(f"object key {key!r} is not a valid UTF-8 str") from exc
    if n > MAX_KEY_BYTES:
        raise KeyTooLong(f"object key is {n} bytes of UTF-8; the limit is {MAX_KEY_BYTES}", size=n)


def _missing(c: CatalogReader, b: BucketInfo, key: str) -> NoSuchKey:
    """NoSuchKey for a key with no current version; when a delete marker is the
    latest version the error says so (``delete_marker``, ``version_id`` details)."""
    if b.versioning:
        newest = c.noncurrent(b.name, key, 1)
        if newest and newest[0].delete_marker and newest[0].is_latest:
            return NoSuchKey("The specified key does not exist.", bucket=b.name, key=key,
                             delete_marker=True, version_id=newest[0].version_id)
    return NoSuchKey("The specified key does not exist.", bucket=b.name, key=key)


class VersionedObjects:
    """Version-aware calls, mixed into :class:`~gpufeed.engine.Engine`."""

    _cat: Catalog
    _files: BlobFiles
    _kv: KVBucketPolicy
    if TYPE_CHECKING:
        def _head_snapshot(self, bucket: str, key: str, snapshot: str) -> ObjectInfo:
            """:class:`~gpufeed.engine._snapshots.SnapshotCalls`' lookup."""

    # lookups -------------------------------------------------------------------
    def head_object(self, bucket: str, key: str, version_id: str | None = None, *,
                    snapshot: str | None = None) -> ObjectInfo:
        """Look an object version up (one indexed catalog read; the hot path).

        Every read path calls this, so in a kv bucket it is the "use" that
        LRU eviction orders by: the key moves to the recent end of an
        in-memory list (a dict move under a lock, no catalog write; read
        times reach the catalog at eviction passes and on close). An object
        past its bucket's TTL is deleted here and reported missing.

        Args:
            bucket, key: the object.
            version_id: a version (``"null"`` or an id this node gave), or
                ``None`` for the current one.
            snapshot: the version snapshot ``snapshot`` recorded (no ``version_id`` then).

        Raises:
            NoSuchBucket: the bucket does not exist.
            NoSuchKey: the key has no current version (or it expired); when a
                delete marker is its latest version the error's details say
                ``delete_marker=True`` and its ``version_id``.
            NoSuchVersion: no version ``version_id`` of the key.
            MethodNotAllowed: ``version_id`` names a delete marker (details
                ``delete_marker=True``, ``version_id``, ``last_modified``).
            InvalidArgument: the key is not valid UTF-8, or a malformed version id.
            NoSuchSnapshot: no snapshot ``snapshot`` of the bucket.
        """
        if snapshot is not None:
            if version_id is not None:
                raise InvalidArgument("a read names a version id or a snapshot, not both",
                                      argument_name="snapshot", argument_value=snapshot)
            return self._head_snapshot(bucket, key, snapshot)
        if version_id is not None:
            return self._head_version(bucket, key, version_id)
        info = self._cat.object(bucket, key)
        if info is not None:
            if self._kv.on_read(info):
                return info
            raise NoSuchKey("The specified key does not exist.", bucket=bucket, key=key, expired=True)
        with self._cat.snapshot() as c:
            raise _missing(c, require_bucket(c, bucket), key)

    def _head_version(self, bucket: str, key: str, version_id: str) -> ObjectInfo:
        check_version_id(version_id)
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            info = c.version(bucket, key, version_id)
        if info is None:
            raise NoSuchVersion("The specified version does not exist.", bucket=bucket, key=key,
                                version_id=version_id)
        if info.delete_marker:
            raise MethodNotAllowed("The specified method is not allowed against this resource.",
                                   bucket=bucket, key=key, delete_marker=True, version_id=version_id,
                                   last_modified=info.last_modified)
        if info.is_latest and not self._kv.on_read(info):
            raise NoSuchKey("The specified key does not exist.", bucket=bucket, key=key, expired=True)
        return info

    # deletes -------------------------------------------------------------------
    def delete_object(self, bucket: str, key: str, version_id: str | None = None, *,
                      bypass_governance: bool = False, conditions: DeleteConditions | None = None) -> DeleteResult:
        """Delete as S3 DeleteObject does; a missing key or version is not an error.

        Without ``version_id``: in a never-versioned bucket the object goes; with
        versioning a delete marker becomes the key's latest version (the
        current version stays, noncurrent; a suspended bucket's ``null``
        version is replaced). With ``version_id``: that version (or delete
        marker) is removed for good, unless object lock protects it.

        Args:
            bypass_governance: remove a version under GOVERNANCE retention
                (S3 ``x-amz-bypass-governance-retention``).
            conditions: delete only if the version targeted (the current one,
                or ``version_id``) has this ETag / size / last-modified time;
                checked in the delete's own transaction. A missing key with
                conditions changes nothing (S3 answers 204).

        Returns:
            The :class:`DeleteResult` (version removed or delete marker made).

        Raises:
            NoSuchBucket: the bucket does not exist.
            KeyTooLong: key over 1,024 UTF-8 bytes (S3 refuses it rather than
                answering 204 for a key that cannot exist).
            InvalidArgument: not a ``str``, not valid UTF-8, or a malformed version id.
            AccessDenied: the version is under retention or legal hold.
            PreconditionFailed: ``conditions`` do not hold.
        """
        _check_key_arg(key)
        now = time.time()
        with self._cat.write() as w:
            b = require_bucket(w, bucket)
            result, freed = delete_version(w, b, key, version_id, bypass_governance, now, conditions)
            if freed and w.object(bucket, key) is None:
                self._kv.on_delete(w, bucket, key)
            freed = releasable(w, freed)
        self._files.remove_blobs(freed)
        return result

    # bucket versioning and object lock ---------------------------------------------
    def put_bucket_versioning(self, bucket: str, state: str) -> None:
        """Turn versioning on (``"Enabled"``) or suspend it (``"Suspended"``).

        Raises:
            NoSuchBucket: it does not exist.
            InvalidArgument: another state, a kv bucket (a cache keeps one version) or
                a directory bucket (S3 Express One Zone has no versioning).
            InvalidBucketState: suspending a bucket with object lock.

        Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketVersioning.html
        """
        if state not in ("Enabled", "Suspended"):
            raise InvalidArgument(f"versioning state must be Enabled or Suspended, not {state!r}")
        with self._cat.write() as w:
            b = require_bucket(w, bucket)
            if b.kind in ("kv", "directory"):
                raise InvalidArgument(f"bucket {bucket!r} is a {b.kind} bucket, which keeps one version per key")
            if b.object_lock and state != "Enabled":
                raise InvalidBucketState("An Object Lock configuration is present on this bucket, so the "
                                         "versioning state cannot be changed.", bucket=bucket)
            w.set_bucket_versioning(bucket, state)

    def get_bucket_versioning(self, bucket: str) -> str:
        """The bucket's versioning state: ``""`` (never enabled), ``"Enabled"`` or ``"Suspended"``.

        Raises:
            NoSuchBucket: it does not exist.
        """
        return require_bucket(self._cat, bucket).versioning

    def put_object_lock_configuration(self, bucket: str, mode: str = "", days: int = 0, years: int = 0) -> None:
        """Turn object lock on for a versioned bucket, with a default retention
        for new versions (``mode`` ``""``: none; else exactly one of ``days`` and
        ``years`` positive).

        Raises:
            NoSuchBucket: it does not exist.
            InvalidBucketState: its versioning is not ``"Enabled"``.
            InvalidArgument: an unknown mode or a bad period.

        Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLockConfiguration.html
        """
        if mode and mode not in LOCK_MODES:
            raise InvalidArgument(f"Unknown object lock mode {mode!r}; use GOVERNANCE or COMPLIANCE")
        for n in (days, years):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise InvalidArgument("Default retention period must be a positive integer value")
        if mode and (days > 0) == (years > 0):
            raise InvalidArgument("A default retention names either Days or Years, greater than 0")
        if not mode and (days or years):
            raise InvalidArgument("A default retention period needs a mode")
        with self._cat.write() as w:
            b = require_bucket(w, bucket)
            if b.versioning != "Enabled":
                raise InvalidBucketState("Versioning must be 'Enabled' on the bucket to apply a Object Lock "
                                         "configuration", bucket=bucket)
            w.set_bucket_lock(bucket, mode, days, years)

    def get_object_lock_configuration(self, bucket: str) -> BucketInfo:
        """The bucket, whose ``lock_mode``/``lock_days``/``lock_years`` are its default retention.

        Raises:
            NoSuchBucket: it does not exist.
            ObjectLockConfigurationNotFoundError: it has no object lock.
        """
        b = require_bucket(self._cat, bucket)
        if not b.object_lock:
            raise ObjectLockConfigurationNotFoundError("Object Lock configuration does not exist for this bucket",
                                                       bucket=bucket)
        return b

    # per-version settings ---------------------------------------------------------
    def _update_version(self, bucket: str, key: str, version_id: str | None, change, *,
                        lock: bool) -> ObjectInfo:
        """Apply ``change(w, bucket_info, version) -> new version`` to one version."""
        if version_id is not None:
            check_version_id(version_id)
        with self._cat.write() as w:
            b = require_bucket(w, bucket)
            if lock and not b.object_lock:
                raise InvalidRequestError(_NOT_LOCKED, bucket=bucket)
            v = self._target(w, b, key, version_id)
            new = change(w, b, v)
            w.update_version(new)
        return new

    @staticmethod
    def _target(w: CatalogReader, b: BucketInfo, key: str, version_id: str | None) -> ObjectInfo:
        if version_id is None:
            v = w.object(b.name, key)
            if v is None:
                raise _missing(w, b, key)
            return v
        v = w.version(b.name, key, version_id)
        if v is None:
            raise NoSuchVersion("The specified version does not exist.", bucket=b.name, key=key,
                                version_id=version_id)
        if v.delete_marker:
            raise MethodNotAllowed("The specified method is not allowed against this resource.",
                                   bucket=b.name, key=key, delete_marker=True, version_id=version_id)
        return v

    def put_object_retention(self, bucket: str, key: str, mode: str, until: float, *,
                             version_id: str | None = None, bypass_governance: bool = False) -> ObjectInfo:
        """Set (``mode`` ``""`` and ``until`` 0: remove) a version's retention.

        COMPLIANCE retention can only be extended (same mode, a later date);
        GOVERNANCE retention can be extended freely and shortened, removed or
        changed in mode only with ``bypass_governance``.

        Returns:
            The version with its new retention.

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for :meth:`head_object`.
            InvalidRequestError: the bucket has no object lock.
            InvalidArgument: an unknown mode, or a date not in the future.
            AccessDenied: the change would weaken a retention it may not.

        Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectRetention.html
        """
        now = time.time()
        if mode or until:
            check_retention(mode, until, now)

        def change(w, b, v: ObjectInfo) -> ObjectInfo:
            if v.lock_mode and v.lock_until > now:
                weaker = (mode != v.lock_mode and not (v.lock_mode == "GOVERNANCE" and mode == "COMPLIANCE")) \
                    or until < v.lock_until
                if weaker and (v.lock_mode == "COMPLIANCE" or not bypass_governance):
                    raise AccessDenied("Access Denied because object protected by object lock.",
                                       bucket=bucket, key=key)
            return dataclasses.replace(v, lock_mode=mode, lock_until=until if mode else 0.0)

        return self._update_version(bucket, key, version_id, change, lock=True)

    def put_object_legal_hold(self, bucket: str, key: str, on: bool, *, version_id: str | None = None) -> ObjectInfo:
        """Put a legal hold on a version (``on``) or take it off.

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for :meth:`head_object`.
            InvalidRequestError: the bucket has no object lock.

        Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLegalHold.html
        """
        return self._update_version(bucket, key, version_id,
                                    lambda w, b, v: dataclasses.replace(v, legal_hold=bool(on)), lock=True)

    def get_object_retention(self, bucket: str, key: str, *, version_id: str | None = None) -> ObjectInfo:
        """The version, whose ``lock_mode``/``lock_until`` are its retention.

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for :meth:`head_object`.
            InvalidRequestError: the bucket has no object lock.
            NoSuchObjectLockConfiguration: the version has no retention.
        """
        v = self._locked_version(bucket, key, version_id)
        if not v.lock_mode:
            raise NoSuchObjectLockConfiguration("The specified object does not have a ObjectLock configuration",
                                                bucket=bucket, key=key)
        return v

    def _locked_version(self, bucket: str, key: str, version_id: str | None) -> ObjectInfo:
        if version_id is not None:
            check_version_id(version_id)
        with self._cat.snapshot() as c:
            b = require_bucket(c, bucket)
            if not b.object_lock:
                raise InvalidRequestError(_NOT_LOCKED, bucket=bucket)
            return self._target(c, b, key, version_id)

    def get_object_legal_hold(self, bucket: str, key: str, *, version_id: str | None = None) -> bool:
        """Whether the version has a legal hold.

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for :meth:`head_object`.
            InvalidRequestError: the bucket has no object lock.
        """
        return self._locked_version(bucket, key, version_id).legal_hold

    def put_object_tagging(self, bucket: str, key: str, tags: dict[str, str], *,
                           version_id: str | None = None) -> ObjectInfo:
        """Replace a version's tag set (``{}`` removes every tag).

        Returns:
            The version with its new tags.

        Raises:
            NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for :meth:`head_object`.
            InvalidTag: over S3's limits (10 tags; key 1-128, value 0-256 characters).

        Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectTagging.html
        """
        tags = check_tags(tags)
        return self._update_version(bucket, key, version_id, lambda w, b, v: dataclasses.replace(v, tags=tags),
                                    lock=False)

    # listing ----------------------------------------------------------------------
    def list_object_versions(self, bucket: str, *, prefix: str = "", delimiter: str = "", key_marker: str = "",
                             version_id_marker: str = "", max_keys: int = 1000) -> VersionListResult:
        """One page of every version and delete marker (S3 ListObjectVersions):
        by key, newest first within a key; a never-versioned bucket lists each
        object as version ``null``.

        Args:
            prefix, delimiter: as for :meth:`list_objects`.
            key_marker, version_id_marker: the previous page's
                ``next_key_marker``/``next_version_id_marker``.
            max_keys: page size, 0..1000 (larger values are clipped).

        Raises:
            NoSuchBucket: the bucket does not exist.
            InvalidArgument: negative ``max_keys``, a version-id marker without
                a key marker or malformed, text that is not valid UTF-8.

        Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectVersions.html
        """
        if not isinstance(max_keys, int) or max_keys < 0:
            raise InvalidArgument(f"max_keys must be an int >= 0, not {max_keys!r}")
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            if max_keys == 0:
                return VersionListResult([], [], False)
            return list_versions(c, bucket, prefix=prefix, delimiter=delimiter, key_marker=key_marker,
                                 version_id_marker=version_id_marker, max_keys=min(max_keys, 1000))

    # bucket configuration documents --------------------------------------------------
    def put_bucket_config(self, bucket: str, name: str, document: str) -> None:
        """Store a bucket configuration document the front keeps whole (``name``
        ``"cors"``, ``"tagging"``, ...), replacing any; the front checked it.

        Raises:
            NoSuchBucket: it does not exist.
            InvalidArgument: ``name`` or ``document`` is not a ``str``.
        """
        if not isinstance(name, str) or not isinstance(document, str):
            raise InvalidArgument("a bucket configuration is a str name and a str document")
        with self._cat.write() as w:
            require_bucket(w, bucket)
            w.set_bucket_config(bucket, name, document)

    def get_bucket_config(self, bucket: str, name: str) -> str | None:
        """The bucket's configuration document ``name`` as stored, or ``None``.

        Raises:
            NoSuchBucket: it does not exist.
        """
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            return c.bucket_config(bucket, name)

    def delete_bucket_config(self, bucket: str, name: str) -> bool:
        """Remove the bucket's configuration document ``name``.

        Returns:
            Whether it had one.

        Raises:
            NoSuchBucket: it does not exist.
        """
        with self._cat.write() as w:
            require_bucket(w, bucket)
            return w.delete_bucket_config(bucket, name)
