"""Bucket configurations: Get and Delete of policy, CORS, encryption, website,
replication and tagging; PutBucketTagging.

gpufeed stores three of them, whole, through the engine's bucket configuration
documents: CORS (set by ``_cors``), the bucket's policy (``_policy``, which
answers its Get and Delete too) and the bucket's tag set (set here). Get
answers the stored document, or S3's own "no such configuration" 404 when none
is set (always, for the configurations gpufeed does not hold), so clients that
probe for them go on; Delete succeeds whether one was set or not. Setting the
others is not built and answers 501 (the router's
:data:`~gpufeed.s3._router.UNSUPPORTED_BUCKET`).

A tag set holds at most 50 tags with unique keys of 1 to 128 characters and
values of 0 to 256, both of letters, digits, spaces and ``_ . : / = + - @``;
keys starting ``aws:`` are S3's own. An empty tag set removes the bucket's tags.

Sources: "GetBucketPolicy", "GetBucketCors", "GetBucketEncryption",
"GetBucketWebsite", "GetBucketReplication", "GetBucketTagging",
"PutBucketTagging" and the Delete operations of the same names, Amazon S3 API
Reference; "Error responses" (the codes),
https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html; "Using
cost allocation S3 bucket tags" (the limits), Amazon S3 User Guide.
"""

from __future__ import annotations

import json
import unicodedata
import xml.etree.ElementTree as ET
from collections.abc import Callable

from aiohttp import web

from ..errors import BadRequest, InvalidTag, MalformedXML, NoSuchConfiguration
from . import _cors, _policy
from ._context import HandlerTable, S3Request, Services
from ._headers import require_integrity_header
from ._router import DeleteBucketConfiguration, GetBucketConfiguration, PutBucketTagging
from ._xml import element, local, parse_xml, sub

__all__ = ["HANDLERS", "NOT_SET", "MAX_BUCKET_TAGS", "parse_tagging", "render_tagging"]

#: Sub-resource -> (S3 error code, message) of a configuration that is not set.
NOT_SET = {
    "policy": ("NoSuchBucketPolicy", "The bucket policy does not exist"),
    "cors": ("NoSuchCORSConfiguration", "The CORS configuration does not exist"),
    "encryption": ("ServerSideEncryptionConfigurationNotFoundError",
                   "The server side encryption configuration was not found"),
    "website": ("NoSuchWebsiteConfiguration", "The specified bucket does not have a website configuration"),
    "replication": ("ReplicationConfigurationNotFoundError", "The replication configuration was not found"),
    "tagging": ("NoSuchTagSet", "The TagSet does not exist"),
}

#: Most tags one bucket holds (S3's limit).
MAX_BUCKET_TAGS = 50
#: Longest tag key and value, characters (S3's limits).
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256
_TAG_PUNCTUATION = frozenset("_.:/=+-@")
_MALFORMED = "The XML you provided was not well-formed or did not validate against our published schema"


# -- tag sets ------------------------------------------------------------------------

def _tag_text_ok(text: str) -> bool:
    """Letters, digits, spaces (Unicode separators) and ``_ . : / = + - @`` only (S3's tag characters)."""
    return all(c in _TAG_PUNCTUATION or unicodedata.category(c)[0] in "LNZ" for c in text)


def _check_tag(key: str, value: str) -> None:
    if len(key) > MAX_TAG_KEY:
        raise InvalidTag(f"The TagKey you have provided is too long, max {MAX_TAG_KEY}")
    if not key or not _tag_text_ok(key):
        raise InvalidTag("The TagKey you have provided is invalid")
    if len(value) > MAX_TAG_VALUE:
        raise InvalidTag(f"The TagValue you have provided is too long, max {MAX_TAG_VALUE}")
    if not _tag_text_ok(value):
        raise InvalidTag("The TagValue you have provided is invalid")
    if key.lower().startswith("aws:"):
        raise InvalidTag("System tags cannot be added/updated by requester")


def _tag(el: ET.Element) -> tuple[str, str]:
    parts: dict[str, str] = {}
    for c in el:
        name = local(c.tag)
        if name not in ("Key", "Value") or name in parts:
            raise MalformedXML(f"{_MALFORMED}: unexpected or repeated <{name}> in <Tag>")
        parts[name] = c.text or ""
    if len(parts) != 2:
        raise MalformedXML(f"{_MALFORMED}: each <Tag> needs a <Key> and a <Value>")
    return parts["Key"], parts["Value"]


def parse_tagging(body: bytes) -> list[tuple[str, str]]:
    """A ``Tagging`` document -> its ``(key, value)`` pairs, in document order.

    Args:
        body: the PutBucketTagging request body.

    Raises:
        MalformedXML: not well-formed, not ``<Tagging><TagSet><Tag>...``, a tag
            without its ``Key`` or ``Value``.
        BadRequest: more than :data:`MAX_BUCKET_TAGS` tags.
        InvalidTag: a key or value too long or with characters S3 refuses, an
            empty key, a key starting ``aws:``, a key given twice.
    """
    root = parse_xml(body)
    if local(root.tag) != "Tagging" or len(root) != 1 or local(root[0].tag) != "TagSet":
        raise MalformedXML(f"{_MALFORMED}: expected <Tagging> with one <TagSet>")
    if any(local(c.tag) != "Tag" for c in root[0]):
        raise MalformedXML(f"{_MALFORMED}: <TagSet> holds only <Tag> elements")
    tags = [_tag(el) for el in root[0]]
    if len(tags) > MAX_BUCKET_TAGS:
        raise BadRequest(f"Bucket tag count cannot be greater than {MAX_BUCKET_TAGS}")
    seen: set[str] = set()
    for key, value in tags:
        _check_tag(key, value)
        if key in seen:
            raise InvalidTag("Cannot provide multiple Tags with the same key")
        seen.add(key)
    return tags


def render_tagging(document: str) -> ET.Element:
    """A stored tag set (JSON ``[[key, value], ...]``) -> the GetBucketTagging document."""
    root = element("Tagging")
    tag_set = sub(root, "TagSet")
    for key, value in json.loads(document):
        tag = sub(tag_set, "Tag")
        sub(tag, "Key", key)
        sub(tag, "Value", value)
    return root


# -- handlers ------------------------------------------------------------------------

#: Stored configuration -> its GetBucket... document.
_RENDER: dict[str, Callable[[str], ET.Element]] = {
    "cors": _cors.render_stored,
    "tagging": render_tagging,
}


async def get_bucket_configuration(s: Services, req: S3Request, ep: GetBucketConfiguration) -> web.Response:
    """GetBucketCors, GetBucketTagging, GetBucketPolicy: the stored document;
    GetBucketEncryption (Website, Replication) and the others when none is set: 404.

    Raises:
        NoSuchBucket: the bucket does not exist.
        NoSuchConfiguration: none is set, with S3's code for that configuration.
    """
    if ep.config == "policy":
        return await _policy.get_bucket_policy(s, req, ep)
    document = await s.call(s.engine.get_bucket_config, ep.bucket, ep.config)
    render = _RENDER.get(ep.config)
    if document is None or render is None:
        code, message = NOT_SET[ep.config]
        raise NoSuchConfiguration(message, code=code, bucket=ep.bucket)
    return s.xml(render(document))


async def delete_bucket_configuration(s: Services, req: S3Request, ep: DeleteBucketConfiguration) -> web.Response:
    """DeleteBucketCors (Tagging, Policy, Encryption, Website, Replication): 204,
    also when none was set.

    Raises:
        NoSuchBucket: the bucket does not exist.
    """
    if ep.config == "policy":
        return await _policy.delete_bucket_policy(s, req, ep)
    await s.call(s.engine.delete_bucket_config, ep.bucket, ep.config)
    return web.Response(status=204)


async def put_bucket_tagging(s: Services, req: S3Request, ep: PutBucketTagging) -> web.Response:
    """PutBucketTagging: replace the bucket's tag set (204, no body); an empty
    tag set removes it.

    Raises:
        InvalidRequestError: neither ``Content-MD5`` nor a checksum header.
        BadDigest: the body does not match them.
        MalformedXML, BadRequest, InvalidTag: see :func:`parse_tagging`.
        NoSuchBucket: no such bucket (checked first; nothing changes on any error).
    """
    require_integrity_header(req.headers)
    tags = parse_tagging(await s.read_xml(req))
    if tags:
        await s.call(s.engine.put_bucket_config, ep.bucket, "tagging", json.dumps(tags))
    else:
        await s.call(s.engine.delete_bucket_config, ep.bucket, "tagging")
    return web.Response(status=204)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    GetBucketConfiguration: get_bucket_configuration,
    DeleteBucketConfiguration: delete_bucket_configuration,
    PutBucketTagging: put_bucket_tagging,
}
