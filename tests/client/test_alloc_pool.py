"""alloc() pooling and alloc_shared() against a live node."""

from __future__ import annotations

import mmap
import threading

import numpy as np
import pytest

from gpufeed.client import Client
from gpufeed.errors import InvalidArgument, TransportError


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_buffer_freed_while_the_pool_lock_is_held_is_pooled_not_deadlocked(node, transport):
    """A finalizer runs inside whatever allocation triggers it, also on a thread
    that holds the pool's lock (a garbage collection inside alloc())."""
    with Client(node.shm_url if transport == "shm" else node.tcp_url) as c:
        buf = c.alloc(1 << 20)
        address = np.frombuffer(buf, np.uint8).ctypes.data
        holder = [buf]
        del buf

        def free_under_lock() -> None:
            with c._t.regions_lock:
                holder.clear()  # the last reference: the finalizer runs here, lock held

        t = threading.Thread(target=free_under_lock, daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), "freeing an alloc() buffer under the pool lock deadlocked"
        again = c.alloc(1 << 20)
        assert np.frombuffer(again, np.uint8).ctypes.data == address  # pooled, then reused


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_alloc_shared_is_read_into_and_mappable_by_its_descriptor(node, transport):
    with Client(node.shm_url if transport == "shm" else node.tcp_url) as c:
        try:
            c.create_bucket("alloc-shared")
        except Exception:  # noqa: BLE001 - made by the other parametrization
            pass
        data = np.random.default_rng(3).bytes(3 << 20)
        c.put("alloc-shared", "obj", data)
        buf = c.alloc_shared(len(data) + 10)
        before = len(c._regions)
        assert c.get_many_into([("alloc-shared", "obj", buf.view)]) == [len(data)]
        other = mmap.mmap(buf.fd, buf.nbytes)  # what another process does with the descriptor
        buf.close()
        buf.close()  # idempotent
        assert len(c._regions) == before - (transport == "shm")  # unregistered on shm
        assert other[:len(data)] == data
        with pytest.raises(ValueError, match="closed"):
            _ = buf.view
        for bad in (0, -1, 1.5):
            with pytest.raises(InvalidArgument):
                c.alloc_shared(bad)
    with pytest.raises(TransportError):
        c.alloc_shared(10)
