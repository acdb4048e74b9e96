"""Bucket lifecycle rules: checking them, storing them, and applying them.

A bucket's rules (:class:`~gpufeed.engine.types.LifecycleRule`) live in the
catalog. :meth:`Lifecycle.apply` is one pass over every bucket's enabled
rules at a given time (the node calls it from a background thread; tests
call it with any ``now``):

- ``Expiration`` (``Days`` or ``Date``) deletes current objects under the
  rule's prefix whose time has come. Each deletion is conditional on the
  version read (a key overwritten meanwhile keeps its new version). With
  versioning this step will instead add a delete marker, and
  ``NoncurrentVersionExpiration`` will delete old versions.
- ``AbortIncompleteMultipartUpload`` aborts uploads under the prefix started
  ``DaysAfterInitiation`` days ago.
- Separately from any rule, the node's default aborts uploads nobody has
  touched (started, or sent a part) for ``idle_upload_s`` seconds: what
  crashed clients leave behind.

"N days after t" is ``t + N days`` rounded up to the next midnight UTC, as S3
computes it. Work is done in batches of :data:`_BATCH` keys, one catalog
transaction each, so a large bucket never holds the writer for long.

Source: "Lifecycle configuration elements" and "Setting lifecycle
configuration on a bucket", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html;
"PutBucketLifecycleConfiguration", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketLifecycleConfiguration.html
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import closing

from ..errors import InvalidArgument, InvalidRequestError, NoSuchLifecycleConfiguration
from ._blobs import BlobFiles
from ._names import check_text, successor
from .catalog import Catalog, CatalogWriter, require_bucket
from .types import LifecycleResult, LifecycleRule, UploadInfo

__all__ = ["Lifecycle", "check_rules", "due_time", "MAX_RULES", "DAY_S"]

#: Most rules one bucket's configuration holds (S3's limit).
MAX_RULES = 1000
#: Longest rule ID, characters (S3's limit).
_MAX_ID = 255
#: Seconds in a day.
DAY_S = 86400
#: Keys examined, and objects or uploads removed, per catalog transaction.
_BATCH = 1000

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
            date not at midnight UTC, a prefix that is not valid UTF-8.
        InvalidRequestError: a rule with no action, or with both ``Days`` and
            ``Date`` of ``Expiration`` (S3's ``InvalidRequest``).
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
        if r.expiration_days is None and r.expiration_date is None and r.abort_days is None:
            raise InvalidRequestError("At least one action needs to be specified in a rule")
        if r.expiration_days is not None and r.expiration_date is not None:
            raise InvalidRequestError("Expiration can have either Days or Date, not both")
        _check_days(r.expiration_days, "Days' for Expiration action")
        _check_days(r.abort_days, "DaysAfterInitiation' for AbortIncompleteMultipartUpload action")
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
    """

    def __init__(self, catalog: Catalog, files: BlobFiles, on_delete: OnDelete) -> None:
        self._cat = catalog
        self._files = files
        self._on_delete = on_delete

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
        expired = aborted = 0
        for bucket, rules in self._cat.lifecycles().items():
            for r in rules:
                if not r.enabled:
                    continue
                if r.expiration_days is not None or r.expiration_date is not None:
                    expired += self._expire(bucket, r, now)
                if r.abort_days is not None:
                    days = r.abort_days
                    stale = [u for u in self._cat.uploads(bucket)
                             if u.key.startswith(r.prefix) and due_time(u.initiated, days) <= now]
                    aborted += self._abort(stale, None)
        if idle_upload_s > 0:
            aborted += self._abort(self._cat.idle_uploads(now - idle_upload_s), now - idle_upload_s)
        return LifecycleResult(expired, aborted)

    def _expire(self, bucket: str, rule: LifecycleRule, now: float) -> int:
        """Delete the current objects under ``rule.prefix`` whose expiration has come."""
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
            done += self._delete_objects(bucket, [(k, b) for k, b, lm in page if is_due(lm)])
            if len(page) < _BATCH:
                return done
            start, inclusive = page[-1][0], False

    def _delete_objects(self, bucket: str, due: list[tuple[str, str]]) -> int:
        """Delete each ``(key, blob_id)`` that is still that version; returns how many."""
        if not due:
            return 0
        gone: list[str] = []
        with self._cat.write() as w:
            if w.bucket(bucket) is None:
                return 0
            for key, blob_id in due:
                if w.delete_object(bucket, key, blob_id):
                    self._on_delete(w, bucket, key)
                    gone.append(blob_id)
        self._files.remove_blobs(gone)
        return len(gone)

    def _abort(self, uploads: list[UploadInfo], idle_before: float | None) -> int:
        """Abort ``uploads`` (rows, then part files), batch by batch. With
        ``idle_before``, an upload touched at or after it meanwhile is kept."""
        done = 0
        for i in range(0, len(uploads), _BATCH):
            dropped: list[str] = []
            with self._cat.write() as w:
                for u in uploads[i:i + _BATCH]:
                    if w.upload(u.bucket, u.key, u.upload_id) is None:
                        continue  # completed or aborted meanwhile
                    if idle_before is not None and any(
                            p.info.last_modified >= idle_before for p in w.parts(u.upload_id)):
                        continue  # a part arrived meanwhile
                    w.delete_upload(u.upload_id)
                    dropped.append(u.upload_id)
            for upload_id in dropped:
                self._files.remove_upload_dir(upload_id)
            done += len(dropped)
        return done
