"""Directory buckets on the S3 front (S3 Express One Zone): creation, sessions, refusals.

- **CreateBucket** of a ``base--zone-id--x-s3`` name with a
  ``CreateBucketConfiguration`` naming ``Location`` (``Type``
  ``AvailabilityZone``, ``Name`` the zone id of the name) and ``Bucket``
  (``DataRedundancy`` ``SingleAvailabilityZone``, ``Type`` ``Directory``)
  makes an engine bucket of kind ``"directory"`` (:func:`create_directory_bucket`).
  Without that configuration the name is a general purpose name, which may not
  end in ``--x-s3`` (``InvalidBucketName``).
- **CreateSession** (``GET /bucket?session``) hands out temporary credentials
  (access key, secret, session token; they expire after :data:`SESSION_TTL_S`)
  acting for the caller's key, for that bucket only, ``ReadWrite`` or
  ``ReadOnly`` (``x-amz-create-session-mode``). A request signed with them
  (SigV4, service ``s3express``) carries the token in ``x-amz-s3session-token``
  (or ``X-Amz-S3session-Token`` in a presigned query). Sessions live in the
  node's memory (:class:`SessionKeyRing`): a restart ends them, and a session
  dies with the key that made it (revoked keys are checked on every request).
- **Refusals** (:func:`check_directory`, once a request is authorized): on a directory bucket, ListObjects
  (v1), versioning, object lock, tagging, ACLs, CORS, the bucket location
  and browser-form POST are answered ``501 NotImplemented``; ListObjectsV2
  takes only ``/`` as delimiter and, with it, prefixes ending in ``/``
  (``InvalidArgument``). Listings come in UTF-8 binary key order, as in a
  general purpose bucket (S3 does not promise any order for directory
  buckets). Lifecycle and bucket policies stay, as S3 supports them there.

Sources: "CreateSession", "CreateBucket", "ListObjectsV2", Amazon S3 API
Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateSession.html;
"Directory buckets", "Directory bucket naming rules", "How is S3 Express One
Zone different?" and "Authorizing Zonal endpoint API operations with
CreateSession", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/s3-express-create-session.html
"""

from __future__ import annotations

from aiohttp import web

from ..engine import check_directory_bucket_name, check_directory_listing, is_directory_name
from ..engine.types import DEFAULT_TENANT
from ..errors import (
    InvalidArgument,
    InvalidToken,
    MalformedXML,
    NotImplementedByGpufeed,
)
from ._auth import AuthResult
from ._context import HandlerTable, S3Request, Services
from ._router import (
    BucketEndpoint,
    CopyObject,
    CreateBucket,
    CreateMultipartUpload,
    CreateSession,
    DeleteBucketConfiguration,
    DeleteObjectTagging,
    Endpoint,
    GetBucketAcl,
    GetBucketConfiguration,
    GetBucketLocation,
    GetBucketVersioning,
    GetObjectAcl,
    GetObjectLegalHold,
    GetObjectLockConfiguration,
    GetObjectRetention,
    GetObjectTagging,
    ListObjects,
    ListObjectVersions,
    PostObject,
    PutBucketAcl,
    PutBucketCors,
    PutBucketTagging,
    PutBucketVersioning,
    PutObject,
    PutObjectAcl,
    PutObjectLegalHold,
    PutObjectLockConfiguration,
    PutObjectRetention,
    PutObjectTagging,
    Target,
)
from ._sessions import SESSION_TOKEN_HEADER, SessionKeyRing
from ._tenancy import CURRENT_TENANT
from ._xml import child_text, element, iso8601, local, sub

__all__ = ["SESSION_TOKEN_QUERY", "check_session", "check_directory", "create_directory_bucket",
           "is_directory_configuration", "HANDLERS"]

#: The same in a presigned URL's query.
SESSION_TOKEN_QUERY = "X-Amz-S3session-Token"
_NOT_SUPPORTED = "This operation is not supported by directory buckets."
_MODE_HEADER = "x-amz-create-session-mode"

#: Operations refused on a directory bucket (each page says "not supported for directory buckets").
_REFUSED = (
    GetBucketVersioning, PutBucketVersioning, ListObjectVersions, GetObjectLockConfiguration,
    PutObjectLockConfiguration, GetObjectRetention, PutObjectRetention, GetObjectLegalHold, PutObjectLegalHold,
    GetObjectTagging, PutObjectTagging, DeleteObjectTagging, PutBucketTagging, PutBucketCors, GetBucketAcl,
    PutBucketAcl, GetObjectAcl, PutObjectAcl, GetBucketLocation, PostObject,
)
#: Configurations a directory bucket has no API for (policy and encryption it has).
_REFUSED_CONFIGS = frozenset({"tagging", "cors", "website", "replication"})
#: Object write headers naming features directory buckets lack.
_REFUSED_HEADERS = ("x-amz-tagging", "x-amz-object-lock-mode", "x-amz-object-lock-retain-until-date",
                    "x-amz-object-lock-legal-hold")


def check_session(s: Services, target: Target, headers, auth: AuthResult, endpoint: Endpoint) -> None:
    """The session token of one authenticated, routed request (before it is
    authorized: a request signed with a session acts as the session's key).

    Raises:
        InvalidToken, ExpiredToken, AccessDenied: see :meth:`SessionKeyRing.check`.
    """
    token = headers.get(SESSION_TOKEN_HEADER)
    if token is None:
        token = target.query.get(SESSION_TOKEN_QUERY)
    ring = s.credentials
    if isinstance(ring, SessionKeyRing):
        ring.check(auth, token, endpoint)
    elif token is not None:
        raise InvalidToken("The provided token is malformed or otherwise invalid.")


def check_directory(target: Target, headers, endpoint: Endpoint) -> None:
    """The rules of directory buckets for one authorized request (a directory
    bucket is told apart by its name: no general purpose bucket may end in ``--x-s3``).

    Raises:
        NotImplementedByGpufeed: an operation or header directory buckets lack,
            or CreateSession on a general purpose bucket.
        InvalidArgument: a ListObjectsV2 delimiter or prefix they refuse.
    """
    if not isinstance(endpoint, BucketEndpoint) or not is_directory_name(endpoint.bucket):
        if isinstance(endpoint, CreateSession):
            raise NotImplementedByGpufeed("CreateSession is only supported by directory buckets.")
        return
    _check_directory_endpoint(target, headers, endpoint)


def _check_directory_endpoint(target: Target, headers, endpoint: BucketEndpoint) -> None:
    if isinstance(endpoint, _REFUSED):
        raise NotImplementedByGpufeed(_NOT_SUPPORTED)
    if isinstance(endpoint, (GetBucketConfiguration, DeleteBucketConfiguration)) \
            and endpoint.config in _REFUSED_CONFIGS:
        raise NotImplementedByGpufeed(_NOT_SUPPORTED)
    if isinstance(endpoint, ListObjects):
        if not endpoint.v2:
            raise NotImplementedByGpufeed(_NOT_SUPPORTED)
        check_directory_listing(target.query.get("prefix", ""), target.query.get("delimiter", ""))
    if isinstance(endpoint, (PutObject, CopyObject, CreateMultipartUpload)):
        for name in _REFUSED_HEADERS:
            if name in headers:
                raise NotImplementedByGpufeed(f"{_NOT_SUPPORTED} ({name})")


async def create_session(s: Services, req: S3Request, ep: CreateSession) -> web.Response:
    """CreateSession: temporary credentials for one directory bucket.

    Raises:
        NoSuchBucket: the bucket does not exist.
        InvalidArgument: a session mode other than ``ReadWrite``/``ReadOnly``.
        AccessDenied: signed with session credentials.

    Source: "CreateSession", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateSession.html
    """
    mode = req.headers.get(_MODE_HEADER, "ReadWrite")
    if mode not in ("ReadWrite", "ReadOnly"):
        raise InvalidArgument(f"Invalid session mode {mode!r}", argument=_MODE_HEADER)
    await s.call(s.engine.head_bucket, ep.bucket)
    ring = s.credentials
    if not isinstance(ring, SessionKeyRing):  # a front built without sessions
        raise NotImplementedByGpufeed("CreateSession is not enabled on this node")
    session = ring.create(req.auth.access_key, ep.bucket, read_only=mode == "ReadOnly")
    root = element("CreateSessionResult")
    creds = sub(root, "Credentials")
    sub(creds, "SessionToken", session.token)
    sub(creds, "SecretAccessKey", session.secret_key)
    sub(creds, "AccessKeyId", session.access_key)
    sub(creds, "Expiration", iso8601(session.expires_s))
    return s.xml(root)


def _directory_configuration(doc, bucket: str) -> None:
    """Check a directory bucket's ``CreateBucketConfiguration``.

    Raises:
        InvalidArgument: a location type, zone, data redundancy or bucket type
            that is not the single-AZ directory bucket this name asks for.
    """
    location, info = _child(doc, "Location"), _child(doc, "Bucket")
    zone = bucket[: -len("--x-s3")].rpartition("--")[2]
    want = {
        "Location/Type": ((child_text(location, "Type") if location is not None else None), "AvailabilityZone"),
        "Location/Name": ((child_text(location, "Name") if location is not None else None), zone),
        "Bucket/DataRedundancy": ((child_text(info, "DataRedundancy") if info is not None else None),
                                  "SingleAvailabilityZone"),
    }
    for field, (got, expected) in want.items():
        if got is not None and got.strip() != expected:
            raise InvalidArgument(f"CreateBucketConfiguration {field} must be {expected!r}, not {got.strip()!r}",
                                  argument=field)
    if (child_text(doc, "LocationConstraint") or "").strip():
        raise InvalidArgument("LocationConstraint is not supported for directory buckets",
                              argument="LocationConstraint")


def _child(el, name: str):
    for c in el:
        if local(c.tag) == name:
            return c
    return None


def is_directory_configuration(doc) -> bool:
    """Whether a parsed ``CreateBucketConfiguration`` asks for a directory bucket
    (``<Bucket><Type>Directory</Type></Bucket>``)."""
    info = _child(doc, "Bucket") if doc is not None else None
    return info is not None and (child_text(info, "Type") or "").strip() == "Directory"


async def create_directory_bucket(s: Services, req: S3Request, ep: CreateBucket, doc, *,
                                  object_lock: bool = False) -> web.Response:
    """CreateBucket of a directory bucket (``doc``: its parsed configuration;
    ``object_lock``: ``x-amz-bucket-object-lock-enabled`` was asked, which the
    engine refuses for any bucket but a standard one).

    Raises:
        InvalidBucketName: the name breaks a directory bucket naming rule.
        MalformedXML: the document is not a CreateBucketConfiguration.
        InvalidArgument: see :func:`_directory_configuration`.
        BucketAlreadyOwnedByYou, BucketAlreadyExists: the name is taken.

    Source: "CreateBucket" (Directory buckets), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html
    """
    check_directory_bucket_name(ep.bucket)
    if local(doc.tag) != "CreateBucketConfiguration":
        raise MalformedXML("expected CreateBucketConfiguration")
    _directory_configuration(doc, ep.bucket)
    await s.call(s.engine.create_bucket, ep.bucket, kind="directory", object_lock=object_lock,
                 owner=CURRENT_TENANT.get() or DEFAULT_TENANT)
    return web.Response(status=200, headers={"Location": f"/{ep.bucket}"})


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {CreateSession: create_session}
