"""Counters of the KV-cache tier: :class:`Counters` (thread-safe ``int``
counters with a consistent snapshot), :class:`KVMetrics` (those of one
:class:`~gpufeed.ai.kvcache.KVCacheStore`) and :class:`ConnectorMetrics`
(those of one LMCache connector, :mod:`gpufeed.ai.kvcache.lmcache`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

__all__ = ["Counters", "KVMetrics", "ConnectorMetrics"]


@dataclass
class Counters:
    """Base of a ``@dataclass`` of ``int`` counters: thread-safe :meth:`add` and a
    consistent :meth:`snapshot`. A dataclass itself (with no fields) so that
    :func:`dataclasses.fields` applies to ``self``."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class KVMetrics(Counters):
    """Counters of one store (monotonic; read with :meth:`snapshot`).

    ``node_errors`` is the warning metric: node calls that failed because the
    node was unreachable or broken (serving continued by recompute).
    """

    lookups: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    tier_hits: int = 0
    chunks_read: int = 0
    bytes_read: int = 0
    chunks_written: int = 0
    bytes_written: int = 0
    missing_chunks: int = 0
    corrupt_chunks: int = 0
    node_errors: int = 0
    put_errors: int = 0


@dataclass
class ConnectorMetrics(Counters):
    """Counters of one connector (thread-safe ``add``).

    ``node_errors`` is the warning metric: node calls that failed because the
    node was unreachable, timed out or answered with an unexpected error.
    """

    hits: int = 0            # MemoryObjs returned by get / batched_get
    misses: int = 0          # keys not on the node
    corrupt: int = 0         # objects that failed a check (short, bad header, other key, checksum)
    node_errors: int = 0
    alloc_failures: int = 0  # LMCache's CPU allocator had no room
    puts: int = 0
    put_errors: int = 0      # puts that failed or were dropped (node down, unsupported MemoryObj)
    bytes_read: int = 0      # payload bytes returned
    node_digests: int = 0    # payloads checked against the node's digest (shm) instead of hashed here
    bytes_written: int = 0   # object bytes written
