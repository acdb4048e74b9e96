"""The LMCache plugin's object header: golden bytes and hostile inputs (no LMCache needed)."""

from __future__ import annotations

import struct

import pytest
import torch

from gpufeed.ai.kvcache._lmcache_format import (
    ObjectFormatError,
    ObjectHeader,
    header_len,
    payload_checksum,
)

KEY = "org/model@1@0@1234@bfloat16"


def make(**kw) -> ObjectHeader:
    args = dict(fmt=1, shapes=((2, 4, 16, 16),), dtypes=(torch.bfloat16,), key=KEY,
                payload_len=4096, checksum=payload_checksum(bytes(4096)))
    args.update(kw)
    return ObjectHeader(**args)


def test_golden_bytes():
    raw = make().pack()
    assert len(raw) == header_len(1, len(KEY)) == 128  # 32 + 20 + 27 = 79 -> 128
    assert raw.hex() == (
        "47464c43" "0100" "0100" "0100" "1b00" "80000000" "0010000000000000"
        + struct.pack("<Q", payload_checksum(bytes(4096))).hex()
        + "0300" "0400" "02000000" "04000000" "10000000" "10000000"
        + KEY.encode().hex() + "00" * (128 - 79))
    assert ObjectHeader.unpack(raw) == make()


def test_roundtrip_groups_dims_and_odd_keys():
    h = make(shapes=((5,), (2, 3)), dtypes=(torch.float32, torch.int8), key="模型 \udcff@x",
             fmt=6)
    assert ObjectHeader.unpack(h.pack() + b"payload") == h


@pytest.mark.parametrize("edit", [
    lambda b: b[:31],                                  # shorter than the fixed part
    lambda b: b"XXXX" + b[4:],                         # magic
    lambda b: b[:4] + b"\x02\x00" + b[6:],             # version
    lambda b: b[:8] + b"\x00\x00" + b[10:],            # 0 groups
    lambda b: b[:8] + b"\x09\x00" + b[10:],            # 9 groups
    lambda b: b[:12] + b"\x40\x00\x00\x00" + b[16:],   # header_len that does not fit
    lambda b: b[:32] + b"\x63\x00" + b[34:],           # unknown dtype code
    lambda b: b[:34] + b"\x05\x00" + b[36:],           # 5 dims
    lambda b: b[:34] + b"\x00\x00" + b[36:],           # 0 dims
    lambda b: b[:52] + b"\xff\xfe" + b[54:],           # key not UTF-8
    lambda b: b[:100],                                 # cut inside the header
], ids=["short", "magic", "version", "groups0", "groups9", "header_len", "dtype", "ndim5",
        "ndim0", "key-utf8", "cut"])
def test_hostile_headers_are_format_errors(edit):
    with pytest.raises(ObjectFormatError):
        ObjectHeader.unpack(edit(make().pack()))


@pytest.mark.parametrize("kw", [dict(shapes=(), dtypes=()), dict(shapes=((1, 2, 3, 4, 5),)),
                                dict(dtypes=(torch.complex64,)), dict(shapes=((1 << 32,),))])
def test_unencodable_memory_objs_are_refused(kw):
    with pytest.raises(ObjectFormatError):
        make(**kw).pack()
