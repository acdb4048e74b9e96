"""Read leases on the client: small reads of a leased object in this process.

With ``Client(..., leases=True)`` over shm, :meth:`Client.get_into` of the
current version asks the node once for a lease (op LEASE, see
:mod:`gpufeed.wire._leases` for why it is safe): the version's data file
(read-only), its block sums and the node's commit counter. Reads of that
object then take one ``preadv`` into the caller's buffer and one CRC32C
(awscrt, native) against the sums, in this process, with no round trip,
while the counter is unchanged, the lease is younger than the node's
``lease_s``, and the connection it came on is open. Anything else (no lease
offered, an object that cannot be leased, a read past the end, a short read,
a check that fails) goes through GET as without leases, which reports what is
wrong; a failed check also drops the lease.

Bounded: at most ``max_leases`` objects (256 by default; each keeps its data
file's descriptor open) and ``max_sums_bytes`` of their sums are held (the
oldest go first), and reads over ``max_read_bytes`` use GET (which lands large
reads in place at full speed anyway). Closing the client drops every lease.

Our own code rather than a library's: it is the fast path's client side.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from array import array

from awscrt.checksums import crc32c

from ..errors import NotImplementedByGpufeed

__all__ = ["Leases", "Lease"]

_BLOCK = 4096  # bytes per block sum (gpufeed.engine._blocksums)


class Lease:
    """One leased object version (or a refusal, ``fd == -1``, remembered as long).

    Attributes:
        fd: the read-only data file (closed when the lease goes), or -1.
        size: the version's bytes.
        generation: the commit counter it holds under.
        expires: ``time.monotonic()`` after which it is void.
        verify: reads are checked against ``sums`` (uint32 running CRC32C per 4 KiB block).
        conn: the connection it came on (void once that is closed).
    """

    __slots__ = ("fd", "size", "generation", "expires", "verify", "sums", "conn", "__weakref__")

    def __init__(self, fd: int, size: int, generation: int, expires: float, verify: bool, sums: array,
                 conn) -> None:
        self.fd, self.size, self.generation, self.expires = fd, size, generation, expires
        self.verify, self.sums, self.conn = verify, sums, conn

    def __del__(self) -> None:  # the last reader is done with the descriptor
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Leases:
    """The leases of one shm client.

    Args:
        ask: ``ask(bucket, key) -> (LeaseReply, [data_fd, counter_fd], connection)``
            (raises the node's error).
        max_leases: objects held at once (>= 1); each holds one open descriptor
            (of its data file) until it goes.
        max_sums_bytes: bytes of block sums held at once.
        max_read_bytes: largest read served from a lease.

    The caller checks that it is not a forked child first (its transport's fork check).
    """

    def __init__(self, ask, *, max_leases: int = 256, max_sums_bytes: int = 64 << 20,
                 max_read_bytes: int = 1 << 20) -> None:
        self._ask = ask
        self.max_leases, self.max_sums_bytes, self.max_read_bytes = max_leases, max_sums_bytes, max_read_bytes
        self._held: dict[tuple[str, str], Lease] = {}
        self._sums_bytes = 0
        self._counter: memoryview | None = None  # the node's commit counter, mapped read-only
        self._counter_id: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self.hits = 0  # reads served from a lease (for tests and benchmarks; approximate across threads)

    def read_into(self, bucket: str, key: str, dest: memoryview, offset: int) -> int | None:
        """Read ``len(dest)`` bytes at ``offset`` of the current version from a lease.

        Returns:
            The bytes read and checked, or ``None``: not served (read it with GET).

        Raises:
            The node's error for the LEASE request (NoSuchKey, AccessDenied, ...),
            except NotImplementedByGpufeed, which means ``None``.
        """
        n = len(dest)
        if not 0 < n <= self.max_read_bytes:
            return None
        lease = self._held.get((bucket, key))
        counter = self._counter
        if (lease is None or time.monotonic() > lease.expires or lease.conn.closed
                or (counter is not None and counter[0] != lease.generation)):
            lease = self._renew(bucket, key)
        if lease.fd < 0 or offset >= lease.size:
            return None  # not leasable, or past the end: GET answers
        end = min(offset + n, lease.size)
        m = end - offset
        if not lease.verify:
            if os.preadv(lease.fd, [dest[:m]], offset) != m:
                return None
            self.hits += 1
            return m
        first, last = offset // _BLOCK, -(-end // _BLOCK)
        seed = lease.sums[first - 1] if first else 0
        if offset % _BLOCK == 0 and (m % _BLOCK == 0 or end == lease.size):
            view = dest[:m]
            if os.preadv(lease.fd, [view], offset) == m and crc32c(view, seed) == lease.sums[last - 1]:
                self.hits += 1
                return m
        else:  # the whole blocks around the range, checked, then the range copied out
            lo = first * _BLOCK
            scratch = bytearray(min(last * _BLOCK, lease.size) - lo)
            if os.preadv(lease.fd, [scratch], lo) == len(scratch) and crc32c(scratch, seed) == lease.sums[last - 1]:
                dest[:m] = memoryview(scratch)[offset - lo:end - lo]
                self.hits += 1
                return m
        self.drop(bucket, key)  # short or failed its check: GET says what is wrong
        return None

    def drop(self, bucket: str, key: str) -> None:
        """Forget the lease of ``bucket/key`` (if any)."""
        with self._lock:
            lease = self._held.pop((bucket, key), None)
            if lease is not None:
                self._sums_bytes -= len(lease.sums) * 4

    def clear(self) -> None:
        """Forget every lease (descriptors close as their last reads end)."""
        with self._lock:
            self._held.clear()
            self._sums_bytes = 0

    def _renew(self, bucket: str, key: str) -> Lease:
        try:
            reply, fds, conn = self._ask(bucket, key)
        except NotImplementedByGpufeed:
            # remembered as a refusal for as long as a lease would be
            lease = Lease(-1, 0, self._counter[0] if self._counter is not None else -1,
                          time.monotonic() + 1.0, False, array("I"), _OPEN)
            self._keep(bucket, key, lease)
            return lease
        try:
            self._map_counter(fds[1])
        finally:
            os.close(fds[1])
        sums = array("I")
        sums.frombytes(reply.sums)
        lease = Lease(fds[0], reply.size, reply.generation, time.monotonic() + reply.ttl_s, reply.verify,
                      sums, conn)
        if reply.verify and len(sums) < -(-reply.size // _BLOCK):
            return Lease(-1, 0, -1, 0.0, False, array("I"), _OPEN)  # not ours to judge: GET does
        self._keep(bucket, key, lease)
        return lease

    def _map_counter(self, fd: int) -> None:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if ident == self._counter_id:
            return
        mm = mmap.mmap(fd, _BLOCK, mmap.MAP_SHARED, mmap.PROT_READ)
        with self._lock:  # a new node process: every lease of the old one is void
            self._held.clear()
            self._sums_bytes = 0
            self._counter, self._counter_id = memoryview(mm).cast("Q"), ident

    def _keep(self, bucket: str, key: str, lease: Lease) -> None:
        cost = len(lease.sums) * 4
        with self._lock:
            old = self._held.pop((bucket, key), None)
            if old is not None:
                self._sums_bytes -= len(old.sums) * 4
            while self._held and (len(self._held) >= self.max_leases
                                  or self._sums_bytes + cost > self.max_sums_bytes):
                first = next(iter(self._held))
                self._sums_bytes -= len(self._held.pop(first).sums) * 4
            if cost <= self.max_sums_bytes:
                self._held[(bucket, key)] = lease
                self._sums_bytes += cost


class _Open:
    closed = False


_OPEN = _Open()  # the "connection" of a remembered refusal: never closed
