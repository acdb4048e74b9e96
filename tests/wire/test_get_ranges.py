"""Many ranges of one object in one request (``Client.get_ranges_into``, op
GETR) against a real node: bit-identical bytes over shm (into ``alloc``
memory, and into a plain buffer) and TCP, in the node's native batch loop and
in its Python loop (``GPUFEED_NATIVE=0``); ranges that are not whole blocks,
that run past the end, or that start past it; compressed and deduplicated
buckets; a damaged block fails only its range; bad input is a typed error and
the connection stays usable."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gpufeed import _native
from gpufeed.bench.integrity import _chunks  # the catalog's chunk list of one object
from gpufeed.client import AsyncClient, Client
from gpufeed.engine import Engine
from gpufeed.errors import DamagedObject, InvalidArgument, InvalidRange, NoSuchKey
from gpufeed.testing.node import flip_bits, start_node

BLOCK = 4096
SIZE = (4 << 20) + 1000  # not a whole number of blocks: the last range is cut


def _data(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module", params=["native", "python"])
def node(request, tmp_path_factory):
    if request.param == "native" and _native.read_ranges is None:
        pytest.skip("the native batch loop is not built here")
    data = tmp_path_factory.mktemp("ranges") / "data"
    with Engine(data, fsync=False) as e:
        for name, policy in [("raw", {}), ("zst", {"compression": "zstd"}),
                             ("ddp", {"dedup": True, "chunk_bytes": 256 << 10})]:
            e.create_bucket(name)
            if policy:
                e.set_bucket_data(name, **policy)
    n = start_node(data, env={"GPUFEED_NATIVE": "0" if request.param == "python" else "1"})
    data_bytes = _data(SIZE)
    with Client(n.tcp_url, access_key=n.access_key, secret_key=n.secret_key) as c:
        for bucket in ("raw", "zst", "ddp"):
            c.put(bucket, "obj", data_bytes)
    yield n, data_bytes
    assert n.stop() == 0, n.log_path.read_text()


def _client(n, transport: str) -> Client:
    return Client(n.shm_url if transport == "shm" else n.tcp_url, access_key=n.access_key,
                  secret_key=n.secret_key)


def _expect(data: bytes, offsets, lengths) -> bytes:
    return b"".join(data[o:o + k].ljust(k, b"\0")[:k] for o, k in zip(offsets, lengths))


@pytest.mark.parametrize("transport,dest_kind", [("shm", "alloc"), ("shm", "bytearray"), ("tcp", "bytearray")])
@pytest.mark.parametrize("bucket", ["raw", "zst", "ddp"])
def test_ranges_land_packed_and_bit_identical(node, transport, dest_kind, bucket):
    n, data = node
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, SIZE // BLOCK, 300) * BLOCK
    odd = rng.integers(0, SIZE - 70_000, 40)  # not block-aligned, odd lengths
    across = [(4 << 20) - 3000, 123_457]  # over the 4 MiB chunks' edge; over ddp's 256 KiB chunks
    offsets = np.concatenate([blocks, odd, across, [SIZE - 1000, SIZE - 5]])
    lengths = [BLOCK] * 300 + rng.integers(1, 70_000, 40).tolist() + [6000, 700_001] + [1000, 4096]
    with _client(n, transport) as c:
        total = sum(lengths)
        dest = c.alloc(total) if dest_kind == "alloc" else bytearray(total)
        memoryview(dest)[:] = b"\xee" * total
        got = c.get_ranges_into(bucket, "obj", dest, offsets, lengths)
        want = [min(k, SIZE - o) for o, k in zip(offsets.tolist(), lengths)]
        assert got.dtype == np.int64 and got.tolist() == want  # the last range is cut at the end
        pos = 0
        for o, k, w in zip(offsets.tolist(), lengths, want):
            assert bytes(memoryview(dest)[pos:pos + w]) == data[o:o + w]
            pos += k
        # one length for all ranges
        same = c.get_ranges_into(bucket, "obj", dest, blocks[:8], BLOCK)
        assert same.tolist() == [BLOCK] * 8
        assert bytes(memoryview(dest)[:8 * BLOCK]) == _expect(data, blocks[:8].tolist(), [BLOCK] * 8)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_range_past_the_end_fails_alone(node, transport):
    n, data = node
    with _client(n, transport) as c:
        dest = bytearray(3 * BLOCK)
        errors: list = []
        got = c.get_ranges_into("raw", "obj", dest, [0, SIZE, BLOCK], BLOCK, errors_out=errors)
        assert got.tolist() == [BLOCK, -1, BLOCK]
        assert errors[0] is None and errors[2] is None and isinstance(errors[1], InvalidRange)
        assert "range 1" in str(errors[1])
        assert bytes(dest[2 * BLOCK:]) == data[BLOCK:2 * BLOCK]
        with pytest.raises(InvalidRange, match="range 1"):
            c.get_ranges_into("raw", "obj", dest, [0, SIZE + BLOCK], BLOCK)
        assert c.get_ranges_into("raw", "obj", dest, [], BLOCK).tolist() == []


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_bad_arguments_are_typed_errors_before_anything_is_sent(node, transport):
    n, data = node
    with _client(n, transport) as c:
        dest = bytearray(4 * BLOCK)
        with pytest.raises(InvalidArgument, match="lengths"):
            c.get_ranges_into("raw", "obj", dest, [0, BLOCK], [BLOCK])
        with pytest.raises(InvalidArgument):
            c.get_ranges_into("raw", "obj", dest, [-1], BLOCK)
        with pytest.raises(InvalidArgument, match="exceeds"):
            c.get_ranges_into("raw", "obj", dest, [0] * 5, BLOCK)  # dest too small
        with pytest.raises(InvalidArgument):
            c.get_ranges_into("raw", "obj", bytes(BLOCK), [0], BLOCK)  # read-only
        with pytest.raises(InvalidArgument, match="at most"):
            c.get_ranges_into("raw", "obj", dest, np.zeros(70_000, dtype=np.int64), 0)
        for offsets, lengths in [(np.linspace(0, 17, 4), 1), ([1.7], 1), ([0], [2.9]), (["1"], 1), ([0], True),
                                 ([[0, 1]], 1), ([None], 1)]:
            with pytest.raises(InvalidArgument, match="integers"):  # never truncated or cast silently
                c.get_ranges_into("raw", "obj", dest, offsets, lengths)
        with pytest.raises(InvalidArgument, match="errors_out"):
            c.get_ranges_into("raw", "obj", dest, [0], BLOCK, errors_out=())
        for offsets in ([1 << 64, 0], [-1, 1 << 63], [0, -(1 << 70)]):  # Python ints past uint64 or int64
            with pytest.raises(InvalidArgument, match="outside 0-"):
                c.get_ranges_into("raw", "obj", dest, offsets, BLOCK)
        errs: list = []  # ints past int64 with smaller ones are no floats: each range stands for itself
        assert c.get_ranges_into("raw", "obj", dest, [1 << 63, 0], BLOCK, errors_out=errs).tolist() == [-1, BLOCK]
        assert isinstance(errs[0], InvalidRange) and errs[1] is None and bytes(dest[BLOCK:2 * BLOCK]) == data[:BLOCK]
        with pytest.raises(NoSuchKey):
            c.get_ranges_into("raw", "missing", dest, [0], BLOCK)
        assert c.get_ranges_into("raw", "obj", dest, [0], BLOCK).tolist() == [BLOCK]  # still usable


def test_a_large_tcp_batch_is_sent_from_the_files(node):
    n, data = node
    offsets = list(range(0, SIZE - (1 << 20), 1 << 20))  # 4 ranges of 1 MiB + 1 past the buffer limit
    with _client(n, "tcp") as c:
        dest = bytearray(len(offsets) * (1 << 20) + (1 << 20))
        got = c.get_ranges_into("raw", "obj", dest, offsets + [0], 1 << 20)
        assert got.tolist() == [1 << 20] * (len(offsets) + 1)
        assert bytes(dest) == _expect(data, offsets + [0], [1 << 20] * (len(offsets) + 1))



@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_damaged_block_fails_only_its_range(tmp_path, native, transport):
    if native == "1" and _native.read_ranges is None:
        pytest.skip("the native batch loop is not built here")
    n = start_node(tmp_path / "data", env={"GPUFEED_NATIVE": native})
    try:
        data = _data(1 << 20, 5)
        with _client(n, transport) as c:
            c.create_bucket("hurt")
            c.put("hurt", "obj", data)
            ((_chunk, file, offset, _stored),) = _chunks(n.data_dir / "catalog.sqlite3", "hurt", "obj")
            flip_bits(n.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + 40 * BLOCK + 77, 0x10)
            blocks = [39, 40, 41, 255]
            dest = c.alloc(len(blocks) * BLOCK) if transport == "shm" else bytearray(len(blocks) * BLOCK)
            errors: list = []
            got = c.get_ranges_into("hurt", "obj", dest, [b * BLOCK for b in blocks], BLOCK, errors_out=errors)
            assert got.tolist() == [BLOCK, -1, BLOCK, BLOCK]
            assert isinstance(errors[1], DamagedObject) and "hurt/obj" in str(errors[1])
            for i in (0, 2, 3):
                assert bytes(memoryview(dest)[i * BLOCK:(i + 1) * BLOCK]) == \
                    data[blocks[i] * BLOCK:(blocks[i] + 1) * BLOCK]
            with pytest.raises(DamagedObject):
                c.get_ranges_into("hurt", "obj", dest, [40 * BLOCK], BLOCK)
            assert c.get_ranges_into("hurt", "obj", dest, [41 * BLOCK], BLOCK).tolist() == [BLOCK]
    finally:
        assert n.stop() == 0, n.log_path.read_text()


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_damaged_block_fails_the_ranges_in_it_and_not_their_neighbours_in_other_chunks(tmp_path, native):
    if native == "1" and _native.read_ranges is None:
        pytest.skip("the native batch loop is not built here")
    with Engine(tmp_path / "data", fsync=False) as e:
        e.create_bucket("hurt")
        e.set_bucket_data("hurt", dedup=True, chunk_bytes=256 << 10)  # 4 chunks of 1 MiB
    n = start_node(tmp_path / "data", env={"GPUFEED_NATIVE": native})
    try:
        data = _data(1 << 20, 6)
        with _client(n, "shm") as c:
            c.put("hurt", "obj", data)
            chunks = _chunks(n.data_dir / "catalog.sqlite3", "hurt", "obj")
            assert len(chunks) == 4
            (_chunk, file, offset, _stored) = chunks[2]
            flip_bits(n.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + 40 * BLOCK + 77, 0x10)
            bad = (512 << 10) + 40 * BLOCK  # the damaged block's object offset
            offsets = [(512 << 10) - 1000, bad + 70, bad + 4000, (768 << 10) + 5, bad - 9000]
            lengths = [3000, 100, 4096, 9000, 8000]  # over the edge of chunks 1 and 2; in the block; from
            # it into the next; in chunk 3; ending before it
            dest = c.alloc(sum(lengths))
            errors: list = []
            got = c.get_ranges_into("hurt", "obj", dest, offsets, lengths, errors_out=errors)
            assert got.tolist() == [3000, -1, -1, 9000, 8000]
            assert isinstance(errors[1], DamagedObject) and isinstance(errors[2], DamagedObject)
            pos = 0
            for o, k, g in zip(offsets, lengths, got.tolist()):
                if g > 0:
                    assert bytes(memoryview(dest)[pos:pos + k]) == data[o:o + k]
                pos += k
    finally:
        assert n.stop() == 0, n.log_path.read_text()


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_large_tcp_batch_with_a_damaged_block_sends_every_other_range_from_the_file(tmp_path, native):
    if native == "1" and _native.read_ranges is None:
        pytest.skip("the native batch loop is not built here")
    n = start_node(tmp_path / "data", env={"GPUFEED_NATIVE": native})
    try:
        data = _data(3 << 20, 7)
        with _client(n, "tcp") as c:
            c.create_bucket("hurt")
            c.put("hurt", "obj", data)
            ((_chunk, file, offset, _stored),) = _chunks(n.data_dir / "catalog.sqlite3", "hurt", "obj")
            bad = (1 << 20) + 40 * BLOCK + 77
            flip_bits(n.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + bad, 0x10)
            rng = np.random.default_rng(8)
            offsets = rng.integers(0, (3 << 20) - 30_000, 300).tolist() + [bad - 5, bad - 5000]
            lengths = [28_672] * 300 + [10, 4000]  # over 4 MiB in all: sent from the file; the next to last
            # range lies in the damaged block, the last one ends in the block before it
            dest = bytearray(sum(lengths))
            errors: list = []
            got = c.get_ranges_into("hurt", "obj", dest, offsets, lengths, errors_out=errors).tolist()
            block = bad // BLOCK
            pos = 0
            for i, (o, k) in enumerate(zip(offsets, lengths)):
                if o // BLOCK <= block <= (o + k - 1) // BLOCK:
                    assert got[i] == -1 and isinstance(errors[i], DamagedObject), (i, o, k)
                else:
                    assert got[i] == k and bytes(dest[pos:pos + k]) == data[o:o + k], (i, o, k)
                pos += k
            assert got[-2] == -1
    finally:
        assert n.stop() == 0, n.log_path.read_text()


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_missing_first_chunk_fails_only_its_ranges(tmp_path, native):
    if native == "1" and _native.read_ranges is None:
        pytest.skip("the native batch loop is not built here")
    with Engine(tmp_path / "data", fsync=False) as e:
        e.create_bucket("ddp")
        e.set_bucket_data("ddp", dedup=True, chunk_bytes=64 << 10)  # 4 chunks, each in a data file of its own
    n = start_node(tmp_path / "data", env={"GPUFEED_NATIVE": native})
    try:
        data = _data(4 << 16, 9)
        with _client(n, "shm") as c:
            c.put("ddp", "obj", data)
            (_chunk, file, _offset, _stored) = _chunks(n.data_dir / "catalog.sqlite3", "ddp", "obj")[0]
            (n.data_dir / "blobs" / file[:2] / file[2:4] / file).unlink()
            offsets = [i * (64 << 10) + 10 for i in range(4)]
            dest = bytearray(4 * 100)
            errors: list = []
            got = c.get_ranges_into("ddp", "obj", dest, offsets, 100, errors_out=errors)
            assert got.tolist() == [-1, 100, 100, 100] and isinstance(errors[0], DamagedObject)
            assert all(bytes(dest[i * 100:(i + 1) * 100]) == data[o:o + 100] for i, o in enumerate(offsets) if i)
            tail = bytearray(100)
            assert c.get_into("ddp", "obj", tail, offset=offsets[3]) == 100 and bytes(tail) == data[offsets[3]:][:100]
    finally:
        assert n.stop() == 0, n.log_path.read_text()


def test_20000_failed_ranges_of_a_long_key_fit_one_reply(tmp_path):
    n = start_node(tmp_path / "data")
    key = "k" * 1000  # each range's error names the object: 20,000 of them were over 16 MiB
    try:
        data = _data(1 << 20, 10)
        with _client(n, "tcp") as c:
            c.create_bucket("hurt")
            c.put("hurt", key, data)
            ((_chunk, file, offset, _stored),) = _chunks(n.data_dir / "catalog.sqlite3", "hurt", key)
            flip_bits(n.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + 5 * BLOCK + 1, 0x10)
            dest = bytearray(20_000)
            errors: list = []
            got = c.get_ranges_into("hurt", key, dest, np.full(20_000, 5 * BLOCK), 1, errors_out=errors)
            assert (got == -1).all() and all(isinstance(e, DamagedObject) for e in errors)
            assert f"hurt/{key}" in str(errors[-1]) and "as range" not in str(errors[-1])  # whole, as for range 0
            assert c.get_ranges_into("hurt", key, dest, [0], BLOCK).tolist() == [BLOCK]  # the connection stays
    finally:
        assert n.stop() == 0, n.log_path.read_text()


def test_ranges_of_a_compressed_chunk_are_read_from_one_decompression_and_fail_together(tmp_path):
    with Engine(tmp_path / "data", fsync=False) as e:
        e.create_bucket("zst")
        e.set_bucket_data("zst", compression="zstd", chunk_bytes=256 << 10)
    n = start_node(tmp_path / "data")
    try:
        data = bytes(np.arange(1 << 20, dtype=np.uint32) % 251 // 3 % 256)[: 1 << 20]  # compressible
        with _client(n, "tcp") as c:
            c.put("zst", "obj", data)
            chunks = _chunks(n.data_dir / "catalog.sqlite3", "zst", "obj")
            assert len(chunks) == 4
            offsets = [10, 70_000, 200_000, (256 << 10) + 5, (256 << 10) + 99_999, (3 << 18) + 1]
            dest = bytearray(6 * 5000)
            got = c.get_ranges_into("zst", "obj", dest, offsets, 5000)
            assert got.tolist() == [5000] * 6 and bytes(dest) == _expect(data, offsets, [5000] * 6)
            (_chunk, file, offset, stored) = chunks[1]
            flip_bits(n.data_dir / "blobs" / file[:2] / file[2:4] / file, offset + stored // 2, 0x10)
            errors: list = []
            got = c.get_ranges_into("zst", "obj", dest, offsets, 5000, errors_out=errors)
            assert got.tolist() == [5000, 5000, 5000, -1, -1, 5000]
            assert isinstance(errors[3], DamagedObject) and isinstance(errors[4], DamagedObject)
            assert bytes(dest[:3 * 5000]) == _expect(data, offsets[:3], [5000] * 3)
            assert bytes(dest[5 * 5000:]) == data[offsets[5]:offsets[5] + 5000]
    finally:
        assert n.stop() == 0, n.log_path.read_text()


def test_the_async_form(node):
    n, data = node

    async def main():
        async with await AsyncClient.connect(n.tcp_url, access_key=n.access_key, secret_key=n.secret_key) as ac:
            dest = bytearray(2 * BLOCK)
            got = await ac.get_ranges_into("raw", "obj", dest, [BLOCK, 7 * BLOCK], BLOCK)
            return got.tolist(), bytes(dest)

    got, dest = asyncio.run(main())
    assert got == [BLOCK, BLOCK] and dest == data[BLOCK:2 * BLOCK] + data[7 * BLOCK:8 * BLOCK]
