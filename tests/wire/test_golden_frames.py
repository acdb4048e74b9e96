"""Golden bytes of fast-path frames, written from ``docs/wire-protocol.md`` (header
layout) and the msgpack spec (metadata arrays), not from the encoder."""

from __future__ import annotations

import struct

import pytest

from gpufeed.errors import ProtocolError
from gpufeed.wire import protocol as p


def fixstr(s: str) -> bytes:
    b = s.encode()
    assert len(b) < 32
    return bytes([0xA0 | len(b)]) + b


def test_header_layout():
    golden = (b"GF" + bytes([1, 11]) + (10).to_bytes(4, "little") + (7).to_bytes(8, "little")
              + (4096).to_bytes(8, "little"))
    assert len(golden) == p.HEADER_SIZE == 24
    assert p.pack_header(p.Op.GET, 10, 7, 4096) == golden
    assert p.unpack_header(golden) == (p.Op.GET, 10, 7, 4096)


@pytest.mark.parametrize("bad, match", [
    (b"XF" + bytes(22), "bad magic"),
    (b"GF" + bytes([2, 11]) + bytes(20), "version"),
    (b"GF" + bytes([1, 11]) + struct.pack("<I", p.MAX_META + 1) + bytes(16), "exceeds"),
])
def test_hostile_headers(bad, match):
    with pytest.raises(ProtocolError, match=match):
        p.unpack_header(bad)


def test_reply_and_error_opcodes():
    assert p.REPLY | p.Op.GET == 0x8B and p.ERROR_OP == 0xFF


def test_get_metadata_is_a_msgpack_array_in_field_order():
    # [bucket, key, offset, length, region, region_offset, digest]
    golden = bytes([0x97]) + fixstr("bkt") + fixstr("a/b") + bytes([0x00, 0x05, 0xFF, 0x00, 0x00])
    assert p.encode(p.Get("bkt", "a/b", 0, 5)) == golden
    assert p.decode(p.Get, golden) == p.Get("bkt", "a/b", 0, 5)


def test_put_and_error_metadata():
    # [bucket, key, length, region, region_offset, content_type, metadata]
    golden_put = bytes([0x97]) + fixstr("bkt") + fixstr("k") + bytes([0x03, 0xFF, 0x00, 0xC0, 0x80])
    assert p.encode(p.Put("bkt", "k", 3)) == golden_put
    golden_err = bytes([0x92]) + fixstr("NoSuchKey") + fixstr("gone")
    assert p.encode(p.ErrorReply("NoSuchKey", "gone")) == golden_err
    assert p.decode(p.ErrorReply, golden_err) == p.ErrorReply("NoSuchKey", "gone")


def test_truncated_metadata_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        p.decode(p.Get, bytes([0x97]) + fixstr("bkt"))
