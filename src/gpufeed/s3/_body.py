"""Request bodies: plain or ``aws-chunked``, with the digests the client declared.

A body is consumed as an async iterator of decoded byte chunks, never held
whole in memory. :func:`stream_body` copies it into a pending write: the event
loop only reads the socket, and two ordered lanes on the worker pool take the
pieces from there (as the socket delivered them, never joined), one writing the
file with ``pwritev`` (the engine hashes MD5 alongside, on a thread of its own)
and one feeding :class:`BodyDigests` (SHA-256, CRC32, ...). Each lane is
drained by one worker while it has work, so the loop is not woken per batch.
All the hashing is native code that releases the GIL, so an upload keeps both
cores busy and never stalls other clients' requests on the loop.
:meth:`BodyDigests.verify` runs at the end.

aws-chunked framing (Amazon S3 API Reference, "Signature Calculations for the
Authorization Header: Transferring Payload in Multiple Chunks" and
"... Including Trailing Headers")::

    <hex-size>[;chunk-signature=<sig>]\\r\\n<data>\\r\\n   (repeated)
    0[;chunk-signature=<sig>]\\r\\n
    [<trailer-name>:<value>\\r\\n ...] [x-amz-trailer-signature:<sig>\\r\\n]
    \\r\\n
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor

from aiohttp import web

from ..errors import (
    IncompleteBody,
    InvalidArgument,
    InvalidRequestError,
    SignatureDoesNotMatch,
)
from ._auth import AuthResult, chunk_signature
from ._checksum import CHECKSUM_ALGORITHMS, BodyDigests, sent_algorithms

__all__ = ["RequestBody", "STREAMING_SIGNED", "STREAMING_UNSIGNED_TRAILER", "stream_body"]

STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
_STREAMING = {STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: Largest piece handed on at once, bytes.
_PIECE = 1 << 20  # 1 MiB
#: Longest chunk-header or trailer line accepted, bytes.
_MAX_LINE = 4096
#: Body bytes handed to one worker-thread write, bytes.
_WRITE_BATCH = 4 << 20  # 4 MiB
#: Most body bytes read ahead of the slower lane (file write or digests), bytes.
_READ_AHEAD = 32 << 20  # 32 MiB
#: From this size a piece's hashing leaves the event loop, bytes.
_OFF_LOOP = 64 << 10  # 64 KiB


class RequestBody:
    """The body of one request, decoded, plus the digests it must match.

    Args:
        request: the aiohttp request.
        auth: the verified signature (payload hash mode, chunk-signing key).
        want_md5: also compute MD5 (the caller checks ``Content-MD5`` itself).
        checksum_headers: check the ``x-amz-checksum-*`` headers against this body
            (False where they describe something else: CompleteMultipartUpload's
            name the whole object).
        compute: checksum algorithms to compute with nothing to check them
            against (a FULL_OBJECT upload's part sent without a checksum).

    Attributes:
        digests: the :class:`BodyDigests` to feed and verify.
        expected_size: decoded length the client announced, bytes, or None.
        chunked: the body uses aws-chunked framing.

    Raises:
        InvalidArgument: unknown ``x-amz-content-sha256`` value.
        InvalidRequestError: a checksum header that is not base64 of its algorithm's
            length, or an ``x-amz-sdk-checksum-algorithm`` naming another algorithm.
    """

    def __init__(self, request: web.BaseRequest, auth: AuthResult, *, want_md5: bool = False,
                 checksum_headers: bool = True, compute: tuple[str, ...] = ()) -> None:
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
        if checksum_headers:
            sent_algorithms(headers)
        for alg in CHECKSUM_ALGORITHMS if checksum_headers else ():
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
        self.digests = BodyDigests(sha256_hex=sha256_hex, checksums=checksums, want_md5=want_md5,
                                   compute=tuple(alg for alg in compute if alg not in checksums))
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
        """Yield the decoded body in pieces of at most 1 MiB (as they arrive, never joined
        when the body is not aws-chunked).

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
                # One buffered read at a time, as the socket delivered it: readany
                # would join everything buffered (a copy of up to 2 MiB).
                content = self._request.content
                while True:
                    piece, end_of_http_chunk = await content.readchunk()
                    if not piece:
                        if end_of_http_chunk and not content.at_eof():
                            continue  # a Transfer-Encoding: chunked boundary
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
        data = bytes(buf)
        if len(data) >= _OFF_LOOP:
            await asyncio.get_running_loop().run_in_executor(None, self.digests.update, data)
        else:
            self.digests.update(data)
        self.digests.verify()
        return data

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
            hashing: asyncio.Future | None = None  # the previous piece's hash, on a worker
            remaining = size
            while remaining:
                piece = await content.read(min(remaining, _PIECE))  # what is buffered, up to that
                if not piece:
                    raise IncompleteBody("The request body ended before it was complete")
                remaining -= len(piece)
                if chunk_hash is not None:
                    if hashing is not None:
                        await hashing
                    hashing = self._hash_piece(chunk_hash, piece)
                yield piece
            if hashing is not None:
                await hashing
            if signed:
                assert chunk_hash is not None
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

    @staticmethod
    def _hash_piece(h, piece: bytes) -> asyncio.Future | None:
        """Feed ``piece`` to ``h``: on a worker thread when it is large (returns that future)."""
        if len(piece) < _OFF_LOOP:
            h.update(piece)
            return None
        return asyncio.get_running_loop().run_in_executor(None, h.update, piece)

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
                self.digests.set_trailer(alg, value)
        if signed and self._auth.payload_hash == STREAMING_SIGNED_TRAILER:
            digest = hashlib.sha256("".join(canonical).encode()).hexdigest()
            want = chunk_signature(self._auth, previous, digest, kind="TRAILER")
            if trailer_sig is None or not hmac.compare_digest(want, trailer_sig.lower()):
                raise SignatureDoesNotMatch("The trailer signature does not match.")


# -- streaming into a pending write -------------------------------------------------

class _Lane:
    """Calls ``fn(batch)`` for each submitted batch on ``executor``, in order, one at a time.

    One worker drains the lane's queue while it has batches, so a busy lane
    costs the event loop nothing per batch: it is woken only when it waits
    (:meth:`wait`). A failed batch drops every later one without running it
    and is raised by the next :meth:`submit` or :meth:`wait`. Once
    ``wait(0)`` returns (or :meth:`settle` does), no worker is running ``fn``.
    """

    def __init__(self, executor: Executor, fn: Callable[[list[bytes]], object]) -> None:
        self._loop = asyncio.get_running_loop()
        self._executor = executor
        self._fn = fn
        self._lock = threading.Lock()
        self._queue: deque[tuple[list[bytes], int]] = deque()
        self._running = False  # a worker is draining the queue
        self._stopped = False  # drop queued batches (settle after a failure)
        self._error: BaseException | None = None
        self._pending = 0  # bytes submitted and not yet done, under _lock
        self._waiter: tuple[asyncio.Future, int] | None = None  # (future, bytes limit), under _lock

    def submit(self, batch: list[bytes], nbytes: int) -> None:
        """Queue ``batch`` (``nbytes`` long); raises an earlier batch's failure."""
        with self._lock:
            if self._error is not None:
                raise self._error
            self._queue.append((batch, nbytes))
            self._pending += nbytes
            start = not self._running
            self._running = True
        if start:
            try:
                self._executor.submit(self._drain)
            except BaseException:
                with self._lock:
                    self._running = False
                raise

    def _drain(self) -> None:
        """Worker: run queued batches until the queue is empty (or the lane stopped)."""
        while True:
            with self._lock:
                if not self._queue or self._stopped or self._error is not None:
                    self._queue.clear()
                    self._pending = 0
                    self._running = False
                    self._wake()
                    return
                batch, nbytes = self._queue.popleft()
            try:
                self._fn(batch)
            except BaseException as exc:
                with self._lock:
                    self._error = exc
            with self._lock:
                self._pending -= nbytes
                self._wake()

    def _done_waiting(self, limit: int) -> bool:
        """Under ``_lock``: a failure, or at most ``limit`` bytes outstanding (0: idle too)."""
        if self._error is not None:
            return not self._running or limit > 0
        return self._pending <= limit and (limit > 0 or not self._running)

    def _wake(self) -> None:
        """Under ``_lock``: resolve the loop's waiter when its condition holds."""
        if self._waiter is not None and self._done_waiting(self._waiter[1]):
            fut = self._waiter[0]
            self._waiter = None
            try:
                self._loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    async def wait(self, limit: int) -> None:
        """Until at most ``limit`` bytes are queued or running (``0``: the lane is idle).

        Raises:
            the exception of a failed batch.
        """
        while True:
            with self._lock:
                if self._done_waiting(limit):
                    if self._error is not None:
                        raise self._error
                    return
                fut = self._loop.create_future()
                self._waiter = (fut, limit)
            await fut

    async def settle(self) -> None:
        """Drop queued batches and wait until no worker runs ``fn`` (ignoring failures)."""
        with self._lock:
            self._stopped = True
        while True:
            with self._lock:
                if not self._running:
                    return
                fut = self._loop.create_future()
                self._waiter = (fut, 0)
            await asyncio.shield(fut)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def stream_body(body: RequestBody, pending, executor: Executor) -> None:
    """Copy the decoded body into ``pending`` while its declared digests are computed.

    The event loop only reads the socket; batches of 4 MiB (the pieces as read,
    never joined) go to two ordered lanes on ``executor``: the file write
    (``pwritev``, with the engine's MD5 beside it) and
    :meth:`BodyDigests.update_many`. Reading runs up to 32 MiB ahead of the
    slower lane, so the socket, the disk and each hash proceed at their own pace
    on all cores. Does not verify the digests (call ``body.digests.verify()``).

    Args:
        body: the request body.
        pending: a :class:`~gpufeed.engine.PendingWrite` (the caller aborts it on error).
        executor: the worker pool.

    Raises:
        IncompleteBody, SignatureDoesNotMatch: see :meth:`RequestBody.chunks`.
        InternalError: the write failed (disk full, I/O error).
    """
    lanes = [_Lane(executor, pending.write_many)]
    if body.digests.active:
        lanes.append(_Lane(executor, body.digests.update_many))
    batch: list[bytes] = []
    size = 0
    try:
        async for piece in body.chunks():
            batch.append(piece)
            size += len(piece)
            if size >= _WRITE_BATCH:
                for lane in lanes:
                    lane.submit(batch, size)
                batch, size = [], 0
                for lane in lanes:  # past the read-ahead, wait for the slower lane
                    await lane.wait(_READ_AHEAD)
        if batch:
            for lane in lanes:
                lane.submit(batch, size)
        for lane in lanes:
            await lane.wait(0)
    except BaseException:
        # Never leave a worker writing into a PendingWrite the caller aborts next.
        for lane in lanes:
            await lane.settle()
        raise
