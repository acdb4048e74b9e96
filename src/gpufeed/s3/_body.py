"""Request bodies: plain or ``aws-chunked``, with the digests the client declared.

A body is consumed as an async iterator of decoded byte chunks, never held
whole in memory. The consumer feeds each chunk to :class:`BodyDigests` (on a
worker thread for big bodies) and calls :meth:`BodyDigests.verify` at the end.

aws-chunked framing (Amazon S3 API Reference, "Signature Calculations for the
Authorization Header: Transferring Payload in Multiple Chunks" and
"... Including Trailing Headers")::

    <hex-size>[;chunk-signature=<sig>]\\r\\n<data>\\r\\n   (repeated)
    0[;chunk-signature=<sig>]\\r\\n
    [<trailer-name>:<value>\\r\\n ...] [x-amz-trailer-signature:<sig>\\r\\n]
    \\r\\n
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import AsyncIterator

from aiohttp import web

from ..errors import (
    IncompleteBody,
    InvalidArgument,
    InvalidRequestError,
    SignatureDoesNotMatch,
)
from ._auth import AuthResult, chunk_signature
from ._checksum import CHECKSUM_ALGORITHMS, BodyDigests, decode_b64_digest

__all__ = ["RequestBody", "STREAMING_SIGNED", "STREAMING_UNSIGNED_TRAILER"]

STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
_STREAMING = {STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: Largest piece handed on at once, bytes.
_PIECE = 1 << 20  # 1 MiB
#: Longest chunk-header or trailer line accepted, bytes.
_MAX_LINE = 4096


class RequestBody:
    """The body of one request, decoded, plus the digests it must match.

    Args:
        request: the aiohttp request.
        auth: the verified signature (payload hash mode, chunk-signing key).
        want_md5: also compute MD5 (the caller checks ``Content-MD5`` itself).

    Attributes:
        digests: the :class:`BodyDigests` to feed and verify.
        expected_size: decoded length the client announced, bytes, or None.
        chunked: the body uses aws-chunked framing.

    Raises:
        InvalidArgument: unknown ``x-amz-content-sha256`` value.
        InvalidDigest: a checksum header that is not valid base64.
    """

    def __init__(self, request: web.BaseRequest, auth: AuthResult, *, want_md5: bool = False) -> None:
        self._request = request
        self._auth = auth
        mode = auth.payload_hash
        headers = request.headers
        self.chunked = mode in _STREAMING
        sha256_hex = None
        if not self.chunked and mode != "UNSIGNED-PAYLOAD":
            if not _HEX64.match(mode):
                raise InvalidArgument(
                    "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-... or a valid "
                    "sha256 value.",
                )
            sha256_hex = mode
        checksums: dict[str, str | None] = {}
        for alg in CHECKSUM_ALGORITHMS:
            value = headers.get(f"x-amz-checksum-{alg}")
            if value is not None:
                checksums[alg] = value
        self._trailers: list[str] = []
        for name in headers.get("x-amz-trailer", "").split(","):
            name = name.strip().lower()
            if not name:
                continue
            alg = name.removeprefix("x-amz-checksum-")
            if not name.startswith("x-amz-checksum-") or alg not in CHECKSUM_ALGORITHMS:
                raise InvalidRequestError(f"unsupported trailer {name!r}")
            checksums.setdefault(alg, None)
            self._trailers.append(alg)
        self.digests = BodyDigests(sha256_hex=sha256_hex, checksums=checksums, want_md5=want_md5)
        if self.chunked:
            decoded = headers.get("x-amz-decoded-content-length")
            try:
                self.expected_size = int(decoded) if decoded is not None else None
            except ValueError as exc:
                raise InvalidArgument("x-amz-decoded-content-length is not a number") from exc
        else:
            self.expected_size = request.content_length
        self.received = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        """Yield the decoded body in pieces of at most 1 MiB.

        Raises:
            IncompleteBody: the connection ended early or the decoded length differs
                from the announced one.
            SignatureDoesNotMatch: a chunk signature is wrong (signed streaming).
        """
        try:
            if self.chunked:
                async for piece in self._chunked():
                    self.received += len(piece)
                    yield piece
            else:
                content = self._request.content
                while True:
                    piece = await content.readany()
                    if not piece:
                        break
                    self.received += len(piece)
                    yield piece
        except (ConnectionError, EOFError) as exc:
            raise IncompleteBody("The request body ended before it was complete") from exc
        except Exception as exc:
            # aiohttp signals a truncated body with its own payload errors.
            if type(exc).__module__.startswith("aiohttp"):
                raise IncompleteBody(
                    "You did not provide the number of bytes specified by the Content-Length "
                    "HTTP header"
                ) from exc
            raise
        if self.expected_size is not None and self.received != self.expected_size:
            raise IncompleteBody(
                f"You did not provide the number of bytes announced: got {self.received}, "
                f"expected {self.expected_size}"
            )

    async def read_all(self, limit: int) -> bytes:
        """Read and verify the whole (small) body.

        Args:
            limit: largest body accepted, bytes.

        Raises:
            InvalidRequestError: the body is larger than ``limit``.
        """
        buf = bytearray()
        async for piece in self.chunks():
            buf += piece
            if len(buf) > limit:
                raise InvalidRequestError(f"request body larger than {limit} bytes")
        self.digests.update(buf)
        self.digests.verify()
        return bytes(buf)

    # aws-chunked -----------------------------------------------------------
    async def _line(self) -> bytes:
        content = self._request.content
        line = await content.readuntil(b"\n")
        if not line.endswith(b"\n"):
            raise IncompleteBody("aws-chunked body ended inside a chunk header")
        if len(line) > _MAX_LINE:
            raise InvalidArgument("aws-chunked header line too long")
        return line.rstrip(b"\r\n")

    async def _chunked(self) -> AsyncIterator[bytes]:
        content = self._request.content
        auth = self._auth
        signed = auth.payload_hash in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER)
        previous = auth.signature
        while True:
            header = (await self._line()).decode("latin-1")
            size_hex, _, ext = header.partition(";")
            try:
                size = int(size_hex.strip(), 16)
            except ValueError as exc:
                raise InvalidArgument(f"bad aws-chunked chunk size {size_hex!r}") from exc
            if size < 0:
                raise InvalidArgument("negative aws-chunked chunk size")
            chunk_hash = hashlib.sha256() if signed else None
            remaining = size
            while remaining:
                piece = await content.readexactly(min(remaining, _PIECE))
                remaining -= len(piece)
                if chunk_hash is not None:
                    chunk_hash.update(piece)
                yield piece
            if signed:
                claimed = ext.strip().removeprefix("chunk-signature=")
                want = chunk_signature(auth, previous, chunk_hash.hexdigest())
                if not hmac.compare_digest(want, claimed.lower()):
                    raise SignatureDoesNotMatch(
                        "The chunk signature we calculated does not match the one you provided."
                    )
                previous = want
            if size == 0:
                break
            if await content.readexactly(2) != b"\r\n":
                raise InvalidArgument("aws-chunked chunk data not followed by CRLF")
        await self._trailer(previous, signed)

    async def _trailer(self, previous: str, signed: bool) -> None:
        lines: list[bytes] = []
        while True:
            try:
                line = await self._line()
            except IncompleteBody:
                if lines or not self._trailers:
                    break  # lenient: some clients omit the final CRLF
                raise
            if not line:
                break
            lines.append(line)
        trailer_sig = None
        canonical = []
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "x-amz-trailer-signature":
                trailer_sig = value
                continue
            canonical.append(f"{name}:{value}\n")
            if name.startswith("x-amz-checksum-"):
                alg = name.removeprefix("x-amz-checksum-")
                if alg not in self._trailers:
                    raise InvalidRequestError(f"trailer {name} was not announced in x-amz-trailer")
                decode_b64_digest(value, CHECKSUM_ALGORITHMS[alg], name)
                self.digests.set_trailer(alg, value)
        if signed and self._auth.payload_hash == STREAMING_SIGNED_TRAILER:
            digest = hashlib.sha256("".join(canonical).encode()).hexdigest()
            want = chunk_signature(self._auth, previous, digest, kind="TRAILER")
            if trailer_sig is None or not hmac.compare_digest(want, trailer_sig.lower()):
                raise SignatureDoesNotMatch("The trailer signature does not match.")
