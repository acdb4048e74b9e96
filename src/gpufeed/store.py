"""A small abstract key/value store that every gpufeed backend implements.

Modelled on zarr-python v3's ``zarr.abc.store.Store`` and obspec: byte ranges
are tiny frozen dataclasses (``RangeByteRequest(start, end)`` with an
exclusive end, ``OffsetByteRequest``, ``SuffixByteRequest``); reads return
buffer-protocol objects; writes accept any buffer; ``set`` is atomic (either
the whole value is written or nothing is visible). Sync methods are the
primary form; ``*_async`` twins run them on a worker thread unless a backend
overrides them.

Every backend (engine on local disk, remote over the fast path, remote over
S3) passes the shared conformance suite in :mod:`gpufeed.testing.store`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import InvalidRange

__all__ = [
    "ByteRequest",
    "RangeByteRequest",
    "OffsetByteRequest",
    "SuffixByteRequest",
    "resolve_range",
    "check_page_keys",
    "Store",
]


@dataclass(frozen=True, slots=True)
class RangeByteRequest:
    """Bytes ``[start, end)`` of a value (``end`` exclusive, both in bytes)."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class OffsetByteRequest:
    """Bytes from ``offset`` to the end of the value."""

    offset: int


@dataclass(frozen=True, slots=True)
class SuffixByteRequest:
    """The last ``suffix`` bytes of the value (all of it when shorter)."""

    suffix: int


ByteRequest = RangeByteRequest | OffsetByteRequest | SuffixByteRequest


def resolve_range(byte_range: ByteRequest | None, size: int) -> tuple[int, int]:
    """Turn a byte request into ``(start, length)`` for a value of ``size`` bytes.

    Follows HTTP range semantics (RFC 9110 section 14.1.2) as S3 applies them:
    an end past the value is clipped; a start at or past the end of a non-empty
    value is unsatisfiable.

    Raises:
        InvalidRange: negative numbers, ``end < start``, or a start at/after ``size``
            (except a zero-length request on an empty value, which yields ``(0, 0)``).
    """
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        start, end = byte_range.start, byte_range.end
        if start < 0 or end < start:
            raise InvalidRange(f"invalid range [{start}, {end})", size=size)
        if start >= size and not (start == 0 and size == 0):
            raise InvalidRange(f"range start {start} is past the end ({size} bytes)", size=size)
        return start, min(end, size) - start
    if isinstance(byte_range, OffsetByteRequest):
        off = byte_range.offset
        if off < 0 or (off >= size and not (off == 0 and size == 0)):
            raise InvalidRange(f"offset {off} is past the end ({size} bytes)", size=size)
        return off, size - off
    if isinstance(byte_range, SuffixByteRequest):
        n = byte_range.suffix
        if n < 0:
            raise InvalidRange(f"invalid suffix length {n}", size=size)
        if n == 0 and size > 0:
            raise InvalidRange("suffix length 0 is unsatisfiable", size=size)
        n = min(n, size)
        return size - n, n
    raise TypeError(f"not a byte request: {byte_range!r}")


def check_page_keys(page_keys: int) -> int:
    """``page_keys`` if it is an int >= 1, else :class:`~gpufeed.errors.InvalidArgument`."""
    if type(page_keys) is not int or page_keys < 1:
        from .errors import InvalidArgument

        raise InvalidArgument(f"page_keys must be an int >= 1, not {page_keys!r}")
    return page_keys


class Store(ABC):
    """Abstract key/value store over one bucket (or one namespace).

    Keys are ``str`` (S3 keys: up to 1,024 UTF-8 bytes, any characters).
    Values are bytes-like.

    Subclasses implement the five abstract methods; ``get_ranges`` and the
    ``*_async`` twins have correct-but-slow defaults that backends override.
    """

    #: Writes (``set``, ``delete``) raise :class:`~gpufeed.errors.AccessDenied`.
    read_only: bool = False
    #: Keys a listing asks the backend for per page (a small value exercises paging).
    page_keys: int = 1000

    @abstractmethod
    def get(self, key: str, byte_range: ByteRequest | None = None) -> memoryview | bytes:
        """Return the value (or a byte range of it).

        Raises:
            NoSuchKey: the key does not exist.
            InvalidRange: the range is unsatisfiable.
        """

    @abstractmethod
    def set(self, key: str, value) -> None:
        """Store ``value`` (any buffer) under ``key``; atomic: all or nothing visible.

        Raises:
            AccessDenied: the store is read-only.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error (S3 semantics).

        Raises:
            AccessDenied: the store is read-only.
        """

    @abstractmethod
    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Yield every key starting with ``prefix``, in UTF-8 byte order."""

    def get_ranges(self, key: str, ranges: list[ByteRequest]) -> list[memoryview | bytes]:
        """Read several ranges of one value; the default reads them one by one."""
        return [self.get(key, r) for r in ranges]

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """Return ``(keys, common_prefixes)`` directly under ``prefix`` with delimiter ``/``."""
        keys: list[str] = []
        dirs: list[str] = []
        for k in self.list_prefix(prefix):
            rest = k[len(prefix):]
            if "/" in rest:
                d = prefix + rest.split("/", 1)[0] + "/"
                if not dirs or dirs[-1] != d:
                    dirs.append(d)
            else:
                keys.append(k)
        return keys, dirs

    async def get_async(self, key: str, byte_range: ByteRequest | None = None):
        return await asyncio.to_thread(self.get, key, byte_range)

    async def set_async(self, key: str, value) -> None:
        await asyncio.to_thread(self.set, key, value)

    async def exists_async(self, key: str) -> bool:
        return await asyncio.to_thread(self.exists, key)

    async def delete_async(self, key: str) -> None:
        await asyncio.to_thread(self.delete, key)
