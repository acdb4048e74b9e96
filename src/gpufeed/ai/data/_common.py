"""What both datasets share: the constructor's connection and policy
arguments, the per-process reader, decoding under the error policy, and the
fingerprint that ties a saved state to one listing."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from ._errors import DataError, SampleDecodeError
from ._fetch import Reader, ReadLimits
from ._source import ErrorPolicy, Listed, Source

__all__ = ["DatasetBase", "SKIP", "fingerprint"]

#: Returned by :meth:`DatasetBase.decode_or_skip` for a sample left out.
SKIP = object()


def fingerprint(items: Sequence[Listed]) -> str:
    """A short hash of the listing (keys and sizes), to refuse a saved state
    taken over another listing."""
    h = hashlib.blake2b(digest_size=8)
    for it in items:
        h.update(it.key.encode("utf-8", "surrogatepass"))
        h.update(b"\0%d\0" % it.size)
    return h.hexdigest()


class DatasetBase:
    """Connection, error policy and read-ahead of a dataset (see the datasets' Args)."""

    def _setup(self, url: str, prefix: str, *, on_error: str, max_retries: int, retry_backoff_s: float,
               limits: ReadLimits | None, access_key: str | None, secret_key: str | None,
               request_timeout_s: float, connections: int | None) -> None:
        self.limits = limits if limits is not None else ReadLimits()
        # read buffers come from Client.alloc (pooled); keep no more idle than one read-ahead's worth
        client_kw: dict[str, Any] = {"access_key": access_key, "secret_key": secret_key,
                                     "request_timeout_s": request_timeout_s,
                                     "max_idle_bytes": self.limits.max_inflight_bytes + self.limits.batch_bytes}
        if connections is not None:
            client_kw["connections"] = connections
        self.source = Source.parse(url, prefix, client_kw)
        self.policy = ErrorPolicy(on_error, max_retries, retry_backoff_s)
        self._reader: Reader | None = None

    @property
    def reader(self) -> Reader:
        """This process's reader (made on first use; not pickled)."""
        if self._reader is None:
            self._reader = Reader(self.source, self.policy, self.limits)
        return self._reader

    @property
    def skipped(self) -> int:
        """Objects and samples this process left out under ``on_error="skip"``."""
        return self._reader.skipped if self._reader is not None else 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_reader"] = None  # its counters and client belong to this process
        return state

    def close(self) -> None:
        """Close this process's client (a later read opens a new one)."""
        self.source.close()

    def decode_or_skip(self, decode: Callable[[Any], Any] | None, value: Any, key: str,
                       reread: Callable[[], Any], sample: str | None = None) -> Any:
        """``decode(value)`` under the error policy.

        Args:
            decode: the dataset's decode function (``None``: ``value`` as is).
            value: the raw sample.
            key: the object key the sample came from (named in errors).
            reread: reads the raw sample again (for ``on_error="retry"``);
                returns ``SKIP`` when the read itself was skipped.
            sample: the sample's key within the object (a tar shard's
                ``__key__``), named in errors after the object.

        Returns:
            The decoded sample, or :data:`SKIP`.

        Raises:
            SampleDecodeError: ``decode`` raised (``"raise"``, or ``"retry"``
                once the retries are spent); the cause is chained.
        """
        if decode is None:
            return value
        attempts = 1 + (self.policy.max_retries if self.policy.on_error == "retry" else 0)
        err: DataError | None = None
        for attempt in range(attempts):
            if attempt:
                value = reread()
                if value is SKIP:
                    return SKIP
            try:
                return decode(value)
            except Exception as exc:  # noqa: BLE001 - any failure of user code names the sample
                where = self.source.where(key) + (f": sample {sample!r}" if sample is not None else "")
                err = SampleDecodeError(f"{where}: decode failed: {type(exc).__name__}: {exc}",
                                        bucket=self.source.bucket, key=key)
                err.__cause__ = exc
        assert err is not None
        if self.policy.on_error == "skip":
            self.reader.skip(err)
            return SKIP
        raise err
