"""The KV-chunk object format (spec: ``docs/kvcache-format.md``).

One object per chunk: a fixed header, one XXH3-64 checksum per ``[kv][layer]``
block, zero padding up to ``header_len`` (a multiple of 64), then the payload
``[2, layers, tokens, kv_heads, head_dim]`` in C order. Each ``[kv][layer]``
block is contiguous in the object *and* in a caller's ``[2, L, T, H, D]``
tensor, so a reader fetches blocks straight into place and checks each one on
its own (a layer-wise reader verifies layer ``i`` before it is used).

Header (little-endian)::

    offset size field
    0      4    magic        b"GFKV"
    4      2    version      1
    6      2    dtype        code from DTYPE_CODES
    8      4    layers
    12     4    tokens
    16     4    kv_heads
    20     4    head_dim
    24     4    header_len   payload offset; multiple of 64
    28     4    flags        0
    32     16   digest       the chunk's chained key digest
    48     8*2L checksums    XXH3-64 of block [kv][layer], kv-major
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from ...errors import FormatError
from ._keys import DTYPE_CODES, KVLayout

__all__ = ["ChunkHeader", "ChunkFormatError", "MAGIC", "VERSION", "header_len", "block_checksum"]

MAGIC = b"GFKV"
VERSION = 1
_FIXED = struct.Struct("<4sHHIIIIII16s")  # 48 bytes
_CODE_TO_DTYPE = {code: name for name, (code, _) in DTYPE_CODES.items()}


class ChunkFormatError(FormatError):
    """Chunk bytes that do not match the expected header (treated as a cache miss)."""


def header_len(num_layers: int) -> int:
    """Bytes before the payload for ``num_layers`` layers: ``48 + 16 * L`` rounded up to 64."""
    return (_FIXED.size + 16 * num_layers + 63) // 64 * 64


def block_checksum(buf) -> int:
    """XXH3-64 (seed 0) of one block's bytes."""
    return xxhash.xxh3_64_intdigest(buf)


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """A parsed chunk header. ``checksums[kv * layers + layer]`` is block ``[kv][layer]``'s XXH3-64."""

    dtype: str
    layers: int
    tokens: int
    kv_heads: int
    head_dim: int
    digest: bytes
    checksums: tuple[int, ...]

    @property
    def header_len(self) -> int:
        return header_len(self.layers)

    def block_bytes(self, itemsize: int) -> int:
        """Bytes of one ``[kv][layer]`` block: ``tokens * kv_heads * head_dim * itemsize``."""
        return self.tokens * self.kv_heads * self.head_dim * itemsize

    def pack(self) -> bytes:
        """The ``header_len`` bytes that start the object."""
        code = DTYPE_CODES[self.dtype][0]
        out = bytearray(self.header_len)
        _FIXED.pack_into(out, 0, MAGIC, VERSION, code, self.layers, self.tokens, self.kv_heads,
                         self.head_dim, self.header_len, 0, self.digest)
        struct.pack_into(f"<{len(self.checksums)}Q", out, _FIXED.size, *self.checksums)
        return bytes(out)

    @classmethod
    def unpack(cls, buf) -> "ChunkHeader":
        """Parse a header.

        Raises:
            ChunkFormatError: short buffer, bad magic/version, unknown dtype, bad header_len.
        """
        mv = memoryview(buf).cast("B")
        if len(mv) < _FIXED.size:
            raise ChunkFormatError(f"header of {len(mv)} bytes is too short")
        magic, version, code, layers, tokens, heads, hdim, hlen, _flags, digest = _FIXED.unpack_from(mv)
        if magic != MAGIC or version != VERSION:
            raise ChunkFormatError(f"bad magic/version {magic!r}/{version}")
        if code not in _CODE_TO_DTYPE:
            raise ChunkFormatError(f"unknown dtype code {code}")
        if layers == 0 or hlen != header_len(layers) or len(mv) < hlen:
            raise ChunkFormatError(f"header_len {hlen} does not fit {layers} layers / {len(mv)} bytes")
        sums = struct.unpack_from(f"<{2 * layers}Q", mv, _FIXED.size)
        return cls(_CODE_TO_DTYPE[code], layers, tokens, heads, hdim, bytes(digest), sums)

    def check(self, layout: KVLayout, digest: bytes, tokens: int) -> None:
        """Raise :class:`ChunkFormatError` unless this header is chunk ``digest`` of ``layout``
        holding ``tokens`` tokens."""
        want = (layout.dtype, layout.num_layers, tokens, layout.num_kv_heads, layout.head_dim, digest)
        have = (self.dtype, self.layers, self.tokens, self.kv_heads, self.head_dim, self.digest)
        if want != have:
            raise ChunkFormatError(f"chunk header {have} does not match the expected {want}")
