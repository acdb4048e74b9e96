"""Values and argument checks shared by the SDK's client and its transports.

Everything here is transport-neutral: the request and listing records users
see, URL parsing, and the cheap checks that turn bad arguments into typed
errors before any byte reaches a connection.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgspec

from ..errors import InvalidArgument
from ..wire import protocol as p

__all__ = ["ReadRequest", "ListEntry", "ObjectMeta", "DeleteResult", "parse_url", "as_bytes",
           "check_object", "check_bucket", "check_version", "bucket_req", "then", "MAX_OFFSET",
           "writable_dest"]

ObjectMeta = p.ObjectMeta
DeleteResult = p.DeleteResult

#: Largest object offset or length the wire carries (a signed 64-bit int).
MAX_OFFSET = (1 << 63) - 1


class ReadRequest(msgspec.Struct, frozen=True):
    """One read of a batch: bytes ``[offset, offset + length)`` of ``bucket/key``
    into ``dest`` (a writable contiguous buffer; ``length`` defaults to ``len(dest)``).

    ``digest`` > 0 asks the server for the XXH3-64 of each consecutive
    ``digest``-byte piece of the delivered bytes (see ``digests_out`` of
    :meth:`Client.submit_get_many_into`). ``version_id`` reads that version of
    the object (``None``: the current one); ``snapshot`` the version that bucket
    snapshot recorded (``None``: the live bucket)."""

    bucket: str
    key: str
    dest: object
    offset: int = 0
    length: int | None = None
    digest: int = 0
    version_id: str | None = None
    snapshot: str | None = None


@dataclass(frozen=True, slots=True)
class ListEntry:
    """A listed key (``is_prefix`` False) or a rolled-up common prefix (True)."""

    key: str
    size: int = 0
    etag: str = ""
    last_modified: float = 0.0
    is_prefix: bool = False


def parse_url(url: str) -> tuple[str, object]:
    """``gpufeed+tcp://h:p`` -> ``("tcp", (h, p))``; ``gpufeed+cluster://h:p`` -> ``("cluster", (h, p))``;
    ``gpufeed+shm:///x.sock`` -> ``("shm", "/x.sock")``.

    Raises:
        InvalidArgument: any other form.
    """
    parts = urlsplit(url)
    if parts.scheme in ("gpufeed+tcp", "gpufeed+cluster"):
        if not parts.hostname or not parts.port:
            raise InvalidArgument(f"{url!r}: expected {parts.scheme}://HOST:PORT")
        return parts.scheme[len("gpufeed+"):], (parts.hostname, parts.port)
    if parts.scheme == "gpufeed+shm":
        path = parts.netloc + parts.path if parts.netloc else parts.path
        if not path:
            raise InvalidArgument(f"{url!r}: expected gpufeed+shm:///path/to/gpufeed.sock")
        return "shm", path
    raise InvalidArgument(f"{url!r}: the scheme must be gpufeed+tcp, gpufeed+cluster or gpufeed+shm")


def as_bytes(buf) -> memoryview:
    """A flat byte view of any contiguous buffer, torch CPU tensors included.

    Raises:
        InvalidArgument: not a buffer, not C-contiguous, or a tensor that is not
            a contiguous CPU tensor.
    """
    if type(buf) is memoryview and buf.ndim == 1 and buf.format == "B" and buf.c_contiguous:
        return buf  # already a flat byte view (a slice of an alloc() buffer)
    if hasattr(buf, "untyped_storage") and not isinstance(buf, (bytes, bytearray, memoryview)):
        import torch  # only reached for tensors

        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise InvalidArgument("tensors must be contiguous and on the CPU")
        buf = buf.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        mv = memoryview(buf)
    except TypeError as exc:
        raise InvalidArgument(f"not a buffer: {type(buf).__name__}") from exc
    if not mv.c_contiguous:
        raise InvalidArgument("the buffer must be C-contiguous")
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


def check_bucket(bucket) -> None:
    """Raises InvalidArgument unless ``bucket`` is a ``str``."""
    if type(bucket) is not str:
        raise InvalidArgument("bucket must be str")


def check_object(bucket, key, offset: int = 0, length: int | None = None) -> None:
    """Cheap argument checks so bad input is a typed error, never a dead connection.

    Raises:
        InvalidArgument: bucket or key not a ``str``; offset or length not an
            int in ``[0, 2**63)``.
    """
    if type(bucket) is not str or type(key) is not str:
        raise InvalidArgument("bucket and key must be str")
    if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
        raise InvalidArgument(f"offset must be an int in [0, 2**63): {offset!r}")
    if length is not None and (type(length) is not int or not 0 <= length <= MAX_OFFSET):
        raise InvalidArgument(f"length must be an int >= 0: {length!r}")


def check_version(version_id, bypass_governance: bool = False) -> None:
    """Cheap checks of a version argument (the node checks the id's form).

    Raises:
        InvalidArgument: ``version_id`` is neither ``None`` nor a ``str``, or
            ``bypass_governance`` is not a ``bool``.
    """
    if version_id is not None and type(version_id) is not str:
        raise InvalidArgument(f"version_id must be a str or None: {version_id!r}")
    if type(bypass_governance) is not bool:
        raise InvalidArgument(f"bypass_governance must be a bool: {bypass_governance!r}")


def check_snapshot(snapshot) -> None:
    """Cheap check of a snapshot argument (the node checks the name's form).

    Raises:
        InvalidArgument: neither ``None`` nor a non-empty ``str``.
    """
    if snapshot is not None and (type(snapshot) is not str or not snapshot):
        raise InvalidArgument(f"snapshot must be a non-empty str or None: {snapshot!r}")


def bucket_req(bucket, kind, capacity_bytes, ttl_s) -> p.BucketReq:
    """A CREATE_BUCKET request, checked so a bad argument is a typed error, not a dead connection."""
    if type(bucket) is not str or type(kind) is not str:
        raise InvalidArgument("bucket and kind must be str")
    if type(capacity_bytes) is not int or not 0 <= capacity_bytes <= MAX_OFFSET:
        raise InvalidArgument(f"capacity_bytes must be an int >= 0: {capacity_bytes!r}")
    if type(ttl_s) not in (int, float) or not 0 <= ttl_s < float("inf"):
        raise InvalidArgument(f"ttl_s must be a number of seconds >= 0: {ttl_s!r}")
    return p.BucketReq(bucket, kind, capacity_bytes, float(ttl_s))


class ReplyFuture(Future):
    """A Future whose waiter may read its own reply off the connection.

    A fast-path connection has no thread that must read every reply: a thread
    that waits (``result()`` or ``exception()`` without a timeout) reads reply
    frames itself until its own is in (leader/follower), which spares the
    hand-over from a receiver thread to the waiting thread on each request.
    Registering a done-callback wakes the connection's receiver thread, since
    nobody may wait for such a Future.

    Args:
        drive: reads replies until this Future is done (the connection's), or ``None``.
        kick: wakes the connection's receiver thread, or ``None``.
    """

    def __init__(self, drive=None, kick=None) -> None:
        super().__init__()
        self._drive = drive
        self._kick = kick
        self._poked = False  # a leader handed the reading over to this waiter

    def result(self, timeout: float | None = None):
        if timeout is None and self._drive is not None and not self.done():
            self._drive(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None):
        if timeout is None and self._drive is not None and not self.done():
            self._drive(self)
        return super().exception(timeout)

    def add_done_callback(self, fn) -> None:
        super().add_done_callback(fn)
        if self._kick is not None and not self.done():
            self._kick()


def then(fut: Future, fn) -> Future:
    """A Future of ``fn(fut.result())`` (``fn`` runs where ``fut`` completes: it must not block).

    Waiting for the result of a :class:`ReplyFuture`'s derived Future reads the
    reply on the waiting thread, as waiting for ``fut`` itself would."""
    if isinstance(fut, ReplyFuture):
        src = fut
        out: Future = ReplyFuture(lambda _out: _wait_quietly(src), src._kick)
    else:
        out = Future()

    def done(f: Future) -> None:
        try:
            out.set_result(fn(f.result()))
        except BaseException as exc:
            out.set_exception(exc)

    Future.add_done_callback(fut, done)  # no receiver wake-up: ``out``'s waiter drives ``fut``
    return out


def _wait_quietly(fut: Future) -> None:
    """Wait for ``fut``; its outcome reaches the caller through its callbacks."""
    fut.exception()


def writable_dest(buffer, length: int | None, *, batch: bool = False) -> memoryview:
    """The checked destination of a read: a flat writable view, cut to ``length``.

    Raises:
        InvalidArgument: not a contiguous buffer, read-only, or shorter than ``length``.
    """
    dest = as_bytes(buffer)
    if dest.readonly:
        raise InvalidArgument("a destination buffer is read-only" if batch
                              else "the destination buffer is read-only")
    if length is not None:
        if length > len(dest):
            raise InvalidArgument(f"length {length} exceeds {'its' if batch else 'the'} buffer "
                                  f"({len(dest)} bytes)")
        dest = dest[:length]
    return dest
