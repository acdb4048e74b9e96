"""Server-allocated shared-memory regions and the pool that reuses them.

Why: on the shm transport the server writes object bytes into memory the
client shares with it. Fresh shared memory is expensive to populate (every
4 KiB page is allocated, zeroed and mapped: measured 0.5-1.3 s per GB on the
2-core VM, more than the read itself), and a serving process typically loads
its model once, into fresh memory. So the server can hand out regions itself
(``ALLOC_REGION``, the memfd travels back with ``SCM_RIGHTS``) and keep the
ones a client is provably done with, zeroed and still populated, for the next
client: a new process then maps pages that already exist (~0.1 s per GB).

Reuse is only safe when no process can still see the memory, so a region
goes back to the pool only when

* the client said it unmapped the region and holds no descriptor of it
  (``UNREGISTER`` with ``unmapped``), or
* the client *process* has exited: the server takes a pidfd of the peer when
  the connection is accepted (``SO_PEERCRED``); regions still registered when
  a connection closes wait (the process's tensors may still use them) until
  that pidfd becomes readable,

and never while a request of that connection might still write into it.
Regions waiting for their process count against the pool's capacity (the
oldest are freed first: the server unmaps them and the memory goes when the
client unmaps it); a client the server cannot watch (another PID namespace,
or an in-process node) gets its regions freed when its connection closes. Regions are zeroed before reuse, so no
client sees another's bytes. A client that forks says so (``FORKED``): its
children may map what it was lent so far, so none of that is reused.

Our own code because it is the fast path's memory management.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import socket
import struct
import threading

import numpy as np

from .._memory import populate

__all__ = ["ServerRegion", "RegionPool", "peer_pid", "peer_process"]



class ServerRegion:
    """A memfd the server created and keeps open (to lend it again).

    Attributes:
        fd: the memfd (owned; closed by :meth:`close`).
        mm: the server's mapping (populated).
        size: bytes.
    """

    __slots__ = ("fd", "mm", "size", "key", "lends", "live")

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.lends = 0      # times lent; a registration made under another number is stale
        self.live = False   # lent and not yet released for reuse
        self.fd = os.memfd_create("gpufeed-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            # a client must not shrink it under the server's mapping (SIGBUS) or seal it
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.mm = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
            populate(self.mm)  # in parallel, GIL released (MAP_POPULATE is one thread)
        except BaseException:
            os.close(self.fd)
            raise
        st = os.fstat(self.fd)
        self.key = (st.st_dev, st.st_ino)  # how a REGISTER of this memfd is recognised

    def zero(self) -> None:
        """Overwrite every byte with 0 (``memset`` with the GIL released)."""
        arr = np.frombuffer(self.mm, dtype=np.uint8)
        try:
            ctypes.memset(arr.ctypes.data, 0, arr.nbytes)
        finally:
            del arr

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:  # a worker still holds a slice; the GC unmaps it later
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


class RegionPool:
    """Zeroed, populated server regions waiting for their next client.

    Args:
        capacity_bytes: most bytes kept; 0 keeps nothing (every region is freed
            when its client is done).

    Thread-safe. ``stats()`` counts hits (a request served from the pool),
    misses (a fresh region) and bytes kept.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = max(0, int(capacity_bytes))
        self._free: list[ServerRegion] = []
        self._lock = threading.Lock()
        self._closed = False
        self.hits = 0
        self.misses = 0

    def take(self, size: int) -> tuple[ServerRegion, bool]:
        """A region of at least ``size`` bytes (and at most about twice that) from
        the pool, else a fresh one; returns ``(region, reused)``."""
        with self._lock:
            fits = [r for r in self._free if size <= r.size <= max(2 * size, 1 << 20)]
            if fits:
                best = min(fits, key=lambda r: r.size)
                self._free.remove(best)
                self.hits += 1
                return best, True
            self.misses += 1
        return ServerRegion(size), False

    def give_back(self, regions: list[ServerRegion]) -> None:
        """Zero ``regions`` and keep them (oldest dropped past capacity), or free them."""
        for region in regions:
            if self.capacity_bytes < region.size or self._closed:
                region.close()
                continue
            try:
                region.zero()
            except (OSError, ValueError):  # closed under us (server stopping)
                region.close()
                continue
            with self._lock:
                if self._closed:
                    region.close()
                    continue
                self._free.append(region)
                kept = sum(r.size for r in self._free)
                while kept > self.capacity_bytes and self._free:
                    old = self._free.pop(0)
                    kept -= old.size
                    old.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses,
                    "bytes": sum(r.size for r in self._free), "regions": len(self._free)}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for region in free:
            region.close()


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket (``SO_PEERCRED``);
    0 when unknown (another PID namespace)."""
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except OSError:
        return 0
    return max(pid, 0)


def peer_process(sock: socket.socket) -> tuple[int, int | None]:
    """``(pid, pidfd)`` of the process at the other end of a Unix socket; pid 0
    when unknown (another PID namespace), pidfd None when it cannot be watched
    (no ``pidfd_open``, an unknown pid, or this very process: an in-process
    node's clients never "exit")."""
    pid = peer_pid(sock)
    if pid <= 0:
        return 0, None
    if pid == os.getpid():
        return pid, None
    try:
        return pid, os.pidfd_open(pid)
    except (OSError, AttributeError):
        return pid, None
