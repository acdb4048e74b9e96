"""Memory regions shared with the server (same-host shared-memory transport).

A region is a ``memfd`` mapped into this process and, once registered, into
the server: the server reads object bytes straight into it. Buffers the
application gets from :meth:`gpufeed.Client.alloc` live in regions, so data
lands in its final place in one copy.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import weakref
from collections.abc import Callable

from .._memory import address_of

__all__ = ["Region", "address_of", "StagingPool", "SharedBuffer"]


class Region:
    """A memfd-backed memory region.

    Args:
        region_id: id the server knows it by.
        size: bytes.
        name: memfd name (fresh regions).
        fd: map this memfd instead of creating one: a region the server lent
            (``ALLOC_REGION``). The region takes ownership of the descriptor.

    Attributes:
        region_id: id the server knows it by.
        size: bytes.
        mm: the ``mmap`` object.
        address: base address in this process.
        lent: the server allocated it.
    """

    def __init__(self, region_id: int, size: int, name: str = "gpufeed", fd: int | None = None) -> None:
        self.region_id = region_id
        self.size = size
        self.lent = fd is not None
        #: byte range Client.map_ahead already mapped in (one span: alloc buffers start at 0)
        self.mapped_from, self.mapped_to = size, 0
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING) if fd is None else fd
        try:
            if not self.lent:
                os.ftruncate(self.fd, max(size, 1))
                # the node maps it: it requires a memfd that cannot shrink under it
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            self.mm = mmap.mmap(self.fd, max(size, 1), flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.address = address_of(self.mm)[0]
        self._finalizer = weakref.finalize(self, Region._cleanup, self.fd)

    @staticmethod
    def _cleanup(fd: int) -> None:
        try:
            os.close(fd)
        except OSError:
            pass

    def drop_fd(self) -> None:
        """Close the descriptor now (the mapping stays)."""
        self._finalizer()

    def contains(self, address: int, nbytes: int) -> bool:
        return self.address <= address and address + nbytes <= self.address + self.size

    def view(self, offset: int = 0, length: int | None = None) -> memoryview:
        length = self.size - offset if length is None else length
        return memoryview(self.mm)[offset : offset + length]

    def close(self) -> bool:
        """Close the fd and unmap; returns True if unmapped. While buffers over it
        are alive the mapping stays (it goes with the last of them) and this
        returns False."""
        self._finalizer()
        try:
            self.mm.close()
        except BufferError:  # buffers over it are still alive: they own the mapping now
            return False
        return True


class StagingPool:
    """Fixed-size slots in one registered region, for buffers that are not in a
    region (one extra memcpy instead of none).

    Args:
        region: the registered staging region.
        slot_bytes: size of each slot.
    """

    def __init__(self, region: Region, slot_bytes: int) -> None:
        self.region = region
        self.slot_bytes = slot_bytes
        self._free = list(range(region.size // slot_bytes))
        self._cond = threading.Condition()

    def acquire(self) -> int:
        """Block until a slot is free; returns its byte offset in the region."""
        with self._cond:
            while not self._free:
                self._cond.wait()
            return self._free.pop() * self.slot_bytes

    def try_acquire(self) -> int | None:
        """A free slot's offset, or ``None`` without waiting."""
        with self._cond:
            return self._free.pop() * self.slot_bytes if self._free else None

    @property
    def nslots(self) -> int:
        return self.region.size // self.slot_bytes

    def acquire_many(self, k: int) -> list[int]:
        """Block until ``k`` slots are free and take them together (no
        hold-and-wait between batches). ``k`` must not exceed :attr:`nslots`."""
        if k > self.nslots:
            raise ValueError(f"{k} slots requested, the pool has {self.nslots}")
        with self._cond:
            while len(self._free) < k:
                self._cond.wait()
            return [self._free.pop() * self.slot_bytes for _ in range(k)]

    def release(self, offset: int) -> None:
        with self._cond:
            self._free.append(offset // self.slot_bytes)
            self._cond.notify_all()


class SharedBuffer:
    """Fresh memory that another process can map too, by its memfd
    (``Client.alloc_shared``). On shm the node writes reads into it directly.

    Not pooled: once another process maps it (a tensor handed to a
    DataLoader's main process), this client cannot know when it is done.

    Args:
        region: the memfd region (this process's mapping).
        release: called once by :meth:`close` (unregisters it from the node);
            ``None``: nothing to undo.

    Attributes:
        nbytes: size in bytes.
    """

    def __init__(self, region: Region, release: Callable[[Region], None] | None) -> None:
        self._region: Region | None = region
        self._release = release
        self.nbytes = region.size

    @property
    def fd(self) -> int:
        """The memfd (owned by this buffer: valid until :meth:`close`; map it or
        ``dup`` it, e.g. ``torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)``).

        Raises:
            ValueError: the buffer is closed.
        """
        if self._region is None:
            raise ValueError("the shared buffer is closed")
        return self._region.fd

    @property
    def view(self) -> memoryview:
        """A writable ``memoryview`` of :attr:`nbytes` bytes over this process's mapping.

        Raises:
            ValueError: the buffer is closed.
        """
        if self._region is None:
            raise ValueError("the shared buffer is closed")
        return self._region.view(0, self.nbytes)

    def close(self) -> None:
        """Stop the node writing into it, close the descriptor and unmap this
        process's mapping (it stays while views of it are alive). Mappings made
        from the descriptor (and the bytes in them) stay. Idempotent. Call it
        only once no read into the buffer is in flight."""
        region, self._region = self._region, None
        if region is None:
            return
        if self._release is not None:
            self._release(region)
        region.close()
