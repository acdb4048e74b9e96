"""Restoring (rolling back) a bucket, or the keys under a prefix, to a snapshot.

Inside one write transaction:

- each key the snapshot holds whose current version is not the recorded one
  (another blob, or the same blob with another tag set: tags change in place)
  gets the recorded version back as a new current version: same blob id (no
  data copied), size, ETag, content type, metadata, checksums, headers and
  tags, written now; versioning decides what happens to the version it
  replaces, exactly as for a put (:func:`~gpufeed.engine._versions.place_version`:
  it becomes noncurrent in a versioned bucket, is replaced otherwise), and the
  bucket's default retention applies to it as to any new version;
- each current key under the prefix the snapshot does not hold is deleted as
  DeleteObject without a version id does (a delete marker in a versioned bucket);
- keys whose current version already is the recorded one, tags included,
  are left alone.

Object lock: when any current version it would replace or delete is under
retention or legal hold, the whole restore is refused up front with
AccessDenied naming the key, and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

from ..errors import AccessDenied
from ._names import successor
from ._tenants import check_quota
from ._versions import check_unlocked, delete_version, place_version
from .catalog import CatalogWriter
from .types import BucketInfo, ObjectInfo, RestoreResult, SnapshotInfo

__all__ = ["restore_snapshot", "merge_keys"]

_ALL = 1 << 62


def merge_keys(old: Iterator[ObjectInfo], new: Iterator[ObjectInfo]
               ) -> Iterator[tuple[str, ObjectInfo | None, ObjectInfo | None]]:
    """Join two streams of versions ordered by key: ``(key, old or None, new or None)``."""
    a, b = next(old, None), next(new, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a.key < b.key):
            assert a is not None
            yield a.key, a, None
            a = next(old, None)
        elif a is None or b.key != a.key:
            yield b.key, None, b
            b = next(new, None)
        else:
            yield a.key, a, b
            a, b = next(old, None), next(new, None)


def restore_snapshot(w: CatalogWriter, b: BucketInfo, snap: SnapshotInfo, prefix: str,
                     now: float) -> tuple[RestoreResult, list[str]]:
    """Restore the keys under ``prefix`` of bucket ``b`` to ``snap`` (see the module docstring).

    Returns:
        ``(result, freed)``: counts, and the blob ids of rows it dropped (for
        :func:`~gpufeed.engine._release.releasable`).

    Raises:
        AccessDenied: a current version to replace or delete is protected.
        QuotaExceeded: the restore grew the bucket past a quota.
    """
    end = successor(prefix) if prefix else None
    old = w.scan_snapshot(b.name, snap.name, prefix, inclusive=True, end=end, limit=_ALL)
    cur = w.scan_objects(b.name, prefix, inclusive=True, end=end, limit=_ALL)
    with closing(old), closing(cur):
        plan = list(merge_keys(old, cur))
    puts = [(e, c) for _, e, c in plan if e is not None and (c is None or c.blob_id != e.blob_id or c.tags != e.tags)]
    deletes = [c for _, e, c in plan if e is None and c is not None]
    for v in [c for _, c in puts if c is not None] + deletes:
        try:
            check_unlocked(v, now, False)
        except AccessDenied:
            raise AccessDenied(f"restore of snapshot {snap.name!r} refused: the current version of {v.key!r} "
                               "is protected by object lock; nothing was changed", bucket=b.name, key=v.key) from None
    before = w.usage(b.name)
    freed: list[str] = []
    for e, c in puts:
        info = ObjectInfo(b.name, e.key, e.size, e.etag, now, e.content_type, dict(e.metadata), dict(e.checksums),
                          e.blob_id, e.path, dict(e.headers), tags=dict(e.tags))
        info, gone = place_version(w, b, info, c, None)
        w.put_object(info)
        freed += gone
    for v in deletes:
        freed += delete_version(w, b, v.key, None, False, now)[1]
    after = w.usage(b.name)
    if after[0] > before[0] or after[1] > before[1]:
        check_quota(w, b)
    return RestoreResult(len(puts), len(deletes), len(plan) - len(puts) - len(deletes)), freed
