"""S3 multipart uploads: Create, UploadPart, UploadPartCopy, Complete, Abort,
ListParts and ListMultipartUploads.

Source: "Uploading and copying objects using multipart upload", Amazon S3
User Guide, and the operations of the same names in the API Reference.
"""

from __future__ import annotations

import base64
from urllib.parse import quote

from aiohttp import web

from ..checksums import (
    CHECKSUM_ALGORITHMS,
    CHECKSUM_TYPES,
    COMPOSITE_ALGORITHMS,
    FULL_OBJECT_ALGORITHMS,
    UPLOAD_CHECKSUM_ALGORITHM,
    UPLOAD_CHECKSUM_TYPE,
    multipart_checksums,
    new_hasher,
)
from ..engine import UploadInfo
from ..errors import (
    BadDigest,
    InternalError,
    InvalidArgument,
    InvalidCopySourceRange,
    InvalidPart,
    InvalidRequestError,
    MalformedXML,
    NoSuchUpload,
)
from ._attributes import CHECKSUM_ELEMENT
from ._checksum import checksum_value, sent_algorithms
from ._context import HandlerTable, S3Request, Services
from ._features import check_part_headers, check_write_headers, sse_headers
from ._headers import (
    check_conditions,
    checksum_headers,
    content_md5,
    quote_etag,
    stored_content_type,
    stored_headers,
    strip_etag,
    user_metadata,
    write_conditions,
)
from ._listing import url_encoder
from ._lock import check_lock_write, write_retention
from ._router import (
    AbortMultipartUpload,
    CompleteMultipartUpload,
    CreateMultipartUpload,
    ListMultipartUploads,
    ListParts,
    UploadPart,
    UploadPartCopy,
)
from ._tagging import tagging_header
from ._versions import copy_source_headers, write_headers
from ._xml import child_text, element, iso8601, local, parse_xml, sub

__all__ = ["HANDLERS"]


# -- uploads -----------------------------------------------------------------------

def _upload_checksum(h) -> tuple[str, str] | None:
    """``x-amz-checksum-algorithm`` and ``x-amz-checksum-type`` of a
    CreateMultipartUpload -> ``(ALGORITHM, TYPE)``, or None without an algorithm.

    The type defaults to FULL_OBJECT for CRC64NVME and COMPOSITE otherwise;
    SHA-1/SHA-256 cannot be FULL_OBJECT and CRC64NVME cannot be COMPOSITE.

    Raises:
        InvalidRequestError: an unknown algorithm or type, a type without an
            algorithm, or a combination S3 does not define.

    Source: "CreateMultipartUpload" (``x-amz-checksum-type``), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateMultipartUpload.html
    """
    alg = (h.get("x-amz-checksum-algorithm") or "").strip().lower()
    ctype = (h.get("x-amz-checksum-type") or "").strip().upper()
    if not alg:
        if ctype:
            raise InvalidRequestError(
                "The x-amz-checksum-type header can only be used with the x-amz-checksum-algorithm header.")
        return None
    if alg not in CHECKSUM_ALGORITHMS:
        raise InvalidRequestError(
            "Checksum algorithm provided is unsupported. Please try again with any of the valid types: "
            "[CRC32, CRC32C, CRC64NVME, SHA1, SHA256]")
    if ctype and ctype not in CHECKSUM_TYPES:
        raise InvalidRequestError("Value for x-amz-checksum-type header is invalid.")
    ctype = ctype or ("FULL_OBJECT" if alg == "crc64nvme" else "COMPOSITE")
    allowed = FULL_OBJECT_ALGORITHMS if ctype == "FULL_OBJECT" else COMPOSITE_ALGORITHMS
    if alg not in allowed:
        raise InvalidRequestError(f"The {ctype} checksum type cannot be used with the {alg} checksum algorithm.")
    return alg.upper(), ctype


async def create_multipart_upload(s: Services, req: S3Request, ep: CreateMultipartUpload) -> web.Response:
    """CreateMultipartUpload: a new upload id; metadata and checksum type are taken now."""
    h = req.headers
    check_write_headers(h)
    checksum = _upload_checksum(h)
    stored = stored_headers(h)
    if checksum is not None:
        stored[UPLOAD_CHECKSUM_ALGORITHM] = checksum[0].lower()
        stored[UPLOAD_CHECKSUM_TYPE] = checksum[1]
    retention = write_retention(h)
    await check_lock_write(s, ep.bucket, h, retention, body=False)
    up = await s.call(s.engine.create_multipart_upload, ep.bucket, ep.key,
                      content_type=stored_content_type(h), metadata=user_metadata(h),
                      headers=stored, tags=tagging_header(h), retention=retention)
    root = element("InitiateMultipartUploadResult")
    sub(root, "Bucket", ep.bucket)
    sub(root, "Key", ep.key)
    sub(root, "UploadId", up.upload_id)
    headers = sse_headers(h)
    if checksum is not None:
        headers["x-amz-checksum-algorithm"], headers["x-amz-checksum-type"] = checksum
    return s.xml(root, headers=headers)


def _find_upload(s: Services, bucket: str, key: str, upload_id: str) -> UploadInfo | None:
    """The upload ``upload_id`` of ``bucket/key``, or None (blocking: runs on the pool)."""
    try:
        return s.engine.head_multipart_upload(bucket, key, upload_id)
    except NoSuchUpload:
        return None


def _created_checksum(upload: UploadInfo | None) -> tuple[str | None, str | None]:
    """``(algorithm, type)`` an upload was created with (lower-case algorithm,
    ``COMPOSITE`` / ``FULL_OBJECT``); ``None`` for what it did not name."""
    if upload is None:
        return None, None
    return upload.headers.get(UPLOAD_CHECKSUM_ALGORITHM), upload.headers.get(UPLOAD_CHECKSUM_TYPE)


def _type_mismatch(expected: str, actual: str) -> InvalidRequestError:
    return InvalidRequestError(f"Checksum Type mismatch occurred, expected checksum Type: {expected}, "
                               f"actual checksum Type: {actual}")


def _part_checksum(headers, upload: UploadInfo | None) -> tuple[str, ...]:
    """Check that an UploadPart carries the checksum its upload was created with.

    A part of an upload created with ``x-amz-checksum-algorithm`` must carry
    exactly that algorithm's checksum (header or trailer); a FULL_OBJECT
    upload's part may carry none, and the server computes it.

    Returns:
        The algorithms the server must compute itself (empty, or the upload's).

    Raises:
        InvalidRequestError: another algorithm's checksum, several, none on a
            COMPOSITE upload ("Checksum Type mismatch occurred, expected
            checksum Type: crc32, actual checksum Type: null"), or an
            ``x-amz-sdk-checksum-algorithm`` naming another algorithm than the one sent.

    Source: "UploadPart" (``x-amz-checksum-*``, InvalidRequest), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPart.html
    """
    sent = sent_algorithms(headers)
    algorithm, ctype = _created_checksum(upload)
    if algorithm is None:
        return ()
    if len(sent) > 1:
        raise InvalidRequestError("Expecting a single x-amz-checksum- header. "
                                  "Multiple checksum Types are not allowed.")
    if sent and sent[0] != algorithm:
        raise _type_mismatch(algorithm, sent[0])
    if sent:
        return ()
    if ctype == "FULL_OBJECT":
        return (algorithm,)
    raise _type_mismatch(algorithm, "null")


async def upload_part(s: Services, req: S3Request, ep: UploadPart) -> web.Response:
    """UploadPart: stream the body into the part, replacing an earlier one; the
    part carries its upload's checksum algorithm (see :func:`_part_checksum`), and
    needs ``Content-MD5`` or a checksum in a bucket with a default retention."""
    check_part_headers(req.headers)
    md5 = content_md5(req.headers)
    await check_lock_write(s, ep.bucket, req.headers, None, body=True)  # default retention wants a checksum

    def begin():
        compute = _part_checksum(req.headers, _find_upload(s, ep.bucket, ep.key, ep.upload_id))
        return compute, s.engine.begin_part(ep.bucket, ep.key, ep.upload_id, ep.part_number)

    compute, pending = await s.call(begin)

    def commit(checksums, expected_size):
        return pending.commit(content_md5=md5, expected_size=expected_size, checksums=checksums)

    part, checksums = await s.receive(req, pending, commit, compute=compute)
    return web.Response(status=200, headers=checksum_headers(part.etag, checksums))


def _copy_range(value: str | None, size: int) -> tuple[int, int]:
    """``x-amz-copy-source-range: bytes=first-last`` -> ``(offset, count)``
    within a source of ``size`` bytes (the whole source when absent).

    Source: "UploadPartCopy", Amazon S3 API Reference (both bounds required,
    zero-based and inclusive).

    Raises:
        InvalidArgument: not ``bytes=first-last`` with ``first <= last`` (400).
        InvalidCopySourceRange: the range reaches past the source's end (400 InvalidRange).
    """
    if value is None:
        return 0, size
    value = value.strip()
    first, _, last = value.removeprefix("bytes=").partition("-")
    if not value.startswith("bytes=") or not (first.isdigit() and last.isdigit()) or int(last) < int(first):
        raise InvalidArgument("The x-amz-copy-source-range value must be of the form bytes=first-last "
                              "where first and last are the zero-based offsets of the first and last bytes to copy")
    offset, end = int(first), int(last)
    if end >= size:
        raise InvalidCopySourceRange(f"Range specified is not valid for source object of size: {size}")
    return offset, end - offset + 1


async def upload_part_copy(s: Services, req: S3Request, ep: UploadPartCopy) -> web.Response:
    """UploadPartCopy: a part copied from (a byte range of) an object, file to file."""
    h = req.headers
    check_part_headers(h, copy=True)
    src, fobj = await s.open_object(ep.source_bucket, ep.source_key, ep.source_version_id)
    try:
        check_conditions(h, src, copy_source=True)
        offset, count = _copy_range(h.get("x-amz-copy-source-range"), src.size)
        versions = await s.call(copy_source_headers, s.engine, src)
    except BaseException:
        fobj.close()
        raise

    def run():
        with fobj:
            algorithm = _created_checksum(_find_upload(s, ep.bucket, ep.key, ep.upload_id))[0]
            pending = s.engine.begin_part(ep.bucket, ep.key, ep.upload_id, ep.part_number)
            with pending:
                hasher = new_hasher(algorithm) if algorithm else None
                if fobj.copy_to(pending, offset, count, hasher) < count:
                    raise InternalError("source object is shorter than its catalog size")
                checksums = {algorithm: base64.b64encode(hasher.digest()).decode()} if hasher else {}
                return pending.commit(expected_size=count, checksums=checksums)

    part = await s.call(run)
    root = element("CopyPartResult")
    sub(root, "LastModified", iso8601(part.last_modified))
    sub(root, "ETag", quote_etag(part.etag))
    for alg, value in part.checksums.items():
        sub(root, CHECKSUM_ELEMENT[alg], value)
    return s.xml(root, headers=versions)


def _complete_parts(data: bytes) -> list[tuple[int, str, dict[str, str]]]:
    """A CompleteMultipartUpload document -> ``[(part number, etag, {algorithm: checksum})]``.

    Raises:
        MalformedXML: not that document, a Part without a number or ETag, or no part.
    """
    doc = parse_xml(data)
    if local(doc.tag) != "CompleteMultipartUpload":
        raise MalformedXML("expected a CompleteMultipartUpload document")
    by_element = {v: k for k, v in CHECKSUM_ELEMENT.items()}
    parts = []
    for el in doc:
        if local(el.tag) != "Part":
            continue
        number, etag = child_text(el, "PartNumber"), child_text(el, "ETag")
        if number is None or etag is None:
            raise MalformedXML("each Part needs a PartNumber and an ETag")
        checksums = {by_element[local(c.tag)]: (c.text or "").strip()
                     for c in el if local(c.tag) in by_element}
        try:
            parts.append((int(number), strip_etag(etag), checksums))
        except ValueError as exc:
            raise MalformedXML("PartNumber must be an integer") from exc
    if not parts:
        raise MalformedXML("The XML you provided was not well-formed or did not validate against our published schema.")
    return parts


#: S3's message for a listed part that does not match an uploaded one (two spaces, as S3 writes it).
_INVALID_PART = ("One or more of the specified parts could not be found.  The part may not have been "
                 "uploaded, or the specified entity tag may not match the part's entity tag.")


def _check_part_values(parts: list[tuple[int, str, dict[str, str]]], algorithm: str | None,
                       ctype: str | None) -> None:
    """The checksums a CompleteMultipartUpload document gives for its parts:
    at most one per part, each well formed; every part's, when the upload was
    created with a COMPOSITE checksum.

    Raises:
        InvalidArgument: a malformed value or several for one part ("Invalid
            Base64 or multiple checksums present in request").
        InvalidRequestError: a COMPOSITE upload's part given without its checksum.
    """
    for number, _etag, checksums in parts:
        try:
            if len(checksums) > 1:
                raise InvalidRequestError("multiple checksums")
            for alg, value in checksums.items():
                checksum_value(alg, value, f"Checksum{alg.upper()} of part {number}")
        except InvalidRequestError as exc:
            raise InvalidArgument(
                "Invalid Base64 or multiple checksums present in request", argument_name="Checksum",
                argument_value="".join(f"{alg.upper()}:{value};" for alg, value in checksums.items()),
            ) from exc
        if algorithm is not None and ctype != "FULL_OBJECT" and algorithm not in checksums:
            raise InvalidRequestError(
                f"The upload was created using a {algorithm} checksum. The complete request must include "
                f"the checksum for each part. It was missing for part {number} in the request.")


def _check_whole(given: dict[str, str], parts: list[tuple[dict[str, str], int]], ctype: str | None) -> None:
    """The whole-object ``x-amz-checksum-<algorithm>`` headers of a
    CompleteMultipartUpload against the checksums combined from ``parts``
    (``({algorithm: base64}, size)`` in object order).

    Raises:
        InvalidRequestError: a malformed header value.
        BadDigest: a value that differs from the combined one.
    """
    combined = multipart_checksums(parts, ctype)
    for alg, value in given.items():
        b64, dash, count = value.strip().partition("-")
        if dash and not count.isdigit():
            raise InvalidRequestError(f"Value for x-amz-checksum-{alg} header is invalid.")
        checksum_value(alg, b64, f"x-amz-checksum-{alg} header")
        want = combined.get(alg)
        if want is None:
            continue  # a part lacks this algorithm (or is missing: the engine refuses that)
        want_b64, _, want_count = want.partition("-")
        if b64 != want_b64 or (dash and count != want_count):
            raise BadDigest(f"The {alg} you specified did not match the calculated checksum.")


def _check_complete_checksums(s: Services, req: S3Request, ep: CompleteMultipartUpload,
                              parts: list[tuple[int, str, dict[str, str]]]) -> None:
    """Check the checksums a CompleteMultipartUpload carries before anything changes
    (blocking: runs on the pool).

    Each part checksum in the document must be well formed and equal the one
    the part was uploaded with; an upload created with a COMPOSITE checksum
    needs each part's. An ``x-amz-checksum-<algorithm>`` header is the whole
    object's: the combined CRC for FULL_OBJECT, ``<base64>-<n>`` (or just
    ``<base64>``) for COMPOSITE, as the server itself returns it (for
    COMPOSITE, combined from the document's part checksums, so it is checked
    first); an ``x-amz-checksum-type`` header must name the upload's type.

    Raises:
        InvalidArgument: a malformed part checksum, or several for one part.
        InvalidRequestError: a malformed header, a type other than the upload's,
            or a part of a COMPOSITE upload listed without its checksum.
        InvalidPart: a part checksum that differs from the uploaded part's.
        BadDigest: the whole-object checksum differs from the combined one.

    Source: "CompleteMultipartUpload", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html
    """
    h = req.headers
    given = {alg: h[f"x-amz-checksum-{alg}"] for alg in CHECKSUM_ALGORITHMS if f"x-amz-checksum-{alg}" in h}
    wanted_type = (h.get("x-amz-checksum-type") or "").strip().upper()
    upload = _find_upload(s, ep.bucket, ep.key, ep.upload_id)
    algorithm, ctype = _created_checksum(upload)
    if upload is None or (algorithm is None and not given and not wanted_type
                          and not any(ck for _, _, ck in parts)):
        return  # unknown, completed or aborted: the completion itself answers that
    try:
        have = {p.part_number: p for p in s.engine.list_parts(ep.bucket, ep.key, ep.upload_id)}
    except NoSuchUpload:
        return
    if wanted_type and wanted_type not in CHECKSUM_TYPES:
        raise InvalidRequestError("Value for x-amz-checksum-type header is invalid.")
    if wanted_type and wanted_type != (ctype or "COMPOSITE"):
        raise InvalidRequestError(f"The upload was created using the {ctype or 'COMPOSITE'} checksum mode. "
                                  f"The complete request must use the same checksum mode.")
    _check_part_values(parts, algorithm, ctype)
    found = [(number, have[number], ck) for number, _etag, ck in parts if number in have]
    whole = len(found) == len(parts)
    if given and whole and ctype == "COMPOSITE":
        _check_whole(given, [({**p.checksums, **ck}, p.size) for _, p, ck in found], ctype)
    for number, part, checksums in found:
        for alg, value in checksums.items():
            if part.checksums.get(alg) != value.strip():
                raise InvalidPart(_INVALID_PART, part_number=number)
    if given:
        _check_whole(given, [(p.checksums, p.size) for _, p, _ck in found] if whole else [], ctype)


async def complete_multipart_upload(s: Services, req: S3Request, ep: CompleteMultipartUpload) -> web.Response:
    """CompleteMultipartUpload: join the listed parts into the object, atomically
    (with the request's If-Match / If-None-Match checked inside the commit).
    The object's checksums are composite (``<base64>-<n>``) or full-object
    CRCs, as the upload was created."""
    parts = _complete_parts(await s.read_xml(req, checksum_headers=False))
    await s.call(_check_complete_checksums, s, req, ep, parts)
    info = await s.call(s.engine.complete_multipart_upload, ep.bucket, ep.key,
                        ep.upload_id, [(n, e) for n, e, _ in parts], **write_conditions(req.headers))
    root = element("CompleteMultipartUploadResult")
    host = req.target.host or ""
    sub(root, "Location", f"http://{host}/{quote(ep.bucket)}/{quote(ep.key)}")
    sub(root, "Bucket", ep.bucket)
    sub(root, "Key", ep.key)
    sub(root, "ETag", quote_etag(info.etag))
    for alg, value in info.checksums.items():
        sub(root, CHECKSUM_ELEMENT[alg], value)
    if info.checksums:
        composite = any("-" in v for v in info.checksums.values())
        sub(root, "ChecksumType", "COMPOSITE" if composite else "FULL_OBJECT")
    return s.xml(root, headers=sse_headers(info.headers) | write_headers(info))


async def abort_multipart_upload(s: Services, req: S3Request, ep: AbortMultipartUpload) -> web.Response:
    """AbortMultipartUpload: drop the upload and its parts."""
    await s.call(s.engine.abort_multipart_upload, ep.bucket, ep.key, ep.upload_id)
    return web.Response(status=204)


# -- listings ----------------------------------------------------------------------

def _sub_checksum_kind(parent, algorithm: str | None, ctype: str | None) -> None:
    """``ChecksumAlgorithm`` and ``ChecksumType`` of an upload created with them."""
    if algorithm is not None:
        sub(parent, "ChecksumAlgorithm", algorithm.upper())
        if ctype is not None:
            sub(parent, "ChecksumType", ctype)


async def list_parts(s: Services, req: S3Request, ep: ListParts) -> web.Response:
    """ListParts: one page of an upload's parts in part-number order, each with
    its checksum, and the upload's checksum algorithm and type.

    Source: "ListParts", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListParts.html
    """
    q = req.query
    max_parts = s.query_int(q, "max-parts", 1000, 1000)
    marker = s.query_int(q, "part-number-marker", 0, 10000)

    def read():
        return s.engine.list_parts(ep.bucket, ep.key, ep.upload_id), \
            _created_checksum(_find_upload(s, ep.bucket, ep.key, ep.upload_id))

    parts, (algorithm, ctype) = await s.call(read)
    parts = sorted((p for p in parts if p.part_number > marker), key=lambda p: p.part_number)
    page, truncated = parts[:max_parts], len(parts) > max_parts
    root = element("ListPartsResult")
    sub(root, "Bucket", ep.bucket)
    sub(root, "Key", ep.key)
    sub(root, "UploadId", ep.upload_id)
    s.owner(root, "Initiator")
    s.owner(root)
    sub(root, "StorageClass", "STANDARD")
    _sub_checksum_kind(root, algorithm, ctype)
    sub(root, "PartNumberMarker", marker)
    sub(root, "NextPartNumberMarker", page[-1].part_number if page else marker)
    sub(root, "MaxParts", max_parts)
    sub(root, "IsTruncated", truncated)
    for p in page:
        el = sub(root, "Part")
        sub(el, "PartNumber", p.part_number)
        sub(el, "LastModified", iso8601(p.last_modified))
        sub(el, "ETag", quote_etag(p.etag))
        sub(el, "Size", p.size)
        for alg, value in p.checksums.items():
            sub(el, CHECKSUM_ELEMENT[alg], value)
    return s.xml(root)


def _upload_entries(uploads, prefix: str, delimiter: str, key_marker: str, id_marker: str) -> list:
    """Uploads after the markers, and the common prefixes that group them, in key order.

    Returns:
        A list of :class:`~gpufeed.engine.UploadInfo` and prefix strings.
    """
    uploads = sorted(uploads, key=lambda u: (u.key.encode(), u.initiated, u.upload_id))
    if key_marker:
        uploads = [u for u in uploads
                   if u.key.encode() > key_marker.encode()
                   or (id_marker and u.key == key_marker and (u.initiated, u.upload_id) >
                       next(((x.initiated, x.upload_id) for x in uploads if x.upload_id == id_marker),
                            (float("inf"), "")))]
    entries: list = []
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
    return entries


async def list_multipart_uploads(s: Services, req: S3Request, ep: ListMultipartUploads) -> web.Response:
    """ListMultipartUploads: one page of the bucket's uploads in progress (with the
    checksum algorithm and type of those created with one).

    Source: "ListMultipartUploads", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListMultipartUploads.html
    """
    q = req.query
    prefix = q.get("prefix", "")
    delimiter = q.get("delimiter", "")
    key_marker = q.get("key-marker", "")
    id_marker = q.get("upload-id-marker", "")
    max_uploads = s.query_int(q, "max-uploads", 1000, 1000)
    encoding = q.get("encoding-type")
    uploads = await s.call(s.engine.list_multipart_uploads, ep.bucket, prefix)
    entries = _upload_entries(uploads, prefix, delimiter, key_marker, id_marker)
    page, truncated = entries[:max_uploads], len(entries) > max_uploads
    enc = url_encoder(encoding)
    root = element("ListMultipartUploadsResult")
    sub(root, "Bucket", ep.bucket)
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
        s.owner(el, "Initiator")
        s.owner(el)
        sub(el, "StorageClass", "STANDARD")
        sub(el, "Initiated", iso8601(e.initiated))
        _sub_checksum_kind(el, *_created_checksum(e))
    for e in page:
        if isinstance(e, str):
            cp = sub(root, "CommonPrefixes")
            sub(cp, "Prefix", enc(e))
    return s.xml(root)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    CreateMultipartUpload: create_multipart_upload,
    UploadPart: upload_part,
    UploadPartCopy: upload_part_copy,
    CompleteMultipartUpload: complete_multipart_upload,
    AbortMultipartUpload: abort_multipart_upload,
    ListParts: list_parts,
    ListMultipartUploads: list_multipart_uploads,
}
