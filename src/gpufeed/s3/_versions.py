"""S3 versioning: PutBucketVersioning, GetBucketVersioning, ListObjectVersions,
and the version headers and parameters of the object calls.

The engine keeps the versions (:mod:`gpufeed.engine._versions` holds the
rules); this module says them in S3's words:

- ``versionId`` query parameters (:func:`version_arg`) are passed to the
  engine, which refuses a malformed one with ``InvalidArgument`` "Invalid
  version id specified".
- ``x-amz-version-id`` on GetObject / HeadObject whenever the object's
  bucket is or was versioned (``null`` included), never for a bucket that
  never was (:func:`read_headers`); on PutObject, CopyObject and
  CompleteMultipartUpload for a version with an id (:func:`write_headers`:
  a ``null`` version, of a never-versioned or suspended bucket, is not
  named); ``x-amz-copy-source-version-id`` on copies from a versioned
  source (:func:`copy_source_headers`); DeleteObject's
  ``x-amz-version-id`` and ``x-amz-delete-marker`` (:func:`delete_headers`).
- Errors about versions carry their headers and elements
  (:func:`error_extras`): a key whose latest version is a delete marker is
  404 ``NoSuchKey`` with ``x-amz-delete-marker: true`` and the marker's
  ``x-amz-version-id``; a delete marker asked for by id is 405
  ``MethodNotAllowed`` with ``x-amz-delete-marker: true`` and its
  ``Last-Modified``; ``NoSuchVersion`` names its ``Key`` and ``VersionId``.

Sources: "PutBucketVersioning", "GetBucketVersioning", "ListObjectVersions",
"GetObject", "HeadObject", "DeleteObject", "CopyObject", Amazon S3 API
Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/; "Working with
delete markers", Amazon S3 User Guide.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from ..engine import Engine, ObjectInfo
from ..engine.types import DeleteResult
from ..errors import GpufeedError, InvalidArgument, MalformedXML, NotImplementedByGpufeed
from ._context import HandlerTable, S3Request, Services
from ._headers import quote_etag
from ._listing import url_encoder
from ._router import GetBucketVersioning, ListObjectVersions, PutBucketVersioning
from ._xml import child_text, element, http_date, iso8601, local, parse_xml, sub

__all__ = [
    "HANDLERS",
    "version_arg",
    "read_version",
    "read_headers",
    "write_headers",
    "copy_source_headers",
    "delete_headers",
    "error_extras",
]

_STATES = ("Enabled", "Suspended")
_MALFORMED = "The XML you provided was not well-formed or did not validate against our published schema."


# -- request parameters and response headers ----------------------------------------

def version_arg(query: Mapping[str, str]) -> str | None:
    """The ``versionId`` query parameter, or None; its form is the engine's to check.

    Raises:
        InvalidArgument: an empty ``versionId`` (S3: "Version id cannot be the empty string").
    """
    version = query.get("versionId")
    if version == "":
        raise InvalidArgument("Version id cannot be the empty string", argument="versionId")
    return version


def read_headers(engine: Engine, info: ObjectInfo) -> dict[str, str]:
    """``x-amz-version-id`` of a version read by GetObject / HeadObject:
    sent when the bucket is or was versioned, ``null`` included (blocking: a
    ``null`` version costs one catalog read of its bucket).

    Raises:
        NoSuchBucket: the bucket went meanwhile.
    """
    if info.version_id != "null" or engine.head_bucket(info.bucket).versioning:
        return {"x-amz-version-id": info.version_id}
    return {}


def read_version(s: Services, bucket: str, key: str, version_id: str | None, *,
                 open_file: bool, snapshot: str | None = None):
    """Look a version up (and open it for reading) with its :func:`read_headers`,
    in one blocking call for the worker pool.

    Returns:
        ``(info, handle or None, headers)``; the caller closes the
        :class:`~gpufeed.engine.ObjectHandle`.

    Raises:
        NoSuchBucket, NoSuchKey, NoSuchVersion, MethodNotAllowed, InvalidArgument,
            NoSuchSnapshot: as :meth:`gpufeed.engine.Engine.head_object` raises them
            (``snapshot``: the version that snapshot recorded).
    """
    if open_file:
        info, fobj = s.open_dup(bucket, key, version_id, snapshot)
    else:
        info, fobj = s.engine.head_object(bucket, key, version_id, snapshot=snapshot), None
    try:
        return info, fobj, read_headers(s.engine, info)
    except BaseException:
        if fobj is not None:
            fobj.close()
        raise


def write_headers(info: ObjectInfo) -> dict[str, str]:
    """``x-amz-version-id`` of a version just written (none for a ``null`` version)."""
    return {"x-amz-version-id": info.version_id} if info.version_id != "null" else {}


def copy_source_headers(engine: Engine, src: ObjectInfo) -> dict[str, str]:
    """``x-amz-copy-source-version-id`` of a copy's source, when its bucket is or was
    versioned (blocking, as :func:`read_headers`)."""
    found = read_headers(engine, src)
    return {"x-amz-copy-source-version-id": found["x-amz-version-id"]} if found else {}


def delete_headers(result: DeleteResult) -> dict[str, str]:
    """DeleteObject's ``x-amz-version-id`` (the version removed or the delete
    marker made) and ``x-amz-delete-marker: true`` (either was a delete marker)."""
    headers: dict[str, str] = {}
    if result.version_id is not None:
        headers["x-amz-version-id"] = result.version_id
    if result.delete_marker:
        headers["x-amz-delete-marker"] = "true"
    return headers


def error_extras(exc: GpufeedError, method: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The headers and extra ``<Error>`` elements of an error about a version.

    Args:
        exc: the error; its details ``delete_marker``, ``version_id`` and
            ``last_modified`` (Unix s) are used.
        method: the request's HTTP method (named by a 405's ``Method``).

    Returns:
        ``(headers, [(element, text), ...])``, both empty for other errors.
    """
    d = exc.details
    headers: dict[str, str] = {}
    elements: list[tuple[str, str]] = []
    if d.get("delete_marker"):
        headers["x-amz-delete-marker"] = "true"
        if exc.code == "MethodNotAllowed":
            if "last_modified" in d:
                headers["Last-Modified"] = http_date(float(str(d["last_modified"])))
            elements += [("Method", method), ("ResourceType", "DeleteMarker")]
        elif "version_id" in d:
            headers["x-amz-version-id"] = str(d["version_id"])
    if exc.code == "NoSuchVersion" and "version_id" in d:
        elements.append(("VersionId", str(d["version_id"])))
    return headers, elements


# -- bucket versioning ---------------------------------------------------------------

def _versioning_state(data: bytes) -> str | None:
    """A VersioningConfiguration document -> its ``Status`` (None: not given).

    Raises:
        MalformedXML: not that document, or a Status / MfaDelete S3 does not know.
        NotImplementedByGpufeed: ``MfaDelete`` ``Enabled``.
    """
    doc = parse_xml(data)
    if local(doc.tag) != "VersioningConfiguration":
        raise MalformedXML(_MALFORMED)
    for el in doc:
        if local(el.tag) not in ("Status", "MfaDelete"):
            raise MalformedXML(_MALFORMED)
    mfa = child_text(doc, "MfaDelete")
    if mfa is not None and mfa.strip() not in ("Enabled", "Disabled"):
        raise MalformedXML(_MALFORMED)
    if mfa is not None and mfa.strip() == "Enabled":
        raise NotImplementedByGpufeed("MFA delete (MfaDelete) is not implemented by gpufeed")
    status = child_text(doc, "Status")
    if status is not None and status.strip() not in _STATES:
        raise MalformedXML(_MALFORMED)
    return status.strip() if status is not None else None


async def put_bucket_versioning(s: Services, req: S3Request, ep: PutBucketVersioning) -> web.Response:
    """PutBucketVersioning: ``Status`` ``Enabled`` or ``Suspended``; a document
    without ``Status`` changes nothing.

    Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketVersioning.html

    Raises:
        MalformedXML: see :func:`_versioning_state`.
        NotImplementedByGpufeed: MFA delete (``MfaDelete`` ``Enabled``, ``x-amz-mfa``).
        NoSuchBucket, InvalidArgument, InvalidBucketState: as the engine refuses
            (a kv bucket; suspending a bucket with object lock).
    """
    if "x-amz-mfa" in req.headers:
        raise NotImplementedByGpufeed("MFA delete (x-amz-mfa) is not implemented by gpufeed")
    state = _versioning_state(await s.read_xml(req))
    if state is None:
        await s.call(s.engine.head_bucket, ep.bucket)
    else:
        await s.call(s.engine.put_bucket_versioning, ep.bucket, state)
    return web.Response(status=200)


async def get_bucket_versioning(s: Services, req: S3Request, ep: GetBucketVersioning) -> web.Response:
    """GetBucketVersioning: an empty configuration for a bucket never versioned,
    else its ``Status``.

    Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketVersioning.html
    """
    state = await s.call(s.engine.get_bucket_versioning, ep.bucket)
    root = element("VersioningConfiguration")
    if state:
        sub(root, "Status", state)
    return s.xml(root)


# -- ListObjectVersions --------------------------------------------------------------

def _add_version(s: Services, root, v: ObjectInfo, enc) -> None:
    """Append one ``Version`` or ``DeleteMarker`` element."""
    el = sub(root, "DeleteMarker" if v.delete_marker else "Version")
    sub(el, "Key", enc(v.key))
    sub(el, "VersionId", v.version_id)
    sub(el, "IsLatest", v.is_latest)
    sub(el, "LastModified", iso8601(v.last_modified))
    if not v.delete_marker:
        sub(el, "ETag", quote_etag(v.etag))
        for alg in v.checksums:
            sub(el, "ChecksumAlgorithm", alg.upper())
        sub(el, "Size", v.size)
        sub(el, "StorageClass", "STANDARD")
    s.owner(el)


async def list_object_versions(s: Services, req: S3Request, ep: ListObjectVersions) -> web.Response:
    """ListObjectVersions: one page of versions and delete markers, by key and
    newest first within a key, and common prefixes; a never-versioned bucket
    lists each object as version ``null``.

    Source: https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectVersions.html

    Raises:
        InvalidArgument: a bad ``encoding-type`` or ``max-keys``, a version-id
            marker without a key marker or malformed.
        NoSuchBucket: the bucket does not exist.
    """
    q = req.query
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
    key_marker, id_marker = q.get("key-marker", ""), q.get("version-id-marker", "")
    encoding = q.get("encoding-type")
    if encoding not in (None, "url"):
        raise InvalidArgument("Invalid Encoding Method specified in Request")
    max_keys = s.query_int(q, "max-keys", 1000, 1000)
    res = await s.call(s.engine.list_object_versions, ep.bucket, prefix=prefix, delimiter=delimiter,
                       key_marker=key_marker, version_id_marker=id_marker, max_keys=max_keys)
    enc = url_encoder(encoding)
    root = element("ListVersionsResult")
    sub(root, "Name", ep.bucket)
    sub(root, "Prefix", enc(prefix))
    sub(root, "KeyMarker", enc(key_marker))
    sub(root, "VersionIdMarker", id_marker)
    if res.is_truncated:
        if res.next_key_marker is not None:
            sub(root, "NextKeyMarker", enc(res.next_key_marker))
        if res.next_version_id_marker is not None:
            sub(root, "NextVersionIdMarker", res.next_version_id_marker)
    sub(root, "MaxKeys", max_keys)
    if delimiter:
        sub(root, "Delimiter", enc(delimiter))
    if encoding:
        sub(root, "EncodingType", encoding)
    sub(root, "IsTruncated", res.is_truncated)
    for v in res.versions:
        _add_version(s, root, v, enc)
    for p in res.common_prefixes:
        sub(sub(root, "CommonPrefixes"), "Prefix", enc(p))
    return s.xml(root)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    PutBucketVersioning: put_bucket_versioning,
    GetBucketVersioning: get_bucket_versioning,
    ListObjectVersions: list_object_versions,
}
