"""S3 object tagging: Put/Get/DeleteObjectTagging, the ``x-amz-tagging``
header of uploads and copies, ``x-amz-tagging-directive``, and the
``x-amz-tagging-count`` of reads.

Each object version has its own tag set, kept by the engine, which also
checks S3's limits (10 tags; keys of 1 to 128 characters, values of 0 to 256,
from S3's tag alphabet; no ``aws:`` prefix) and answers ``InvalidTag``. Here:
a ``Tagging`` document that does not follow the schema is ``MalformedXML``, a
key given twice in it ``InvalidTag``; an ``x-amz-tagging`` header (URL query
form, ``k1=v1&k2=v2``) that is not UTF-8 or names a key twice is
``InvalidArgument``; an unknown tagging directive ``InvalidArgument``.

Sources: "PutObjectTagging", "GetObjectTagging", "DeleteObjectTagging",
"PutObject" (``x-amz-tagging``), "CopyObject" (``x-amz-tagging-directive``),
"GetObject" and "HeadObject" (``x-amz-tagging-count``), Amazon S3 API
Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObjectTagging.html;
"Categorizing your storage using tags", Amazon S3 User Guide.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote_plus

from aiohttp import web

from ..engine import ObjectInfo
from ..errors import InvalidArgument, InvalidTag, MalformedXML
from ._context import HandlerTable, S3Request, Services
from ._headers import require_integrity_header
from ._router import DeleteObjectTagging, GetObjectTagging, PutObjectTagging
from ._xml import element, local, parse_xml, sub

__all__ = ["HANDLERS", "parse_tag_set", "tagging_header", "copy_tags", "tag_count_headers"]

_MALFORMED = "The XML you provided was not well-formed or did not validate against our published schema"
_BAD_HEADER = ("The header 'x-amz-tagging' shall be encoded as UTF-8 then URLEncoded URL query parameters "
               "without tag name duplicates.")


def _malformed(detail: str) -> MalformedXML:
    return MalformedXML(f"{_MALFORMED}: {detail}")


def parse_tag_set(body: bytes) -> dict[str, str]:
    """A ``Tagging`` document (``<Tagging><TagSet><Tag><Key/><Value/></Tag>...``)
    -> ``{key: value}``; the engine checks the limits.

    Raises:
        MalformedXML: not well-formed, not ``Tagging`` with one ``TagSet`` of
            ``Tag`` elements each holding one ``Key`` and one ``Value``.
        InvalidTag: a key given twice.
    """
    root = parse_xml(body)
    if local(root.tag) != "Tagging" or len(root) != 1 or local(root[0].tag) != "TagSet":
        raise _malformed("expected <Tagging> with one <TagSet>")
    tags: dict[str, str] = {}
    for el in root[0]:
        if local(el.tag) != "Tag":
            raise _malformed("<TagSet> holds only <Tag> elements")
        parts: dict[str, str] = {}
        for c in el:
            name = local(c.tag)
            if name not in ("Key", "Value") or name in parts or len(c):
                raise _malformed(f"unexpected <{name}> in <Tag>")
            parts[name] = c.text or ""
        if len(parts) != 2:
            raise _malformed("each <Tag> has a <Key> and a <Value>")
        if parts["Key"] in tags:
            raise InvalidTag("Cannot provide multiple Tags with the same key")
        tags[parts["Key"]] = parts["Value"]
    return tags


def tagging_header(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The ``x-amz-tagging`` header (``k1=v1&k2=v2``, URL-encoded UTF-8) as
    ``{key: value}``, or None when absent.

    Raises:
        InvalidArgument: not UTF-8 once decoded, or a key given twice.
    """
    value = headers.get("x-amz-tagging")
    if value is None:
        return None
    tags: dict[str, str] = {}
    for item in value.split("&"):
        if not item:
            continue
        raw_key, _, raw_value = item.partition("=")
        try:
            key, val = unquote_plus(raw_key, errors="strict"), unquote_plus(raw_value, errors="strict")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(_BAD_HEADER) from exc
        if key in tags:
            raise InvalidArgument(_BAD_HEADER)
        tags[key] = val
    return tags


def copy_tags(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The tag set of a CopyObject's new version: None keeps the source's
    (``x-amz-tagging-directive: COPY``, the default), else ``x-amz-tagging``
    (``REPLACE``; no header: no tags).

    Raises:
        InvalidArgument: an unknown directive, or a bad ``x-amz-tagging``.
    """
    directive = headers.get("x-amz-tagging-directive", "COPY").strip().upper()
    if directive not in ("COPY", "REPLACE"):
        raise InvalidArgument("Unknown tagging directive.")
    if directive == "COPY":
        return None
    return tagging_header(headers) or {}


def tag_count_headers(info: ObjectInfo) -> dict[str, str]:
    """``x-amz-tagging-count`` of a GetObject / HeadObject answer (none for an untagged version)."""
    return {"x-amz-tagging-count": str(len(info.tags))} if info.tags else {}


def _version_header(info: ObjectInfo) -> dict[str, str]:
    return {"x-amz-version-id": info.version_id} if info.version_id != "null" else {}


async def put_object_tagging(s: Services, req: S3Request, ep: PutObjectTagging) -> web.Response:
    """PutObjectTagging: replace a version's tag set (``versionId``; the current version without).

    Raises:
        InvalidRequestError: neither ``Content-MD5`` nor a checksum header.
        MalformedXML, InvalidTag: see :func:`parse_tag_set`; over the limits.
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed, InvalidArgument: as for HeadObject.
    """
    require_integrity_header(req.headers)
    tags = parse_tag_set(await s.read_xml(req))
    info = await s.call(s.engine.put_object_tagging, ep.bucket, ep.key, tags, version_id=req.query.get("versionId"))
    return web.Response(status=200, headers=_version_header(info))


async def get_object_tagging(s: Services, req: S3Request, ep: GetObjectTagging) -> web.Response:
    """GetObjectTagging: the version's tag set (empty when it has none).

    Raises:
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed, InvalidArgument: as for HeadObject.
    """
    info = await s.call(s.engine.head_object, ep.bucket, ep.key, req.query.get("versionId"))
    root = element("Tagging")
    tag_set = sub(root, "TagSet")
    for key, value in info.tags.items():
        tag = sub(tag_set, "Tag")
        sub(tag, "Key", key)
        sub(tag, "Value", value)
    return s.xml(root, headers=_version_header(info))


async def delete_object_tagging(s: Services, req: S3Request, ep: DeleteObjectTagging) -> web.Response:
    """DeleteObjectTagging: remove a version's tags (204).

    Raises:
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed, InvalidArgument: as for HeadObject.
    """
    info = await s.call(s.engine.put_object_tagging, ep.bucket, ep.key, {}, version_id=req.query.get("versionId"))
    return web.Response(status=204, headers=_version_header(info))


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    PutObjectTagging: put_object_tagging,
    GetObjectTagging: get_object_tagging,
    DeleteObjectTagging: delete_object_tagging,
}
