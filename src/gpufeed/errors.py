"""The whole gpufeed exception tree, and the table that maps each error to S3.

Every layer raises these; low-level errors (``OSError``, ``sqlite3.Error``,
socket errors) are translated at one boundary with ``raise Specific(msg) from exc``.
The S3 front turns an error into ``<Error><Code>...</Code>`` XML with
:data:`S3_ERRORS`; the fast-path wire protocol sends the same code string and
the client re-raises the same class with :func:`error_from_code`.

Tree::

    GpufeedError
    ├── NotFoundError (FileNotFoundError)
    │   ├── NoSuchBucket
    │   ├── NoSuchKey
    │   ├── NoSuchUpload
    │   ├── NoSuchLifecycleConfiguration
    │   ├── NoSuchVersion
    │   ├── NoSuchObjectLockConfiguration  (a version with no retention / legal hold)
    │   ├── ObjectLockConfigurationNotFoundError  (a bucket without object lock)
    │   ├── NoSuchTenant
    │   ├── NoSuchAccessKey
    │   ├── NoSuchSnapshot
    │   ├── NoSuchReplicationRule  (the bucket has no replication rule on this node)
    │   └── NoSuchConfiguration  (its code names the configuration: NoSuchBucketPolicy, ...)
    ├── AccessError (PermissionError)
    │   ├── AccessDenied
    │   ├── QuotaExceeded     (a write past a tenant's or bucket's quota)
    │   ├── InvalidAccessKeyId
    │   ├── SignatureDoesNotMatch
    │   ├── RequestExpired
    │   ├── RequestTimeTooSkewed
    │   ├── ExpiredToken         (400: a session token past its expiration)
    │   ├── InvalidToken         (400: a session token we did not issue, or not the key's)
    │   └── CORSForbidden        (403 AccessForbidden: a CORS preflight refused)
    ├── ConflictError
    │   ├── BucketAlreadyOwnedByYou
    │   ├── BucketNotEmpty
    │   ├── InvalidBucketState
    │   ├── DataFolderInUse   (another node holds the data folder; not an S3 answer)
    │   ├── CatalogInUse      (another deployment owns the PostgreSQL catalog; not an S3 answer)
    │   ├── NodeIdInUse       (a live cluster member already has this node id; not an S3 answer)
    │   ├── TenantAlreadyExists
    │   ├── TenantNotEmpty    (it still owns buckets)
    │   ├── BucketAlreadyExists  (the name is another tenant's)
    │   ├── SnapshotAlreadyExists
    │   └── PreconditionFailed
    ├── InvalidRequestError (ValueError)
    │   ├── InvalidBucketName
    │   ├── KeyTooLong
    │   ├── InvalidArgument
    │   ├── InvalidTag
    │   ├── InvalidTenantName
    │   ├── InvalidRange
    │   │   └── InvalidCopySourceRange  (400, code InvalidRange)
    │   ├── BadDigest
    │   ├── EntityTooSmall
    │   ├── EntityTooLarge
    │   ├── MetadataTooLarge
    │   ├── InvalidLocationConstraint
    │   ├── InvalidStorageClass
    │   ├── IllegalLocationConstraint  (code IllegalLocationConstraintException)
    │   ├── InvalidPart
    │   │   └── InvalidPartNumber  (416: GET/HEAD of a part the object does not have)
    │   ├── InvalidPartOrder
    │   ├── MalformedXML
    │   ├── MalformedPolicy       (a bucket policy refused, with AWS's reason)
    │   ├── IncompleteBody
    │   ├── InvalidDigest
    │   ├── XAmzContentSHA256Mismatch
    │   ├── AuthorizationHeaderMalformed
    │   ├── AuthorizationQueryParametersError
    │   ├── RequestTimeout        (the body stopped arriving)
    │   ├── AccessControlListNotSupported
    │   ├── InvalidPolicyDocument
    │   ├── MalformedPOSTRequest
    │   ├── MissingContentLength  (411)
    │   ├── MethodNotAllowed      (405)
    │   ├── BadRequest            (S3's generic 400: too many bucket tags, a preflight without Origin)
    │   └── MaxMessageLengthExceeded  (a configuration document over its size limit)
    ├── NotModified            (304 for conditional GET; not really an error)
    ├── SlowDown               (503: a client holds too many connections)
    ├── ReplicationTargetUnavailable  (503: a replication round could not reach its target)
    ├── NotImplementedByGpufeed
    ├── ProtocolError          (fast path: malformed or truncated frame)
    ├── FormatError (ValueError)  stored bytes not in their format: KV chunk /
    │                             plugin object headers (ChunkFormatError,
    │                             ObjectFormatError, beside their code)
    ├── ChunkCorrupt (500)  a stored chunk that does not decode to its size or
    │                       match its digest (names bucket, key, chunk when known)
    ├── TransportError (ConnectionError)  (fast path: connection lost / refused)
    ├── StorageFull            (507: the data folder reached its capacity)
    └── InternalError
        ├── DamagedObject      (500: stored data failed its check on read)
        ├── CatalogDamaged     (the catalog fails its integrity check; not an S3 answer)
        ├── ServiceUnavailable (503: something the request needs cannot be reached now)
        │   ├── CatalogUnavailable (the catalog's database)
        │   └── HolderUnavailable  (the cluster node that holds the data)
        └── CatalogTooNew      (the catalog was written by a newer gpufeed)

Source for codes and statuses: "Error responses", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html
"""

from __future__ import annotations

__all__ = [
    "GpufeedError", "NotFoundError", "NoSuchBucket", "NoSuchKey", "NoSuchUpload", "NoSuchLifecycleConfiguration",
    "NoSuchConfiguration", "NoSuchVersion", "NoSuchObjectLockConfiguration", "ObjectLockConfigurationNotFoundError",
    "NoSuchTenant", "NoSuchAccessKey", "NoSuchReplicationRule", "NoSuchSnapshot", "SnapshotAlreadyExists",
    "TenantAlreadyExists", "TenantNotEmpty", "BucketAlreadyExists", "InvalidTenantName", "AccessError",
    "AccessDenied", "QuotaExceeded", "InvalidAccessKeyId", "SignatureDoesNotMatch", "RequestExpired",
    "CORSForbidden", "ConflictError", "BucketAlreadyOwnedByYou", "BucketNotEmpty", "InvalidBucketState",
    "DataFolderInUse", "CatalogInUse", "NodeIdInUse", "CatalogUnavailable", "PreconditionFailed",
    "InvalidRequestError", "InvalidBucketName", "KeyTooLong", "InvalidArgument", "InvalidTag", "InvalidRange",
    "InvalidCopySourceRange", "AccessControlListNotSupported", "InvalidPolicyDocument", "MalformedPOSTRequest",
    "BadDigest", "EntityTooSmall", "EntityTooLarge", "MetadataTooLarge", "InvalidLocationConstraint",
    "InvalidStorageClass", "IllegalLocationConstraint", "InvalidPart", "InvalidPartNumber", "InvalidPartOrder",
    "MalformedXML", "MalformedPolicy", "IncompleteBody", "InvalidDigest", "XAmzContentSHA256Mismatch",
    "AuthorizationHeaderMalformed", "AuthorizationQueryParametersError", "MissingContentLength", "MethodNotAllowed",
    "BadRequest", "MaxMessageLengthExceeded", "RequestTimeTooSkewed", "ExpiredToken", "InvalidToken",
    "RequestTimeout", "SlowDown", "ReplicationTargetUnavailable", "NotModified", "NotImplementedByGpufeed",
    "ProtocolError", "TransportError", "InternalError", "DamagedObject", "StorageFull", "CatalogDamaged",
    "CatalogTooNew", "FormatError", "ChunkCorrupt", "S3_ERRORS", "error_from_code", "HolderUnavailable",
    "ServiceUnavailable",
]


class GpufeedError(Exception):
    """Base of every error gpufeed raises on purpose.

    Attributes:
        code: the S3 error code string (``"NoSuchKey"``), also used on the wire.
        status: the HTTP status the S3 front answers with.
    """

    code: str = "InternalError"
    status: int = 500

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details = details


class NotFoundError(GpufeedError, FileNotFoundError):
    code, status = "NotFound", 404


class NoSuchBucket(NotFoundError):
    code, status = "NoSuchBucket", 404


class NoSuchKey(NotFoundError):
    code, status = "NoSuchKey", 404


class NoSuchUpload(NotFoundError):
    code, status = "NoSuchUpload", 404


class NoSuchLifecycleConfiguration(NotFoundError):
    code, status = "NoSuchLifecycleConfiguration", 404


class NoSuchConfiguration(NotFoundError):
    """A bucket configuration (policy, CORS, website, ...) that is not set. S3
    has one code per configuration, so the instance carries it: ``code``
    (``"NoSuchBucketPolicy"``, ``"NoSuchCORSConfiguration"``, ...)."""

    code, status = "NoSuchConfiguration", 404

    def __init__(self, message: str = "", *, code: str | None = None, **details: object) -> None:
        super().__init__(message, **details)
        if code is not None:
            self.code = code


class NoSuchVersion(NotFoundError):
    code, status = "NoSuchVersion", 404


class NoSuchObjectLockConfiguration(NotFoundError):
    """The object version has no retention (or no legal hold) to answer."""
    code, status = "NoSuchObjectLockConfiguration", 404


class ObjectLockConfigurationNotFoundError(NotFoundError):
    """The bucket was not made with object lock."""
    code, status = "ObjectLockConfigurationNotFoundError", 404


class NoSuchTenant(NotFoundError):
    code, status = "NoSuchTenant", 404


class NoSuchAccessKey(NotFoundError):
    code, status = "NoSuchAccessKey", 404


class NoSuchSnapshot(NotFoundError):
    """No snapshot of that name in the bucket (gpufeed's own code)."""
    code, status = "NoSuchSnapshot", 404


class NoSuchReplicationRule(NotFoundError):
    """The bucket has no replication rule on this node (gpufeed's own code)."""
    code, status = "NoSuchReplicationRule", 404


class AccessError(GpufeedError, PermissionError):
    code, status = "AccessDenied", 403


class AccessDenied(AccessError):
    code, status = "AccessDenied", 403


class QuotaExceeded(AccessError):
    """The write would take a bucket or its tenant past its quota (bytes or object versions)."""
    code, status = "QuotaExceeded", 403


class InvalidAccessKeyId(AccessError):
    code, status = "InvalidAccessKeyId", 403


class SignatureDoesNotMatch(AccessError):
    code, status = "SignatureDoesNotMatch", 403


class RequestExpired(AccessError):
    # S3 answers an expired presigned URL with AccessDenied "Request has expired".
    code, status = "AccessDenied", 403


class ConflictError(GpufeedError):
    code, status = "Conflict", 409


class BucketAlreadyOwnedByYou(ConflictError):
    code, status = "BucketAlreadyOwnedByYou", 409


class BucketNotEmpty(ConflictError):
    code, status = "BucketNotEmpty", 409


class InvalidBucketState(ConflictError):
    """The request does not fit the bucket's state (suspending versioning under object lock, ...)."""
    code, status = "InvalidBucketState", 409


class DataFolderInUse(ConflictError):
    """Another engine (another node process) has the data folder open; the message names its pid."""
    code, status = "DataFolderInUse", 409


class CatalogInUse(ConflictError):
    """The PostgreSQL catalog belongs to another deployment (another node's data
    folder, or another cluster): the node refuses to start rather than read rows
    that name data it does not hold. Not an S3 answer."""

    code, status = "CatalogInUse", 409


class NodeIdInUse(ConflictError):
    """A live member of the cluster already has this node's id (its data folder
    was copied, or started twice on different hosts): the second one refuses
    to start; the message names the member that holds the id. Not an S3 answer."""

    code, status = "NodeIdInUse", 409


class TenantAlreadyExists(ConflictError):
    code, status = "TenantAlreadyExists", 409


class TenantNotEmpty(ConflictError):
    """The tenant still owns buckets."""
    code, status = "TenantNotEmpty", 409


class BucketAlreadyExists(ConflictError):
    """The bucket name is taken by another tenant."""
    code, status = "BucketAlreadyExists", 409


class SnapshotAlreadyExists(ConflictError):
    """The bucket has a snapshot of that name already (gpufeed's own code)."""
    code, status = "SnapshotAlreadyExists", 409


class PreconditionFailed(ConflictError):
    code, status = "PreconditionFailed", 412


class InvalidRequestError(GpufeedError, ValueError):
    code, status = "InvalidRequest", 400


class InvalidBucketName(InvalidRequestError):
    code, status = "InvalidBucketName", 400


class KeyTooLong(InvalidRequestError):
    code, status = "KeyTooLongError", 400


class InvalidArgument(InvalidRequestError):
    code, status = "InvalidArgument", 400


class InvalidTag(InvalidRequestError):
    """A tag set S3 refuses: over its limits (count, key or value length), a
    reserved ``aws:`` key, characters outside its alphabet, a duplicate key."""
    code, status = "InvalidTag", 400


class InvalidTenantName(InvalidRequestError):
    code, status = "InvalidTenantName", 400


class InvalidRange(InvalidRequestError):
    code, status = "InvalidRange", 416


class InvalidCopySourceRange(InvalidRange):
    """``x-amz-copy-source-range`` past the end of the source: 400, not 416."""

    code, status = "InvalidRange", 400


class AccessControlListNotSupported(InvalidRequestError):
    """An ACL other than the owner's full control (gpufeed buckets enforce bucket ownership)."""

    code, status = "AccessControlListNotSupported", 400


class InvalidPolicyDocument(InvalidRequestError):
    """A browser-form POST whose policy document is not one S3 accepts."""

    code, status = "InvalidPolicyDocument", 400


class MalformedPOSTRequest(InvalidRequestError):
    """A browser-form POST whose body is not well-formed multipart/form-data."""

    code, status = "MalformedPOSTRequest", 400


class BadDigest(InvalidRequestError):
    code, status = "BadDigest", 400


class EntityTooSmall(InvalidRequestError):
    code, status = "EntityTooSmall", 400


class MetadataTooLarge(InvalidRequestError):
    code, status = "MetadataTooLarge", 400


class EntityTooLarge(InvalidRequestError):
    code, status = "EntityTooLarge", 400


class InvalidLocationConstraint(InvalidRequestError):
    """A CreateBucket ``LocationConstraint`` S3 does not accept (``us-east-1`` itself)."""

    code, status = "InvalidLocationConstraint", 400


class InvalidStorageClass(InvalidRequestError):
    """An ``x-amz-storage-class`` that is no S3 storage class."""

    code, status = "InvalidStorageClass", 400


class IllegalLocationConstraint(InvalidRequestError):
    """A CreateBucket ``LocationConstraint`` (or none) other than the node's region."""

    code, status = "IllegalLocationConstraintException", 400


class InvalidPart(InvalidRequestError):
    code, status = "InvalidPart", 400


class InvalidPartNumber(InvalidPart):
    """A GetObject / HeadObject ``partNumber`` the object does not have."""

    code, status = "InvalidPartNumber", 416


class InvalidPartOrder(InvalidRequestError):
    code, status = "InvalidPartOrder", 400


class MalformedXML(InvalidRequestError):
    code, status = "MalformedXML", 400


class MalformedPolicy(InvalidRequestError):
    """A PutBucketPolicy document refused; the message is AWS's reason
    ("Policy has invalid resource", "Invalid principal in policy", ...)."""

    code, status = "MalformedPolicy", 400


class IncompleteBody(InvalidRequestError):
    code, status = "IncompleteBody", 400


class InvalidDigest(InvalidRequestError):
    """``Content-MD5`` (or an ``x-amz-checksum-*`` header) is not valid base64 of the right length."""

    code, status = "InvalidDigest", 400


class XAmzContentSHA256Mismatch(InvalidRequestError):
    """The body's SHA-256 differs from the ``x-amz-content-sha256`` the client signed."""

    code, status = "XAmzContentSHA256Mismatch", 400


class AuthorizationHeaderMalformed(InvalidRequestError):
    code, status = "AuthorizationHeaderMalformed", 400


class AuthorizationQueryParametersError(InvalidRequestError):
    code, status = "AuthorizationQueryParametersError", 400


class MissingContentLength(InvalidRequestError):
    code, status = "MissingContentLength", 411


class MethodNotAllowed(InvalidRequestError):
    code, status = "MethodNotAllowed", 405


class BadRequest(InvalidRequestError):
    """S3's generic 400 ``BadRequest`` (more than 50 bucket tags; a CORS
    preflight without an ``Origin`` header)."""

    code, status = "BadRequest", 400


class MaxMessageLengthExceeded(InvalidRequestError):
    """A request document over its size limit (a CORS configuration over 64 KiB)."""

    code, status = "MaxMessageLengthExceeded", 400


class CORSForbidden(AccessError):
    """A CORS preflight (``OPTIONS``) that no rule of the bucket allows, or a
    bucket without CORS rules: S3 answers 403 ``AccessForbidden``."""

    code, status = "AccessForbidden", 403


class RequestTimeTooSkewed(AccessError):
    """The signed ``X-Amz-Date`` is more than 15 minutes from the server's clock."""

    code, status = "RequestTimeTooSkewed", 403


class ExpiredToken(AccessError):
    """A session token (``x-amz-s3session-token``) past its expiration."""

    code, status = "ExpiredToken", 400


class InvalidToken(AccessError):
    """A session token that is malformed, not ours, or not the signing key's."""

    code, status = "InvalidToken", 400


class RequestTimeout(InvalidRequestError):
    """The request body stopped arriving for longer than the S3 body timeout."""

    code, status = "RequestTimeout", 400


class SlowDown(GpufeedError):
    """Refused to spare the node: the client address holds too many connections."""

    code, status = "SlowDown", 503


class ReplicationTargetUnavailable(GpufeedError):
    """A replication round broke off (target unreachable, connection broken, node stopping)."""
    code, status = "ReplicationTargetUnavailable", 503


class NotModified(GpufeedError):
    code, status = "NotModified", 304


class NotImplementedByGpufeed(GpufeedError):
    code, status = "NotImplemented", 501


class ProtocolError(GpufeedError):
    """A fast-path frame was malformed, truncated or of an unknown version."""

    code, status = "ProtocolError", 400


class FormatError(GpufeedError, ValueError):
    """Stored bytes that do not follow their format (a KV chunk or plugin object
    header); the KV readers treat such an object as a cache miss."""

    code, status = "InvalidObjectFormat", 500


class ChunkCorrupt(GpufeedError):
    """A stored chunk is damaged: its compressed stream does not decode, decodes
    to the wrong length, or its bytes do not match their digest or block sums.

    Never returned as data. The codec layer raises it without context; the
    engine names the object with :meth:`attach` before it reaches a front.

    Attributes:
        bucket: the bucket of the object being read, or ``None``.
        key: the object key, or ``None``.
        chunk: the chunk's id (digest hex or index), or ``None``.
    """

    code, status = "ChunkCorrupt", 500

    def __init__(self, message: str = "", *, bucket: str | None = None, key: str | None = None,
                 chunk: str | None = None, **details: object) -> None:
        super().__init__(message, **details)
        self.bucket, self.key, self.chunk = bucket, key, chunk
        self._reason = self.message
        self._describe()

    def attach(self, *, bucket: str | None = None, key: str | None = None,
               chunk: str | None = None) -> ChunkCorrupt:
        """Name the damaged object and chunk (fields left ``None`` keep their value).

        Returns:
            ``self``, so ``raise err.attach(bucket=b, key=k) from None`` reads in one line.
        """
        self.bucket = bucket if bucket is not None else self.bucket
        self.key = key if key is not None else self.key
        self.chunk = chunk if chunk is not None else self.chunk
        self._describe()
        return self

    def _describe(self) -> None:
        where = ", ".join(f"{name} {value!r}" for name, value in
                          (("bucket", self.bucket), ("key", self.key), ("chunk", self.chunk)) if value is not None)
        self.message = f"{self._reason} ({where})" if where else self._reason
        self.args = (self.message,)


class TransportError(GpufeedError, ConnectionError):
    """The fast-path connection failed (refused, reset, closed mid-frame)."""

    code, status = "TransportError", 503


class InternalError(GpufeedError):
    code, status = "InternalError", 500


class DamagedObject(InternalError):
    """Stored data failed its check on read (a chunk whose bytes do not match
    their sums, a short or missing data file, a compressed chunk that does not
    decompress): nothing of it was returned as good data. The message names
    the bucket, key and chunk; the chunk is marked damaged and ``gpufeed scrub``
    reports it. Not an S3 code (S3 has none for this); status 500."""
    code, status = "DamagedObject", 500

    def __init__(self, message: str = "", *, chunk: str = "", **details: object) -> None:
        super().__init__(message, chunk=chunk, **details)
        self.chunk = chunk


class StorageFull(GpufeedError):
    """The node's data folder has reached its configured capacity (or the disk
    is full): the write was refused and nothing of it was kept; reads still work.
    Status 507 (HTTP Insufficient Storage); not an S3 code."""
    code, status = "StorageFull", 507


class CatalogDamaged(InternalError):
    """The catalog file fails its integrity check (not a database, truncated,
    damaged pages, tables missing) or is missing while data files exist. The
    file is left as it was; the message names the problems and the command
    that recovers it (``gpufeed catalog recover``)."""

    code, status = "CatalogDamaged", 500


class ServiceUnavailable(InternalError):
    """Something the request needs cannot be reached now: S3's
    ``ServiceUnavailable`` (503), which SDKs retry with back-off. The fast-path
    client raises this class for the code; the node raises a kind of it."""

    code, status = "ServiceUnavailable", 503


class CatalogUnavailable(ServiceUnavailable):
    """The catalog's database cannot be reached or failed mid-request (server
    down, connection lost, no pooled connection free in time): nothing of the
    request was committed; retrying once the database is back succeeds. S3's
    ``ServiceUnavailable`` (503), which SDKs retry with back-off; the message
    names the database (``host:port/dbname``, never a password)."""

    code, status = "ServiceUnavailable", 503


class HolderUnavailable(ServiceUnavailable):
    """A cluster node was asked for data whose data file another node holds, and
    that node is not live (expired, left) or did not answer within the fetch
    timeout. S3's ``ServiceUnavailable`` (503); the message names the bucket,
    key, chunk, holder and the reason."""

    code, status = "ServiceUnavailable", 503


class CatalogTooNew(InternalError):
    """The catalog's schema version is newer than this gpufeed's: a newer
    gpufeed wrote it, and this one refuses to open what it cannot read."""

    code, status = "CatalogTooNew", 500


def _all_subclasses(cls: type[GpufeedError]) -> list[type[GpufeedError]]:
    out: list[type[GpufeedError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


#: Map of S3 error code -> (exception class, HTTP status). Where two classes
#: share a code (RequestExpired answers as AccessDenied) the more general wins.
S3_ERRORS: dict[str, tuple[type[GpufeedError], int]] = {}
_ERROR_CLASSES: list[type[GpufeedError]] = [GpufeedError, *_all_subclasses(GpufeedError)]
for _cls in _ERROR_CLASSES:
    S3_ERRORS.setdefault(_cls.code, (_cls, _cls.status))
# AccessError is a family, not an answer: the code AccessDenied rebuilds as
# AccessDenied itself (handlers of AccessError or PermissionError still catch it).
S3_ERRORS[AccessDenied.code] = (AccessDenied, AccessDenied.status)


def error_from_code(code: str, message: str = "") -> GpufeedError:
    """Rebuild the typed exception for an error code received on the wire.

    Args:
        code: an S3 error code such as ``"NoSuchKey"``.
        message: the human-readable message that came with it.

    Returns:
        An instance of the matching class, :class:`GpufeedError` for unknown codes.
    """
    cls = S3_ERRORS.get(code, (GpufeedError, 500))[0]
    err = cls(message or code)
    if cls is GpufeedError:
        err.code = code
    return err
