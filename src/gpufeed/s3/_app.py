"""The S3 HTTP front: aiohttp glue, authentication, dispatch, error documents.

One aiohttp catch-all route. For each request :class:`S3Front` parses the
target once (:func:`~gpufeed.s3._router.parse_target`), checks its SigV4
signature, routes it to a typed endpoint (:func:`~gpufeed.s3._router.route`)
and runs that endpoint's handler from its family module (``_buckets``,
``_listing``, ``_objects``, ``_multipart``, ``_versions``, ...). Every :class:`GpufeedError` becomes
an S3 error document here; any other exception a 500 with no traceback.
``OPTIONS`` (a CORS preflight) passes without a signature (see
:func:`~gpufeed.s3._auth.verify_request`); a request with an ``Origin`` gets
its bucket's CORS headers on whatever it is answered, errors included
(:func:`~gpufeed.s3._cors.actual_request_headers`).
:func:`start_s3` serves the app through :mod:`~gpufeed.s3._server` (timeouts,
per-address cap, malformed requests, access log).

Source: Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web

from .._metrics import NodeMetrics
from ..config import NodeConfig
from ..engine import Engine
from ..errors import AccessDenied, GpufeedError, InternalError, MethodNotAllowed, NotModified, SignatureDoesNotMatch
from . import (
    _acl,
    _attributes,
    _bucketconfig,
    _buckets,
    _cors,
    _express,
    _lifecycle,
    _listing,
    _lock,
    _multipart,
    _objects,
    _policy,
    _post,
    _tagging,
    _versions,
)
from ._accesslog import AccessLog
from ._admin import ADMIN_PREFIX, handle_admin
from ._auth import AuthResult, verify_request
from ._context import MAX_XML, HandlerTable, S3Request, Services
from ._features import check_request_headers
from ._headers import quote_etag
from ._health import HEALTH_PATH, health_report, health_response
from ._router import BucketEndpoint, CreateBucket, Endpoint, PostObject, Target, parse_target, route
from ._server import (
    AUTH,
    ERROR_CODE,
    OP,
    REQUEST_ID,
    TARGET,
    ConnectionLimits,
    ConnectionPolicy,
    S3RequestHandler,
    S3Site,
    common_headers,
    error_response,
    new_request_id,
)
from ._snapshots import check_snapshot_request
from ._tenancy import BUCKET_OWNER, CURRENT_TENANT
from ._xml import http_date

if TYPE_CHECKING:
    from ..replication import Replicator

__all__ = ["S3Front", "make_app", "start_s3", "serve_s3", "error_response", "HANDLERS"]

log = logging.getLogger("gpufeed.s3")

#: Socket read buffer of the HTTP server, bytes.
_READ_BUFSIZE = 1 << 20  # 1 MiB
_FRONT_KEY = web.AppKey("gpufeed_s3_front", object)
#: aiohttp connection settings of the S3 port.
_HANDLER_ARGS = {
    "auto_decompress": False,  # S3 stores Content-Encoding: gzip bodies as sent
    "read_bufsize": _READ_BUFSIZE,
    # room for long presigned URLs and headers; user metadata is then
    # refused with S3's own MetadataTooLarge rather than a bare 400
    "max_line_size": 64 << 10,
    "max_field_size": 64 << 10,
}

#: Endpoint class -> handler, over every family.
HANDLERS: HandlerTable = {
    **_buckets.HANDLERS,
    **_listing.HANDLERS,
    **_objects.HANDLERS,
    **_multipart.HANDLERS,
    **_lifecycle.HANDLERS,
    **_acl.HANDLERS,
    **_attributes.HANDLERS,
    **_bucketconfig.HANDLERS,
    **_cors.HANDLERS,
    **_post.HANDLERS,
    **_lock.HANDLERS,
    **_tagging.HANDLERS,
    **_versions.HANDLERS,
    **_policy.HANDLERS,
    **_express.HANDLERS,
}


def _not_modified(exc: NotModified) -> web.Response:
    return web.Response(status=304, headers={
        "ETag": quote_etag(str(exc.details.get("etag", ""))),
        "Last-Modified": http_date(float(str(exc.details.get("last_modified", 0)))),
    })


class S3Front(Services):
    """The S3 endpoint of one node: the aiohttp handlers over :class:`Services`.

    Args:
        engine: the storage engine (synchronous, thread-safe).
        config: node settings (credentials, region, io threads, size limit).
        started_s: Unix time the node started, seconds (for the health answer's
            uptime); ``None``: now.
    """

    def __init__(self, engine: Engine, config: NodeConfig, started_s: float | None = None) -> None:
        super().__init__(engine, config)
        self.started_s = time.time() if started_s is None else started_s

    async def _health(self, request: web.BaseRequest) -> web.Response:
        """``GET``/``HEAD`` :data:`HEALTH_PATH`, unauthenticated (see :mod:`._health`).

        Raises:
            MethodNotAllowed: any other method.
        """
        request[OP] = "Health"
        if request.method not in ("GET", "HEAD"):
            raise MethodNotAllowed(f"{request.method} is not allowed on {HEALTH_PATH}")
        status, body = await self.call(health_report, self.engine, self.started_s)
        return health_response(request.method, status, body)

    def _target(self, request: web.BaseRequest) -> Target:
        target = request.get(TARGET)
        if target is None:
            target = parse_target(request.method, request.raw_path, request.headers)
            request[TARGET] = target
        return target

    async def _find_cors(self, request: web.BaseRequest, target: Target) -> None:
        """Look up once the CORS headers of a request with an ``Origin`` (added
        to its response when it is prepared, see :func:`_add_common_headers`)."""
        if _cors.CORS_HEADERS not in request and target.method != "OPTIONS" and "Origin" in request.headers:
            request[_cors.CORS_HEADERS] = await _cors.actual_request_headers(self, target, request.headers)

    def _verify(self, request: web.BaseRequest, target: Target) -> AuthResult:
        """The SigV4 check; headers only (the signed payload hash is checked as the body streams).

        Raises:
            SignatureDoesNotMatch: also when botocore cannot even build the
                canonical request (a signed header value it cannot represent, a
                malformed host): such a request cannot carry a valid signature.
        """
        try:
            return verify_request(
                method=request.method,
                raw_path=target.raw_path,
                raw_query=target.raw_query,
                headers=request.headers,
                credentials=self.credentials,
                virtual_bucket=target.virtual_bucket,
                allow_anonymous=True,
            )
        except GpufeedError:
            raise
        except (ValueError, AttributeError, UnicodeError) as exc:
            log.debug("S3 signature of %s %s not computable: %r", request.method, target.raw_path, exc)
            raise SignatureDoesNotMatch(
                "The request signature we calculated does not match the signature you provided. "
                "Check your key and signing method.") from exc

    def _authorize(self, request: web.BaseRequest, auth: AuthResult, endpoint: Endpoint) -> None:
        """Set the request's tenant and ask the engine whether it may take its
        action on its bucket or object (and a copy's read of its source):
        :func:`._policy.authorize_request`.

        An anonymous request (no signature) goes on as no tenant to a bucket
        or object, where only a bucket policy can let it through; listing the
        buckets or creating one needs a signature. A form POST that carries no
        signature of its own is authenticated later, by its policy's signature
        (:mod:`._post` asks then).

        Raises:
            NoSuchBucket: the bucket does not exist.
            AccessDenied: the request is not allowed.
        """
        tenant = self.credentials.tenant_of(auth.access_key) if auth.access_key else None
        CURRENT_TENANT.set(tenant)
        BUCKET_OWNER.set(None)
        deferred = isinstance(endpoint, PostObject) and not auth.access_key  # signed in its form
        if not isinstance(endpoint, BucketEndpoint) or isinstance(endpoint, CreateBucket) or deferred:
            if auth.anonymous:
                raise AccessDenied("Anonymous access is not allowed")
            return
        _policy.authorize_request(self.engine, endpoint, self._target(request).query, tenant,
                                  access_key=self.credentials.principal_key(auth.access_key) or None,
                                  source_ip=request.remote)
        BUCKET_OWNER.set(self.engine.bucket_owner(endpoint.bucket))

    async def expect(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """aiohttp expect handler: answer ``Expect: 100-continue`` only once the
        signature holds, so an unauthenticated client is refused before it sends
        its body (the handler then reuses the result). Any other expectation is
        ignored, as S3 does."""
        if request.headers.get("Expect", "").strip().lower() != "100-continue":
            return None
        _started(request)
        request_id = new_request_id()
        request[REQUEST_ID] = request_id
        target = self._target(request)
        try:
            await self._find_cors(request, target)
            request[AUTH] = self._verify(request, target)
        except GpufeedError as exc:
            request[ERROR_CODE] = exc.code
            resp = error_response(request.method, exc, target.path, request_id)
            resp.force_close()  # the body was never sent; do not read it
            return resp
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the interim response is not part of the answer
        return None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """aiohttp handler: every request of the endpoint comes here."""
        _started(request)
        request_id = request.get(REQUEST_ID) or new_request_id()
        request[REQUEST_ID] = request_id
        target = self._target(request)
        try:
            if target.path == HEALTH_PATH:  # before authentication: probes do not sign
                return await self._health(request)
            await self._find_cors(request, target)
            auth = request.get(AUTH) or self._verify(request, target)
            request[AUTH] = auth
            if auth.anonymous and target.path.startswith(ADMIN_PREFIX):
                raise AccessDenied("Anonymous access is not allowed")
            if target.path.startswith(ADMIN_PREFIX):
                request[OP] = "Admin"
                return await handle_admin(self, request, target, auth)
            endpoint = _route(target, auth)
            request[OP] = type(endpoint).__name__
            _express.check_session(self, target, request.headers, auth, endpoint)
            self._authorize(request, auth, endpoint)
            check_snapshot_request(endpoint, target.query)
            _express.check_directory(target, request.headers, endpoint)
            check_request_headers(request.headers)
            handler = HANDLERS[type(endpoint)]
            return await handler(self, S3Request(request, target, auth), endpoint)
        except NotModified as exc:
            return _not_modified(exc)
        except GpufeedError as exc:
            request[ERROR_CODE] = exc.code
            if exc.status == 500:  # the node's fault; 501 and the like are answers
                log.error("S3 %s %s answered %s %s: %s (request id %s)", request.method, target.raw_path,
                          exc.status, exc.code, exc.message, request_id)
            else:
                log.debug("S3 %s %s answered %s %s: %s (request id %s)", request.method, target.raw_path,
                          exc.status, exc.code, exc.message, request_id)
            return error_response(request.method, exc, target.path, request_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # never a traceback to the client
            log.exception("S3 %s %s failed (request id %s)", request.method, target.raw_path, request_id)
            request[ERROR_CODE] = InternalError.code
            return error_response(request.method,
                                  InternalError("We encountered an internal error. Please try again."),
                                  target.path, request_id)


def _route(target: Target, auth: AuthResult) -> Endpoint:
    """:func:`route`, but an anonymous request learns nothing from it: whatever
    it cannot be routed to is 403 AccessDenied."""
    try:
        return route(target)
    except GpufeedError:
        if auth.anonymous:
            raise AccessDenied("Access Denied") from None
        raise


def _started(request: web.BaseRequest) -> None:
    """Tell the connection a request's handler runs (its header timeout ends, its body timeout starts)."""
    protocol = request.protocol
    if isinstance(protocol, S3RequestHandler):
        protocol.request_started(request)


async def _add_common_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    rid = request.get(REQUEST_ID) or new_request_id()
    request[REQUEST_ID] = rid
    response.headers.update(common_headers(rid))
    cors = request.get(_cors.CORS_HEADERS)
    if cors:
        response.headers.update(cors)
    protocol = request.protocol
    if isinstance(protocol, S3RequestHandler):
        protocol.response_started(request, response)


def make_app(engine: Engine, config: NodeConfig) -> web.Application:
    """Build the aiohttp application of the S3 endpoint.

    Args:
        engine: the node's storage engine.
        config: node settings; ``access_key``/``secret_key``/``region`` are the
            SigV4 credentials accepted, ``io_threads`` sizes the worker pool.

    Returns:
        An application with one catch-all route; its worker pool is shut down
        on cleanup (the engine is not closed: it belongs to the caller).
    """
    return _make_app(engine, config, None)


def _make_app(engine: Engine, config: NodeConfig, metrics: NodeMetrics | None,
              replication: Replicator | None = None) -> web.Application:
    """:func:`make_app`, with the node's metrics (their start time is the health
    answer's) and replication rules (served by the admin API)."""
    app = web.Application(client_max_size=MAX_XML, handler_args=_HANDLER_ARGS)
    front = S3Front(engine, config, metrics.started_s if metrics is not None else None)
    front.replication = replication
    app[_FRONT_KEY] = front
    app.router.add_route("*", "/{tail:[\\s\\S]*}", front.handle,  # keys may hold newlines
                         expect_handler=front.expect)
    app.on_response_prepare.append(_add_common_headers)

    async def _cleanup(_app: web.Application) -> None:
        front.close()

    app.on_cleanup.append(_cleanup)
    return app


async def start_s3(engine: Engine, config: NodeConfig) -> tuple[web.AppRunner, int]:
    """Serve the S3 endpoint on ``config.host:config.s3_port`` (0 picks a free port).

    Connections get the header and body timeouts, the per-address cap and the
    access log of ``config`` (see :mod:`gpufeed.s3._server`).

    Returns:
        ``(runner, port)``: call ``await runner.cleanup()`` to stop (it also
        closes the access log).

    Raises:
        OSError: the port is taken, or the access log file cannot be opened.
    """
    return await serve_s3(engine, config, None)


async def serve_s3(engine: Engine, config: NodeConfig, metrics: NodeMetrics | None, *,
                   replication: Replicator | None = None) -> tuple[web.AppRunner, int]:
    """:func:`start_s3`, counting every request in ``metrics`` (the node's) and
    reporting the port's open connections to it at scrape time; the admin API
    serves ``replication``'s rules (``None``: none).

    Returns:
        ``(runner, port)``: call ``await runner.cleanup()`` to stop (it also
        closes the access log).

    Raises:
        OSError: the port is taken, or the access log file cannot be opened.
    """
    app = _make_app(engine, config, metrics, replication)
    access_log = AccessLog(config.access_log)

    async def _close_log(_app: web.Application) -> None:
        access_log.close()

    app.on_cleanup.append(_close_log)
    policy = ConnectionPolicy(
        header_timeout_s=config.s3_header_timeout_s, body_timeout_s=config.s3_body_timeout_s,
        limits=ConnectionLimits(config.s3_max_connections_per_address), access_log=access_log, metrics=metrics)
    if metrics is not None:
        metrics.count_connections("s3", policy.limits.total)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = S3Site(runner, config.host, config.s3_port, policy=policy, backlog=1024, handler_args={
        **_HANDLER_ARGS, "keepalive_timeout": config.s3_keepalive_timeout_s, "access_log": None})
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    port = runner.addresses[0][1]
    return runner, port
