"""S3 object operations: GetObject, HeadObject, GetObjectAcl, PutObject,
CopyObject, DeleteObject, DeleteObjects.

Uploads stream into :meth:`gpufeed.engine.Engine.begin_put` chunk by chunk;
downloads are sent with ``sendfile`` from the object's immutable data file.

Source: Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os

from aiohttp import web
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict

from ..engine import MAX_KEY_BYTES
from ..engine.types import DeleteConditions, DeleteResult
from ..errors import (
    DamagedObject,
    GpufeedError,
    InvalidArgument,
    InvalidRequestError,
    KeyTooLong,
    MalformedXML,
    NoSuchKey,
    PreconditionFailed,
    ServiceUnavailable,
)
from ._attributes import parse_part_number, part_range
from ._context import HandlerTable, S3Request, Services
from ._features import check_read_request, check_write_headers, sse_headers
from ._headers import (
    check_conditions,
    checksum_headers,
    content_md5,
    etag_matches,
    object_headers,
    parse_range,
    quote_etag,
    response_overrides,
    serialize_head,
    stored_content_type,
    stored_headers,
    strip_etag,
    user_metadata,
    write_conditions,
)
from ._lock import bypass_governance, check_lock_write, lock_headers, write_retention
from ._router import (
    CopyObject,
    DeleteObject,
    DeleteObjects,
    GetObject,
    GetObjectAcl,
    HeadObject,
    PutObject,
)
from ._snapshots import snapshot_arg
from ._tagging import copy_tags, tag_count_headers, tagging_header
from ._tenancy import CURRENT_TENANT
from ._versions import (
    copy_source_headers,
    delete_headers,
    read_version,
    version_arg,
    write_headers,
)
from ._xml import child_text, element, iso8601, local, parse_http_date, parse_xml, sub

__all__ = ["HANDLERS"]

#: Most keys one DeleteObjects request may name.
_MAX_DELETE_KEYS = 1000


def _has_surrogates(value: str) -> bool:
    return not value.isascii() and any("\udc80" <= c <= "\udcff" for c in value)


class _ObjectResponse(web.StreamResponse):
    """A GetObject / HeadObject response whose header values may hold lone
    surrogates: stored bytes that were not UTF-8 (see :mod:`._headers`), sent
    as those bytes. aiohttp's own serializer encodes strict UTF-8 (it drops or
    refuses them), so such a head is serialized by
    :func:`~._headers.serialize_head` into the writer's header buffer instead.
    """

    async def _write_headers(self) -> None:
        if not any(_has_surrogates(v) for v in self.headers.values()):
            await super()._write_headers()
            return
        request, writer = self._req, self._payload_writer
        assert request is not None and isinstance(writer, StreamWriter)
        status_line = f"HTTP/{request.version[0]}.{request.version[1]} {self.status} {self.reason}"
        # aiohttp's write_headers (hooks, state) over a stand-in, then the real bytes.
        stand_in = CIMultiDict((k, v.encode("utf-8", "surrogateescape").decode("latin-1"))
                               for k, v in self.headers.items())
        await writer.write_headers(status_line, stand_in)
        writer._headers_buf = serialize_head(status_line, self.headers)
        if self._send_headers_immediately:
            writer.send_headers()


class _SendfileResponse(_ObjectResponse):
    """Sends ``count`` bytes of an open version from ``offset``: each piece of
    at most 8 MiB is checked against its block sums on the worker pool, then
    sent with ``loop.sendfile`` (raw data) or written (decompressed data).
    The first piece is checked before the status line goes out, so a damaged
    small object is a clean 500 ``DamagedObject``; damage found later aborts
    the connection (the body falls short of ``Content-Length``, so the client
    fails instead of taking wrong bytes)."""

    def __init__(self, handle, offset: int, count: int, first: list, **kwargs) -> None:
        super().__init__(**kwargs)
        self._handle = handle
        self._offset = offset
        self._count = count
        self._first = first
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
            end, pieces = self._offset + self._count, self._first
            checked = self._offset + sum(len(p) if isinstance(p, memoryview) else p[2] for p in pieces)
            loop = request._loop
            while True:
                # check the next piece on the pool while this one is sent
                ahead = (loop.run_in_executor(None, self._handle.extents, checked, min(end - checked, _PIECE_BYTES))
                         if checked < end else None)
                try:
                    for piece in pieces:
                        await _send_piece(loop, transport, writer, piece)
                except BaseException:
                    if ahead is not None:
                        await asyncio.gather(ahead, return_exceptions=True)
                    raise
                if ahead is None:
                    break
                try:
                    pieces = await ahead
                except (DamagedObject, ServiceUnavailable) as exc:
                    transport.abort()  # headers are out: fail the body, never send bad bytes
                    raise ConnectionResetError(f"object data failed its check or its holder: {exc}") from None
                checked += sum(len(p) if isinstance(p, memoryview) else p[2] for p in pieces)
            await super().write_eof()
            return writer
        finally:
            self._handle.close()


#: Bytes checked and sent per step of a GET.
_PIECE_BYTES = 8 << 20


async def _send_piece(loop, transport, writer, piece) -> int:
    """Send one checked piece (``(fd, offset, length)`` or a buffer); returns its length."""
    if isinstance(piece, memoryview):
        await writer.write(piece)
        return len(piece)
    fd, offset, count = piece
    with open(fd, "rb", closefd=False, buffering=0) as f:
        try:
            await loop.sendfile(transport, f, offset, count)
        except NotImplementedError:  # TLS: through the writer
            left = count
            while left:
                chunk = os.pread(fd, min(left, 1 << 20), offset + count - left)
                if not chunk:
                    break
                await writer.write(chunk)
                left -= len(chunk)
    return count


# -- reads -------------------------------------------------------------------------

async def get_object(s: Services, req: S3Request, ep: GetObject) -> web.StreamResponse:
    """GetObject: the object or one byte range of it, sent with ``sendfile``."""
    return await _get(s, req, ep, head=False)


async def head_object(s: Services, req: S3Request, ep: HeadObject) -> web.StreamResponse:
    """HeadObject: GetObject's status and headers, no body."""
    return await _get(s, req, ep, head=True)


async def _get(s: Services, req: S3Request, ep: GetObject | HeadObject, *, head: bool) -> web.StreamResponse:
    h = req.headers
    check_read_request(h, req.query)
    part = req.query.get("partNumber")
    part_number = parse_part_number(part) if part is not None else None
    info, fobj, versions = await s.call(read_version, s, ep.bucket, ep.key, version_arg(req.query),
                                        open_file=not head, snapshot=snapshot_arg(req.query))
    try:
        check_conditions(h, info)
        if part_number is not None and "Range" in h:
            raise InvalidRequestError("Cannot specify both Range header and partNumber query parameter")
        rng = parse_range(h.get("Range"), info.size)
        headers = object_headers(info, checksums=rng is None and part_number is None and
                                 h.get("x-amz-checksum-mode", "").upper() == "ENABLED")
        headers.update(versions)
        headers.update(response_overrides(req.query))
        headers.update(lock_headers(info) | tag_count_headers(info))
        status = 200
        offset, count = 0, info.size
        if part_number is not None:
            offset, count, parts_count = await s.call(part_range, s.engine, info, part_number)
            if parts_count is not None:
                headers["x-amz-mp-parts-count"] = str(parts_count)
            if count:  # S3 answers a part as a range of the object
                rng = offset, count
        if rng is not None:
            offset, count = rng
            status = 206
            headers["Content-Range"] = f"bytes {offset}-{offset + count - 1}/{info.size}"
    except BaseException:
        if fobj is not None:
            fobj.close()
        raise
    if head:
        resp = _ObjectResponse(status=status, headers=headers)
        resp.content_length = count
        await resp.prepare(req.http)
        await resp.write_eof()
        return resp
    try:
        first = await s.call(fobj.extents, offset, min(count, _PIECE_BYTES))
    except BaseException:
        fobj.close()
        raise
    return _SendfileResponse(fobj, offset, count, first, status=status, headers=headers)


async def get_object_acl(s: Services, req: S3Request, ep: GetObjectAcl) -> web.Response:
    """GetObjectAcl: the owner has FULL_CONTROL."""
    await s.call(s.engine.head_object, ep.bucket, ep.key, version_arg(req.query))
    return s.acl()


# -- writes ------------------------------------------------------------------------

def _check_write_conditions(s: Services, req: S3Request, bucket: str, key: str) -> None:
    """If-Match / If-None-Match on PutObject, checked early (blocking) so a
    failing request is refused before its body is read. Only a fast path: the
    engine checks the same conditions again, atomically, inside its commit
    (see :func:`~gpufeed.s3._headers.write_conditions`)."""
    h = req.headers
    if "If-Match" not in h and "If-None-Match" not in h:
        return
    try:
        info = s.engine.head_object(bucket, key)
    except NoSuchKey:
        if "If-Match" in h:
            raise
        return
    failed = "At least one of the pre-conditions you specified did not hold"
    if "If-None-Match" in h and etag_matches(h["If-None-Match"], info.etag):
        raise PreconditionFailed(failed, condition="If-None-Match")
    if "If-Match" in h and not etag_matches(h["If-Match"], info.etag):
        raise PreconditionFailed(failed, condition="If-Match")


async def put_object(s: Services, req: S3Request, ep: PutObject) -> web.Response:
    """PutObject: stream the body into a new version, committed atomically."""
    h = req.headers
    check_write_headers(h)
    md5 = content_md5(h)
    metadata = user_metadata(h)
    content_type = stored_content_type(h)
    stored = stored_headers(h)
    conditions = write_conditions(h)
    retention, tags = write_retention(h), tagging_header(h)
    await check_lock_write(s, ep.bucket, h, retention, body=True)
    await s.call(_check_write_conditions, s, req, ep.bucket, ep.key)
    pending = await s.call(s.engine.begin_put, ep.bucket, ep.key)

    def commit(checksums, expected_size):
        return pending.commit(content_type=content_type, metadata=metadata, checksums=checksums,
                              content_md5=md5, expected_size=expected_size, headers=stored,
                              tags=tags, retention=retention, **conditions)

    info, checksums = await s.receive(req, pending, commit)
    return web.Response(status=200, headers=checksum_headers(info.etag, checksums) | sse_headers(h)
                        | write_headers(info))


async def copy_object(s: Services, req: S3Request, ep: CopyObject) -> web.Response:
    """CopyObject, with the ``COPY`` or ``REPLACE`` metadata directive.

    Raises:
        InvalidArgument: an unknown metadata directive.
        InvalidRequestError: a copy onto itself that changes nothing.
    """
    h = req.headers
    check_write_headers(h, copy=True)
    directive = h.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise InvalidArgument("Unknown metadata directive.")
    retention, tags = write_retention(h), copy_tags(h)
    await check_lock_write(s, ep.bucket, h, retention, body=False)
    src = await s.call(s.engine.head_object, ep.source_bucket, ep.source_key, ep.source_version_id)
    check_conditions(h, src, copy_source=True)
    if directive == "COPY" and (ep.source_bucket, ep.source_key, ep.source_version_id) == \
            (ep.bucket, ep.key, None):
        raise InvalidRequestError(
            "This copy request is illegal because it is trying to copy an object to itself "
            "without changing the object's metadata, storage class, website redirect location "
            "or encryption attributes."
        )
    metadata = content_type = stored = None
    if directive == "REPLACE":
        metadata = user_metadata(h)
        content_type = stored_content_type(h)
        stored = stored_headers(h)
    info = await s.call(s.engine.copy_object, ep.source_bucket, ep.source_key, ep.bucket, ep.key,
                        metadata=metadata, content_type=content_type, headers=stored, tags=tags,
                        retention=retention, src_version_id=ep.source_version_id, **write_conditions(h))
    root = element("CopyObjectResult")
    sub(root, "LastModified", iso8601(info.last_modified))
    sub(root, "ETag", quote_etag(info.etag))
    versions = write_headers(info) | await s.call(copy_source_headers, s.engine, src)
    return s.xml(root, headers=(sse_headers(h) or sse_headers(info.headers)) | versions)


# -- deletes -----------------------------------------------------------------------

def _delete_conditions(etag: str | None, last_modified: str | None, size: str | None,
                       *, iso: bool) -> DeleteConditions | None:
    """The conditions of a delete (``None`` when none is given).

    Raises:
        InvalidArgument: a size that is not a non-negative integer, or a time that does not parse.
    """
    if etag is None and last_modified is None and size is None:
        return None
    when = None
    if last_modified is not None:
        try:
            when = dt.datetime.fromisoformat(last_modified.strip().replace("Z", "+00:00")).timestamp() if iso \
                else parse_http_date(last_modified)
        except ValueError:
            when = None
        if when is None:
            raise InvalidArgument("Invalid date given for the last-modified-time condition",
                                  argument_name="x-amz-if-match-last-modified-time", argument_value=last_modified)
    n = None
    if size is not None:
        if not size.strip().isdigit():
            raise InvalidArgument("Invalid value for the size condition", argument_name="x-amz-if-match-size",
                                  argument_value=size)
        n = int(size)
    return DeleteConditions(None if etag is None else "*" if etag.strip() == "*" else strip_etag(etag), when, n)


async def delete_object(s: Services, req: S3Request, ep: DeleteObject) -> web.Response:
    """DeleteObject: 204 whether or not the key (or version) existed; in a
    versioned bucket, with the version removed or the delete marker made; a
    version under GOVERNANCE retention goes with ``x-amz-bypass-governance-retention: true``.
    ``If-Match``, ``x-amz-if-match-last-modified-time`` and ``x-amz-if-match-size``
    make it conditional (412 PreconditionFailed when one does not hold)."""
    h = req.headers
    conditions = _delete_conditions(h.get("If-Match"), h.get("x-amz-if-match-last-modified-time"),
                                    h.get("x-amz-if-match-size"), iso=False)
    result = await s.call(s.engine.delete_object, ep.bucket, ep.key, version_arg(req.query),
                          bypass_governance=bypass_governance(h), conditions=conditions)
    return web.Response(status=204, headers=delete_headers(result))


def _delete_keys(data: bytes) -> tuple[list[tuple[str, str | None, DeleteConditions | None]], bool]:
    """A Delete document -> ([(key, version id or None, conditions)], quiet).

    Raises:
        MalformedXML: not a Delete document, an Object without a Key, or not
            1 to 1000 objects.
        InvalidArgument: an object's ``Size`` or ``LastModifiedTime`` that does not parse.
    """
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
            keys.append((key, child_text(el, "VersionId"),
                         _delete_conditions(child_text(el, "ETag"), child_text(el, "LastModifiedTime"),
                                            child_text(el, "Size"), iso=True)))
    if not keys or len(keys) > _MAX_DELETE_KEYS:
        raise MalformedXML("Delete must name between 1 and 1000 objects")
    return keys, quiet


def _deleted(root, key: str, version: str | None, result: DeleteResult) -> None:
    """One ``Deleted`` entry, as S3 words it: the version asked for, and the
    delete marker made or removed."""
    d = sub(root, "Deleted")
    sub(d, "Key", key)
    if version is not None:
        sub(d, "VersionId", version)
    if result.delete_marker:
        sub(d, "DeleteMarker", True)
        sub(d, "DeleteMarkerVersionId", result.version_id)


async def delete_objects(s: Services, req: S3Request, ep: DeleteObjects) -> web.Response:
    """DeleteObjects: delete up to 1000 keys or versions; each failure is
    reported in the result document, not as the request's status (a key the
    bucket policy does not let the requester delete is such an AccessDenied)."""
    keys, quiet = _delete_keys(await s.read_xml(req))
    bypass = bypass_governance(req.headers)
    tenant, access_key, source_ip = CURRENT_TENANT.get(), req.auth.access_key or None, req.http.remote

    def run() -> list[tuple[str, str | None, DeleteResult | GpufeedError]]:
        out: list[tuple[str, str | None, DeleteResult | GpufeedError]] = []
        for key, version, conditions in keys:
            try:
                if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
                    raise KeyTooLong("Your key is too long")
                if version == "":
                    raise InvalidArgument("Version id cannot be the empty string")
                s.engine.authorize(tenant, "s3:DeleteObject" if version is None else "s3:DeleteObjectVersion",
                                   ep.bucket, key, access_key=access_key, source_ip=source_ip)
                out.append((key, version, s.engine.delete_object(ep.bucket, key, version, bypass_governance=bypass,
                                                                 conditions=conditions)))
            except GpufeedError as exc:
                out.append((key, version, exc))
        return out

    results = await s.call(run)
    root = element("DeleteResult")
    for key, version, res in results:
        if isinstance(res, DeleteResult):
            if not quiet:
                _deleted(root, key, version, res)
        else:
            e = sub(root, "Error")
            sub(e, "Key", key)
            if version is not None:
                sub(e, "VersionId", version)
            sub(e, "Code", res.code)
            sub(e, "Message", res.message)
    return s.xml(root)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    GetObject: get_object,
    HeadObject: head_object,
    GetObjectAcl: get_object_acl,
    PutObject: put_object,
    CopyObject: copy_object,
    DeleteObject: delete_object,
    DeleteObjects: delete_objects,
}
