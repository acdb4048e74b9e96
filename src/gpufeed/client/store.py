"""``Store`` over the fast path: a bucket of a remote node as a key/value store."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import AccessDenied, InvalidRange
from ..store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest, check_page_keys
from ._client import Client

__all__ = ["ClientStore"]


class ClientStore(Store):
    """One bucket of a gpufeed node, reached with :class:`~gpufeed.client.Client`.

    Args:
        client: a connected client (not closed by the store).
        bucket: the bucket (must exist).
        read_only: refuse writes with :class:`~gpufeed.errors.AccessDenied`.
        page_keys: keys per listing request.

    Raises:
        InvalidArgument: ``page_keys`` is not an int >= 1.
    """

    def __init__(self, client: Client, bucket: str, *, read_only: bool = False,
                 page_keys: int = 1000) -> None:
        self.client = client
        self.bucket = bucket
        self.read_only = read_only
        self.page_keys = check_page_keys(page_keys)

    def __repr__(self) -> str:
        return f"ClientStore({self.client.url!r}, {self.bucket!r})"

    def _check_writable(self) -> None:
        if self.read_only:
            raise AccessDenied(f"{self!r} is read-only")

    def get(self, key: str, byte_range: ByteRequest | None = None):
        if byte_range is None:
            return self.client.get(self.bucket, key)
        if isinstance(byte_range, RangeByteRequest):
            if byte_range.start < 0 or byte_range.end < byte_range.start:
                raise InvalidRange(f"invalid range {byte_range}")
            return self.client.get(self.bucket, key, offset=byte_range.start,
                                   length=byte_range.end - byte_range.start)
        if isinstance(byte_range, OffsetByteRequest):
            if byte_range.offset < 0:
                raise InvalidRange(f"invalid offset {byte_range.offset}")
            return self.client.get(self.bucket, key, offset=byte_range.offset)
        if isinstance(byte_range, SuffixByteRequest):
            if byte_range.suffix < 0:
                raise InvalidRange(f"invalid suffix {byte_range.suffix}")
            size = self.client.head(self.bucket, key).size
            if byte_range.suffix == 0 and size > 0:
                raise InvalidRange("suffix length 0 is unsatisfiable")
            n = min(byte_range.suffix, size)
            return self.client.get(self.bucket, key, offset=size - n, length=n)
        raise TypeError(f"not a byte request: {byte_range!r}")

    def set(self, key: str, value) -> None:
        self._check_writable()
        self.client.put(self.bucket, key, value)

    def exists(self, key: str) -> bool:
        try:
            self.client.head(self.bucket, key)
        except FileNotFoundError:
            return False
        return True

    def delete(self, key: str) -> None:
        self._check_writable()
        self.client.delete(self.bucket, key)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        for entry in self.client.list(self.bucket, prefix, page_size=self.page_keys):
            yield entry.key
