"""Open files of object versions, shared by the fast path's readers.

A blob file is immutable (a new version of an object is a new file), so one
open descriptor per blob can serve every reader of that version. The cache
keeps the most recently used ones open (LRU) and counts references, so a file
is never closed under a reader: an evicted entry is closed when its last
reader lets go.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from ..engine import Engine, ObjectInfo

__all__ = ["OpenFile", "OpenFiles"]


class OpenFile:
    """A read-only descriptor of one blob, held by :class:`OpenFiles`.

    Attributes:
        fd: the descriptor; valid until the holder calls :meth:`OpenFiles.release`.
    """

    __slots__ = ("fd", "refs", "evicted")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.refs = 1
        self.evicted = False


class OpenFiles:
    """Open descriptors of immutable blob files: LRU, ref-counted, thread-safe.

    Args:
        engine: looks objects up and opens their current version.
        capacity: most descriptors kept open when nobody holds them.

    Every :meth:`open` is paired with one :meth:`release` of what it returned.
    """

    def __init__(self, engine: Engine, capacity: int = 512) -> None:
        self.engine = engine
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, OpenFile] = OrderedDict()  # blob_id -> open file

    def open(self, bucket: str, key: str) -> tuple[ObjectInfo, OpenFile]:
        """Look up an object and take a reference to its current version's file:
        the cached one when that version is open already, else one the engine
        opens (which retries a version replaced between lookup and open).

        Returns:
            ``(info, file)``: the version's metadata and its open file.

        Raises:
            NoSuchBucket, NoSuchKey: no such object.
            OSError: the file cannot be opened.
        """
        info = self.engine.head_object(bucket, key)
        f = self._acquire(info.blob_id)
        if f is None:
            info, fd = self.engine.open_object(bucket, key)
            f = self._add(info.blob_id, fd)
        return info, f

    def release(self, f: OpenFile) -> None:
        """Drop one reference taken by :meth:`open`."""
        with self._lock:
            f.refs -= 1
            if f.evicted and f.refs == 0:
                os.close(f.fd)

    def close(self) -> None:
        """Close every file nobody holds; held ones close on their last release."""
        with self._lock:
            for f in self._entries.values():
                f.evicted = True
                if f.refs == 0:
                    os.close(f.fd)
            self._entries.clear()

    def _acquire(self, blob_id: str) -> OpenFile | None:
        """The cached file of ``blob_id`` with a reference taken, or ``None``."""
        with self._lock:
            f = self._entries.get(blob_id)
            if f is not None:
                f.refs += 1
                self._entries.move_to_end(blob_id)
            return f

    def _add(self, blob_id: str, fd: int) -> OpenFile:
        """Cache an open descriptor (taking a reference); if another thread cached
        the same blob meanwhile, ``fd`` is closed and that entry is used."""
        with self._lock:
            f = self._entries.get(blob_id)
            if f is not None:
                os.close(fd)
                f.refs += 1
                return f
            f = OpenFile(fd)
            self._entries[blob_id] = f
            while len(self._entries) > self.capacity:
                _, old = self._entries.popitem(last=False)
                old.evicted = True
                if old.refs == 0:
                    os.close(old.fd)
            return f
