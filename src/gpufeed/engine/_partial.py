"""Large raw chunks another cluster node holds, fetched window by window as
reads need them (:class:`PartialChunk`).

A read through a node that holds no copy of a chunk fetches the chunk from a
node that does (:mod:`._remote`). A small chunk is fetched whole, checked and
kept for later reads (:mod:`._fetched`). A raw chunk (stored uncompressed, with
running CRC32C block sums) of more than :data:`PARTIAL_MIN_BYTES` is one
large object or more, and a range read of it (a safetensors header, one
tensor, one sample) needs a small part: such a chunk gets a private sparse
temp file of its size, and each read first makes sure the
:data:`WINDOW_BYTES` windows it touches are there, fetching each missing one
with a ranged op CHUNK and checking its blocks against the catalog's sums
before a byte of it is served (:func:`._remote.fetch_checked`). The windows
fetched stay for the rest of the open version; they are not kept after it.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from ._blocksums import SUM_KIND
from ._remote import fetch_checked, private_temp
from .types import ChunkRecord

if TYPE_CHECKING:
    from ._chunks import ChunkStore

__all__ = ["PartialChunk", "PARTIAL_MIN_BYTES", "WINDOW_BYTES", "fetches_in_windows"]

#: Raw chunks of more stored bytes than this are fetched in windows.
PARTIAL_MIN_BYTES = 64 << 20  # 64 MiB
#: Bytes of a window (a multiple of the 4 KiB sum block).
WINDOW_BYTES = 8 << 20  # 8 MiB


def fetches_in_windows(c: ChunkRecord) -> bool:
    """Whether chunk ``c`` is fetched window by window: raw, running CRC32C
    sums, more than :data:`PARTIAL_MIN_BYTES` stored bytes."""
    return not c.codec and c.sum_kind == SUM_KIND and c.domain is None and c.stored > PARTIAL_MIN_BYTES


class PartialChunk:
    """One chunk another node holds, its windows fetched as reads need them.

    Args:
        store: the engine's chunk store (fetch function, temp files).
        c: the chunk (:func:`fetches_in_windows`).
        bucket, key: the object read (named in errors).

    Attributes:
        fd: the private unlinked temp file; the chunk's stored bytes sit at
            ``c.file_offset``, each byte valid once :meth:`ensure` covered it.
            The opener closes it.
    """

    def __init__(self, store: ChunkStore, c: ChunkRecord, bucket: str, key: str) -> None:
        self._store, self._c, self._where = store, c, (bucket, key)
        self._have: set[int] = set()
        self._lock = threading.Lock()
        self.fd = private_temp(store)
        try:
            os.ftruncate(self.fd, c.file_offset + c.stored)
        except BaseException:
            os.close(self.fd)
            raise

    def ensure(self, start: int, n: int) -> None:
        """Make sure the stored bytes ``[start, start + n)`` of the chunk are in
        :attr:`fd`, checked: fetch each window they touch that is not there yet.

        Raises:
            HolderUnavailable: no node that holds the chunk could be read from.
            DamagedObject: every node that answered sent bytes that fail their check.
        """
        c = self._c
        stop = min(start + n, c.stored)
        if stop <= start:
            return
        with self._lock:
            for w in range(start // WINDOW_BYTES, (stop - 1) // WINDOW_BYTES + 1):
                if w in self._have:
                    continue
                off = w * WINDOW_BYTES
                fetch_checked(self._store, c, *self._where, self.fd, (off, min(WINDOW_BYTES, c.stored - off)))
                self._have.add(w)

    @property
    def fetched_bytes(self) -> int:
        """Stored bytes fetched so far."""
        with self._lock:
            return sum(min(WINDOW_BYTES, self._c.stored - w * WINDOW_BYTES) for w in self._have)
