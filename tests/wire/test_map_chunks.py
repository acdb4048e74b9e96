"""Zero-copy map of objects stored in chunks: a dedup bucket's raw fixed-size
chunks (one data file each) map side by side; compressed or content-defined
ones are refused with InvalidRequest; damaged data is refused before any
descriptor is sent."""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest

from gpufeed.client import Client
from gpufeed.engine import Engine
from gpufeed.errors import DamagedObject, InvalidRequestError
from gpufeed.testing.node import start_node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    data = tmp_path_factory.mktemp("mapchunks") / "data"
    with Engine(data, fsync=False) as e:
        for name, policy in [("dd-fixed", {"dedup": True, "chunk_bytes": 256 << 10}),
                             ("dd-cdc", {"dedup": True, "chunking": "cdc", "chunk_bytes": 128 << 10}),
                             ("zst", {"compression": "zstd"})]:
            e.create_bucket(name)
            e.set_bucket_data(name, **policy)
    n = start_node(data)
    yield n
    assert n.stop() == 0, n.log_path.read_text()


def _data(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_dedup_chunks_map_side_by_side(node):
    data = _data((3 << 20) + 12345)
    with Client(node.shm_url) as c:
        c.put("dd-fixed", "k", data)
        c.put("dd-fixed", "k2", data[:1 << 20] + _data(1 << 20, 1))  # shares its first chunks
        view = c.map_object("dd-fixed", "k")
        assert len(view) == len(data) and bytes(view) == data
        assert bytes(c.map_object("dd-fixed", "k2"))[:1 << 20] == data[:1 << 20]


@pytest.mark.parametrize("bucket", ["dd-cdc", "zst"])
def test_unmappable_layouts_are_refused_and_still_read(node, bucket):
    data = _data(1_200_000, 3) if bucket == "dd-cdc" else b"abc" * 400_000  # cdc: cuts not on pages
    with Client(node.shm_url) as c:
        c.put(bucket, "k", data)
        with pytest.raises(InvalidRequestError):
            c.map_object(bucket, "k")
        assert bytes(c.get(bucket, "k")) == data  # the same connection reads it


def test_damaged_chunk_refuses_the_map(node):
    data = _data(1 << 20, 7)
    with Client(node.shm_url) as c:
        c.put("dd-fixed", "good", _data((3 << 20) + 12345))
        c.put("dd-fixed", "bad", data)
        db = sqlite3.connect(f"file:{node.data_dir / 'catalog.sqlite3'}?mode=ro", uri=True)
        file = db.execute("SELECT c.file FROM objects o JOIN manifest_chunks m ON m.blob_id=o.blob_id"
                          " JOIN chunks c ON c.chunk_id=m.chunk_id WHERE o.bucket='dd-fixed' AND o.key='bad'"
                          " ORDER BY m.seq DESC LIMIT 1").fetchone()[0]
        db.close()
        path = node.data_dir / "blobs" / file[:2] / file[2:4] / file
        with open(path, "r+b") as f:
            f.seek(1000)
            f.write(b"\xff\x00\xff")
        with pytest.raises(DamagedObject):
            c.map_object("dd-fixed", "bad")
        assert os.path.exists(path)
        assert bytes(c.get("dd-fixed", "good"))[:10] == _data((3 << 20) + 12345)[:10]


def test_a_chunk_is_checked_for_the_first_map_only(node):
    """The first map of a chunk since the node started checks it; later maps
    trust that check (documented: scrub finds damage that comes later)."""
    data = _data(1 << 20, 9)
    with Client(node.shm_url) as c:
        c.put("dd-fixed", "twice", data)
        assert bytes(c.map_object("dd-fixed", "twice")) == data
        assert bytes(c.map_object("dd-fixed", "twice")) == data
        assert bytes(c.get("dd-fixed", "twice")) == data  # reads always check
