"""Bucket policies on the S3 front: Put/Get/DeleteBucketPolicy, and the S3
action each endpoint asks :meth:`gpufeed.engine.Engine.authorize` for.

The engine checks and evaluates the policy (:mod:`gpufeed.engine._policy`);
this module says what a request is, in the policy's terms: its action
(:func:`request_action`, :data:`ACTIONS`), its object key and, for listings,
its ``prefix`` (``s3:prefix``). Only the bucket's owner gets, sets or deletes
the policy. GetBucketPolicy answers the document as it was set (JSON, not
XML); PutBucketPolicy answers 204, DeleteBucketPolicy 204 also when none was set.

Sources: "PutBucketPolicy", "GetBucketPolicy", "DeleteBucketPolicy", Amazon S3
API Reference; "Actions, resources, and condition keys for Amazon S3", Service
Authorization Reference,
https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html
"""

from __future__ import annotations

from aiohttp import web

from ..engine import Engine
from ..errors import AccessDenied, MalformedPolicy, NoSuchConfiguration
from ._context import HandlerTable, S3Request, Services
from ._router import (
    AbortMultipartUpload,
    BucketEndpoint,
    CompleteMultipartUpload,
    CopyObject,
    CreateMultipartUpload,
    CreateSession,
    DeleteBucket,
    DeleteBucketConfiguration,
    DeleteBucketLifecycle,
    DeleteObject,
    DeleteObjects,
    DeleteObjectTagging,
    Endpoint,
    GetBucketAcl,
    GetBucketConfiguration,
    GetBucketLifecycleConfiguration,
    GetBucketLocation,
    GetBucketVersioning,
    GetObject,
    GetObjectAcl,
    GetObjectAttributes,
    GetObjectLegalHold,
    GetObjectLockConfiguration,
    GetObjectRetention,
    GetObjectTagging,
    HeadBucket,
    HeadObject,
    ListMultipartUploads,
    ListObjects,
    ListObjectVersions,
    ListParts,
    PostObject,
    PutBucketAcl,
    PutBucketCors,
    PutBucketLifecycleConfiguration,
    PutBucketPolicy,
    PutBucketTagging,
    PutBucketVersioning,
    PutObject,
    PutObjectAcl,
    PutObjectLegalHold,
    PutObjectLockConfiguration,
    PutObjectRetention,
    PutObjectTagging,
    UploadPart,
    UploadPartCopy,
)

__all__ = ["HANDLERS", "ACTIONS", "request_action", "source_action", "LISTINGS", "authorize_request",
           "may_reach"]

#: Endpoint -> the S3 action it asks for (its form naming a version, where S3 has one, in
#: :data:`_VERSION_ACTIONS`). DeleteObjects asks ``s3:DeleteObject`` for each key it names.
ACTIONS: dict[type[Endpoint], str] = {
    HeadBucket: "s3:ListBucket", ListObjects: "s3:ListBucket", ListObjectVersions: "s3:ListBucketVersions",
    ListMultipartUploads: "s3:ListBucketMultipartUploads", DeleteBucket: "s3:DeleteBucket",
    GetBucketLocation: "s3:GetBucketLocation", GetBucketVersioning: "s3:GetBucketVersioning",
    PutBucketVersioning: "s3:PutBucketVersioning", GetBucketAcl: "s3:GetBucketAcl", PutBucketAcl: "s3:PutBucketAcl",
    GetBucketLifecycleConfiguration: "s3:GetLifecycleConfiguration",
    PutBucketLifecycleConfiguration: "s3:PutLifecycleConfiguration",
    DeleteBucketLifecycle: "s3:PutLifecycleConfiguration", PutBucketCors: "s3:PutBucketCORS",
    PutBucketTagging: "s3:PutBucketTagging", PutBucketPolicy: "s3:PutBucketPolicy",
    GetObjectLockConfiguration: "s3:GetBucketObjectLockConfiguration",
    PutObjectLockConfiguration: "s3:PutBucketObjectLockConfiguration", DeleteObjects: "s3:DeleteObject",
    PostObject: "s3:PutObject",
    GetObject: "s3:GetObject", HeadObject: "s3:GetObject", GetObjectAcl: "s3:GetObjectAcl",
    PutObjectAcl: "s3:PutObjectAcl", GetObjectAttributes: "s3:GetObjectAttributes",
    GetObjectRetention: "s3:GetObjectRetention", PutObjectRetention: "s3:PutObjectRetention",
    GetObjectLegalHold: "s3:GetObjectLegalHold", PutObjectLegalHold: "s3:PutObjectLegalHold",
    GetObjectTagging: "s3:GetObjectTagging", PutObjectTagging: "s3:PutObjectTagging",
    DeleteObjectTagging: "s3:DeleteObjectTagging", PutObject: "s3:PutObject", CopyObject: "s3:PutObject",
    DeleteObject: "s3:DeleteObject", CreateMultipartUpload: "s3:PutObject", UploadPart: "s3:PutObject",
    UploadPartCopy: "s3:PutObject", CompleteMultipartUpload: "s3:PutObject",
    AbortMultipartUpload: "s3:AbortMultipartUpload", ListParts: "s3:ListMultipartUploadParts",
    # a session grants nothing by itself: each request signed with it is authorized as the key that made it
    CreateSession: "s3:ListBucket",
}
#: An action -> its form when the request names a version (``?versionId=``).
_VERSION_ACTIONS = {
    "s3:GetObject": "s3:GetObjectVersion", "s3:DeleteObject": "s3:DeleteObjectVersion",
    "s3:GetObjectAcl": "s3:GetObjectVersionAcl", "s3:PutObjectAcl": "s3:PutObjectVersionAcl",
    "s3:GetObjectTagging": "s3:GetObjectVersionTagging", "s3:PutObjectTagging": "s3:PutObjectVersionTagging",
    "s3:DeleteObjectTagging": "s3:DeleteObjectVersionTagging",
    "s3:GetObjectAttributes": "s3:GetObjectVersionAttributes",
}
#: Bucket configuration -> (its Get action, its Delete action).
_CONFIG_ACTIONS = {
    "policy": ("s3:GetBucketPolicy", "s3:DeleteBucketPolicy"),
    "cors": ("s3:GetBucketCORS", "s3:PutBucketCORS"),
    "encryption": ("s3:GetEncryptionConfiguration", "s3:PutEncryptionConfiguration"),
    "website": ("s3:GetBucketWebsite", "s3:DeleteBucketWebsite"),
    "replication": ("s3:GetReplicationConfiguration", "s3:PutReplicationConfiguration"),
    "tagging": ("s3:GetBucketTagging", "s3:PutBucketTagging"),
}
#: Endpoints that list a bucket (their ``prefix`` is the request's ``s3:prefix``).
LISTINGS = (ListObjects, ListObjectVersions, ListMultipartUploads)


def request_action(endpoint: BucketEndpoint, query: dict[str, str]) -> str:
    """The S3 action a request on a bucket asks for.

    Args:
        endpoint: the routed request (a bucket or object endpoint).
        query: its decoded query (``versionId`` picks an action's version form).

    Returns:
        ``"s3:<Action>"``.
    """
    if isinstance(endpoint, GetBucketConfiguration):
        return _CONFIG_ACTIONS[endpoint.config][0]
    if isinstance(endpoint, DeleteBucketConfiguration):
        return _CONFIG_ACTIONS[endpoint.config][1]
    action = ACTIONS.get(type(endpoint), "s3:*")
    if "versionId" in query:
        action = _VERSION_ACTIONS.get(action, action)
    return action


def source_action(version_id: str | None) -> str:
    """The action a copy asks for on its source (``s3:GetObject``, or its version form)."""
    return "s3:GetObject" if version_id is None else "s3:GetObjectVersion"


# -- handlers ------------------------------------------------------------------------

def _no_policy(bucket: str) -> NoSuchConfiguration:
    return NoSuchConfiguration("The bucket policy does not exist", code="NoSuchBucketPolicy", bucket=bucket)


async def get_bucket_policy(s: Services, req: S3Request, ep: GetBucketConfiguration) -> web.Response:
    """GetBucketPolicy: the policy document as it was set (``application/json``).

    Raises:
        NoSuchBucket: the bucket does not exist.
        NoSuchConfiguration: it has no policy (404 NoSuchBucketPolicy).
    """
    text = await s.call(s.engine.get_bucket_policy, ep.bucket)
    if text is None:
        raise _no_policy(ep.bucket)
    return web.Response(status=200, text=text, content_type="application/json")


async def put_bucket_policy(s: Services, req: S3Request, ep: PutBucketPolicy) -> web.Response:
    """PutBucketPolicy: check the document and store it whole (204).

    Raises:
        NoSuchBucket: the bucket does not exist.
        MalformedPolicy: the document is refused (AWS's reason; nothing changes),
            also when it is not UTF-8.
        BadDigest: a ``Content-MD5`` that does not match the body.
    """
    body = await s.read_xml(req)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPolicy("This policy contains invalid Json") from exc
    await s.call(s.engine.put_bucket_policy, ep.bucket, text)
    return web.Response(status=204)


async def delete_bucket_policy(s: Services, req: S3Request, ep: DeleteBucketConfiguration) -> web.Response:
    """DeleteBucketPolicy: 204, also when none was set.

    Raises:
        NoSuchBucket: the bucket does not exist.
    """
    await s.call(s.engine.delete_bucket_policy, ep.bucket)
    return web.Response(status=204)


def may_reach(engine: Engine, bucket: str, tenant: str | None) -> bool:
    """Whether a request whose keys are known only later (DeleteObjects, a form
    POST) goes on to its per-key checks: the owner's always, anyone else's only
    on a bucket with a policy (without one, the whole request is refused, as
    any other call is).

    Raises:
        NoSuchBucket: the bucket does not exist.
    """
    return engine.bucket_owner(bucket) == tenant or engine.bucket_policy(bucket) is not None


#: Endpoint -> handler of this family (Get and Delete reach here from ``_bucketconfig``).
HANDLERS: HandlerTable = {
    PutBucketPolicy: put_bucket_policy,
}


def authorize_request(engine: Engine, endpoint: BucketEndpoint, query: dict[str, str], tenant: str | None, *,
                      access_key: str | None, source_ip: str | None) -> None:
    """Ask the engine whether a request on a bucket may go on: its action on its
    bucket or object (with ``s3:prefix`` for listings), a copy's
    ``s3:GetObject`` on its source, and GetObjectAttributes' ``s3:GetObject``
    too. DeleteObjects and a form POST are asked key by key by their
    handlers; here they only need the bucket's owner or a bucket policy.

    Raises:
        NoSuchBucket: a bucket named does not exist.
        AccessDenied: the request is not allowed.
    """
    if isinstance(endpoint, (DeleteObjects, PostObject)):
        if not may_reach(engine, endpoint.bucket, tenant):
            raise AccessDenied("Access Denied")
        return
    key = getattr(endpoint, "key", None)
    prefix = query.get("prefix", "") if isinstance(endpoint, LISTINGS) else None
    engine.authorize(tenant, request_action(endpoint, query), endpoint.bucket, key, access_key=access_key,
                     source_ip=source_ip, prefix=prefix)
    if isinstance(endpoint, (CopyObject, UploadPartCopy)):
        engine.authorize(tenant, source_action(endpoint.source_version_id), endpoint.source_bucket,
                         endpoint.source_key, access_key=access_key, source_ip=source_ip)
    if isinstance(endpoint, GetObjectAttributes):  # S3 asks for the object read as well
        engine.authorize(tenant, source_action(query.get("versionId")), endpoint.bucket, key,
                         access_key=access_key, source_ip=source_ip)
