"""Native helpers of the fast path, each with a Python fallback.

:data:`read_ranges` is the C loop of :mod:`gpufeed._native.ranges` (built at
install when a C compiler is there; see its source for the contract) bound
to the CRC32C of google-crc32c's C library, or ``None`` when either is
missing: callers then run the same reads in Python. Set
``GPUFEED_NATIVE=0`` to use the Python path anyway (for comparisons).
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from typing import Any

__all__ = ["read_ranges", "crc32c_extend_address"]


def crc32c_extend_address() -> int | None:
    """The address of ``crc32c_extend(uint32_t crc, const uint8_t *data, size_t n)``
    in google-crc32c's C library (the one its wheel bundles, else the system's),
    or ``None`` when it cannot be loaded."""
    try:
        import google_crc32c  # noqa: F401  (its wheel's folder holds the library)
    except ImportError:
        return None
    site = os.path.dirname(os.path.dirname(os.path.abspath(google_crc32c.__file__)))
    candidates = sorted(glob.glob(os.path.join(site, "google_crc32c.libs", "libcrc32c*.so*")))
    candidates += ["libcrc32c.so.1", "libcrc32c.so"]
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            fn = lib.crc32c_extend
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint32
        fn.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
        if fn(0, b"123456789", 9) != 0xE3069283:  # the CRC-32C check value
            continue
        return ctypes.cast(fn, ctypes.c_void_p).value
    return None


def _bind() -> Callable[..., int] | None:
    if os.environ.get("GPUFEED_NATIVE", "1") == "0":
        return None
    try:
        from . import ranges
    except ImportError:
        return None
    address = crc32c_extend_address()
    if not address:
        return None
    loop: Any = ranges.read_ranges

    def read_ranges(table, sums, offsets, lengths, dest, out, fd: int = -1, fd_offset: int = 0) -> int:
        """See :mod:`gpufeed._native.ranges`' source."""
        return loop(table, sums, offsets, lengths, dest, out, address, fd, fd_offset)

    return read_ranges


#: ``read_ranges(table, sums, offsets, lengths, dest, out, fd=-1, fd_offset=0) ->
#: served`` (see the C source), or ``None`` without the extension or the library.
read_ranges = _bind()
