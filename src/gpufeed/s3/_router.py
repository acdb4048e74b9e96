"""S3 request routing: a request line becomes a typed :class:`Endpoint` once.

Two steps, both pure functions of the request (no engine, no I/O):

1. :func:`parse_target` reads the request target, the ``Host`` header (once)
   and the copy-source header into a :class:`Target`: bucket and key for
   path-style and virtual-hosted-style requests, the decoded query.
2. :func:`route` maps a :class:`Target` to one endpoint value per S3
   operation (:class:`GetObject`, :class:`UploadPart`, ...), carrying the
   bucket, key, upload id, part number or copy source the operation names.

The front authenticates between the two steps, so an unsigned request is
refused before the router says anything about it (:class:`MethodNotAllowed`,
:class:`NotImplementedByGpufeed`).

A new S3 call is a new endpoint class here, a branch in :func:`route` and a
handler in the module of its family (``_objects``, ``_listing``,
``_multipart``, ``_buckets``, ``_bucketconfig``, ``_cors``; versioning and
policies get modules of their own). Sub-resources S3 has and gpufeed does not
implement are listed in :data:`UNSUPPORTED_BUCKET` and :data:`UNSUPPORTED_OBJECT`
and answered 501. Every ``OPTIONS`` request is a CORS preflight
(:class:`CorsPreflight`); the front lets it through without a signature.

Source: Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/;
the shape follows Garage ``src/api/s3/router.rs`` (``enum Endpoint``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from ..errors import InvalidArgument, MethodNotAllowed, NotImplementedByGpufeed

__all__ = [
    "Target", "parse_target", "bucket_from_host", "route", "UNSUPPORTED_BUCKET", "UNSUPPORTED_OBJECT", "Endpoint",
    "BucketEndpoint", "ObjectEndpoint", "ListBuckets", "HeadBucket", "CreateBucket", "DeleteBucket", "CreateSession",
    "GetBucketLocation", "GetBucketVersioning", "GetBucketAcl", "GetBucketLifecycleConfiguration",
    "PutBucketLifecycleConfiguration", "DeleteBucketLifecycle", "PutBucketAcl", "GetBucketConfiguration",
    "DeleteBucketConfiguration", "PutBucketCors", "PutBucketTagging", "PutBucketPolicy", "CorsPreflight",
    "PutObjectLockConfiguration", "GetObjectLockConfiguration", "BUCKET_CONFIGURATIONS", "STORED_CONFIGURATIONS",
    "ListObjects", "ListMultipartUploads", "DeleteObjects", "PostObject", "GetObject", "HeadObject",
    "GetObjectAcl", "PutObjectAcl", "GetObjectAttributes", "PutObjectRetention", "GetObjectRetention",
    "PutObjectLegalHold", "GetObjectLegalHold", "PutObjectTagging", "GetObjectTagging", "DeleteObjectTagging",
    "PutObject", "CopyObject", "DeleteObject", "CreateMultipartUpload", "UploadPart", "UploadPartCopy",
    "CompleteMultipartUpload", "AbortMultipartUpload", "ListParts", "PutBucketVersioning", "ListObjectVersions",
]

#: Bucket configurations with Get and Delete (:class:`GetBucketConfiguration`,
#: :class:`DeleteBucketConfiguration`): Get answers the stored document or S3's
#: "no such configuration" 404, Delete succeeds whether one was set or not.
BUCKET_CONFIGURATIONS = frozenset({"policy", "cors", "encryption", "website", "replication", "tagging"})
#: The configurations gpufeed stores (set with :class:`PutBucketCors`,
#: :class:`PutBucketTagging`, :class:`PutBucketPolicy`); setting any other is in
#: :data:`UNSUPPORTED_BUCKET`.
STORED_CONFIGURATIONS = frozenset({"cors", "tagging", "policy"})
#: Bucket sub-resources S3 has and gpufeed does not implement (answered 501).
UNSUPPORTED_BUCKET = frozenset({
    "website", "logging", "notification", "replication",
    "encryption", "requestPayment", "accelerate",
    "analytics", "inventory", "metrics", "ownershipControls", "publicAccessBlock",
    "intelligent-tiering", "policyStatus",
})
#: Object sub-resources S3 has and gpufeed does not implement (answered 501).
UNSUPPORTED_OBJECT = frozenset({
    "torrent", "restore", "select",
})

#: Every bucket sub-resource the router knows (a request naming two is refused).
_SUB_RESOURCES = UNSUPPORTED_BUCKET | BUCKET_CONFIGURATIONS | {
    "lifecycle", "acl", "location", "versioning", "versions", "uploads", "delete", "object-lock", "session"}

_PART_NUMBER_RANGE = "Part number must be an integer between 1 and 10000, inclusive"


# -- the request target ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Target:
    """The request line and the routing headers of one request, parsed once.

    Attributes:
        method: HTTP method (``GET``, ``PUT``, ...).
        raw_path: the path exactly as on the wire (still percent-encoded).
        raw_query: the query string as on the wire, without ``?``.
        path: ``raw_path`` percent-decoded (the S3 error ``Resource``).
        query: decoded query parameters; the first of repeated names wins.
        host: the ``Host`` header, or None.
        virtual_bucket: the bucket named by ``host`` (virtual-hosted style),
            or None for path style.
        bucket: the bucket addressed, or None (the service).
        key: the object key addressed, or None (the bucket itself).
        copy_source: the ``x-amz-copy-source`` header, or None.
    """

    method: str
    raw_path: str
    raw_query: str
    path: str
    query: dict[str, str]
    host: str | None
    virtual_bucket: str | None
    bucket: str | None
    key: str | None
    copy_source: str | None = None


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

    Args:
        host: the ``Host`` header value, or None.

    Returns:
        The bucket name, or None.
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


def parse_target(method: str, raw_target: str, headers: Mapping[str, str]) -> Target:
    """Parse a request line and its headers into a :class:`Target`.

    Never raises: a malformed percent escape is kept as decoded by
    :func:`urllib.parse.unquote`.

    Args:
        method: HTTP method.
        raw_target: the request target as on the wire (origin or absolute form).
        headers: the request headers, case-insensitive (``Host`` and
            ``x-amz-copy-source`` are read).

    Returns:
        The parsed target.
    """
    raw_path, raw_query = _split_target(raw_target)
    path = unquote(raw_path)
    host = headers.get("Host")
    virtual_bucket = bucket_from_host(host)
    rest = path[1:] if path.startswith("/") else path
    if virtual_bucket is not None:
        bucket, key = virtual_bucket, rest
    else:
        bucket, _, key = rest.partition("/")
    return Target(
        method=method, raw_path=raw_path, raw_query=raw_query, path=path,
        query=_parse_query(raw_query), host=host, virtual_bucket=virtual_bucket,
        bucket=bucket or None, key=key or None, copy_source=headers.get("x-amz-copy-source"),
    )


# -- endpoints ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Endpoint:
    """One S3 operation with the resource it names (base of every endpoint)."""


@dataclass(frozen=True, slots=True)
class BucketEndpoint(Endpoint):
    """An operation on one bucket.

    Attributes:
        bucket: the bucket name (not validated here; the engine checks it).
    """

    bucket: str


@dataclass(frozen=True, slots=True)
class ObjectEndpoint(BucketEndpoint):
    """An operation on one object.

    Attributes:
        key: the object key (not validated here; the engine checks it).
    """

    key: str


@dataclass(frozen=True, slots=True)
class ListBuckets(Endpoint):
    """``GET /``: ListBuckets."""


@dataclass(frozen=True, slots=True)
class HeadBucket(BucketEndpoint):
    """``HEAD /bucket``: HeadBucket."""


@dataclass(frozen=True, slots=True)
class CreateBucket(BucketEndpoint):
    """``PUT /bucket``: CreateBucket."""


@dataclass(frozen=True, slots=True)
class DeleteBucket(BucketEndpoint):
    """``DELETE /bucket``: DeleteBucket."""


@dataclass(frozen=True, slots=True)
class GetBucketLocation(BucketEndpoint):
    """``GET /bucket?location``: GetBucketLocation."""


@dataclass(frozen=True, slots=True)
class GetBucketVersioning(BucketEndpoint):
    """``GET /bucket?versioning``: GetBucketVersioning."""


@dataclass(frozen=True, slots=True)
class PutBucketVersioning(BucketEndpoint):
    """``PUT /bucket?versioning``: PutBucketVersioning."""


@dataclass(frozen=True, slots=True)
class ListObjectVersions(BucketEndpoint):
    """``GET /bucket?versions``: ListObjectVersions."""


@dataclass(frozen=True, slots=True)
class GetBucketAcl(BucketEndpoint):
    """``GET /bucket?acl``: GetBucketAcl."""


@dataclass(frozen=True, slots=True)
class GetBucketLifecycleConfiguration(BucketEndpoint):
    """``GET /bucket?lifecycle``: GetBucketLifecycleConfiguration."""


@dataclass(frozen=True, slots=True)
class PutBucketLifecycleConfiguration(BucketEndpoint):
    """``PUT /bucket?lifecycle``: PutBucketLifecycleConfiguration."""


@dataclass(frozen=True, slots=True)
class DeleteBucketLifecycle(BucketEndpoint):
    """``DELETE /bucket?lifecycle``: DeleteBucketLifecycle."""


_LIFECYCLE: dict[str, type[BucketEndpoint]] = {
    "GET": GetBucketLifecycleConfiguration,
    "PUT": PutBucketLifecycleConfiguration,
    "DELETE": DeleteBucketLifecycle,
}


@dataclass(frozen=True, slots=True)
class PutBucketAcl(BucketEndpoint):
    """``PUT /bucket?acl``: PutBucketAcl (only the owner's full control is accepted)."""


@dataclass(frozen=True, slots=True)
class GetBucketConfiguration(BucketEndpoint):
    """``GET /bucket?policy`` (``cors``, ``encryption``, ...): GetBucketPolicy and its kin.

    Attributes:
        config: the sub-resource, one of :data:`BUCKET_CONFIGURATIONS`.
    """

    config: str


@dataclass(frozen=True, slots=True)
class DeleteBucketConfiguration(BucketEndpoint):
    """``DELETE /bucket?policy`` (``cors``, ...): DeleteBucketPolicy and its kin.

    Attributes:
        config: the sub-resource, one of :data:`BUCKET_CONFIGURATIONS`.
    """

    config: str


@dataclass(frozen=True, slots=True)
class PutBucketCors(BucketEndpoint):
    """``PUT /bucket?cors``: PutBucketCors."""


@dataclass(frozen=True, slots=True)
class PutBucketTagging(BucketEndpoint):
    """``PUT /bucket?tagging``: PutBucketTagging."""


@dataclass(frozen=True, slots=True)
class PutBucketPolicy(BucketEndpoint):
    """``PUT /bucket?policy``: PutBucketPolicy."""


_PUT_CONFIGURATION: dict[str, type[BucketEndpoint]] = {
    "cors": PutBucketCors, "tagging": PutBucketTagging, "policy": PutBucketPolicy}


@dataclass(frozen=True, slots=True)
class CorsPreflight(Endpoint):
    """``OPTIONS`` on anything: a CORS preflight request (never authenticated).

    Attributes:
        bucket: the bucket addressed, or None (the service).
        key: the object key addressed, or None (the bucket itself).
    """

    bucket: str | None
    key: str | None


@dataclass(frozen=True, slots=True)
class PutObjectLockConfiguration(BucketEndpoint):
    """``PUT /bucket?object-lock``: PutObjectLockConfiguration."""


@dataclass(frozen=True, slots=True)
class GetObjectLockConfiguration(BucketEndpoint):
    """``GET /bucket?object-lock``: GetObjectLockConfiguration."""


@dataclass(frozen=True, slots=True)
class ListObjects(BucketEndpoint):
    """``GET /bucket``: ListObjects, or ListObjectsV2 with ``list-type=2``.

    Attributes:
        v2: ListObjectsV2 (continuation tokens) rather than ListObjects (markers).
    """

    v2: bool = False


@dataclass(frozen=True, slots=True)
class CreateSession(BucketEndpoint):
    """``GET /bucket?session``: CreateSession (temporary credentials for a directory bucket)."""


@dataclass(frozen=True, slots=True)
class ListMultipartUploads(BucketEndpoint):
    """``GET /bucket?uploads``: ListMultipartUploads."""


@dataclass(frozen=True, slots=True)
class DeleteObjects(BucketEndpoint):
    """``POST /bucket?delete``: DeleteObjects."""


@dataclass(frozen=True, slots=True)
class PostObject(BucketEndpoint):
    """``POST /bucket`` with a ``multipart/form-data`` body: POST Object (browser form upload)."""


@dataclass(frozen=True, slots=True)
class GetObject(ObjectEndpoint):
    """``GET /bucket/key``: GetObject."""


@dataclass(frozen=True, slots=True)
class HeadObject(ObjectEndpoint):
    """``HEAD /bucket/key``: HeadObject."""


@dataclass(frozen=True, slots=True)
class GetObjectAcl(ObjectEndpoint):
    """``GET /bucket/key?acl`` (and ``HEAD``): GetObjectAcl."""


@dataclass(frozen=True, slots=True)
class PutObjectAcl(ObjectEndpoint):
    """``PUT /bucket/key?acl``: PutObjectAcl (only the owner's full control is accepted)."""


@dataclass(frozen=True, slots=True)
class GetObjectAttributes(ObjectEndpoint):
    """``GET /bucket/key?attributes`` (and ``HEAD``): GetObjectAttributes."""


@dataclass(frozen=True, slots=True)
class PutObjectRetention(ObjectEndpoint):
    """``PUT /bucket/key?retention``: PutObjectRetention."""


@dataclass(frozen=True, slots=True)
class GetObjectRetention(ObjectEndpoint):
    """``GET /bucket/key?retention``: GetObjectRetention."""


@dataclass(frozen=True, slots=True)
class PutObjectLegalHold(ObjectEndpoint):
    """``PUT /bucket/key?legal-hold``: PutObjectLegalHold."""


@dataclass(frozen=True, slots=True)
class GetObjectLegalHold(ObjectEndpoint):
    """``GET /bucket/key?legal-hold``: GetObjectLegalHold."""


@dataclass(frozen=True, slots=True)
class PutObjectTagging(ObjectEndpoint):
    """``PUT /bucket/key?tagging``: PutObjectTagging."""


@dataclass(frozen=True, slots=True)
class GetObjectTagging(ObjectEndpoint):
    """``GET /bucket/key?tagging`` (and ``HEAD``): GetObjectTagging."""


@dataclass(frozen=True, slots=True)
class DeleteObjectTagging(ObjectEndpoint):
    """``DELETE /bucket/key?tagging``: DeleteObjectTagging."""


#: Object sub-resource -> method -> endpoint (object lock and tagging).
_OBJECT_SETTINGS: dict[str, dict[str, type[ObjectEndpoint]]] = {
    "retention": {"GET": GetObjectRetention, "HEAD": GetObjectRetention, "PUT": PutObjectRetention},
    "legal-hold": {"GET": GetObjectLegalHold, "HEAD": GetObjectLegalHold, "PUT": PutObjectLegalHold},
    "tagging": {"GET": GetObjectTagging, "HEAD": GetObjectTagging, "PUT": PutObjectTagging,
                "DELETE": DeleteObjectTagging},
}


@dataclass(frozen=True, slots=True)
class PutObject(ObjectEndpoint):
    """``PUT /bucket/key``: PutObject."""


@dataclass(frozen=True, slots=True)
class CopyObject(ObjectEndpoint):
    """``PUT /bucket/key`` with ``x-amz-copy-source``: CopyObject.

    Attributes:
        source_bucket, source_key: the object copied.
        source_version_id: the source version (``?versionId=`` of the copy
            source), or None for the current one.
    """

    source_bucket: str
    source_key: str
    source_version_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteObject(ObjectEndpoint):
    """``DELETE /bucket/key``: DeleteObject."""


@dataclass(frozen=True, slots=True)
class CreateMultipartUpload(ObjectEndpoint):
    """``POST /bucket/key?uploads``: CreateMultipartUpload."""


@dataclass(frozen=True, slots=True)
class UploadPart(ObjectEndpoint):
    """``PUT /bucket/key?uploadId=U&partNumber=N``: UploadPart.

    Attributes:
        upload_id: the multipart upload (non-empty).
        part_number: 1 to 10000.
    """

    upload_id: str
    part_number: int


@dataclass(frozen=True, slots=True)
class UploadPartCopy(UploadPart):
    """UploadPart with ``x-amz-copy-source``: UploadPartCopy.

    Attributes:
        source_bucket, source_key: the object the part is copied from.
        source_version_id: as for :class:`CopyObject`.
    """

    source_bucket: str
    source_key: str
    source_version_id: str | None = None


@dataclass(frozen=True, slots=True)
class CompleteMultipartUpload(ObjectEndpoint):
    """``POST /bucket/key?uploadId=U``: CompleteMultipartUpload."""

    upload_id: str


@dataclass(frozen=True, slots=True)
class AbortMultipartUpload(ObjectEndpoint):
    """``DELETE /bucket/key?uploadId=U``: AbortMultipartUpload."""

    upload_id: str


@dataclass(frozen=True, slots=True)
class ListParts(ObjectEndpoint):
    """``GET /bucket/key?uploadId=U``: ListParts."""

    upload_id: str


# -- routing -----------------------------------------------------------------------

def _not_allowed() -> MethodNotAllowed:
    return MethodNotAllowed("The specified method is not allowed against this resource.")


def _copy_source(value: str) -> tuple[str, str, str | None]:
    """``x-amz-copy-source`` (``[/]bucket/key[?versionId=...]``, percent-encoded)
    -> (bucket, key, version id or None); the engine checks the version id's form."""
    src = value.strip()
    src, _, query = src.partition("?")
    src = unquote(src).lstrip("/")
    bucket, _, key = src.partition("/")
    if not bucket or not key:
        raise InvalidArgument("Copy Source must mention the source bucket and key: sourcebucket/sourcekey")
    version = _parse_query(query).get("versionId") if query else None
    if version == "":
        raise InvalidArgument("Version id cannot be the empty string", argument="x-amz-copy-source")
    return bucket, key, version


def _part(query: Mapping[str, str]) -> tuple[str, int]:
    """The ``uploadId`` and ``partNumber`` of an UploadPart(Copy)."""
    upload_id = query.get("uploadId")
    if not upload_id:
        raise InvalidArgument("uploadId is required with partNumber")
    try:
        number = int(query.get("partNumber", ""))
    except ValueError as exc:
        raise InvalidArgument(_PART_NUMBER_RANGE) from exc
    if not 1 <= number <= 10000:
        raise InvalidArgument(_PART_NUMBER_RANGE)
    return upload_id, number


def route(target: Target) -> Endpoint:
    """The S3 operation a request asks for.

    Args:
        target: the parsed request (:func:`parse_target`).

    Returns:
        One endpoint value.

    Raises:
        MethodNotAllowed: the method means nothing for that resource (405).
        NotImplementedByGpufeed: an S3 operation gpufeed does not implement (501).
        InvalidArgument: a malformed upload id, part number or copy source (400).
    """
    if target.method == "OPTIONS":
        return CorsPreflight(target.bucket, target.key)
    if target.bucket is None:
        if target.method in ("GET", "HEAD"):
            return ListBuckets()
        raise _not_allowed()
    if target.key is None:
        return _route_bucket(target.method, target.query, target.bucket)
    return _route_object(target, target.bucket, target.key)


def _route_bucket(method: str, q: dict[str, str], bucket: str) -> Endpoint:
    configs = BUCKET_CONFIGURATIONS & q.keys()
    if len(configs) == 1 and not (_SUB_RESOURCES - configs) & q.keys():
        # one configuration named alone (with several, the 501 below names one)
        config = next(iter(configs))
        if method == "GET":
            return GetBucketConfiguration(bucket, config)
        if method == "DELETE":
            return DeleteBucketConfiguration(bucket, config)
        if method == "PUT" and config in _PUT_CONFIGURATION:
            return _PUT_CONFIGURATION[config](bucket)
    unsupported = (UNSUPPORTED_BUCKET | configs) & q.keys()
    if unsupported:
        raise NotImplementedByGpufeed(f"bucket sub-resource {sorted(unsupported)[0]!r} is not implemented")
    if "lifecycle" in q and method in _LIFECYCLE:
        return _LIFECYCLE[method](bucket)
    if "object-lock" in q:
        if method not in ("GET", "PUT"):
            raise _not_allowed()
        return GetObjectLockConfiguration(bucket) if method == "GET" else PutObjectLockConfiguration(bucket)
    if ("versioning" in q and method not in ("GET", "HEAD", "PUT")) or \
            ("versions" in q and method not in ("GET", "HEAD")):
        raise _not_allowed()
    if method == "GET":
        if "location" in q:
            return GetBucketLocation(bucket)
        if "versioning" in q:
            return GetBucketVersioning(bucket)
        if "versions" in q:
            return ListObjectVersions(bucket)
        if "acl" in q:
            return GetBucketAcl(bucket)
        if "uploads" in q:
            return ListMultipartUploads(bucket)
        return CreateSession(bucket) if "session" in q else ListObjects(bucket, v2=q.get("list-type") == "2")
    if method == "HEAD":
        return HeadBucket(bucket)
    if method == "PUT":
        if "acl" in q:
            return PutBucketAcl(bucket)
        if "versioning" in q:
            return PutBucketVersioning(bucket)
        if q.keys() - {"x-id"}:
            raise NotImplementedByGpufeed(f"PUT bucket ?{next(iter(q))} is not implemented")
        return CreateBucket(bucket)
    if method == "DELETE":
        return DeleteBucket(bucket)
    if method == "POST" and "delete" in q:
        return DeleteObjects(bucket)
    if method == "POST" and not q:
        return PostObject(bucket)
    raise _not_allowed()


def _route_object(target: Target, bucket: str, key: str) -> Endpoint:
    method, q = target.method, target.query
    unsupported = UNSUPPORTED_OBJECT & q.keys()
    if unsupported:
        raise NotImplementedByGpufeed(f"object sub-resource {sorted(unsupported)[0]!r} is not implemented")
    for name, endpoints in _OBJECT_SETTINGS.items():
        if name in q:
            if method not in endpoints:
                raise _not_allowed()
            return endpoints[method](bucket, key)
    if method in ("GET", "HEAD"):
        if "uploadId" in q and method == "GET":
            return ListParts(bucket, key, q["uploadId"])
        if "acl" in q:
            return GetObjectAcl(bucket, key)
        if "attributes" in q:
            return GetObjectAttributes(bucket, key)
        return GetObject(bucket, key) if method == "GET" else HeadObject(bucket, key)
    if method == "PUT":
        return _route_object_put(target, bucket, key)
    if method == "DELETE":
        if "uploadId" in q:
            return AbortMultipartUpload(bucket, key, q["uploadId"])
        return DeleteObject(bucket, key)
    if method == "POST":
        if "uploads" in q:
            return CreateMultipartUpload(bucket, key)
        if "uploadId" in q:
            return CompleteMultipartUpload(bucket, key, q["uploadId"])
        raise NotImplementedByGpufeed("this POST operation is not implemented")
    raise _not_allowed()


def _route_object_put(target: Target, bucket: str, key: str) -> Endpoint:
    q = target.query
    if "acl" in q:
        return PutObjectAcl(bucket, key)
    if "uploadId" in q or "partNumber" in q:
        upload_id, number = _part(q)
        if target.copy_source is not None:
            return UploadPartCopy(bucket, key, upload_id, number, *_copy_source(target.copy_source))
        return UploadPart(bucket, key, upload_id, number)
    if target.copy_source is not None:
        return CopyObject(bucket, key, *_copy_source(target.copy_source))
    return PutObject(bucket, key)
