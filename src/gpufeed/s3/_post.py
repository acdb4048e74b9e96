"""S3 POST Object: browser form uploads authorised by a signed policy document.

A ``multipart/form-data`` POST to a bucket carries form fields (``key``,
``policy``, ``x-amz-algorithm``, ``x-amz-credential``, ``x-amz-date``,
``x-amz-signature``, ``Content-Type``, ``x-amz-meta-*``, ...) followed by the
``file`` field. The policy is base64 of a JSON document with an
``expiration`` and a list of ``conditions``; the signature is the SigV4
HMAC of the base64 policy under the credential's signing key. The upload is
accepted only if the signature holds, the policy has not expired, and every
field (except ``x-amz-signature``, ``policy``, ``file`` and ``x-ignore-*``)
is allowed by a condition, each condition holds, and the file's size is in
``content-length-range``. ``${filename}`` in the key is the file's name.

The front's authentication lets such a request through unsigned
(:func:`gpufeed.s3._auth.verify_request` marks it ``deferred``); this module
is where it is authenticated.

Sources: "Authenticating Requests in Browser-Based Uploads Using POST (AWS
Signature Version 4)", "Creating a POST Policy" and "POST Object", Amazon S3
API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-HTTPPOSTConstructPolicy.html
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hashlib
import hmac
import json
import time
from urllib.parse import quote, urlencode

from aiohttp import BodyPartReader, MultipartReader, web
from multidict import CIMultiDict

from ..engine.types import Retention
from ..errors import (
    AccessDenied,
    EntityTooLarge,
    EntityTooSmall,
    InvalidAccessKeyId,
    InvalidPolicyDocument,
    MalformedPOSTRequest,
    NotImplementedByGpufeed,
    SignatureDoesNotMatch,
)
from ._context import HandlerTable, S3Request, Services
from ._features import check_write_headers
from ._headers import quote_etag, stored_content_type, stored_headers, user_metadata
from ._lock import write_retention
from ._policy import may_reach
from ._router import PostObject
from ._tagging import parse_tag_set
from ._tenancy import CURRENT_TENANT
from ._versions import write_headers
from ._xml import element, sub

__all__ = ["HANDLERS", "check_policy", "post_object"]

#: Most bytes of form fields before the file.
_MAX_FIELDS = 64 << 10  # 64 KiB
#: Bytes of the file read per chunk.
_CHUNK = 1 << 20  # 1 MiB
#: Fields no condition needs to name.
_UNCHECKED = frozenset({"x-amz-signature", "policy", "file"})
_FAILED = "Invalid according to Policy: Policy Condition failed: "


def _decode_policy(policy_b64: str) -> dict:
    """The policy document of the form.

    Raises:
        InvalidPolicyDocument: not base64 of a JSON object with ``expiration`` and ``conditions``.
    """
    try:
        doc = json.loads(base64.b64decode(policy_b64, validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise InvalidPolicyDocument("Invalid Policy: Invalid JSON.") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("conditions"), list) \
            or not isinstance(doc.get("expiration"), str):
        raise InvalidPolicyDocument("Invalid Policy: the policy needs an expiration and a list of conditions.")
    return doc


def _expiration_s(value: str) -> float:
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return float(calendar.timegm(time.strptime(value, fmt)))
        except ValueError:
            continue
    raise InvalidPolicyDocument(f"Invalid Policy: Invalid 'expiration' value: {value!r}")


def check_policy(doc: dict, fields: dict[str, str], size: int | None, now_s: float) -> tuple[int, int] | None:
    """Check the form ``fields`` (lower-case names) against a policy document.

    Args:
        doc: the decoded policy.
        fields: every form field except ``file``; ``bucket`` is the request's bucket.
        size: the file's size in bytes, or None to skip ``content-length-range``.
        now_s: the current Unix time, seconds.

    Returns:
        The ``content-length-range`` ``(min, max)`` in bytes, or None.

    Raises:
        AccessDenied: expired, a condition fails, or a field no condition names.
        InvalidPolicyDocument: a condition that is not one of S3's forms.
        EntityTooSmall, EntityTooLarge: ``size`` outside ``content-length-range``.
    """
    if _expiration_s(doc["expiration"]) < now_s:
        raise AccessDenied("Invalid according to Policy: Policy expired.")
    covered: set[str] = set()
    length_range = None
    for cond in doc["conditions"]:
        if isinstance(cond, dict) and len(cond) == 1:
            [(name, value)] = cond.items()
            cond = ["eq", f"${name}", value]
        if not isinstance(cond, list) or len(cond) != 3:
            raise InvalidPolicyDocument(f"Invalid Policy: Invalid Condition: {cond!r}")
        op, name, value = cond
        if isinstance(op, str) and op.lower() == "content-length-range":
            if not (isinstance(name, int) and isinstance(value, int) and 0 <= name <= value):
                raise InvalidPolicyDocument(f"Invalid Policy: Invalid content-length-range: {cond!r}")
            length_range = (name, value)
            continue
        if not (isinstance(op, str) and isinstance(name, str) and name.startswith("$")
                and isinstance(value, str) and op.lower() in ("eq", "starts-with")):
            raise InvalidPolicyDocument(f"Invalid Policy: Invalid Condition: {cond!r}")
        field = name[1:].lower()
        covered.add(field)
        got = fields.get(field, "")
        ok = got == value if op.lower() == "eq" else got.startswith(value)
        if not ok:
            raise AccessDenied(_FAILED + json.dumps(cond))
    for field in fields:
        if field not in covered and field not in _UNCHECKED and not field.startswith("x-ignore-") \
                and field != "bucket":
            raise AccessDenied(f"Invalid according to Policy: Extra input fields: {field}")
    if size is not None and length_range is not None:
        if size < length_range[0]:
            raise EntityTooSmall("Your proposed upload is smaller than the minimum allowed size")
        if size > length_range[1]:
            raise EntityTooLarge("Your proposed upload exceeds the maximum allowed size")
    return length_range


def _check_signature(s: Services, fields: dict[str, str]) -> None:
    """The SigV4 signature of the policy.

    Raises:
        InvalidPolicyDocument, AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch.
        NotImplementedByGpufeed: signature version 2 forms.
    """
    if "awsaccesskeyid" in fields or "signature" in fields:
        raise NotImplementedByGpufeed("POST uploads signed with signature version 2 are not implemented")
    if fields.get("x-amz-algorithm") != "AWS4-HMAC-SHA256":
        raise AccessDenied("POST requires x-amz-algorithm AWS4-HMAC-SHA256")
    for name in ("policy", "x-amz-credential", "x-amz-date", "x-amz-signature"):
        if not fields.get(name):
            raise AccessDenied(f"Bucket POST must contain a field named '{name}'")
    parts = fields["x-amz-credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise AccessDenied(f"Error parsing the X-Amz-Credential parameter: {fields['x-amz-credential']!r}")
    access_key, date, region, service, _ = parts
    secret = s.credentials.get(access_key)
    if secret is None:
        raise InvalidAccessKeyId("The AWS Access Key Id you provided does not exist in our records.")
    CURRENT_TENANT.set(s.credentials.tenant_of(access_key))

    def h(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    key = h(h(h(h(f"AWS4{secret}".encode(), date), region), service), "aws4_request")
    expected = hmac.new(key, fields["policy"].encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, fields["x-amz-signature"].strip().lower()):
        raise SignatureDoesNotMatch("The request signature we calculated does not match the signature "
                                    "you provided. Check your key and signing method.")


async def _read_fields(reader: MultipartReader) -> tuple[dict[str, str], BodyPartReader]:
    """The form fields (lower-case names, first value wins) up to the ``file`` part.

    Raises:
        MalformedPOSTRequest: no file field, or fields over 64 KiB.
    """
    fields: dict[str, str] = {}
    total = 0
    while True:
        part = await reader.next()
        if part is None:
            raise MalformedPOSTRequest("The body of your POST request is not well-formed "
                                       "multipart/form-data (no file field).")
        if not isinstance(part, BodyPartReader) or not part.name:
            raise MalformedPOSTRequest("The body of your POST request is not well-formed multipart/form-data.")
        name = part.name.lower()
        if name == "file":
            return fields, part
        data = await part.read(decode=False)
        total += len(name) + len(data)
        if total > _MAX_FIELDS:
            raise MalformedPOSTRequest("Your POST request fields preceding the upload file were too large.")
        fields.setdefault(name, bytes(data).decode("utf-8", "replace"))


def _as_headers(fields: dict[str, str]) -> CIMultiDict:
    """The form fields a PutObject would have carried as headers."""
    headers: CIMultiDict = CIMultiDict()
    for name, value in fields.items():
        if name == "acl":
            headers["x-amz-acl"] = value
        elif name not in ("key", "tagging", "policy", "success_action_status", "success_action_redirect", "redirect"):
            headers[name] = value
    return headers


async def _store(s: Services, ep: PostObject, key: str, file: BodyPartReader, headers: CIMultiDict,
                 fields: dict[str, str], policy: dict, tags: dict[str, str] | None, retention: Retention | None):
    """Stream the file into a new version of ``key``; commit once the policy holds for its size."""
    pending = await s.call(s.engine.begin_put, ep.bucket, key)
    try:
        size = 0
        while True:
            chunk = await file.read_chunk(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > s.config.max_object_bytes:
                raise EntityTooLarge("Your proposed upload exceeds the maximum allowed size")
            await s.call(pending.write, chunk)
        check_policy(policy, fields, size, time.time())
        return await s.call(lambda: pending.commit(
            content_type=stored_content_type(headers), metadata=user_metadata(headers),
            headers=stored_headers(headers), tags=tags, retention=retention))
    except BaseException:
        pending.abort()
        raise


async def post_object(s: Services, req: S3Request, ep: PostObject) -> web.StreamResponse:
    """POST Object: a browser form upload under a signed policy.

    Raises:
        MalformedPOSTRequest: not multipart/form-data, or no file field.
        InvalidPolicyDocument, AccessDenied, SignatureDoesNotMatch, InvalidAccessKeyId:
            see :func:`check_policy` and the signature check.
        NotImplementedByGpufeed: a field naming a feature not built (SSE-KMS, ...).
        MalformedXML, InvalidTag: a ``tagging`` field that is no ``Tagging`` document, or over the limits.
        InvalidArgument, InvalidRequestError: bad ``x-amz-object-lock-*`` fields, or lock fields for a
            bucket without object lock.
    """
    if not req.http.content_type.startswith("multipart/form-data"):
        raise MalformedPOSTRequest("Bucket POST must be of the enclosure-type multipart/form-data")
    fields, file = await _read_fields(await req.http.multipart())
    _check_signature(s, fields)
    if not may_reach(s.engine, ep.bucket, CURRENT_TENANT.get()):
        raise AccessDenied("Access Denied")
    policy = _decode_policy(fields["policy"])
    if "key" not in fields:
        raise MalformedPOSTRequest("Bucket POST must contain a field named 'key'.")
    fields["bucket"] = ep.bucket
    check_policy(policy, fields, None, time.time())
    headers = _as_headers(fields)
    check_write_headers(headers)
    tags = parse_tag_set(fields["tagging"].encode()) if "tagging" in fields else None
    retention = write_retention(headers)
    key = fields["key"].replace("${filename}", file.filename or "")
    s.engine.authorize(CURRENT_TENANT.get(), "s3:PutObject", ep.bucket, key,
                       access_key=fields["x-amz-credential"].split("/")[0], source_ip=req.http.remote)
    info = await _store(s, ep, key, file, headers, fields, policy, tags, retention)
    etag = quote_etag(info.etag)
    common = {"ETag": etag} | write_headers(info)
    location = f"http://{req.target.host or ''}/{quote(ep.bucket)}/{quote(key)}"
    redirect = fields.get("success_action_redirect") or fields.get("redirect")
    if redirect:
        query = urlencode({"bucket": ep.bucket, "key": key, "etag": etag})
        return web.Response(status=303, headers={"Location": f"{redirect}{'&' if '?' in redirect else '?'}{query}"}
                            | common)
    status = fields.get("success_action_status", "204")
    if status == "201":
        root = element("PostResponse")
        sub(root, "Location", location)
        sub(root, "Bucket", ep.bucket)
        sub(root, "Key", key)
        sub(root, "ETag", etag)
        return s.xml(root, status=201, headers={"Location": location} | common)
    return web.Response(status=200 if status == "200" else 204, headers={"Location": location} | common)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    PostObject: post_object,
}
