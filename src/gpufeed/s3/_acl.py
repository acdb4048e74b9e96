"""S3 ACL writes: PutBucketAcl and PutObjectAcl.

Every gpufeed bucket and object has one ACL, the owner's full control (the
reads, GetBucketAcl and GetObjectAcl, answer it). A write that says the same,
with a canned ACL (``private``, ``bucket-owner-full-control``) or an
AccessControlPolicy document that grants only the owner FULL_CONTROL, is
accepted and changes nothing; any other grant is refused with
``AccessControlListNotSupported``, as S3 answers for a bucket whose object
ownership is "bucket owner enforced".

Sources: "PutBucketAcl" and "PutObjectAcl", Amazon S3 API Reference;
"Controlling ownership of objects and disabling ACLs for your bucket", Amazon S3 User Guide.
"""

from __future__ import annotations

from aiohttp import web

from ..errors import AccessControlListNotSupported, MalformedXML
from ._context import HandlerTable, S3Request, Services
from ._features import check_acl_headers
from ._router import PutBucketAcl, PutObjectAcl
from ._versions import version_arg
from ._xml import child_text, local, parse_xml

__all__ = ["HANDLERS", "check_acl_document"]


def check_acl_document(data: bytes, owner_id: str) -> None:
    """Accept an AccessControlPolicy document only if it grants the owner FULL_CONTROL and nothing else.

    Args:
        data: the request body.
        owner_id: the canonical id of the node's one owner.

    Raises:
        MalformedXML: not an AccessControlPolicy document, or a Grant without
            Grantee or Permission.
        AccessControlListNotSupported: a grant to anyone else, or of anything else.
    """
    doc = parse_xml(data)
    if local(doc.tag) != "AccessControlPolicy":
        raise MalformedXML("expected an AccessControlPolicy document")
    for acl in (el for el in doc if local(el.tag) == "AccessControlList"):
        for grant in (el for el in acl if local(el.tag) == "Grant"):
            grantee = next((el for el in grant if local(el.tag) == "Grantee"), None)
            permission = child_text(grant, "Permission")
            if grantee is None or permission is None:
                raise MalformedXML("each Grant needs a Grantee and a Permission")
            if (child_text(grantee, "ID") or "").strip() != owner_id or permission.strip() != "FULL_CONTROL":
                raise AccessControlListNotSupported(
                    "The bucket does not allow ACLs; only the owner's FULL_CONTROL may be granted")


async def _put_acl(s: Services, req: S3Request) -> None:
    """Check the ACL a request sets (header or document)."""
    check_acl_headers(req.headers)
    data = await s.read_xml(req)
    if "x-amz-acl" not in req.headers or data.strip():
        check_acl_document(data, s.owner_id)


async def put_bucket_acl(s: Services, req: S3Request, ep: PutBucketAcl) -> web.Response:
    """PutBucketAcl: accepted when it sets the owner's full control (the only ACL there is)."""
    await _put_acl(s, req)
    await s.call(s.engine.head_bucket, ep.bucket)
    return web.Response(status=200)


async def put_object_acl(s: Services, req: S3Request, ep: PutObjectAcl) -> web.Response:
    """PutObjectAcl: accepted when it sets the owner's full control (the only ACL there is)."""
    await _put_acl(s, req)
    await s.call(s.engine.head_object, ep.bucket, ep.key, version_arg(req.query))
    return web.Response(status=200)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    PutBucketAcl: put_bucket_acl,
    PutObjectAcl: put_object_acl,
}
