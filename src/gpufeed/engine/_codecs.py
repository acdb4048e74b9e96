"""Chunk codecs, digests and content-defined cuts: pure functions, no engine state.

The chunk store calls these on chunks of up to a few MiB, from several threads
at once. Every function is thread-safe and spends its time inside native code
that releases the GIL (lz4, zstandard, blake3, xxhash), except :func:`cdc_cuts`:
fastcdc's Cython scan holds the GIL (~1 GB/s on one core here).

Formats (what the manifest must keep beside a stored chunk: codec and raw size):

* ``"off"``: the chunk's bytes as they are.
* ``"lz4"``: one LZ4 *block* (no frame, no stored size): the manifest already
  holds the raw size and the digests, so a frame's header, size and checksum
  would repeat them; the block decoder (``LZ4_decompress_safe``) is bounds-safe
  and decodes into one allocation of exactly the raw size.
* ``"zstd"``: one zstd frame with its content size in the header and no
  checksum (the chunk digest and block sums cover the decoded bytes).

Neither codec detects every corruption by itself (a damaged literal may decode
to wrong bytes of the right length): callers check the decoded bytes against
the chunk's digest or block sums. What these functions promise is narrower:
a stream that does not decode to exactly the expected size raises
:class:`~gpufeed.errors.ChunkCorrupt`, never a library exception.

Sources: LZ4 block format (https://github.com/lz4/lz4/blob/dev/doc/lz4_Block_format.md),
zstd frame format RFC 8878, FastCDC (Xia et al., USENIX ATC 2016), BLAKE3 spec,
xxHash XXH3 (https://github.com/Cyan4973/xxHash).
"""

from __future__ import annotations

import threading

import blake3
import lz4.block
import numpy as np
import xxhash
import zstandard

# The Cython build, imported by name: no silent fall-back to the pure-Python scan (~100 x slower).
from fastcdc.fastcdc_cy import fastcdc_cy as _fastcdc

from ..errors import ChunkCorrupt, InvalidArgument

__all__ = [
    "CODECS",
    "DIGESTS",
    "ZSTD_DEFAULT_LEVEL",
    "CDC_AVG_MIN",
    "CDC_AVG_MAX",
    "CDC_MAX_LIMIT",
    "parse_compression",
    "format_compression",
    "compress_chunk",
    "probe_pays",
    "PROBE_BYTES",
    "decompress_chunk",
    "chunk_digest",
    "digest_size",
    "cdc_cuts",
]

CODECS = ("off", "lz4", "zstd")
DIGESTS = {"blake3": 32, "xxh3": 16}  # algorithm -> digest bytes
ZSTD_DEFAULT_LEVEL = 3
ZSTD_LEVELS = range(1, 20)  # 1..19 (20..22 need "ultra" windows: not offered)
CDC_AVG_MIN = 64 << 10  # 64 KiB
CDC_AVG_MAX = 1 << 20  # 1 MiB
CDC_MAX_LIMIT = 8 << 20  # 8 MiB: no content-defined chunk is larger

_MIN_SAVING = 0.03  # a stored chunk must be at least 3 % smaller than its raw bytes
_PROBE_BYTES = 64 << 10  # 64 KiB sample compressed first; chunks under 2 x this skip the probe
_PROBE_ZSTD_LEVEL = 1
#: Bytes of the sample :func:`probe_pays` is given (from the middle of a chunk).
PROBE_BYTES = _PROBE_BYTES  # zstd's fastest level predicts whether any level pays
_BLAKE3_THREADS_FROM = 1 << 20  # 1 MiB: multi-threaded BLAKE3 measured ~1.7 x faster from here

_local = threading.local()  # per-thread zstd contexts (ZstdCompressor/Decompressor are not thread-safe)


def parse_compression(text: str) -> tuple[str, int]:
    """Parse a bucket's compression setting.

    Args:
        text: ``"off"``, ``"lz4"``, ``"zstd"`` or ``"zstd:LEVEL"`` with LEVEL 1..19
            (case and surrounding spaces ignored).

    Returns:
        ``(codec, level)``: ``("off", 0)``, ``("lz4", 0)`` or ``("zstd", level)``
        (level 3 when none is given).

    Raises:
        InvalidArgument: anything else.
    """
    norm = text.strip().lower() if isinstance(text, str) else ""
    if norm in ("off", "lz4"):
        return norm, 0
    if norm == "zstd":
        return "zstd", ZSTD_DEFAULT_LEVEL
    name, sep, level = norm.partition(":")
    if name == "zstd" and sep and level.isascii() and level.isdigit() and int(level) in ZSTD_LEVELS:
        return "zstd", int(level)
    raise InvalidArgument(f"compression {text!r}: expected off, lz4, zstd or zstd:LEVEL with LEVEL 1..19")


def format_compression(codec: str, level: int) -> str:
    """The setting text :func:`parse_compression` reads back (``"zstd:3"``, ``"lz4"``, ``"off"``).

    Raises:
        InvalidArgument: an unknown codec or a zstd level outside 1..19.
    """
    _check_codec(codec, level)
    return f"zstd:{level}" if codec == "zstd" else codec


def _check_codec(codec: str, level: int) -> None:
    if codec not in CODECS:
        raise InvalidArgument(f"codec {codec!r}: expected one of {', '.join(CODECS)}")
    if codec == "zstd" and level not in ZSTD_LEVELS:
        raise InvalidArgument(f"zstd level {level!r}: expected 1..19")


def _bytes(view: object) -> memoryview:
    """A flat byte view of any C-contiguous buffer (numpy arrays of any dtype included)."""
    mv = view if isinstance(view, memoryview) else memoryview(view)  # type: ignore[arg-type]
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


def _cctx(level: int) -> zstandard.ZstdCompressor:
    ctxs = getattr(_local, "cctx", None)
    if ctxs is None:
        ctxs = _local.cctx = {}
    ctx = ctxs.get(level)
    if ctx is None:
        ctx = ctxs[level] = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True)
    return ctx


def _dctx() -> zstandard.ZstdDecompressor:
    ctx = getattr(_local, "dctx", None)
    if ctx is None:
        ctx = _local.dctx = zstandard.ZstdDecompressor()
    return ctx


def _encode(data: memoryview, codec: str, level: int) -> bytes:
    if codec == "lz4":
        return lz4.block.compress(data, store_size=False)
    return _cctx(level).compress(data)


def compress_chunk(view: memoryview, codec: str, level: int = ZSTD_DEFAULT_LEVEL) -> bytes | None:
    """Compress one chunk, or say that compressing it does not pay.

    A 64 KiB sample from the middle of the chunk is compressed first (lz4, or
    zstd at level 1 for any zstd level: zstd's entropy stage shrinks data lz4
    cannot, such as real bf16 weights); when the sample does not shrink by 3 %
    the chunk is skipped without compressing the rest. Random bf16 weights or
    JPEGs cost about 10 us per 4 MiB chunk this way (see ``gpufeed bench codecs``).

    Args:
        view: the chunk's raw bytes (any C-contiguous buffer), up to a few MiB.
        codec: ``"off"``, ``"lz4"`` or ``"zstd"``.
        level: zstd level 1..19 (ignored for the others).

    Returns:
        The stored bytes (see the module docstring for the formats), or ``None``
        when the chunk should be stored raw: codec ``"off"``, an empty chunk,
        or a result not at least 3 % smaller than the chunk.

    Raises:
        InvalidArgument: an unknown codec or a zstd level outside 1..19.
    """
    _check_codec(codec, level)
    data = _bytes(view)
    n = len(data)
    if codec == "off" or n == 0:
        return None
    if n >= 2 * _PROBE_BYTES and not probe_pays(data[(n - _PROBE_BYTES) // 2:][:_PROBE_BYTES], codec, level):
        return None
    out = _encode(data, codec, level)
    return out if len(out) <= n * (1 - _MIN_SAVING) else None


def probe_pays(sample: memoryview, codec: str, level: int = ZSTD_DEFAULT_LEVEL) -> bool:
    """Whether a sample of a chunk (:data:`PROBE_BYTES` from its middle, as
    :func:`compress_chunk` takes it) shrinks by 3 % under ``codec`` (zstd at
    level 1 for any level): the cheap test that decides whether a chunk is
    compressed at all.

    Raises:
        InvalidArgument: an unknown codec or a zstd level outside 1..19.
    """
    _check_codec(codec, level)
    if codec == "off" or len(sample) == 0:
        return False
    probe = _encode(_bytes(sample), codec, min(level, _PROBE_ZSTD_LEVEL))
    return len(probe) <= len(sample) * (1 - _MIN_SAVING)


def decompress_chunk(stored: object, codec: str, size: int, out: memoryview | None = None) -> bytes | None:
    """Decode a stored chunk to exactly ``size`` bytes.

    Args:
        stored: the chunk as stored (any buffer).
        codec: the codec it was stored with: ``"off"``, ``"lz4"`` or ``"zstd"``.
        size: the raw chunk size in bytes, from the manifest.
        out: a writable buffer of exactly ``size`` bytes to decode into (zstd
            decodes in place; lz4 decodes then copies once); ``None`` returns new bytes.

    Returns:
        The raw bytes when ``out`` is ``None``; otherwise ``None`` (``out`` holds them).

    Raises:
        ChunkCorrupt: the stream does not decode, or decodes to other than ``size``
            bytes (a raw chunk of the wrong length included).
        InvalidArgument: an unknown codec.
        ValueError: ``out`` is not ``size`` bytes long, or ``size`` is negative.
    """
    _check_codec(codec, ZSTD_DEFAULT_LEVEL)
    src = _bytes(stored)
    dst = None if out is None else _bytes(out)
    if size < 0 or (dst is not None and len(dst) != size):
        raise ValueError(f"out holds {None if dst is None else len(dst)} bytes; the chunk is {size}")
    if codec == "off":
        if len(src) != size:
            raise ChunkCorrupt(f"raw chunk holds {len(src)} bytes, expected {size}")
        if dst is None:
            return bytes(src)
        dst[:] = src
        return None
    if codec == "zstd":
        return _zstd_decode(src, size, dst)
    try:
        raw = lz4.block.decompress(src, uncompressed_size=size)
    except lz4.block.LZ4BlockError as exc:
        raise ChunkCorrupt(f"lz4 chunk does not decode: {exc}") from exc
    if len(raw) != size:
        raise ChunkCorrupt(f"lz4 chunk decodes to {len(raw)} bytes, expected {size}")
    if dst is None:
        return raw
    np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(raw, np.uint8))
    return None


def _zstd_decode(src: memoryview, size: int, dst: memoryview | None) -> bytes | None:
    """One zstd frame whose header states ``size`` and whose body decodes to exactly that."""
    try:
        declared = zstandard.frame_content_size(src)
        if declared != size:  # checked before decoding: a damaged header cannot make us allocate its number
            raise ChunkCorrupt(f"zstd chunk declares {declared} bytes, expected {size}")
        if dst is None:
            raw = _dctx().decompress(src, max_output_size=size)
            if len(raw) != size:
                raise ChunkCorrupt(f"zstd chunk decodes to {len(raw)} bytes, expected {size}")
            return raw
        with _dctx().stream_reader(src, read_across_frames=False) as reader:
            got = reader.readinto(dst)
            extra = reader.read(1)
        if got != size or extra:
            raise ChunkCorrupt(f"zstd chunk decodes to {got + len(extra)}+ bytes, expected {size}")
        return None
    except zstandard.ZstdError as exc:
        raise ChunkCorrupt(f"zstd chunk does not decode: {exc}") from exc


def digest_size(algo: str) -> int:
    """Bytes in a chunk digest of ``algo`` (32 for ``"blake3"``, 16 for ``"xxh3"``).

    Raises:
        InvalidArgument: an unknown algorithm.
    """
    try:
        return DIGESTS[algo]
    except KeyError:
        raise InvalidArgument(f"digest {algo!r}: expected one of {', '.join(DIGESTS)}") from None


def chunk_digest(view: object, algo: str) -> bytes:
    """The content address of a chunk's raw bytes.

    Args:
        view: the raw chunk (any C-contiguous buffer).
        algo: ``"blake3"`` (BLAKE3-256; multi-threaded from 1 MiB) or ``"xxh3"``
            (XXH3-128, canonical big-endian bytes as ``xxhash.xxh3_128_digest``).

    Returns:
        32 bytes (blake3) or 16 bytes (xxh3).

    Raises:
        InvalidArgument: an unknown algorithm.
    """
    digest_size(algo)
    data = _bytes(view)
    if algo == "xxh3":
        return xxhash.xxh3_128_digest(data)
    threads = blake3.blake3.AUTO if len(data) >= _BLAKE3_THREADS_FROM else 1
    return blake3.blake3(data, max_threads=threads).digest()


def cdc_cuts(view: object, min_size: int | None = None, avg_size: int = 256 << 10,
             max_size: int | None = None) -> list[int]:
    """Content-defined chunk boundaries (FastCDC, Xia et al. 2016, fastcdc's Cython scan).

    Cuts depend on the bytes around them, not on offsets: bytes inserted near
    the start move only the first chunk or two, and later chunks keep their
    contents (and digests), which is what deduplicates shifted data.
    The scan holds the GIL (~1 GB/s on one core here).

    Args:
        view: the bytes to cut (any C-contiguous buffer).
        min_size: smallest chunk in bytes (default ``avg_size // 4``), within
            ``avg_size // 16 .. avg_size``.
        avg_size: target average chunk in bytes, 64 KiB..1 MiB (FastCDC rounds
            its mask to the nearest power of two).
        max_size: largest chunk in bytes (default ``avg_size * 4``), within
            ``avg_size .. min(avg_size * 16, 8 MiB)``.

    Returns:
        The end offset of each chunk, increasing; the last is ``len(view)``
        (an empty input gives ``[]``). Only the last chunk may be under ``min_size``.

    Raises:
        InvalidArgument: sizes outside those ranges.
    """
    if not isinstance(avg_size, int) or not CDC_AVG_MIN <= avg_size <= CDC_AVG_MAX:
        raise InvalidArgument(f"CDC average size {avg_size!r}: expected {CDC_AVG_MIN}..{CDC_AVG_MAX} bytes")
    lo = avg_size // 4 if min_size is None else min_size
    hi = avg_size * 4 if max_size is None else max_size
    if not isinstance(lo, int) or not avg_size // 16 <= lo <= avg_size:
        raise InvalidArgument(f"CDC minimum size {lo!r}: expected {avg_size // 16}..{avg_size} bytes")
    if not isinstance(hi, int) or not avg_size <= hi <= min(avg_size * 16, CDC_MAX_LIMIT):
        raise InvalidArgument(f"CDC maximum size {hi!r}: expected {avg_size}..{min(avg_size * 16, CDC_MAX_LIMIT)}")
    data = _bytes(view)
    if not len(data):
        return []
    return [c.offset + c.length for c in _fastcdc(data, lo, avg_size, hi)]
