"""Populating shared memory: page faults taken up front, in parallel, without the GIL.

Why our own code: fresh shared memory (``memfd``) costs far more to fault in
than to fill: every 4 KiB page is allocated, zeroed and mapped, measured at
0.6 s per GiB on one core of the 2-core VM, against 0.13 s to ``preadv`` a
GiB of page-cached data into it. ``MAP_POPULATE`` and
``mmap.madvise(MADV_POPULATE_WRITE)`` do that work on one thread, and
CPython's ``mmap.madvise`` holds the GIL while it runs (measured: a Python
thread made no progress during a 0.59 s ``madvise``). :func:`populate` calls
``madvise(2)`` through ``ctypes`` (which releases the GIL) on slices of the
range from several threads at once: page faults on one mapping run in
parallel under the kernel's per-VMA locks (measured 0.37-0.41 s per GiB on
two threads against 0.59 s on one).

``MADV_POPULATE_WRITE`` (Linux 5.14) faults pages in writable without
changing their contents; on older kernels :func:`populate` returns ``False``
and the pages are faulted in on first use instead.

Mapping files without copies: :func:`map_file_private` maps one file;
:func:`map_extents` lays ranges of several files side by side in one reserved
address range (an object stored as chunk files reads as one buffer). Both go
through ``ctypes`` because Python's ``mmap`` module can neither place a
mapping at an address nor map without keeping a descriptor open.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MappedExtents", "address_of", "map_extents", "map_file_private", "populate",
           "populate_range", "prefetch_range"]

#: ``MADV_POPULATE_READ`` / ``MADV_POPULATE_WRITE`` from ``<sys/mman.h>`` (Linux 5.14+).
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
#: Slices below this size are not worth a thread.
_MIN_SLICE_BYTES = 64 << 20

_MAP_FAILED = ctypes.c_void_p(-1).value
_madvise: Any
_mmap: Any
_munmap: Any
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _madvise = _libc.madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise.restype = ctypes.c_int
    _mmap = _libc.mmap
    _mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
    _mmap.restype = ctypes.c_void_p
    _munmap = _libc.munmap
    _munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _munmap.restype = ctypes.c_int
except (OSError, AttributeError):  # not glibc/musl: fall back to faults on first use
    _madvise = _mmap = _munmap = None


def address_of(buf) -> tuple[int, int]:
    """``(address, nbytes)`` of a contiguous buffer (bytes-like, numpy, mmap slice).

    A writable, non-empty buffer is asked through ctypes (0.4 µs); others
    through numpy (4 µs): batch reads ask once per item."""
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        return address, (buf if type(buf) is memoryview else memoryview(buf)).nbytes
    except (TypeError, ValueError, BufferError):  # read-only, empty or not simple
        arr = np.frombuffer(buf, dtype=np.uint8)
        return arr.ctypes.data, arr.nbytes


def _populate_range(address: int, length: int, advice: int, failed: list[int]) -> None:
    if _madvise(address, length, advice) != 0:
        failed.append(ctypes.get_errno())


def populate(mm: mmap.mmap, threads: int | None = None, *, write: bool = True) -> bool:
    """Fault in every page of a writable shared mapping, contents unchanged.

    Args:
        mm: a ``MAP_SHARED`` mapping opened with ``PROT_WRITE``.
        threads: most threads to split the range over; default the CPU count
            (at most 8). Each gets at least 64 MiB.
        write: fault pages in for writing (``MADV_POPULATE_WRITE``: allocates
            fresh pages). ``False`` maps pages that already exist for reading
            (``MADV_POPULATE_READ``): half the cost for shared memory another
            process filled (measured 0.10 against 0.19 s per GiB), and for a
            shared writable mapping the pages are then writable too.

    Returns:
        ``True`` when every page is now mapped; ``False`` when the kernel or C
        library cannot do it (``EINVAL`` before Linux 5.14) or memory ran short
        (``ENOMEM``): the pages are then faulted in on first touch, as usual.
        Never raises for those; ``ValueError`` if ``mm`` is closed.
    """
    if len(mm) == 0:
        return False
    return populate_range(address_of(mm)[0], len(mm), threads, write=write)


def populate_range(address: int, length: int, threads: int | None = None, *,
                   write: bool = True) -> bool:
    """:func:`populate` for ``length`` bytes at ``address`` of this process (any
    writable mapping; the range is widened to whole pages)."""
    if _madvise is None or length <= 0:
        return False
    page = mmap.PAGESIZE
    start = address - address % page
    size = -(-(address + length - start) // page) * page
    want = threads or min(os.cpu_count() or 1, 8)
    n = max(1, min(want, size // _MIN_SLICE_BYTES))
    step = -(-size // n // page) * page
    advice = MADV_POPULATE_WRITE if write else MADV_POPULATE_READ
    failed: list[int] = []
    if n == 1:
        _populate_range(start, size, advice, failed)
        return not failed
    workers = [threading.Thread(target=_populate_range,
                                args=(start + off, min(step, size - off), advice, failed),
                                name="gpufeed-populate", daemon=True)
               for off in range(step, size, step)]
    for w in workers:
        w.start()
    _populate_range(start, min(step, size), advice, failed)
    for w in workers:
        w.join()
    return not failed


def map_file_private(fd: int, size: int) -> memoryview:
    """Map ``size`` bytes of file ``fd`` ``MAP_PRIVATE`` (copy-on-write),
    readable and writable, without keeping a descriptor.

    Why not ``mmap.mmap``: CPython's mmap object keeps a ``dup`` of the
    descriptor for as long as it lives (before Python 3.13's ``trackfd``), so
    every mapped object would hold an open file, and a process holding many
    loaded tensors would run into its descriptor limit.

    Returns:
        A writable byte ``memoryview``; the mapping is removed (``munmap``) when
        the last view of it (tensors made from it included) is gone.

    Raises:
        OSError: ``mmap(2)`` failed (``errno`` set); ``ValueError``: ``size`` <= 0.
    """
    if size <= 0:
        raise ValueError("size must be > 0")
    if _mmap is None:
        raise OSError("mmap(2) is not reachable through ctypes here")
    address = _mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if address in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
    owner = (ctypes.c_char * size).from_address(address)
    weakref.finalize(owner, _munmap, address, size)
    return memoryview(owner).cast("B")


def prefetch_range(address: int, length: int, threads: int | None = None) -> bool:
    """Map ``length`` bytes at ``address`` of a file mapping in for reading: start
    readahead of the whole range (``MADV_WILLNEED``: pages not cached yet are
    read from disk in large asynchronous requests), then map every page
    (``MADV_POPULATE_READ``, in parallel). Returns what :func:`populate_range`
    returns."""
    if length <= 0 or _madvise is None:
        return False
    page = mmap.PAGESIZE
    start = address - address % page
    _madvise(start, address + length - start, mmap.MADV_WILLNEED)  # advice only
    return populate_range(address, length, threads, write=False)


#: ``MAP_FIXED`` / ``MAP_NORESERVE`` from ``<sys/mman.h>`` (Linux; the same on x86-64 and arm64).
MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
PROT_NONE = getattr(mmap, "PROT_NONE", 0)


class MappedExtents:
    """Ranges of files mapped side by side as one contiguous buffer (:func:`map_extents`).

    :attr:`view` is a byte ``memoryview`` of all of it: ``extents[0]``'s bytes,
    then ``extents[1]``'s, and so on. The whole range is unmapped (one
    ``munmap`` of the reservation, never twice) when the last reference to the
    mapping goes: this object (after :meth:`close`, or once garbage) and every
    view, slice, numpy array or tensor made from :attr:`view`. :meth:`close`
    while such views live does not pull pages out from under them; the mapping
    then goes with the last of them.

    Attributes:
        address: where the mapping starts in this process (page-aligned; 0 when empty).
        nbytes: the mapping's length in bytes (the sum of the extents' lengths).
        writable: copy-on-write (``MAP_PRIVATE``) rather than read-only ``MAP_SHARED``.
    """

    __slots__ = ("address", "nbytes", "writable", "_view", "_finalizer")

    def __init__(self, address: int, nbytes: int, writable: bool, view: memoryview,
                 finalizer: weakref.finalize | None) -> None:
        self.address, self.nbytes, self.writable = address, nbytes, writable
        self._view: memoryview | None = view
        self._finalizer = finalizer

    @property
    def view(self) -> memoryview:
        """The mapping as a byte ``memoryview`` (read-only unless :attr:`writable`).

        Raises:
            ValueError: after :meth:`close`.
        """
        if self._view is None:
            raise ValueError("the mapping is closed")
        return self._view

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._view is None

    @property
    def unmapped(self) -> bool:
        """The address range has been given back to the kernel (``munmap``)."""
        return self._finalizer is None or not self._finalizer.alive

    def __len__(self) -> int:
        return self.nbytes

    def close(self) -> None:
        """Drop this object's hold on the mapping: unmapped now if no view made
        from :attr:`view` is alive, else when the last one goes. Idempotent."""
        view, self._view = self._view, None
        if view is not None:
            try:
                view.release()
            except BufferError:  # something exports from it (numpy): it holds the mapping
                pass

    def __enter__(self) -> "MappedExtents":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_extents(extents: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The non-empty extents, checked for page alignment and for files long enough.

    Raises:
        ValueError: an offset not a page multiple, a length other than the last
            one's not a page multiple, a negative value, or a file shorter than
            its extent (touching its missing pages would raise ``SIGBUS``).
    """
    page = mmap.PAGESIZE
    out = []
    for i, (fd, offset, length) in enumerate(extents):
        if offset < 0 or length < 0:
            raise ValueError(f"extent {i}: negative offset {offset} or length {length}")
        if offset % page:
            raise ValueError(f"extent {i}: file offset {offset} is not a multiple of the "
                             f"page size ({page} bytes)")
        if length % page and i != len(extents) - 1:
            raise ValueError(f"extent {i}: length {length} is not a multiple of the page size "
                             f"({page} bytes); only the last extent may end mid-page")
        if length == 0:
            continue
        size = os.fstat(fd).st_size
        if size < offset + length:
            raise ValueError(f"extent {i}: the file holds {size} bytes, fewer than the extent's "
                             f"end ({offset + length})")
        out.append((fd, offset, length))
    return out


def map_extents(extents: Sequence[tuple[int, int, int]], *,
                copy_on_write: bool = False) -> MappedExtents:
    """Map ``(fd, file_offset, length)`` ranges of files side by side as one
    contiguous buffer, without copying: the pages are the page cache's.

    The whole range is reserved first (an anonymous ``PROT_NONE`` mapping),
    then each extent is mapped over its place with ``MAP_FIXED``. The
    descriptors may be closed as soon as this returns. Zero-length extents are
    skipped. The files must not shrink while mapped (a page past a file's end
    raises ``SIGBUS`` when touched); gpufeed's data files are never truncated.

    Args:
        extents: ``(fd, file_offset, length)`` in bytes, in the order they are
            laid out. Every ``file_offset`` and every ``length`` but the last
            must be a multiple of the page size (``mmap.PAGESIZE``, 4 KiB).
        copy_on_write: map ``MAP_PRIVATE`` and writable (a write changes this
            process's copy of the page only, never the file; read-only
            descriptors suffice). Default: ``MAP_SHARED``, ``PROT_READ``, and a
            read-only view.

    Returns:
        A :class:`MappedExtents` of ``sum(length)`` bytes (empty when that is 0).

    Raises:
        ValueError: misaligned or negative extents, or a file shorter than its extent.
        OSError: ``mmap(2)`` failed (address space, ``vm.max_map_count``, a
            descriptor that is not a readable regular file); nothing stays mapped.
    """
    parts = _check_extents(extents)
    total = sum(e[2] for e in parts)
    if total == 0:
        return MappedExtents(0, 0, copy_on_write,
                             memoryview(bytearray(0) if copy_on_write else b""), None)
    if _mmap is None:
        raise OSError("mmap(2) is not reachable through ctypes here")
    page = mmap.PAGESIZE
    reserved = -(-total // page) * page
    base = _mmap(None, reserved, PROT_NONE,
                 mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if base in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"reserving {reserved} bytes of address space failed: "
                           f"{os.strerror(err)}")
    prot, flags = mmap.PROT_READ, mmap.MAP_SHARED | MAP_FIXED
    if copy_on_write:
        prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | MAP_FIXED
    pos = 0
    for i, (fd, offset, length) in enumerate(parts):
        got = _mmap(base + pos, length, prot, flags, fd, offset)
        if got != base + pos:
            err = ctypes.get_errno()
            _munmap(base, reserved)  # the reservation and every extent placed so far
            raise OSError(err, f"mapping extent {i} ({length} bytes at offset {offset}) "
                               f"failed: {os.strerror(err)}")
        pos += length
    owner = (ctypes.c_char * total).from_address(base)
    finalizer = weakref.finalize(owner, _munmap, base, reserved)
    view = memoryview(owner).cast("B")
    return MappedExtents(base, total, copy_on_write, view if copy_on_write else view.toreadonly(),
                         finalizer)
