"""The chunks a cluster node fetched from other nodes, kept for the reads
after (:mod:`._remote`): a byte-bounded LRU of unlinked temp files; and the
fetches under way, shared by the reads that need the same bytes at the same
time (:class:`SharedFetches`). Kept apart from :mod:`._remote` so the chunk
store can name it without an import cycle.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

__all__ = ["FetchedChunks", "SharedFetches", "FETCH_CACHE_BYTES"]


#: Stored bytes of fetched chunks a node keeps unless configured.
FETCH_CACHE_BYTES = 1 << 30  # 1 GiB


class FetchedChunks:
    """The chunks a node fetched from other nodes, each under a key that names
    its bytes (:func:`._remote.fetch_chunk` uses chunk id, data file, offset
    and length: a chunk a repair moved is another key), most recently used
    first, at most ``max_bytes`` stored bytes in all (a chunk larger than that is not
    kept). Each is an unlinked temp file in the data folder's ``tmp/``, so its
    space returns when the last reader closes it. Thread-safe.

    Args:
        max_bytes: most stored bytes kept (0: none).
    """

    def __init__(self, max_bytes: int = FETCH_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple, tuple[int, int]] = OrderedDict()  # key -> (fd, stored bytes)
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        #: Stored bytes fetched from other nodes since start (whole chunks and windows).
        self.fetched_bytes = 0
        #: The fetches under way, shared by concurrent reads of the same bytes.
        self.flights = SharedFetches()

    def get(self, key: tuple) -> int | None:
        """A new descriptor (the caller closes it) of the chunk kept under
        ``key``, or ``None`` when none is."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                self.misses += 1
                return None
            self._kept.move_to_end(key)
            self.hits += 1
            return os.dup(kept[0])

    def put(self, key: tuple, fd: int, stored: int) -> None:
        """Keep the chunk held in ``fd`` (``stored`` bytes, checked; ``fd`` is
        duplicated: the caller keeps its own) under ``key``, dropping the least
        recently used chunks past ``max_bytes``."""
        if self.max_bytes <= 0 or stored > self.max_bytes:
            return
        with self._lock:
            if key in self._kept:
                return
            self._kept[key] = (os.dup(fd), stored)
            self._bytes += stored
            while self._bytes > self.max_bytes:
                _, (old, n) = self._kept.popitem(last=False)
                os.close(old)
                self._bytes -= n

    def count_fetched(self, n: int) -> None:
        """Count ``n`` stored bytes fetched from another node."""
        with self._lock:
            self.fetched_bytes += n

    @property
    def kept_bytes(self) -> int:
        """Stored bytes kept now."""
        return self._bytes

    def close(self) -> None:
        """Drop every kept chunk (idempotent)."""
        with self._lock:
            kept, self._kept, self._bytes = self._kept, OrderedDict(), 0
        for fd, _ in kept.values():
            os.close(fd)


class _Flight:
    """One fetch under way: set ``done`` once ``fd`` (or ``error``) is there;
    ``users`` callers still to take their descriptor of it."""

    __slots__ = ("done", "fd", "error", "users")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.fd = -1
        self.error: BaseException | None = None
        self.users = 0


class SharedFetches:
    """Fetches shared by the callers that need the same bytes at the same time
    (single flight): the first caller for a key runs the fetch, the callers
    that ask for that key while it runs wait for it, and every one of them
    gets its own descriptor of the one result, or the fetch's error. A key
    asked after its fetch ended starts a new one (the chunk cache, or the
    caller's own file, serves what was fetched before). Thread-safe.

    Attributes:
        shared: calls since start that got another caller's fetch instead of their own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight] = {}
        self.shared = 0

    def fetch(self, key: Hashable, fn: Callable[[], int]) -> int:
        """A new descriptor (the caller closes it) of the file ``fn()`` returns for
        ``key``: ``fn`` runs once for the callers that ask for ``key`` while it runs
        (it returns a descriptor it hands over: it is closed once every caller
        has its own).

        Raises:
            Exception: what ``fn`` raised, in every caller that waited for it.
        """
        with self._lock:
            flight = self._flights.get(key)
            owner = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
            else:
                self.shared += 1
            flight.users += 1
        if owner:
            try:
                flight.fd = fn()
            except BaseException as exc:  # every waiter gets it too
                flight.error = exc
            with self._lock:
                del self._flights[key]
            flight.done.set()
        else:
            flight.done.wait()
        try:
            if flight.error is not None:
                raise flight.error
            return os.dup(flight.fd)
        finally:
            with self._lock:
                flight.users -= 1
                last = flight.users == 0
            if last and flight.fd >= 0:
                os.close(flight.fd)
