"""S3 object listing: ListObjects (markers) and ListObjectsV2 (continuation tokens).

With ``encoding-type=url`` S3 encodes every key-valued element of the answer:
ListObjects its ``Prefix``, ``Marker``, ``Delimiter``, ``NextMarker``, keys
and common prefixes; ListObjectsV2 its ``Prefix``, ``StartAfter``,
``Delimiter``, keys and common prefixes (continuation tokens stay opaque).
The encoding is form encoding with ``/`` kept: a space becomes ``+``, a
``+`` ``%2B`` (measured on S3: ``a b.txt`` -> ``a+b.txt``, ``a+b.txt`` ->
``a%2Bb.txt``), so clients that decode with ``unquote_plus`` (botocore)
get the key back.

Source: "ListObjects" and "ListObjectsV2", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjects.html
"""

from __future__ import annotations

from urllib.parse import quote_plus

from aiohttp import web

from ..errors import InvalidArgument
from ._context import HandlerTable, S3Request, Services
from ._headers import quote_etag
from ._router import ListObjects
from ._snapshots import snapshot_arg
from ._xml import element, iso8601, sub

__all__ = ["HANDLERS", "url_encoder"]


def url_encoder(encoding: str | None):
    """The key encoder of ``encoding-type``: S3's form encoding for ``url``
    (``/`` kept, space as ``+``), else identity."""

    def enc(s: str) -> str:
        return quote_plus(s, safe="/") if encoding == "url" else s

    return enc


async def list_objects(s: Services, req: S3Request, ep: ListObjects) -> web.Response:
    """ListObjects / ListObjectsV2: one page of keys and common prefixes.

    An empty ``continuation-token`` starts from the beginning (as S3 does);
    ``snapshot`` lists the keys a snapshot recorded (:mod:`._snapshots`).

    Raises:
        InvalidArgument: a bad ``encoding-type`` or ``max-keys``, a token we did not make.
    """
    q, v2 = req.query, ep.v2
    prefix = q.get("prefix", "")
    delimiter = q.get("delimiter", "")
    encoding = q.get("encoding-type")
    if encoding not in (None, "url"):
        raise InvalidArgument("Invalid Encoding Method specified in Request")
    max_keys = s.query_int(q, "max-keys", 1000, 1000)
    token = (q.get("continuation-token") or None) if v2 else None
    start_after = q.get("start-after", "") if v2 else q.get("marker", "")
    # A v1 NextMarker that is a common prefix ("b/") skips everything under it:
    # the engine's list_objects does that for any start_after.
    snapshot = snapshot_arg(q)
    if max_keys == 0 and snapshot is None:
        await s.call(s.engine.head_bucket, ep.bucket)
        objects, prefixes, truncated, next_token, next_marker = [], [], False, None, None
    else:
        res = await s.call(
            s.engine.list_objects, ep.bucket, prefix=prefix, delimiter=delimiter,
            start_after=start_after, continuation_token=token, max_keys=max_keys, snapshot=snapshot,
        )
        objects, prefixes = res.objects, res.common_prefixes
        truncated, next_token, next_marker = res.is_truncated, res.next_token, res.next_marker
    enc = url_encoder(encoding)
    root = element("ListBucketResult")
    sub(root, "Name", ep.bucket)
    sub(root, "Prefix", enc(prefix))
    if v2:
        if token is not None:
            sub(root, "ContinuationToken", token)
        if start_after:
            sub(root, "StartAfter", enc(start_after))
        sub(root, "KeyCount", len(objects) + len(prefixes))
    else:
        sub(root, "Marker", enc(q.get("marker", "")))
    sub(root, "MaxKeys", max_keys)
    if delimiter:
        sub(root, "Delimiter", enc(delimiter))
    if encoding:
        sub(root, "EncodingType", encoding)
    sub(root, "IsTruncated", truncated)
    if truncated:
        if v2:
            sub(root, "NextContinuationToken", next_token)
        else:
            marker = next_marker
            if marker is None:
                marker = max([o.key for o in objects] + prefixes) if (objects or prefixes) else ""
            sub(root, "NextMarker", enc(marker))
    _add_entries(s, root, objects, prefixes, enc, with_owner=not v2 or q.get("fetch-owner") == "true")
    return s.xml(root)


def _add_entries(s: Services, root, objects, prefixes, enc, *, with_owner: bool) -> None:
    """Append the ``Contents`` of ``objects`` then the ``CommonPrefixes``."""
    for o in objects:
        c = sub(root, "Contents")
        sub(c, "Key", enc(o.key))
        sub(c, "LastModified", iso8601(o.last_modified))
        sub(c, "ETag", quote_etag(o.etag))
        if o.checksums:
            for alg in o.checksums:
                sub(c, "ChecksumAlgorithm", alg.upper())
        sub(c, "Size", o.size)
        if with_owner:
            s.owner(c)
        sub(c, "StorageClass", "STANDARD")
    for p in prefixes:
        cp = sub(root, "CommonPrefixes")
        sub(cp, "Prefix", enc(p))


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    ListObjects: list_objects,
}
