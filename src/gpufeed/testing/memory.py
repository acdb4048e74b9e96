"""What a process has mapped: for tests that check memory is resident up front."""

from __future__ import annotations

__all__ = ["resident_bytes"]


def resident_bytes(address: int) -> int:
    """Resident bytes (``Rss``, from ``/proc/self/smaps``) of this process's mapping
    that holds ``address``.

    Raises:
        AssertionError: no mapping holds ``address``.
    """
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")
