"""S3 object lock (WORM): the bucket's object lock configuration, the
retention and legal hold of each version, the lock headers of writes and
reads, and ``x-amz-bypass-governance-retention``.

The engine enforces the lock (a version under retention or legal hold cannot
be removed or replaced by any front; COMPLIANCE retention can only be
extended); this module turns S3's documents and headers into engine calls and
back, and answers malformed input as S3 does:

- documents that do not follow the schema (an unknown element, a mode other
  than ``GOVERNANCE``/``COMPLIANCE``, a legal hold other than ``ON``/``OFF``,
  ``Days`` and ``Years`` together): ``MalformedXML``;
- a default retention period that is not a positive integer, a retain-until
  date that is not in the future or not ISO 8601: ``InvalidArgument``;
- a write's ``x-amz-object-lock-mode`` without ``x-amz-object-lock-retain-until-date``
  (or the other way round), an unknown mode or legal hold: ``InvalidArgument``,
  checked in S3's order (the date's format, the date, both given, the mode,
  the legal hold);
- lock settings for a bucket without object lock: ``InvalidRequest`` "Bucket
  is missing Object Lock Configuration";
- a Put of a lock document without ``Content-MD5`` or a checksum header, and an
  upload body with lock settings (its own or the bucket's default retention)
  without one: ``InvalidRequest``.

Sources: "PutObjectLockConfiguration", "GetObjectLockConfiguration",
"PutObjectRetention", "GetObjectRetention", "PutObjectLegalHold",
"GetObjectLegalHold", "PutObject" (``x-amz-object-lock-*``), "DeleteObject"
(``x-amz-bypass-governance-retention``), Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectLockConfiguration.html;
"Locking objects with Object Lock", Amazon S3 User Guide.
"""

from __future__ import annotations

import datetime as dt
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from aiohttp import web

from ..engine import ObjectInfo
from ..engine.types import LOCK_MODES, Retention
from ..errors import InvalidArgument, InvalidRequestError, MalformedXML
from ._context import HandlerTable, S3Request, Services
from ._headers import has_integrity_header, require_integrity_header
from ._router import (
    GetObjectLegalHold,
    GetObjectLockConfiguration,
    GetObjectRetention,
    PutObjectLegalHold,
    PutObjectLockConfiguration,
    PutObjectRetention,
)
from ._xml import element, iso8601, local, parse_xml, sub

__all__ = [
    "HANDLERS",
    "bypass_governance",
    "write_retention",
    "check_lock_write",
    "lock_headers",
    "parse_lock_configuration",
    "parse_retention",
    "parse_legal_hold",
]

_MODE = "x-amz-object-lock-mode"
_UNTIL = "x-amz-object-lock-retain-until-date"
_HOLD = "x-amz-object-lock-legal-hold"
#: Longest default retention S3 accepts, per unit.
_MAX_PERIOD = {"Days": 36500, "Years": 100}
_MALFORMED = "The XML you provided was not well-formed or did not validate against our published schema"
_NOT_LOCKED = "Bucket is missing Object Lock Configuration"


def _malformed(detail: str) -> MalformedXML:
    return MalformedXML(f"{_MALFORMED}: {detail}")


def parse_date(text: str) -> float | None:
    """An ISO 8601 date and time (``2030-01-01T00:00:00Z``, UTC when no offset) -> Unix s, or None."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


# -- headers -----------------------------------------------------------------------

def bypass_governance(headers: Mapping[str, str]) -> bool:
    """Whether ``x-amz-bypass-governance-retention: true`` asks to bypass GOVERNANCE retention."""
    return headers.get("x-amz-bypass-governance-retention", "").strip().lower() == "true"


def write_retention(headers: Mapping[str, str]) -> Retention | None:
    """The ``x-amz-object-lock-*`` headers of PutObject, CopyObject,
    CreateMultipartUpload (and POST Object fields) as the new version's lock.

    Returns:
        The :class:`~gpufeed.engine.types.Retention` asked for, or None when no
        lock header is given (the bucket's default retention applies).

    Raises:
        InvalidArgument: a retain-until date not ISO 8601 or not in the future,
            a mode without a date or a date without a mode, a mode other than
            GOVERNANCE/COMPLIANCE, a legal hold other than ON/OFF (in that order).
    """
    mode, until_text, hold = headers.get(_MODE), headers.get(_UNTIL), headers.get(_HOLD)
    if mode is None and until_text is None and hold is None:
        return None
    until = 0.0
    if until_text is not None:
        parsed = parse_date(until_text)
        if parsed is None:
            raise InvalidArgument("The retain until date must be provided in ISO 8601 format")
        if parsed <= time.time():
            raise InvalidArgument("The retain until date must be in the future!")
        until = parsed
    if (mode is None) != (until_text is None):
        raise InvalidArgument(f"{_UNTIL} and {_MODE} must both be supplied")
    if mode is not None and mode.strip() not in LOCK_MODES:
        raise InvalidArgument("Unknown wormMode directive.")
    if hold is not None and hold.strip() not in ("ON", "OFF"):
        raise InvalidArgument("Legal Hold must be either of 'ON' or 'OFF'")
    return Retention((mode or "").strip(), until, (hold or "").strip() == "ON")


async def check_lock_write(s: Services, bucket: str, headers: Mapping[str, str], retention: Retention | None,
                           *, body: bool) -> None:
    """Refuse a write's lock settings before its body is read (one catalog
    read on the pool, skipped when there is nothing to check).

    Args:
        s: the front's services.
        bucket: the bucket written to.
        headers: the request headers.
        retention: the write's lock headers (:func:`write_retention`).
        body: the request uploads a body (PutObject, UploadPart): S3 wants
            ``Content-MD5`` or a checksum with lock settings, the write's own
            or the bucket's default retention.

    Raises:
        NoSuchBucket: the bucket does not exist.
        InvalidRequestError: lock headers for a bucket without object lock; a
            body with lock settings and no integrity header.
    """
    integrity = not body or has_integrity_header(headers)
    if retention is None and integrity:
        return
    b = await s.call(s.engine.head_bucket, bucket)
    if retention is not None and not b.object_lock:
        raise InvalidRequestError(_NOT_LOCKED, bucket=bucket)
    if not integrity and (retention is not None or (b.object_lock and b.lock_mode)):
        raise InvalidRequestError("Content-MD5 OR x-amz-checksum- HTTP header is required for Put Object "
                                  "requests with Object Lock parameters", bucket=bucket)


def lock_headers(info: ObjectInfo) -> dict[str, str]:
    """The ``x-amz-object-lock-*`` headers of a GetObject / HeadObject answer
    (mode and retain-until date when the version has a retention; legal hold when on)."""
    out: dict[str, str] = {}
    if info.lock_mode:
        out[_MODE] = info.lock_mode
        out[_UNTIL] = iso8601(info.lock_until)
    if info.legal_hold:
        out[_HOLD] = "ON"
    return out


# -- documents ---------------------------------------------------------------------

def _children(el: ET.Element, allowed: frozenset[str]) -> dict[str, str | ET.Element]:
    """``name -> child`` (stripped text for leaves); an unknown or repeated child is MalformedXML."""
    out: dict[str, str | ET.Element] = {}
    for c in el:
        name = local(c.tag)
        if name not in allowed or name in out:
            raise _malformed(f"unexpected <{name}> in <{local(el.tag)}>")
        out[name] = c if len(c) else (c.text or "").strip()
    return out


def _root(body: bytes, tag: str) -> ET.Element:
    doc = parse_xml(body)
    if local(doc.tag) != tag:
        raise _malformed(f"expected <{tag}>")
    return doc


def _text(parts: dict[str, str | ET.Element], name: str) -> str | None:
    value = parts.get(name)
    if isinstance(value, ET.Element):
        raise _malformed(f"<{name}> holds text only")
    return value


def _mode(parts: dict[str, str | ET.Element]) -> str | None:
    mode = _text(parts, "Mode")
    if mode is not None and mode not in LOCK_MODES:
        raise _malformed("<Mode> is GOVERNANCE or COMPLIANCE")
    return mode


def parse_lock_configuration(body: bytes) -> tuple[str, int, int]:
    """An ``ObjectLockConfiguration`` document -> ``(mode, days, years)`` of its
    default retention (``("", 0, 0)`` without a ``Rule``).

    Raises:
        MalformedXML: not the schema: ``ObjectLockEnabled`` other than
            ``Enabled``, a ``Rule`` without ``DefaultRetention``, a mode other
            than GOVERNANCE/COMPLIANCE, not exactly one of ``Days`` and ``Years``,
            a period that is not an integer.
        InvalidArgument: a period that is not positive, or over 36500 days / 100 years.
    """
    parts = _children(_root(body, "ObjectLockConfiguration"), frozenset({"ObjectLockEnabled", "Rule"}))
    if _text(parts, "ObjectLockEnabled") != "Enabled":
        raise _malformed("<ObjectLockEnabled> must be Enabled")
    rule = parts.get("Rule")
    if rule is None:
        return "", 0, 0
    if not isinstance(rule, ET.Element):
        raise _malformed("<Rule> needs a <DefaultRetention>")
    default = _children(rule, frozenset({"DefaultRetention"})).get("DefaultRetention")
    if not isinstance(default, ET.Element):
        raise _malformed("<Rule> needs a <DefaultRetention>")
    d = _children(default, frozenset({"Mode", "Days", "Years"}))
    mode = _mode(d)
    if mode is None or ("Days" in d) == ("Years" in d):
        raise _malformed("<DefaultRetention> has a <Mode> and one of <Days> or <Years>")
    unit = "Days" if "Days" in d else "Years"
    try:
        n = int(_text(d, unit) or "")
    except ValueError as exc:
        raise _malformed(f"<{unit}> must be an integer") from exc
    if n <= 0:
        raise InvalidArgument("Default retention period must be a positive integer value")
    if n > _MAX_PERIOD[unit]:
        raise InvalidArgument("Default retention period is too large.")
    return mode, n if unit == "Days" else 0, n if unit == "Years" else 0


def parse_retention(body: bytes) -> tuple[str, float]:
    """A ``Retention`` document -> ``(mode, until_s)``; ``("", 0.0)`` for an
    empty one (which removes a retention, where that is allowed).

    Raises:
        MalformedXML: not the schema, a mode other than GOVERNANCE/COMPLIANCE,
            a date that is not ISO 8601, or a mode without a date (or the
            other way round).
    """
    parts = _children(_root(body, "Retention"), frozenset({"Mode", "RetainUntilDate"}))
    mode = _mode(parts)
    text = _text(parts, "RetainUntilDate")
    if (mode is None) != (text is None):
        raise _malformed("<Retention> has both <Mode> and <RetainUntilDate>, or neither")
    if text is None or mode is None:
        return "", 0.0
    until = parse_date(text)
    if until is None:
        raise _malformed("<RetainUntilDate> must be an ISO 8601 date")
    return mode, until


def parse_legal_hold(body: bytes) -> bool:
    """A ``LegalHold`` document -> whether its ``Status`` is ``ON``.

    Raises:
        MalformedXML: not the schema, or a status other than ON/OFF.
    """
    status = _text(_children(_root(body, "LegalHold"), frozenset({"Status"})), "Status")
    if status not in ("ON", "OFF"):
        raise _malformed("<Status> is ON or OFF")
    return status == "ON"


# -- handlers ----------------------------------------------------------------------

async def put_object_lock_configuration(s: Services, req: S3Request, ep: PutObjectLockConfiguration) -> web.Response:
    """PutObjectLockConfiguration: turn object lock on for a versioned bucket
    and set (or, without a ``Rule``, remove) its default retention.

    Raises:
        InvalidRequestError: neither ``Content-MD5`` nor a checksum header.
        MalformedXML, InvalidArgument: see :func:`parse_lock_configuration`.
        NoSuchBucket: no such bucket.
        InvalidBucketState: the bucket's versioning is not Enabled.
    """
    require_integrity_header(req.headers)
    mode, days, years = parse_lock_configuration(await s.read_xml(req))
    await s.call(s.engine.put_object_lock_configuration, ep.bucket, mode, days, years)
    return web.Response(status=200)


async def get_object_lock_configuration(s: Services, req: S3Request, ep: GetObjectLockConfiguration) -> web.Response:
    """GetObjectLockConfiguration: ``ObjectLockEnabled`` and the default retention.

    Raises:
        NoSuchBucket: no such bucket.
        ObjectLockConfigurationNotFoundError: the bucket has no object lock.
    """
    b = await s.call(s.engine.get_object_lock_configuration, ep.bucket)
    root = element("ObjectLockConfiguration")
    sub(root, "ObjectLockEnabled", "Enabled")
    if b.lock_mode:
        default = sub(sub(root, "Rule"), "DefaultRetention")
        sub(default, "Mode", b.lock_mode)
        if b.lock_days:
            sub(default, "Days", b.lock_days)
        else:
            sub(default, "Years", b.lock_years)
    return s.xml(root)


async def put_object_retention(s: Services, req: S3Request, ep: PutObjectRetention) -> web.Response:
    """PutObjectRetention: set a version's retention (``versionId``; the
    current version without), bypassing GOVERNANCE retention with
    ``x-amz-bypass-governance-retention: true``.

    Raises:
        InvalidRequestError: no integrity header; the bucket has no object lock.
        MalformedXML: see :func:`parse_retention`.
        InvalidArgument: a date not in the future, a malformed version id.
        AccessDenied: the change would weaken a retention it may not.
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for HeadObject.
    """
    require_integrity_header(req.headers)
    mode, until = parse_retention(await s.read_xml(req))
    await s.call(s.engine.put_object_retention, ep.bucket, ep.key, mode, until,
                 version_id=req.query.get("versionId"), bypass_governance=bypass_governance(req.headers))
    return web.Response(status=200)


async def get_object_retention(s: Services, req: S3Request, ep: GetObjectRetention) -> web.Response:
    """GetObjectRetention: the version's mode and retain-until date.

    Raises:
        InvalidRequestError: the bucket has no object lock.
        NoSuchObjectLockConfiguration: the version has no retention.
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for HeadObject.
    """
    info = await s.call(s.engine.get_object_retention, ep.bucket, ep.key, version_id=req.query.get("versionId"))
    root = element("Retention")
    sub(root, "Mode", info.lock_mode)
    sub(root, "RetainUntilDate", iso8601(info.lock_until))
    return s.xml(root)


async def put_object_legal_hold(s: Services, req: S3Request, ep: PutObjectLegalHold) -> web.Response:
    """PutObjectLegalHold: put a legal hold on a version (``ON``) or take it off (``OFF``).

    Raises:
        InvalidRequestError: no integrity header; the bucket has no object lock.
        MalformedXML: see :func:`parse_legal_hold`.
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for HeadObject.
    """
    require_integrity_header(req.headers)
    on = parse_legal_hold(await s.read_xml(req))
    await s.call(s.engine.put_object_legal_hold, ep.bucket, ep.key, on, version_id=req.query.get("versionId"))
    return web.Response(status=200)


async def get_object_legal_hold(s: Services, req: S3Request, ep: GetObjectLegalHold) -> web.Response:
    """GetObjectLegalHold: the version's legal hold status, ``ON`` or ``OFF``.

    Raises:
        InvalidRequestError: the bucket has no object lock.
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed: as for HeadObject.
    """
    on = await s.call(s.engine.get_object_legal_hold, ep.bucket, ep.key, version_id=req.query.get("versionId"))
    root = element("LegalHold")
    sub(root, "Status", "ON" if on else "OFF")
    return s.xml(root)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    PutObjectLockConfiguration: put_object_lock_configuration,
    GetObjectLockConfiguration: get_object_lock_configuration,
    PutObjectRetention: put_object_retention,
    GetObjectRetention: get_object_retention,
    PutObjectLegalHold: put_object_legal_hold,
    GetObjectLegalHold: get_object_legal_hold,
}
