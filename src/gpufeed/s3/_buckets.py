"""S3 service and bucket operations: ListBuckets, Create/Head/DeleteBucket,
GetBucketLocation, GetBucketVersioning, GetBucketAcl.

Source: Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/
"""

from __future__ import annotations

from aiohttp import web

from ..errors import InvalidArgument, MalformedXML
from ._context import HandlerTable, S3Request, Services
from ._router import (
    CreateBucket,
    DeleteBucket,
    GetBucketAcl,
    GetBucketLocation,
    GetBucketVersioning,
    HeadBucket,
    ListBuckets,
)
from ._xml import element, iso8601, local, parse_xml, sub

__all__ = ["HANDLERS"]


async def list_buckets(s: Services, req: S3Request, ep: ListBuckets) -> web.Response:
    """ListBuckets: every bucket with its creation date."""
    buckets = await s.call(s.engine.list_buckets)
    root = element("ListAllMyBucketsResult")
    s.owner(root)
    bs = sub(root, "Buckets")
    for b in buckets:
        el = sub(bs, "Bucket")
        sub(el, "Name", b.name)
        sub(el, "CreationDate", iso8601(b.created))
    return s.xml(root)


async def head_bucket(s: Services, req: S3Request, ep: HeadBucket) -> web.Response:
    """HeadBucket: 200 with the region, or the engine's NoSuchBucket."""
    await s.call(s.engine.head_bucket, ep.bucket)
    return web.Response(status=200, headers={"x-amz-bucket-region": s.config.region})


async def create_bucket(s: Services, req: S3Request, ep: CreateBucket) -> web.Response:
    """CreateBucket, with the gpufeed extension headers
    ``x-gpufeed-bucket-kind: kv`` (+ ``x-gpufeed-capacity-bytes``,
    ``x-gpufeed-ttl-s``) that make an evicting KV-cache bucket.

    Raises:
        MalformedXML: a body that is not a CreateBucketConfiguration.
        InvalidArgument: a policy header that is not a number.
    """
    data = await s.read_xml(req)
    if data.strip():
        doc = parse_xml(data)
        if local(doc.tag) != "CreateBucketConfiguration":
            raise MalformedXML("expected CreateBucketConfiguration")
    h = req.headers
    try:
        policy = {
            "kind": h.get("x-gpufeed-bucket-kind", "standard"),
            "capacity_bytes": int(h.get("x-gpufeed-capacity-bytes", "0")),
            "ttl_s": float(h.get("x-gpufeed-ttl-s", "0")),
        }
    except ValueError as exc:
        raise InvalidArgument(f"bad x-gpufeed bucket policy header: {exc}") from exc
    await s.call(s.engine.create_bucket, ep.bucket, **policy)
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


async def get_bucket_versioning(s: Services, req: S3Request, ep: GetBucketVersioning) -> web.Response:
    """GetBucketVersioning: never enabled (an empty configuration)."""
    await s.call(s.engine.head_bucket, ep.bucket)
    return s.xml(element("VersioningConfiguration"))


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
    GetBucketVersioning: get_bucket_versioning,
    GetBucketAcl: get_bucket_acl,
}
