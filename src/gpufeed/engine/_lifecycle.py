"""Bucket lifecycle rules: checking them, storing them, and applying them.

A bucket's rules (:class:`~gpufeed.engine.types.LifecycleRule`) live in the
catalog. :meth:`Lifecycle.apply` is one pass over every bucket's enabled
rules at a given time (the node calls it from a background thread; tests
call it with any ``now``):

- ``Expiration`` (``Days`` or ``Date``) expires current objects under the
  rule's prefix whose time has come: in a never-versioned bucket they are
  deleted; in a versioned one (``Enabled`` or ``Suspended``) it does what
  DeleteObject without a version id does (a delete marker becomes the latest
  version; no data goes, except a suspended bucket's replaced ``null``
  version). Each is conditional on the version read still being current (a
  key overwritten meanwhile keeps its new version).
- ``NoncurrentVersionExpiration`` removes for good the noncurrent versions
  (delete markers included) that became noncurrent ``NoncurrentDays`` days
  ago, counted from when the next newer version was made, keeping each key's
  ``NewerNoncurrentVersions`` newest noncurrent ones whatever their age. A
  version object lock protects (retention until after ``now``, legal hold) is
  kept and counted as skipped.
- ``ExpiredObjectDeleteMarker`` removes a delete marker that is its key's
  only version; ``Expiration`` ``Days`` does too once the marker is ``Days``
  old.
- ``AbortIncompleteMultipartUpload`` aborts uploads under the prefix started
  ``DaysAfterInitiation`` days ago.
- Separately from any rule, the node's default aborts uploads nobody has
  touched (started, or sent a part) for ``idle_upload_s`` seconds: what
  crashed clients leave behind.

"N days after t" is ``t + N days`` rounded up to the next midnight UTC, as S3
computes it. Work is done in batches of :data:`_BATCH` keys, one catalog
transaction each, so a large bucket never holds the writer for long.

Source: "Lifecycle configuration elements", "Setting lifecycle
configuration on a bucket" and "Managing delete markers", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html;
"PutBucketLifecycleConfiguration", "LifecycleExpiration" and
"NoncurrentVersionExpiration", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketLifecycleConfiguration.html
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from contextlib import closing

from ..errors import AccessDenied, InvalidArgument, InvalidRequestError, MalformedXML, NoSuchLifecycleConfiguration
from ._blobs import BlobFiles
from ._names import check_text, successor
from ._release import releasable
from ._versions import check_unlocked, delete_version
from .catalog import Catalog, CatalogWriter, require_bucket
from .types import BucketInfo, LifecycleResult, LifecycleRule, ObjectInfo, UploadInfo

__all__ = ["Lifecycle", "LifecycleCalls", "check_rules", "due_time", "MAX_RULES", "MAX_NEWER_NONCURRENT", "DAY_S"]

#: Most rules one bucket's configuration holds (S3's limit).
MAX_RULES = 1000
#: Longest rule ID, characters (S3's limit).
_MAX_ID = 255
#: Seconds in a day.
DAY_S = 86400
#: Keys examined, and objects or uploads removed, per catalog transaction.
_BATCH = 1000
#: Most noncurrent versions ``NewerNoncurrentVersions`` keeps (S3's limit).
MAX_NEWER_NONCURRENT = 100
#: "Every version of a key" as a catalog row limit.
_ALL = 1 << 62

#: ``on_delete(w, bucket, key)``: the engine's hook for an object deleted in ``w``.
OnDelete = Callable[[CatalogWriter, str, str], None]


def due_time(t_s: float, days: int) -> float:
    """When something made at ``t_s`` (Unix s) is ``days`` days old by S3's rule:
    ``t_s + days`` rounded up to the next midnight UTC, Unix s."""
    return math.ceil((t_s + days * DAY_S) / DAY_S) * DAY_S


def _check_days(value: object, what: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise InvalidArgument(f"'{what}' must be a positive integer")


def check_rules(rules: list[LifecycleRule]) -> None:
    """Check a whole lifecycle configuration as S3 does.

    Raises:
        InvalidArgument: no rules or more than :data:`MAX_RULES`, an empty, long
            or repeated ID, a number of days that is not a positive integer, a
            date not at midnight UTC, a prefix that is not valid UTF-8,
            ``NewerNoncurrentVersions`` without ``NoncurrentDays`` or over
            :data:`MAX_NEWER_NONCURRENT`.
        InvalidRequestError: a rule with no action, or with both ``Days`` and
            ``Date`` of ``Expiration`` (S3's ``InvalidRequest``).
        MalformedXML: ``ExpiredObjectDeleteMarker`` with ``Days`` or ``Date``
            in one ``Expiration`` (what S3 answers).
    """
    if not rules:
        raise InvalidArgument("a lifecycle configuration needs at least one rule")
    if len(rules) > MAX_RULES:
        raise InvalidArgument(f"a lifecycle configuration has at most {MAX_RULES} rules, not {len(rules)}")
    seen: set[str] = set()
    for r in rules:
        if not isinstance(r, LifecycleRule):
            raise InvalidArgument(f"not a LifecycleRule: {r!r}")
        if not isinstance(r.id, str) or not r.id or len(r.id) > _MAX_ID:
            raise InvalidArgument(f"ID length should not exceed allowed limit of {_MAX_ID}")
        if r.id in seen:
            raise InvalidArgument("Rule ID must be unique. Found same ID for more than one rule")
        seen.add(r.id)
        check_text(r.prefix, "prefix")
        _check_actions(r)


def _check_actions(r: LifecycleRule) -> None:
    """Check the actions of one rule (see :func:`check_rules`)."""
    if (r.expiration_days is None and r.expiration_date is None and r.abort_days is None
            and r.noncurrent_days is None and r.newer_noncurrent is None
            and r.expired_object_delete_marker is None):
        raise InvalidRequestError("At least one action needs to be specified in a rule")
    if r.expiration_days is not None and r.expiration_date is not None:
        raise InvalidRequestError("Expiration can have either Days or Date, not both")
    if r.expired_object_delete_marker is not None and (
            r.expiration_days is not None or r.expiration_date is not None):
        raise MalformedXML("The XML you provided was not well-formed or did not validate against our "
                           "published schema: ExpiredObjectDeleteMarker cannot be specified with Days or Date")
    if not (r.expired_object_delete_marker is None or isinstance(r.expired_object_delete_marker, bool)):
        raise InvalidArgument("'ExpiredObjectDeleteMarker' must be true or false")
    _check_days(r.expiration_days, "Days' for Expiration action")
    _check_days(r.abort_days, "DaysAfterInitiation' for AbortIncompleteMultipartUpload action")
    if r.newer_noncurrent is not None and r.noncurrent_days is None:
        raise InvalidArgument("'NoncurrentDays' for NoncurrentVersionExpiration action must be a positive integer")
    _check_days(r.noncurrent_days, "NoncurrentDays' for NoncurrentVersionExpiration action")
    _check_days(r.newer_noncurrent, "NewerNoncurrentVersions' for NoncurrentVersionExpiration action")
    if r.newer_noncurrent is not None and r.newer_noncurrent > MAX_NEWER_NONCURRENT:
        raise InvalidArgument(f"'NewerNoncurrentVersions' for NoncurrentVersionExpiration action must be "
                              f"at most {MAX_NEWER_NONCURRENT}")
    if r.expiration_date is not None and (
            not math.isfinite(r.expiration_date) or r.expiration_date % DAY_S != 0):
        raise InvalidArgument("'Date' must be at midnight GMT")


class Lifecycle:
    """The lifecycle rules of one engine.

    Args:
        catalog: the engine's catalog.
        files: the engine's data folder (blob and upload files to remove).
        on_delete: called for each object a rule deletes, inside the deleting
            transaction (the kv-bucket bookkeeping).

    Attributes:
        forget_upload: ``(bucket, key, upload_id)``: removes an aborted upload's
            part files (the engine sets the multipart one, which in a cluster
            removes them on every node); by default this node's folder only.
    """

    def __init__(self, catalog: Catalog, files: BlobFiles, on_delete: OnDelete) -> None:
        self._cat = catalog
        self._files = files
        self._on_delete = on_delete
        self.forget_upload: Callable[[str, str, str], None] = lambda _b, _k, upload_id: \
            files.remove_upload_dir(upload_id)

    # configuration --------------------------------------------------------
    def put(self, bucket: str, rules: list[LifecycleRule]) -> None:
        """Check ``rules`` and make them the bucket's configuration (replacing any)."""
        rules = list(rules)
        check_rules(rules)
        with self._cat.write() as w:
            require_bucket(w, bucket)
            w.set_lifecycle(bucket, rules)

    def get(self, bucket: str) -> list[LifecycleRule]:
        """The bucket's rules.

        Raises:
            NoSuchBucket: no such bucket.
            NoSuchLifecycleConfiguration: it has none.
        """
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            rules = c.lifecycle(bucket)
        if rules is None:
            raise NoSuchLifecycleConfiguration("The lifecycle configuration does not exist", bucket=bucket)
        return rules

    def delete(self, bucket: str) -> None:
        """Remove the bucket's configuration (none is fine)."""
        with self._cat.write() as w:
            require_bucket(w, bucket)
            w.delete_lifecycle(bucket)

    # applying ------------------------------------------------------------
    def apply(self, now: float | None, idle_upload_s: float) -> LifecycleResult:
        """One pass of every enabled rule of every bucket at ``now`` (Unix s;
        ``None`` for the clock), then the idle-upload default (``0`` skips it)."""
        now = time.time() if now is None else now
        tally = _Tally()
        for bucket, rules in self._cat.lifecycles().items():
            for r in rules:
                if not r.enabled:
                    continue
                if r.expiration_days is not None or r.expiration_date is not None:
                    tally.expired_objects += self._expire(bucket, r, now)
                if (r.noncurrent_days is not None or r.expired_object_delete_marker
                        or r.expiration_days is not None):
                    self._expire_versions(bucket, r, now, tally)
                if r.abort_days is not None:
                    days = r.abort_days
                    stale = [u for u in self._cat.uploads(bucket)
                             if u.key.startswith(r.prefix) and due_time(u.initiated, days) <= now]
                    tally.aborted_uploads += self._abort(stale, None)
        if idle_upload_s > 0:
            tally.aborted_uploads += self._abort(self._cat.idle_uploads(now - idle_upload_s), now - idle_upload_s)
        return LifecycleResult(**dataclasses.asdict(tally))

    def _expire(self, bucket: str, rule: LifecycleRule, now: float) -> int:
        """Expire the current objects under ``rule.prefix`` whose expiration has come."""
        date, days = rule.expiration_date, rule.expiration_days
        if date is not None and now < date:
            return 0

        def is_due(last_modified: float) -> bool:
            return date is not None or (days is not None and due_time(last_modified, days) <= now)

        end = successor(rule.prefix) if rule.prefix else None
        start, inclusive, done = rule.prefix, True, 0
        while True:
            with closing(self._cat.scan_objects(bucket, start, inclusive=inclusive, end=end,
                                                limit=_BATCH)) as rows:
                page = [(o.key, o.blob_id, o.last_modified) for o in rows]
            done += self._delete_objects(bucket, [(k, b) for k, b, lm in page if is_due(lm)], now)
            if len(page) < _BATCH:
                return done
            start, inclusive = page[-1][0], False

    def _delete_objects(self, bucket: str, due: list[tuple[str, str]], now: float | None = None) -> int:
        """Expire each ``(key, blob_id)`` that is still the key's current version
        (at ``now``, Unix s; ``None`` for the clock); returns how many."""
        if not due:
            return 0
        now = time.time() if now is None else now
        done = 0
        freed: list[str] = []
        with self._cat.write() as w:
            b = w.bucket(bucket)
            if b is None:
                return 0
            for key, blob_id in due:
                if b.versioning:
                    if self._mark_deleted(w, b, key, blob_id, now, freed):
                        done += 1
                elif w.delete_object(bucket, key, blob_id):
                    self._on_delete(w, bucket, key)
                    freed.append(blob_id)
                    done += 1
            freed = releasable(w, freed)
        self._files.remove_blobs(freed)
        return done

    def _mark_deleted(self, w: CatalogWriter, b: BucketInfo, key: str, blob_id: str, now: float,
                      freed: list[str]) -> bool:
        """In a versioned bucket, expire the current version ``blob_id`` of ``key``
        as DeleteObject without a version id does (:func:`delete_version`);
        blob ids it frees go to ``freed``.

        Returns:
            Whether it was done: not when the version is no longer current, nor
            when the ``null`` version a suspended bucket would replace is protected.
        """
        cur = w.object(b.name, key)
        if cur is None or cur.blob_id != blob_id:
            return False
        if b.versioning == "Suspended":
            null = w.version(b.name, key, "null")
            if null is not None and _locked(null, now):
                return False
        _, gone = delete_version(w, b, key, None, False, now)
        if gone and w.object(b.name, key) is None:
            self._on_delete(w, b.name, key)
        freed.extend(gone)
        return True

    def _expire_versions(self, bucket: str, rule: LifecycleRule, now: float, tally: _Tally) -> None:
        """Apply ``rule``'s noncurrent-version and delete-marker actions to every
        key under its prefix that has versions besides a current one, a batch
        of keys per catalog transaction (where each key's versions are read
        again, so what is removed is decided on the state it is removed from)."""
        end = successor(rule.prefix) if rule.prefix else None
        start, inclusive = rule.prefix, True
        while True:
            with closing(self._cat.scan_noncurrent(bucket, start, inclusive=inclusive, end=end,
                                                   limit=_BATCH)) as rows:
                page = [(o.key, o.delete_marker and o.is_latest) for o in rows]
            keys = _candidates(page, rule)
            if keys:
                freed: list[str] = []
                with self._cat.write() as w:
                    b = w.bucket(bucket)
                    if b is None:
                        return
                    for key in keys:
                        _prune_key(w, b, key, rule, now, tally, freed)
                    freed = releasable(w, freed)
                self._files.remove_blobs(freed)
            if len(page) < _BATCH:
                return
            start, inclusive = page[-1][0], False

    def _abort(self, uploads: list[UploadInfo], idle_before: float | None) -> int:
        """Abort ``uploads`` (rows, then part files), batch by batch. With
        ``idle_before``, an upload touched at or after it meanwhile is kept."""
        done = 0
        for i in range(0, len(uploads), _BATCH):
            dropped: list[UploadInfo] = []
            with self._cat.write() as w:
                for u in uploads[i:i + _BATCH]:
                    if w.upload(u.bucket, u.key, u.upload_id) is None:
                        continue  # completed or aborted meanwhile
                    if idle_before is not None and any(
                            p.info.last_modified >= idle_before for p in w.parts(u.upload_id)):
                        continue  # a part arrived meanwhile
                    w.delete_upload(u.upload_id)
                    dropped.append(u)
            for u in dropped:
                self.forget_upload(u.bucket, u.key, u.upload_id)
            done += len(dropped)
        return done


@dataclasses.dataclass(slots=True)
class _Tally:
    """The counters of one pass (the fields of :class:`LifecycleResult`)."""

    expired_objects: int = 0
    aborted_uploads: int = 0
    noncurrent_expired: int = 0
    delete_markers_removed: int = 0
    locked_skipped: int = 0


def _locked(v: ObjectInfo, now: float) -> bool:
    """Whether object lock keeps lifecycle from removing ``v`` at ``now`` (no bypass)."""
    try:
        check_unlocked(v, now, False)
    except AccessDenied:
        return True
    return False


def _candidates(page: list[tuple[str, bool]], rule: LifecycleRule) -> list[str]:
    """The keys of a page of noncurrent rows (``(key, is a latest delete marker)``,
    newest first within a key) that ``rule`` may act on: every key when it
    expires noncurrent versions, else those whose one row is a latest delete marker."""
    keys: list[str] = []
    lone: list[bool] = []
    for key, latest_marker in page:
        if keys and keys[-1] == key:
            lone[-1] = False
        else:
            keys.append(key)
            lone.append(latest_marker)
    if rule.noncurrent_days is not None:
        return keys
    return [k for k, one in zip(keys, lone, strict=True) if one]


def _prune_key(w: CatalogWriter, b: BucketInfo, key: str, rule: LifecycleRule, now: float,
               tally: _Tally, freed: list[str]) -> None:
    """Inside ``w``: remove the key's due noncurrent versions, then its delete
    marker when that is all that is left and ``rule`` expires it."""
    cur = w.object(b.name, key)
    versions = ([cur] if cur is not None else []) + w.noncurrent(b.name, key, _ALL)  # newest first
    if not versions:
        return
    days = rule.noncurrent_days
    if days is not None:
        keep = rule.newer_noncurrent or 0
        left = versions[:1]
        # versions[i] became noncurrent when versions[i - 1] was made; i - 1 newer noncurrent ones
        for i in range(1, len(versions)):
            v = versions[i]
            if i - 1 < keep or due_time(versions[i - 1].last_modified, days) > now:
                left.append(v)
            elif _locked(v, now):
                tally.locked_skipped += 1
                left.append(v)
            else:
                freed.extend(delete_version(w, b, key, v.version_id, False, now)[1])
                tally.noncurrent_expired += 1
        versions = left
    m = versions[0]
    if len(versions) == 1 and m.delete_marker and m.is_latest and (
            rule.expired_object_delete_marker
            or (rule.expiration_days is not None and due_time(m.last_modified, rule.expiration_days) <= now)):
        delete_version(w, b, key, m.version_id, False, now)
        tally.delete_markers_removed += 1


class LifecycleCalls:
    """The lifecycle part of :class:`~gpufeed.engine.Engine`'s API, mixed into it."""

    _lifecycle: Lifecycle

    def put_bucket_lifecycle(self, bucket: str, rules: list[LifecycleRule]) -> None:
        """Make ``rules`` the bucket's lifecycle configuration, replacing any.

        Raises:
            NoSuchBucket: it does not exist.
            InvalidArgument, InvalidRequestError: rules S3 would refuse
                (see :func:`gpufeed.engine._lifecycle.check_rules`).

        Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketLifecycleConfiguration.html
        """
        self._lifecycle.put(bucket, rules)

    def get_bucket_lifecycle(self, bucket: str) -> list[LifecycleRule]:
        """The bucket's lifecycle rules, in the order they were set.

        Raises:
            NoSuchBucket: it does not exist.
            NoSuchLifecycleConfiguration: it has none.
        """
        return self._lifecycle.get(bucket)

    def delete_bucket_lifecycle(self, bucket: str) -> None:
        """Remove the bucket's lifecycle configuration (having none is fine).

        Raises:
            NoSuchBucket: it does not exist.
        """
        self._lifecycle.delete(bucket)

    def apply_lifecycle(self, now: float | None = None, *, idle_upload_s: float = 0.0) -> LifecycleResult:
        """Apply every bucket's enabled lifecycle rules once, as of ``now``.

        Expired current objects are deleted, or in a versioned bucket get a
        delete marker (only the version that expired; a key overwritten
        meanwhile stays), due noncurrent versions not under object lock and
        lone delete markers are removed, due multipart uploads aborted (see
        :mod:`gpufeed.engine._lifecycle`); then,
        with ``idle_upload_s > 0``, every upload with no activity (start or part
        upload) for that many seconds is aborted, whatever the rules say.

        Args:
            now: Unix s the rules are applied at; ``None`` for the clock.
            idle_upload_s: seconds after which an untouched upload is aborted; 0 never.

        Returns:
            What was removed.

        Raises:
            InternalError: the catalog failed, or the engine is closed.
        """
        return self._lifecycle.apply(now, idle_upload_s)
