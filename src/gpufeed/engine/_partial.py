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

Reads of other open versions that need the same window of the same chunk
(its id and place) while it is fetched wait for that one fetch
(:class:`._fetched.SharedFetches`, keyed by chunk and window) and copy its
checked bytes into their own file (checked again there), or get its error:
concurrent range GETs of one window fetch it once.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from ..errors import DamagedObject, InternalError
from ._blocksums import SUM_KIND
from ._remote import check_span, fetch_checked, private_temp
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
                self._fill(w * WINDOW_BYTES, min(WINDOW_BYTES, c.stored - w * WINDOW_BYTES))
                self._have.add(w)

    def _fill(self, off: int, n: int) -> None:
        """Fetch the window of ``n`` stored bytes at ``off`` into :attr:`fd`, or wait
        for the same window another open version fetches and copy it from there."""
        c, kept = self._c, self._store.fetched
        if kept is None:
            fetch_checked(self._store, c, *self._where, self.fd, (off, n))
            return

        def fetch() -> int:
            fetch_checked(self._store, c, *self._where, self.fd, (off, n))
            return os.dup(self.fd)
        place = (c.chunk_id, c.file, c.file_offset, c.stored)
        src = kept.flights.fetch(("window", place, off), fetch)
        try:
            if os.path.samestat(os.fstat(src), os.fstat(self.fd)):
                return  # this one fetched it
            _copy_range(src, self.fd, c.file_offset + off, n)
        finally:
            os.close(src)
        reason = check_span(self.fd, c, (off, n))
        if reason is not None:
            raise DamagedObject(f"{self._where[0]}/{self._where[1]}: chunk {c.chunk_id}: the window copied from "
                                f"another read's fetch failed its check ({reason}); nothing of it was served",
                                chunk=c.chunk_id, bucket=self._where[0], key=self._where[1])

    @property
    def fetched_bytes(self) -> int:
        """Stored bytes fetched so far."""
        with self._lock:
            return sum(min(WINDOW_BYTES, self._c.stored - w * WINDOW_BYTES) for w in self._have)


def _copy_range(src: int, dst: int, pos: int, n: int) -> None:
    """Copy the ``n`` bytes at ``pos`` of file ``src`` to the same place of ``dst``
    (``copy_file_range``, else reads and writes).

    Raises:
        InternalError: the file system failed, or ``src`` ended early.
    """
    done = 0
    try:
        while done < n:
            try:
                got = os.copy_file_range(src, dst, n - done, pos + done, pos + done)
            except OSError:  # not on this file system: copy through memory
                buf = os.pread(src, min(n - done, 1 << 20), pos + done)
                got = os.pwrite(dst, buf, pos + done) if buf else 0
            if got == 0:
                raise InternalError(f"a fetched window ended after {done} of {n} bytes")
            done += got
    except OSError as exc:
        raise InternalError(f"copying a fetched window failed: {exc}") from exc
