"""Object versions and object lock (WORM): where a new version goes, what a
delete does, which versions are protected, and listing every version.

The catalog keeps each key's current version in its ``objects`` place (the
hot path reads only that) and every other version, delete markers included,
among the noncurrent versions (:meth:`~gpufeed.engine.catalog.CatalogReader.noncurrent`).
``seq`` orders a key's versions (larger is newer).

S3 semantics followed:

- A never-versioned bucket: every object is version ``null``; a put replaces
  it, a delete removes it.
- ``Enabled``: a put adds a version with a new id and the previous current
  version becomes noncurrent; a delete without a version id adds a delete
  marker as the key's latest version (even for a key that has none).
- ``Suspended``: a put or delete makes version ``null``, replacing the key's
  ``null`` version (current or not); other versions stay.
- A delete naming a version removes it for good; when it was the latest, the
  newest remaining version (or delete marker) becomes the latest.
- Object lock: a version under retention (until its retain-until date) or
  legal hold cannot be removed or replaced by anyone; ``GOVERNANCE`` retention
  yields to a request that bypasses it, ``COMPLIANCE`` to none and can only be
  extended. New versions of a bucket with a default retention get it.

Sources: "Retaining multiple versions of objects with S3 Versioning",
"Working with delete markers", "Locking objects with Object Lock", Amazon S3
User Guide; "PutBucketVersioning", "DeleteObject", "ListObjectVersions",
"PutObjectRetention", "PutObjectLegalHold", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/
"""

from __future__ import annotations

import dataclasses
import heapq
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing

from ..errors import AccessDenied, InvalidArgument, InvalidRequestError, InvalidTag, PreconditionFailed
from ._blobs import new_id
from ._names import check_text, successor
from .catalog import CatalogReader, CatalogWriter
from .types import LOCK_MODES, BucketInfo, DeleteConditions, DeleteResult, ObjectInfo, Retention, VersionListResult

__all__ = [
    "check_version_id", "check_tags", "check_unlocked", "place_version", "delete_version", "lock_of_new",
    "list_versions", "MAX_TAGS", "DAY_S", "YEAR_S",
]

#: Most tags on one object version (S3's limit).
MAX_TAGS = 10
_MAX_TAG_KEY = 128
_MAX_TAG_VALUE = 256
#: Letters, digits, white space and ``+ - = . _ : / @`` (S3's tag alphabet).
_TAG_TEXT = re.compile(r"[\w\s+\-=.:/@]*")
_VERSION_ID = re.compile(r"[0-9a-f]{32}")
DAY_S = 86400
#: A retention "year" as S3 counts it for default retention, seconds.
YEAR_S = 365 * DAY_S
_LOCKED = "Access Denied because object protected by object lock."


def check_version_id(version_id: str) -> None:
    """Refuse a version id this node cannot have made.

    Raises:
        InvalidArgument: not ``"null"`` nor 32 lower-case hex digits (S3: "Invalid version id specified").
    """
    if version_id != "null" and not (isinstance(version_id, str) and _VERSION_ID.fullmatch(version_id)):
        raise InvalidArgument("Invalid version id specified", argument_name="versionId",
                              argument_value=str(version_id))


def check_tags(tags: dict[str, str], limit: int = MAX_TAGS) -> dict[str, str]:
    """Check a tag set against S3's limits.

    Returns:
        A copy of ``tags``.

    Raises:
        InvalidTag: more than ``limit`` tags, a key of 0 or over 128 characters,
            a value over 256, a key starting ``aws:``, or characters outside
            S3's tag alphabet.
        InvalidArgument: not a ``str -> str`` map.
    """
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise InvalidArgument("tags must be a dict of str to str")
    if len(tags) > limit:
        raise InvalidTag(f"Object tags cannot be greater than {limit}")
    for k, v in tags.items():
        if not k or len(k) > _MAX_TAG_KEY:
            raise InvalidTag(f"The TagKey you have provided is too long, max {_MAX_TAG_KEY}" if k
                             else "The TagKey you have provided is invalid")
        if len(v) > _MAX_TAG_VALUE:
            raise InvalidTag(f"The TagValue you have provided is too long, max {_MAX_TAG_VALUE}")
        if k.lower().startswith("aws:"):
            raise InvalidTag("Your TagKey cannot be prefixed with aws:")
        if not _TAG_TEXT.fullmatch(k) or not _TAG_TEXT.fullmatch(v):
            raise InvalidTag("The TagKey you have provided is invalid" if not _TAG_TEXT.fullmatch(k)
                             else "The TagValue you have provided is invalid")
    return dict(tags)


def check_unlocked(v: ObjectInfo, now: float, bypass_governance: bool) -> None:
    """Refuse to remove or replace a protected version.

    Raises:
        AccessDenied: ``v`` has a legal hold, COMPLIANCE retention until after
            ``now``, or GOVERNANCE retention until after ``now`` and no bypass.
    """
    if v.legal_hold or (v.lock_mode and v.lock_until > now
                        and (v.lock_mode == "COMPLIANCE" or not bypass_governance)):
        raise AccessDenied(_LOCKED, bucket=v.bucket, key=v.key)


def lock_of_new(b: BucketInfo, retention: Retention | None, now: float) -> tuple[str, float, bool]:
    """``(mode, until, legal_hold)`` of a version made at ``now`` in bucket ``b``:
    the retention asked for, else the bucket's default.

    Raises:
        InvalidRequestError: lock settings for a bucket without object lock.
        InvalidArgument: an unknown mode, or a retain-until date not in the future.
    """
    r = retention or Retention()
    if (r.mode or r.until or r.legal_hold) and not b.object_lock:
        raise InvalidRequestError("Bucket is missing Object Lock Configuration", bucket=b.name)
    if r.mode or r.until:
        check_retention(r.mode, r.until, now)
        return r.mode, r.until, r.legal_hold
    if b.object_lock and b.lock_mode:
        return b.lock_mode, now + b.lock_days * DAY_S + b.lock_years * YEAR_S, r.legal_hold
    return "", 0.0, r.legal_hold


def check_retention(mode: str, until: float, now: float) -> None:
    """Check a retention setting.

    Raises:
        InvalidArgument: ``mode`` not GOVERNANCE/COMPLIANCE, or ``until`` not after ``now``.
    """
    if mode not in LOCK_MODES:
        raise InvalidArgument(f"Unknown object lock mode {mode!r}; use GOVERNANCE or COMPLIANCE")
    if not until > now:
        raise InvalidArgument("The retain until date must be in the future!")


def _next_seq(w: CatalogReader, bucket: str, key: str, old: ObjectInfo | None) -> int:
    floor = old.seq if old is not None else 0
    newest = w.noncurrent(bucket, key, 1)
    if newest:
        floor = max(floor, newest[0].seq)
    return max(time.time_ns(), floor + 1)


def _make_room(w: CatalogWriter, b: BucketInfo, key: str, old: ObjectInfo | None, vid: str,
               now: float, freed: list[str]) -> None:
    """Before version ``vid`` becomes the key's latest: the current version
    becomes noncurrent (or is dropped when both are ``null``), a noncurrent
    ``null`` version is dropped when ``vid`` is ``null``, and no delete marker
    stays latest. Blob ids of dropped versions go to ``freed``."""
    if old is not None:
        w.delete_object(b.name, key)
        if vid == "null" and old.version_id == "null":
            check_unlocked(old, now, False)
            freed.append(old.blob_id)
        else:
            w.insert_noncurrent(dataclasses.replace(old, is_latest=False))
    if vid == "null":
        prior = w.version(b.name, key, "null")
        if prior is not None:
            check_unlocked(prior, now, False)
            w.delete_noncurrent(b.name, key, "null")
            if not prior.delete_marker:
                freed.append(prior.blob_id)
    w.set_latest_marker(b.name, key, None)


def place_version(w: CatalogWriter, b: BucketInfo, info: ObjectInfo, old: ObjectInfo | None,
                  retention: Retention | None) -> tuple[ObjectInfo, list[str]]:
    """Give the new version ``info`` its id, order and lock, and move the key's
    other versions out of its way (inside the commit's transaction; the caller
    then stores the result with ``put_object``).

    Returns:
        ``(info, freed)``: the version to store, and the blob ids of versions it replaced.

    Raises:
        AccessDenied: it would replace a protected version.
        InvalidRequestError, InvalidArgument: see :func:`lock_of_new`.
    """
    now = info.last_modified
    mode, until, hold = lock_of_new(b, retention, now)
    freed: list[str] = []
    if b.versioning == "":
        seq = max(time.time_ns(), (old.seq if old is not None else 0) + 1)
        vid = "null"
        if old is not None:
            freed.append(old.blob_id)
    else:
        seq = _next_seq(w, b.name, info.key, old)
        vid = new_id() if b.versioning == "Enabled" else "null"
        _make_room(w, b, info.key, old, vid, now, freed)
    return dataclasses.replace(info, version_id=vid, seq=seq, lock_mode=mode, lock_until=until,
                               legal_hold=hold), freed


def _promote(w: CatalogWriter, bucket: str, key: str) -> None:
    """Make the key's newest noncurrent version (or delete marker) its latest."""
    newest = w.noncurrent(bucket, key, 1)
    if not newest:
        return
    n = newest[0]
    if n.delete_marker:
        w.set_latest_marker(bucket, key, n.version_id)
    else:
        w.delete_noncurrent(bucket, key, n.version_id)
        w.put_object(dataclasses.replace(n, is_latest=True))


def _check_conditions(w: CatalogWriter, b: BucketInfo, key: str, version_id: str | None,
                      conditions: DeleteConditions) -> bool:
    """Whether the version a conditional delete targets exists (nothing is done
    when it does not, as S3 answers 204 then).

    Raises:
        PreconditionFailed: it exists and differs from a condition.
    """
    v = w.object(b.name, key) if version_id is None else w.version(b.name, key, version_id)
    if v is None or v.delete_marker:
        return False
    c = conditions
    if (c.etag is not None and c.etag not in ("*", v.etag)) or (c.size is not None and c.size != v.size) or \
            (c.last_modified is not None and int(c.last_modified) != int(v.last_modified)):
        raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                 condition="If-Match")
    return True


def delete_version(w: CatalogWriter, b: BucketInfo, key: str, version_id: str | None,
                   bypass_governance: bool, now: float,
                   conditions: DeleteConditions | None = None) -> tuple[DeleteResult, list[str]]:
    """S3 DeleteObject inside a write transaction (see the module docstring).

    Returns:
        ``(result, freed)``: what was done and the blob ids to unlink after the commit.

    Raises:
        InvalidArgument: a malformed ``version_id``.
        AccessDenied: the version is protected by object lock.
        PreconditionFailed: ``conditions`` do not hold for the version targeted
            (a missing version with conditions: nothing is done).
    """
    freed: list[str] = []
    if version_id is not None:
        check_version_id(version_id)
    if conditions is not None and not _check_conditions(w, b, key, version_id, conditions):
        return DeleteResult(version_id, False), freed
    if version_id is None:
        old = w.object(b.name, key)
        if b.versioning == "":
            if old is not None:
                w.delete_object(b.name, key)
                freed.append(old.blob_id)
            return DeleteResult(None, False), freed
        seq = _next_seq(w, b.name, key, old)
        vid = new_id() if b.versioning == "Enabled" else "null"
        _make_room(w, b, key, old, vid, now, freed)
        w.insert_noncurrent(ObjectInfo(b.name, key, 0, "", now, "", version_id=vid, seq=seq,
                                       delete_marker=True, is_latest=True))
        return DeleteResult(vid, True), freed
    v = w.version(b.name, key, version_id)
    if v is None:
        return DeleteResult(version_id, False), freed
    check_unlocked(v, now, bypass_governance)
    if not v.delete_marker and v.is_latest:
        w.delete_object(b.name, key)
        _promote(w, b.name, key)
    else:
        w.delete_noncurrent(b.name, key, version_id)
        if v.delete_marker and v.is_latest:
            _promote(w, b.name, key)
    if not v.delete_marker:
        freed.append(v.blob_id)
    return DeleteResult(version_id, v.delete_marker), freed


# -- listing -----------------------------------------------------------------------

def _merged(stack: ExitStack, c: CatalogReader, bucket: str, start: str, end: str | None) -> Iterator[ObjectInfo]:
    """Every version of keys in ``[start, end)``: by key, newest first (lazy)."""
    big = 1 << 62
    cur = stack.enter_context(closing(c.scan_objects(bucket, start, inclusive=True, end=end, limit=big)))
    non = stack.enter_context(closing(c.scan_noncurrent(bucket, start, inclusive=True, end=end, limit=big)))
    return heapq.merge(cur, non, key=lambda o: (o.key, -o.seq))


def _start(c: CatalogReader, bucket: str, prefix: str, delimiter: str, key_marker: str,
           version_id_marker: str) -> tuple[str | None, str | None, int | None]:
    """``(start key, key to skip from, seq to skip from)``: where a page starts.

    Raises:
        InvalidArgument: a version-id marker without a key marker, or one that is malformed.
    """
    if version_id_marker and not key_marker:
        raise InvalidArgument("A version-id marker cannot be specified without a key marker.",
                              argument_name="version-id-marker", argument_value=version_id_marker)
    if not key_marker or key_marker < prefix:
        return prefix, None, None
    if version_id_marker:
        check_version_id(version_id_marker)
        v = c.version(bucket, key_marker, version_id_marker)
        if v is not None:
            return key_marker, key_marker, v.seq  # the versions after it: older, same key
    if delimiter and key_marker.startswith(prefix):
        i = key_marker.find(delimiter, len(prefix))
        if i >= 0 and i + len(delimiter) == len(key_marker):
            return successor(key_marker), None, None  # a common prefix: past every key under it
    return key_marker + "\x00", None, None  # the first key after key_marker


def list_versions(c: CatalogReader, bucket: str, *, prefix: str, delimiter: str, key_marker: str,
                  version_id_marker: str, max_keys: int) -> VersionListResult:
    """One page of ListObjectVersions, read through ``c`` (one snapshot).

    Args:
        prefix, delimiter: as for ListObjectsV2; each common prefix counts as one entry.
        key_marker, version_id_marker: start after this version (after every
            version of ``key_marker`` when no version id is given).
        max_keys: 1 to 1000 entries.

    Raises:
        InvalidArgument: a bad marker, or text that is not valid UTF-8.
    """
    for text, name in ((prefix, "prefix"), (delimiter, "delimiter"), (key_marker, "key-marker")):
        check_text(text, name)
    start, skip_key, skip_seq = _start(c, bucket, prefix, delimiter, key_marker, version_id_marker)
    end = successor(prefix) if prefix else None
    out: list[ObjectInfo] = []
    prefixes: list[str] = []
    truncated = False
    last: ObjectInfo | str | None = None
    while start is not None and not truncated:
        restart = None
        with ExitStack() as stack:
            for v in _merged(stack, c, bucket, start, end):
                if skip_key is not None and v.key == skip_key and skip_seq is not None and v.seq >= skip_seq:
                    continue
                if len(out) + len(prefixes) >= max_keys:
                    truncated = True
                    break
                i = v.key.find(delimiter, len(prefix)) if delimiter else -1
                if i >= 0:
                    cp = v.key[: i + len(delimiter)]
                    prefixes.append(cp)
                    last = cp
                    restart = successor(cp)
                    break
                out.append(v)
                last = v
        if restart is None:
            break
        start, skip_key = restart, None
    if not truncated or last is None:
        return VersionListResult(out, prefixes, False)
    if isinstance(last, str):
        return VersionListResult(out, prefixes, True, last, None)
    return VersionListResult(out, prefixes, True, last.key, last.version_id)
