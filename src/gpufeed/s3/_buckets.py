"""S3 service and bucket operations: ListBuckets, Create/Head/DeleteBucket,
GetBucketLocation, GetBucketAcl (GetBucketVersioning is in ``_versions``).

Source: Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/
"""

from __future__ import annotations

import base64
import binascii

from aiohttp import web

from ..engine.types import DEFAULT_TENANT
from ..errors import (
    BucketAlreadyOwnedByYou,
    IllegalLocationConstraint,
    InvalidArgument,
    InvalidLocationConstraint,
    MalformedXML,
)
from ._context import HandlerTable, S3Request, Services
from ._express import create_directory_bucket, is_directory_configuration
from ._features import check_create_bucket_headers
from ._router import (
    CreateBucket,
    DeleteBucket,
    GetBucketAcl,
    GetBucketLocation,
    HeadBucket,
    ListBuckets,
)
from ._tenancy import CURRENT_TENANT
from ._xml import child_text, element, iso8601, local, parse_xml, sub

__all__ = ["HANDLERS"]


#: Most buckets one ListBuckets page holds (S3's ``max-buckets`` range is 1..10000).
_MAX_BUCKETS = 10000
_BAD_TOKEN = "The continuation token provided is incorrect"


def _token(name: str) -> str:
    """The continuation token after bucket ``name`` (opaque to clients)."""
    return base64.urlsafe_b64encode(name.encode()).decode()


def _after(token: str) -> str:
    """The bucket name a continuation token resumes after.

    Raises:
        InvalidArgument: not a token this node made.
    """
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode()
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise InvalidArgument(_BAD_TOKEN) from exc


async def list_buckets(s: Services, req: S3Request, ep: ListBuckets) -> web.Response:
    """ListBuckets: buckets by name with their creation dates; one page of
    ``max-buckets`` (1..10000) after ``continuation-token``, only names starting
    with ``prefix``, none unless ``bucket-region`` is the node's region.

    Source: "ListBuckets", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListBuckets.html

    Raises:
        InvalidArgument: ``max-buckets`` outside 1..10000, or a token we did not make.
    """
    q = req.query
    prefix = q.get("prefix", "")
    after = _after(q["continuation-token"]) if q.get("continuation-token") else ""
    limit = _MAX_BUCKETS
    if q.get("max-buckets", "") != "":
        try:
            limit = int(q["max-buckets"])
        except ValueError:
            limit = 0
        if not 1 <= limit <= _MAX_BUCKETS:
            raise InvalidArgument("Argument max-buckets must be an integer between 1 and 10000")
    buckets = await s.call(s.engine.list_buckets, CURRENT_TENANT.get() or "")
    region = q.get("bucket-region")
    chosen = [b for b in buckets if b.name.startswith(prefix) and b.name > after
              and region in (None, s.config.region)]
    page = chosen[:limit]
    root = element("ListAllMyBucketsResult")
    s.owner(root)
    bs = sub(root, "Buckets")
    for b in page:
        el = sub(bs, "Bucket")
        sub(el, "Name", b.name)
        sub(el, "CreationDate", iso8601(b.created))
        sub(el, "BucketRegion", s.config.region)
    if len(chosen) > limit:
        sub(root, "ContinuationToken", _token(page[-1].name))
    if "prefix" in q:
        sub(root, "Prefix", prefix)
    return s.xml(root)


async def head_bucket(s: Services, req: S3Request, ep: HeadBucket) -> web.Response:
    """HeadBucket: 200 with the region, or the engine's NoSuchBucket."""
    await s.call(s.engine.head_bucket, ep.bucket)
    return web.Response(status=200, headers={"x-amz-bucket-region": s.config.region})


def _check_location(constraint: str, region: str) -> None:
    """A CreateBucket ``LocationConstraint`` (``""``: none) sent to a node of ``region``,
    checked as S3 checks it: a us-east-1 node answers as S3's us-east-1
    endpoint (which takes any other region's constraint), a node of another
    region as that region's endpoint.

    Raises:
        InvalidLocationConstraint: ``us-east-1`` named explicitly (S3 wants none there).
        IllegalLocationConstraint: outside us-east-1, a constraint (or none)
            other than the node's region.
    """
    if constraint == "us-east-1" and region == "us-east-1":
        raise InvalidLocationConstraint("The specified location-constraint is not valid",
                                        location_constraint=constraint)
    if region != "us-east-1" and constraint != region:
        raise IllegalLocationConstraint(f"The {constraint or 'unspecified'} location constraint is incompatible "
                                        "for the region specific endpoint this request was sent to.")


async def create_bucket(s: Services, req: S3Request, ep: CreateBucket) -> web.Response:
    """CreateBucket (``x-amz-bucket-object-lock-enabled: true``: with object
    lock, and so versioning, for good), with the gpufeed extension headers
    ``x-gpufeed-bucket-kind: kv`` (+ ``x-gpufeed-capacity-bytes``,
    ``x-gpufeed-ttl-s``) that make an evicting KV-cache bucket, and
    ``x-gpufeed-etag-policy: md5|fast|none`` (how the bucket's writes are hashed).

    Creating a bucket the caller already owns answers 200 in us-east-1 (S3's
    legacy behaviour there) and 409 BucketAlreadyOwnedByYou in any other region.
    The ``LocationConstraint`` must name the node's region (none in us-east-1).

    Source: "CreateBucket", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateBucket.html

    Raises:
        MalformedXML: a body that is not a CreateBucketConfiguration.
        InvalidLocationConstraint, IllegalLocationConstraint: see :func:`_check_location`.
        InvalidArgument: a policy header that is not a number; object lock on a kv bucket.
        NotImplementedByGpufeed: an object ownership other than BucketOwnerEnforced.
        AccessControlListNotSupported: an ACL other than the owner's full control.
    """
    object_lock = check_create_bucket_headers(req.headers)
    data = await s.read_xml(req)
    constraint = ""
    if data.strip():
        doc = parse_xml(data)
        if is_directory_configuration(doc):  # S3 Express One Zone (see ._express)
            return await create_directory_bucket(s, req, ep, doc, object_lock=object_lock)
        if local(doc.tag) != "CreateBucketConfiguration":
            raise MalformedXML("expected CreateBucketConfiguration")
        constraint = (child_text(doc, "LocationConstraint") or "").strip()
    _check_location(constraint, s.config.region)
    h = req.headers
    try:
        policy = {
            "kind": h.get("x-gpufeed-bucket-kind", "standard"),
            "capacity_bytes": int(h.get("x-gpufeed-capacity-bytes", "0")),
            "ttl_s": float(h.get("x-gpufeed-ttl-s", "0")),
            "etag_policy": h.get("x-gpufeed-etag-policy", "md5").strip().lower(),
        }
    except ValueError as exc:
        raise InvalidArgument(f"bad x-gpufeed bucket policy header: {exc}") from exc
    try:
        await s.call(s.engine.create_bucket, ep.bucket, owner=CURRENT_TENANT.get() or DEFAULT_TENANT,
                     object_lock=object_lock, **policy)
    except BucketAlreadyOwnedByYou:
        if s.config.region != "us-east-1":
            raise
    return web.Response(status=200, headers={"Location": f"/{ep.bucket}"})


async def delete_bucket(s: Services, req: S3Request, ep: DeleteBucket) -> web.Response:
    """DeleteBucket (the engine refuses a bucket that is not empty)."""
    await s.call(s.engine.delete_bucket, ep.bucket)
    return web.Response(status=204)


async def get_bucket_location(s: Services, req: S3Request, ep: GetBucketLocation) -> web.Response:
    """GetBucketLocation: the node's region (empty for us-east-1, as S3 does)."""
    await s.call(s.engine.head_bucket, ep.bucket)
    root = element("LocationConstraint")
    if s.config.region != "us-east-1":
        root.text = s.config.region
    return s.xml(root)


async def get_bucket_acl(s: Services, req: S3Request, ep: GetBucketAcl) -> web.Response:
    """GetBucketAcl: the owner has FULL_CONTROL."""
    await s.call(s.engine.head_bucket, ep.bucket)
    return s.acl()


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    ListBuckets: list_buckets,
    HeadBucket: head_bucket,
    CreateBucket: create_bucket,
    DeleteBucket: delete_bucket,
    GetBucketLocation: get_bucket_location,
    GetBucketAcl: get_bucket_acl,
}
