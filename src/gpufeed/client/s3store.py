"""``Store`` over any S3 endpoint with boto3 (ours or another), for comparison
and for moving data between gpufeed and other object stores."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import AccessDenied, InvalidArgument, InvalidRange, NoSuchBucket, NoSuchKey, error_from_code
from ..store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
    check_page_keys,
    resolve_range,
)

__all__ = ["S3Store"]


class S3Store(Store):
    """One bucket of an S3 endpoint as a :class:`~gpufeed.store.Store`.

    Args:
        s3: a boto3 S3 client (``boto3.client("s3", endpoint_url=...)``).
        bucket: the bucket (must exist).
        read_only: refuse writes with :class:`~gpufeed.errors.AccessDenied`.
        page_keys: ``MaxKeys`` of each ListObjectsV2 request (at most 1,000).

    Errors are translated from botocore's ``ClientError`` to the typed errors
    of :mod:`gpufeed.errors` at this boundary.
    """

    def __init__(self, s3, bucket: str, *, read_only: bool = False, page_keys: int = 1000) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.read_only = read_only
        self.page_keys = min(check_page_keys(page_keys), 1000)

    def __repr__(self) -> str:
        return f"S3Store({self.s3.meta.endpoint_url!r}, {self.bucket!r})"

    def _check_writable(self) -> None:
        if self.read_only:
            raise AccessDenied(f"{self!r} is read-only")

    def _call(self, fn, **kw):
        from botocore.exceptions import ClientError, ParamValidationError

        try:
            return fn(Bucket=self.bucket, **kw)
        except ParamValidationError as exc:  # boto3 refuses e.g. an empty key itself
            raise InvalidArgument(str(exc)) from exc
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = err.get("Code", "InternalError")
            if code in ("404", "NotFound"):
                code = "NoSuchKey"
            raise error_from_code(code, err.get("Message", "")) from exc

    def get(self, key: str, byte_range: ByteRequest | None = None):
        if byte_range is None:
            return self._call(self.s3.get_object, Key=key)["Body"].read()
        if isinstance(byte_range, RangeByteRequest):
            if byte_range.start < 0 or byte_range.end < byte_range.start:
                raise InvalidRange(f"invalid range {byte_range}")
            if byte_range.end == byte_range.start:
                size = self._call(self.s3.head_object, Key=key)["ContentLength"]
                resolve_range(byte_range, size)
                return b""
            header = f"bytes={byte_range.start}-{byte_range.end - 1}"
        elif isinstance(byte_range, OffsetByteRequest):
            if byte_range.offset < 0:
                raise InvalidRange(f"invalid offset {byte_range.offset}")
            header = f"bytes={byte_range.offset}-"
        elif isinstance(byte_range, SuffixByteRequest):
            size = self._call(self.s3.head_object, Key=key)["ContentLength"]
            start, n = resolve_range(byte_range, size)
            if n == 0:
                return b""
            header = f"bytes={start}-{start + n - 1}"
        else:
            raise TypeError(f"not a byte request: {byte_range!r}")
        try:
            return self._call(self.s3.get_object, Key=key, Range=header)["Body"].read()
        except InvalidRange:
            # S3 answers "bytes=0-" on an empty object with 416; the Store contract
            # (like resolve_range) gives the empty value.
            if header == "bytes=0-" and self._call(self.s3.head_object, Key=key)["ContentLength"] == 0:
                return b""
            raise

    def set(self, key: str, value) -> None:
        self._check_writable()
        self._call(self.s3.put_object, Key=key, Body=bytes(value))

    def exists(self, key: str) -> bool:
        try:
            self._call(self.s3.head_object, Key=key)
        except (NoSuchKey, NoSuchBucket):
            return False
        return True

    def delete(self, key: str) -> None:
        self._check_writable()
        self._call(self.s3.delete_object, Key=key)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        token = None
        while True:
            kw = {"Prefix": prefix, "MaxKeys": self.page_keys}
            if token:
                kw["ContinuationToken"] = token
            page = self._call(self.s3.list_objects_v2, **kw)
            for obj in page.get("Contents", []):
                yield obj["Key"]
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]
