"""S3 bucket lifecycle: Put/Get/DeleteBucketLifecycleConfiguration.

The XML document becomes a list of :class:`~gpufeed.engine.LifecycleRule`
here; the engine checks the values (days, dates, IDs) and applies the rules.
Supported: ``Expiration`` with ``Days`` or ``Date`` (current objects; a
delete marker in a versioned bucket) or with ``ExpiredObjectDeleteMarker``,
``NoncurrentVersionExpiration`` with ``NoncurrentDays`` and
``NewerNoncurrentVersions``, ``AbortIncompleteMultipartUpload`` with
``DaysAfterInitiation``, a ``Filter`` with a ``Prefix`` or empty, the
deprecated rule-level ``Prefix``, ``Status`` and ``ID``. Rule parts gpufeed
does not build (transitions between storage classes, filters on tags or
object size) are refused with 501 ``NotImplemented`` naming the element, so
no rule is ever stored and then silently not applied. Anything that does not
follow the schema is ``MalformedXML``, and so is ``ExpiredObjectDeleteMarker``
beside ``Days`` or ``Date`` (what S3 answers).

Source: "PutBucketLifecycleConfiguration", "GetBucketLifecycleConfiguration",
"DeleteBucketLifecycle", "LifecycleRule", "LifecycleExpiration" and
"NoncurrentVersionExpiration", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketLifecycleConfiguration.html
"""

from __future__ import annotations

import datetime as dt
import uuid
import xml.etree.ElementTree as ET

from aiohttp import web

from ..engine import LifecycleRule
from ..errors import InvalidArgument, MalformedXML, NotImplementedByGpufeed
from ._context import HandlerTable, S3Request, Services
from ._router import DeleteBucketLifecycle, GetBucketLifecycleConfiguration, PutBucketLifecycleConfiguration
from ._xml import element, iso8601, local, parse_xml, sub

__all__ = ["HANDLERS", "parse_lifecycle", "render_lifecycle"]

_MALFORMED = "The XML you provided was not well-formed or did not validate against our published schema"
_RULE_PARTS = frozenset({"ID", "Filter", "Prefix", "Status", "Expiration", "NoncurrentVersionExpiration",
                         "AbortIncompleteMultipartUpload"})
#: Rule elements S3 has and gpufeed does not build, with what is not built.
_NOT_BUILT = {
    "Transition": "storage classes",
    "Transitions": "storage classes",
    "NoncurrentVersionTransition": "storage classes",
    "NoncurrentVersionTransitions": "storage classes",
    "Tag": "rule filters on object tags",
    "And": "rule filters combining tags and sizes",
    "ObjectSizeGreaterThan": "rule filters on object size",
    "ObjectSizeLessThan": "rule filters on object size",
}


def _malformed(detail: str = "") -> MalformedXML:
    return MalformedXML(f"{_MALFORMED}{': ' + detail if detail else ''}")


def _children(el: ET.Element, allowed: frozenset[str], where: str) -> dict[str, ET.Element]:
    """``name -> child``; a repeated or unknown child is MalformedXML, one gpufeed
    does not build is NotImplemented."""
    out: dict[str, ET.Element] = {}
    for c in el:
        name = local(c.tag)
        if name in _NOT_BUILT and name not in allowed:
            raise NotImplementedByGpufeed(
                f"lifecycle {name} is not implemented ({_NOT_BUILT[name]} are not built); remove it from the rule")
        if name not in allowed or name in out:
            raise _malformed(f"unexpected <{name}> in <{where}>")
        out[name] = c
    return out


def _int(el: ET.Element) -> int:
    try:
        return int((el.text or "").strip())
    except ValueError as exc:
        raise _malformed(f"<{local(el.tag)}> must be an integer") from exc


def _bool(el: ET.Element) -> bool:
    """An ``xsd:boolean``: ``true``, ``false``, ``1`` or ``0``."""
    text = (el.text or "").strip()
    if text not in ("true", "false", "1", "0"):
        raise _malformed(f"<{local(el.tag)}> must be true or false")
    return text in ("true", "1")


def _date(el: ET.Element) -> float:
    text = (el.text or "").strip()
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise _malformed("<Date> must be an ISO 8601 date") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _prefix(parts: dict[str, ET.Element]) -> tuple[str, bool]:
    """The rule's ``(prefix, legacy_prefix)`` from its ``Filter`` or rule-level ``Prefix``."""
    if ("Filter" in parts) == ("Prefix" in parts):
        raise _malformed("a rule has either a <Filter> or a <Prefix>")
    if "Prefix" in parts:
        return parts["Prefix"].text or "", True
    filt = _children(parts["Filter"], frozenset({"Prefix"}), "Filter")
    return (filt["Prefix"].text or "") if "Prefix" in filt else "", False


def _expiration(el: ET.Element) -> tuple[int | None, float | None, bool | None]:
    """``<Expiration>`` -> ``(days, date, expired_object_delete_marker)``; the
    engine refuses ``ExpiredObjectDeleteMarker`` beside ``Days`` or ``Date``."""
    exp = _children(el, frozenset({"Days", "Date", "ExpiredObjectDeleteMarker"}), "Expiration")
    if not exp or ("Days" in exp and "Date" in exp):
        raise _malformed("<Expiration> has one of <Days>, <Date> or <ExpiredObjectDeleteMarker>")
    return (_int(exp["Days"]) if "Days" in exp else None,
            _date(exp["Date"]) if "Date" in exp else None,
            _bool(exp["ExpiredObjectDeleteMarker"]) if "ExpiredObjectDeleteMarker" in exp else None)


def _noncurrent(el: ET.Element) -> tuple[int, int | None]:
    """``<NoncurrentVersionExpiration>`` -> ``(noncurrent_days, newer_noncurrent)``.

    Raises:
        InvalidArgument: no ``NoncurrentDays`` (S3 requires it, whatever its schema says).
    """
    nc = _children(el, frozenset({"NoncurrentDays", "NewerNoncurrentVersions"}), "NoncurrentVersionExpiration")
    if "NoncurrentDays" not in nc:
        raise InvalidArgument("'NoncurrentDays' for NoncurrentVersionExpiration action must be a positive integer")
    newer = nc.get("NewerNoncurrentVersions")
    return _int(nc["NoncurrentDays"]), (_int(newer) if newer is not None else None)


def _rule(el: ET.Element) -> LifecycleRule:
    parts = _children(el, _RULE_PARTS, "Rule")
    prefix, legacy = _prefix(parts)
    status = (parts["Status"].text or "").strip() if "Status" in parts else None
    if status not in ("Enabled", "Disabled"):
        raise _malformed("<Status> must be Enabled or Disabled")
    rule_id = (parts["ID"].text or "") if "ID" in parts else uuid.uuid4().hex
    days = date = abort = marker = noncurrent = newer = None
    if "Expiration" in parts:
        days, date, marker = _expiration(parts["Expiration"])
    if "NoncurrentVersionExpiration" in parts:
        noncurrent, newer = _noncurrent(parts["NoncurrentVersionExpiration"])
    if "AbortIncompleteMultipartUpload" in parts:
        a = _children(parts["AbortIncompleteMultipartUpload"], frozenset({"DaysAfterInitiation"}),
                      "AbortIncompleteMultipartUpload")
        if "DaysAfterInitiation" not in a:
            raise _malformed("<AbortIncompleteMultipartUpload> needs <DaysAfterInitiation>")
        abort = _int(a["DaysAfterInitiation"])
    return LifecycleRule(rule_id, status == "Enabled", prefix, days, date, abort, legacy,
                         noncurrent_days=noncurrent, newer_noncurrent=newer,
                         expired_object_delete_marker=marker)


def parse_lifecycle(body: bytes) -> list[LifecycleRule]:
    """A ``LifecycleConfiguration`` document -> rules, in document order.

    An omitted ``ID`` gets a random one, as S3 does.

    Raises:
        MalformedXML: not well-formed, not a LifecycleConfiguration, no rules,
            an unknown or repeated element, a missing Status or Filter, a
            number, date or boolean that does not parse.
        InvalidArgument: a ``NoncurrentVersionExpiration`` without ``NoncurrentDays``.
        NotImplementedByGpufeed: an element of a feature gpufeed does not build.
    """
    root = parse_xml(body)
    if local(root.tag) != "LifecycleConfiguration":
        raise _malformed("expected <LifecycleConfiguration>")
    rules = []
    for el in root:
        if local(el.tag) != "Rule":
            raise _malformed(f"unexpected <{local(el.tag)}> in <LifecycleConfiguration>")
        rules.append(_rule(el))
    if not rules:
        raise _malformed("a lifecycle configuration needs at least one <Rule>")
    return rules


def render_lifecycle(rules: list[LifecycleRule]) -> ET.Element:
    """Rules -> the ``LifecycleConfiguration`` document GetBucketLifecycleConfiguration answers."""
    root = element("LifecycleConfiguration")
    for r in rules:
        el = sub(root, "Rule")
        sub(el, "ID", r.id)
        if r.legacy_prefix:
            sub(el, "Prefix", r.prefix)
        else:
            filt = sub(el, "Filter")
            if r.prefix:
                sub(filt, "Prefix", r.prefix)
        sub(el, "Status", "Enabled" if r.enabled else "Disabled")
        if r.expiration_days is not None or r.expiration_date is not None or \
                r.expired_object_delete_marker is not None:
            exp = sub(el, "Expiration")
            if r.expiration_days is not None:
                sub(exp, "Days", r.expiration_days)
            elif r.expiration_date is not None:
                sub(exp, "Date", iso8601(r.expiration_date))
            if r.expired_object_delete_marker is not None:
                sub(exp, "ExpiredObjectDeleteMarker", r.expired_object_delete_marker)
        if r.noncurrent_days is not None:
            nc = sub(el, "NoncurrentVersionExpiration")
            sub(nc, "NoncurrentDays", r.noncurrent_days)
            if r.newer_noncurrent is not None:
                sub(nc, "NewerNoncurrentVersions", r.newer_noncurrent)
        if r.abort_days is not None:
            sub(sub(el, "AbortIncompleteMultipartUpload"), "DaysAfterInitiation", r.abort_days)
    return root


async def put_lifecycle(s: Services, req: S3Request, ep: PutBucketLifecycleConfiguration) -> web.Response:
    """PutBucketLifecycleConfiguration: replace the bucket's rules (200, no body).

    Raises:
        MalformedXML, NotImplementedByGpufeed: see :func:`parse_lifecycle`;
            MalformedXML also for ``ExpiredObjectDeleteMarker`` beside ``Days``
            or ``Date``.
        InvalidArgument, InvalidRequestError: values S3 refuses (days not
            positive, a date not at midnight UTC, repeated or long IDs,
            ``NoncurrentVersionExpiration`` without ``NoncurrentDays``,
            ``NewerNoncurrentVersions`` over 100).
        NoSuchBucket: no such bucket.
    """
    rules = parse_lifecycle(await s.read_xml(req))
    await s.call(s.engine.put_bucket_lifecycle, ep.bucket, rules)
    return web.Response(status=200)


async def get_lifecycle(s: Services, req: S3Request, ep: GetBucketLifecycleConfiguration) -> web.Response:
    """GetBucketLifecycleConfiguration: the rules, or 404 NoSuchLifecycleConfiguration."""
    rules = await s.call(s.engine.get_bucket_lifecycle, ep.bucket)
    return s.xml(render_lifecycle(rules))


async def delete_lifecycle(s: Services, req: S3Request, ep: DeleteBucketLifecycle) -> web.Response:
    """DeleteBucketLifecycle: 204, also when the bucket had no rules."""
    await s.call(s.engine.delete_bucket_lifecycle, ep.bucket)
    return web.Response(status=204)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    PutBucketLifecycleConfiguration: put_lifecycle,
    GetBucketLifecycleConfiguration: get_lifecycle,
    DeleteBucketLifecycle: delete_lifecycle,
}
