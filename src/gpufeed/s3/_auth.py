"""AWS Signature Version 4 verification for the S3 front.

The maths (canonical request, string to sign, signing key) is botocore's own
:class:`botocore.auth.SigV4Auth`, fed with what the client signed: its method,
path, query, the headers it lists in ``SignedHeaders`` and its ``X-Amz-Date``.
Only the parsing of the ``Authorization`` header / presigned query and the
constant-time comparison live here.

Sources: "Authenticating Requests (AWS Signature Version 4)", Amazon S3 API
Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-authenticating-requests.html
and its pages on header auth, query auth (presigned URLs) and chunked uploads.
"""

from __future__ import annotations

import base64
import calendar
import email.utils
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, unquote, urlsplit

from botocore.auth import HmacV1Auth, SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials

from ..errors import (
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidRequestError,
    RequestExpired,
    RequestTimeTooSkewed,
    SignatureDoesNotMatch,
)

__all__ = ["AuthResult", "SecretLookup", "verify_request", "chunk_signature", "EMPTY_SHA256"]

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
#: Largest clock difference accepted for header-signed requests, seconds (S3: 15 min).
MAX_SKEW_S = 15 * 60
#: Longest presigned URL validity, seconds (S3: 7 days).
MAX_EXPIRES_S = 7 * 24 * 3600

_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<sig>[0-9a-fA-F]+)\s*$"
)


class SecretLookup(Protocol):
    """What the verifier asks of the accepted keys."""

    def get(self, access_key: str, default: None = None, /) -> str | None:
        """The secret of a valid key, else ``None``."""


@dataclass(frozen=True, slots=True)
class AuthResult:
    """What a verified request proved.

    Attributes:
        access_key: the access key id it was signed with.
        payload_hash: the ``x-amz-content-sha256`` value signed (``UNSIGNED-PAYLOAD`` for
            presigned URLs).
        signature: the request's hex signature (seed of aws-chunked chunk signatures).
        timestamp: the signed ``X-Amz-Date`` (``YYYYMMDDTHHMMSSZ``).
        scope: the credential scope ``date/region/service/aws4_request``.
        signing_key: the derived SigV4 key (for chunk signatures).
        deferred: an unsigned browser-form POST to a bucket (its handler checks
            the signed policy in the form, ``gpufeed.s3._post``) or a CORS
            preflight (``OPTIONS``, answered from the bucket's CORS rules alone,
            ``gpufeed.s3._cors``); nothing else is proved.
        anonymous: the request carries no signature at all; it goes on as no
            tenant and reaches only what a bucket policy grants everyone.
    """

    access_key: str
    payload_hash: str
    signature: str
    timestamp: str
    scope: str
    signing_key: bytes
    deferred: bool = False
    anonymous: bool = False


class _ClientSigned(SigV4Auth):
    """SigV4Auth that signs exactly the headers the client listed, path as given.

    ``raw_values``: stand-in token -> header value whose bytes were not UTF-8
    (lone surrogates, as aiohttp decodes them); botocore's canonical request is
    built over the tokens, and hashed with the values' original bytes.
    """

    def __init__(self, credentials, service, region, signed_headers: list[str],
                 raw_values: dict[str, str] | None = None) -> None:
        super().__init__(credentials, service, region)
        self._signed = signed_headers
        self._raw_values = raw_values or {}

    def string_to_sign(self, request, canonical_request):
        for token, value in self._raw_values.items():
            canonical_request = canonical_request.replace(token, value)
        digest = hashlib.sha256(canonical_request.encode("utf-8", "surrogateescape")).hexdigest()
        return "\n".join([ALGORITHM, request.context["timestamp"], self.credential_scope(request), digest])

    def headers_to_sign(self, request):
        header_map = super().headers_to_sign(request)
        for name in list(header_map.keys()):
            if name not in self._signed:
                del header_map[name]
        return header_map

    def _normalize_url_path(self, path):
        # S3 signs the path as sent: no dot-segment removal, no double encoding.
        return path


class _V2Signer(HmacV1Auth):
    """botocore's HMAC-SHA1 (signature version 2) signer, dated as the client
    dated it; ``raw_values`` as for :class:`_ClientSigned`."""

    def __init__(self, credentials, date: str, raw_values: dict[str, str] | None = None) -> None:
        super().__init__(credentials)
        self._date = date
        self._raw_values = raw_values or {}

    def _get_date(self):
        return self._date

    def sign_string(self, string_to_sign):
        for token, value in self._raw_values.items():
            string_to_sign = string_to_sign.replace(token, value)
        digest = hmac.new(self.credentials.secret_key.encode("utf-8"),
                          string_to_sign.encode("utf-8", "surrogateescape"), hashlib.sha1).digest()
        return base64.b64encode(digest).strip().decode("utf-8")


def _verify_v2(*, method, raw_path, raw_query, query, headers, credentials, now_s, virtual_bucket):
    """Signature version 2 (``Authorization: AWS key:sig`` or ``?AWSAccessKeyId&Signature&Expires``),
    still what boto3's ``generate_presigned_url`` makes unless told ``signature_version="s3v4"``.

    Source: "Signing and authenticating REST requests" (legacy), Amazon S3 User Guide.

    A request naming a bucket snapshot (``?snapshot=``) is refused: SigV2 signs
    only the subresources AWS lists, so the parameter could be added to (or
    removed from) a signed URL without breaking its signature.
    """
    if "snapshot" in query:
        raise AccessDenied("a request that names a snapshot must be signed with Signature Version 4 "
                           "(SigV2 does not sign the snapshot parameter)")
    auth = headers.get("Authorization")
    if auth is not None:
        access_key, _, signature = auth[4:].strip().rpartition(":")
        if not access_key:
            raise AuthorizationHeaderMalformed("The authorization header is malformed.")
        date = "" if "x-amz-date" in headers else headers.get("Date", "")
        try:
            signed_at = email.utils.parsedate_to_datetime(headers.get("x-amz-date") or date)
        except (TypeError, ValueError, IndexError):
            signed_at = None
        if signed_at is None:
            raise AccessDenied("AWS authentication requires a valid Date or x-amz-date header")
        if abs(now_s - signed_at.timestamp()) > MAX_SKEW_S:
            raise RequestTimeTooSkewed(
                "The difference between the request time and the current time is too large."
            )
    else:
        access_key, signature, date = query["AWSAccessKeyId"], query["Signature"], query.get("Expires", "")
        try:
            expires_at = int(date)
        except ValueError as exc:
            raise AccessDenied("Query-string authentication requires the Expires parameter") from exc
        if now_s > expires_at:
            raise RequestExpired("Request has expired", expires=expires_at)
    secret = credentials.get(access_key)
    if secret is None:
        raise InvalidAccessKeyId(
            "The AWS Access Key Id you provided does not exist in our records.", access_key=access_key
        )
    sign_headers = HTTPHeaders()
    raw_values: dict[str, str] = {}
    for name, value in headers.items():
        lname = name.lower()
        if lname in ("content-md5", "content-type") or lname.startswith("x-amz-"):
            if not value.isascii() and not _is_utf8(value):
                token = f"gpufeed-raw-value-{len(raw_values)}-{secrets.token_hex(8)}"
                raw_values[token], value = value, token
            sign_headers[lname] = value
    resource = f"/{virtual_bucket}{raw_path}" if virtual_bucket else raw_path
    split = urlsplit(f"http://host{raw_path}" + (f"?{raw_query}" if raw_query else ""))
    signer = _V2Signer(Credentials(access_key, secret), date, raw_values)
    # botocore signs a bucket as "/bucket/" while sending "/bucket": accept both.
    candidates = [resource] if resource.count("/") > 1 else [resource, resource.rstrip("/") + "/"]
    for auth_path in candidates:
        expected = signer.get_signature(method, split, sign_headers, auth_path=auth_path)
        if hmac.compare_digest(expected.encode(), signature.encode()):
            break
    else:
        raise SignatureDoesNotMatch(
            "The request signature we calculated does not match the signature you provided. "
            "Check your key and signing method."
        )
    payload = headers.get("X-Amz-Content-SHA256", "UNSIGNED-PAYLOAD")
    return AuthResult(access_key=access_key, payload_hash=payload, signature="", timestamp="",
                      scope="", signing_key=b"")


def _parse_amz_date(value: str) -> float:
    try:
        return calendar.timegm(time.strptime(value, "%Y%m%dT%H%M%SZ"))
    except (ValueError, TypeError) as exc:
        raise AccessDenied("X-Amz-Date must be in the ISO8601 basic format YYYYMMDDTHHMMSSZ") from exc


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    def h(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    return h(h(h(h(f"AWS4{secret}".encode(), date), region), service), "aws4_request")


def _query_pairs(raw_query: str) -> list[tuple[str, str]]:
    pairs = []
    if raw_query:
        for part in raw_query.split("&"):
            if not part:
                continue
            k, _, v = part.partition("=")
            pairs.append((unquote(k), unquote(v)))
    return pairs


def _path_candidates(raw_path: str) -> list[str]:
    """The canonical URI as the client most likely computed it.

    botocore (and most SDKs) put the already-encoded path on the wire, so the
    raw path is tried first; a client that sent unencoded characters signed the
    RFC 3986 encoding of the decoded path.
    """
    out = [raw_path or "/"]
    alt = quote(unquote(raw_path), safe="/~") or "/"
    if alt not in out:
        out.append(alt)
    return out


@dataclass(frozen=True, slots=True)
class _Claim:
    """The SigV4 fields a request presents, from its Authorization header or its query.

    Attributes:
        credential: ``access_key/date/region/service/aws4_request``.
        signed: ``;``-separated signed header names.
        signature: the hex signature to check.
        timestamp: ``X-Amz-Date`` (``YYYYMMDDTHHMMSSZ``).
        payload_hash: the payload line of the canonical request.
        error_cls: the error of a malformed field (header or query flavour).
        expires_s: ``X-Amz-Expires`` of a presigned URL, None for a header signature.
    """

    credential: str
    signed: str
    signature: str
    timestamp: str
    payload_hash: str
    error_cls: type
    expires_s: int | None = None


def _header_claim(auth: str, headers) -> _Claim:
    """The claim of an ``Authorization: AWS4-HMAC-SHA256 ...`` header."""
    m = _AUTH_RE.match(auth.strip())
    if m is None:
        raise AuthorizationHeaderMalformed("The authorization header is malformed.")
    timestamp = headers.get("X-Amz-Date") or ""
    if not timestamp:
        raise AccessDenied("AWS authentication requires a valid Date or x-amz-date header")
    payload_hash = headers.get("X-Amz-Content-SHA256")
    if payload_hash is None:
        raise InvalidRequestError(
            "Missing required header for this request: x-amz-content-sha256"
        )
    return _Claim(credential=m.group("cred"), signed=m.group("signed"), signature=m.group("sig"),
                  timestamp=timestamp, payload_hash=payload_hash, error_cls=AuthorizationHeaderMalformed)


def _expires_s(value: str) -> int:
    """``X-Amz-Expires``, seconds.

    Raises:
        AuthorizationQueryParametersError: not a number ("X-Amz-Expires should be a number").
    """
    try:
        return int(value)
    except ValueError as exc:
        raise AuthorizationQueryParametersError("X-Amz-Expires should be a number") from exc


def _query_claim(query: dict[str, str]) -> _Claim:
    """The claim of a presigned URL (``X-Amz-Algorithm``, ``X-Amz-Credential``, ...)."""
    if query.get("X-Amz-Algorithm") != ALGORITHM:
        raise AuthorizationQueryParametersError(
            "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\""
        )
    try:
        claim = _Claim(
            credential=query["X-Amz-Credential"],
            signed=query["X-Amz-SignedHeaders"],
            signature=query["X-Amz-Signature"],
            timestamp=query["X-Amz-Date"],
            payload_hash="UNSIGNED-PAYLOAD",
            error_cls=AuthorizationQueryParametersError,
            expires_s=_expires_s(query["X-Amz-Expires"]),
        )
    except KeyError as exc:
        raise AuthorizationQueryParametersError(
            "Query-string authentication version 4 requires the X-Amz-Algorithm, "
            "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, "
            "and X-Amz-Expires parameters."
        ) from exc
    # S3 answers both with 403 AccessDenied (not the 400 of a malformed query).
    expires_s = claim.expires_s or 0
    if expires_s < 0:
        raise AccessDenied("X-Amz-Expires must be non-negative")
    if expires_s > MAX_EXPIRES_S:
        raise AccessDenied("X-Amz-Expires must be less than a week (in seconds) that is 604800")
    return claim


def _check_time(claim: _Claim, date: str, now_s: float) -> None:
    """The signing time against the scope date, the clock and a presigned URL's expiry."""
    signed_at = _parse_amz_date(claim.timestamp)
    if claim.timestamp[:8] != date:
        raise claim.error_cls("The credential scope date does not match X-Amz-Date")
    if claim.expires_s is not None:
        if now_s > signed_at + claim.expires_s:
            raise RequestExpired("Request has expired", expires=claim.expires_s)
        if signed_at > now_s + MAX_SKEW_S:
            raise AccessDenied("Request is not valid yet")
    elif abs(now_s - signed_at) > MAX_SKEW_S:
        raise RequestTimeTooSkewed(
            "The difference between the request time and the current time is too large."
        )


def _is_utf8(value: str) -> bool:
    """Whether a header value decoded with ``surrogateescape`` was valid UTF-8 on the wire."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _signed_headers(claim: _Claim, headers,
                    header_signed: bool) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The signed header names, their canonical values, and the stand-in token ->
    value of each value whose bytes were not UTF-8 (signed over those bytes;
    see :class:`_ClientSigned`)."""
    signed_names = claim.signed.lower().split(";")
    if "host" not in signed_names:
        raise claim.error_cls("The host header must be signed")
    sign_headers = {}
    raw_values: dict[str, str] = {}
    for name in signed_names:
        values = headers.getall(name, [])
        if values:
            value = ",".join(" ".join(v.split()) for v in values)
            if not value.isascii() and not _is_utf8(value):
                token = f"gpufeed-raw-value-{len(raw_values)}-{secrets.token_hex(8)}"
                raw_values[token], value = value, token
            sign_headers[name] = value
    if header_signed:
        # Used for the payload line even when the client did not sign the header itself.
        sign_headers.setdefault("x-amz-content-sha256", claim.payload_hash)
    return signed_names, sign_headers, raw_values


def _is_form_post(method: str, raw_path: str, raw_query: str, headers, virtual_bucket: str | None) -> bool:
    """Whether a request is a browser-form POST Object (``POST /bucket``, no query,
    ``multipart/form-data``): the only request whose signature is in its body."""
    if method != "POST" or raw_query or not headers.get("Content-Type", "").lower().startswith("multipart/form-data"):
        return False
    path = raw_path.strip("/")
    return path == "" if virtual_bucket is not None else bool(path) and "/" not in path


def _unverified() -> AuthResult:
    """The result of a request let through unsigned (``deferred``): it proves nothing."""
    return AuthResult(access_key="", payload_hash="UNSIGNED-PAYLOAD", signature="", timestamp="",
                      scope="", signing_key=b"", deferred=True)


def _no_signature(form_post: bool, allow_anonymous: bool) -> AuthResult:
    """A request with no signature: a form POST is ``deferred``; any other is
    ``anonymous`` (no tenant, no key) when allowed.

    Raises:
        AccessDenied: it is not allowed.
    """
    if form_post:
        return _unverified()
    if not allow_anonymous:
        raise AccessDenied("Anonymous access is not allowed")
    return AuthResult(access_key="", payload_hash="UNSIGNED-PAYLOAD", signature="", timestamp="",
                      scope="", signing_key=b"", anonymous=True)


def verify_request(
    *,
    method: str,
    raw_path: str,
    raw_query: str,
    headers,
    credentials: SecretLookup,
    now_s: float | None = None,
    virtual_bucket: str | None = None,
    allow_anonymous: bool = False,
) -> AuthResult:
    """Check a request's SigV4 signature (header or presigned query).

    Args:
        method: HTTP method.
        raw_path: the request path exactly as on the wire (still percent-encoded).
        raw_query: the query string as on the wire, without ``?``.
        headers: case-insensitive multi-dict of request headers.
        credentials: gives the secret of a valid key (``.get``), else ``None``.
        now_s: current Unix time, seconds (for tests).
        virtual_bucket: the bucket named by the Host header (signature version 2
            signs ``/bucket/key`` even for virtual-hosted requests).
        allow_anonymous: let a request with no signature at all through ``anonymous``.

    Returns:
        An :class:`AuthResult`. Let through ``deferred``: a browser-form POST to a bucket (its handler
    checks the policy signature in the body) and any ``OPTIONS``, a CORS
    preflight, unsigned as browsers send it (routed only to the preflight).

    Raises:
        AccessDenied: no signature at all (anonymous request) and not ``allow_anonymous``.
        InvalidAccessKeyId: unknown access key.
        SignatureDoesNotMatch: the signature differs from the one computed.
        RequestExpired: presigned URL past ``X-Amz-Date + X-Amz-Expires``.
        RequestTimeTooSkewed: header-signed request more than 15 min off.
        AuthorizationHeaderMalformed, AuthorizationQueryParametersError: unparsable.
    """
    if method == "OPTIONS":  # a CORS preflight
        return _unverified()
    now_s = time.time() if now_s is None else now_s
    pairs = _query_pairs(raw_query)
    query = dict(pairs)
    auth = headers.get("Authorization")
    presigned = "X-Amz-Signature" in query or "X-Amz-Algorithm" in query
    if (auth is not None and auth.startswith("AWS ")) or (
        auth is None and "AWSAccessKeyId" in query and "Signature" in query
    ):
        return _verify_v2(method=method, raw_path=raw_path, raw_query=raw_query, query=query,
                          headers=headers, credentials=credentials, now_s=now_s,
                          virtual_bucket=virtual_bucket)
    if auth is None and not presigned:
        return _no_signature(_is_form_post(method, raw_path, raw_query, headers, virtual_bucket), allow_anonymous)
    claim = _header_claim(auth, headers) if auth is not None else _query_claim(query)

    parts = claim.credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise claim.error_cls(f"Error parsing the X-Amz-Credential parameter: {claim.credential!r}")
    access_key, date, region, service, _ = parts
    secret = credentials.get(access_key)
    if secret is None:
        raise InvalidAccessKeyId(
            "The AWS Access Key Id you provided does not exist in our records.",
            access_key=access_key,
        )
    _check_time(claim, date, now_s)
    signed_names, sign_headers, raw_values = _signed_headers(claim, headers, auth is not None)
    signer = _ClientSigned(Credentials(access_key, secret), service, region, signed_names, raw_values)
    expected = _match_signature(signer, method, raw_path, raw_query, pairs, sign_headers, claim)
    return AuthResult(
        access_key=access_key,
        payload_hash=claim.payload_hash,
        signature=expected,
        timestamp=claim.timestamp,
        scope=f"{date}/{region}/{service}/aws4_request",
        signing_key=_signing_key(secret, date, region, service),
    )


def _match_signature(signer: _ClientSigned, method: str, raw_path: str, raw_query: str,
                     pairs: list[tuple[str, str]], sign_headers: dict[str, str], claim: _Claim) -> str:
    """The signature computed over each canonical form a client may have signed
    that equals the claimed one.

    Raises:
        SignatureDoesNotMatch: none does.
    """
    params = [(k, v) for k, v in pairs if k != "X-Amz-Signature"]
    # Query as RFC 3986 re-encoded from the decoded pairs (the spec), then as sent
    # (clients that sign their own, not fully encoded, query string).
    raw_signed_query = "&".join(
        p for p in raw_query.split("&") if p and not p.startswith("X-Amz-Signature=")
    )
    variants: list[tuple[str, list[tuple[str, str]] | None, str]] = [
        (path, params, "") for path in _path_candidates(raw_path)]
    variants.append((raw_path or "/", None, raw_signed_query))
    for path, query_params, url_query in variants:
        req = AWSRequest(
            method=method,
            url=f"http://{sign_headers.get('host', '')}{path}" + (f"?{url_query}" if url_query else ""),
            headers=sign_headers,
            params=query_params,
        )
        req.context["timestamp"] = claim.timestamp
        canonical = signer.canonical_request(req)
        if "x-amz-content-sha256" not in sign_headers:
            # Presigned: the payload line is always UNSIGNED-PAYLOAD for S3.
            canonical = canonical.rsplit("\n", 1)[0] + "\nUNSIGNED-PAYLOAD"
        string_to_sign = signer.string_to_sign(req, canonical)
        expected = signer.signature(string_to_sign, req)
        if hmac.compare_digest(expected, claim.signature.lower()):
            return expected
    raise SignatureDoesNotMatch(
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method."
    )


def chunk_signature(auth: AuthResult, previous: str, chunk_sha256_hex: str, kind: str = "PAYLOAD") -> str:
    """Signature of one aws-chunked chunk (or of the trailer, ``kind="TRAILER"``).

    Source: "Signature Calculations for the Authorization Header: Transferring
    Payload in Multiple Chunks (Chunked Upload)", Amazon S3 API Reference.
    """
    if kind == "PAYLOAD":
        sts = "\n".join(
            [f"{ALGORITHM}-PAYLOAD", auth.timestamp, auth.scope, previous, EMPTY_SHA256, chunk_sha256_hex]
        )
    else:
        sts = "\n".join([f"{ALGORITHM}-TRAILER", auth.timestamp, auth.scope, previous, chunk_sha256_hex])
    return hmac.new(auth.signing_key, sts.encode(), hashlib.sha256).hexdigest()
