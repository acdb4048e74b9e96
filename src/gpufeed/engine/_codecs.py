"""Chunk codecs, digests and content-defined cuts (minimal; replaced by the full module)."""

from __future__ import annotations

import struct

import blake3
import lz4.block
import xxhash
import zstandard

from ..errors import InternalError, InvalidArgument

__all__ = ["parse_compression", "compress_chunk", "decompress_chunk", "chunk_digest", "block_sums", "cdc_cuts"]


def parse_compression(text: str) -> tuple[str, int]:
    name, _, level = text.partition(":")
    if name not in ("off", "lz4", "zstd") or (level and name != "zstd"):
        raise InvalidArgument(f"compression must be off, lz4, zstd or zstd:LEVEL, not {text!r}")
    return name, int(level) if level else 3


def compress_chunk(view: memoryview, codec: str, level: int) -> bytes | None:
    if codec == "lz4":
        out = lz4.block.compress(view, store_size=False)
    else:
        out = zstandard.ZstdCompressor(level=level).compress(view)
    return out if len(out) < 0.97 * len(view) else None


def decompress_chunk(stored, codec: str, size: int, out: memoryview | None = None):
    try:
        data = lz4.block.decompress(stored, uncompressed_size=size) if codec == "lz4" else \
            zstandard.ZstdDecompressor().decompress(stored, max_output_size=size)
    except Exception as exc:
        raise InternalError(f"corrupt {codec} chunk: {exc}") from exc
    if len(data) != size:
        raise InternalError("corrupt chunk: wrong length")
    if out is None:
        return data
    out[:size] = data
    return size


def chunk_digest(view, algo: str) -> bytes:
    return blake3.blake3(view).digest() if algo == "blake3" else xxhash.xxh3_128_digest(view)


def block_sums(view, block: int = 64 << 10) -> bytes:
    mv = memoryview(view)
    n = len(mv)
    return struct.pack(f"<{(n + block - 1) // block}Q",
                       *[xxhash.xxh3_64_intdigest(mv[o:o + block]) for o in range(0, n, block)])


def cdc_cuts(view, min_size: int, avg_size: int, max_size: int) -> list[int]:
    from fastcdc import fastcdc_cy
    return [c.offset + c.length for c in fastcdc_cy.fastcdc_cy(view, min_size, avg_size, max_size)] \
        if hasattr(fastcdc_cy, "fastcdc_cy") else list(range(avg_size, len(view), avg_size)) + [len(view)]
