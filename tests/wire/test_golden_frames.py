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


def str8(s: str) -> bytes:
    b = s.encode()
    assert 32 <= len(b) < 256
    return bytes([0xD9, len(b)]) + b


VID = "0123456789abcdef0123456789abcdef"


def test_versioned_requests_append_their_fields():
    # GET [..., digest, version_id]; HEAD [bucket, key, version_id];
    # DELETE [bucket, key, version_id, bypass_governance]
    golden_get = bytes([0x98]) + fixstr("bkt") + fixstr("a/b") + bytes([0x00, 0x05, 0xFF, 0x00, 0x00]) + str8(VID)
    assert p.encode(p.Get("bkt", "a/b", 0, 5, version_id=VID)) == golden_get
    assert p.decode(p.Get, golden_get) == p.Get("bkt", "a/b", 0, 5, version_id=VID)
    golden_head = bytes([0x93]) + fixstr("bkt") + fixstr("k") + fixstr("null")
    assert p.encode(p.Head("bkt", "k", "null")) == golden_head
    golden_delete = bytes([0x94]) + fixstr("bkt") + fixstr("k") + str8(VID) + bytes([0xC3])
    assert p.encode(p.Delete("bkt", "k", VID, True)) == golden_delete
    assert p.decode(p.Delete, golden_delete) == p.Delete("bkt", "k", VID, True)
    golden_bypass = bytes([0x94]) + fixstr("bkt") + fixstr("k") + bytes([0xC0, 0xC3])
    assert p.encode(p.Delete("bkt", "k", bypass_governance=True)) == golden_bypass


def test_requests_without_versions_keep_their_first_form():
    golden_head = bytes([0x92]) + fixstr("bkt") + fixstr("k")
    assert p.encode(p.Head("bkt", "k")) == golden_head
    assert p.encode(p.Delete("bkt", "k")) == golden_head
    assert p.decode(p.Head, golden_head) == p.Head("bkt", "k", None)
    assert p.decode(p.Delete, golden_head) == p.Delete("bkt", "k", None, False)


def test_version_replies():
    # DELETE reply [version_id, delete_marker]; an empty array (a node without versions) decodes too
    golden = bytes([0x92]) + str8(VID) + bytes([0xC3])
    assert p.encode(p.DeleteResult(VID, True)) == golden
    assert p.decode(p.DeleteResult, bytes([0x90])) == p.DeleteResult(None, False)
    # ObjectMeta's first form (7 fields) decodes with no version and no lock
    first = (bytes([0x97]) + fixstr("bkt") + fixstr("k") + bytes([0x03]) + fixstr("x1")
             + bytes([0xCB]) + struct.pack(">d", 1.5) + fixstr("a/b") + bytes([0x80]))
    meta = p.decode(p.ObjectMeta, first)
    assert (meta.size, meta.version_id, meta.lock_mode, meta.lock_until, meta.legal_hold) == (3, None, "", 0.0, False)
    # [.., metadata, version_id, lock_mode, lock_until, legal_hold]
    full = (bytes([0x9B]) + first[1:] + str8(VID) + fixstr("GOVERNANCE") + bytes([0xCB])
            + struct.pack(">d", 2.0) + bytes([0xC2]))
    assert p.encode(p.ObjectMeta("bkt", "k", 3, "x1", 1.5, "a/b", {}, VID, "GOVERNANCE", 2.0, False)) == full


def test_error_reply_says_when_a_delete_marker_was_in_the_way():
    # [code, message, delete_marker, version_id]
    golden = bytes([0x94]) + fixstr("NoSuchKey") + fixstr("gone") + bytes([0xC3]) + str8(VID)
    reply = p.ErrorReply("NoSuchKey", "gone", True, VID)
    assert p.encode(reply) == golden
    err = p.error_from_reply(p.decode(p.ErrorReply, golden))
    assert err.code == "NoSuchKey" and err.details == {"delete_marker": True, "version_id": VID}


def test_part_reply_names_files_only_for_has():
    # PART reply [size, files]: put/get/drop keep the first form [size]
    assert p.encode(p.PartFileReply(5)) == bytes([0x91, 0x05])
    name = "00001." + "ab" * 16
    golden = bytes([0x92, 0x01, 0x91]) + str8(name)
    assert p.encode(p.PartFileReply(1, (name,))) == golden
    assert p.decode(p.PartFileReply, golden) == p.PartFileReply(1, (name,))
    assert p.decode(p.PartFileReply, bytes([0x91, 0x05])) == p.PartFileReply(5)


def test_unknown_trailing_fields_are_ignored():
    """Fields are only ever added at the end: a receiver reads the ones it knows."""
    # HEAD is [bucket, key, version_id, snapshot]; a fifth element is one it does not know
    later = bytes([0x95]) + fixstr("bkt") + fixstr("k") + fixstr("null") + bytes([0xC0, 0x07])
    assert p.decode(p.Head, later) == p.Head("bkt", "k", "null")


# --- authentication (docs/wire-protocol.md, "Authentication") -----------------------

def bin8(b: bytes) -> bytes:
    assert len(b) < 256
    return bytes([0xC4, len(b)]) + b


def test_auth_request_and_replies():
    assert p.Op.AUTH == 6 and p.REPLY | p.Op.AUTH == 0x86
    nonce, proof = bytes(range(32)), bytes(range(32, 64))
    # [access_key, client_nonce, proof]
    golden = bytes([0x93]) + fixstr("gpufeed") + bin8(nonce) + bin8(proof)
    assert p.encode(p.Auth("gpufeed", nonce, proof)) == golden
    assert p.decode(p.Auth, golden) == p.Auth("gpufeed", nonce, proof)
    # [tenant, proof]
    golden_reply = bytes([0x92]) + fixstr("default") + bin8(proof)
    assert p.encode(p.AuthReply("default", proof)) == golden_reply
    # HELLO reply: [server, version, transport, features, nonce]
    golden_hello = (bytes([0x95]) + fixstr("gpufeed/x") + bytes([0x01]) + fixstr("tcp")
                    + bytes([0x92]) + fixstr("auth") + fixstr("versions") + bin8(nonce))
    assert p.encode(p.HelloReply("gpufeed/x", 1, "tcp", ["auth", "versions"], nonce)) == golden_hello
    # a HELLO reply of a node without authentication has no nonce
    old = bytes([0x94]) + fixstr("old") + bytes([0x01]) + fixstr("tcp") + bytes([0x90])
    assert p.decode(p.HelloReply, old).nonce == b""


def test_auth_proof_known_answer():
    """The proof from the spec's words, with hashlib/hmac only: the key is
    HMAC-SHA256(secret, label + " key"); the proof HMAC-SHA256(key, each field
    preceded by its u16 LE length)."""
    import hashlib
    import hmac

    label = b"gpufeed-wire-auth/1"
    key = hmac.new(b"gpufeed-secret-key", label + b" key", hashlib.sha256).digest()
    sn, cn = b"S" * 32, b"C" * 32
    msg = b"".join(len(f).to_bytes(2, "little") + f
                   for f in (label, b"client", b"shm", b"gpufeed", sn, cn))
    want = hmac.new(key, msg, hashlib.sha256).digest()
    assert p.auth_key("gpufeed-secret-key") == key
    assert p.auth_proof(key, "client", "shm", "gpufeed", sn, cn) == want
    # every field counts: role, transport, key id and both nonces
    for change in (("server", "shm", "gpufeed", sn, cn), ("client", "tcp", "gpufeed", sn, cn),
                   ("client", "shm", "gpufeedx", sn, cn), ("client", "shm", "gpufeed", cn, cn),
                   ("client", "shm", "gpufeed", sn, sn)):
        assert p.auth_proof(key, *change) != want
