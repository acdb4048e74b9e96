"""Open descriptors of object versions' data files, shared by every reader.

A blob file is immutable (a new version of an object is a new file), so one
open descriptor per blob serves every reader of that version, over the fast
path and S3 alike. The cache keeps the most recently used descriptors open
(LRU) and counts references, so a file is never closed under a reader. When a
version is deleted or overwritten its blob is unlinked first and then
*forgotten* here: its descriptor closes as soon as its last reader lets go, so
the version's disk space comes back then, not when LRU eviction gets to it.

Ordering that keeps the cache from re-opening a removed version: a blob's file
is unlinked before :meth:`OpenFiles.forget`, and :meth:`OpenFiles.acquire`
opens and caches under the same lock, so an open either happened before the
forget (and is dropped by it) or after the unlink (and fails with
``FileNotFoundError``, which the engine answers by looking the key up again).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["OpenFile", "OpenFiles"]

_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC


class OpenFile:
    """A read-only descriptor of one blob, held by :class:`OpenFiles`.

    Attributes:
        fd: the descriptor; valid until the holder calls :meth:`OpenFiles.release`.
        size: the file's length when it was opened, bytes.
    """

    __slots__ = ("fd", "size", "refs", "evicted")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        try:
            self.size = os.fstat(fd).st_size
        except OSError:
            os.close(fd)
            raise
        self.refs = 1
        self.evicted = False


class OpenFiles:
    """Open descriptors of immutable blob files: LRU, ref-counted, thread-safe.

    Args:
        capacity: most descriptors kept open when nobody holds them.

    Every :meth:`acquire` is paired with one :meth:`release` of what it returned.
    """

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, OpenFile] = OrderedDict()  # blob_id -> open file
        self._open = 0  # descriptors open: cached, or forgotten but still held

    def acquire(self, blob_id: str, path: str) -> OpenFile:
        """A reference to the open file of ``blob_id`` (opening ``path`` when it is
        not cached).

        Raises:
            FileNotFoundError: the blob was removed (its version was replaced).
            OSError: the file cannot be opened.
        """
        with self._lock:
            f = self._entries.get(blob_id)
            if f is not None:
                f.refs += 1
                self._entries.move_to_end(blob_id)
                return f
            f = OpenFile(os.open(path, _OPEN_READ))
            self._open += 1
            self._entries[blob_id] = f
            while len(self._entries) > self.capacity:
                _, old = self._entries.popitem(last=False)
                self._evict(old)
            return f

    def release(self, f: OpenFile) -> None:
        """Drop one reference taken by :meth:`acquire`."""
        with self._lock:
            f.refs -= 1
            if f.evicted and f.refs == 0:
                self._close(f)

    def forget(self, blob_ids: Iterable[str]) -> None:
        """Blobs whose files were unlinked: close their descriptors now, or on the
        last reader's release."""
        with self._lock:
            for b in blob_ids:
                f = self._entries.pop(b, None)
                if f is not None:
                    self._evict(f)

    def open_count(self) -> int:
        """Descriptors open now (cached, or forgotten but still held by a reader)."""
        with self._lock:
            return self._open

    def close(self) -> None:
        """Close every file nobody holds; held ones close on their last release."""
        with self._lock:
            for f in self._entries.values():
                self._evict(f)
            self._entries.clear()

    def _evict(self, f: OpenFile) -> None:
        f.evicted = True
        if f.refs == 0:
            self._close(f)

    def _close(self, f: OpenFile) -> None:
        os.close(f.fd)
        self._open -= 1
