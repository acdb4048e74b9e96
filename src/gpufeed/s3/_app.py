"""The S3 HTTP front: routing, authentication, operations, error documents.

One aiohttp catch-all route; :class:`S3Front` splits each request into
(bucket, key, sub-resource), checks its SigV4 signature, runs the operation and
answers S3 XML. The engine is synchronous, so every call into it (and every
hash of a large body) runs on a thread pool, never on the event loop. Uploads
stream into :meth:`gpufeed.engine.Engine.begin_put` chunk by chunk; downloads
are sent with ``sendfile`` from the object's immutable data file.

Source: Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import ipaddress
import logging
import os
import uuid
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote, unquote

from aiohttp import web
from multidict import CIMultiDict

from ..config import NodeConfig
from ..engine import MAX_KEY_BYTES, Engine, ObjectInfo
from ..errors import (
    BadDigest,
    EntityTooLarge,
    GpufeedError,
    InternalError,
    InvalidArgument,
    InvalidDigest,
    InvalidRange,
    InvalidRequestError,
    KeyTooLong,
    MetadataTooLarge,
    MalformedXML,
    MethodNotAllowed,
    MissingContentLength,
    NoSuchKey,
    NotImplementedByGpufeed,
    NotModified,
    PreconditionFailed,
)
from ..store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest, resolve_range
from ._auth import AuthResult, verify_request
from ._body import RequestBody
from ._xml import child_text, element, http_date, iso8601, local, parse_http_date, parse_xml, sub, to_bytes

__all__ = ["S3Front", "make_app", "start_s3"]

log = logging.getLogger("gpufeed.s3")

#: Batch of body bytes handed to one worker-thread write, bytes.
_WRITE_BATCH = 4 << 20  # 4 MiB
#: Largest XML request document accepted, bytes.
_MAX_XML = 4 << 20  # 4 MiB
#: Socket read buffer of the HTTP server, bytes.
_READ_BUFSIZE = 1 << 20  # 1 MiB
_FRONT_KEY = web.AppKey("gpufeed_s3_front", object)
_REQUEST_ID = web.RequestKey("gpufeed_s3_request_id", str)
_AUTH = web.RequestKey("gpufeed_s3_auth", object)  # AuthResult found by S3Front.expect

# Sub-resources S3 has and gpufeed does not implement (answered 501).
_UNSUPPORTED_BUCKET = {
    "policy", "cors", "lifecycle", "website", "logging", "notification", "replication",
    "encryption", "object-lock", "tagging", "versions", "requestPayment", "accelerate",
    "analytics", "inventory", "metrics", "ownershipControls", "publicAccessBlock",
    "intelligent-tiering", "policyStatus",
}
_UNSUPPORTED_OBJECT = {"tagging", "retention", "legal-hold", "torrent", "restore", "select", "attributes"}
#: XML element of each checksum algorithm (CompleteMultipartUploadResult, ListParts).
_CHECKSUM_ELEMENT = {
    "crc32": "ChecksumCRC32", "crc32c": "ChecksumCRC32C", "crc64nvme": "ChecksumCRC64NVME",
    "sha1": "ChecksumSHA1", "sha256": "ChecksumSHA256",
}
_RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


@dataclass(slots=True)
class _Ctx:
    """One parsed request."""

    request: web.BaseRequest
    method: str
    raw_path: str
    query: dict[str, str]
    bucket: str | None
    key: str | None
    auth: AuthResult | None = None


def _split_target(raw: str) -> tuple[str, str]:
    """Request target -> (raw path, raw query); absolute-form targets are reduced."""
    if not raw.startswith("/"):
        scheme_end = raw.find("://")
        if scheme_end != -1:
            slash = raw.find("/", scheme_end + 3)
            raw = raw[slash:] if slash != -1 else "/"
    path, _, query = raw.partition("?")
    return path, query


def _parse_query(raw_query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in raw_query.split("&"):
        if part:
            k, _, v = part.partition("=")
            out.setdefault(unquote(k), unquote(v))
    return out


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def bucket_from_host(host: str | None) -> str | None:
    """The bucket of a virtual-hosted-style request, or None for path style.

    ``bucket.localhost[:port]`` and ``bucket.s3.<anything>`` name a bucket; an IP
    address, ``localhost`` and any other host name mean path style.
    """
    if not host:
        return None
    name = host.lower()
    if name.startswith("["):
        return None
    name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    if _is_ip(name) or name == "localhost":
        return None
    if name.endswith(".localhost"):
        return name[: -len(".localhost")] or None
    idx = name.find(".s3.")
    if idx > 0:
        return name[:idx]
    if name.endswith(".s3"):
        return name[:-3] or None
    return None


def _quote_etag(etag: str) -> str:
    return f'"{etag}"'


def _strip_etag(value: str) -> str:
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"')


def _etag_matches(header: str, etag: str) -> bool:
    for item in header.split(","):
        item = item.strip()
        if item == "*" or _strip_etag(item) == etag:
            return True
    return False


def _check_conditions(headers, info: ObjectInfo, *, copy_source: bool = False) -> None:
    """Evaluate If-Match / If-None-Match / If-(Un)Modified-Since (RFC 9110 section 13.2.2).

    Args:
        headers: request headers.
        info: the object the conditions are about.
        copy_source: read the ``x-amz-copy-source-if-*`` variants, where every
            failure is 412 (CopyObject / UploadPartCopy).

    Raises:
        PreconditionFailed: 412.
        NotModified: 304 (GET/HEAD only).
    """
    p = "x-amz-copy-source-" if copy_source else ""
    if_match = headers.get(p + "If-Match")
    if_none_match = headers.get(p + "If-None-Match")
    modified_s = int(info.last_modified)
    if if_match is not None:
        if not _etag_matches(if_match, info.etag):
            raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                     condition="If-Match")
    else:
        since = parse_http_date(headers.get(p + "If-Unmodified-Since"))
        if since is not None and modified_s > since:
            raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                     condition="If-Unmodified-Since")
    if if_none_match is not None:
        if _etag_matches(if_none_match, info.etag):
            if copy_source:
                raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                         condition="x-amz-copy-source-If-None-Match")
            raise NotModified("Not Modified", etag=info.etag, last_modified=info.last_modified)
    else:
        since = parse_http_date(headers.get(p + "If-Modified-Since"))
        if since is not None and modified_s <= since:
            if copy_source:
                raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                         condition="x-amz-copy-source-If-Modified-Since")
            raise NotModified("Not Modified", etag=info.etag, last_modified=info.last_modified)


def parse_range(value: str | None, size: int):
    """Parse a ``Range: bytes=...`` header for an object of ``size`` bytes.

    Returns:
        ``(start, length)`` or None when there is no usable range (absent,
        malformed or several ranges: S3 then answers the whole object).

    Raises:
        InvalidRange: the range cannot be satisfied (416).
    """
    if not value:
        return None
    value = value.strip()
    if not value.startswith("bytes=") or "," in value:
        return None
    spec = value[6:].strip()
    first, dash, last = spec.partition("-")
    if not dash:
        return None
    try:
        if first == "":
            if not last.isdigit():
                return None
            req = SuffixByteRequest(int(last))
        elif last == "":
            if not first.isdigit():
                return None
            req = OffsetByteRequest(int(first))
        else:
            if not (first.isdigit() and last.isdigit()):
                return None
            a, b = int(first), int(last)
            if b < a:
                return None  # syntactically invalid: ignored (RFC 9110 section 14.2)
            req = RangeByteRequest(a, b + 1)
    except ValueError:
        return None
    if size == 0 or (isinstance(req, SuffixByteRequest) and req.suffix == 0):
        raise InvalidRange("The requested range is not satisfiable", size=size)
    return resolve_range(req, size)


#: Standard headers S3 stores at upload and returns on GET/HEAD, as spelled in responses.
#: Source: "PutObject" request headers, Amazon S3 API Reference.
_STORED_HEADERS = (
    "Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Expires",
    "x-amz-website-redirect-location",
)


def _stored_headers(headers) -> dict[str, str]:
    """The :data:`_STORED_HEADERS` of an upload request. ``aws-chunked`` is the
    transfer framing of the request, not the object's coding, so it is dropped
    from ``Content-Encoding`` (as S3 does)."""
    out: dict[str, str] = {}
    for name in _STORED_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        if name == "Content-Encoding":
            value = ",".join(c.strip() for c in value.split(",") if c.strip().lower() not in ("aws-chunked", ""))
            if not value:
                continue
        out[name] = value
    return out


def _user_metadata(headers) -> dict[str, str]:
    meta: dict[str, str] = {}
    for name, value in headers.items():
        lname = name.lower()
        if lname.startswith("x-amz-meta-"):
            k = lname[len("x-amz-meta-"):]
            meta[k] = f"{meta[k]},{value}" if k in meta else value
    size = sum(len(k.encode()) + len(v.encode()) for k, v in meta.items())
    if size > _MAX_USER_METADATA:
        raise MetadataTooLarge(
            f"Your metadata headers exceed the maximum allowed metadata size ({size} > "
            f"{_MAX_USER_METADATA} bytes)")
    return meta


#: S3's limit on user-defined metadata (names + values), bytes.
_MAX_USER_METADATA = 2 << 10  # 2 KiB


def _content_md5(headers) -> str | None:
    value = headers.get("Content-MD5")
    if value is None:
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidDigest("The Content-MD5 you specified was invalid.") from exc
    if len(raw) != 16:
        raise InvalidDigest("The Content-MD5 you specified was invalid.")
    return value.strip()


def _object_headers(info: ObjectInfo, *, checksums: bool) -> CIMultiDict:
    h = CIMultiDict()
    h["ETag"] = _quote_etag(info.etag)
    h["Last-Modified"] = http_date(info.last_modified)
    h["Content-Type"] = info.content_type or "application/octet-stream"
    h["Accept-Ranges"] = "bytes"
    for k, v in info.headers.items():
        h[k] = v
    for k, v in info.metadata.items():
        h[f"x-amz-meta-{k}"] = v
    if checksums and info.checksums:
        for alg, v in info.checksums.items():
            h[f"x-amz-checksum-{alg}"] = v
        # A multipart object's "<b64>-N" is a checksum of the part checksums.
        composite = any("-" in v for v in info.checksums.values())
        h["x-amz-checksum-type"] = "COMPOSITE" if composite else "FULL_OBJECT"
    return h


def _write_conditions(headers) -> dict[str, str]:
    """``If-Match`` / ``If-None-Match`` of a write as engine commit arguments
    (one ETag or ``*`` each, as S3 takes them; quotes removed)."""
    out: dict[str, str] = {}
    for header, arg in (("If-Match", "if_match"), ("If-None-Match", "if_none_match")):
        value = headers.get(header)
        if value is not None:
            out[arg] = "*" if value.strip() == "*" else _strip_etag(value)
    return out


def _parse_copy_source(value: str) -> tuple[str, str]:
    src = value.strip()
    src, _, _version = src.partition("?")
    src = unquote(src).lstrip("/")
    bucket, _, key = src.partition("/")
    if not bucket or not key:
        raise InvalidArgument("Copy Source must mention the source bucket and key: sourcebucket/sourcekey")
    return bucket, key


class _SendfileResponse(web.StreamResponse):
    """Sends ``count`` bytes of an open file from ``offset`` with ``loop.sendfile``."""

    def __init__(self, fobj, offset: int, count: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self._fobj = fobj
        self._offset = offset
        self._count = count
        self.content_length = count

    async def prepare(self, request):
        if self._payload_writer is not None:
            return self._payload_writer
        try:
            writer = await super().prepare(request)
            if request.method == "HEAD" or self._count == 0:
                await super().write_eof()
                return writer
            transport = request.transport
            if transport is None:
                raise ConnectionResetError("Connection lost")
            try:
                await request._loop.sendfile(transport, self._fobj, self._offset, self._count)
            except NotImplementedError:
                self._fobj.seek(self._offset)
                left = self._count
                while left:
                    chunk = await request._loop.run_in_executor(None, self._fobj.read, min(left, 1 << 20))
                    if not chunk:
                        break
                    await writer.write(chunk)
                    left -= len(chunk)
            await super().write_eof()
            return writer
        finally:
            self._fobj.close()


class S3Front:
    """The S3 endpoint of one node.

    Args:
        engine: the storage engine (synchronous, thread-safe).
        config: node settings (credentials, region, io threads, size limit).
    """

    def __init__(self, engine: Engine, config: NodeConfig) -> None:
        self.engine = engine
        self.config = config
        self.credentials = {config.access_key: config.secret_key}
        self.executor = ThreadPoolExecutor(
            max_workers=max(4, config.io_threads), thread_name_prefix="gpufeed-s3"
        )
        self.owner_id = hashlib.sha256(config.access_key.encode()).hexdigest()

    async def call(self, fn, *args, **kwargs):
        """Run a blocking function on the front's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    # entry point -----------------------------------------------------------------
    def _verify(self, request: web.BaseRequest, raw_path: str, raw_query: str) -> AuthResult:
        """The SigV4 check; headers only (the signed payload hash is checked as the body streams)."""
        return verify_request(
            method=request.method,
            raw_path=raw_path,
            raw_query=raw_query,
            headers=request.headers,
            credentials=self.credentials,
            virtual_bucket=bucket_from_host(request.headers.get("Host")),
        )

    async def expect(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """aiohttp expect handler: answer ``Expect: 100-continue`` only once the
        signature holds, so an unauthenticated client is refused before it sends
        its body (the handler then reuses the result)."""
        if request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers.get('Expect')}")
        request_id = uuid.uuid4().hex[:16].upper()
        request[_REQUEST_ID] = request_id
        raw_path, raw_query = _split_target(request.raw_path)
        try:
            request[_AUTH] = self._verify(request, raw_path, raw_query)
        except GpufeedError as exc:
            resp = self._error(request, exc, unquote(raw_path), request_id)
            resp.force_close()  # the body was never sent; do not read it
            return resp
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the interim response is not part of the answer
        return None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """aiohttp handler: every request of the endpoint comes here."""
        request_id = request.get(_REQUEST_ID) or uuid.uuid4().hex[:16].upper()
        request[_REQUEST_ID] = request_id
        raw_path, raw_query = _split_target(request.raw_path)
        resource = unquote(raw_path)
        try:
            ctx = self._parse(request, raw_path, raw_query)
            ctx.auth = request.get(_AUTH) or self._verify(request, raw_path, raw_query)
            return await self._dispatch(ctx)
        except NotModified as exc:
            return web.Response(status=304, headers={
                "ETag": _quote_etag(str(exc.details.get("etag", ""))),
                "Last-Modified": http_date(float(exc.details.get("last_modified", 0))),
            })
        except GpufeedError as exc:
            return self._error(request, exc, resource, request_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a traceback to the client
            log.exception("S3 %s %s failed (request id %s)", request.method, raw_path, request_id)
            return self._error(request, InternalError("We encountered an internal error. Please try again."),
                               resource, request_id, cause=exc)

    def _error(self, request, exc: GpufeedError, resource: str, request_id: str, cause=None):
        status = exc.status
        if request.method == "HEAD":
            return web.Response(status=status)
        root = ET.Element("Error")  # S3 error documents carry no namespace
        sub(root, "Code", exc.code)
        sub(root, "Message", exc.message)
        for name in ("bucket", "key"):
            if name in exc.details:
                sub(root, "BucketName" if name == "bucket" else "Key", exc.details[name])
        if "condition" in exc.details:
            sub(root, "Condition", exc.details["condition"])
        sub(root, "Resource", resource)
        sub(root, "RequestId", request_id)
        headers = {}
        if exc.code == "InvalidRange" and "size" in exc.details:
            headers["Content-Range"] = f"bytes */{exc.details['size']}"
        return web.Response(status=status, body=to_bytes(root), content_type="application/xml",
                            headers=headers)

    def _parse(self, request, raw_path: str, raw_query: str) -> _Ctx:
        query = _parse_query(raw_query)
        path = unquote(raw_path)
        host_bucket = bucket_from_host(request.headers.get("Host"))
        if host_bucket is not None:
            bucket, key = host_bucket, path[1:] if path.startswith("/") else path
        else:
            rest = path[1:] if path.startswith("/") else path
            bucket, _, key = rest.partition("/")
        return _Ctx(request=request, method=request.method, raw_path=raw_path, query=query,
                    bucket=bucket or None, key=key or None)

    async def _dispatch(self, ctx: _Ctx) -> web.StreamResponse:
        m, q = ctx.method, ctx.query
        if ctx.bucket is None:
            if m in ("GET", "HEAD"):
                return await self.list_buckets(ctx)
            raise MethodNotAllowed("The specified method is not allowed against this resource.")
        if ctx.key is None:
            unsupported = _UNSUPPORTED_BUCKET & q.keys()
            if unsupported:
                raise NotImplementedByGpufeed(f"bucket sub-resource {sorted(unsupported)[0]!r} is not implemented")
            if m == "GET":
                if "location" in q:
                    return await self.get_bucket_location(ctx)
                if "versioning" in q:
                    return await self.get_bucket_versioning(ctx)
                if "acl" in q:
                    await self.call(self.engine.head_bucket, ctx.bucket)
                    return self._acl()
                if "uploads" in q:
                    return await self.list_multipart_uploads(ctx)
                if q.get("list-type") == "2":
                    return await self.list_objects(ctx, v2=True)
                return await self.list_objects(ctx, v2=False)
            if m == "HEAD":
                await self.call(self.engine.head_bucket, ctx.bucket)
                return web.Response(status=200, headers={"x-amz-bucket-region": self.config.region})
            if m == "PUT":
                if q.keys() - {"x-id"}:
                    raise NotImplementedByGpufeed(f"PUT bucket ?{next(iter(q))} is not implemented")
                return await self.create_bucket(ctx)
            if m == "DELETE":
                return await self.delete_bucket(ctx)
            if m == "POST" and "delete" in q:
                return await self.delete_objects(ctx)
            raise MethodNotAllowed("The specified method is not allowed against this resource.")
        unsupported = _UNSUPPORTED_OBJECT & q.keys()
        if unsupported:
            raise NotImplementedByGpufeed(f"object sub-resource {sorted(unsupported)[0]!r} is not implemented")
        if m in ("GET", "HEAD"):
            if "uploadId" in q and m == "GET":
                return await self.list_parts(ctx)
            if "acl" in q:
                await self.call(self.engine.head_object, ctx.bucket, ctx.key)
                return self._acl()
            return await self.get_object(ctx, head=m == "HEAD")
        if m == "PUT":
            if "acl" in q:
                raise NotImplementedByGpufeed("PUT object ?acl is not implemented")
            if "uploadId" in q or "partNumber" in q:
                if "x-amz-copy-source" in ctx.request.headers:
                    return await self.upload_part_copy(ctx)
                return await self.upload_part(ctx)
            if "x-amz-copy-source" in ctx.request.headers:
                return await self.copy_object(ctx)
            return await self.put_object(ctx)
        if m == "DELETE":
            if "uploadId" in q:
                await self.call(self.engine.abort_multipart_upload, ctx.bucket, ctx.key, q["uploadId"])
                return web.Response(status=204)
            await self.call(self.engine.delete_object, ctx.bucket, ctx.key)
            return web.Response(status=204)
        if m == "POST":
            if "uploads" in q:
                return await self.create_multipart_upload(ctx)
            if "uploadId" in q:
                return await self.complete_multipart_upload(ctx)
            raise NotImplementedByGpufeed("this POST operation is not implemented")
        raise MethodNotAllowed("The specified method is not allowed against this resource.")

    # helpers -----------------------------------------------------------------------
    def _xml(self, root, status: int = 200, headers=None) -> web.Response:
        return web.Response(status=status, body=to_bytes(root), content_type="application/xml",
                            headers=headers)

    def _owner(self, parent, tag: str = "Owner") -> None:
        owner = sub(parent, tag)
        sub(owner, "ID", self.owner_id)
        sub(owner, "DisplayName", self.config.access_key)

    def _acl(self) -> web.Response:
        root = element("AccessControlPolicy")
        self._owner(root)
        acl = sub(root, "AccessControlList")
        grant = sub(acl, "Grant")
        grantee = sub(grant, "Grantee")
        grantee.set("xmlns:xsi", "http://www.w3.org/2001/XMLSchema-instance")
        grantee.set("xsi:type", "CanonicalUser")
        sub(grantee, "ID", self.owner_id)
        sub(grantee, "DisplayName", self.config.access_key)
        sub(grant, "Permission", "FULL_CONTROL")
        return self._xml(root)

    async def _read_xml(self, ctx: _Ctx, *, check_md5: bool = True):
        body = RequestBody(ctx.request, ctx.auth, want_md5=check_md5)
        data = await body.read_all(_MAX_XML)
        if check_md5:
            md5 = _content_md5(ctx.request.headers)
            if md5 is not None and md5 != body.digests.md5_b64():
                raise BadDigest("The Content-MD5 you specified did not match what we received.")
        return data

    def _max_int(self, q: dict, name: str, default: int, cap: int) -> int:
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

    async def _stream_to(self, body: RequestBody, pending) -> None:
        """Copy the decoded body into a PendingWrite in 4 MiB batches on the pool.

        The next batch is read from the socket while the previous one is written;
        within a batch the client-declared digests (SHA-256, CRC32, ...) run on a
        second worker while the engine writes and MD5-hashes (all release the GIL).
        """
        digests = body.digests
        loop = asyncio.get_running_loop()

        async def write(batch: list[bytes]) -> None:
            buf = batch[0] if len(batch) == 1 else b"".join(batch)
            if digests.active:
                await asyncio.gather(
                    loop.run_in_executor(self.executor, pending.write, buf),
                    loop.run_in_executor(self.executor, digests.update, buf),
                )
            else:
                await loop.run_in_executor(self.executor, pending.write, buf)

        inflight = None
        batch: list[bytes] = []
        size = 0
        try:
            async for piece in body.chunks():
                batch.append(piece)
                size += len(piece)
                if size >= _WRITE_BATCH:
                    if inflight is not None:
                        await inflight
                    inflight = asyncio.ensure_future(write(batch))
                    batch, size = [], 0
        except BaseException:
            if inflight is not None and not inflight.done():
                # Never leave a worker writing into a PendingWrite the caller aborts next.
                await asyncio.wait([inflight])
            raise
        if inflight is not None:
            await inflight
        if batch:
            await write(batch)

    async def _receive(self, ctx: _Ctx, pending, commit):
        """Stream the body into ``pending`` and ``commit(checksums)`` on the pool;
        abort on any failure (client gone, digest mismatch) so nothing is visible."""
        try:
            body = RequestBody(ctx.request, ctx.auth)
            if body.expected_size is None and not body.chunked and \
                    ctx.request.headers.get("Transfer-Encoding", "").lower() != "chunked":
                raise MissingContentLength("You must provide the Content-Length HTTP header.")
            if body.expected_size is not None and body.expected_size > self.config.max_object_bytes:
                raise EntityTooLarge("Your proposed upload exceeds the maximum allowed size")
            await self._stream_to(body, pending)
            checksums = body.digests.verify()
            return await self.call(commit, checksums, body.expected_size), checksums
        except BaseException:
            pending.abort()
            raise

    # service / bucket operations ------------------------------------------------------
    async def list_buckets(self, ctx: _Ctx) -> web.Response:
        buckets = await self.call(self.engine.list_buckets)
        root = element("ListAllMyBucketsResult")
        self._owner(root)
        bs = sub(root, "Buckets")
        for b in buckets:
            el = sub(bs, "Bucket")
            sub(el, "Name", b.name)
            sub(el, "CreationDate", iso8601(b.created))
        return self._xml(root)

    async def create_bucket(self, ctx: _Ctx) -> web.Response:
        data = await self._read_xml(ctx)
        if data.strip():
            doc = parse_xml(data)
            if local(doc.tag) != "CreateBucketConfiguration":
                raise MalformedXML("expected CreateBucketConfiguration")
        # gpufeed extension: x-gpufeed-bucket-kind: kv (+ capacity/TTL) makes an evicting KV-cache bucket.
        h = ctx.request.headers
        try:
            policy = {
                "kind": h.get("x-gpufeed-bucket-kind", "standard"),
                "capacity_bytes": int(h.get("x-gpufeed-capacity-bytes", "0")),
                "ttl_s": float(h.get("x-gpufeed-ttl-s", "0")),
            }
        except ValueError as exc:
            raise InvalidArgument(f"bad x-gpufeed bucket policy header: {exc}") from exc
        await self.call(self.engine.create_bucket, ctx.bucket, **policy)
        return web.Response(status=200, headers={"Location": f"/{ctx.bucket}"})

    async def delete_bucket(self, ctx: _Ctx) -> web.Response:
        await self.call(self.engine.delete_bucket, ctx.bucket)
        return web.Response(status=204)

    async def get_bucket_location(self, ctx: _Ctx) -> web.Response:
        await self.call(self.engine.head_bucket, ctx.bucket)
        root = element("LocationConstraint")
        if self.config.region != "us-east-1":
            root.text = self.config.region
        return self._xml(root)

    async def get_bucket_versioning(self, ctx: _Ctx) -> web.Response:
        await self.call(self.engine.head_bucket, ctx.bucket)
        return self._xml(element("VersioningConfiguration"))

    async def list_objects(self, ctx: _Ctx, *, v2: bool) -> web.Response:
        q = ctx.query
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        encoding = q.get("encoding-type")
        if encoding not in (None, "url"):
            raise InvalidArgument("Invalid Encoding Method specified in Request")
        max_keys = self._max_int(q, "max-keys", 1000, 1000)
        token = q.get("continuation-token") if v2 else None
        start_after = q.get("start-after", "") if v2 else q.get("marker", "")
        if v2 and token == "":
            raise InvalidArgument("The continuation token provided is incorrect")
        # A v1 NextMarker that is a common prefix ("b/") skips everything under it:
        # the engine's list_objects does that for any start_after.
        if max_keys == 0:
            await self.call(self.engine.head_bucket, ctx.bucket)
            objects, prefixes, truncated, next_token, next_marker = [], [], False, None, None
        else:
            res = await self.call(
                self.engine.list_objects, ctx.bucket, prefix=prefix, delimiter=delimiter,
                start_after=start_after, continuation_token=token, max_keys=max_keys,
            )
            objects, prefixes = res.objects, res.common_prefixes
            truncated, next_token, next_marker = res.is_truncated, res.next_token, res.next_marker

        def enc(s: str) -> str:
            return quote(s, safe="/") if encoding == "url" else s

        root = element("ListBucketResult")
        sub(root, "Name", ctx.bucket)
        sub(root, "Prefix", enc(prefix))
        if v2:
            if token is not None:
                sub(root, "ContinuationToken", token)
            if start_after:
                sub(root, "StartAfter", enc(start_after))
            sub(root, "KeyCount", len(objects) + len(prefixes))
        else:
            sub(root, "Marker", enc(q.get("marker", "")))
        sub(root, "MaxKeys", max_keys)
        if delimiter:
            sub(root, "Delimiter", enc(delimiter))
        if encoding:
            sub(root, "EncodingType", encoding)
        sub(root, "IsTruncated", truncated)
        if truncated:
            if v2:
                sub(root, "NextContinuationToken", next_token)
            else:
                marker = next_marker
                if marker is None:
                    marker = max([o.key for o in objects] + prefixes) if (objects or prefixes) else ""
                sub(root, "NextMarker", enc(marker))
        with_owner = not v2 or q.get("fetch-owner") == "true"
        for o in objects:
            c = sub(root, "Contents")
            sub(c, "Key", enc(o.key))
            sub(c, "LastModified", iso8601(o.last_modified))
            sub(c, "ETag", _quote_etag(o.etag))
            if o.checksums:
                for alg in o.checksums:
                    sub(c, "ChecksumAlgorithm", alg.upper())
            sub(c, "Size", o.size)
            if with_owner:
                self._owner(c)
            sub(c, "StorageClass", "STANDARD")
        for p in prefixes:
            cp = sub(root, "CommonPrefixes")
            sub(cp, "Prefix", enc(p))
        return self._xml(root)

    async def delete_objects(self, ctx: _Ctx) -> web.Response:
        data = await self._read_xml(ctx)
        doc = parse_xml(data)
        if local(doc.tag) != "Delete":
            raise MalformedXML("expected a Delete document")
        quiet = (child_text(doc, "Quiet") or "").strip().lower() == "true"
        keys = []
        for el in doc:
            if local(el.tag) == "Object":
                key = child_text(el, "Key")
                if key is None:
                    raise MalformedXML("an Object without a Key")
                keys.append(key)
        if not keys or len(keys) > 1000:
            raise MalformedXML("Delete must name between 1 and 1000 objects")
        await self.call(self.engine.head_bucket, ctx.bucket)

        def run() -> list[tuple[str, GpufeedError | None]]:
            out = []
            for key in keys:
                try:
                    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
                        raise KeyTooLong("Your key is too long")
                    self.engine.delete_object(ctx.bucket, key)
                    out.append((key, None))
                except GpufeedError as exc:
                    out.append((key, exc))
            return out

        results = await self.call(run)
        root = element("DeleteResult")
        for key, err in results:
            if err is None:
                if not quiet:
                    d = sub(root, "Deleted")
                    sub(d, "Key", key)
            else:
                e = sub(root, "Error")
                sub(e, "Key", key)
                sub(e, "Code", err.code)
                sub(e, "Message", err.message)
        return self._xml(root)

    # object operations -------------------------------------------------------------------
    def _check_write_conditions(self, ctx: _Ctx) -> None:
        """If-Match / If-None-Match on PutObject and CompleteMultipartUpload, checked
        early (blocking) so a failing request is refused before its body is read.
        Only a fast path: the engine checks the same conditions again, atomically,
        inside its commit (see :func:`_write_conditions`)."""
        h = ctx.request.headers
        if "If-Match" not in h and "If-None-Match" not in h:
            return
        try:
            info = self.engine.head_object(ctx.bucket, ctx.key)
        except NoSuchKey:
            if "If-Match" in h:
                raise
            return
        if "If-None-Match" in h and _etag_matches(h["If-None-Match"], info.etag):
            raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                     condition="If-None-Match")
        if "If-Match" in h and not _etag_matches(h["If-Match"], info.etag):
            raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                     condition="If-Match")

    async def put_object(self, ctx: _Ctx) -> web.Response:
        h = ctx.request.headers
        content_md5 = _content_md5(h)
        metadata = _user_metadata(h)
        content_type = h.get("Content-Type")
        stored = _stored_headers(h)
        conditions = _write_conditions(h)
        await self.call(self._check_write_conditions, ctx)
        pending = await self.call(self.engine.begin_put, ctx.bucket, ctx.key)

        def commit(checksums, expected_size):
            return pending.commit(content_type=content_type, metadata=metadata, checksums=checksums,
                                  content_md5=content_md5, expected_size=expected_size, headers=stored,
                                  **conditions)

        info, checksums = await self._receive(ctx, pending, commit)
        headers = {"ETag": _quote_etag(info.etag)}
        for alg, v in checksums.items():
            headers[f"x-amz-checksum-{alg}"] = v
        return web.Response(status=200, headers=headers)

    async def _open(self, bucket: str, key: str):
        """The current version and its data file opened for reading (the engine
        retries a version replaced between lookup and open, so a reader racing
        overwriters never sees a spurious 404). Returns ``(info, file)``."""
        info, fd = await self.call(self.engine.open_object, bucket, key)
        return info, os.fdopen(fd, "rb")

    async def get_object(self, ctx: _Ctx, *, head: bool) -> web.StreamResponse:
        h = ctx.request.headers
        fobj = None
        if head:
            info = await self.call(self.engine.head_object, ctx.bucket, ctx.key)
        else:
            info, fobj = await self._open(ctx.bucket, ctx.key)
        try:
            _check_conditions(h, info)
            rng = parse_range(h.get("Range"), info.size)
            if rng is not None and ctx.query.get("partNumber"):
                raise InvalidRequestError("Cannot specify both Range header and partNumber query parameter")
            headers = _object_headers(info, checksums=rng is None and
                                      h.get("x-amz-checksum-mode", "").upper() == "ENABLED")
            for param, header in _RESPONSE_OVERRIDES.items():
                if param in ctx.query:
                    headers[header] = ctx.query[param]
            status = 200
            offset, count = 0, info.size
            if rng is not None:
                offset, count = rng
                status = 206
                headers["Content-Range"] = f"bytes {offset}-{offset + count - 1}/{info.size}"
        except BaseException:
            if fobj is not None:
                fobj.close()
            raise
        if head:
            resp = web.StreamResponse(status=status, headers=headers)
            resp.content_length = count
            await resp.prepare(ctx.request)
            await resp.write_eof()
            return resp
        resp = _SendfileResponse(fobj, offset, count, status=status, headers=headers)
        return resp

    async def copy_object(self, ctx: _Ctx) -> web.Response:
        h = ctx.request.headers
        src_bucket, src_key = _parse_copy_source(h["x-amz-copy-source"])
        directive = h.get("x-amz-metadata-directive", "COPY").upper()
        if directive not in ("COPY", "REPLACE"):
            raise InvalidArgument("Unknown metadata directive.")
        src = await self.call(self.engine.head_object, src_bucket, src_key)
        _check_conditions(h, src, copy_source=True)
        if directive == "COPY" and (src_bucket, src_key) == (ctx.bucket, ctx.key):
            raise InvalidRequestError(
                "This copy request is illegal because it is trying to copy an object to itself "
                "without changing the object's metadata, storage class, website redirect location "
                "or encryption attributes."
            )
        metadata = content_type = stored = None
        if directive == "REPLACE":
            metadata = _user_metadata(h)
            content_type = h.get("Content-Type")
            stored = _stored_headers(h)
        info = await self.call(self.engine.copy_object, src_bucket, src_key, ctx.bucket, ctx.key,
                               metadata=metadata, content_type=content_type, headers=stored)
        root = element("CopyObjectResult")
        sub(root, "LastModified", iso8601(info.last_modified))
        sub(root, "ETag", _quote_etag(info.etag))
        return self._xml(root)

    # multipart ----------------------------------------------------------------------------
    def _part_number(self, ctx: _Ctx) -> tuple[str, int]:
        q = ctx.query
        upload_id = q.get("uploadId")
        if not upload_id:
            raise InvalidArgument("uploadId is required with partNumber")
        try:
            number = int(q.get("partNumber", ""))
        except ValueError as exc:
            raise InvalidArgument("Part number must be an integer between 1 and 10000, inclusive") from exc
        if not 1 <= number <= 10000:
            raise InvalidArgument("Part number must be an integer between 1 and 10000, inclusive")
        return upload_id, number

    async def create_multipart_upload(self, ctx: _Ctx) -> web.Response:
        h = ctx.request.headers
        up = await self.call(self.engine.create_multipart_upload, ctx.bucket, ctx.key,
                             content_type=h.get("Content-Type"), metadata=_user_metadata(h),
                             headers=_stored_headers(h))
        root = element("InitiateMultipartUploadResult")
        sub(root, "Bucket", ctx.bucket)
        sub(root, "Key", ctx.key)
        sub(root, "UploadId", up.upload_id)
        headers = {}
        alg = h.get("x-amz-checksum-algorithm")
        if alg:
            headers["x-amz-checksum-algorithm"] = alg
        return self._xml(root, headers=headers)

    async def upload_part(self, ctx: _Ctx) -> web.Response:
        upload_id, number = self._part_number(ctx)
        content_md5 = _content_md5(ctx.request.headers)
        pending = await self.call(self.engine.begin_part, ctx.bucket, ctx.key, upload_id, number)

        def commit(checksums, expected_size):
            return pending.commit(content_md5=content_md5, expected_size=expected_size, checksums=checksums)

        part, checksums = await self._receive(ctx, pending, commit)
        headers = {"ETag": _quote_etag(part.etag)}
        for alg, v in checksums.items():
            headers[f"x-amz-checksum-{alg}"] = v
        return web.Response(status=200, headers=headers)

    async def upload_part_copy(self, ctx: _Ctx) -> web.Response:
        h = ctx.request.headers
        upload_id, number = self._part_number(ctx)
        src_bucket, src_key = _parse_copy_source(h["x-amz-copy-source"])
        src, fobj = await self._open(src_bucket, src_key)
        try:
            _check_conditions(h, src, copy_source=True)
            offset, count = 0, src.size
            rng = h.get("x-amz-copy-source-range")
            if rng is not None:
                first, _, last = rng.strip().removeprefix("bytes=").partition("-")
                if not (first.isdigit() and last.isdigit()):
                    raise InvalidArgument("The x-amz-copy-source-range value must be of the form bytes=first-last")
                offset, end = int(first), int(last)
                if end < offset or end >= src.size:
                    raise InvalidArgument(f"Range specified is not valid for source object of size: {src.size}")
                count = end - offset + 1
        except BaseException:
            fobj.close()
            raise

        def run():
            with fobj:
                pending = self.engine.begin_part(ctx.bucket, ctx.key, upload_id, number)
                with pending:
                    done = 0
                    while done < count:
                        n = pending.write_from_fd(fobj.fileno(), offset + done, count - done)
                        if n <= 0:
                            raise InternalError("source object is shorter than its catalog size")
                        done += n
                    return pending.commit(expected_size=count)

        part = await self.call(run)
        root = element("CopyPartResult")
        sub(root, "LastModified", iso8601(part.last_modified))
        sub(root, "ETag", _quote_etag(part.etag))
        return self._xml(root)

    async def complete_multipart_upload(self, ctx: _Ctx) -> web.Response:
        data = await self._read_xml(ctx)
        doc = parse_xml(data)
        if local(doc.tag) != "CompleteMultipartUpload":
            raise MalformedXML("expected a CompleteMultipartUpload document")
        parts = []
        for el in doc:
            if local(el.tag) != "Part":
                continue
            number, etag = child_text(el, "PartNumber"), child_text(el, "ETag")
            if number is None or etag is None:
                raise MalformedXML("each Part needs a PartNumber and an ETag")
            try:
                parts.append((int(number), _strip_etag(etag)))
            except ValueError as exc:
                raise MalformedXML("PartNumber must be an integer") from exc
        if not parts:
            raise MalformedXML("The XML you provided was not well-formed or did not validate against our published schema.")
        info = await self.call(self.engine.complete_multipart_upload, ctx.bucket, ctx.key,
                               ctx.query["uploadId"], parts, **_write_conditions(ctx.request.headers))
        root = element("CompleteMultipartUploadResult")
        host = ctx.request.headers.get("Host", "")
        sub(root, "Location", f"http://{host}/{quote(ctx.bucket)}/{quote(ctx.key)}")
        sub(root, "Bucket", ctx.bucket)
        sub(root, "Key", ctx.key)
        sub(root, "ETag", _quote_etag(info.etag))
        for alg, value in info.checksums.items():
            sub(root, _CHECKSUM_ELEMENT[alg], value)
        if info.checksums:
            sub(root, "ChecksumType", "COMPOSITE")
        return self._xml(root)

    async def list_parts(self, ctx: _Ctx) -> web.Response:
        q = ctx.query
        upload_id = q["uploadId"]
        max_parts = self._max_int(q, "max-parts", 1000, 1000)
        marker = self._max_int(q, "part-number-marker", 0, 10000)
        parts = await self.call(self.engine.list_parts, ctx.bucket, ctx.key, upload_id)
        parts = sorted((p for p in parts if p.part_number > marker), key=lambda p: p.part_number)
        page, truncated = parts[:max_parts], len(parts) > max_parts
        root = element("ListPartsResult")
        sub(root, "Bucket", ctx.bucket)
        sub(root, "Key", ctx.key)
        sub(root, "UploadId", upload_id)
        self._owner(root, "Initiator")
        self._owner(root)
        sub(root, "StorageClass", "STANDARD")
        sub(root, "PartNumberMarker", marker)
        sub(root, "NextPartNumberMarker", page[-1].part_number if page else marker)
        sub(root, "MaxParts", max_parts)
        sub(root, "IsTruncated", truncated)
        for p in page:
            el = sub(root, "Part")
            sub(el, "PartNumber", p.part_number)
            sub(el, "LastModified", iso8601(p.last_modified))
            sub(el, "ETag", _quote_etag(p.etag))
            sub(el, "Size", p.size)
            for alg, value in p.checksums.items():
                sub(el, _CHECKSUM_ELEMENT[alg], value)
        return self._xml(root)

    async def list_multipart_uploads(self, ctx: _Ctx) -> web.Response:
        q = ctx.query
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        key_marker = q.get("key-marker", "")
        id_marker = q.get("upload-id-marker", "")
        max_uploads = self._max_int(q, "max-uploads", 1000, 1000)
        encoding = q.get("encoding-type")
        uploads = await self.call(self.engine.list_multipart_uploads, ctx.bucket, prefix)
        uploads = sorted(uploads, key=lambda u: (u.key.encode(), u.initiated, u.upload_id))
        if key_marker:
            uploads = [u for u in uploads
                       if u.key.encode() > key_marker.encode()
                       or (id_marker and u.key == key_marker and (u.initiated, u.upload_id) >
                           next(((x.initiated, x.upload_id) for x in uploads if x.upload_id == id_marker),
                                (float("inf"), "")))]
        entries: list = []  # uploads and common prefixes in key order
        seen_prefixes = set()
        for u in uploads:
            if delimiter:
                rest = u.key[len(prefix):]
                idx = rest.find(delimiter)
                if idx != -1:
                    cp = prefix + rest[: idx + len(delimiter)]
                    if cp not in seen_prefixes:
                        seen_prefixes.add(cp)
                        entries.append(cp)
                    continue
            entries.append(u)
        page, truncated = entries[:max_uploads], len(entries) > max_uploads

        def enc(s: str) -> str:
            return quote(s, safe="/") if encoding == "url" else s

        root = element("ListMultipartUploadsResult")
        sub(root, "Bucket", ctx.bucket)
        sub(root, "KeyMarker", enc(key_marker))
        sub(root, "UploadIdMarker", id_marker)
        if truncated and page:
            last = page[-1]
            sub(root, "NextKeyMarker", enc(last if isinstance(last, str) else last.key))
            sub(root, "NextUploadIdMarker", "" if isinstance(last, str) else last.upload_id)
        sub(root, "MaxUploads", max_uploads)
        if prefix:
            sub(root, "Prefix", enc(prefix))
        if delimiter:
            sub(root, "Delimiter", enc(delimiter))
        if encoding:
            sub(root, "EncodingType", encoding)
        sub(root, "IsTruncated", truncated)
        for e in page:
            if isinstance(e, str):
                continue
            el = sub(root, "Upload")
            sub(el, "Key", enc(e.key))
            sub(el, "UploadId", e.upload_id)
            self._owner(el, "Initiator")
            self._owner(el)
            sub(el, "StorageClass", "STANDARD")
            sub(el, "Initiated", iso8601(e.initiated))
        for e in page:
            if isinstance(e, str):
                cp = sub(root, "CommonPrefixes")
                sub(cp, "Prefix", enc(e))
        return self._xml(root)


async def _add_common_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    rid = request.get(_REQUEST_ID) or uuid.uuid4().hex[:16].upper()
    response.headers["x-amz-request-id"] = rid
    response.headers["x-amz-id-2"] = base64.b64encode(rid.encode()).decode()
    response.headers["Server"] = "gpufeed"


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
    app = web.Application(
        client_max_size=_MAX_XML,
        handler_args={
            "auto_decompress": False,  # S3 stores Content-Encoding: gzip bodies as sent
            "read_bufsize": _READ_BUFSIZE,
            # room for long presigned URLs and headers; user metadata is then
            # refused with S3's own MetadataTooLarge rather than a bare 400
            "max_line_size": 64 << 10,
            "max_field_size": 64 << 10,
        },
    )
    front = S3Front(engine, config)
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

    Returns:
        ``(runner, port)``: call ``await runner.cleanup()`` to stop.
    """
    app = make_app(engine, config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.s3_port, reuse_address=True, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port
