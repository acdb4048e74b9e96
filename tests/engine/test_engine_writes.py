"""Engine: stored HTTP headers, catalog migration, atomic conditional commits,
per-part checksums and their composite, long keys on delete, v1 markers.

Real engines on temp folders; no mocks.
"""

from __future__ import annotations

import base64
import hashlib
import sqlite3
import threading
import zlib

import pytest

from gpufeed.checksums import composite_checksum
from gpufeed.engine import MIN_PART_BYTES, Engine
from gpufeed.errors import KeyTooLong, NoSuchKey, PreconditionFailed

B = "bkt"
HEADERS = {
    "Cache-Control": "max-age=60",
    "Content-Disposition": 'attachment; filename="a b.txt"',
    "Content-Encoding": "gzip",
    "Content-Language": "de-CH",
    "Expires": "Wed, 21 Oct 2037 07:28:00 GMT",
}


@pytest.fixture
def engine(tmp_path):
    with Engine(tmp_path / "data", fsync=False) as e:
        e.create_bucket(B)
        yield e


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _crc32_b64(data: bytes) -> str:
    return _b64(zlib.crc32(data).to_bytes(4, "big"))


# headers -------------------------------------------------------------------------
def test_headers_round_trip_put_head_list(engine):
    info = engine.put_object(B, "h", b"x", headers=HEADERS)
    assert info.headers == HEADERS
    assert engine.head_object(B, "h").headers == HEADERS
    assert engine.list_objects(B).objects[0].headers == HEADERS
    engine.put_object(B, "h", b"y")  # an overwrite without headers drops them
    assert engine.head_object(B, "h").headers == {}


def test_headers_multipart_and_copy(engine):
    up = engine.create_multipart_upload(B, "mp", headers=HEADERS)
    assert up.headers == HEADERS
    assert engine.list_multipart_uploads(B)[0].headers == HEADERS
    p = engine.upload_part(B, "mp", up.upload_id, 1, b"abc")
    assert engine.complete_multipart_upload(B, "mp", up.upload_id, [(1, p.etag)]).headers == HEADERS
    assert engine.head_object(B, "mp").headers == HEADERS
    assert engine.copy_object(B, "mp", B, "copied").headers == HEADERS  # COPY keeps them
    replaced = engine.copy_object(B, "mp", B, "replaced", headers={"Cache-Control": "no-cache"})
    assert replaced.headers == {"Cache-Control": "no-cache"}
    assert replaced.metadata == {} and replaced.content_type == "application/octet-stream"
    assert engine.copy_object(B, "mp", B, "md-only", metadata={"a": "b"}).headers == {}  # REPLACE: all


def test_catalog_without_new_columns_is_migrated(tmp_path):
    """A catalog written before the headers/part-checksums columns existed opens,
    reads its rows with empty headers, and takes the new fields afterwards."""
    data = tmp_path / "data"
    with Engine(data, fsync=False) as e:
        e.create_bucket(B)
        e.put_object(B, "old", b"old data", metadata={"m": "1"})
        up = e.create_multipart_upload(B, "mp")
        e.upload_part(B, "mp", up.upload_id, 1, b"part")
    db = sqlite3.connect(data / "catalog.sqlite3")
    for table, column in (("objects", "headers"), ("uploads", "headers"), ("parts", "checksums")):
        db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.commit()
    assert "headers" not in {r[1] for r in db.execute("PRAGMA table_info(objects)")}
    db.close()
    with Engine(data, fsync=False) as e:
        old = e.head_object(B, "old")
        assert old.headers == {} and old.metadata == {"m": "1"} and e.get_object(B, "old") == b"old data"
        assert e.list_parts(B, "mp", up.upload_id)[0].checksums == {}
        e.put_object(B, "new", b"n", headers={"Cache-Control": "no-store"})
        assert e.head_object(B, "new").headers == {"Cache-Control": "no-store"}
    with Engine(data, fsync=False) as e:  # a second open finds the columns and adds nothing
        assert e.head_object(B, "new").headers == {"Cache-Control": "no-store"}


# conditional commits -------------------------------------------------------------------
def test_if_none_match_star_is_checked_at_commit(engine):
    first = engine.begin_put(B, "once")
    second = engine.begin_put(B, "once")
    first.write(b"first")
    second.write(b"second")
    first.commit(if_none_match="*")
    with pytest.raises(PreconditionFailed):
        second.commit(if_none_match="*")
    assert engine.get_object(B, "once") == b"first"
    assert not any((engine.data_dir / "tmp").iterdir())  # the loser's temp file is gone


def test_if_match(engine):
    with pytest.raises(NoSuchKey):
        engine.put_object(B, "k", b"1", if_match="*")
    etag = engine.put_object(B, "k", b"1").etag
    with pytest.raises(PreconditionFailed):
        engine.put_object(B, "k", b"2", if_match="0" * 32)
    assert engine.put_object(B, "k", b"2", if_match=etag).etag != etag
    with pytest.raises(PreconditionFailed):
        engine.put_object(B, "k", b"3", if_match=etag)  # etag is stale now
    engine.put_object(B, "k", b"3", if_match="*")
    with pytest.raises(PreconditionFailed):
        engine.put_object(B, "k", b"4", if_none_match=engine.head_object(B, "k").etag)
    assert engine.get_object(B, "k") == b"3"


def test_if_none_match_races_have_one_winner(engine):
    n = 16
    barrier = threading.Barrier(n)
    wins, losses = [], []

    def put(i: int) -> None:
        pw = engine.begin_put(B, "race")
        pw.write(str(i).encode())
        barrier.wait()
        try:
            pw.commit(if_none_match="*")
            wins.append(i)
        except PreconditionFailed:
            losses.append(i)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == n - 1
    assert engine.get_object(B, "race") == str(wins[0]).encode()


def test_complete_multipart_with_condition(engine):
    engine.put_object(B, "mp", b"exists")
    up = engine.create_multipart_upload(B, "mp")
    p = engine.upload_part(B, "mp", up.upload_id, 1, b"new")
    with pytest.raises(PreconditionFailed):
        engine.complete_multipart_upload(B, "mp", up.upload_id, [(1, p.etag)], if_none_match="*")
    assert engine.get_object(B, "mp") == b"exists"
    assert engine.list_parts(B, "mp", up.upload_id)  # the upload stays open
    etag = engine.head_object(B, "mp").etag
    engine.complete_multipart_upload(B, "mp", up.upload_id, [(1, p.etag)], if_match=etag)
    assert engine.get_object(B, "mp") == b"new"


# delete --------------------------------------------------------------------------------
def test_delete_key_too_long(engine):
    with pytest.raises(KeyTooLong):
        engine.delete_object(B, "k" * 1025)
    with pytest.raises(KeyTooLong):
        engine.delete_object(B, "é" * 513)  # 1,026 bytes of UTF-8
    engine.delete_object(B, "k" * 1024)  # at the limit: a missing key is no error


# multipart checksums -------------------------------------------------------------------
def test_composite_checksum_format():
    parts = [b"a" * 10, b"b" * 3]
    digests = [zlib.crc32(p).to_bytes(4, "big") for p in parts]
    want = _b64(zlib.crc32(b"".join(digests)).to_bytes(4, "big")) + "-2"
    assert composite_checksum("crc32", [_b64(d) for d in digests]) == want
    sha = [hashlib.sha256(p).digest() for p in parts]
    assert composite_checksum("sha256", [_b64(d) for d in sha]) == _b64(hashlib.sha256(b"".join(sha)).digest()) + "-2"


def test_part_checksums_stored_and_combined(engine):
    p1, p2 = b"\x01" * MIN_PART_BYTES, b"tail"
    up = engine.create_multipart_upload(B, "ck")
    ck1 = {"crc32": _crc32_b64(p1), "sha1": _b64(hashlib.sha1(p1).digest())}
    ck2 = {"crc32": _crc32_b64(p2)}  # no sha1: the object gets no sha1 composite
    e1 = engine.upload_part(B, "ck", up.upload_id, 1, p1, checksums=ck1)
    assert e1.checksums == ck1
    e2 = engine.upload_part(B, "ck", up.upload_id, 2, p2, checksums=ck2)
    assert [p.checksums for p in engine.list_parts(B, "ck", up.upload_id)] == [ck1, ck2]
    info = engine.complete_multipart_upload(B, "ck", up.upload_id, [(1, e1.etag), (2, e2.etag)])
    want = composite_checksum("crc32", [ck1["crc32"], ck2["crc32"]])
    assert want.endswith("-2")
    assert info.checksums == {"crc32": want}
    assert engine.head_object(B, "ck").checksums == {"crc32": want}


def test_multipart_without_part_checksums_has_none(engine):
    up = engine.create_multipart_upload(B, "plain")
    e1 = engine.upload_part(B, "plain", up.upload_id, 1, b"x")
    assert engine.complete_multipart_upload(B, "plain", up.upload_id, [(1, e1.etag)]).checksums == {}


# listing -------------------------------------------------------------------------------
def test_start_after_equal_to_common_prefix_skips_it(engine):
    for k in ("a", "b/1", "b/2", "b/c/3", "b0", "c/1", "d"):
        engine.put_object(B, k, b"")
    r = engine.list_objects(B, delimiter="/", start_after="b/")
    assert [o.key for o in r.objects] == ["b0", "d"] and r.common_prefixes == ["c/"]
    r = engine.list_objects(B, prefix="b/", delimiter="/", start_after="b/c/")
    assert [o.key for o in r.objects] == [] and r.common_prefixes == []
    # a marker that is a plain key (or a prefix not ending at its first delimiter) is only a key
    r = engine.list_objects(B, delimiter="/", start_after="b")
    assert [o.key for o in r.objects] == ["b0", "d"] and r.common_prefixes == ["b/", "c/"]
    after = engine.list_objects(B, start_after="b/").objects
    assert [o.key for o in after] == ["b/1", "b/2", "b/c/3", "b0", "c/1", "d"]


# -- ETag policy -----------------------------------------------------------------------

def test_etag_policy_of_a_bucket(tmp_path):
    """md5: S3's hex MD5; fast: x + XXH3-128 whatever the front asks; none: n + the
    version's blob id (no hashing), unique per version; Content-MD5 is checked in all."""
    import hashlib

    import xxhash

    from gpufeed.errors import BadDigest, InvalidArgument

    with Engine(tmp_path / "d", fsync=False) as e:
        for policy in ("md5", "fast", "none"):
            e.create_bucket(f"etag-{policy}", etag_policy=policy)
        data = b"some bytes" * 1000
        assert e.put_object("etag-md5", "k", data).etag == hashlib.md5(data).hexdigest()
        assert e.put_object("etag-md5", "f", data, etag="xxh3").etag == "x" + xxhash.xxh3_128_hexdigest(data)
        assert e.put_object("etag-fast", "k", data).etag == "x" + xxhash.xxh3_128_hexdigest(data)
        first = e.put_object("etag-none", "k", data)
        second = e.put_object("etag-none", "k", data)
        assert first.etag == "n" + first.blob_id and second.etag == "n" + second.blob_id != first.etag
        assert e.head_object("etag-none", "k").etag == second.etag
        good = base64.b64encode(hashlib.md5(data).digest()).decode()
        e.put_object("etag-none", "checked", data, content_md5=good)
        with pytest.raises(BadDigest):
            e.put_object("etag-none", "bad", data, content_md5=base64.b64encode(b"0" * 16).decode())
        assert [b["etag_policy"] for b in map(e.bucket_stats, ("etag-md5", "etag-fast", "etag-none"))] == \
            ["md5", "fast", "none"]
        with pytest.raises(InvalidArgument):
            e.create_bucket("etag-bad", etag_policy="sha1")
