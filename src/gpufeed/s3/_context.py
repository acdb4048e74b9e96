"""What every S3 handler is given: the node's services and the request.

:class:`Services` holds the engine, the settings and the worker pool (the
engine is synchronous, so every call into it, and every hash of a large body,
runs on the pool, never on the event loop), plus the plumbing the handler
families share: XML answers, the owner element, reading an XML request
document, and streaming an upload body into a
:class:`~gpufeed.engine.PendingWrite`. :class:`S3Request` is one authenticated,
parsed request.

Handlers are plain ``async def handler(s, req, endpoint) -> StreamResponse``
functions in the module of their family; ``_app`` dispatches to them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..config import NodeConfig
from ..engine import Engine, KeyRing
from ..errors import BadDigest, EntityTooLarge, InvalidArgument, MissingContentLength
from ._auth import AuthResult
from ._body import RequestBody, stream_body
from ._headers import content_md5
from ._router import Endpoint, Target
from ._sessions import SessionKeyRing
from ._tenancy import answer_owner, owner_identity
from ._xml import element, sub, to_bytes

if TYPE_CHECKING:
    from ..replication import Replicator

__all__ = ["Services", "S3Request", "Handler", "HandlerTable", "MAX_XML"]

#: Largest XML request document accepted, bytes.
MAX_XML = 4 << 20  # 4 MiB


@dataclass(slots=True)
class S3Request:
    """One parsed, authenticated request.

    Attributes:
        http: the aiohttp request (headers, body stream, transport).
        target: its parsed target (:func:`~gpufeed.s3._router.parse_target`).
        auth: the signature check's result (it verifies streamed chunk signatures).
    """

    http: web.BaseRequest
    target: Target
    auth: AuthResult

    @property
    def headers(self):
        """The request headers (case-insensitive multi-dict)."""
        return self.http.headers

    @property
    def query(self) -> dict[str, str]:
        """The decoded query parameters."""
        return self.target.query


class Services:
    """The engine, settings and worker pool the S3 handlers run on.

    Args:
        engine: the storage engine (synchronous, thread-safe).
        config: node settings (credentials, region, io threads, size limit).
    """

    def __init__(self, engine: Engine, config: NodeConfig) -> None:
        self.engine = engine
        self.config = config
        self.credentials = SessionKeyRing(KeyRing(config.access_key, config.secret_key, engine))  # + sessions
        #: The node's replication rules (:class:`gpufeed.replication.Replicator`), set by
        #: the node; ``None``: the admin API answers that it runs none.
        self.replication: Replicator | None = None
        self.executor = ThreadPoolExecutor(
            max_workers=max(4, config.io_threads), thread_name_prefix="gpufeed-s3"
        )
        # Upload bodies (file writes and hashing) get workers of their own, so a
        # request's engine calls never queue behind another upload's hashing.
        self.body_executor = ThreadPoolExecutor(
            max_workers=max(4, config.io_threads), thread_name_prefix="gpufeed-s3-body"
        )

    async def call(self, fn, *args, **kwargs):
        """Run a blocking function on the front's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop the worker pools (queued calls are cancelled)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.body_executor.shutdown(wait=False, cancel_futures=True)

    # XML answers -----------------------------------------------------------------
    @staticmethod
    def xml(root, status: int = 200, headers=None) -> web.Response:
        """An ``application/xml`` response of one document."""
        return web.Response(status=status, body=to_bytes(root), content_type="application/xml",
                            headers=headers)

    @property
    def owner_id(self) -> str:
        """The canonical user ID of the owner of what the request reaches (its bucket's owner)."""
        return owner_identity(self.config, answer_owner())[0]

    def owner(self, parent, tag: str = "Owner") -> None:
        """Append the owner (``ID`` and ``DisplayName``) as ``tag``: the bucket's
        owner (objects written through a bucket policy belong to the bucket),
        or the requester's tenant where no bucket is named."""
        owner_id, name = owner_identity(self.config, answer_owner())
        owner = sub(parent, tag)
        sub(owner, "ID", owner_id)
        sub(owner, "DisplayName", name)

    def acl(self) -> web.Response:
        """The one ACL of every bucket and object: the owner has FULL_CONTROL."""
        root = element("AccessControlPolicy")
        self.owner(root)
        acl = sub(root, "AccessControlList")
        grant = sub(acl, "Grant")
        grantee = sub(grant, "Grantee")
        grantee.set("xmlns:xsi", "http://www.w3.org/2001/XMLSchema-instance")
        grantee.set("xsi:type", "CanonicalUser")
        owner_id, name = owner_identity(self.config, answer_owner())
        sub(grantee, "ID", owner_id)
        sub(grantee, "DisplayName", name)
        sub(grant, "Permission", "FULL_CONTROL")
        return self.xml(root)

    # request parameters and documents -------------------------------------------
    @staticmethod
    def query_int(q: dict[str, str], name: str, default: int, cap: int) -> int:
        """A non-negative integer query parameter, at most ``cap``.

        Raises:
            InvalidArgument: not an integer, or negative.
        """
        raw = q.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError as exc:
            raise InvalidArgument(f"Provided {name} not an integer or within integer range") from exc
        if value < 0:
            raise InvalidArgument(f"Argument {name} must be an integer between 0 and 2147483647")
        return min(value, cap)

    async def read_xml(self, req: S3Request, *, check_md5: bool = True, checksum_headers: bool = True) -> bytes:
        """The request body (an XML document) of at most :data:`MAX_XML` bytes.

        ``checksum_headers=False``: the ``x-amz-checksum-*`` headers are not the
        body's (CompleteMultipartUpload's describe the object).

        Raises:
            BadDigest: ``Content-MD5`` does not match the body.
        """
        body = RequestBody(req.http, req.auth, want_md5=check_md5, checksum_headers=checksum_headers)
        data = await body.read_all(MAX_XML)
        if check_md5:
            md5 = content_md5(req.headers)
            if md5 is not None and md5 != body.digests.md5_b64():
                raise BadDigest("The Content-MD5 you specified did not match what we received.")
        return data

    async def open_object(self, bucket: str, key: str, version_id: str | None = None):
        """The current version (or the version ``version_id``) opened for
        reading (the engine retries a version replaced between lookup and open,
        so a reader racing overwriters never sees a spurious 404). Returns
        ``(info, handle)``: an :class:`~gpufeed.engine.ObjectHandle` whose
        reads are checked; the caller closes it."""
        return await self.call(self.open_dup, bucket, key, version_id)

    def open_dup(self, bucket: str, key: str, version_id: str | None = None, snapshot: str | None = None):
        """:meth:`open_object`, blocking (for code already on the worker pool)."""
        h = self.engine.open_version(bucket, key, version_id, snapshot=snapshot)
        return h.info, h

    # upload bodies ---------------------------------------------------------------
    async def receive(self, req: S3Request, pending, commit, *, compute: tuple[str, ...] = ()):
        """Stream the body into ``pending`` and ``commit(checksums, expected_size)``
        on the pool; abort on any failure (client gone, digest mismatch) so nothing
        is visible. ``compute``: checksum algorithms the server computes itself
        (returned with the verified ones).

        Returns:
            ``(commit's result, verified checksums)``.

        Raises:
            MissingContentLength: neither a length nor chunked framing.
            EntityTooLarge: the declared size is over ``config.max_object_bytes``.
        """
        try:
            body = RequestBody(req.http, req.auth, compute=compute)
            if body.expected_size is None and not body.chunked and \
                    req.headers.get("Transfer-Encoding", "").lower() != "chunked":
                raise MissingContentLength("You must provide the Content-Length HTTP header.")
            if body.expected_size is not None and body.expected_size > self.config.max_object_bytes:
                raise EntityTooLarge("Your proposed upload exceeds the maximum allowed size")
            await stream_body(body, pending, self.body_executor)
            checksums = body.digests.verify()
            return await self.call(commit, checksums, body.expected_size), checksums
        except BaseException:
            pending.abort()
            raise


#: An endpoint handler: ``(services, request, endpoint) -> response``.
Handler = Callable[[Services, S3Request, Any], Awaitable[web.StreamResponse]]
#: Endpoint class -> handler, one table per family module.
HandlerTable = dict[type[Endpoint], Handler]
