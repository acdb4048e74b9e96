"""Bucket snapshots: instant, read-only records of a bucket's current objects,
and the calls that make, read, compare, restore and delete them, mixed into
:class:`~gpufeed.engine.Engine`.

What a snapshot is:

- **Consistent**: it records every current object of the bucket (the latest
  version of each key that is not a delete marker) as one catalog commit saw
  them, with all their metadata (size, ETag, content type, user metadata,
  checksums, headers, version id, tags, lock settings) and their blob id.
  It is made by one ``INSERT ... SELECT`` inside a write transaction; no data
  is copied.
- **Pinning**: the data of what it recorded stays on disk while the snapshot
  exists, whatever happens to the live objects (overwrites, deletes,
  lifecycle expiry): every path that frees data asks :func:`._release.releasable`,
  which keeps any blob a snapshot entry names, and the start-up sweep counts
  snapshot entries as live. Deleting a snapshot frees the blobs only it named.
- **Read-only**: nothing changes a snapshot but deleting it. Reads name it
  (``snapshot=`` on :meth:`head_object`, :meth:`open_version`,
  :meth:`get_object`, :meth:`list_objects`) and take the same read path as
  live reads (one indexed lookup, then the shared open-file cache).
- **Object lock**: a restore never replaces nor deletes a current version
  under retention or legal hold (it is refused whole, up front); a snapshot
  that recorded a version still protected now (legal hold, or retention not
  yet expired; GOVERNANCE yields to a bypass) cannot be deleted, so the
  record of a locked version lives at least as long as the lock.
- Snapshots of kv (cache) buckets are refused; a bucket with snapshots cannot
  be deleted (delete its snapshots first).

Names: 1 to 128 characters of letters, digits, ``.``, ``_`` and ``-``,
starting with a letter or digit, never ``..``; ``auto-`` is reserved for the
node's schedules (:mod:`._snapshot_schedule`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Generator
from contextlib import closing

from ..errors import (
    AccessDenied,
    BucketNotEmpty,
    InvalidArgument,
    InvalidRequestError,
    NoSuchKey,
    NoSuchSnapshot,
    SnapshotAlreadyExists,
)
from ._blobs import BlobFiles
from ._listing import Position, read_page
from ._names import successor
from ._release import releasable
from ._restore import merge_keys, restore_snapshot
from ._versions import check_unlocked
from .catalog import Catalog, CatalogReader, require_bucket
from .types import SNAPSHOT_KINDS, ListResult, ObjectInfo, RestoreResult, SnapshotDiff, SnapshotInfo

__all__ = ["SnapshotCalls", "check_snapshot_name", "require_snapshot", "MAX_SNAPSHOT_NAME", "AUTO_PREFIX"]

#: Longest snapshot name, characters.
MAX_SNAPSHOT_NAME = 128
#: Names the node's schedules give their snapshots start with this.
AUTO_PREFIX = "auto-"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ALL = 1 << 62


def check_snapshot_name(name: object) -> str:
    """Refuse a snapshot name that could be read as a path or is out of bounds.

    Returns:
        ``name``.

    Raises:
        InvalidArgument: not a ``str``; empty; over :data:`MAX_SNAPSHOT_NAME`
            characters; a character other than letters, digits, ``.``, ``_``,
            ``-`` (so no ``/``, ``\\``, ``@``, spaces or controls); not starting
            with a letter or digit; or holding ``..``.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a snapshot name must be a non-empty string", argument_name="snapshot",
                              argument_value=str(name))
    if len(name) > MAX_SNAPSHOT_NAME:
        raise InvalidArgument(f"a snapshot name is at most {MAX_SNAPSHOT_NAME} characters, not {len(name)}",
                              argument_name="snapshot", argument_value=name[:MAX_SNAPSHOT_NAME])
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidArgument(f"invalid snapshot name {name!r}: use letters, digits, '.', '_' and '-', "
                              "starting with a letter or digit, without '..' or path characters",
                              argument_name="snapshot", argument_value=name)
    return name


def require_snapshot(c: CatalogReader, bucket: str, name: str) -> SnapshotInfo:
    """The snapshot ``name`` of ``bucket`` as ``c`` sees it.

    Raises:
        NoSuchBucket: no such bucket.
        NoSuchSnapshot: no such snapshot of it.
    """
    require_bucket(c, bucket)
    info = c.bucket_snapshot(bucket, name)
    if info is None:
        raise NoSuchSnapshot(f"bucket {bucket!r} has no snapshot {name!r}", bucket=bucket, snapshot=name)
    return info


class _SnapshotScan:
    """A snapshot's entries seen through ``scan_objects``, for :func:`read_page`."""

    def __init__(self, reader: CatalogReader, snapshot: str) -> None:
        self._r, self._name = reader, snapshot

    def scan_objects(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                     limit: int) -> Generator[ObjectInfo, None, None]:
        return self._r.scan_snapshot(bucket, self._name, start, inclusive=inclusive, end=end, limit=limit)


class SnapshotCalls:
    """Snapshot calls, mixed into :class:`~gpufeed.engine.Engine`."""

    _cat: Catalog
    _files: BlobFiles

    def create_snapshot(self, bucket: str, name: str, *, kind: str = "manual",
                        now: float | None = None) -> SnapshotInfo:
        """Record the bucket's current objects as snapshot ``name`` (see the module
        docstring); one catalog transaction, no data copied.

        Args:
            kind: ``"manual"``; schedules pass ``"hourly"`` / ``"daily"``.
            now: its ``created`` time, Unix s (``None``: the clock).

        Returns:
            The snapshot, with its object count and logical bytes.

        Raises:
            NoSuchBucket: no such bucket.
            InvalidArgument: a bad name (:func:`check_snapshot_name`), a manual
                name starting ``auto-``, an unknown kind, or a kv bucket.
            SnapshotAlreadyExists: the bucket has a snapshot of that name.
        """
        check_snapshot_name(name)
        if kind not in SNAPSHOT_KINDS:
            raise InvalidArgument(f"snapshot kind must be one of {SNAPSHOT_KINDS}, not {kind!r}")
        if kind == "manual" and name.startswith(AUTO_PREFIX):
            raise InvalidArgument(f"snapshot names starting {AUTO_PREFIX!r} are the node's schedules'",
                                  argument_name="snapshot", argument_value=name)
        with self._cat.write() as w:
            b = require_bucket(w, bucket)
            if b.kind == "kv":
                raise InvalidArgument(f"bucket {bucket!r} is a kv (cache) bucket; it has no snapshots")
            if w.bucket_snapshot(bucket, name) is not None:
                raise SnapshotAlreadyExists(f"bucket {bucket!r} has a snapshot {name!r} already",
                                            bucket=bucket, snapshot=name)
            return w.insert_snapshot(SnapshotInfo(bucket, name, time.time() if now is None else now, kind))

    def list_snapshots(self, bucket: str) -> list[SnapshotInfo]:
        """The bucket's snapshots, oldest first.

        Raises:
            NoSuchBucket: no such bucket.
        """
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            return c.bucket_snapshots(bucket)

    def head_snapshot(self, bucket: str, name: str) -> SnapshotInfo:
        """One snapshot's record.

        Raises:
            NoSuchBucket, NoSuchSnapshot: no such bucket or snapshot.
            InvalidArgument: a bad name.
        """
        check_snapshot_name(name)
        with self._cat.snapshot() as c:
            return require_snapshot(c, bucket, name)

    def delete_snapshot(self, bucket: str, name: str, *, bypass_governance: bool = False,
                        replication: bool = False) -> None:
        """Delete a snapshot; the data only it held is freed after the commit.

        Refused while a version it recorded is still protected by object lock
        (legal hold; retention not yet expired, GOVERNANCE yielding to
        ``bypass_governance``), looked up on the live version; and for a
        snapshot of kind ``replication`` (the base a replication rule diffs
        against) unless ``replication`` (the rule's own pruning).

        Raises:
            NoSuchBucket, NoSuchSnapshot: no such bucket or snapshot.
            InvalidArgument: a bad name.
            AccessDenied: it holds a protected version (the message names the key).
            InvalidRequestError: a replication rule's snapshot.
        """
        check_snapshot_name(name)
        now = time.time()
        with self._cat.write() as w:
            snap = require_snapshot(w, bucket, name)
            if snap.kind == "replication" and not replication:
                raise InvalidRequestError(f"snapshot {name!r} of {bucket!r} belongs to its replication rule (the "
                                          "base its next round diffs against); 'gpufeed replicate remove "
                                          f"{bucket}' removes the rule and its snapshots")
            if require_bucket(w, bucket).object_lock:
                self._check_snapshot_unlocked(w, snap, now, bypass_governance)
            freed = releasable(w, w.delete_snapshot(bucket, name))
        self._files.remove_blobs(freed)

    @staticmethod
    def _check_snapshot_unlocked(w: CatalogReader, snap: SnapshotInfo, now: float, bypass: bool) -> None:
        with closing(w.scan_snapshot(snap.bucket, snap.name, "", inclusive=True, end=None, limit=_ALL)) as rows:
            for e in rows:
                live = w.version(snap.bucket, e.key, e.version_id)
                try:
                    check_unlocked(live if live is not None else e, now, bypass)
                except AccessDenied:
                    raise AccessDenied(f"snapshot {snap.name!r} holds {e.key!r} (version {e.version_id}), "
                                       "which object lock still protects; delete it after the lock ends",
                                       bucket=snap.bucket, key=e.key) from None

    def diff_snapshots(self, bucket: str, base: str, target: str | None = None, *,
                       prefix: str = "") -> SnapshotDiff:
        """Keys that differ between snapshot ``base`` and snapshot ``target``
        (``None``: the live bucket now), under ``prefix``; read in one catalog
        snapshot. A key is changed when its blob id or ETag differs, and
        retagged when only its tag set does.

        Raises:
            NoSuchBucket, NoSuchSnapshot: no such bucket or snapshot.
            InvalidArgument: a bad name.
        """
        check_snapshot_name(base)
        if target is not None:
            check_snapshot_name(target)
        end = successor(prefix) if prefix else None
        added: list[str] = []
        changed: list[str] = []
        removed: list[str] = []
        retagged: list[str] = []
        with self._cat.snapshot() as c:
            require_snapshot(c, bucket, base)
            if target is not None:
                require_snapshot(c, bucket, target)
            old = c.scan_snapshot(bucket, base, prefix, inclusive=True, end=end, limit=_ALL)
            new = (c.scan_objects(bucket, prefix, inclusive=True, end=end, limit=_ALL) if target is None
                   else c.scan_snapshot(bucket, target, prefix, inclusive=True, end=end, limit=_ALL))
            with closing(old), closing(new):
                for key, a, b in merge_keys(old, new):
                    if a is None:
                        added.append(key)
                    elif b is None:
                        removed.append(key)
                    elif a.blob_id != b.blob_id or a.etag != b.etag:
                        changed.append(key)
                    elif a.tags != b.tags:
                        retagged.append(key)
        return SnapshotDiff(added, changed, removed, retagged)

    def restore_snapshot(self, bucket: str, name: str, *, prefix: str = "") -> RestoreResult:
        """Roll the bucket (or the keys under ``prefix``) back to snapshot ``name``
        in one transaction (see :func:`._restore.restore_snapshot`); the data
        of replaced versions no row names any more is freed after the commit.

        Raises:
            NoSuchBucket, NoSuchSnapshot: no such bucket or snapshot.
            InvalidArgument: a bad name.
            AccessDenied: a current version it would replace or delete is
                protected by object lock (the message names the key; nothing changed).
            QuotaExceeded: the versions it adds would pass a quota.
        """
        check_snapshot_name(name)
        with self._cat.write() as w:
            snap = require_snapshot(w, bucket, name)
            result, freed = restore_snapshot(w, require_bucket(w, bucket), snap, prefix, time.time())
            freed = releasable(w, freed)
        self._files.remove_blobs(freed)
        return result

    # reads -------------------------------------------------------------------------
    def _head_snapshot(self, bucket: str, key: str, snapshot: str) -> ObjectInfo:
        """The version of ``key`` snapshot ``snapshot`` recorded (one indexed read
        on the hit path, as a live head).

        Raises:
            NoSuchBucket, NoSuchSnapshot, NoSuchKey: what is missing.
            InvalidArgument: a bad snapshot name, a key that is not UTF-8.
        """
        check_snapshot_name(snapshot)
        info = self._cat.snapshot_object(bucket, snapshot, key)
        if info is not None:
            return info
        with self._cat.snapshot() as c:
            require_snapshot(c, bucket, snapshot)
        raise NoSuchKey(f"snapshot {snapshot!r} of bucket {bucket!r} holds no key {key!r}",
                        bucket=bucket, key=key)

    def _list_snapshot(self, bucket: str, snapshot: str, pos: Position, *, prefix: str, delimiter: str,
                       max_keys: int) -> ListResult:
        """One :meth:`list_objects` page of a snapshot's keys."""
        check_snapshot_name(snapshot)
        with self._cat.snapshot() as c:
            require_snapshot(c, bucket, snapshot)
            if max_keys == 0:
                return ListResult([], [], False)
            return read_page(_SnapshotScan(c, snapshot), bucket, pos, prefix=prefix, delimiter=delimiter,
                             max_keys=max_keys, hidden_before=None)

    def _check_no_snapshots(self, c: CatalogReader, bucket: str) -> None:
        """Refuse to delete a bucket that has snapshots.

        Raises:
            BucketNotEmpty: it has one.
        """
        snaps = c.bucket_snapshots(bucket)
        if snaps:
            raise BucketNotEmpty(f"bucket {bucket!r} has {len(snaps)} snapshot(s) (first {snaps[0].name!r}); "
                                 "delete them first", bucket=bucket)

