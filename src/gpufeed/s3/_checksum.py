"""Integrity checks of S3 request bodies: MD5, SHA-256 and the ``x-amz-checksum-*`` family.

boto3 >= 1.36 sends ``x-amz-checksum-crc32`` by default; other SDKs send
CRC32C, CRC64NVME, SHA1 or SHA256. The server recomputes each one the client
declared while the body streams through and refuses the upload on mismatch.

The algorithms themselves live in :mod:`gpufeed.checksums` (re-exported
here): zlib, awscrt and hashlib, native code that releases the GIL, so bodies
are hashed on worker threads at several GB/s (MD5 and SHA-256 ~0.5-1 GB/s).

Source: "Checking object integrity", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from ..checksums import CHECKSUM_ALGORITHMS, crc32c, crc64nvme, new_hasher
from ..errors import BadDigest, InvalidDigest, InvalidRequestError

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "BodyDigests",
    "crc32c",
    "crc64nvme",
    "new_hasher",
    "decode_b64_digest",
    "checksum_value",
    "sent_algorithms",
]


def decode_b64_digest(value: str, nbytes: int, what: str) -> bytes:
    """Decode a base64 digest header, checking its length.

    Raises:
        InvalidDigest: not base64, or not ``nbytes`` long once decoded.
    """
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidDigest(f"{what} is not valid base64") from exc
    if len(raw) != nbytes:
        raise InvalidDigest(f"{what} must be {nbytes} bytes, got {len(raw)}")
    return raw


def checksum_value(algorithm: str, value: str, what: str) -> bytes:
    """Decode one ``x-amz-checksum-<algorithm>`` value (header, trailer or XML element).

    Raises:
        InvalidRequestError: not base64 of the algorithm's digest length (S3:
            "Value for x-amz-checksum-crc32 header is invalid.").
    """
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestError(f"Value for {what} is invalid.") from exc
    # S3 also refuses a non-canonical encoding (padding bits set: "y/Q5Jh==").
    if len(raw) != CHECKSUM_ALGORITHMS[algorithm] or base64.b64encode(raw).decode() != value.strip():
        raise InvalidRequestError(f"Value for {what} is invalid.")
    return raw


def sent_algorithms(headers) -> list[str]:
    """The checksum algorithms a request body carries, in header or trailer
    (``x-amz-checksum-<algorithm>``, ``x-amz-trailer``), checked against
    ``x-amz-sdk-checksum-algorithm``.

    Returns:
        The algorithms (lower case), in :data:`CHECKSUM_ALGORITHMS` order.

    Raises:
        InvalidRequestError: ``x-amz-sdk-checksum-algorithm`` names another
            algorithm than the checksum sent ("Value for
            x-amz-sdk-checksum-algorithm header is invalid.", as S3 answers).

    Source: "Checking object integrity", Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html
    """
    trailers = {t.strip().lower() for t in headers.get("x-amz-trailer", "").split(",")}
    sent = [alg for alg in CHECKSUM_ALGORITHMS
            if f"x-amz-checksum-{alg}" in headers or f"x-amz-checksum-{alg}" in trailers]
    sdk = headers.get("x-amz-sdk-checksum-algorithm")
    if sdk is not None and sent and sdk.strip().lower() not in sent:
        raise InvalidRequestError("Value for x-amz-sdk-checksum-algorithm header is invalid.")
    return sent


class BodyDigests:
    """All digests a request body must match, fed chunk by chunk.

    Args:
        sha256_hex: the hex SHA-256 the client signed (``x-amz-content-sha256``), or None.
        checksums: ``{algorithm: base64 value}`` from ``x-amz-checksum-*`` headers;
            an algorithm whose value is ``None`` is computed (for a trailer that
            arrives after the body) but not yet checked.
        compute: algorithms computed without anything to check them against
            (the server's own checksum of a part the client sent none for).
        want_md5: also compute MD5 (for ``Content-MD5`` on requests the engine does not check).

    Raises:
        InvalidRequestError: a checksum value that is not base64 of its algorithm's length.
    """

    def __init__(
        self,
        *,
        sha256_hex: str | None = None,
        checksums: dict[str, str | None] | None = None,
        want_md5: bool = False,
        compute: tuple[str, ...] = (),
    ) -> None:
        self.sha256_hex = sha256_hex
        self.expected: dict[str, bytes | None] = {}
        self._hashers: dict[str, Any] = {alg: new_hasher(alg) for alg in compute}
        self._computed = tuple(compute)
        for alg, value in (checksums or {}).items():
            self.expected[alg] = (
                None if value is None else checksum_value(alg, value, f"x-amz-checksum-{alg} header")
            )
            self._hashers[alg] = new_hasher(alg)
        self._sha256 = None
        if sha256_hex is not None:
            self._sha256 = self._hashers.get("sha256") or hashlib.sha256()
        self._md5 = hashlib.md5() if want_md5 else None

    @property
    def active(self) -> bool:
        """True when there is anything to compute."""
        return bool(self._hashers) or self._sha256 is not None or self._md5 is not None

    def _all(self) -> list:
        hashers = list(self._hashers.values())
        if self._sha256 is not None and self._sha256 is not self._hashers.get("sha256"):
            hashers.append(self._sha256)
        if self._md5 is not None:
            hashers.append(self._md5)
        return hashers

    def update(self, data) -> None:
        """Feed the next bytes of the (decoded) body (native code; releases the GIL)."""
        for h in self._all():
            h.update(data)

    def update_many(self, pieces: list[bytes]) -> None:
        """Feed consecutive pieces of the body, each to every hasher while it is in cache."""
        hashers = self._all()
        for piece in pieces:
            for h in hashers:
                h.update(piece)

    def set_trailer(self, algorithm: str, value: str) -> None:
        """Record a checksum value that came in an aws-chunked trailer."""
        if algorithm not in self._hashers:
            raise InvalidRequestError(f"trailer x-amz-checksum-{algorithm} was not announced")
        self.expected[algorithm] = checksum_value(algorithm, value, f"x-amz-checksum-{algorithm} trailer")

    def md5_b64(self) -> str:
        """Base64 MD5 of everything fed (only when ``want_md5``)."""
        assert self._md5 is not None
        return base64.b64encode(self._md5.digest()).decode()

    def verify(self) -> dict[str, str]:
        """Check every digest against what was fed.

        Returns:
            ``{algorithm: base64}`` of the verified ``x-amz-checksum-*`` values
            and of the computed ones, to store with the object.

        Raises:
            XAmzContentSHA256Mismatch: the signed payload hash differs.
            BadDigest: an ``x-amz-checksum-*`` value differs (or a trailer never came).
        """
        from ..errors import XAmzContentSHA256Mismatch

        if self._sha256 is not None:
            got = self._sha256.hexdigest()
            if got != self.sha256_hex:
                raise XAmzContentSHA256Mismatch(
                    "The provided 'x-amz-content-sha256' header does not match what was computed.",
                    client=self.sha256_hex,
                    server=got,
                )
        out = {}
        for alg, want in self.expected.items():
            if want is None:
                raise BadDigest(f"the trailing x-amz-checksum-{alg} never arrived")
            got = self._hashers[alg].digest()
            if got != want:
                raise BadDigest(
                    f"The {alg.upper()} you specified did not match the calculated checksum."
                )
            out[alg] = base64.b64encode(got).decode()
        for alg in self._computed:
            out.setdefault(alg, base64.b64encode(self._hashers[alg].digest()).decode())
        return out
