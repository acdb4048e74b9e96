"""Reading many objects with bounded memory: batched small reads, whole-object
large reads, many requests in flight, and the error policy.

:meth:`Reader.read` takes an ordered stream of listed objects and yields
their bytes in the same order. Objects smaller than ``batch_bytes`` are
grouped (up to ``batch_items`` of them) into one
:meth:`~gpufeed.client.Client.submit_get_many_into`, one round trip for the
group; larger ones (tar shards) are read whole with one
:meth:`~gpufeed.client.Client.submit_get_into` each, which the TCP transport
splits across its pooled connections. Requests are submitted ahead while the
bytes in flight stay under ``max_inflight_bytes`` and the objects under
``max_inflight`` (at least one group is always in flight).

Each object is read with one byte more than its listed size: a read that
fills that byte, or stops short, means the object was rewritten since it was
listed (:class:`SampleChanged`), so a sample is never silently cut or
padded.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from ...client import ReadRequest
from ...errors import GpufeedError, InvalidArgument, NoSuchBucket, NoSuchKey, TransportError
from ._errors import DataError, SampleChanged, SampleMissing, SampleReadError
from ._source import ErrorPolicy, Listed, Source

__all__ = ["Reader", "ReadLimits"]

log = logging.getLogger("gpufeed.ai.data")


@dataclass(frozen=True)
class ReadLimits:
    """How much a dataset reads ahead, and how it groups small reads.

    Attributes:
        max_inflight_bytes: bytes of objects requested but not yet handed on
            (per process: each DataLoader worker has its own). Default 256 MiB.
        max_inflight: objects requested but not yet handed on. Default 512.
        batch_bytes: objects smaller than this are read in groups, one round
            trip per group of at most ``batch_bytes`` bytes. Default 4 MiB.
        batch_items: objects per group, at most. Default 64.
    """

    max_inflight_bytes: int = 256 << 20  # 256 MiB
    max_inflight: int = 512
    batch_bytes: int = 4 << 20  # 4 MiB
    batch_items: int = 64

    def __post_init__(self) -> None:
        for name in ("max_inflight_bytes", "max_inflight", "batch_bytes", "batch_items"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1: {value!r}")


@dataclass
class _Pending:
    group: list[Listed]
    views: list[memoryview]
    fut: Future
    errors: list | None
    nbytes: int


class Reader:
    """Reads listed objects of one :class:`Source` in order, with the error policy.

    Args:
        source: where the objects live (its client is this process's).
        policy: what to do with an object that cannot be read.
        limits: read-ahead and grouping.

    Attributes:
        skipped: objects left out under ``on_error="skip"``.
        last_skipped: why the last of them was left out (``None``: none was).
    """

    def __init__(self, source: Source, policy: ErrorPolicy, limits: ReadLimits) -> None:
        self.source, self.policy, self.limits = source, policy, limits
        self.skipped = 0
        self.last_skipped: DataError | None = None
        self._retry_worked = False

    def read(self, items: Iterable[Listed]) -> Iterator[tuple[Listed, memoryview | None]]:
        """Yield ``(item, data)`` for each item, in order; ``data`` is exactly
        ``item.size`` bytes, or ``None`` for an item skipped by the policy.

        Raises:
            SampleMissing: the object is gone (``on_error`` ``"raise"``, or
                ``"retry"`` once the retries are spent).
            SampleChanged: its size is not the listed size.
            SampleReadError: the node could not be reached or failed the read.
        """
        lim = self.limits
        groups = self._groups(items)
        pending: deque[_Pending] = deque()
        inflight_bytes = inflight_items = 0
        nxt = next(groups, None)
        while True:
            while nxt is not None and (not pending or (
                    inflight_bytes + _need(nxt) <= lim.max_inflight_bytes
                    and inflight_items + len(nxt) <= lim.max_inflight)):
                p = self._submit(nxt)
                pending.append(p)
                inflight_bytes += p.nbytes
                inflight_items += len(nxt)
                nxt = next(groups, None)
            if not pending:
                return
            p = pending.popleft()
            inflight_bytes -= p.nbytes
            inflight_items -= len(p.group)
            yield from self._finish(p)

    def read_one(self, item: Listed) -> memoryview | None:
        """One object, read alone, with the error policy (``None``: skipped).

        Raises:
            as :meth:`read`.
        """
        return next(iter(self.read([item])))[1]

    def _groups(self, items: Iterable[Listed]) -> Iterator[list[Listed]]:
        lim = self.limits
        group: list[Listed] = []
        nbytes = 0
        for it in items:
            if it.size + 1 > lim.batch_bytes:
                if group:
                    yield group
                    group, nbytes = [], 0
                yield [it]
                continue
            if group and (nbytes + it.size + 1 > lim.batch_bytes or len(group) >= lim.batch_items):
                yield group
                group, nbytes = [], 0
            group.append(it)
            nbytes += it.size + 1
        if group:
            yield group

    def _submit(self, group: list[Listed]) -> _Pending:
        nbytes = _need(group)
        errors: list | None = None
        views: list[memoryview] = []
        try:
            client = self.source.client()
            # memory the node writes into directly (shm), pooled and already faulted in
            buf = client.alloc(nbytes)
            pos = 0
            for it in group:
                views.append(buf[pos:pos + it.size + 1])
                pos += it.size + 1
            if len(group) == 1 and group[0].size + 1 > self.limits.batch_bytes:
                fut = client.submit_get_into(self.source.bucket, group[0].key, views[0])
            else:
                errors = []
                reqs = [ReadRequest(self.source.bucket, it.key, v) for it, v in zip(group, views)]
                fut = client.submit_get_many_into(reqs, errors_out=errors)
            # the node writes into alloc memory by region id, so nothing else holds the buffer:
            # keep it until the read is done, even if this reader is dropped before then
            # (else the pool could lend it again while the node still writes into it)
            fut.add_done_callback(functools.partial(_keep, buf))
        except (GpufeedError, OSError) as exc:  # could not even send: fail the group
            fut = Future()
            fut.set_exception(exc)
        return _Pending(group, views, fut, errors, nbytes)

    def _finish(self, p: _Pending) -> Iterator[tuple[Listed, memoryview | None]]:
        try:
            got = p.fut.result()
        except (GpufeedError, OSError) as exc:
            if _lost(exc):
                self.source.failed(exc)
            for it in p.group:
                yield it, self._recover(it, exc)
            return
        counts = got if isinstance(got, list) else [got]
        for i, it in enumerate(p.group):
            err = p.errors[i] if p.errors is not None else None
            if err is None and counts[i] != it.size:
                err = SampleChanged(f"{self.source.where(it.key)}: listed with {it.size} bytes, "
                                    f"now {'more' if counts[i] > it.size else counts[i]}",
                                    bucket=self.source.bucket, key=it.key)
            if err is not None:
                yield it, self._recover(it, err)
            else:
                yield it, p.views[i][:it.size]

    def _recover(self, item: Listed, exc: BaseException) -> memoryview | None:
        """Apply the policy to a failed read: the bytes of a successful retry,
        ``None`` to skip, or raise the typed error."""
        err = self.typed(item, exc)
        if self.policy.on_error == "retry":
            for attempt in range(self.policy.max_retries):
                # the other reads of a group that failed with its connection: once one retry
                # worked, the node is back, and the next one goes without waiting
                if attempt or not self._retry_worked:
                    time.sleep(self.policy.retry_backoff_s * (2 ** attempt))
                data = self._read_alone(item)
                self._retry_worked = not isinstance(data, BaseException)
                if not isinstance(data, BaseException):
                    return data
                err = self.typed(item, data)
            raise err
        if self.policy.on_error == "skip":
            self.skip(err)
            return None
        raise err

    def _read_alone(self, item: Listed) -> memoryview | BaseException:
        buf = memoryview(bytearray(item.size + 1))
        try:
            n = self.source.client().get_into(self.source.bucket, item.key, buf)
        except (GpufeedError, OSError) as exc:
            if _lost(exc):
                self.source.failed(exc)
            return exc
        if n != item.size:
            return SampleChanged(f"{self.source.where(item.key)}: listed with {item.size} bytes, "
                                 f"now {'more' if n > item.size else n}",
                                 bucket=self.source.bucket, key=item.key)
        return buf[:item.size]

    def typed(self, item: Listed, exc: BaseException) -> DataError:
        """``exc`` as the :class:`DataError` that names ``item`` (the cause chained)."""
        where, kw = self.source.where(item.key), {"bucket": self.source.bucket, "key": item.key}
        if isinstance(exc, DataError):
            return exc
        if isinstance(exc, (NoSuchKey, NoSuchBucket)):
            err: DataError = SampleMissing(f"{where}: listed, but gone ({exc.code}): "
                                           f"deleted during the epoch?", **kw)
        else:
            err = SampleReadError(f"{where}: read failed: {type(exc).__name__}: {exc}", **kw)
        err.__cause__ = exc
        return err

    def skip(self, err: DataError) -> None:
        """Count and log a sample left out under ``on_error="skip"``."""
        self.skipped += 1
        self.last_skipped = err
        log.warning("skipping %s: %s", self.source.where(err.key) if err.key else "a sample", err)


def _keep(_buf: memoryview, _fut: Future) -> None:
    """A done-callback whose only job is to hold ``_buf`` as long as the Future lives."""


def _lost(exc: BaseException) -> bool:
    """The connection failed (rather than the node answering with an error)."""
    return isinstance(exc, TransportError) or not isinstance(exc, GpufeedError)


def _need(group: list[Listed]) -> int:
    return sum(it.size + 1 for it in group)
