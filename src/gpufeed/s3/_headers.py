"""S3 request and response headers: ETags, conditional requests, ranges, metadata.

Pure functions over header mappings and :class:`~gpufeed.engine.ObjectInfo`;
no I/O. Used by the object and multipart handlers.

Header bytes: aiohttp decodes request header values as UTF-8 with
``surrogateescape``, so bytes that are not UTF-8 arrive as lone surrogates. A
stored value (user metadata, the standard headers S3 keeps) whose bytes were
not UTF-8 is stored as the latin-1 decoding of those bytes (a ``str`` every
catalog and front can hold) and its response header name is listed under
:data:`RAW_BYTES_KEY` in the object's stored headers; :func:`object_headers`
turns it back into the surrogate form, which :func:`serialize_head` sends as
the original bytes. Valid UTF-8 is stored as the text it spells.

Sources: RFC 9110 sections 13 (conditional requests) and 14 (range requests);
"PutObject" and "GetObject", Amazon S3 API Reference.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

from multidict import CIMultiDict

from ..checksums import CHECKSUM_ALGORITHMS
from ..engine import ObjectInfo
from ..errors import (
    InvalidArgument,
    InvalidDigest,
    InvalidRange,
    InvalidRequestError,
    MetadataTooLarge,
    NotModified,
    PreconditionFailed,
)
from ..store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest, resolve_range
from ._xml import http_date, parse_http_date

__all__ = [
    "quote_etag",
    "strip_etag",
    "etag_matches",
    "check_conditions",
    "parse_range",
    "stored_headers",
    "user_metadata",
    "stored_content_type",
    "content_md5",
    "require_integrity_header",
    "has_integrity_header",
    "object_headers",
    "write_conditions",
    "checksum_headers",
    "header_value",
    "response_overrides",
    "RESPONSE_OVERRIDES",
    "MAX_USER_METADATA",
    "RAW_BYTES_KEY",
    "serialize_head",
]

#: S3's limit on user-defined metadata (names + values), bytes.
MAX_USER_METADATA = 2 << 10  # 2 KiB

#: Key of an object's stored headers listing (comma-separated, lower case) the
#: response headers whose stored values are the latin-1 decoding of request
#: bytes that were not UTF-8; never sent as a header itself.
RAW_BYTES_KEY = "x-gpufeed-raw-bytes"

#: Standard headers S3 stores at upload and returns on GET/HEAD, as spelled in responses.
#: Source: "PutObject" request headers, Amazon S3 API Reference.
_STORED_HEADERS = (
    "Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Expires",
    "x-amz-website-redirect-location", "x-amz-server-side-encryption",
)

#: GetObject query parameters that override a response header.
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}

_FAILED = "At least one of the pre-conditions you specified did not hold"

#: What an HTTP field value may not hold: control characters other than HTAB
#: (RFC 9110 section 5.5); CR, LF and NUL would split or end the response head.
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: An HTTP field name: a token (RFC 9110 section 5.1).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def header_value(name: str, value: str) -> str:
    """``value`` unchanged, checked to be safe to send as the response header ``name``.

    Every value a request or a stored object puts into a response header goes
    through here, so a hostile one is refused instead of splitting the response.

    Raises:
        InvalidArgument: ``name`` is not an HTTP token, or ``value`` holds a
            control character (CR, LF, NUL, ...; HTAB is allowed).
    """
    if not _TOKEN.fullmatch(name):
        raise InvalidArgument(f"{name!r} is not a valid HTTP header name")
    if _BAD_VALUE.search(value):
        raise InvalidArgument(f"The value for {name} holds a control character (CR, LF, NUL, ...)")
    return value


def response_overrides(query: dict[str, str]) -> dict[str, str]:
    """The ``response-*`` query parameters of a GetObject as ``{header: value}``.

    Raises:
        InvalidArgument: a value holds a control character.
    """
    return {header: header_value(header, query[param])
            for param, header in RESPONSE_OVERRIDES.items() if param in query}


def quote_etag(etag: str) -> str:
    """An ETag as sent in headers and XML: in double quotes."""
    return f'"{etag}"'


def strip_etag(value: str) -> str:
    """A client's ETag without ``W/`` and quotes."""
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"')


def etag_matches(header: str, etag: str) -> bool:
    """Whether an ``If-Match``-style list (``*`` or comma-separated ETags) names ``etag``."""
    for item in header.split(","):
        item = item.strip()
        if item == "*" or strip_etag(item) == etag:
            return True
    return False


def check_conditions(headers, info: ObjectInfo, *, copy_source: bool = False) -> None:
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
        if not etag_matches(if_match, info.etag):
            raise PreconditionFailed(_FAILED, condition="If-Match")
    else:
        since = parse_http_date(headers.get(p + "If-Unmodified-Since"))
        if since is not None and modified_s > since:
            raise PreconditionFailed(_FAILED, condition="If-Unmodified-Since")
    if if_none_match is not None:
        if etag_matches(if_none_match, info.etag):
            if copy_source:
                raise PreconditionFailed(_FAILED, condition="x-amz-copy-source-If-None-Match")
            raise NotModified("Not Modified", etag=info.etag, last_modified=info.last_modified)
    else:
        since = parse_http_date(headers.get(p + "If-Modified-Since"))
        if since is not None and modified_s <= since:
            if copy_source:
                raise PreconditionFailed(_FAILED, condition="x-amz-copy-source-If-Modified-Since")
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
    req: SuffixByteRequest | OffsetByteRequest | RangeByteRequest
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


def _wire(value: str) -> bytes:
    """The bytes a request header value had on the wire (aiohttp decodes them as
    UTF-8 with ``surrogateescape``)."""
    return value.encode("utf-8", "surrogateescape")


def _is_raw(value: str) -> bool:
    """Whether a request header value's bytes were not UTF-8 (it holds lone surrogates)."""
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _stored_value(value: str) -> str:
    """A request header value as stored: itself when its bytes were UTF-8, else
    the latin-1 decoding of its bytes (see the module docstring)."""
    return _wire(value).decode("latin-1") if _is_raw(value) else value


def _sent_value(value: str, raw: bool) -> str:
    """A stored value as handed to :func:`serialize_head`: the surrogate form of
    its original bytes when ``raw``."""
    if not raw:
        return value
    try:
        return value.encode("latin-1").decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # not stored by this front: sent as the text it is
        return value


def _raw_metadata(headers) -> dict[str, str]:
    """The ``x-amz-meta-*`` headers as ``{name: value}`` in aiohttp's decoding
    (names lower-cased, repeated names joined with commas)."""
    meta: dict[str, str] = {}
    for name, value in headers.items():
        lname = name.lower()
        if lname.startswith("x-amz-meta-"):
            header_value(name, value)
            k = lname[len("x-amz-meta-"):]
            meta[k] = f"{meta[k]},{value}" if k in meta else value
    return meta


def stored_headers(headers) -> dict[str, str]:
    """The standard headers of an upload request that S3 stores with the object.

    Values are kept as sent, byte for byte (``Content-Encoding: deflate, gzip``
    comes back so), except that ``aws-chunked``, the transfer framing of the
    request and not the object's coding, is dropped from ``Content-Encoding``
    (as S3 does). Values (here or in ``x-amz-meta-*``) whose bytes were not
    UTF-8 are listed under :data:`RAW_BYTES_KEY`.

    Raises:
        InvalidArgument: a value holds a control character.
    """
    out: dict[str, str] = {}
    raw: list[str] = []
    for name in _STORED_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        if name == "Content-Encoding":
            codings = value.split(",")
            if any(c.strip().lower() == "aws-chunked" for c in codings):
                value = ",".join(c for c in codings if c.strip().lower() != "aws-chunked").strip()
            if not value:
                continue
        header_value(name, value)
        if _is_raw(value):
            raw.append(name.lower())
        out[name] = _stored_value(value)
    if _is_raw(headers.get("Content-Type", "")):
        raw.append("content-type")
    raw += [f"x-amz-meta-{k}" for k, v in _raw_metadata(headers).items() if _is_raw(v)]
    if raw:
        out[RAW_BYTES_KEY] = ",".join(raw)
    return out


def stored_content_type(headers) -> str | None:
    """The ``Content-Type`` of an upload request as stored (see :func:`stored_headers`), or None.

    Raises:
        InvalidArgument: it holds a control character.
    """
    value = headers.get("Content-Type")
    return None if value is None else _stored_value(header_value("Content-Type", value))


def user_metadata(headers) -> dict[str, str]:
    """The ``x-amz-meta-*`` headers as ``{name: value}`` (names lower-cased,
    repeated names joined with commas). Values are kept as sent: bytes outside
    ASCII come back byte for byte, UTF-8 or not (a value that is not UTF-8 is
    stored as the latin-1 decoding of its bytes and marked by
    :func:`stored_headers`), and RFC 2047 encoded words (``=?UTF-8?B?...?=``)
    are neither decoded nor added.

    Raises:
        MetadataTooLarge: names and values exceed :data:`MAX_USER_METADATA`
            bytes as sent (S3 counts the UTF-8 bytes of each name and value).
        InvalidArgument: a value holds a control character.

    Source: "Working with object metadata" (user-defined metadata), Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingMetadata.html
    """
    meta = _raw_metadata(headers)
    size = sum(len(_wire(k)) + len(_wire(v)) for k, v in meta.items())
    if size > MAX_USER_METADATA:
        raise MetadataTooLarge(
            f"Your metadata headers exceed the maximum allowed metadata size ({size} > "
            f"{MAX_USER_METADATA} bytes)")
    return {k: _stored_value(v) for k, v in meta.items()}


def serialize_head(status_line: str, headers) -> bytes:
    """A response's status line and headers as bytes, each value's lone
    surrogates written as the bytes they stand for (``surrogateescape``).

    Raises:
        ValueError: a name or value holds CR or LF.
    """
    lines = [status_line]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} holds CR or LF")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def content_md5(headers) -> str | None:
    """The ``Content-MD5`` header (base64 of 16 bytes), stripped, or None.

    Raises:
        InvalidDigest: not base64 of 16 bytes.
    """
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


def has_integrity_header(headers: Mapping[str, str]) -> bool:
    """Whether the request carries ``Content-MD5`` or a checksum of its body
    (``x-amz-checksum-*``, ``x-amz-sdk-checksum-algorithm``, or a trailer)."""
    if "Content-MD5" in headers or "x-amz-trailer" in headers or "x-amz-sdk-checksum-algorithm" in headers:
        return True
    return any(f"x-amz-checksum-{alg}" in headers for alg in CHECKSUM_ALGORITHMS)


def require_integrity_header(headers: Mapping[str, str]) -> None:
    """Refuse a request without ``Content-MD5`` or a checksum of its body (see
    :func:`has_integrity_header`), as S3 does for the calls whose API page
    requires one (PutBucketCors, PutBucketTagging, PutObjectTagging, the object
    lock Puts). The values themselves are checked as the body is read.

    Raises:
        InvalidRequestError: neither is present (S3's ``InvalidRequest``).
    """
    if not has_integrity_header(headers):
        raise InvalidRequestError("Missing required header for this request: Content-MD5")


def object_headers(info: ObjectInfo, *, checksums: bool) -> CIMultiDict:
    """The GetObject / HeadObject response headers of an object. Stored values
    whose bytes were not UTF-8 come back in the surrogate form
    :func:`serialize_head` sends as those bytes.

    Args:
        info: the object.
        checksums: add its ``x-amz-checksum-*`` headers and checksum type.

    Raises:
        InvalidArgument: a stored header or metadata item cannot be sent as a
            header (stored through another front with a control character).
    """
    h: CIMultiDict = CIMultiDict()
    h["ETag"] = quote_etag(info.etag)
    h["Last-Modified"] = http_date(info.last_modified)
    raw = set(info.headers.get(RAW_BYTES_KEY, "").split(","))
    h["Content-Type"] = header_value("Content-Type", _sent_value(info.content_type or "application/octet-stream",
                                                                 "content-type" in raw))
    h["Accept-Ranges"] = "bytes"
    for k, v in info.headers.items():
        if k != RAW_BYTES_KEY:
            h[k] = header_value(k, _sent_value(v, k.lower() in raw))
    for k, v in info.metadata.items():
        name = f"x-amz-meta-{k}"
        h[name] = header_value(name, _sent_value(v, name in raw))
    if checksums and info.checksums:
        for alg, v in info.checksums.items():
            h[f"x-amz-checksum-{alg}"] = v
        # A multipart object's "<b64>-N" is a checksum of the part checksums.
        composite = any("-" in v for v in info.checksums.values())
        h["x-amz-checksum-type"] = "COMPOSITE" if composite else "FULL_OBJECT"
    return h


def write_conditions(headers) -> dict[str, str]:
    """``If-Match`` / ``If-None-Match`` of a write as engine commit arguments
    (one ETag or ``*`` each, as S3 takes them; quotes removed)."""
    out: dict[str, str] = {}
    for header, arg in (("If-Match", "if_match"), ("If-None-Match", "if_none_match")):
        value = headers.get(header)
        if value is not None:
            out[arg] = "*" if value.strip() == "*" else strip_etag(value)
    return out


def checksum_headers(etag: str, checksums: dict[str, str]) -> dict[str, str]:
    """The response headers of a PutObject / UploadPart: its ETag and the
    ``x-amz-checksum-*`` values verified on the body."""
    headers = {"ETag": quote_etag(etag)}
    for alg, v in checksums.items():
        headers[f"x-amz-checksum-{alg}"] = v
    return headers
