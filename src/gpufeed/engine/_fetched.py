"""The chunks a cluster node fetched from other nodes, kept for the reads
after (:mod:`._remote`): a byte-bounded LRU of unlinked temp files. Kept apart
from :mod:`._remote` so the chunk store can name it without an import cycle.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

__all__ = ["FetchedChunks", "FETCH_CACHE_BYTES"]


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
