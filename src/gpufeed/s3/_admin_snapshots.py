"""The snapshot calls of the admin API (:mod:`._admin`), in JSON.

====== ================================================= ==========================================
method path (under ``/_gpufeed/admin/``)                  answer (JSON)
====== ================================================= ==========================================
GET    ``buckets/B/snapshots``                           ``{"snapshots": [snapshot, ...]}`` oldest first
POST   ``buckets/B/snapshots`` ``{"name"}``              the snapshot ``{"bucket", "name", "created",
                                                         "kind", "objects", "bytes"}``
GET    ``buckets/B/snapshots/S``                         the snapshot
DELETE ``buckets/B/snapshots/S`` ``{"bypass_governance"}``  ``{}``
POST   ``buckets/B/snapshots/S/restore`` ``{"prefix"}``  ``{"restored", "deleted", "unchanged"}``
GET    ``buckets/B/snapshots/S/diff`` (``?target=T&prefix=P``) ``{"added", "changed", "removed"}``
                                                         (no ``target``: against the live bucket)
GET    ``buckets/B/snapshot-schedule``                   ``{"hourly", "daily"}`` (keep counts, 0 = off)
PUT    ``buckets/B/snapshot-schedule`` ``{"hourly", "daily"}`` the schedule after the change (a count left out is kept)
====== ================================================= ==========================================

Who may call: the node's admin key, for any bucket; any other access key
for the buckets its tenant owns (a tenant snapshots its own buckets only;
another tenant's bucket is 403 AccessDenied, a missing one 404 NoSuchBucket,
as bucket calls answer). Session credentials (CreateSession) cannot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from ..engine import Engine
from ..errors import AccessDenied, InvalidArgument, MethodNotAllowed

__all__ = ["is_snapshot_call", "snapshot_call"]


def is_snapshot_call(parts: list[str]) -> bool:
    """Whether the admin path ``parts`` (split on ``/``) is one of the calls above."""
    return len(parts) >= 3 and parts[0] == "buckets" and parts[2] in ("snapshots", "snapshot-schedule")


def _flag(body: Mapping[str, object], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be true or false, not {value!r}")
    return value


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string, not {value!r}")
    return value


def snapshot_call(engine: Engine, method: str, parts: list[str], query: Mapping[str, str],
                  body: Callable[[], dict], *, admin: bool, tenant: str | None) -> dict:
    """Run one snapshot call (blocking; for the worker pool).

    Args:
        parts: the path after the admin prefix, split on ``/``.
        body: returns the request's JSON body (``{}`` when empty).
        admin: the request was signed with the node's admin key.
        tenant: the tenant of the key it was signed with (``None``: none).

    Returns:
        The JSON-ready answer.

    Raises:
        AccessDenied: not the admin key and not the bucket's owner.
        NoSuchBucket, NoSuchSnapshot, InvalidArgument, SnapshotAlreadyExists,
            MethodNotAllowed, NoSuchKey: as the engine raises them, or an unknown path.
    """
    bucket, rest = parts[1], parts[2:]
    if not admin and (tenant is None or engine.bucket_owner(bucket) != tenant):
        raise AccessDenied("only the bucket's owner or the node's admin key may manage its snapshots")
    match rest:
        case ["snapshots"] if method == "GET":
            return {"snapshots": [dataclasses.asdict(s) for s in engine.list_snapshots(bucket)]}
        case ["snapshots"] if method == "POST":
            return dataclasses.asdict(engine.create_snapshot(bucket, _text(body().get("name"), "name")))
        case ["snapshots", name] if method == "GET":
            return dataclasses.asdict(engine.head_snapshot(bucket, name))
        case ["snapshots", name] if method == "DELETE":
            engine.delete_snapshot(bucket, name, bypass_governance=_flag(body(), "bypass_governance"))
            return {}
        case ["snapshots", name, "restore"] if method == "POST":
            prefix = _text(body().get("prefix", ""), "prefix")
            return dataclasses.asdict(engine.restore_snapshot(bucket, name, prefix=prefix))
        case ["snapshots", name, "diff"] if method == "GET":
            diff = engine.diff_snapshots(bucket, name, query.get("target") or None, prefix=query.get("prefix", ""))
            return dataclasses.asdict(diff)
        case ["snapshot-schedule"] if method == "GET":
            return engine.snapshot_schedule(bucket)
        case ["snapshot-schedule"] if method == "PUT":
            b = body()
            unknown = set(b) - {"hourly", "daily"}
            if unknown:
                raise InvalidArgument(f"unknown schedule fields: {', '.join(sorted(unknown))} (hourly, daily)")
            now = engine.snapshot_schedule(bucket)  # a count left out is kept, as the CLI does
            return engine.set_snapshot_schedule(bucket, hourly=b.get("hourly", now["hourly"]),
                                                daily=b.get("daily", now["daily"]))
        case ["snapshots"] | ["snapshots", _] | ["snapshots", _, "restore" | "diff"] | ["snapshot-schedule"]:
            raise MethodNotAllowed(f"{method} is not allowed on this snapshot call")
    raise InvalidArgument(f"no snapshot admin call {'/'.join(parts)}")
