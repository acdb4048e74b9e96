"""The local CPU tier: an LRU of verified KV chunks, capacity in bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

__all__ = ["CpuTier"]


class CpuTier:
    """Thread-safe LRU of chunk payloads ``[2, layers, tokens, kv_heads, head_dim]``.

    Chunks live in pinned (page-locked) memory when CUDA is available, so a
    copy to a GPU can run asynchronously; otherwise in plain memory.

    Args:
        capacity_bytes: most payload bytes held; 0 disables the tier.
        pin: pin new buffers (default: ``torch.cuda.is_available()``).
    """

    def __init__(self, capacity_bytes: int, *, pin: bool | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> torch.Tensor | None:
        """The chunk (most recently used from now on), or None."""
        with self._lock:
            t = self._items.get(key)
            if t is not None:
                self._items.move_to_end(key)
            return t

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A new buffer for a chunk (pinned when the tier pins)."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin)

    def put(self, key: str, payload: torch.Tensor) -> bool:
        """Insert (or refresh) a chunk the tier now owns; evicts least recently used
        chunks to fit. Returns False (nothing stored) when it cannot fit at all."""
        n = payload.numel() * payload.element_size()
        if n > self.capacity_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old.numel() * old.element_size()
            while self._items and self.nbytes + n > self.capacity_bytes:
                _, t = self._items.popitem(last=False)
                self.nbytes -= t.numel() * t.element_size()
                self.evictions += 1
            self._items[key] = payload
            self.nbytes += n
        return True

    def discard(self, key: str) -> None:
        with self._lock:
            t = self._items.pop(key, None)
            if t is not None:
                self.nbytes -= t.numel() * t.element_size()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0
