"""A batch read over shm whose reply lands while the SDK is still wiring up its
completion: the result must wait for the staged bytes to be copied out."""

from __future__ import annotations

import time

from gpufeed.client import Client
from gpufeed.client._transports import _shm_batch


def test_reply_landing_while_the_batch_registers_its_callbacks(node, monkeypatch):
    real_done, real_when_all = _shm_batch._batch_done, _shm_batch._when_all

    def slow_copy(*args, **kwargs):  # the reply's copy-out, slowed (big items, a busy machine)
        time.sleep(0.3)
        return real_done(*args, **kwargs)

    def late_when_all(parts, finish, release):  # the reply arrives before this registers
        time.sleep(0.1)
        return real_when_all(parts, finish, release)

    monkeypatch.setattr(_shm_batch, "_batch_done", slow_copy)
    monkeypatch.setattr(_shm_batch, "_when_all", late_when_all)
    with Client(node.shm_url, **node.credentials) as c:
        c.create_bucket("shm-batch-race")
        c.put("shm-batch-race", "k", b"x" * 5000)
        dest = bytearray(5000)  # outside alloc() memory: staged, copied out on the reply
        assert c.get_many_into([("shm-batch-race", "k", dest)]) == [5000]
        assert bytes(dest) == b"x" * 5000
        c.delete("shm-batch-race", "k")
