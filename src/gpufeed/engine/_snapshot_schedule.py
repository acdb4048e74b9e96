"""Snapshot schedules: per bucket, keep the last N hourly and/or daily snapshots.

A bucket's schedule is its configuration document ``snapshot-schedule``
(JSON ``{"hourly": N, "daily": N}``, kept by the catalog with its other
bucket documents and removed with the bucket). The node calls
:meth:`ScheduledSnapshots.run_snapshot_schedules` in the background (every
``NodeConfig.snapshot_interval_s``); each pass, for every scheduled bucket:

- makes the snapshot of the current period if it has none: hourly ones are
  named ``auto-hourly-YYYY-MM-DDTHH``, daily ones ``auto-daily-YYYY-MM-DD``
  (UTC, the period they were made in);
- deletes the oldest snapshots of that kind beyond N (only snapshots the
  schedule made; manual ones are never pruned). One that object lock still
  protects is kept and pruned at a later pass.

Setting a kind's N to 0 stops making that kind (what exists stays until
deleted by hand).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from ..errors import AccessDenied, GpufeedError, InvalidArgument
from .catalog import Catalog, require_bucket
from .types import SnapshotInfo

__all__ = ["ScheduledSnapshots", "SCHEDULE_CONFIG", "auto_name", "MAX_KEEP"]

log = logging.getLogger("gpufeed.snapshots")

#: The bucket configuration document that holds a schedule.
SCHEDULE_CONFIG = "snapshot-schedule"
#: Most snapshots one kind of schedule keeps.
MAX_KEEP = 10000
_KINDS = ("hourly", "daily")
_FORMATS = {"hourly": "%Y-%m-%dT%H", "daily": "%Y-%m-%d"}


def auto_name(kind: str, now: float) -> str:
    """The name a schedule gives the snapshot of ``kind`` made at ``now`` (Unix s, UTC)."""
    return f"auto-{kind}-{time.strftime(_FORMATS[kind], time.gmtime(now))}"


def _keep(value: object, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_KEEP:
        raise InvalidArgument(f"{kind} keep count must be an integer 0..{MAX_KEEP}, not {value!r}",
                              argument_name=kind, argument_value=str(value))
    return value


class ScheduledSnapshots:
    """Schedule calls, mixed into :class:`~gpufeed.engine.Engine`."""

    _cat: Catalog
    if TYPE_CHECKING:
        def create_snapshot(self, bucket: str, name: str, *, kind: str = "manual",
                            now: float | None = None) -> SnapshotInfo:
            """:meth:`~gpufeed.engine._snapshots.SnapshotCalls.create_snapshot`."""

        def delete_snapshot(self, bucket: str, name: str, *, bypass_governance: bool = False) -> None:
            """:meth:`~gpufeed.engine._snapshots.SnapshotCalls.delete_snapshot`."""

    def set_snapshot_schedule(self, bucket: str, *, hourly: int = 0, daily: int = 0) -> dict[str, int]:
        """Keep the last ``hourly`` hourly and ``daily`` daily snapshots of the
        bucket (both 0: no schedule).

        Returns:
            The schedule, ``{"hourly": n, "daily": n}``.

        Raises:
            NoSuchBucket: no such bucket.
            InvalidArgument: a count outside 0..:data:`MAX_KEEP`, or a kv bucket.
        """
        sched = {"hourly": _keep(hourly, "hourly"), "daily": _keep(daily, "daily")}
        with self._cat.write() as w:
            b = require_bucket(w, bucket)
            if b.kind == "kv":
                raise InvalidArgument(f"bucket {bucket!r} is a kv (cache) bucket; it has no snapshots")
            if hourly or daily:
                w.set_bucket_config(bucket, SCHEDULE_CONFIG, json.dumps(sched))
            else:
                w.delete_bucket_config(bucket, SCHEDULE_CONFIG)
        return sched

    def snapshot_schedule(self, bucket: str) -> dict[str, int]:
        """The bucket's schedule, ``{"hourly": n, "daily": n}`` (zeros: none).

        Raises:
            NoSuchBucket: no such bucket.
        """
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            doc = c.bucket_config(bucket, SCHEDULE_CONFIG)
        stored = json.loads(doc) if doc else {}
        return {k: int(stored.get(k, 0)) for k in _KINDS}

    def run_snapshot_schedules(self, now: float | None = None) -> list[str]:
        """One pass of every bucket's schedule (see the module docstring). A bucket
        that fails is logged and skipped.

        Args:
            now: the pass's time, Unix s (``None``: the clock).

        Returns:
            ``"bucket/name"`` of every snapshot made or deleted, ``+`` / ``-`` prefixed.
        """
        now = time.time() if now is None else now
        done: list[str] = []
        for b in self._cat.buckets():
            doc = self._cat.bucket_config(b.name, SCHEDULE_CONFIG)
            if not doc:
                continue
            try:
                sched = json.loads(doc)
                for kind in _KINDS:
                    if int(sched.get(kind, 0)) > 0:
                        done += self._run_one(b.name, kind, int(sched[kind]), now)
            except GpufeedError as exc:
                log.warning("snapshot schedule of bucket %s: %s", b.name, exc)
        return done

    def _run_one(self, bucket: str, kind: str, keep: int, now: float) -> list[str]:
        done: list[str] = []
        name = auto_name(kind, now)
        ours = [s for s in self._cat.bucket_snapshots(bucket) if s.kind == kind]
        if not any(s.name == name for s in ours):
            ours.append(self.create_snapshot(bucket, name, kind=kind, now=now))
            done.append(f"+{bucket}/{name}")
        ours.sort(key=lambda s: (s.created, s.name))
        for old in ours[:max(0, len(ours) - keep)]:
            try:
                self.delete_snapshot(bucket, old.name)
                done.append(f"-{bucket}/{old.name}")
            except AccessDenied as exc:
                log.info("snapshot %s/%s kept: %s", bucket, old.name, exc.message)
        return done
