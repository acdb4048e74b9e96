"""S3 CORS: PutBucketCors (Get and Delete are in ``_bucketconfig``), preflight
``OPTIONS`` requests and the CORS headers of actual requests.

The ``CORSConfiguration`` document is checked here and kept by the engine as
JSON (:func:`rules_to_json`) under the bucket configuration ``"cors"``;
GetBucketCors renders it back (:func:`render_cors`).

A request is evaluated against the first rule that matches, as S3 does:

* its ``Origin`` matches one ``AllowedOrigin`` (exactly, or around the one
  ``*`` a pattern may hold; ``*`` also matches nothing; case matters);
* its method (``Access-Control-Request-Method`` when sent, which a preflight
  always does) is one of ``AllowedMethod``;
* for a preflight, every name of ``Access-Control-Request-Headers`` matches an
  ``AllowedHeader`` (case does not matter; ``*`` as in origins).

A preflight (:func:`preflight`, never authenticated) that matches is 200 with
the rule's ``Access-Control-*`` headers; otherwise 403 ``AccessForbidden``
(400 ``BadRequest`` without ``Origin``). An actual request with an ``Origin``
that matches gets the same headers (without ``Access-Control-Allow-Headers``)
on whatever it is answered, errors included (:func:`actual_request_headers`);
one that matches no rule is served without them. Browsers enforce the answer;
the node does not refuse an actual request for CORS reasons.

Sources: "PutBucketCors", "GetBucketCors", "DeleteBucketCors", "CORSRule" and
"Appendix: OPTIONS object", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketCors.html;
"Using cross-origin resource sharing (CORS)" and "Troubleshooting CORS",
Amazon S3 User Guide; WHATWG Fetch, "CORS protocol".
"""

from __future__ import annotations

import functools
import json
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass

from aiohttp import web

from ..errors import (
    BadRequest,
    CORSForbidden,
    GpufeedError,
    InvalidArgument,
    InvalidRequestError,
    MalformedXML,
    MaxMessageLengthExceeded,
)
from ._context import HandlerTable, S3Request, Services
from ._headers import require_integrity_header
from ._router import CorsPreflight, PutBucketCors, Target
from ._xml import element, local, parse_xml, sub

__all__ = [
    "HANDLERS",
    "CorsRule",
    "CORS_HEADERS",
    "MAX_RULES",
    "MAX_DOCUMENT",
    "parse_cors",
    "render_cors",
    "rules_to_json",
    "rules_from_json",
    "render_stored",
    "matching_rule",
    "actual_request_headers",
    "preflight",
]

#: The engine's name of the bucket configuration this module keeps.
CONFIG = "cors"
#: Most rules one configuration holds (S3's limit).
MAX_RULES = 100
#: Largest configuration document, bytes (S3's limit).
MAX_DOCUMENT = 64 << 10  # 64 KiB
#: Longest rule ID, characters (S3's limit).
MAX_ID = 255
#: The methods a rule may allow (S3 refuses any other).
METHODS = frozenset({"GET", "PUT", "HEAD", "POST", "DELETE"})
#: The CORS headers to add to an actual request's response (set by the front).
CORS_HEADERS = web.RequestKey("gpufeed_s3_cors_headers", dict)

_VARY = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"
_MALFORMED = "The XML you provided was not well-formed or did not validate against our published schema"
_NOT_ALLOWED = ("CORSResponse: This CORS request is not allowed. This is usually because the evalution of "
                "Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers "
                "are not whitelisted by the resource's CORS spec.")  # sic: S3's own spelling
_LISTS = {"AllowedOrigin": "allowed_origins", "AllowedMethod": "allowed_methods",
          "AllowedHeader": "allowed_headers", "ExposeHeader": "expose_headers"}


@dataclass(frozen=True, slots=True)
class CorsRule:
    """One ``CORSRule``, values as sent.

    Attributes:
        allowed_origins: origin patterns, each with at most one ``*``.
        allowed_methods: some of ``GET``, ``PUT``, ``HEAD``, ``POST``, ``DELETE``.
        allowed_headers: request header name patterns, each with at most one ``*``.
        expose_headers: response header names a browser script may read.
        max_age_s: how long a browser may cache a preflight answer, seconds, or None.
        id: the rule's ``ID``, or None.
    """

    allowed_origins: tuple[str, ...]
    allowed_methods: tuple[str, ...]
    allowed_headers: tuple[str, ...] = ()
    expose_headers: tuple[str, ...] = ()
    max_age_s: int | None = None
    id: str | None = None

    def origin_answer(self, origin: str) -> str | None:
        """``Access-Control-Allow-Origin`` for ``origin``: ``*`` when the pattern
        it matched is ``*``, else the origin itself; None when none matches."""
        for pattern in self.allowed_origins:
            if _glob(pattern, origin):
                return "*" if pattern == "*" else origin
        return None

    def allows_headers(self, names: list[str]) -> bool:
        """Whether every (lower-case) requested header name matches an ``AllowedHeader``."""
        patterns = [p.lower() for p in self.allowed_headers]
        return all(any(_glob(p, name) for p in patterns) for name in names)


def _glob(pattern: str, text: str) -> bool:
    """``pattern`` (at most one ``*``, matching any run, empty included) matches all of ``text``."""
    head, star, tail = pattern.partition("*")
    if not star:
        return pattern == text
    return len(text) >= len(head) + len(tail) and text.startswith(head) and text.endswith(tail)


# -- the document ------------------------------------------------------------------

def _malformed(detail: str) -> MalformedXML:
    return MalformedXML(f"{_MALFORMED}: {detail}")


def _rule(el: ET.Element) -> CorsRule:
    lists: dict[str, list[str]] = {field: [] for field in _LISTS.values()}
    single: dict[str, str] = {}
    for c in el:
        name, text = local(c.tag), c.text or ""
        if name in _LISTS:
            lists[_LISTS[name]].append(text)
        elif name in ("ID", "MaxAgeSeconds") and name not in single:
            single[name] = text
        else:
            raise _malformed(f"unexpected or repeated <{name}> in <CORSRule>")
    if not lists["allowed_origins"] or not lists["allowed_methods"]:
        raise _malformed("each <CORSRule> needs an <AllowedOrigin> and an <AllowedMethod>")
    max_age = None
    if "MaxAgeSeconds" in single:
        try:
            max_age = int(single["MaxAgeSeconds"].strip())
        except ValueError as exc:
            raise _malformed("<MaxAgeSeconds> must be an integer") from exc
        if max_age < 0:
            raise _malformed("<MaxAgeSeconds> must not be negative")
    rule_id = single.get("ID")
    if rule_id is not None and len(rule_id) > MAX_ID:
        raise InvalidArgument(f"ID length should not exceed allowed limit of {MAX_ID}")
    rule = CorsRule(**{k: tuple(v) for k, v in lists.items()}, max_age_s=max_age, id=rule_id)
    _check_values(rule)
    return rule


def _check_values(rule: CorsRule) -> None:
    """S3's ``InvalidRequest`` answers to a rule's values."""
    for method in rule.allowed_methods:
        if method not in METHODS:
            raise InvalidRequestError(
                f"Found unsupported HTTP method in CORS config. Unsupported method is {method}")
    for what, values in (("AllowedOrigin", rule.allowed_origins), ("AllowedHeader", rule.allowed_headers)):
        for value in values:
            if value.count("*") > 1:
                raise InvalidRequestError(f'{what} "{value}" can not have more than one wildcard.')
    for value in rule.expose_headers:
        if "*" in value:
            raise InvalidRequestError(
                f'ExposeHeader "{value}" contains wildcard. We currently do not support wildcard for '
                "ExposeHeader.")


def parse_cors(body: bytes) -> list[CorsRule]:
    """A ``CORSConfiguration`` document -> its rules, in document order.

    Args:
        body: the PutBucketCors request body.

    Returns:
        One to :data:`MAX_RULES` rules.

    Raises:
        MaxMessageLengthExceeded: more than :data:`MAX_DOCUMENT` bytes.
        MalformedXML: not well-formed, not a ``CORSConfiguration``, no rules or
            more than :data:`MAX_RULES`, an unknown or repeated element, a rule
            without origin or method, a ``MaxAgeSeconds`` that is not a
            non-negative integer.
        InvalidRequestError: a method other than GET, PUT, HEAD, POST, DELETE;
            an origin or allowed header with two ``*``; an expose header with one.
        InvalidArgument: an ``ID`` over :data:`MAX_ID` characters.
    """
    if len(body) > MAX_DOCUMENT:
        raise MaxMessageLengthExceeded("Your request was too big.")
    root = parse_xml(body)
    if local(root.tag) != "CORSConfiguration":
        raise _malformed("expected <CORSConfiguration>")
    if any(local(c.tag) != "CORSRule" for c in root):
        raise _malformed("<CORSConfiguration> holds only <CORSRule> elements")
    if not 1 <= len(root) <= MAX_RULES:
        raise _malformed(f"a CORS configuration holds 1 to {MAX_RULES} <CORSRule> elements")
    return [_rule(el) for el in root]


def render_cors(rules: list[CorsRule] | tuple[CorsRule, ...]) -> ET.Element:
    """Rules -> the ``CORSConfiguration`` document GetBucketCors answers (only the members set)."""
    root = element("CORSConfiguration")
    for r in rules:
        el = sub(root, "CORSRule")
        if r.id is not None:
            sub(el, "ID", r.id)
        for tag, values in (("AllowedHeader", r.allowed_headers), ("AllowedMethod", r.allowed_methods),
                            ("AllowedOrigin", r.allowed_origins), ("ExposeHeader", r.expose_headers)):
            for value in values:
                sub(el, tag, value)
        if r.max_age_s is not None:
            sub(el, "MaxAgeSeconds", r.max_age_s)
    return root


def rules_to_json(rules: list[CorsRule]) -> str:
    """The stored form of a configuration: ``{"rules": [{field: value}, ...]}``."""
    return json.dumps({"rules": [asdict(r) for r in rules]}, separators=(",", ":"))


@functools.lru_cache(maxsize=64)
def rules_from_json(document: str) -> tuple[CorsRule, ...]:
    """The rules of a stored configuration (:func:`rules_to_json`); parsed once per document."""
    out = []
    for r in json.loads(document)["rules"]:
        out.append(CorsRule(
            allowed_origins=tuple(r["allowed_origins"]), allowed_methods=tuple(r["allowed_methods"]),
            allowed_headers=tuple(r["allowed_headers"]), expose_headers=tuple(r["expose_headers"]),
            max_age_s=r["max_age_s"], id=r["id"]))
    return tuple(out)


def render_stored(document: str) -> ET.Element:
    """A stored configuration -> the GetBucketCors document."""
    return render_cors(rules_from_json(document))


# -- evaluation --------------------------------------------------------------------

def _header_names(value: str | None) -> list[str]:
    """``Access-Control-Request-Headers`` -> lower-case names, in order, empty items dropped."""
    return [n.strip().lower() for n in (value or "").split(",") if n.strip()]


def matching_rule(rules: tuple[CorsRule, ...], origin: str, method: str,
                  header_names: list[str]) -> tuple[CorsRule, str] | None:
    """The first rule allowing ``origin``, ``method`` and every one of ``header_names``.

    Returns:
        ``(rule, Access-Control-Allow-Origin value)``, or None.
    """
    for rule in rules:
        if method not in rule.allowed_methods:
            continue
        answer = rule.origin_answer(origin)
        if answer is not None and rule.allows_headers(header_names):
            return rule, answer
    return None


def _answer_headers(rule: CorsRule, allow_origin: str) -> dict[str, str]:
    """The headers S3 sends for a matched rule, on a preflight and on an actual request."""
    out = {"Access-Control-Allow-Origin": allow_origin,
           "Access-Control-Allow-Methods": ", ".join(rule.allowed_methods)}
    if rule.expose_headers:
        out["Access-Control-Expose-Headers"] = ", ".join(rule.expose_headers)
    if rule.max_age_s is not None:
        out["Access-Control-Max-Age"] = str(rule.max_age_s)
    if allow_origin != "*":
        out["Access-Control-Allow-Credentials"] = "true"
    out["Vary"] = _VARY
    return out


async def _stored_rules(s: Services, bucket: str) -> tuple[CorsRule, ...] | None:
    """The bucket's rules, or None without a configuration.

    Raises:
        NoSuchBucket, InvalidBucketName: from the engine.
    """
    document = await s.call(s.engine.get_bucket_config, bucket, CONFIG)
    return None if document is None else rules_from_json(document)


async def actual_request_headers(s: Services, target: Target, headers) -> dict[str, str]:
    """The CORS headers of a (non-``OPTIONS``) request's response: those of the
    first rule that allows its ``Origin`` and method, else none.

    Args:
        s: the front's services.
        target: the parsed request.
        headers: the request headers.

    Returns:
        Header name -> value; empty without ``Origin``, bucket, configuration
        or matching rule (a missing bucket is the handler's answer to give).
    """
    origin = headers.get("Origin")
    if not origin or target.bucket is None:
        return {}
    try:
        rules = await _stored_rules(s, target.bucket)
    except GpufeedError:
        return {}
    method = headers.get("Access-Control-Request-Method") or target.method
    found = matching_rule(rules or (), origin, method, [])
    return {} if found is None else _answer_headers(*found)


async def preflight(s: Services, req: S3Request, ep: CorsPreflight) -> web.Response:
    """A CORS preflight (``OPTIONS``, no authentication): 200 with the first
    matching rule's ``Access-Control-*`` headers and an empty body.

    Raises:
        BadRequest: no ``Origin`` header.
        CORSForbidden: no such bucket, no CORS configuration, no
            ``Access-Control-Request-Method``, or no rule allows the request
            (403 ``AccessForbidden``; the error names the method and whether
            a bucket's or an object's rules were evaluated).
    """
    origin = req.headers.get("Origin")
    if not origin:
        raise BadRequest("Insufficient information. Origin request header needed.")
    method = req.headers.get("Access-Control-Request-Method")
    details = {"method": method or "OPTIONS", "resource_type": "BUCKET"}
    if ep.bucket is None:
        raise CORSForbidden("CORSResponse: Bucket not found", **details)
    try:
        rules = await _stored_rules(s, ep.bucket)
    except GpufeedError as exc:
        raise CORSForbidden("CORSResponse: Bucket not found", **details) from exc
    if rules is None:
        raise CORSForbidden("CORSResponse: CORS is not enabled for this bucket.", **details)
    if ep.key is not None:
        details["resource_type"] = "OBJECT"
    names = _header_names(req.headers.get("Access-Control-Request-Headers"))
    found = matching_rule(rules, origin, method, names) if method else None
    if found is None:
        raise CORSForbidden(_NOT_ALLOWED, **details)
    out = _answer_headers(*found)
    if names:
        out["Access-Control-Allow-Headers"] = ", ".join(names)
    return web.Response(status=200, headers=out)


async def put_cors(s: Services, req: S3Request, ep: PutBucketCors) -> web.Response:
    """PutBucketCors: replace the bucket's CORS rules (200, no body).

    Raises:
        InvalidRequestError: neither ``Content-MD5`` nor a checksum header; see
            also :func:`parse_cors`.
        BadDigest: the body does not match them.
        MalformedXML, MaxMessageLengthExceeded, InvalidArgument: see :func:`parse_cors`.
        NoSuchBucket: no such bucket (checked first; nothing changes on any error).
    """
    require_integrity_header(req.headers)
    rules = parse_cors(await s.read_xml(req))
    await s.call(s.engine.put_bucket_config, ep.bucket, CONFIG, rules_to_json(rules))
    return web.Response(status=200)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    PutBucketCors: put_cors,
    CorsPreflight: preflight,
}
