"""The WebDataset tar shard format (gpufeed.ai.data._tar): interoperability
with the ``webdataset`` package both ways, and hostile shards."""

from __future__ import annotations

import io
import tarfile

import pytest
import webdataset as wds

from gpufeed.ai.data import CorruptShard, parse_shard, write_shard
from gpufeed.ai.data._tar import iter_members, split_name


def wds_shard(samples: list[dict]) -> bytes:
    buf = io.BytesIO()
    with wds.TarWriter(buf) as w:
        for s in samples:
            w.write(s)
    return buf.getvalue()


SAMPLES = [{"__key__": f"dir/{i:06d}", "cls": str(i).encode(), "seg.png": bytes([i]) * (i * 300 + 1),
            "json": b'{"i": %d}' % i} for i in range(7)]


def test_split_name_matches_webdataset():
    from webdataset.tariterators import base_plus_ext

    for name in ["a/b/0001.seg.png", "0001.JPG", "x.y.z", "noext", "d.ir/k.cls", "__index__.json"]:
        ours = split_name(name)
        base, ext = base_plus_ext(name)
        assert ours == (None if base is None else (base, ext.lower()))
    assert split_name("__meta__") is None and split_name("__dir__/x.txt") is None


def test_reads_shards_written_by_webdataset_tarwriter():
    got = parse_shard(wds_shard(SAMPLES), "bkt/s.tar")
    assert [s["__key__"] for s in got] == [s["__key__"] for s in SAMPLES]
    for s, want in zip(got, SAMPLES):
        assert s["__url__"] == "bkt/s.tar"
        assert {k: v for k, v in s.items() if not k.startswith("__")} == \
            {k: v for k, v in want.items() if not k.startswith("__")}


def test_reads_long_names_pax_and_gnu():
    key = "deep/" + "d" * 150 + "/" + "k" * 120
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            for ext, data in (("cls", b"1"), ("txt", b"hello")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        assert parse_shard(buf.getvalue()) == [{"__key__": key, "__url__": "shard", "cls": b"1", "txt": b"hello"}]


def test_our_shards_read_by_webdataset(tmp_path):
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    path = tmp_path / "000000.tar"
    path.write_bytes(write_shard(SAMPLES))
    with open(path, "rb") as f:
        got = [s for s in group_by_keys({**m, "__url__": str(path)} for m in tar_file_iterator(f))]
    assert [s["__key__"] for s in got] == [s["__key__"] for s in SAMPLES]
    for s, want in zip(got, SAMPLES):
        assert s["seg.png"] == want["seg.png"] and s["cls"] == want["cls"] and s["json"] == want["json"]


def test_write_shard_is_deterministic_and_round_trips_str():
    a = write_shard([{"__key__": "k", "txt": "héllo", "bin": memoryview(b"\x00\x01")}])
    assert a == write_shard([{"__key__": "k", "txt": "héllo", "bin": b"\x00\x01"}])
    assert parse_shard(a)[0]["txt"] == "héllo".encode()


@pytest.mark.parametrize("bad", [{"txt": b"x"}, {"__key__": "a.b", "txt": b"x"}, {"__key__": "k", "n": 3}])
def test_write_shard_refuses_bad_samples(bad):
    with pytest.raises(ValueError):
        write_shard([bad])


def test_skips_meta_directories_and_extensionless_files():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo("somedir")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for name, data in (("__meta__", b"{}"), ("__x__/a.json", b"{}"), ("README", b"r"), ("k1.txt", b"a")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert parse_shard(buf.getvalue()) == [{"__key__": "k1", "__url__": "shard", "txt": b"a"}]


# --- hostile shards ----------------------------------------------------------------------
GOOD = write_shard(SAMPLES)
END = (len(GOOD.rstrip(b"\0")) + 511) // 512 * 512  # where the end marker starts


def test_a_flipped_header_byte_is_corrupt_not_a_short_shard():
    # tarfile itself stops quietly at a bad header after the first member: that would drop samples
    second = next(off for off in range(512, len(GOOD), 512) if GOOD[off:off + 6] == b"dir/00")
    bad = bytearray(GOOD)
    bad[second + 10] ^= 0x20
    with pytest.raises(CorruptShard, match="checksum"):
        parse_shard(bytes(bad), "bkt/x.tar")


@pytest.mark.parametrize("cut", [100, 700, 1024, len(GOOD) // 2, END, END + 511])
def test_a_truncated_shard_is_corrupt(cut):
    with pytest.raises(CorruptShard, match="bkt/x.tar"):
        parse_shard(GOOD[:cut], "bkt/x.tar")


def test_garbage_after_the_end_marker_is_corrupt():
    with pytest.raises(CorruptShard, match="after the tar end"):
        parse_shard(GOOD + b"\x01" * 512, "bkt/x.tar")


def test_not_a_tar_at_all_is_corrupt():
    with pytest.raises(CorruptShard):
        parse_shard(b"PK\x03\x04" + b"\x00" * 2000)


def test_two_files_with_one_extension_is_corrupt():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("k.txt", "k.TXT"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(CorruptShard, match="two files"):
        parse_shard(buf.getvalue())


def test_members_are_views_of_the_buffer():
    members = list(iter_members(memoryview(GOOD)))
    assert all(isinstance(d, memoryview) for _, d in members)
    assert len(members) == 3 * len(SAMPLES)
