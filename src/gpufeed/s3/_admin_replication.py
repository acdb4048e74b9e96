"""The replication calls of the admin API (:mod:`._admin`), in JSON.

On the source node (the node's admin key only: rules hold a target's key):

====== ============================================== ==========================================
method path (under ``/_gpufeed/admin/``)                answer (JSON)
====== ============================================== ==========================================
GET    ``replication``                                ``{"rules": [status, ...]}``
POST   ``replication`` ``{"bucket", "target",         the new rule's status
       "target_bucket", "access_key", "secret_key"}``
GET    ``replication/B``                              the rule's status (:meth:`Replicator.status`)
DELETE ``replication/B``                              ``{"bucket", "removed"}``
POST   ``replication/B/pause`` (``resume``)           the status after the change
POST   ``replication/B/sync``                         the round's result (:class:`RoundResult`)
====== ============================================== ==========================================

On the target node (the node's admin key, or a key of the tenant that owns
the bucket; claiming a missing bucket makes it the key's tenant's). Every call
but ``GET`` and ``failover`` names the rule's ``source`` id, and the bucket
must be that source's replica:

====== ============================================== ==========================================
PUT    ``replica/B`` ``{"source"}``                   claim B as a replica (made if missing; 409
                                                      BucketNotEmpty when it holds objects)
GET    ``replica/B``                                  the replica status
POST   ``replica/B/lack`` ``{"source", "digests"}``   ``{"lack": [digest, ...]}``
PUT    ``replica/B/chunks/DIGEST?source=ID``          stage the body (raw bytes); ``{"new": bool}``
POST   ``replica/B/objects`` ``{"source", "key",      ``{"key", "size", "etag"}``
       "chunks", "size", "content_type", ...}``
POST   ``replica/B/delete`` ``{"source", "key"}``     ``{}``
POST   ``replica/B/tags`` ``{"source", "key",         ``{}`` (the current version's tags replaced)
       "tags"}``
POST   ``replica/B/round`` ``{"source", "snapshot",   the replica status
       "created"}``
POST   ``replica/B/failover``                         the mark it had: B is writable from now on
====== ============================================== ==========================================

The replica calls themselves are :mod:`gpufeed.engine._replica`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from aiohttp import web

from ..engine._replica import MAX_REPLICA_CHUNK_BYTES
from ..engine.types import DEFAULT_TENANT
from ..errors import (
    AccessDenied,
    EntityTooLarge,
    IncompleteBody,
    InvalidArgument,
    MethodNotAllowed,
    MissingContentLength,
    NoSuchBucket,
    NoSuchKey,
)
from ._jsonbody import read_json_object

if TYPE_CHECKING:
    from ._context import Services

__all__ = ["is_replication_call", "replication_call", "MAX_COMMIT_BODY"]

#: Largest JSON body of a replica call, bytes (a commit names up to ~200,000 chunks).
MAX_COMMIT_BODY = 16 << 20  # 16 MiB
_SMALL_BODY = 64 << 10


def is_replication_call(parts: list[str]) -> bool:
    """Whether the admin path ``parts`` (split on ``/``) is one of the calls above."""
    return bool(parts) and parts[0] in ("replication", "replica")




async def _raw_body(request: web.BaseRequest) -> bytes:
    if request.content_length is None:
        raise MissingContentLength("a replicated chunk needs a Content-Length")
    if request.content_length > MAX_REPLICA_CHUNK_BYTES:
        raise EntityTooLarge(f"a replicated chunk is at most {MAX_REPLICA_CHUNK_BYTES} bytes")
    try:
        return await request.content.readexactly(request.content_length)
    except Exception as exc:  # asyncio.IncompleteReadError: the sender went away
        raise IncompleteBody("the chunk's body ended before its Content-Length") from exc


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} must be a non-empty string, not {value!r}")
    return value


async def replication_call(s: Services, request: web.BaseRequest, parts: list[str], query: dict[str, str], *,
                           admin: bool, tenant: str | None) -> dict:
    """Run one replication call (see the module docstring).

    Raises:
        AccessDenied: not a key allowed to make the call.
        GpufeedError: as the engine or the rules raise it; MethodNotAllowed,
            NoSuchKey for an unknown call.
    """
    if parts[0] == "replication":
        if not admin:
            raise AccessDenied("replication rules need the node's admin key")
        return await _source_call(s, request, parts[1:])
    if len(parts) < 2:
        raise NoSuchKey(f"no admin call {'/'.join(parts)}")
    bucket = parts[1]
    e = s.engine
    if not admin:
        if tenant is None:
            raise AccessDenied("replica calls need the node's admin key or the bucket owner's key")
        try:
            owner: str | None = await s.call(e.bucket_owner, bucket)
        except NoSuchBucket:
            owner = None  # a claim makes it the caller's
        if owner is not None and owner != tenant:
            raise AccessDenied("only the bucket's owner or the node's admin key may replicate into it")
    method, rest = request.method, parts[2:]
    match rest:
        case [] if method == "PUT":
            body = await read_json_object(request, _SMALL_BODY)
            return await s.call(e.claim_replica, bucket, _text(body.get("source"), "source"),
                                owner=tenant or DEFAULT_TENANT)
        case [] if method == "GET":
            return await s.call(e.replica_status, bucket)
        case ["lack"] if method == "POST":
            body = await read_json_object(request, MAX_COMMIT_BODY)
            lack = await s.call(e.replica_lacking, bucket, _text(body.get("source"), "source"),
                                body.get("digests"))
            return {"lack": lack}
        case ["chunks", digest] if method == "PUT":
            data = await _raw_body(request)
            new = await s.call(e.replica_put_chunk, bucket, _text(query.get("source"), "source"), digest, data)
            return {"new": new}
        case ["objects"] if method == "POST":
            b = await read_json_object(request, MAX_COMMIT_BODY)
            return await s.call(lambda: e.replica_commit(
                bucket, _text(b.get("source"), "source"), _text(b.get("key"), "key"), b.get("chunks"),
                size=b.get("size"), content_type=b.get("content_type"), metadata=b.get("metadata"),
                checksums=b.get("checksums"), headers=b.get("headers"), tags=b.get("tags")))
        case ["delete"] if method == "POST":
            b = await read_json_object(request, _SMALL_BODY)
            await s.call(e.replica_delete, bucket, _text(b.get("source"), "source"), _text(b.get("key"), "key"))
            return {}
        case ["tags"] if method == "POST":
            b = await read_json_object(request, _SMALL_BODY)
            await s.call(e.replica_retag, bucket, _text(b.get("source"), "source"), _text(b.get("key"), "key"),
                         b.get("tags"))
            return {}
        case ["round"] if method == "POST":
            b = await read_json_object(request, _SMALL_BODY)
            return await s.call(e.replica_end_round, bucket, _text(b.get("source"), "source"),
                                b.get("snapshot"), b.get("created"))
        case ["failover"] if method == "POST":
            return await s.call(e.promote_replica, bucket)
        case [] | ["lack" | "objects" | "delete" | "tags" | "round" | "failover"] | ["chunks", _]:
            raise MethodNotAllowed(f"{method} is not allowed on this replica call")
    raise NoSuchKey(f"no admin call {'/'.join(parts)}")


async def _source_call(s: Services, request: web.BaseRequest, rest: list[str]) -> dict:
    r = s.replication
    if r is None:
        raise MethodNotAllowed("this node runs no replication (it was started without it)")
    method = request.method
    match rest:
        case [] if method == "GET":
            return {"rules": await s.call(r.status_all)}
        case [] if method == "POST":
            b = await read_json_object(request, _SMALL_BODY)
            return await s.call(r.add, _text(b.get("bucket"), "bucket"), _text(b.get("target"), "target"),
                                _text(b.get("target_bucket"), "target_bucket"),
                                _text(b.get("access_key"), "access_key"), _text(b.get("secret_key"), "secret_key"))
        case [bucket] if method == "GET":
            return await s.call(r.status, bucket)
        case [bucket] if method == "DELETE":
            return await s.call(r.remove, bucket)
        case [bucket, "pause" | "resume" as what] if method == "POST":
            return await s.call(r.set_paused, bucket, what == "pause")
        case [bucket, "sync"] if method == "POST":
            return dataclasses.asdict(await s.call(r.sync, bucket))
        case [] | [_] | [_, "pause" | "resume" | "sync"]:
            raise MethodNotAllowed(f"{method} is not allowed on this replication call")
    raise NoSuchKey(f"no admin call replication/{'/'.join(rest)}")
