"""The parts of a multipart object: GetObjectAttributes, and the byte range of
GetObject / HeadObject with ``partNumber``.

A version made by CompleteMultipartUpload keeps the sizes and checksums of the
parts it was joined from (:meth:`gpufeed.engine.Engine.object_parts`); part
``n`` of the object is the ``n``-th part joined, whatever number it was
uploaded under. Any other version is one part: ``partNumber=1`` reads all of
it, as S3 does.

Sources: "GetObjectAttributes" and "GetObject" (``partNumber``,
``x-amz-mp-parts-count``), Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObjectAttributes.html
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from ..engine import Engine, ObjectInfo
from ..errors import InvalidArgument, InvalidPartNumber
from ._context import HandlerTable, S3Request, Services
from ._features import check_read_request
from ._router import GetObjectAttributes
from ._versions import read_version, version_arg
from ._xml import element, http_date, sub

__all__ = ["HANDLERS", "CHECKSUM_ELEMENT", "part_range", "parse_part_number"]

#: XML element of each checksum algorithm.
CHECKSUM_ELEMENT = {
    "crc32": "ChecksumCRC32", "crc32c": "ChecksumCRC32C", "crc64nvme": "ChecksumCRC64NVME",
    "sha1": "ChecksumSHA1", "sha256": "ChecksumSHA256",
}
#: Attributes a GetObjectAttributes request may name.
_ATTRIBUTES = frozenset({"ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"})
_PART_NUMBER_RANGE = "Part number must be an integer between 1 and 10000, inclusive"


def parse_part_number(value: str) -> int:
    """A ``partNumber`` query value.

    Raises:
        InvalidArgument: not an integer from 1 to 10000.
    """
    try:
        number = int(value)
    except ValueError as exc:
        raise InvalidArgument(_PART_NUMBER_RANGE) from exc
    if not 1 <= number <= 10000:
        raise InvalidArgument(_PART_NUMBER_RANGE)
    return number


def part_range(engine: Engine, info: ObjectInfo, number: int) -> tuple[int, int, int | None]:
    """Where part ``number`` of the version ``info`` lies (blocking: reads the catalog).

    Returns:
        ``(offset, length, parts count)`` in bytes; the count is ``None`` for a
        version that is not multipart (its one part is the whole object).

    Raises:
        InvalidPartNumber: the object has no such part (416, as S3 answers:
            "The requested partnumber is not satisfiable").
    """
    parts = engine.object_parts(info)
    if not parts:
        if number != 1:
            raise InvalidPartNumber("The requested partnumber is not satisfiable", part_number=number)
        return 0, info.size, None
    if number > len(parts):
        raise InvalidPartNumber("The requested partnumber is not satisfiable", part_number=number)
    offset = sum(p.size for p in parts[: number - 1])
    return offset, parts[number - 1].size, len(parts)


def _header_int(headers: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = headers.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise InvalidArgument(f"{name} must be an integer between {low} and {high}") from exc
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer between {low} and {high}")
    return value


def _wanted(headers) -> set[str]:
    """The attributes named by ``x-amz-object-attributes`` (comma-separated, maybe repeated)."""
    wanted = {a.strip() for v in headers.getall("x-amz-object-attributes", []) for a in v.split(",") if a.strip()}
    if not wanted:
        raise InvalidArgument("The x-amz-object-attributes header specifying the attributes to be "
                              "retrieved is either missing or empty")
    unknown = wanted - _ATTRIBUTES
    if unknown:
        raise InvalidArgument(f"Invalid attribute name specified: {sorted(unknown)[0]}")
    return wanted


async def get_object_attributes(s: Services, req: S3Request, ep: GetObjectAttributes) -> web.Response:
    """GetObjectAttributes: ETag (unquoted, as S3 sends it here), checksum, parts,
    storage class and size, each only when asked.

    Raises:
        InvalidArgument: no or an unknown attribute; a bad ``x-amz-max-parts``
            or ``x-amz-part-number-marker``.
        NoSuchKey, NoSuchBucket: as for HeadObject.
    """
    h = req.headers
    check_read_request(h, req.query)
    wanted = _wanted(h)
    max_parts = _header_int(h, "x-amz-max-parts", 1000, 0, 1000)
    marker = _header_int(h, "x-amz-part-number-marker", 0, 0, 10000)
    info, _, versions = await s.call(read_version, s, ep.bucket, ep.key, version_arg(req.query), open_file=False)
    parts = await s.call(s.engine.object_parts, info) if "ObjectParts" in wanted else []
    root = element("GetObjectAttributesResponse")
    if "ETag" in wanted:
        sub(root, "ETag", info.etag)
    if "Checksum" in wanted and info.checksums:
        el = sub(root, "Checksum")
        for alg, value in info.checksums.items():
            sub(el, CHECKSUM_ELEMENT[alg], value)
        composite = any("-" in v for v in info.checksums.values())
        sub(el, "ChecksumType", "COMPOSITE" if composite else "FULL_OBJECT")
    if "ObjectParts" in wanted and parts:
        numbered = list(enumerate(parts, start=1))[marker:]
        page, truncated = numbered[:max_parts], len(numbered) > max_parts
        el = sub(root, "ObjectParts")
        sub(el, "PartsCount", len(parts))  # the wire name of TotalPartsCount
        sub(el, "PartNumberMarker", marker)
        sub(el, "NextPartNumberMarker", page[-1][0] if page else marker)
        sub(el, "MaxParts", max_parts)
        sub(el, "IsTruncated", truncated)
        for number, part in page:
            p = sub(el, "Part")
            for alg, value in part.checksums.items():
                sub(p, CHECKSUM_ELEMENT[alg], value)
            sub(p, "PartNumber", number)
            sub(p, "Size", part.size)
    if "StorageClass" in wanted:
        sub(root, "StorageClass", "STANDARD")
    if "ObjectSize" in wanted:
        sub(root, "ObjectSize", info.size)
    return s.xml(root, headers={"Last-Modified": http_date(info.last_modified)} | versions)


#: Endpoint -> handler of this family.
HANDLERS: HandlerTable = {
    GetObjectAttributes: get_object_attributes,
}
