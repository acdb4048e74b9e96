"""Small reads (single gets and GETV batches of 4 KiB items) against damaged
data: the read that covers a damaged block fails alone, its neighbours are served, and the
connection stays usable; over shm (items read on the reader thread, one
``preadv`` each) and TCP."""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed.bench.integrity import _chunks  # the catalog's chunk list of one object
from gpufeed.client import Client
from gpufeed.errors import DamagedObject
from gpufeed.testing.node import flip_bits

BLOCK = 4096



@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_damaged_block_fails_only_its_item(fresh_node, transport):
    url = fresh_node.shm_url if transport == "shm" else fresh_node.tcp_url
    data = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    with Client(url, access_key=fresh_node.access_key, secret_key=fresh_node.secret_key) as c:
        c.create_bucket("batch")
        c.put("batch", "obj", data)
        ((_chunk, file, offset, _stored),) = _chunks(fresh_node.data_dir / "catalog.sqlite3", "batch", "obj")
        flip_bits(fresh_node.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + 40 * BLOCK + 123, 0x04)
        blocks = [39, 40, 41, 255]  # the damaged block, its neighbours, the last one
        buf = c.alloc(BLOCK * len(blocks))
        view = memoryview(buf)
        reqs = [("batch", "obj", view[i * BLOCK:(i + 1) * BLOCK], b * BLOCK) for i, b in enumerate(blocks)]
        errors: list = [None] * len(blocks)
        got = c.get_many_into(reqs, errors_out=errors)
        assert got[1] == -1 and isinstance(errors[1], DamagedObject)
        for i, b in enumerate(blocks):
            if i != 1:
                assert got[i] == BLOCK and errors[i] is None
                assert bytes(view[i * BLOCK:(i + 1) * BLOCK]) == data[b * BLOCK:(b + 1) * BLOCK]
        with pytest.raises(DamagedObject):
            c.get_many_into(reqs[1:2])
        with pytest.raises(DamagedObject):  # a single get of that block
            c.get_into("batch", "obj", view[:BLOCK], offset=40 * BLOCK)
        assert c.get_into("batch", "obj", view[:BLOCK], offset=41 * BLOCK) == BLOCK
        assert bytes(view[:BLOCK]) == data[41 * BLOCK:42 * BLOCK]
        # the connection still serves: a read that avoids the damaged block
        assert c.get_many_into(reqs[2:]) == [BLOCK, BLOCK]
        assert bytes(view[2 * BLOCK:3 * BLOCK]) == data[41 * BLOCK:42 * BLOCK]
