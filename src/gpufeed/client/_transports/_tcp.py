"""The TCP transport (``gpufeed+tcp://HOST:PORT``).

Object bytes arrive with ``recv_into`` straight into the caller's buffer;
reads of at least :data:`SPLIT_BYTES` are split across the pooled connections.
"""

from __future__ import annotations

import itertools
import mmap
import socket
from collections.abc import Sequence
from concurrent.futures import Future

from ...errors import InvalidArgument
from ...wire import protocol as p
from .._conn import connect_tcp
from .._types import ReadRequest, then
from ._pooled import PooledTransport
from ._results import batch_result

__all__ = ["TcpTransport", "SPLIT_BYTES"]

#: Reads at least this large are split across TCP connections.
SPLIT_BYTES = 64 << 20  # 64 MiB


class _AnonRegion:
    """Anonymous memory for alloc() on TCP (huge pages where the kernel allows)."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.mm = mmap.mmap(-1, self.size)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass


class TcpTransport(PooledTransport):
    """Pooled TCP connections (default 4); see :class:`~._pooled.PooledTransport`."""

    name = "tcp"
    default_connections = 4

    def _open_socket(self, address: tuple[str, int], timeout_s: float) -> socket.socket:
        return connect_tcp(address, timeout_s)

    def _fresh_region(self, nbytes: int) -> _AnonRegion:
        try:
            return _AnonRegion(nbytes)
        except OSError as exc:
            raise InvalidArgument(f"cannot allocate {nbytes} bytes: {exc}") from exc

    def submit_get(self, bucket: str, key: str, offset: int, length: int | None,
                   version_id: str | None = None, snapshot: str | None = None) -> Future:
        want = -1 if length is None else length
        fut = self.conn().request(p.Op.GET, p.Get(bucket, key, offset, want, version_id=version_id,
                                                  snapshot=snapshot),
                                  alloc=True)
        return then(fut, lambda reply_buf: memoryview(reply_buf[1]))

    def submit_get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                        version_id: str | None = None, snapshot: str | None = None) -> Future:
        if len(dest) < SPLIT_BYTES or len(self.conns) == 1:
            fut = self.conn().request(p.Op.GET, p.Get(bucket, key, offset, len(dest),
                                                      version_id=version_id, snapshot=snapshot), dests=[dest])
            return then(fut, lambda r: r.n)
        return self.executor_submit(self._get_split, bucket, key, dest, offset, version_id, snapshot)

    def get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                 version_id: str | None = None, snapshot: str | None = None) -> int:
        if len(dest) < SPLIT_BYTES or len(self.conns) == 1:
            return self.conn().call(p.Op.GET, p.Get(bucket, key, offset, len(dest), version_id=version_id,
                                                    snapshot=snapshot), dests=[dest]).n
        return self._get_split(bucket, key, dest, offset, version_id, snapshot)

    def _get_split(self, bucket: str, key: str, dest: memoryview, offset: int,
                   version_id: str | None, snapshot: str | None = None) -> int:
        """A large read split over the connections (runs on the executor)."""
        size = self.conn().call(p.Op.HEAD, p.Head(bucket, key, version_id, snapshot)).size
        want = max(0, min(len(dest), size - offset))
        if offset > size or (offset == size and size and len(dest)):
            # let the server produce the typed error
            return self.conn().request(p.Op.GET, p.Get(bucket, key, offset, len(dest),
                                                       version_id=version_id, snapshot=snapshot),
                                       dests=[dest]).result().n
        step = -(-want // len(self.conns))
        step = max(step, 1 << 20)
        futs = [conn.request(p.Op.GET, p.Get(bucket, key, offset + o, min(step, want - o),
                                             version_id=version_id, snapshot=snapshot),
                             dests=[dest[o:o + step]])
                for conn, o in zip(itertools.cycle(self.conns), range(0, want, step))]
        return sum(f.result().n for f in futs)

    def submit_get_many_into(self, reqs: Sequence[ReadRequest], dests: Sequence[memoryview],
                             digests_out: list | None, errors_out: list | None) -> Future:
        items = [p.Get(r.bucket, r.key, r.offset, len(d), version_id=r.version_id, snapshot=r.snapshot)
                 for r, d in zip(reqs, dests)]
        fut = self.conn().request(p.Op.GETV, p.GetV(items), dests=list(dests))
        return then(fut, lambda reply: batch_result(reqs, reply, errors_out))

    def submit_put(self, bucket: str, key: str, data: memoryview, content_type: str | None,
                   metadata: dict[str, str]) -> Future:
        return self.conn().request(p.Op.PUT, p.Put(bucket, key, len(data), -1, 0, content_type,
                                                   metadata), payload=data)
