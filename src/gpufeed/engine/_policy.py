"""Bucket policies: parse a policy document once, then decide requests against it.

The subset of the AWS access policy language gpufeed keeps:

- ``Version`` (``2012-10-17`` or ``2008-10-17``, optional), ``Id``, and
  ``Statement``: one statement or a list of them, each with an optional ``Sid``;
- ``Effect``: ``Allow`` or ``Deny``;
- ``Principal`` or ``NotPrincipal``: ``"*"``, ``{"AWS": "*"}`` or
  ``{"AWS": [...]}`` naming a tenant (``arn:aws:iam::<tenant>:root`` or the
  bare tenant name) or an access key id; each must exist when the policy is set;
- ``Action`` or ``NotAction``: ``s3:<Name>`` with ``*`` and ``?`` wildcards
  (matched without regard to case), or ``*``;
- ``Resource`` or ``NotResource``: ``arn:aws:s3:::<bucket>`` (the bucket) and
  ``arn:aws:s3:::<bucket>/<key pattern>`` (its objects), with wildcards, or
  ``*``; every resource must lie in the policy's own bucket;
- ``Condition``: ``IpAddress`` / ``NotIpAddress`` on ``aws:SourceIp`` (CIDR
  blocks), ``StringEquals`` / ``StringNotEquals`` / ``StringLike`` /
  ``StringNotLike`` on ``s3:prefix``, ``aws:username`` and
  ``aws:PrincipalAccount`` (both are the requester's tenant). Values of one
  key are OR-ed, keys and operators AND-ed; a key the request does not carry
  fails the positive operators and passes the negated ones.

Evaluation (:func:`evaluate`): an explicit ``Deny`` that applies wins, even
against the bucket's owner; otherwise the owner is allowed, and anyone else
(another tenant, an anonymous caller) only when an ``Allow`` applies.

Everything here is a pure function of its arguments; the engine caches the
parsed :class:`Policy` per bucket (:mod:`._tenants`).

Sources: "Policies and permissions in Amazon S3", "Bucket policy examples",
"Amazon S3 condition key examples", Amazon S3 User Guide; "Policy evaluation
logic" and "IAM JSON policy elements reference", IAM User Guide,
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements.html
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import MalformedPolicy

__all__ = [
    "Policy", "Statement", "Condition", "PolicyRequest", "parse_policy", "evaluate", "ACTIONS",
    "MAX_POLICY_BYTES", "OWNER_ONLY_ACTIONS", "resource_arn",
]

#: Largest policy, bytes of its JSON with the whitespace outside strings taken out (S3's 20 KB).
MAX_POLICY_BYTES = 20 << 10  # 20 KiB
_ARN = "arn:aws:s3:::"
_IAM_ROOT = re.compile(r"arn:aws:iam::([^:]+):root")
_VERSIONS = ("2012-10-17", "2008-10-17")
_STATEMENT_FIELDS = frozenset({"Sid", "Effect", "Principal", "NotPrincipal", "Action", "NotAction",
                               "Resource", "NotResource", "Condition"})

#: Every S3 action a policy may name -> the resource it applies to (``bucket`` or ``object``).
ACTIONS: dict[str, str] = {
    **{f"s3:{name}": "object" for name in (
        "GetObject", "GetObjectVersion", "PutObject", "DeleteObject", "DeleteObjectVersion",
        "GetObjectAcl", "GetObjectVersionAcl", "PutObjectAcl", "PutObjectVersionAcl",
        "GetObjectAttributes", "GetObjectVersionAttributes", "GetObjectTagging",
        "GetObjectVersionTagging", "PutObjectTagging", "PutObjectVersionTagging",
        "DeleteObjectTagging", "DeleteObjectVersionTagging", "GetObjectRetention", "PutObjectRetention",
        "GetObjectLegalHold", "PutObjectLegalHold", "BypassGovernanceRetention", "AbortMultipartUpload",
        "ListMultipartUploadParts", "RestoreObject")},
    **{f"s3:{name}": "bucket" for name in (
        "ListBucket", "ListBucketVersions", "ListBucketMultipartUploads", "CreateBucket", "DeleteBucket",
        "GetBucketLocation", "GetBucketVersioning", "PutBucketVersioning", "GetBucketAcl", "PutBucketAcl",
        "GetBucketPolicy", "PutBucketPolicy", "DeleteBucketPolicy", "GetBucketCORS", "PutBucketCORS",
        "GetBucketTagging", "PutBucketTagging", "GetLifecycleConfiguration", "PutLifecycleConfiguration",
        "GetEncryptionConfiguration", "PutEncryptionConfiguration", "GetBucketWebsite", "PutBucketWebsite",
        "DeleteBucketWebsite", "GetReplicationConfiguration", "PutReplicationConfiguration",
        "GetBucketObjectLockConfiguration", "PutBucketObjectLockConfiguration", "GetBucketPolicyStatus")},
}
#: Actions only the bucket's owner may take, whatever a policy says (and a
#: policy's Deny never locks the owner out of them, as S3 keeps the root user in).
OWNER_ONLY_ACTIONS = frozenset({"s3:GetBucketPolicy", "s3:PutBucketPolicy", "s3:DeleteBucketPolicy"})

_STRING_OPS = {"StringEquals": (False, False), "StringNotEquals": (True, False),
               "StringLike": (False, True), "StringNotLike": (True, True)}
_IP_OPS = {"IpAddress": False, "NotIpAddress": True}
#: Condition keys (lower case, as AWS matches them) -> the operators they take.
_KEYS = {"aws:sourceip": "ip", "s3:prefix": "string", "aws:username": "string",
         "aws:principalaccount": "string"}


@dataclass(frozen=True, slots=True)
class PolicyRequest:
    """What one request asks, as a policy sees it.

    Attributes:
        tenant: the requester's tenant, ``None`` when anonymous.
        access_key: the key the request was signed with, ``None`` when anonymous.
        action: the S3 action (``"s3:GetObject"``).
        bucket, key: the resource (``key`` ``None`` for the bucket itself).
        source_ip: the client's address, ``None`` when unknown.
        prefix: the ``prefix`` of a listing (``""`` when it names none), ``None`` otherwise.
    """

    tenant: str | None
    access_key: str | None
    action: str
    bucket: str
    key: str | None = None
    source_ip: str | None = None
    prefix: str | None = None


@dataclass(frozen=True, slots=True)
class Condition:
    """One key of one condition operator.

    Attributes:
        key: the condition key, lower case (``"aws:sourceip"``).
        negate: a ``Not`` operator.
        values: regular expressions (string operators) or networks (IP operators).
    """

    key: str
    negate: bool
    values: tuple


@dataclass(frozen=True, slots=True)
class Statement:
    """One parsed statement.

    Attributes:
        deny: ``Effect`` is ``Deny``.
        principals: ``"*"``, ``"tenant:<name>"`` and ``"key:<id>"`` entries.
        not_principal, not_action, not_resource: the ``Not`` forms were used.
        actions, resources: compiled wildcard patterns.
        conditions: all must hold.
    """

    deny: bool
    principals: frozenset[str]
    not_principal: bool
    actions: tuple[re.Pattern[str], ...]
    not_action: bool
    resources: tuple[re.Pattern[str], ...]
    not_resource: bool
    conditions: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Policy:
    """A parsed bucket policy: its statements in document order."""

    statements: tuple[Statement, ...]


def resource_arn(bucket: str, key: str | None) -> str:
    """The ARN a request acts on: ``arn:aws:s3:::bucket`` or ``arn:aws:s3:::bucket/key``."""
    return f"{_ARN}{bucket}" if key is None else f"{_ARN}{bucket}/{key}"


def _wildcard(pattern: str, *, ignore_case: bool = False) -> re.Pattern[str]:
    """``*`` (any run of characters, ``/`` included) and ``?`` (one character) as a regular expression."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _strings(value: object, what: str) -> list[str]:
    """A policy element that holds one string or a list of them."""
    items = value if isinstance(value, list) else [value]
    strings = [v for v in items if isinstance(v, str)]
    if not items or len(strings) != len(items):
        raise MalformedPolicy(f"Policy has an invalid {what}")
    return strings


# -- parsing -------------------------------------------------------------------------

def parse_policy(text: str, bucket: str, principal: Callable[[str], str | None]) -> Policy:
    """Check a bucket policy document and parse it.

    Args:
        text: the document (JSON) as PutBucketPolicy received it.
        bucket: the bucket it is for (every resource must lie in it).
        principal: an AWS principal string (a tenant ARN or name, an access
            key id) -> ``"tenant:<name>"`` / ``"key:<id>"``, or ``None`` when
            no such tenant or valid key exists.

    Returns:
        The parsed policy.

    Raises:
        MalformedPolicy: with AWS's reason: not JSON (``Policies must be valid
            JSON and the first byte must be '{'``, ``This policy contains
            invalid Json``), over :data:`MAX_POLICY_BYTES`, a missing field,
            an unknown ``Effect``, principal, action, resource (another bucket),
            condition operator or key, an action that applies to none of the
            statement's resources.
    """
    if not text.lstrip().startswith("{"):
        raise MalformedPolicy("Policies must be valid JSON and the first byte must be '{'")
    try:
        doc = json.loads(text)
        compact = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's limit
        raise MalformedPolicy("This policy contains invalid Json") from exc
    if not isinstance(doc, dict):
        raise MalformedPolicy("This policy contains invalid Json")
    if len(compact) > MAX_POLICY_BYTES:
        raise MalformedPolicy("Policy exceeds the maximum allowed document size.")
    unknown = doc.keys() - {"Version", "Id", "Statement"}
    if unknown:
        raise MalformedPolicy(f"Unknown field {sorted(unknown)[0]}")
    if "Version" in doc and doc["Version"] not in _VERSIONS:
        raise MalformedPolicy("The policy must contain a valid version string")
    if "Statement" not in doc:
        raise MalformedPolicy("Missing required field Statement")
    raw = doc["Statement"]
    raw = raw if isinstance(raw, list) else [raw]
    if not raw:
        raise MalformedPolicy("Could not parse the policy: Statement is empty!")
    sids: set[str] = set()
    statements = []
    for st in raw:
        if not isinstance(st, dict):
            raise MalformedPolicy("This policy contains invalid Json")
        sid = st.get("Sid")
        if sid is not None:
            if not isinstance(sid, str):
                raise MalformedPolicy("Statement IDs (SID) must be strings")
            if sid in sids:
                raise MalformedPolicy("Statement IDs (SID) in a single policy must be unique")
            sids.add(sid)
        statements.append(_statement(st, bucket, principal))
    return Policy(tuple(statements))


def _one_of(st: dict, name: str) -> tuple[object, bool]:
    """``st[name]`` or ``st["Not" + name]`` (exactly one of them), and whether it was the ``Not`` form."""
    has, has_not = name in st, f"Not{name}" in st
    if has and has_not:
        raise MalformedPolicy(f"Statement cannot have both {name} and Not{name}")
    if not has and not has_not:
        raise MalformedPolicy(f"Missing required field {name}")
    return (st[f"Not{name}"], True) if has_not else (st[name], False)


def _statement(st: dict, bucket: str, principal: Callable[[str], str | None]) -> Statement:
    unknown = st.keys() - _STATEMENT_FIELDS
    if unknown:
        raise MalformedPolicy(f"Unknown field {sorted(unknown)[0]}")
    if "Effect" not in st:
        raise MalformedPolicy("Missing required field Effect")
    effect = st["Effect"]
    if effect not in ("Allow", "Deny"):
        raise MalformedPolicy(f"Invalid effect: {effect}")
    who, not_principal = _one_of(st, "Principal")
    what, not_action = _one_of(st, "Action")
    where, not_resource = _one_of(st, "Resource")
    actions = _actions(what)
    resources = _resources(where, bucket)
    if not not_action and not not_resource:
        _check_applies(actions, resources)
    return Statement(
        deny=effect == "Deny", principals=_principals(who, principal), not_principal=not_principal,
        actions=tuple(_wildcard(a, ignore_case=True) for a in actions), not_action=not_action,
        resources=tuple(_wildcard(r) for r in resources), not_resource=not_resource,
        conditions=_conditions(st.get("Condition", {})))


def _principals(value: object, principal: Callable[[str], str | None]) -> frozenset[str]:
    if value == "*":
        return frozenset({"*"})
    if not isinstance(value, dict) or set(value) != {"AWS"}:
        raise MalformedPolicy("Invalid principal in policy")
    out = set()
    for name in _strings(value["AWS"], "principal"):
        if name == "*":
            out.add("*")
            continue
        m = _IAM_ROOT.fullmatch(name)
        found = principal(m.group(1) if m else name)
        if found is None or (m and not found.startswith("tenant:")):
            raise MalformedPolicy("Invalid principal in policy")
        out.add(found)
    return frozenset(out)


def _actions(value: object) -> list[str]:
    actions = _strings(value, "action")
    for action in actions:
        if action != "*" and not action.lower().startswith("s3:"):
            raise MalformedPolicy("Policy has invalid action")
        pattern = _wildcard(action, ignore_case=True)
        if not any(pattern.fullmatch(name) for name in ACTIONS):
            raise MalformedPolicy("Policy has invalid action")
    return actions


def _resources(value: object, bucket: str) -> list[str]:
    resources = _strings(value, "resource")
    for resource in resources:
        if resource == "*":
            continue
        if not resource.startswith(_ARN):
            raise MalformedPolicy("Policy has invalid resource")
        name = resource[len(_ARN):].split("/", 1)[0]
        if not _wildcard(name).fullmatch(bucket):
            raise MalformedPolicy("Policy has invalid resource")
    return resources


def _resource_kinds(resource: str) -> set[str]:
    """Which resources (``bucket``, ``object``) an ARN pattern can name."""
    if resource == "*":
        return {"bucket", "object"}
    rest = resource[len(_ARN):]
    if "/" in rest:
        return {"object"}
    return {"bucket", "object"} if "*" in rest else {"bucket"}


def _check_applies(actions: list[str], resources: list[str]) -> None:
    kinds = set().union(*(_resource_kinds(r) for r in resources))
    for action in actions:
        pattern = _wildcard(action, ignore_case=True)
        if not any(kind in kinds for name, kind in ACTIONS.items() if pattern.fullmatch(name)):
            raise MalformedPolicy("Action does not apply to any resource(s) in statement")


def _conditions(value: object) -> tuple[Condition, ...]:
    if not isinstance(value, dict):
        raise MalformedPolicy("Policy has an invalid condition")
    out = []
    for operator, block in value.items():
        if operator not in _STRING_OPS and operator not in _IP_OPS:
            raise MalformedPolicy(f"Invalid Condition type : {operator}")
        if not isinstance(block, dict) or not block:
            raise MalformedPolicy("Policy has an invalid condition")
        for key, raw in block.items():
            kind = _KEYS.get(key.lower()) if isinstance(key, str) else None
            if kind is None or (kind == "ip") != (operator in _IP_OPS):
                raise MalformedPolicy("Policy has an invalid condition key")
            values = _strings(raw, "condition value")
            if operator in _IP_OPS:
                out.append(Condition(key.lower(), _IP_OPS[operator], tuple(_network(v) for v in values)))
            else:
                negate, like = _STRING_OPS[operator]
                out.append(Condition(key.lower(), negate, tuple(
                    _wildcard(v) if like else re.compile(re.escape(v)) for v in values)))
    return tuple(out)


def _network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        raise MalformedPolicy(f"Invalid IP address or CIDR block: {value}") from exc


# -- evaluation ----------------------------------------------------------------------

def _principal_matches(st: Statement, req: PolicyRequest) -> bool:
    hit = "*" in st.principals or (
        req.tenant is not None and f"tenant:{req.tenant}" in st.principals) or (
        req.access_key is not None and f"key:{req.access_key}" in st.principals)
    return hit != st.not_principal


def _context_value(req: PolicyRequest, key: str) -> str | None:
    if key == "aws:sourceip":
        return req.source_ip
    if key == "s3:prefix":
        return req.prefix
    return req.tenant  # aws:username, aws:principalaccount


def _condition_holds(cond: Condition, req: PolicyRequest) -> bool:
    value = _context_value(req, cond.key)
    if value is None:
        return cond.negate
    if cond.key == "aws:sourceip":
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            return cond.negate
        hit = any(address in net for net in cond.values)
    else:
        hit = any(p.fullmatch(value) for p in cond.values)
    return hit != cond.negate


def _applies(st: Statement, req: PolicyRequest, arn: str) -> bool:
    if not _principal_matches(st, req):
        return False
    if any(p.fullmatch(req.action) for p in st.actions) == st.not_action:
        return False
    if any(p.fullmatch(arn) for p in st.resources) == st.not_resource:
        return False
    return all(_condition_holds(c, req) for c in st.conditions)


def evaluate(policy: Policy | None, req: PolicyRequest, *, is_owner: bool) -> bool:
    """Whether ``policy`` lets ``req`` through.

    Args:
        policy: the bucket's parsed policy, ``None`` when it has none.
        req: the request.
        is_owner: the requester's tenant owns the bucket.

    Returns:
        ``False`` when a ``Deny`` statement applies; else ``True`` for the
        owner, and for anyone else when an ``Allow`` statement applies.
    """
    if policy is None:
        return is_owner
    arn = resource_arn(req.bucket, req.key)
    allowed = is_owner
    for st in policy.statements:
        if _applies(st, req, arn):
            if st.deny:
                return False
            allowed = True
    return allowed
