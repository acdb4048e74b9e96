"""The node's admin API: tenants and access keys over the S3 port, in JSON.

Requests are signed with SigV4 like any S3 request and must be signed with
the node's configured key (the admin key; it acts for the default tenant).
Paths live under ``/_gpufeed/admin/``, which no bucket can shadow (``_`` is
not a bucket name's first character):

====== ======================================== =====================================
method path                                     answer (JSON)
====== ======================================== =====================================
GET    ``tenants``                              ``{"tenants": [{"name", "created"}]}``
POST   ``tenants`` ``{"name"}``                 the tenant
GET    ``tenants/NAME/stats``                   :meth:`~gpufeed.engine.Engine.tenant_stats`
DELETE ``tenants/NAME``                         ``{}``
POST   ``tenants/NAME/keys``                    ``{"access_key", "secret_key", "tenant"}``
GET    ``keys`` (``?tenant=NAME``)              ``{"keys": [{"access_key", "tenant", "created", "revoked"}]}``
DELETE ``keys/ACCESS_KEY``                      ``{}``
GET    ``quotas/SCOPE/NAME`` (``tenant|bucket``)  ``{"scope", "name", "quota_bytes", "quota_objects",
                                                "stored_bytes", "stored_versions"}``
PUT    ``quotas/SCOPE/NAME`` ``{"bytes", "objects"}`` the same, after the change (a limit left out is kept)
GET    ``buckets/NAME/stats``                   :func:`bucket_report`
GET    ``buckets/NAME/data``                    the bucket's data policy (``DataPolicy`` fields)
PUT    ``buckets/NAME/data`` ``{field: value}`` the same, after the change (fields left out are kept)
GET    ``data``                                 :meth:`~gpufeed.engine.Engine.node_data_stats`
GET    ``damaged``                              ``{"chunks": Engine.damaged_chunks()}``
GET    ``scrub``                                the scrub status (``ScrubRunner.status``: ``running``,
                                                ``chunks``, ``bytes``, ``started_at``, ``last``)
POST   ``scrub`` ``{"rate"}`` (bytes/s, 0 none)  starts a scrub unless one runs; ``{"started", ...status}``
DELETE ``scrub``                                ends the scrub in progress; ``{"stopped", ...status}``
GET    ``cluster``                              the node's cluster: :func:`~gpufeed.engine._membership.cluster_report`
                                                (InvalidArgument when the node has no cluster name)
====== ======================================== =====================================

Bucket snapshots (``buckets/NAME/snapshots...``, ``buckets/NAME/snapshot-schedule``)
are in :mod:`._admin_snapshots`; those calls also take the key of the
tenant that owns the bucket. Replication rules (``replication...``) and the
calls a replication source makes on its target (``replica/NAME...``) are in
:mod:`._admin_replication`.

Errors answer ``{"error": code, "message": text}`` with the error's status.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from aiohttp import web

from ..engine._membership import cluster_report
from ..errors import AccessDenied, GpufeedError, InvalidArgument, MethodNotAllowed, NoSuchKey
from ._admin_replication import is_replication_call, replication_call
from ._admin_snapshots import is_snapshot_call, snapshot_call
from ._auth import AuthResult
from ._context import Services
from ._jsonbody import read_json_object
from ._router import Target
from ._server import ERROR_CODE

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["ADMIN_PREFIX", "handle_admin", "bucket_report"]

#: Every admin path starts with this.
ADMIN_PREFIX = "/_gpufeed/admin/"


def bucket_report(engine: Engine, name: str) -> dict:
    """What ``gpufeed admin bucket stats`` shows: ``Engine.bucket_stats`` (``kind``,
    ``capacity_bytes``, ``ttl_s``, ``etag_policy``, ``bytes``, ``objects``,
    ``evictions``, ``expirations``) plus ``name``, ``owner`` (its tenant),
    ``created`` (Unix seconds), ``versioning`` (``""`` never enabled,
    ``"Enabled"``, ``"Suspended"``), ``object_lock`` (``{"enabled", "mode",
    "days", "years"}``: the default retention, ``mode`` ``""`` for none) and
    ``quota`` (``{"bytes", "objects"}`` of the bucket's quota, 0 = no limit).

    Raises:
        NoSuchBucket: it does not exist.
    """
    info = engine.head_bucket(name)
    quota = engine.quota("bucket", name)
    return {"name": name, "owner": engine.bucket_owner(name), "created": info.created,
            **engine.bucket_stats(name), "versioning": info.versioning,
            "object_lock": {"enabled": info.object_lock, "mode": info.lock_mode, "days": info.lock_days,
                            "years": info.lock_years}, "quota": {"bytes": quota["quota_bytes"],
                                                                 "objects": quota["quota_objects"]}}


def _cluster_status(s: Services) -> dict:
    """The report of the node's cluster, by the node's expiry setting."""
    if not s.config.cluster:
        raise InvalidArgument("this node is not in a cluster: start nodes with --catalog postgresql://... "
                              "--cluster NAME")
    return cluster_report(s.engine.membership, s.config.cluster, s.config.cluster_expiry_s,
                          count_under=s.engine.under_replicated, replicas=s.config.cluster_replicas,
                          count_under_parts=s.engine.under_replicated_parts)


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


async def handle_admin(s: Services, request: web.BaseRequest, target: Target, auth: AuthResult) -> web.Response:
    """Answer one admin request (see the module docstring); never raises a
    :class:`GpufeedError` (a refusal's code is recorded for the access log)."""
    try:
        parts = target.path[len(ADMIN_PREFIX):].strip("/").split("/")
        admin = auth.access_key == s.config.access_key
        if is_replication_call(parts):
            return _json(await replication_call(s, request, parts, target.query, admin=admin,
                                                tenant=s.credentials.keys.tenant_of(auth.access_key)))
        if is_snapshot_call(parts):
            body = await _body(request) if request.method in ("POST", "PUT", "DELETE") else {}
            return _json(await s.call(snapshot_call, s.engine, request.method, parts, target.query, lambda: body,
                                      admin=admin, tenant=s.credentials.keys.tenant_of(auth.access_key)))
        if not admin:
            raise AccessDenied("the admin API needs the node's admin key")
        return await _dispatch(s, request, target)
    except GpufeedError as exc:
        request[ERROR_CODE] = exc.code
        return _json({"error": exc.code, "message": exc.message}, exc.status)


#: Most bytes of an admin call's JSON body (snapshots, scrub, tenants, keys).
_BODY_LIMIT = 64 << 10  # 64 KiB


async def _body(request: web.BaseRequest) -> dict:
    return await read_json_object(request, _BODY_LIMIT)


async def _dispatch(s: Services, request: web.BaseRequest, target: Target) -> web.Response:
    parts = target.path[len(ADMIN_PREFIX):].strip("/").split("/")
    method, e = request.method, s.engine
    match parts:
        case ["tenants"] if method == "GET":
            tenants = await s.call(e.list_tenants)
            return _json({"tenants": [dataclasses.asdict(t) for t in tenants]})
        case ["tenants"] if method == "POST":
            name = (await _body(request)).get("name")
            return _json(dataclasses.asdict(await s.call(e.create_tenant, name)))
        case ["tenants", name] if method == "DELETE":
            await s.call(e.delete_tenant, name)
            return _json({})
        case ["tenants", name, "stats"] if method == "GET":
            return _json(await s.call(e.tenant_stats, name))
        case ["tenants", name, "keys"] if method == "POST":
            info, secret = await s.call(e.create_access_key, name)
            return _json({"access_key": info.access_key, "secret_key": secret, "tenant": info.tenant})
        case ["keys"] if method == "GET":
            keys = await s.call(e.list_access_keys, target.query.get("tenant"))
            return _json({"keys": [dataclasses.asdict(k) for k in keys]})
        case ["keys", access_key] if method == "DELETE":
            await s.call(e.revoke_access_key, access_key)
            return _json({})
        case ["quotas", scope, name] if method == "GET":
            return _json(await s.call(e.quota, scope, name))
        case ["quotas", scope, name] if method == "PUT":
            body = await _body(request)
            await s.call(e.set_quota, scope, name, body.get("bytes"), body.get("objects"))
            return _json(await s.call(e.quota, scope, name))
        case ["buckets", name, "stats"] if method == "GET":
            return _json(await s.call(bucket_report, e, name))
        case ["buckets", name, "data"] if method == "GET":
            return _json(dataclasses.asdict(await s.call(e.bucket_data, name)))
        case ["buckets", name, "data"] if method == "PUT":
            body = await _body(request)
            return _json(dataclasses.asdict(await s.call(lambda: e.set_bucket_data(name, **body))))
        case ["data"] if method == "GET":
            return _json(await s.call(e.node_data_stats))
        case ["damaged"] if method == "GET":
            return _json({"chunks": await s.call(e.damaged_chunks)})
        case ["cluster"] if method == "GET":
            return _json(await s.call(_cluster_status, s))
        case ["scrub"] if method == "GET":
            return _json(e.scrubber.status())
        case ["scrub"] if method == "DELETE":
            stopped = await s.call(e.scrubber.cancel)
            return _json({"stopped": stopped, **e.scrubber.status()})
        case ["scrub"] if method == "POST":
            rate = (await _body(request)).get("rate", 0)
            if not isinstance(rate, (int, float)) or rate < 0:
                raise InvalidArgument("rate is bytes per second, >= 0")
            started = e.scrubber.start(float(rate))
            return _json({"started": started, **e.scrubber.status()})
        case (["tenants"] | ["tenants", _] | ["tenants", _, "stats" | "keys"] | ["keys"] | ["keys", _]
              | ["quotas", _, _] | ["buckets", _, "stats" | "data"] | ["data"] | ["damaged"] | ["scrub"] | ["cluster"]):
            raise MethodNotAllowed(f"{method} is not allowed on {target.path}")
    raise NoSuchKey(f"no admin call {target.path}")
