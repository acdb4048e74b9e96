"""Block sums (engine/_blocksums.py): running CRC32C per block, checked as runs of any length."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from awscrt.checksums import crc32c

from gpufeed.engine._blocksums import BlockSummer, block_sums, check_blocks, run_expected, sums_array
from gpufeed.errors import InvalidArgument

MiB = 1 << 20
KiB = 1 << 10
SIZE = 4 * MiB - 1000  # the last block is 1000 bytes short


@pytest.fixture(scope="module")
def data() -> bytes:
    return np.random.default_rng(7).integers(0, 256, 4 * MiB, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("size", [0, 1, 4 * KiB - 1, 4 * KiB, 4 * KiB + 1, 64 * KiB + 5, 4 * MiB - 100])
@pytest.mark.parametrize("block", [4 * KiB, 64 * KiB])
def test_block_sums_are_the_running_crc32c_at_each_block_end(data, size, block):
    view = memoryview(data)[:size]
    sums = block_sums(view, block)
    ends = [min(i + block, size) for i in range(0, size, block)]
    assert len(sums) == 4 * len(ends)
    assert list(struct.unpack(f"<{len(ends)}I", sums)) == [crc32c(bytes(view[:e])) for e in ends]


@pytest.mark.parametrize("cuts", [[], [1], [4095, 4097], [100, 5000, 70000, 70001], list(range(3, 300000, 9999))])
def test_summer_fed_in_pieces_matches_one_pass(data, cuts):
    view = memoryview(data)[:300000]
    s = BlockSummer()
    edges = [0, *cuts, len(view)]
    for a, b in zip(edges, edges[1:]):
        s.feed(view[a:b])
    assert s.nbytes == len(view)
    assert s.finish() == block_sums(view)


@pytest.mark.parametrize("first,last", [(0, 1), (0, 5), (3, 4), (2, 9), (0, 73)])
def test_any_run_is_checked_from_two_sums(data, first, last):
    view = memoryview(data)[:300000]  # 74 blocks, the last short
    sums = sums_array(block_sums(view), 1)
    lo, hi = first * 4 * KiB, min(last * 4 * KiB, len(view))
    assert crc32c(bytes(view[lo:hi])) == run_expected(sums, first, last, hi - lo)


@pytest.mark.parametrize("block", [0, 1000, 65535, 64 * KiB + 1, -1])
def test_bad_block_size(block):
    with pytest.raises(InvalidArgument):
        block_sums(b"x" * 10, block)
    with pytest.raises(InvalidArgument):
        check_blocks(b"x" * 10, b"\x00" * 4, 0, block)


def _split(data: memoryview, at: list[int]) -> list[memoryview]:
    edges = [0, *at, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


@pytest.mark.parametrize("block", [4 * KiB, 64 * KiB])
@pytest.mark.parametrize("where", ["first", "middle", "last_short"])
@pytest.mark.parametrize("split", [[], [1000, SIZE - 5000], [64 * KiB, 128 * KiB], [1, 2, 3, 64 * KiB + 7]])
def test_check_blocks_finds_a_flipped_bit(data, block, where, split):
    buf = bytearray(data[:SIZE])
    sums = block_sums(buf, block)
    n = -(-SIZE // block)
    assert check_blocks(_split(memoryview(buf), split) if split else memoryview(buf), sums, 0, block) == -1
    pos = {"first": 5, "middle": 31 * 64 * KiB + 12345, "last_short": SIZE - 1}[where]
    buf[pos] ^= 0x10
    bad = pos // block
    view = memoryview(buf)
    assert check_blocks(_split(view, split) if split else view, sums, 0, block) == bad
    assert check_blocks(tuple(_split(view, split)), sums, 0, block) == bad
    run = view[bad * block:]  # a run that starts at the damaged block, or after it
    assert check_blocks([run[:100], run[100:]], sums, bad, block) == bad
    if bad + 1 < n:
        assert check_blocks(view[(bad + 1) * block:], sums, bad + 1, block) == -1
    if bad > 0:  # a run ending before it
        assert check_blocks(view[:bad * block], sums, 0, block) == -1


@pytest.mark.parametrize("block", [4 * KiB, 64 * KiB])
def test_check_blocks_refuses_runs_that_do_not_fit(data, block):
    view = memoryview(data)[:SIZE]
    sums = block_sums(view, block)
    n = -(-SIZE // block)
    with pytest.raises(ValueError):
        check_blocks(view[:block + 1], sums, 0, block)  # ends mid-block, not at the chunk's end
    with pytest.raises(ValueError):
        check_blocks(view[:2 * block], sums, n - 1, block)  # past the last block
    with pytest.raises(ValueError):
        check_blocks(view[:block], sums, -1, block)
    with pytest.raises(ValueError):
        check_blocks(view[:block], sums[:-1], 0, block)  # not whole sums
    assert check_blocks([], sums, 0, block) == -1
    assert check_blocks(view[(n - 1) * block:], sums, n - 1, block) == -1  # the short last block alone
    assert check_blocks(view[-1000:], sums, n - 1, block) == n - 1  # a short run is checked as the block it claims


def test_two_flipped_blocks_name_the_first(data):
    buf = bytearray(data[:64 * KiB])
    sums = block_sums(buf)
    buf[5 * 4096 + 1] ^= 1
    buf[9 * 4096] ^= 1
    assert check_blocks(memoryview(buf), sums, 0) == 5
    assert check_blocks(memoryview(buf)[6 * 4096:], sums, 6) == 9
