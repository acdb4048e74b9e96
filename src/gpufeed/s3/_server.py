"""The S3 port's connections: read timeouts, a cap per client address, error
documents for what never reaches a handler, and the access log.

aiohttp's server bounds request lines and header fields (``max_line_size``,
``max_field_size``, ``max_headers``) and closes idle keep-alive connections
(``keepalive_timeout``), but it has no limit on how long a client may take to
send its request headers or its body, no cap on connections per client
address, and it answers a malformed request with plain text after logging a
traceback at ERROR. A few hundred connections that never finish their headers
then hold every file descriptor of the node. :class:`S3RequestHandler` adds
the missing parts on aiohttp's own connection class (its public protocol
methods ``connection_made``, ``data_received``, ``connection_lost``,
``handle_error`` and ``log_access``), and :class:`S3Site` serves it from an
accept loop that checks the cap before a connection costs anything; all of
it is small because everything else stays aiohttp's.

The limits (all from :class:`~gpufeed.config.NodeConfig`):

* **header timeout**: a connection must deliver a request's headers within
  ``s3_header_timeout_s`` of its opening or of the first byte of a later
  request; else it is answered 400 ``RequestTimeout`` (when it sent anything)
  and closed. A partial request pipelined behind a running one is bounded by
  the keep-alive timeout instead.
* **body timeout**: while a handler waits for the body, the body must make
  progress every ``s3_body_timeout_s``; else the handler's read raises
  :class:`~gpufeed.errors.RequestTimeout` (answered 400, connection closed).
  Time the node itself stops reading (flow control) does not count.
* **connections per address**: past ``s3_max_connections_per_address`` open
  connections from one IP address, a new one is answered 503 ``SlowDown``
  and closed right after ``accept()`` (:class:`_Listener`), before any of
  its bytes are read.

``handler_cancellation`` stays off (aiohttp's default): a handler whose
client went away finishes or fails on its next read or write, so an upload
is always aborted by its own code path, never cancelled halfway through a
worker-thread write.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import string
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from .._metrics import NodeMetrics
from ..errors import GpufeedError, InternalError, InvalidRequestError, RequestTimeout, SlowDown
from ._accesslog import AccessLog, RateLimitedWarning
from ._versions import error_extras
from ._xml import sub, to_bytes

__all__ = [
    "ConnectionPolicy",
    "ConnectionLimits",
    "S3RequestHandler",
    "S3Site",
    "error_response",
    "common_headers",
    "new_request_id",
    "REQUEST_ID",
    "TARGET",
    "AUTH",
    "ERROR_CODE",
    "OP",
]

log = logging.getLogger("gpufeed.s3")

REQUEST_ID = web.RequestKey("gpufeed_s3_request_id", str)
TARGET = web.RequestKey("gpufeed_s3_target", object)  # Target parsed by S3Front
AUTH = web.RequestKey("gpufeed_s3_auth", object)  # AuthResult found by S3Front
ERROR_CODE = web.RequestKey("gpufeed_s3_error_code", str)  # S3 error code answered
OP = web.RequestKey("gpufeed_s3_op", str)  # operation name (endpoint class), for metrics
_START = web.RequestKey("gpufeed_s3_start", float)  # loop time the handler started

_PRINTABLE = frozenset(string.printable) - frozenset("\r\n\x0b\x0c")


def new_request_id() -> str:
    """A fresh request id: 16 upper-case hex digits."""
    return uuid.uuid4().hex[:16].upper()


def common_headers(request_id: str) -> dict[str, str]:
    """The headers every S3 response carries: ``x-amz-request-id``, ``x-amz-id-2``, ``Server``."""
    import base64

    return {"x-amz-request-id": request_id,
            "x-amz-id-2": base64.b64encode(request_id.encode()).decode(),
            "Server": "gpufeed"}


def error_response(method: str, exc: GpufeedError, resource: str, request_id: str) -> web.Response:
    """The S3 error document of ``exc`` (no body for HEAD).

    Args:
        method: the request's HTTP method.
        exc: the error; its ``code``, ``message``, ``status`` and the details
            ``method``, ``resource_type`` (a refused CORS preflight), ``bucket``,
            ``key``, ``condition``, ``argument_name``, ``argument_value``,
            ``location_constraint``, ``storage_class_requested`` and ``size`` are
            used, and those of versions (:func:`~gpufeed.s3._versions.error_extras`).
        resource: the decoded request path.
        request_id: the request's id.
    """
    status = exc.status
    headers, extra = error_extras(exc, method)
    if method == "HEAD":
        return web.Response(status=status, headers=headers)
    root = ET.Element("Error")  # S3 error documents carry no namespace
    sub(root, "Code", exc.code)
    sub(root, "Message", exc.message)
    for name, tag in (("method", "Method"), ("resource_type", "ResourceType")):
        if name in exc.details:
            sub(root, tag, exc.details[name])
    for name in ("bucket", "key"):
        if name in exc.details:
            sub(root, "BucketName" if name == "bucket" else "Key", exc.details[name])
    if "condition" in exc.details:
        sub(root, "Condition", exc.details["condition"])
    for name, element_name in (("argument_name", "ArgumentName"), ("argument_value", "ArgumentValue"),
                               ("location_constraint", "LocationConstraint"),
                               ("storage_class_requested", "StorageClassRequested")):
        if name in exc.details:
            sub(root, element_name, exc.details[name])
    for name, text in extra:
        sub(root, name, text)
    sub(root, "Resource", resource)
    sub(root, "RequestId", request_id)
    if exc.code == "InvalidRange" and "size" in exc.details:
        headers["Content-Range"] = f"bytes */{exc.details['size']}"
    return web.Response(status=status, body=to_bytes(root), content_type="application/xml",
                        headers=headers)


def _raw_error(exc: GpufeedError, request_id: str) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 response of ``exc``'s error
    document, for a connection that has no parsed request to answer through."""
    resp = error_response("GET", exc, "/", request_id)
    body = resp.body if isinstance(resp.body, bytes) else b""
    head = [f"HTTP/1.1 {resp.status} {resp.reason}", "Content-Type: application/xml",
            f"Content-Length: {len(body)}", "Connection: close",
            *(f"{k}: {v}" for k, v in common_headers(request_id).items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _printable(text: str, limit: int = 200) -> str:
    """``text`` on one line: cut to ``limit`` characters, runs of white space as
    one space, every other non-printable character as ``?``."""
    text = " ".join(text.split())
    return "".join(c if c in _PRINTABLE else "?" for c in text[:limit])


class ConnectionLimits:
    """Open connections per client IP address, against a cap.

    Args:
        max_per_address: most connections one address may hold; 0 means no cap.
    """

    def __init__(self, max_per_address: int) -> None:
        self.max_per_address = max_per_address
        self._open: dict[str, int] = {}
        self._total = 0  # sum of _open, readable from any thread

    def acquire(self, address: str) -> bool:
        """Count one more connection of ``address``; False (nothing counted) at the cap."""
        n = self._open.get(address, 0)
        if self.max_per_address and n >= self.max_per_address:
            return False
        self._open[address] = n + 1
        self._total += 1
        return True

    def release(self, address: str) -> None:
        """Forget one connection of ``address``."""
        n = self._open.get(address, 0) - 1
        if n >= 0:
            self._total -= 1
        if n > 0:
            self._open[address] = n
        else:
            self._open.pop(address, None)

    def open_count(self, address: str) -> int:
        """Connections ``address`` holds now."""
        return self._open.get(address, 0)

    def total(self) -> int:
        """Connections open now, every address together."""
        return self._total


@dataclass
class ConnectionPolicy:
    """What every connection of one S3 port shares.

    Attributes:
        header_timeout_s: seconds to deliver a request's headers; 0 = no limit.
        body_timeout_s: seconds a body may make no progress; 0 = no limit.
        limits: the per-address connection counts.
        access_log: where one line per request goes.
        warn: the rate-limited warning for refusals and malformed requests.
        metrics: where every answered request is counted too; ``None`` counts nothing.
    """

    header_timeout_s: float
    body_timeout_s: float
    limits: ConnectionLimits
    access_log: AccessLog
    warn: RateLimitedWarning = field(default_factory=lambda: RateLimitedWarning(log))
    metrics: NodeMetrics | None = None

    def log(self, record: dict, op: str = "-", received: int = 0) -> None:
        """Write one access-log line and count the request (``op``, ``received`` body bytes)."""
        self.access_log.write(record)
        if self.metrics is not None:
            self.metrics.observe("s3", op, record["status"], record.get("error"), record.get("duration_s", 0.0),
                                 received, record.get("bytes") or 0)


class S3RequestHandler(web.RequestHandler):
    """aiohttp's connection class with header/body timeouts, the per-address
    cap, S3 error documents for malformed requests and the access log.

    Args:
        manager: the runner's :class:`aiohttp.web.Server`.
        loop: the event loop.
        policy: the port's shared limits and logs.
        address: the client's IP address, already counted in ``policy.limits``.
        **kwargs: :class:`aiohttp.web.RequestHandler` settings (sizes, keep-alive).
    """

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop,
                 policy: ConnectionPolicy, address: str, **kwargs) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._policy = policy
        self._peer = address
        self._address: str | None = address  # counted in policy.limits until release_address()
        self._dropping = False  # the body timed out: further input is ignored
        self._busy: web.BaseRequest | None = None  # request whose handler runs
        self._responding = False  # the busy request's response has started
        self._partial = False  # bytes of a request whose headers are not complete yet
        self._last_rx = loop.time()
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # connection events ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None
        self.release_address()
        super().connection_lost(exc)

    def release_address(self) -> None:
        """Stop counting this connection against its address. Idempotent."""
        if self._address is not None:
            self._policy.limits.release(self._address)
            self._address = None

    def data_received(self, data: bytes) -> None:
        if self._dropping:
            return
        self._last_rx = self._loop.time()
        if self._busy is None and data:
            self._partial = True
            if self._header_timer is None:
                self._arm_header_timer()
        super().data_received(data)

    # request events (called by S3Front and aiohttp) ----------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        """The handler of ``request`` starts: its headers are complete. Idempotent."""
        if self._busy is request:
            return
        self._busy, self._responding, self._partial = request, False, False
        request[_START] = self._loop.time()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._policy.body_timeout_s > 0 and not request.content.is_eof():
            self._last_rx = self._loop.time()
            self._arm_body_timer()

    def response_started(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        """``response`` is about to send its headers: the body is no longer waited for
        (aiohttp drains what is left, within its own lingering time)."""
        if self._busy is request:
            self._responding = True
        if self._dropping:
            response.force_close()

    def log_access(self, request: web.BaseRequest, response: web.StreamResponse,
                   time: float | None) -> None:
        """aiohttp's end-of-request hook: write the access line; the connection is idle."""
        if self._busy is request:
            self._busy = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        start = request.get(_START)
        duration = self._loop.time() - start if start is not None else 0.0
        target = request.get(TARGET)
        auth = request.get(AUTH)
        method = request.method if target is not None else "-"
        nbytes = 0
        if method != "HEAD" and response.status not in (204, 304):
            nbytes = response.content_length if response.content_length is not None else response.body_length
        self._policy.log({
            "remote": self._peer, "access_key": getattr(auth, "access_key", None),
            "method": method, "bucket": getattr(target, "bucket", None), "key": getattr(target, "key", None),
            "status": response.status, "error": request.get(ERROR_CODE), "bytes": nbytes,
            "duration_s": round(duration, 6), "request_id": request.get(REQUEST_ID),
        }, request.get(OP, "-"), request.content_length or 0)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """An S3 error document for a request aiohttp could not parse (400: one rate-limited
        warning, no traceback) or whose handler raised past S3Front (500: a bug, logged
        with its traceback)."""
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response "
                                  "with the error message")
        request_id = request.get(REQUEST_ID) or new_request_id()
        request[REQUEST_ID] = request_id
        err: GpufeedError
        if status >= 500:
            log.error("S3 request %s failed", request_id, exc_info=exc)
            err = InternalError("We encountered an internal error. Please try again.")
        else:
            reason = _printable(message or str(exc) or "malformed request")
            self._policy.warn.warn("S3 malformed HTTP request from %s (request id %s): %s",
                                   self._peer, request_id, reason)
            err = InvalidRequestError(f"Malformed HTTP request: {reason}")
        request[ERROR_CODE] = err.code
        resp = error_response(request.method, err, "/", request_id)
        resp.headers.update(common_headers(request_id))
        resp.force_close()
        return resp

    # timers and refusals ---------------------------------------------------------------
    def _arm_header_timer(self) -> None:
        if self._policy.header_timeout_s > 0:
            self._header_timer = self._loop.call_later(self._policy.header_timeout_s, self._header_timed_out)

    def _header_timed_out(self) -> None:
        self._header_timer = None
        transport = self.transport
        if self._busy is not None or transport is None or transport.is_closing():
            return
        if self._partial:  # a request began: answer it
            request_id = new_request_id()
            transport.write(_raw_error(RequestTimeout(
                "Your socket connection to the server was not read from or written to within "
                "the timeout period."), request_id))
            self._policy.log({"remote": self._peer, "method": "-", "status": 400,
                                           "error": "RequestTimeout", "bytes": 0,
                                           "duration_s": self._policy.header_timeout_s,
                                           "request_id": request_id})
            self._policy.warn.warn("S3 connection from %s sent no complete request headers within %s s",
                                   self._peer, self._policy.header_timeout_s)
        self.force_close()
        transport.close()

    def _arm_body_timer(self) -> None:
        when = self._last_rx + self._policy.body_timeout_s
        self._body_timer = self._loop.call_at(when, self._check_body)

    def _check_body(self) -> None:
        self._body_timer = None
        request, transport = self._busy, self.transport
        if request is None or self._responding or transport is None or request.content.is_eof():
            return
        now = self._loop.time()
        if not transport.is_reading():  # the node paused reading: not the client's delay
            self._last_rx = now
        elif now - self._last_rx >= self._policy.body_timeout_s:
            self._dropping = True
            self._policy.warn.warn("S3 request body from %s made no progress for %s s",
                                   self._peer, self._policy.body_timeout_s)
            request.content.set_exception(RequestTimeout(
                "Your socket connection to the server was not read from or written to within "
                "the timeout period."))
            request.content.feed_eof()  # nothing is left to drain: no lingering read
            return
        self._arm_body_timer()


class _Listener:
    """The S3 port's accept loop, in the place of the ``asyncio.Server`` of a site.

    asyncio's own loop accepts up to ``backlog`` connections per wake-up before
    any of them reaches a protocol, so a crowd reconnecting from one address
    takes every file descriptor before one could be refused (measured: 300 slow
    connections against a file limit of 300 stalled valid clients for seconds).
    Here the address is counted right after ``accept()``; a connection over
    the cap is answered 503 SlowDown and closed at once, and running out of
    descriptors is a rate-limited warning and a short pause, not an ERROR.

    Args:
        loop: the event loop.
        sock: the bound, listening, non-blocking socket (closed by :meth:`close`).
        factory: ``address -> S3RequestHandler`` (the address already counted).
        policy: limits and logs of the port.
    """

    _BATCH = 64  # connections accepted per wake-up
    _RETRY_S = 0.1  # pause after running out of descriptors, seconds

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 factory: Callable[[str], S3RequestHandler], policy: ConnectionPolicy) -> None:
        self._loop, self._sock, self._factory, self._policy = loop, sock, factory, policy
        self._closed = False
        self.sockets = [sock]
        loop.add_reader(sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting and close the listening socket. Idempotent."""
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self.sockets = []

    async def wait_closed(self) -> None:
        return None

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(self._BATCH):
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise  # the event loop logs it and keeps serving
                self._policy.warn.warn("S3 port cannot accept (%s): pausing %s s", exc, self._RETRY_S)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(self._RETRY_S, self._resume)
                return
            address = str(peer[0])
            if not self._policy.limits.acquire(address):
                self._refuse(conn, address)
                continue
            conn.setblocking(False)
            self._loop.create_task(self._serve(conn, address))

    async def _serve(self, conn: socket.socket, address: str) -> None:
        handler = self._factory(address)
        try:
            await self._loop.connect_accepted_socket(lambda: handler, sock=conn)
        except BaseException:
            handler.release_address()
            conn.close()
            raise

    def _refuse(self, conn: socket.socket, address: str) -> None:
        """Answer 503 SlowDown without reading anything, then close."""
        request_id = new_request_id()
        try:
            conn.setblocking(False)
            conn.send(_raw_error(SlowDown(
                f"Too many connections from {address}: at most {self._policy.limits.max_per_address} "
                f"at once. Please reduce your request rate."), request_id))
        except OSError:
            pass
        conn.close()
        self._policy.log({"remote": address, "method": "-", "status": 503, "error": "SlowDown",
                                       "bytes": 0, "duration_s": 0.0, "request_id": request_id})
        self._policy.warn.warn("S3 connection from %s refused: it holds %d connections already",
                               address, self._policy.limits.open_count(address))


class S3Site(web.BaseSite):
    """A TCP site of an :class:`aiohttp.web.AppRunner` whose connections are
    :class:`S3RequestHandler`.

    Args:
        runner: the set-up runner.
        host: address to bind.
        port: TCP port; 0 picks a free one.
        policy: limits and logs of the port.
        handler_args: :class:`aiohttp.web.RequestHandler` settings.
        backlog: listen backlog.
    """

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, policy: ConnectionPolicy,
                 handler_args: dict, backlog: int = 1024) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port = host, port
        self._policy = policy
        self._handler_args = handler_args

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    def _make_handler(self, address: str) -> S3RequestHandler:
        server = self._runner.server
        assert server is not None
        return S3RequestHandler(server, loop=asyncio.get_running_loop(), policy=self._policy,
                                address=address, **self._handler_args)

    async def start(self) -> None:
        """Bind ``host:port`` (the first address ``host`` resolves to) and accept.

        Raises:
            OSError: the address cannot be bound.
        """
        await super().start()
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(self._backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._server = _Listener(loop, sock, self._make_handler, self._policy)  # type: ignore[assignment]
