"""``EngineStore``: the abstract :class:`gpufeed.store.Store` over one engine bucket.

The thinnest possible adapter, so that the engine passes the same shared
conformance suite (:mod:`gpufeed.testing.store`) as every remote backend, and
so that code written against ``Store`` can run in-process with no server.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import AccessDenied
from ..store import ByteRequest, Store, check_page_keys, resolve_range
from .engine import Engine

__all__ = ["EngineStore"]



class EngineStore(Store):
    """A :class:`~gpufeed.store.Store` backed by bucket ``bucket`` of ``engine``.

    Args:
        engine: an open engine (not owned: closing the store does not close it).
        bucket: an existing bucket.
        etag: ETag kind for values written by :meth:`set`: ``"xxh3"`` (default;
            tens of GB/s) or ``"md5"`` (S3 compatible, ~0.6 GB/s).
        read_only: refuse writes with :class:`~gpufeed.errors.AccessDenied`.
        page_keys: keys per catalog listing page.

    Raises:
        NoSuchBucket: ``bucket`` does not exist.
    """

    def __init__(self, engine: Engine, bucket: str, *, etag: str = "xxh3", read_only: bool = False,
                 page_keys: int = 1000) -> None:
        self.page_keys = check_page_keys(page_keys)
        engine.head_bucket(bucket)
        self.engine = engine
        self.bucket = bucket
        self.etag = etag
        self.read_only = read_only

    def __repr__(self) -> str:
        return f"EngineStore({str(self.engine.data_dir)!r}, {self.bucket!r})"

    def _check_writable(self) -> None:
        if self.read_only:
            raise AccessDenied(f"{self!r} is read-only")

    def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes:
        """Return the value (or a byte range of it) as ``bytes``.

        Raises:
            NoSuchKey: the key does not exist.
            InvalidRange: the range is unsatisfiable.
        """
        return self.engine.get_object(self.bucket, key, byte_range)

    def get_ranges(self, key: str, ranges: list[ByteRequest]) -> list[memoryview | bytes]:
        """Read several ranges of one version of ``key`` (one lookup, one file).

        All ranges come from the same immutable version even if the key is
        overwritten meanwhile.

        Raises:
            NoSuchKey, InvalidRange: as for :meth:`get`.
        """
        info = self.engine.head_object(self.bucket, key)
        spans = [resolve_range(r, info.size) for r in ranges]
        out: list[memoryview | bytes] = []
        for start, length in spans:
            buf = bytearray(length)
            n = self.engine.read_into(info, buf, start)
            out.append(memoryview(buf)[:n])
        return out

    def set(self, key: str, value) -> None:
        """Store ``value`` (any buffer) under ``key``; atomic.

        Raises:
            AccessDenied: the store is read-only.
            KeyTooLong, InvalidArgument: bad key.
        """
        self._check_writable()
        self.engine.put_object(self.bucket, key, value, etag=self.etag)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (one catalog lookup)."""
        try:
            self.engine.head_object(self.bucket, key)
        except FileNotFoundError:
            return False
        return True

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is fine.

        Raises:
            AccessDenied: the store is read-only.
        """
        self._check_writable()
        self.engine.delete_object(self.bucket, key)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Yield keys starting with ``prefix`` in UTF-8 byte order, a page at a time."""
        token = None
        while True:
            page = self.engine.list_objects(
                self.bucket, prefix=prefix, continuation_token=token, max_keys=self.page_keys
            )
            for o in page.objects:
                yield o.key
            if not page.is_truncated:
                return
            token = page.next_token

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """Keys and common prefixes directly under ``prefix`` (delimiter ``/``),
        using the catalog's delimiter listing (it skips over sub-folders)."""
        keys: list[str] = []
        dirs: list[str] = []
        token = None
        while True:
            page = self.engine.list_objects(
                self.bucket, prefix=prefix, delimiter="/", continuation_token=token, max_keys=self.page_keys
            )
            keys.extend(o.key for o in page.objects)
            dirs.extend(page.common_prefixes)
            if not page.is_truncated:
                return keys, dirs
            token = page.next_token
