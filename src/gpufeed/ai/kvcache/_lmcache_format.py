"""The object format of the LMCache plugin (spec: ``docs/kvcache-lmcache.md``, "Object format").

One object per LMCache key: a header, zero padding up to ``header_len`` (a
multiple of 64), then the MemoryObj's bytes (``MemoryObj.byte_array``). The
header repeats the LMCache key, so an object read under another key (a
hashed long key that collides, a copied object) is a miss, and carries an
XXH3-64 of the payload, so a flipped byte is a miss too.

Header (little-endian)::

    offset size  field
    0      4     magic        b"GFLC"
    4      2     version      1
    6      2     fmt          LMCache ``MemoryFormat`` value (1 = KV_2LTD, ...)
    8      2     groups       G, 1..8 (one per KV layer group)
    10     2     key_len      K, bytes of the UTF-8 key string
    12     4     header_len   payload offset: 32 + 20 G + K rounded up to 64
    16     8     payload_len  bytes of the payload
    24     8     checksum     XXH3-64 (seed 0) of the payload
    32     20 G  groups       per group: u16 dtype code, u16 ndim (1..4), u32 dims[4] (unused 0)
    32+20G K     key          ``CacheEngineKey.to_string()`` in UTF-8 (surrogates passed through)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch
import xxhash

from ...errors import FormatError
from .._dtypes import DTYPES

__all__ = ["ObjectHeader", "ObjectFormatError", "MAGIC", "VERSION", "DTYPE_CODES", "header_len",
           "payload_checksum"]

MAGIC = b"GFLC"
VERSION = 1
MAX_GROUPS = 8
_FIXED = struct.Struct("<4sHHHHIQQ")  # 32 bytes
_GROUP = struct.Struct("<HH4I")  # 20 bytes

#: Tensor dtypes a MemoryObj may hold -> code in the header: every code of
#: :data:`gpufeed.ai._dtypes.DTYPES` (the KV-chunk format's, plus int8).
DTYPE_CODES: dict[torch.dtype, int] = {getattr(torch, name): code for name, (code, _) in DTYPES.items()}
_CODE_TO_DTYPE = {code: dt for dt, code in DTYPE_CODES.items()}


class ObjectFormatError(FormatError):
    """Object bytes that are not a valid plugin object (a cache miss for the reader)."""


def header_len(groups: int, key_len: int) -> int:
    """Bytes before the payload: ``32 + 20 * groups + key_len`` rounded up to 64."""
    return (_FIXED.size + _GROUP.size * groups + key_len + 63) // 64 * 64


def payload_checksum(buf) -> int:
    """XXH3-64 (seed 0) of the payload bytes (any contiguous buffer)."""
    return xxhash.xxh3_64_intdigest(buf)


@dataclass(frozen=True, slots=True)
class ObjectHeader:
    """A parsed header.

    Attributes:
        fmt: LMCache ``MemoryFormat`` value (an int, so this module needs no LMCache).
        shapes: one shape per group, each 1 to 4 dims.
        dtypes: one torch dtype per group.
        key: the LMCache key string the object was written under.
        payload_len: payload bytes.
        checksum: XXH3-64 of the payload.
    """

    fmt: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    key: str
    payload_len: int
    checksum: int

    @property
    def key_bytes(self) -> bytes:
        return self.key.encode("utf-8", "surrogatepass")

    @property
    def header_len(self) -> int:
        return header_len(len(self.shapes), len(self.key_bytes))

    def pack_into(self, buf) -> int:
        """Write the header (padding included) at the start of ``buf``; returns ``header_len``.

        Raises:
            ObjectFormatError: no group or more than 8, a shape of more than 4 dims or
                with a dim over 2**32 - 1, a dtype without a code, a key over 65,535 bytes.
        """
        kb = self.key_bytes
        groups = len(self.shapes)
        if not 1 <= groups <= MAX_GROUPS or len(self.dtypes) != groups:
            raise ObjectFormatError(f"{groups} shapes / {len(self.dtypes)} dtypes: expected 1..8 of each")
        if len(kb) > 0xFFFF:
            raise ObjectFormatError(f"key of {len(kb)} bytes is over 65,535")
        hl = header_len(groups, len(kb))
        mv = memoryview(buf).cast("B")
        mv[:hl] = bytes(hl)
        _FIXED.pack_into(mv, 0, MAGIC, VERSION, self.fmt, groups, len(kb), hl, self.payload_len,
                         self.checksum)
        at = _FIXED.size
        for shape, dtype in zip(self.shapes, self.dtypes):
            if dtype not in DTYPE_CODES:
                raise ObjectFormatError(f"dtype {dtype} has no code in the object format")
            if not 1 <= len(shape) <= 4 or not all(0 <= d <= 0xFFFFFFFF for d in shape):
                raise ObjectFormatError(f"shape {tuple(shape)} is not 1-4 dims of u32")
            dims = list(shape) + [0] * (4 - len(shape))
            _GROUP.pack_into(mv, at, DTYPE_CODES[dtype], len(shape), *dims)
            at += _GROUP.size
        mv[at:at + len(kb)] = kb
        return hl

    def pack(self) -> bytes:
        out = bytearray(self.header_len)
        self.pack_into(out)
        return bytes(out)

    @classmethod
    def unpack(cls, buf) -> "ObjectHeader":
        """Parse a header from the first bytes of ``buf``.

        Raises:
            ObjectFormatError: short buffer, bad magic/version, a group count, dtype
                code, ndim or ``header_len`` that does not fit.
        """
        mv = memoryview(buf).cast("B")
        if len(mv) < _FIXED.size:
            raise ObjectFormatError(f"header of {len(mv)} bytes is too short")
        magic, version, fmt, groups, klen, hl, plen, checksum = _FIXED.unpack_from(mv)
        if magic != MAGIC or version != VERSION:
            raise ObjectFormatError(f"bad magic/version {bytes(magic)!r}/{version}")
        if not 1 <= groups <= MAX_GROUPS:
            raise ObjectFormatError(f"{groups} groups (expected 1..{MAX_GROUPS})")
        if hl != header_len(groups, klen) or len(mv) < hl:
            raise ObjectFormatError(f"header_len {hl} does not fit {groups} groups, a {klen}-byte "
                                    f"key and {len(mv)} bytes")
        shapes, dtypes = [], []
        at = _FIXED.size
        for _ in range(groups):
            code, ndim, *dims = _GROUP.unpack_from(mv, at)
            at += _GROUP.size
            if code not in _CODE_TO_DTYPE or not 1 <= ndim <= 4:
                raise ObjectFormatError(f"unknown dtype code {code} or ndim {ndim}")
            shapes.append(tuple(dims[:ndim]))
            dtypes.append(_CODE_TO_DTYPE[code])
        try:
            key = bytes(mv[at:at + klen]).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise ObjectFormatError(f"the key is not UTF-8: {exc}") from None
        return cls(fmt, tuple(shapes), tuple(dtypes), key, plen, checksum)
