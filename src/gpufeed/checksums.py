"""The S3 checksum algorithms (``x-amz-checksum-*``) and the multipart composite.

Shared by the engine (which combines part checksums when a multipart upload
completes) and the S3 front (which checks request bodies against them).

CRC32 uses :func:`zlib.crc32` (C speed). CRC32C and CRC64NVME have no C
implementation in this environment, so they are table-driven pure Python
(~10 MB/s): callers compute them only when a client asked for them.

Source: "Checking object integrity", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Sequence

from .errors import InvalidRequestError

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "COMPOSITE_ALGORITHMS",
    "composite_checksum",
    "crc32c",
    "crc64nvme",
    "new_hasher",
]


def _make_table(poly: int) -> list[int]:
    """Byte-at-a-time lookup table of a reflected CRC with polynomial ``poly``."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _make_table(0x82F63B78)  # Castagnoli, reflected
_CRC64NVME_TABLE = _make_table(0x9A6C9329AC4BC9B5)  # NVMe, reflected


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data`` continuing from ``crc``.

    Args:
        data: any buffer.
        crc: the value returned for the preceding bytes (0 to start).

    Returns:
        The unsigned 32-bit CRC.
    """
    table = _CRC32C_TABLE
    c = crc ^ 0xFFFFFFFF
    for b in memoryview(data).cast("B"):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def crc64nvme(data, crc: int = 0) -> int:
    """CRC-64/NVME of ``data`` continuing from ``crc`` (unsigned 64-bit result)."""
    table = _CRC64NVME_TABLE
    mask = 0xFFFFFFFFFFFFFFFF
    c = crc ^ mask
    for b in memoryview(data).cast("B"):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ mask


class _Crc:
    """hashlib-like wrapper of an incremental CRC function."""

    def __init__(self, fn, nbytes: int) -> None:
        self._fn = fn
        self._nbytes = nbytes
        self._value = 0

    def update(self, data) -> None:
        self._value = self._fn(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._nbytes, "big")


#: Algorithm name (lower case, as in ``x-amz-checksum-<name>``) -> digest length, bytes.
CHECKSUM_ALGORITHMS: dict[str, int] = {
    "crc32": 4,
    "crc32c": 4,
    "crc64nvme": 8,
    "sha1": 20,
    "sha256": 32,
}

#: Algorithms S3 combines into a composite ("checksum of checksums") for
#: multipart objects; CRC64NVME is full-object only.
COMPOSITE_ALGORITHMS = ("crc32", "crc32c", "sha1", "sha256")


def new_hasher(algorithm: str):
    """A fresh incremental hasher for ``algorithm`` (a key of :data:`CHECKSUM_ALGORITHMS`).

    Raises:
        InvalidRequestError: an algorithm S3 does not define.
    """
    if algorithm == "crc32":
        return _Crc(zlib.crc32, 4)
    if algorithm == "crc32c":
        return _Crc(crc32c, 4)
    if algorithm == "crc64nvme":
        return _Crc(crc64nvme, 8)
    if algorithm == "sha1":
        return hashlib.sha1()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise InvalidRequestError(f"unsupported checksum algorithm {algorithm!r}")


def composite_checksum(algorithm: str, parts_b64: Sequence[str]) -> str:
    """S3's composite checksum of a multipart object: ``<b64 of H(d1 || d2 || ...)>-N``.

    ``d1..dN`` are the raw (base64-decoded) part checksums in part order and
    ``H`` is the same algorithm, so a CRC32 composite is the CRC32 of the
    concatenated 4-byte part CRCs, followed by ``-`` and the number of parts.

    Args:
        algorithm: one of :data:`COMPOSITE_ALGORITHMS`.
        parts_b64: the base64 checksum of each part, in part-number order.

    Returns:
        The composite, e.g. ``"AAAAAA==-3"``.

    Raises:
        InvalidRequestError: an algorithm S3 does not combine, or a part
            checksum that is not base64 of the algorithm's digest length.
    """
    if algorithm not in COMPOSITE_ALGORITHMS:
        raise InvalidRequestError(f"{algorithm!r} has no composite multipart checksum")
    h = new_hasher(algorithm)
    for value in parts_b64:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequestError(f"part checksum {value!r} is not base64") from exc
        if len(raw) != CHECKSUM_ALGORITHMS[algorithm]:
            raise InvalidRequestError(f"part {algorithm} checksum {value!r} has the wrong length")
        h.update(raw)
    return f"{base64.b64encode(h.digest()).decode()}-{len(parts_b64)}"
