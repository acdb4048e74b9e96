"""Golden bytes of the checkpoint manifest and commit (``docs/checkpoint-format.md``)
and of the KV chunk header (``docs/kvcache-format.md``), written from the specs
and the msgpack spec, not from the encoders."""

from __future__ import annotations

import struct

import msgspec
import pytest

from gpufeed.ai.checkpoint import Chunk, Commit, CorruptCheckpoint, Entry, Manifest
from gpufeed.ai.checkpoint._format import decode
from gpufeed.ai.kvcache._format import ChunkFormatError, ChunkHeader


def mp(v) -> bytes:
    """The msgpack subset these formats use (small maps/arrays, str, uint, float64, bin)."""
    if isinstance(v, bool) or v is None:
        raise TypeError(v)
    if isinstance(v, int):
        assert v >= 0
        return bytes([v]) if v < 128 else b"\xce" + struct.pack(">I", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, bytes):
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xA0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, list):
        assert len(v) < 16
        return bytes([0x90 | len(v)]) + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        assert len(v) < 16
        return bytes([0x80 | len(v)]) + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


H1, H2 = "ab" * 32, "cd" * 32


def test_commit_golden_bytes():
    golden = mp({"format": "gpufeed-checkpoint", "version": 1, "step": 7, "manifest_size": 100,
                 "manifest_hash": H2, "committed_unix_s": 2.5})
    c = Commit("gpufeed-checkpoint", 1, 7, 100, H2, 2.5)
    assert msgspec.msgpack.encode(c) == golden
    assert decode(Commit, golden, "k") == c


def test_manifest_golden_bytes():
    entry = {"fqn": "w", "kind": "tensor", "nbytes": 8, "chunks": [[H1, 8]], "dtype": "float32",
             "shape": [2], "offsets": [0], "lengths": [2]}
    golden = mp({"format": "gpufeed-checkpoint", "version": 1, "step": 7, "hash": "blake3",
                 "chunk_bytes": 16 << 20, "created_unix_s": 1.5, "world_size": 1, "entries": [entry],
                 "bytes_total": 8, "bytes_written": 8, "nesting": {"w": ["model", "w"]},
                 "dcp_metadata": b""})
    man = Manifest("gpufeed-checkpoint", 1, 7, "blake3", 16 << 20, 1.5, 1,
                   [Entry("w", "tensor", 8, [Chunk(H1, 8)], dtype="float32", shape=[2], offsets=[0],
                          lengths=[2])], 8, 8, {"w": ["model", "w"]}, b"")
    assert msgspec.msgpack.encode(man) == golden
    assert decode(Manifest, golden, "k") == man


@pytest.mark.parametrize("bad", [b"", b"\x90", mp({"format": "x"}), b"\xc1"])
def test_hostile_manifests_are_corrupt_checkpoints(bad):
    with pytest.raises(CorruptCheckpoint):
        decode(Manifest, bad, "steps/000000000007/manifest")


def test_kv_chunk_header_golden_bytes():
    digest = bytes(range(16))
    fixed = struct.pack("<4sHHIIIIII16s", b"GFKV", 1, 3, 2, 256, 8, 128, 128, 0, digest)
    golden = fixed + struct.pack("<4Q", 1, 2, 3, 4)
    golden += bytes(128 - len(golden))  # zero padding to header_len (48 + 16 * 2 -> 128)
    h = ChunkHeader("bfloat16", 2, 256, 8, 128, digest, (1, 2, 3, 4))
    assert h.pack() == golden
    assert ChunkHeader.unpack(golden) == h


@pytest.mark.parametrize("mutate, match", [
    (lambda b: b"XXKV" + b[4:], "magic"),
    (lambda b: b[:6] + struct.pack("<H", 99) + b[8:], "dtype"),
    (lambda b: b[:24] + struct.pack("<I", 64) + b[28:], "header_len"),
    (lambda b: b[:40], "too short"),
])
def test_hostile_kv_headers(mutate, match):
    good = ChunkHeader("float32", 2, 16, 4, 64, bytes(16), (0, 0, 0, 0)).pack()
    with pytest.raises(ChunkFormatError, match=match):
        ChunkHeader.unpack(mutate(good))
