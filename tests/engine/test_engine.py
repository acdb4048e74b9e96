"""Engine behaviour: buckets, objects, listing, multipart, copy, durability, recovery.

Everything runs against a real engine on a temp folder; no mocks.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import io
import os
import random
import threading

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import gpufeed.engine as engine_pkg
from gpufeed.engine import MIN_PART_BYTES, Engine, EngineStore, ObjectInfo
from gpufeed.errors import (
    BadDigest,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    DataFolderInUse,
    EntityTooSmall,
    IncompleteBody,
    InternalError,
    InvalidArgument,
    InvalidBucketName,
    InvalidPart,
    InvalidPartOrder,
    InvalidRange,
    KeyTooLong,
    MalformedXML,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
)
from gpufeed.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

B = "bkt"


@pytest.fixture
def engine(tmp_path):
    with Engine(tmp_path / "data", fsync=False) as e:
        e.create_bucket(B)
        yield e


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def blob_files(e: Engine) -> set[str]:
    out = set()
    for _root, _, files in os.walk(e.data_dir / "blobs"):
        out.update(files)
    return out


def tmp_files(e: Engine) -> list[str]:
    return os.listdir(e.data_dir / "tmp")


def all_keys(e: Engine, bucket: str = B) -> list[str]:
    out, token = [], None
    while True:
        page = e.list_objects(bucket, continuation_token=token)
        out += [o.key for o in page.objects]
        if not page.is_truncated:
            return out
        token = page.next_token


def test_public_names_are_complete():
    assert set(engine_pkg.__all__) >= {
        "Engine", "PendingWrite", "EngineStore", "BucketInfo", "ObjectInfo", "ListResult",
        "UploadInfo", "PartInfo", "MAX_KEY_BYTES", "MIN_PART_BYTES", "MAX_PARTS",
    }
    for name in engine_pkg.__all__:
        assert getattr(engine_pkg, name) is not None


# buckets -------------------------------------------------------------------
def test_bucket_lifecycle(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        assert e.list_buckets() == []
        b = e.create_bucket("zeta")
        e.create_bucket("alpha")
        assert b.name == "zeta" and b.created > 0
        assert [x.name for x in e.list_buckets()] == ["alpha", "zeta"]
        assert e.head_bucket("zeta") == b
        with pytest.raises(BucketAlreadyOwnedByYou):
            e.create_bucket("zeta")
        e.delete_bucket("zeta")
        with pytest.raises(NoSuchBucket):
            e.head_bucket("zeta")
        with pytest.raises(NoSuchBucket):
            e.delete_bucket("zeta")
        assert [x.name for x in e.list_buckets()] == ["alpha"]


@pytest.mark.parametrize("name", ["abc", "a-b.c", "1bucket", "a" * 63, "my.bucket.name", "0-0"])
def test_valid_bucket_names(engine, name):
    engine.create_bucket(name)
    engine.head_bucket(name)


@pytest.mark.parametrize(
    "name",
    ["ab", "a" * 64, "Abc", "-abc", "abc-", ".abc", "a..b", "a.-b", "192.168.1.1", "a_b", "a b",
     "xn--abc", "abc-s3alias", "abc--ol-s3", "", "buck\u00e9t", 123, None],
)
def test_invalid_bucket_names(engine, name):
    with pytest.raises(InvalidBucketName):
        engine.create_bucket(name)


def test_delete_bucket_not_empty(engine):
    engine.put_object(B, "k", b"v")
    with pytest.raises(BucketNotEmpty):
        engine.delete_bucket(B)
    engine.delete_object(B, "k")
    up = engine.create_multipart_upload(B, "m")
    with pytest.raises(BucketNotEmpty):
        engine.delete_bucket(B)
    engine.abort_multipart_upload(B, "m", up.upload_id)
    engine.delete_bucket(B)


def test_missing_bucket_errors(engine):
    for call in [
        lambda: engine.put_object("nope", "k", b""),
        lambda: engine.head_object("nope", "k"),
        lambda: engine.get_object("nope", "k"),
        lambda: engine.delete_object("nope", "k"),
        lambda: engine.list_objects("nope"),
        lambda: engine.create_multipart_upload("nope", "k"),
        lambda: engine.list_multipart_uploads("nope"),
        lambda: engine.begin_put("nope", "k"),
    ]:
        with pytest.raises(NoSuchBucket):
            call()
    with pytest.raises(NoSuchKey):
        engine.head_object(B, "k")


# objects ---------------------------------------------------------------------
def test_put_head_get_fields(engine):
    data = os.urandom(10_000)
    info = engine.put_object(
        B, "dir/obj", data, content_type="text/plain",
        metadata={"owner": "me", "note": "ünïcode"}, checksums={"crc32c": "AAAAAA=="},
    )
    assert info.size == len(data)
    assert info.etag == hashlib.md5(data).hexdigest()
    assert len(info.blob_id) == 32
    head = engine.head_object(B, "dir/obj")
    assert head == info
    assert head.content_type == "text/plain"
    assert head.metadata == {"owner": "me", "note": "ünïcode"}
    assert head.checksums == {"crc32c": "AAAAAA=="}
    with open(head.path, "rb") as fh:
        assert fh.read() == data
    assert os.path.dirname(head.path) == str(engine.data_dir / "blobs" / info.blob_id[:2] / info.blob_id[2:4])
    assert engine.get_object(B, "dir/obj") == data


def test_defaults(engine):
    info = engine.put_object(B, "k", b"")
    assert info.content_type == "application/octet-stream"
    assert info.metadata == {} and info.checksums == {}
    assert info.etag == hashlib.md5(b"").hexdigest()
    assert engine.get_object(B, "k") == b""


def test_xxh3_etag(engine):
    data = os.urandom(3 << 20)
    info = engine.put_object(B, "x", data, etag="xxh3")
    assert info.etag == "x" + xxhash.xxh3_128(data).hexdigest()
    assert engine.head_object(B, "x").etag == info.etag
    with pytest.raises(InvalidArgument):
        engine.put_object(B, "x", data, etag="sha1")


def test_put_from_iterable_file_and_generator(engine, tmp_path):
    parts = [b"a" * 100, bytearray(b"b" * 200), memoryview(b"c" * 300)]
    assert engine.put_object(B, "list", parts).size == 600
    assert engine.get_object(B, "list") == b"a" * 100 + b"b" * 200 + b"c" * 300
    assert engine.put_object(B, "gen", (bytes([i]) * 10 for i in range(5))).size == 50
    big = os.urandom((8 << 20) + 12345)  # crosses the 8 MiB read chunk
    f = tmp_path / "src.bin"
    f.write_bytes(big)
    with open(f, "rb") as fh:
        info = engine.put_object(B, "file", fh)
    assert info.etag == hashlib.md5(big).hexdigest()
    assert engine.get_object(B, "file") == big
    engine.put_object(B, "bytesio", io.BytesIO(b"from BytesIO"))
    assert engine.get_object(B, "bytesio") == b"from BytesIO"

    class ReadOnly:  # only .read(), like some HTTP bodies
        def __init__(self):
            self.chunks = [b"xy", b"z", b""]

        def read(self, n):
            return self.chunks.pop(0)

    engine.put_object(B, "readonly", ReadOnly())
    assert engine.get_object(B, "readonly") == b"xyz"
    with pytest.raises(TypeError):
        engine.put_object(B, "str", "not bytes")
    assert tmp_files(engine) == []


def test_content_md5(engine):
    data = b"checked"
    engine.put_object(B, "k", data, content_md5=md5_b64(data))
    with pytest.raises(BadDigest):
        engine.put_object(B, "k", b"other", content_md5=md5_b64(data))
    assert engine.get_object(B, "k") == data  # the old version stays
    with pytest.raises(BadDigest):
        engine.put_object(B, "new", b"other", content_md5=md5_b64(data))
    with pytest.raises(NoSuchKey):
        engine.head_object(B, "new")
    with pytest.raises(InvalidArgument):
        engine.put_object(B, "k", data, content_md5="not base64!")
    # Content-MD5 is also checked when the ETag is xxh3 (the file is hashed again).
    engine.put_object(B, "x", data, etag="xxh3", content_md5=md5_b64(data))
    with pytest.raises(BadDigest):
        engine.put_object(B, "x", b"nope", etag="xxh3", content_md5=md5_b64(data))
    assert tmp_files(engine) == []
    assert len(blob_files(engine)) == 2


def test_overwrite_and_delete_remove_old_blobs(engine):
    a = engine.put_object(B, "k", b"one")
    b = engine.put_object(B, "k", b"two")
    assert a.blob_id != b.blob_id
    assert not os.path.exists(a.path) and os.path.exists(b.path)
    assert blob_files(engine) == {b.blob_id}
    engine.delete_object(B, "k")
    engine.delete_object(B, "k")  # missing: fine
    assert blob_files(engine) == set()
    with pytest.raises(NoSuchKey):
        engine.get_object(B, "k")


def test_get_ranges(engine):
    engine.put_object(B, "r", b"0123456789")
    assert engine.get_object(B, "r", RangeByteRequest(2, 4)) == b"23"
    assert engine.get_object(B, "r", RangeByteRequest(8, 100)) == b"89"
    assert engine.get_object(B, "r", OffsetByteRequest(7)) == b"789"
    assert engine.get_object(B, "r", SuffixByteRequest(2)) == b"89"
    with pytest.raises(InvalidRange):
        engine.get_object(B, "r", RangeByteRequest(10, 11))


def test_read_into(engine):
    data = os.urandom(100_000)
    info = engine.put_object(B, "r", data)
    buf = bytearray(len(data))
    assert engine.read_into(info, buf) == len(data) and bytes(buf) == data
    buf = bytearray(1000)
    assert engine.read_into(info, buf, 500) == 1000 and bytes(buf) == data[500:1500]
    assert engine.read_into(info, buf, len(data) - 10) == 10 and bytes(buf[:10]) == data[-10:]
    assert engine.read_into(info, buf, len(data) + 5) == 0
    import numpy as np

    arr = np.zeros(25_000, dtype=np.float32)  # a typed buffer, read as raw bytes
    assert engine.read_into(info, arr) == 100_000
    assert arr.tobytes() == data
    engine.put_object(B, "r", b"replaced")
    with pytest.raises(NoSuchKey):
        engine.read_into(info, buf)


@pytest.mark.parametrize("key", ["k" * 1025, "é" * 513])
def test_key_too_long(engine, key):
    for call in [
        lambda: engine.put_object(B, key, b""),
        lambda: engine.begin_put(B, key),
        lambda: engine.create_multipart_upload(B, key),
    ]:
        with pytest.raises(KeyTooLong):
            call()
    engine.put_object(B, "src", b"")
    with pytest.raises(KeyTooLong):
        engine.copy_object(B, "src", B, key)


@pytest.mark.parametrize("key", ["", "\ud800", "a\udfffb", b"bytes", 5])
def test_invalid_keys(engine, key):
    with pytest.raises(InvalidArgument):
        engine.put_object(B, key, b"")
    if isinstance(key, str) and key:
        with pytest.raises(InvalidArgument):
            engine.head_object(B, key)
        with pytest.raises(InvalidArgument):
            engine.delete_object(B, key)


def test_nul_and_control_characters_in_keys(engine):
    keys = ["a\x00b", "a", "a\x01", "\x7f"]
    for k in keys:
        engine.put_object(B, k, k.encode())
    for k in keys:
        assert engine.get_object(B, k) == k.encode()
    assert all_keys(engine) == sorted(keys, key=lambda k: k.encode())


def test_traversal_keys_stay_inside_data_dir(tmp_path):
    data = tmp_path / "data"
    keys = ["../../escape", "/abs/escape", "..", "a/../../../escape", "..\\escape", "%2e%2e/escape", "./x"]
    with Engine(data, fsync=False) as e:
        e.create_bucket(B)
        for k in keys:
            e.put_object(B, k, b"payload")
        for k in keys:
            info = e.head_object(B, k)
            assert os.path.realpath(info.path).startswith(str(data.resolve()) + os.sep)
            assert e.get_object(B, k) == b"payload"
        assert sorted(all_keys(e)) == sorted(keys)
    # Nothing was written outside the data folder, and inside it only our names.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    for root, _dirs, files in os.walk(data):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), data)
            assert "escape" not in rel
            assert rel in ("catalog.sqlite3", "lock") or rel.startswith("catalog.sqlite3-") \
                or (rel.startswith("blobs/") and len(name) == 32), rel


# pending writes --------------------------------------------------------------
def test_pending_write_invisible_until_commit(engine):
    pw = engine.begin_put(B, "p")
    pw.write(b"hello ")
    pw.write(memoryview(b"world"))
    assert pw.size == 11
    with pytest.raises(NoSuchKey):
        engine.head_object(B, "p")
    assert all_keys(engine) == []
    info = pw.commit(content_type="text/plain", expected_size=11)
    assert info.etag == hashlib.md5(b"hello world").hexdigest()
    assert engine.get_object(B, "p") == b"hello world"
    with pytest.raises(InvalidArgument):
        pw.commit()
    with pytest.raises(InvalidArgument):
        pw.write(b"more")
    pw.abort()  # idempotent, no effect after commit
    assert engine.get_object(B, "p") == b"hello world"


def test_pending_write_abort_leaves_nothing(engine):
    pw = engine.begin_put(B, "p")
    pw.write(os.urandom(1 << 20))
    assert len(tmp_files(engine)) == 1
    pw.abort()
    pw.abort()
    assert tmp_files(engine) == [] and blob_files(engine) == set()
    with pytest.raises(NoSuchKey):
        engine.head_object(B, "p")

    with pytest.raises(RuntimeError):
        with engine.begin_put(B, "q") as pw:
            pw.write(b"partial")
            raise RuntimeError("client went away")
    assert tmp_files(engine) == []
    with pytest.raises(NoSuchKey):
        engine.head_object(B, "q")

    pw = engine.begin_put(B, "dropped")
    pw.write(b"x")
    del pw
    gc.collect()
    assert tmp_files(engine) == []


def test_pending_write_expected_size(engine):
    pw = engine.begin_put(B, "p")
    pw.write(b"abc")
    with pytest.raises(IncompleteBody):
        pw.commit(expected_size=5)
    assert tmp_files(engine) == []
    pw = engine.begin_put(B, "p")
    pw.write(b"abcdef")
    with pytest.raises(InvalidArgument):
        pw.commit(expected_size=5)
    with pytest.raises(NoSuchKey):
        engine.head_object(B, "p")


@pytest.mark.parametrize("kind", ["md5", "xxh3"])
def test_pending_write_direct_fd_paths(engine, tmp_path, kind):
    src = os.urandom(3 << 20)
    f = tmp_path / "src.bin"
    f.write_bytes(src)
    pw = engine.begin_put(B, "direct", etag=kind)
    pw.write(src[:1000])
    # A caller writing through fileno() with pwritev, passing the data for hashing...
    n = os.pwritev(pw.fileno(), [src[1000:2000], src[2000:3000]], pw.size)
    pw.wrote(n, [src[1000:2000], src[2000:3000]])
    # ... or without it (the engine reads the bytes back for the hash).
    n = os.pwrite(pw.fileno(), src[3000:100_000], pw.size)
    pw.wrote(n)
    with open(f, "rb") as fh:
        assert pw.write_from_fd(fh.fileno(), 100_000, 1 << 20) == 1 << 20
    pw.write(src[100_000 + (1 << 20):])
    info = pw.commit()
    assert info.size == len(src)
    assert engine.get_object(B, "direct") == src
    want = hashlib.md5(src).hexdigest() if kind == "md5" else "x" + xxhash.xxh3_128(src).hexdigest()
    assert info.etag == want


def test_write_from_fd_memfd_and_short_source(engine):
    fd = os.memfd_create("src")
    try:
        os.write(fd, b"0123456789")
        pw = engine.begin_put(B, "m")
        assert pw.write_from_fd(fd, 2, 5) == 5
        assert pw.write_from_fd(fd, 8, 100) == 2  # the source ends first
        info = pw.commit()
    finally:
        os.close(fd)
    assert engine.get_object(B, "m") == b"2345689"
    assert info.etag == hashlib.md5(b"2345689").hexdigest()


def test_commit_after_bucket_deleted(engine):
    engine.create_bucket("gone")
    pw = engine.begin_put("gone", "k")
    pw.write(b"data")
    engine.delete_bucket("gone")  # the pending object is invisible, so the bucket is empty
    with pytest.raises(NoSuchBucket):
        pw.commit()
    assert tmp_files(engine) == [] and blob_files(engine) == set()


# listing -----------------------------------------------------------------------
def test_list_utf8_byte_order(engine):
    keys = ["\uffff", "\U00010000", "z", "é", "\x7f", "A", "a", "ab", "a/b"]
    for k in keys:
        engine.put_object(B, k, b"")
    # U+FFFF sorts before U+10000 in UTF-8 (but after it in UTF-16).
    assert all_keys(engine) == sorted(keys, key=lambda k: k.encode("utf-8"))
    assert all_keys(engine).index("\uffff") < all_keys(engine).index("\U00010000")


def test_list_delimiter_and_prefix(engine):
    for k in ["a/1", "a/2", "a/b/3", "b/1", "c", "d--x--y", "d--z", "dd"]:
        engine.put_object(B, k, b"")
    r = engine.list_objects(B, delimiter="/")
    assert r.common_prefixes == ["a/", "b/"]
    assert [o.key for o in r.objects] == ["c", "d--x--y", "d--z", "dd"]
    assert not r.is_truncated and r.next_token is None
    r = engine.list_objects(B, prefix="a/", delimiter="/")
    assert [o.key for o in r.objects] == ["a/1", "a/2"] and r.common_prefixes == ["a/b/"]
    r = engine.list_objects(B, delimiter="--")
    assert r.common_prefixes == ["d--"]
    r = engine.list_objects(B, prefix="d--", delimiter="--")
    assert r.common_prefixes == ["d--x--"] and [o.key for o in r.objects] == ["d--z"]
    r = engine.list_objects(B, prefix="a", delimiter="1")
    assert r.common_prefixes == ["a/1"] and [o.key for o in r.objects] == ["a/2", "a/b/3"]
    assert [o.key for o in engine.list_objects(B, prefix="zzz").objects] == []


def test_list_max_keys_counts_prefixes_and_pages(engine):
    for k in ["a/1", "a/2", "b", "c/1", "d", "e/x/y"]:
        engine.put_object(B, k, b"")
    r = engine.list_objects(B, delimiter="/", max_keys=2)
    assert r.common_prefixes == ["a/"] and [o.key for o in r.objects] == ["b"]
    assert r.is_truncated and r.next_marker == "b"
    r = engine.list_objects(B, delimiter="/", max_keys=2, continuation_token=r.next_token)
    assert r.common_prefixes == ["c/"] and [o.key for o in r.objects] == ["d"]
    assert r.is_truncated and r.next_marker == "d"
    r = engine.list_objects(B, delimiter="/", max_keys=2, continuation_token=r.next_token)
    assert r.common_prefixes == ["e/"] and r.objects == [] and not r.is_truncated
    assert r.next_token is None and r.next_marker is None


def test_list_exact_page_is_not_truncated(engine):
    for k in ["a", "b", "c"]:
        engine.put_object(B, k, b"")
    r = engine.list_objects(B, max_keys=3)
    assert len(r.objects) == 3 and not r.is_truncated
    r = engine.list_objects(B, max_keys=2)
    assert r.is_truncated
    r = engine.list_objects(B, max_keys=1, continuation_token=r.next_token)
    assert [o.key for o in r.objects] == ["c"] and not r.is_truncated


def test_list_max_keys_bounds(engine):
    for i in range(3):
        engine.put_object(B, f"k{i}", b"")
    r = engine.list_objects(B, max_keys=0)
    assert r.objects == [] and r.common_prefixes == [] and not r.is_truncated
    assert len(engine.list_objects(B, max_keys=5000).objects) == 3
    with pytest.raises(InvalidArgument):
        engine.list_objects(B, max_keys=-1)


def test_list_start_after_is_v1_marker(engine):
    for k in ["a", "b", "c", "d/1", "d/2", "e"]:
        engine.put_object(B, k, b"")
    assert [o.key for o in engine.list_objects(B, start_after="b").objects] == ["c", "d/1", "d/2", "e"]
    assert [o.key for o in engine.list_objects(B, start_after="bb").objects] == ["c", "d/1", "d/2", "e"]
    assert [o.key for o in engine.list_objects(B, start_after="e").objects] == []
    r = engine.list_objects(B, start_after="d/1", delimiter="/")
    assert r.common_prefixes == ["d/"] and [o.key for o in r.objects] == ["e"]
    r = engine.list_objects(B, prefix="d/", start_after="a")  # before the prefix: whole prefix
    assert [o.key for o in r.objects] == ["d/1", "d/2"]
    # v1 paging: marker = the previous page's next_marker
    r = engine.list_objects(B, max_keys=2)
    r = engine.list_objects(B, max_keys=2, start_after=r.next_marker)
    assert [o.key for o in r.objects] == ["c", "d/1"]


@pytest.mark.parametrize("token", ["", "!!!", "not-base64?", base64.urlsafe_b64encode(b"zkey").decode(),
                                   base64.urlsafe_b64encode(b"k").decode(),
                                   base64.urlsafe_b64encode(b"k\xff\xfe").decode()])
def test_list_bad_token(engine, token):
    with pytest.raises(InvalidArgument):
        engine.list_objects(B, continuation_token=token)


def test_list_delimiter_seeks_past_prefixes(engine):
    """A delimiter listing over many keys under few prefixes reads few rows."""
    for i in range(3000):
        engine.put_object(B, f"big/{i:05d}", b"")
    engine.put_object(B, "small", b"")
    conn = engine._cat.reader()
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        r = engine.list_objects(B, delimiter="/")
        seek_steps = steps[0]
        steps[0] = 0
        full = engine.list_objects(B, max_keys=1000)
        scan_steps = steps[0]
    finally:
        conn.set_progress_handler(None, 0)
    assert r.common_prefixes == ["big/"] and [o.key for o in r.objects] == ["small"]
    assert len(full.objects) == 1000
    assert seek_steps * 20 < scan_steps, (seek_steps, scan_steps)


_ALPHABET = "ab/-é"
_KEYS = sorted({"".join(random.Random(i).choices(_ALPHABET, k=random.Random(-i).randint(1, 5)))
                for i in range(300)})


def model_list(prefix: str, delimiter: str, after: str | None) -> list[tuple[str, str]]:
    """What S3 lists: ('k', key) and ('p', common prefix) entries, in order."""
    out: list[tuple[str, str]] = []
    for k in sorted(_KEYS, key=lambda k: k.encode()):
        if not k.startswith(prefix) or (after is not None and k <= after):
            continue
        if delimiter:
            i = k.find(delimiter, len(prefix))
            if i >= 0:
                cp = k[: i + len(delimiter)]
                if cp == after:
                    continue  # a v1 NextMarker naming a common prefix: S3 skips what is under it
                if not out or out[-1] != ("p", cp):
                    out.append(("p", cp))
                continue
        out.append(("k", k))
    return out


@pytest.fixture(scope="module")
def listing_engine(tmp_path_factory):
    with Engine(tmp_path_factory.mktemp("listing"), fsync=False) as e:
        e.create_bucket(B)
        for k in _KEYS:
            e.put_object(B, k, b"")
        yield e


@settings(max_examples=150, deadline=None)
@given(
    prefix=st.text(alphabet=_ALPHABET, max_size=2),
    delimiter=st.sampled_from(["", "/", "-", "a", "/a", "é/", "ab"]),
    after=st.one_of(st.none(), st.text(alphabet=_ALPHABET, max_size=3)),
    max_keys=st.integers(1, 7),
)
def test_list_matches_model(listing_engine, prefix, delimiter, after, max_keys):
    want = model_list(prefix, delimiter, after or None)
    got: list[tuple[str, str]] = []
    token = None
    for _ in range(len(want) + 2):
        r = listing_engine.list_objects(
            B, prefix=prefix, delimiter=delimiter, start_after=after or "",
            continuation_token=token, max_keys=max_keys,
        )
        page = sorted([("k", o.key) for o in r.objects] + [("p", p) for p in r.common_prefixes],
                      key=lambda e: e[1].encode())
        assert len(page) <= max_keys
        got += page
        if not r.is_truncated:
            break
        assert page and r.next_marker == page[-1][1]
        token = r.next_token
    assert got == want


# multipart ---------------------------------------------------------------------
def test_multipart_happy_path(engine):
    engine.put_object(B, "mp", b"old version")
    old_blob = engine.head_object(B, "mp").blob_id
    up = engine.create_multipart_upload(B, "mp", content_type="video/mp4", metadata={"a": "1"})
    assert len(up.upload_id) == 32
    assert [u.upload_id for u in engine.list_multipart_uploads(B)] == [up.upload_id]
    assert engine.list_multipart_uploads(B, prefix="x") == []
    p1 = os.urandom(MIN_PART_BYTES)
    p2 = os.urandom(1000)
    i2 = engine.upload_part(B, "mp", up.upload_id, 2, p2, content_md5=md5_b64(p2))
    i1 = engine.upload_part(B, "mp", up.upload_id, 1, io.BytesIO(p1))
    assert i1.etag == hashlib.md5(p1).hexdigest() and i1.size == len(p1)
    assert [p.part_number for p in engine.list_parts(B, "mp", up.upload_id)] == [1, 2]
    assert engine.get_object(B, "mp") == b"old version"  # nothing new is visible before completion
    info = engine.complete_multipart_upload(B, "mp", up.upload_id, [(1, f'"{i1.etag}"'), (2, i2.etag)])
    want = hashlib.md5(hashlib.md5(p1).digest() + hashlib.md5(p2).digest()).hexdigest() + "-2"
    assert info.etag == want and info.size == len(p1) + len(p2)
    assert info.content_type == "video/mp4" and info.metadata == {"a": "1"}
    assert engine.head_object(B, "mp") == info
    assert engine.get_object(B, "mp") == p1 + p2
    assert engine.list_multipart_uploads(B) == []
    assert os.listdir(engine.data_dir / "uploads") == []
    assert blob_files(engine) == {info.blob_id} and old_blob != info.blob_id
    with pytest.raises(NoSuchUpload):
        engine.list_parts(B, "mp", up.upload_id)


def test_multipart_single_small_part_and_reupload(engine):
    up = engine.create_multipart_upload(B, "one")
    engine.upload_part(B, "one", up.upload_id, 1, b"first try")
    files_before = os.listdir(engine.data_dir / "uploads" / up.upload_id)
    p = engine.upload_part(B, "one", up.upload_id, 1, b"second")
    assert [x.etag for x in engine.list_parts(B, "one", up.upload_id)] == [p.etag]
    files_after = os.listdir(engine.data_dir / "uploads" / up.upload_id)
    assert len(files_before) == len(files_after) == 1 and files_before != files_after
    info = engine.complete_multipart_upload(B, "one", up.upload_id, [(1, p.etag)])
    assert engine.get_object(B, "one") == b"second" and info.etag.endswith("-1")


def test_multipart_errors(engine):
    up = engine.create_multipart_upload(B, "k")
    uid = up.upload_id
    small = engine.upload_part(B, "k", uid, 1, b"small")
    last = engine.upload_part(B, "k", uid, 2, b"last")
    for bad in ["0" * 32, "../../etc", "", "ZZ" * 16]:
        with pytest.raises(NoSuchUpload):
            engine.upload_part(B, "k", bad, 1, b"")
        with pytest.raises(NoSuchUpload):
            engine.complete_multipart_upload(B, "k", bad, [(1, small.etag)])
    with pytest.raises(NoSuchUpload):  # right id, wrong key
        engine.upload_part(B, "other", uid, 1, b"")
    for n in [0, 10_001, -1]:
        with pytest.raises(InvalidArgument):
            engine.begin_part(B, "k", uid, n)
    with pytest.raises(MalformedXML):
        engine.complete_multipart_upload(B, "k", uid, [])
    with pytest.raises(InvalidPart):
        engine.complete_multipart_upload(B, "k", uid, [(1, small.etag), (3, last.etag)])
    with pytest.raises(InvalidPart):
        engine.complete_multipart_upload(B, "k", uid, [(1, "0" * 32), (2, last.etag)])
    with pytest.raises(InvalidPartOrder):
        engine.complete_multipart_upload(B, "k", uid, [(2, last.etag), (1, small.etag)])
    with pytest.raises(InvalidPartOrder):
        engine.complete_multipart_upload(B, "k", uid, [(1, small.etag), (1, small.etag)])
    with pytest.raises(EntityTooSmall):
        engine.complete_multipart_upload(B, "k", uid, [(1, small.etag), (2, last.etag)])
    with pytest.raises(BadDigest):
        engine.upload_part(B, "k", uid, 3, b"data", content_md5=md5_b64(b"other"))
    assert [p.part_number for p in engine.list_parts(B, "k", uid)] == [1, 2]  # failures changed nothing
    with pytest.raises(NoSuchKey):
        engine.head_object(B, "k")
    assert tmp_files(engine) == [] and blob_files(engine) == set()
    engine.abort_multipart_upload(B, "k", uid)
    assert not (engine.data_dir / "uploads" / uid).exists()
    with pytest.raises(NoSuchUpload):
        engine.abort_multipart_upload(B, "k", uid)
    with pytest.raises(NoSuchUpload):
        engine.complete_multipart_upload(B, "k", uid, [(1, small.etag)])
    with pytest.raises(NoSuchUpload):
        engine.upload_part(B, "k", uid, 1, b"")


def test_part_commit_after_abort(engine):
    up = engine.create_multipart_upload(B, "k")
    pw = engine.begin_part(B, "k", up.upload_id, 1)
    pw.write(b"late")
    engine.abort_multipart_upload(B, "k", up.upload_id)
    with pytest.raises(NoSuchUpload):
        pw.commit()
    assert tmp_files(engine) == [] and os.listdir(engine.data_dir / "uploads") == []


# copy ------------------------------------------------------------------------------
def test_copy_keeps_metadata_by_default(engine):
    engine.create_bucket("other")
    src = engine.put_object(B, "src", b"copy me" * 1000, content_type="text/x", metadata={"m": "1"},
                            checksums={"sha256": "abc="})
    dst = engine.copy_object(B, "src", "other", "dst")
    assert dst.bucket == "other" and dst.key == "dst" and dst.blob_id != src.blob_id
    assert (dst.etag, dst.size, dst.content_type, dst.metadata, dst.checksums) == \
        (src.etag, src.size, "text/x", {"m": "1"}, {"sha256": "abc="})
    assert engine.get_object("other", "dst") == b"copy me" * 1000
    engine.delete_object(B, "src")  # the copy is independent
    assert engine.get_object("other", "dst") == b"copy me" * 1000


def test_copy_replace_metadata_and_same_key(engine):
    src = engine.put_object(B, "k", b"payload", content_type="text/a", metadata={"v": "1"})
    new = engine.copy_object(B, "k", B, "k", metadata={"v": "2"}, content_type="text/b")
    assert new.metadata == {"v": "2"} and new.content_type == "text/b"
    assert engine.head_object(B, "k") == new
    assert engine.get_object(B, "k") == b"payload"
    assert blob_files(engine) == {new.blob_id} and src.blob_id != new.blob_id
    other = engine.copy_object(B, "k", B, "k2", metadata={})
    assert other.metadata == {} and other.content_type == "application/octet-stream"


def test_copy_errors(engine):
    with pytest.raises(NoSuchKey):
        engine.copy_object(B, "missing", B, "dst")
    engine.put_object(B, "src", b"x")
    with pytest.raises(NoSuchBucket):
        engine.copy_object(B, "src", "nope", "dst")
    with pytest.raises(NoSuchBucket):
        engine.copy_object("nope", "src", B, "dst")
    assert tmp_files(engine) == []


# engine lifecycle and recovery -----------------------------------------------------
def test_data_survives_reopen(tmp_path):
    with Engine(tmp_path, fsync=True) as e:
        e.create_bucket(B)
        info = e.put_object(B, "k", b"durable", metadata={"x": "y"})
        up = e.create_multipart_upload(B, "m")
        e.upload_part(B, "m", up.upload_id, 1, b"part")
    with Engine(tmp_path, fsync=True) as e:
        assert e.recovered == {"tmp": 0, "blobs": 0, "uploads": 0, "parts": 0, "adopted": 0, "missing": 0,
                               "orphan_manifests": 0, "missing_files": 0, "replica_staging": 0}
        assert e.head_object(B, "k") == info
        assert e.get_object(B, "k") == b"durable"
        assert [p.part_number for p in e.list_parts(B, "m", up.upload_id)] == [1]
        e.complete_multipart_upload(B, "m", up.upload_id, [(1, hashlib.md5(b"part").hexdigest())])
        assert e.get_object(B, "m") == b"part"


def test_one_engine_per_data_dir(tmp_path):
    e = Engine(tmp_path, fsync=False)
    with pytest.raises(DataFolderInUse, match=f"process {os.getpid()}"):
        Engine(tmp_path, fsync=False)
    e.close()
    e.close()  # idempotent
    with pytest.raises(InternalError):
        e.head_bucket(B)
    with Engine(tmp_path, fsync=False):
        pass


def test_restart_removes_leftovers(tmp_path):
    with Engine(tmp_path, fsync=False) as e:
        e.create_bucket(B)
        keep = e.put_object(B, "keep", b"kept")
        up = e.create_multipart_upload(B, "m")
        part = e.upload_part(B, "m", up.upload_id, 1, b"part")
    # What a crash at various points leaves behind:
    (tmp_path / "tmp" / "half-written").write_bytes(b"partial")
    (tmp_path / "tmp" / "subdir").mkdir()
    (tmp_path / "tmp" / "subdir" / "x").write_bytes(b"")
    stray = "f" * 32
    os.makedirs(tmp_path / "blobs" / "ff" / "ff")
    (tmp_path / "blobs" / "ff" / "ff" / stray).write_bytes(b"renamed, never committed")
    sibling = keep.blob_id[:-1] + ("0" if keep.blob_id[-1] != "0" else "1")
    (tmp_path / "blobs" / keep.blob_id[:2] / keep.blob_id[2:4] / sibling).write_bytes(b"old version")
    os.mkdir(tmp_path / "uploads" / ("a" * 32))
    (tmp_path / "uploads" / ("a" * 32) / "00001.x").write_bytes(b"orphan upload")
    (tmp_path / "uploads" / up.upload_id / "00002.deadbeef").write_bytes(b"orphan part")
    with Engine(tmp_path, fsync=False) as e:
        assert e.recovered == {"tmp": 2, "blobs": 2, "uploads": 1, "parts": 1, "adopted": 0, "missing": 0,
                               "orphan_manifests": 0, "missing_files": 0, "replica_staging": 0}
        assert os.listdir(tmp_path / "tmp") == []
        assert blob_files(e) == {keep.blob_id}
        assert os.listdir(tmp_path / "uploads") == [up.upload_id]
        assert len(os.listdir(tmp_path / "uploads" / up.upload_id)) == 1
        assert e.get_object(B, "keep") == b"kept"
        info = e.complete_multipart_upload(B, "m", up.upload_id, [(1, part.etag)])
        assert e.get_object(B, "m") == b"part" and info.size == 4


def test_concurrent_heads_and_overwrites(engine):
    values = [bytes([i]) * 4096 for i in range(4)]
    engine.put_object(B, "hot", values[0])
    stop = threading.Event()
    errors: list[object] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                info = engine.head_object(B, "hot")
                assert isinstance(info, ObjectInfo) and info.size == 4096
                data = engine.get_object(B, "hot")
                if data not in values:
                    errors.append(data[:8])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            engine.put_object(B, "hot", values[i % 4])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert len(blob_files(engine)) == 1


def test_reader_connections_of_finished_threads_are_closed(engine):
    for _ in range(20):
        t = threading.Thread(target=lambda: engine.head_bucket(B))
        t.start()
        t.join()
    engine.head_bucket(B)
    assert len(engine._cat._readers) <= 3


def test_engine_store_adapter(engine):
    store = EngineStore(engine, B)
    store.set("a/b", b"v")
    assert engine.head_object(B, "a/b").etag.startswith("x")
    ro = EngineStore(engine, B, read_only=True)
    assert ro.get("a/b") == b"v"
    from gpufeed.errors import AccessDenied

    with pytest.raises(AccessDenied):
        ro.set("a/b", b"w")
    with pytest.raises(AccessDenied):
        ro.delete("a/b")
    with pytest.raises(NoSuchBucket):
        EngineStore(engine, "missing")
