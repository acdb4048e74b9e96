"""The S3 checksum algorithms (``x-amz-checksum-*``), multipart composites and
full-object CRC combination.

Shared by the engine (which combines part checksums when a multipart upload
completes) and the S3 front (which checks request bodies against them).

Every algorithm runs in native code that releases the GIL on large buffers, so
hashing on a worker thread never stalls the event loop. Measured on the 2-core
development machine (64 MiB buffers, GB/s): CRC32 ``isal.isal_zlib.crc32``
6-12 (ISA-L; :func:`zlib.crc32` 1.6-3.3 is the fallback without the ``isal``
package, awscrt's CRC32 1.8); CRC32C ``awscrt.checksums.crc32c``
8.7; CRC64NVME ``awscrt.checksums.crc64nvme`` 10.6; SHA-1 (:mod:`hashlib`)
0.95; SHA-256 1.2; MD5 0.43. CRC32C and CRC64NVME need the ``awscrt``
package (a dependency of gpufeed); without it they raise
:class:`MissingDependency` when used.

Full-object CRCs of a multipart upload are combined from the part CRCs and
part sizes without reading the data again. For the CRC-32, CRC-32C and
CRC-64/NVME variants S3 uses (reflected, initial value and final XOR all
ones), with ``P`` the generator polynomial and ``|B|`` the byte length of
``B``::

    crc(A || B) = (crc(A) * x^(8 |B|) mod P) xor crc(B)

the product taken in GF(2)[x] (the all-ones init and final XOR cancel). This is
zlib's ``crc32_combine`` (Mark Adler, zlib 1.2.12 ``crc32.c``: ``multmodp``
and ``x2nmodp``), generalised to any width and polynomial;
:func:`combine_crc` implements it and is checked against awscrt's
``combine_crc*`` and against the CRC of the concatenated data in the tests.

Sources: "Checking object integrity", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html
(composite and full-object multipart checksums); zlib ``crc32.c``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import zlib
from collections.abc import Callable, Mapping, Sequence

from .errors import InvalidRequestError

try:
    from awscrt import checksums as _crt
except ImportError:  # pragma: no cover - awscrt is a declared dependency
    _crt = None
_isal_crc32: Callable[..., int] | None
try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # a declared dependency too, but zlib gives the same values
    _isal_crc32 = None

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "COMPOSITE_ALGORITHMS",
    "FULL_OBJECT_ALGORITHMS",
    "MissingDependency",
    "combine_crc",
    "composite_checksum",
    "crc32c",
    "crc64nvme",
    "full_object_checksum",
    "multipart_checksums",
    "new_hasher",
    "CHECKSUM_TYPES",
    "UPLOAD_CHECKSUM_TYPE",
    "UPLOAD_CHECKSUM_ALGORITHM",
]


class MissingDependency(ImportError):
    """A checksum needs a package that is not installed (its name is in the message)."""


def _require_crt():
    if _crt is None:
        raise MissingDependency("CRC32C and CRC64NVME checksums need the 'awscrt' package: pip install awscrt")
    return _crt


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data`` continuing from ``crc`` (awscrt, native).

    Args:
        data: any C-contiguous buffer.
        crc: the value returned for the preceding bytes (0 to start).

    Returns:
        The unsigned 32-bit CRC.

    Raises:
        MissingDependency: awscrt is not installed.
    """
    return _require_crt().crc32c(data, crc)


def crc64nvme(data, crc: int = 0) -> int:
    """CRC-64/NVME of ``data`` continuing from ``crc`` (awscrt, native).

    Args:
        data: any C-contiguous buffer.
        crc: the value returned for the preceding bytes (0 to start).

    Returns:
        The unsigned 64-bit CRC.

    Raises:
        MissingDependency: awscrt is not installed.
    """
    return _require_crt().crc64nvme(data, crc)


def _crc32_zlib(data, crc: int = 0) -> int:
    return zlib.crc32(data, crc)


#: CRC-32 (the gzip polynomial, boto3's default upload checksum): ISA-L's
#: (python-isal, carry-less multiply) when it is installed, 3-6 x zlib's speed
#: here with the same values; zlib's otherwise. A soft dependency on purpose:
#: an environment without it stays correct, only slower.
_crc32: Callable[..., int] = _isal_crc32 if _isal_crc32 is not None else _crc32_zlib


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

#: Algorithms with a full-object multipart checksum (the CRCs, combinable).
FULL_OBJECT_ALGORITHMS = ("crc32", "crc32c", "crc64nvme")

#: How a multipart object's checksum is made from its parts' checksums.
CHECKSUM_TYPES = ("COMPOSITE", "FULL_OBJECT")

#: Key of an upload's stored headers that holds its checksum type (set at
#: CreateMultipartUpload, read at completion, never published with the object).
UPLOAD_CHECKSUM_TYPE = "x-gpufeed-checksum-type"

#: Key of an upload's stored headers that holds its checksum algorithm
#: (lower case, as named at CreateMultipartUpload; never published with the object).
UPLOAD_CHECKSUM_ALGORITHM = "x-gpufeed-checksum-algorithm"

#: CRC name -> (width in bits, reflected polynomial, incremental function).
_CRCS: dict[str, tuple[int, int, Callable[..., int]]] = {
    "crc32": (32, 0xEDB88320, _crc32),
    "crc32c": (32, 0x82F63B78, crc32c),
    "crc64nvme": (64, 0x9A6C9329AC4BC9B5, crc64nvme),
}


class _Crc:
    """hashlib-like wrapper of an incremental CRC function."""

    __slots__ = ("_fn", "_nbytes", "_value")

    def __init__(self, fn: Callable[..., int], nbytes: int) -> None:
        self._fn = fn
        self._nbytes = nbytes
        self._value = 0

    def update(self, data) -> None:
        self._value = self._fn(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._nbytes, "big")


def new_hasher(algorithm: str):
    """A fresh incremental hasher for ``algorithm`` (a key of :data:`CHECKSUM_ALGORITHMS`).

    Returns:
        An object with ``update(buffer)`` and ``digest() -> bytes`` (big-endian
        for the CRCs, as S3 encodes them before base64).

    Raises:
        InvalidRequestError: an algorithm S3 does not define.
        MissingDependency: CRC32C or CRC64NVME without awscrt.
    """
    if algorithm in _CRCS:
        width, _, fn = _CRCS[algorithm]
        if algorithm != "crc32":
            _require_crt()
        return _Crc(fn, width // 8)
    if algorithm == "sha1":
        return hashlib.sha1()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise InvalidRequestError(f"unsupported checksum algorithm {algorithm!r}")


# -- CRC combination (zlib's crc32_combine, any width) ----------------------------

def _multmodp(a: int, b: int, poly: int, width: int) -> int:
    """``a * b mod P`` in GF(2)[x], both in reflected bit order (x^0 is the top bit)."""
    m = 1 << (width - 1)
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1


@functools.lru_cache(maxsize=256)
def _x8nmodp(nbytes: int, poly: int, width: int) -> int:
    """``x^(8 * nbytes) mod P`` (reflected), by squaring: x^(2^k) for each set bit."""
    p = 1 << (width - 1)  # x^0
    square = 1 << (width - 2)  # x^1; squared three times: x^8, the shift of one byte
    for _ in range(3):
        square = _multmodp(square, square, poly, width)
    n = nbytes
    while n:
        if n & 1:
            p = _multmodp(square, p, poly, width)
        n >>= 1
        square = _multmodp(square, square, poly, width)
    return p


def combine_crc(algorithm: str, crc1: int, crc2: int, len2: int) -> int:
    """The CRC of ``A || B`` from ``crc1 = crc(A)``, ``crc2 = crc(B)`` and ``len2 = |B|``.

    ``(crc1 * x^(8 len2) mod P) xor crc2`` (see the module docstring; zlib's
    ``crc32_combine``). Pure integer maths: O(log len2) polynomial products,
    cached per ``len2`` (parts of one upload mostly share a size).

    Args:
        algorithm: ``"crc32"``, ``"crc32c"`` or ``"crc64nvme"``.
        crc1: CRC of the first block.
        crc2: CRC of the second block.
        len2: length of the second block, bytes (>= 0).

    Returns:
        The combined CRC (unsigned, the algorithm's width).

    Raises:
        InvalidRequestError: not a CRC algorithm.
    """
    if algorithm not in _CRCS:
        raise InvalidRequestError(f"{algorithm!r} has no full-object multipart checksum")
    width, poly, _ = _CRCS[algorithm]
    if len2 <= 0:
        return crc1 if len2 == 0 else _bad_len(len2)
    return _multmodp(_x8nmodp(len2, poly, width), crc1, poly, width) ^ crc2


def _bad_len(len2: int) -> int:
    raise InvalidRequestError(f"block length must be >= 0, not {len2}")


def _decode_part(algorithm: str, value: str) -> bytes:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidRequestError(f"part checksum {value!r} is not base64") from exc
    if len(raw) != CHECKSUM_ALGORITHMS[algorithm]:
        raise InvalidRequestError(f"part {algorithm} checksum {value!r} has the wrong length")
    return raw


def full_object_checksum(algorithm: str, parts: Sequence[tuple[str, int]]) -> str:
    """S3's full-object checksum of a multipart object: the CRC of all its bytes,
    combined from the parts' CRCs (no ``-N`` suffix).

    Args:
        algorithm: one of :data:`FULL_OBJECT_ALGORITHMS`.
        parts: ``(base64 CRC, size in bytes)`` of each part, in part-number order.

    Returns:
        The base64 CRC of the whole object, e.g. ``"yZRlqg=="``.

    Raises:
        InvalidRequestError: not a CRC algorithm, or a part checksum that is not
            base64 of the algorithm's digest length.
    """
    if algorithm not in FULL_OBJECT_ALGORITHMS:
        raise InvalidRequestError(f"{algorithm!r} has no full-object multipart checksum")
    nbytes = CHECKSUM_ALGORITHMS[algorithm]
    crc = 0
    for value, size in parts:
        crc = combine_crc(algorithm, crc, int.from_bytes(_decode_part(algorithm, value), "big"), size)
    return base64.b64encode(crc.to_bytes(nbytes, "big")).decode()


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
        h.update(_decode_part(algorithm, value))
    return f"{base64.b64encode(h.digest()).decode()}-{len(parts_b64)}"


def multipart_checksums(parts: Sequence[tuple[Mapping[str, str], int]],
                        checksum_type: str | None = None) -> dict[str, str]:
    """The checksums of a multipart object, from its parts' checksums and sizes.

    For each algorithm every part carries: with ``"FULL_OBJECT"``, the CRCs
    (:data:`FULL_OBJECT_ALGORITHMS`) combined into the CRC of the whole object;
    with ``"COMPOSITE"``, :func:`composite_checksum` of
    :data:`COMPOSITE_ALGORITHMS`; with ``None``, each algorithm's S3 default
    (full object for CRC64NVME, composite for the others). Algorithms only
    some parts carry, or that the type cannot combine, are left out.

    Args:
        parts: ``({algorithm: base64}, size in bytes)`` of each part, in part order.
        checksum_type: ``"COMPOSITE"``, ``"FULL_OBJECT"`` or ``None``.

    Returns:
        ``{algorithm: value}``: composites end in ``-<number of parts>``.

    Raises:
        InvalidRequestError: an unknown checksum type, or a malformed part checksum.
    """
    if checksum_type not in (None, *CHECKSUM_TYPES):
        raise InvalidRequestError(f"unknown checksum type {checksum_type!r}")
    out: dict[str, str] = {}
    if not parts:
        return out
    for alg in CHECKSUM_ALGORITHMS:
        if not all(alg in ck for ck, _ in parts):
            continue
        full = checksum_type == "FULL_OBJECT" or (checksum_type is None and alg not in COMPOSITE_ALGORITHMS)
        if full and alg in FULL_OBJECT_ALGORITHMS:
            out[alg] = full_object_checksum(alg, [(ck[alg], size) for ck, size in parts])
        elif not full and alg in COMPOSITE_ALGORITHMS:
            out[alg] = composite_checksum(alg, [ck[alg] for ck, _ in parts])
    return out
