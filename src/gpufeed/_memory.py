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
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["address_of", "populate", "populate_range", "map_file_private", "prefetch_range"]

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
    """``(address, nbytes)`` of a contiguous buffer (bytes-like, numpy, mmap slice)."""
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
