"""The ``gpufeed://`` fsspec filesystem (``gpufeed.client.fs``) against a real
node, over TCP and shm: registration, listing, ranged and batched reads, writes,
buckets as top-level directories, errors, pickling, and fsspec's own shipped
suite (``fsspec.tests.abstract``) for copy/get/put/open/pipe."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from gpufeed.client import Client
from gpufeed.client.fs import URL_ENV, GpufeedFile, GpufeedFileSystem

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["tcp", "shm"])
def fs(request, node) -> GpufeedFileSystem:
    url = node.tcp_url if request.param == "tcp" else node.shm_url
    fs = GpufeedFileSystem(url, **node.credentials, skip_instance_cache=True)
    yield fs
    fs.close()


@pytest.fixture
def bucket(fs) -> str:
    name = "fs-" + uuid.uuid4().hex[:12]
    fs.mkdir(name)
    yield name
    fs.rm(name, recursive=True)


# --- registration -------------------------------------------------------------------------
def test_entry_point_declared_and_found_without_importing_gpufeed(node, tmp_path):
    """The pyproject's ``fsspec.specs`` entry point, installed as package metadata,
    makes ``fsspec.filesystem("gpufeed")`` work in a process that never imported gpufeed."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["fsspec.specs"]
    assert table == {"gpufeed": "gpufeed.client.fs:GpufeedFileSystem"}
    dist = tmp_path / "gpufeed_entry_probe-0.dist-info"  # what pip writes for an installed package
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gpufeed-entry-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[fsspec.specs]\n" + "".join(f"{k} = {v}\n" for k, v in table.items()))
    code = ("import sys, fsspec\n"
            "assert 'gpufeed' not in sys.modules\n"
            "fs = fsspec.filesystem('gpufeed', endpoint=sys.argv[1])\n"
            "fs.mkdir('ep-probe'); fs.pipe('gpufeed://ep-probe/k', b'v')\n"
            "assert fsspec.open('gpufeed://ep-probe/k', endpoint=sys.argv[1]).open().read() == b'v'\n"
            "fs.rm('ep-probe', recursive=True)\n"
            "print(type(fs).__module__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code, node.tcp_url], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gpufeed.client.fs"


def test_node_from_environment(node, monkeypatch):
    monkeypatch.setenv(URL_ENV, node.tcp_url)
    fs = GpufeedFileSystem(skip_instance_cache=True)
    assert fs.endpoint == node.tcp_url
    assert isinstance(fs.ls("", detail=False), list)
    fs.close()


def test_no_node_named_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    with pytest.raises(ValueError, match="GPUFEED_URL"):
        GpufeedFileSystem(skip_instance_cache=True)
    with pytest.raises(ValueError, match="scheme"):
        GpufeedFileSystem("http://127.0.0.1:9000", skip_instance_cache=True)


def test_url_to_fs_and_unstrip(node):
    fs, path = fsspec.url_to_fs("gpufeed://b/k/x.parquet", endpoint=node.tcp_url)
    assert isinstance(fs, GpufeedFileSystem) and path == "b/k/x.parquet"
    assert fs.unstrip_protocol(path) == "gpufeed://b/k/x.parquet"
    assert fs.split_path("gpufeed://b/k/x.parquet") == ("b", "k/x.parquet")


# --- listing and metadata -----------------------------------------------------------------
def test_ls_info_find_glob(fs, bucket):
    fs.pipe({f"{bucket}/a/x.bin": b"x" * 10, f"{bucket}/a/b/y.bin": b"y" * 3, f"{bucket}/top.txt": b"t"})
    assert bucket in fs.ls("", detail=False)
    assert fs.ls(bucket, detail=False) == [f"{bucket}/a", f"{bucket}/top.txt"]
    assert fs.ls(f"gpufeed://{bucket}/a/", detail=False) == [f"{bucket}/a/b", f"{bucket}/a/x.bin"]
    assert fs.ls(f"{bucket}/a/x.bin", detail=False) == [f"{bucket}/a/x.bin"]
    info = fs.info(f"{bucket}/a/x.bin")
    assert info["type"] == "file" and info["size"] == 10 and info["etag"]
    assert info["mtime"].tzinfo is not None and fs.modified(f"{bucket}/a/x.bin") == info["mtime"]
    assert fs.info(f"{bucket}/a")["type"] == "directory"
    assert fs.info(bucket)["type"] == "directory"
    assert fs.isdir(f"{bucket}/a/b") and fs.isfile(f"{bucket}/a/b/y.bin") and not fs.exists(f"{bucket}/a/c")
    assert fs.find(bucket) == [f"{bucket}/a/b/y.bin", f"{bucket}/a/x.bin", f"{bucket}/top.txt"]
    assert fs.find(bucket, withdirs=True) == [bucket, f"{bucket}/a", f"{bucket}/a/b", f"{bucket}/a/b/y.bin",
                                              f"{bucket}/a/x.bin", f"{bucket}/top.txt"]
    assert fs.find(f"{bucket}/a", maxdepth=1) == [f"{bucket}/a/x.bin"]
    assert fs.find(f"{bucket}/a/x.bin") == [f"{bucket}/a/x.bin"]
    assert fs.find(f"{bucket}/nothing") == [] and fs.find(f"{bucket}-missing") == []
    assert fs.glob(f"{bucket}/**/*.bin") == [f"{bucket}/a/b/y.bin", f"{bucket}/a/x.bin"]
    assert fs.glob(f"gpufeed://{bucket}/*.txt") == [f"{bucket}/top.txt"]
    assert fs.du(bucket) == 14
    assert fs.ukey(f"{bucket}/a/x.bin") == info["etag"]


def test_listing_cache_sees_writes_and_deletes(fs, bucket):
    fs.pipe(f"{bucket}/d/one", b"1")
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/one"]
    fs.pipe(f"{bucket}/d/two", b"2")
    with fs.open(f"{bucket}/d/three", "wb") as f:
        f.write(b"3")
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/one", f"{bucket}/d/three", f"{bucket}/d/two"]
    fs.rm(f"{bucket}/d/one")
    assert not fs.exists(f"{bucket}/d/one")
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/three", f"{bucket}/d/two"]


def test_missing_things_are_file_not_found(fs, bucket):
    for path in (f"{bucket}/nope", f"{bucket}-missing", f"{bucket}-missing/k", f"{bucket}/dir/"):
        with pytest.raises(FileNotFoundError):
            fs.info(path)
        with pytest.raises(FileNotFoundError):
            fs.cat_file(path)
        with pytest.raises(FileNotFoundError):
            fs.open(path, "rb")
    for detail in (True, False):
        with pytest.raises(FileNotFoundError):
            fs.ls(f"{bucket}/nope", detail=detail)
    fs.pipe(f"{bucket}/dir/k", b"v")
    with pytest.raises(IsADirectoryError):
        fs.open(f"{bucket}/dir", "rb")
    with pytest.raises(IsADirectoryError):
        fs.cat_file(f"{bucket}/dir")
    with pytest.raises(FileNotFoundError):
        fs.pipe({f"{bucket}/ok": b"1", f"{bucket}-missing/k": b"2"})
    assert fs.cat_file(f"{bucket}/ok") == b"1"
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{bucket}-missing")
    fs.rm(f"{bucket}/nope")  # as S3's DeleteObject (and s3fs): a missing key is no error
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{bucket}/nope/*")  # a pattern matching nothing is


def test_refused_key_is_permission_error(node):
    fs = GpufeedFileSystem(node.tcp_url, access_key="GFNOSUCHKEY", secret_key="wrong-secret",
                           skip_instance_cache=True)
    with pytest.raises(PermissionError):
        fs.ls("")


# --- reads --------------------------------------------------------------------------------
def test_cat_file_follows_slice_rules(fs, bucket):
    data = bytes(range(256)) * 4
    path = f"{bucket}/r.bin"
    fs.pipe_file(path, data)
    for start, end in [(None, None), (0, 10), (10, None), (-10, None), (5, -5), (-20, -10), (1000, 5000),
                       (1024, None), (5000, None), (-5000, 3), (7, 7), (9, 3)]:
        assert fs.cat_file(path, start, end) == data[start:end], (start, end)
    assert fs.cat(path) == data
    assert fs.head(path, 5) == data[:5] and fs.tail(path, 5) == data[-5:]
    fs.pipe_file(f"{bucket}/empty", b"")
    assert fs.cat_file(f"{bucket}/empty") == b""


def test_cat_ranges_batches_many_ranges_and_returns_errors(fs, bucket):
    blobs = {f"{bucket}/s/{i:04d}": os.urandom(1000 + i) for i in range(700)}  # two batches
    fs.pipe(blobs)
    paths = sorted(blobs)
    starts = [i % 50 for i in range(len(paths))]
    ends = [s + 100 for s in starts]
    out = fs.cat_ranges(paths, starts, ends)
    assert out == [blobs[p][s:e] for p, s, e in zip(paths, starts, ends)]
    got = fs.cat_ranges([paths[0], f"{bucket}/s/missing", paths[1], paths[2]], [0, 0, -10, 5000],
                        [10, 10, None, 6000])
    assert got[0] == blobs[paths[0]][:10] and got[2] == blobs[paths[1]][-10:] and got[3] == b""
    assert isinstance(got[1], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges([f"{bucket}/s/missing"], 0, 10, on_error="raise")
    assert fs.cat([paths[0], paths[1]]) == {paths[0]: blobs[paths[0]], paths[1]: blobs[paths[1]]}
    assert fs.cat(f"{bucket}/s/000*") == {p: blobs[p] for p in paths[:10]}
    assert fs.cat(f"{bucket}/s", recursive=True) == blobs
    assert fs.cat_ranges(paths[:3], -5, None) == [blobs[p][-5:] for p in paths[:3]]  # sizes: heads in flight
    with pytest.raises(FileNotFoundError):
        fs.cat([paths[0], f"{bucket}/s/missing"])
    got = fs.cat([paths[0], f"{bucket}/s/missing"], on_error="return")
    assert isinstance(got[f"{bucket}/s/missing"], FileNotFoundError)
    assert fs.cat([paths[0], f"{bucket}/s/missing"], on_error="omit") == {paths[0]: blobs[paths[0]]}


def test_open_read_seek_readinto_and_large_reads(fs, bucket):
    data = os.urandom(3 << 20) + b"line one\nline two\n"
    path = f"{bucket}/big.bin"
    fs.pipe_file(path, data)
    with fs.open(path, "rb", block_size=1 << 20) as f:
        assert isinstance(f, GpufeedFile) and f.size == len(data)
        assert f.read(10) == data[:10]
        f.seek(-18, 2)
        assert f.readline() == b"line one\n" and list(f) == [b"line two\n"]
        f.seek(100)
        buf = bytearray(2 << 20)  # >= block_size: straight into the buffer
        assert f.readinto(buf) == len(buf) and buf == data[100:100 + len(buf)]
        assert f.tell() == 100 + len(buf)
        small = bytearray(10)
        assert f.readinto(small) == 10 and small == data[f.tell() - 10:f.tell()]
        f.seek(5)
        rest = f.read()
        assert rest == data[5:] and isinstance(rest, bytes)
        assert f.read() == b"" and f.readinto(bytearray(4 << 20)) == 0
    with fs.open(path, "rb", cache_type="bytes") as f:
        f.seek(len(data) - 3)
        assert f.read(100) == data[-3:]


def test_text_mode_and_fsspec_open(fs, bucket, node):
    with fs.open(f"{bucket}/t.txt", "w") as f:
        f.write("héllo\nwörld\n")
    with fs.open(f"{bucket}/t.txt", "r") as f:
        assert f.read().splitlines() == ["héllo", "wörld"]
    with fsspec.open(f"gpufeed://{bucket}/t.txt", "rt", endpoint=fs.endpoint, **node.credentials) as f:
        assert f.readline() == "héllo\n"


# --- writes -------------------------------------------------------------------------------
def test_write_modes(fs, bucket):
    path = f"{bucket}/w/obj"
    with fs.open(path, "wb", block_size=1 << 16) as f:
        for _ in range(40):  # past block_size many times: still one put at close
            f.write(b"a" * 10_000)
        assert not fs.exists(path)  # nothing is visible before close
    assert fs.cat_file(path) == b"a" * 400_000
    with fs.open(path, "ab") as f:
        assert f.tell() == 400_000
        f.write(b"tail")
    assert fs.cat_file(path, -6) == b"aatail" and fs.size(path) == 400_004
    with fs.open(f"{bucket}/w/new", "ab") as f:
        f.write(b"fresh")
    assert fs.cat_file(f"{bucket}/w/new") == b"fresh"
    with pytest.raises(FileExistsError):
        fs.open(path, "xb")
    with fs.open(f"{bucket}/w/x", "xb") as f:
        f.write(b"x")
    assert fs.cat_file(f"{bucket}/w/x") == b"x"
    with pytest.raises(FileExistsError):
        fs.pipe_file(path, b"no", mode="create")
    fs.pipe_file(f"{bucket}/w/from-view", memoryview(b"0123456789")[2:6])
    assert fs.cat_file(f"{bucket}/w/from-view") == b"2345"
    fs.touch(f"{bucket}/w/empty")
    assert fs.size(f"{bucket}/w/empty") == 0
    fs.write_text(f"{bucket}/w/text", "ok")
    assert fs.read_text(f"{bucket}/w/text") == "ok"


def test_failed_write_leaves_nothing(fs, bucket):
    path = f"{bucket}/w/failed"
    with pytest.raises(RuntimeError):
        with fs.open(path, "wb") as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    assert not fs.exists(path)
    fs.pipe_file(path, b"old")
    with pytest.raises(RuntimeError):
        with fs.open(path, "ab") as f:
            f.write(b" and new")
            raise RuntimeError("boom")
    assert fs.cat_file(path) == b"old"


def test_put_get_copy_move(fs, bucket, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(5 << 20))
    (src / "sub" / "b.txt").write_bytes(b"bee")
    (src / "sub" / "empty").write_bytes(b"")
    fs.put(str(src), f"{bucket}/up", recursive=True)
    assert fs.find(f"{bucket}/up") == [f"{bucket}/up/a.bin", f"{bucket}/up/sub/b.txt", f"{bucket}/up/sub/empty"]
    dst = tmp_path / "dst"
    fs.get(f"{bucket}/up", str(dst), recursive=True)
    for rel in ("a.bin", "sub/b.txt", "sub/empty"):
        assert (dst / rel).read_bytes() == (src / rel).read_bytes(), rel
    fs.get_file(f"{bucket}/up/a.bin", str(tmp_path / "one.bin"))
    assert (tmp_path / "one.bin").read_bytes() == (src / "a.bin").read_bytes()
    fs.copy(f"{bucket}/up/sub/b.txt", f"{bucket}/copied.txt")
    fs.mv(f"{bucket}/copied.txt", f"{bucket}/moved.txt")
    assert fs.cat_file(f"{bucket}/moved.txt") == b"bee" and not fs.exists(f"{bucket}/copied.txt")


# --- buckets, directories, deletes --------------------------------------------------------
def test_buckets_are_top_level_directories(fs):
    name = "fs-" + uuid.uuid4().hex[:12]
    fs.mkdir(name)
    assert fs.isdir(name) and name in fs.ls("", detail=False) and fs.ls(name) == []
    with pytest.raises(FileExistsError):
        fs.mkdir(name)
    fs.makedirs(name, exist_ok=True)
    fs.makedirs(f"{name}/deeper/dir", exist_ok=True)  # implied directories: nothing to make
    fs.pipe(f"{name}/d/k", b"v")
    with pytest.raises(OSError) as exc:
        fs.rmdir(name)
    assert exc.value.errno == 39  # ENOTEMPTY
    with pytest.raises(OSError):
        fs.rmdir(f"{name}/d")
    with pytest.raises(OSError):
        fs.rm(name)  # a non-empty bucket without recursive
    fs.rm(f"{name}/d", recursive=True)
    assert fs.ls(name) == []
    fs.rmdir(name)
    assert not fs.exists(name)
    with pytest.raises(FileNotFoundError):
        fs.rmdir(name)
    other = "fs-" + uuid.uuid4().hex[:12]
    fs.makedirs(f"{other}/x/y")  # creates the bucket
    fs.pipe(f"{other}/x/y/z", b"1")
    fs.rm(other, recursive=True)
    assert not fs.exists(other)
    with pytest.raises(FileNotFoundError):
        fs.mkdir(f"{other}/x", create_parents=False)


# --- lifecycle ----------------------------------------------------------------------------
def test_pickles_and_reconnects(fs, bucket):
    fs.pipe(f"{bucket}/p", b"pickled")
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.cat_file(f"{bucket}/p") == b"pickled"
    fs.client.close()  # a closed (or lost) client is replaced on next use
    assert fs.cat_file(f"{bucket}/p") == b"pickled"


def test_forked_child_opens_its_own_connection(fs, bucket):
    fs.pipe(f"{bucket}/f", b"forked")
    assert isinstance(fs.client, Client)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os._exit(0 if fs.cat_file(f"{bucket}/f") == b"forked" else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert fs.cat_file(f"{bucket}/f") == b"forked"


# --- fsspec's own suite -------------------------------------------------------------------
class TestFsspecAbstractSuite(AbstractFixtures, AbstractCopyTests, AbstractGetTests, AbstractPutTests,
                              AbstractOpenTests, AbstractPipeTests):
    """fsspec's shipped behavioural tests (``fsspec.tests.abstract``) over TCP,
    as s3fs runs them: objects have no empty directories."""

    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, node):
        fs = GpufeedFileSystem(node.tcp_url, **node.credentials, skip_instance_cache=True)
        yield fs
        fs.close()

    @pytest.fixture
    def fs_join(self):
        return lambda *args: "/".join(args)

    @pytest.fixture
    def fs_path(self, fs):
        name = "fsabs-" + uuid.uuid4().hex[:12]
        fs.mkdir(name)
        yield name
        fs.rm(name, recursive=True)

    @pytest.fixture
    def supports_empty_directories(self):
        return False


def _damage(node, data: bytes) -> None:
    """Flip a byte of the node's data file that holds ``data`` (a raw object is one file of its bytes)."""
    target = next(p for p in Path(node.data_dir, "blobs").rglob("*")
                  if p.is_file() and p.stat().st_size == len(data) and p.read_bytes() == data)
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 1
    target.write_bytes(damaged)


def test_damaged_object_is_an_oserror_and_leaves_no_file(fs, bucket, node, tmp_path):
    path = f"{bucket}/damaged.bin"
    data = os.urandom(300_001)
    fs.pipe(path, data)
    _damage(node, data)
    with pytest.raises(OSError) as got:
        fs.cat(path)
    assert "damaged" in str(got.value) and got.value.__cause__ is not None
    with pytest.raises(OSError):
        with fs.open(path, "rb") as f:
            f.read()
    dest = tmp_path / "damaged.bin"
    with pytest.raises(OSError):
        fs.get(path, str(dest))
    assert not dest.exists()  # never a file of unread bytes


def test_a_node_that_is_gone_is_a_connection_error_naming_the_path(tmp_path):
    from gpufeed.errors import TransportError
    from gpufeed.testing.node import start_node

    n = start_node(tmp_path / "node")
    fs = GpufeedFileSystem(n.tcp_url, **n.credentials, skip_instance_cache=True)
    try:
        fs.mkdir("gone-node")
        fs.pipe("gone-node/k", b"v")
        n.stop()
        for call in (fs.cat_file, fs.info, fs.ls):
            with pytest.raises(ConnectionError, match="gone-node/k: ") as info:
                call("gone-node/k")
            assert isinstance(info.value, TransportError) and isinstance(info.value.__cause__, TransportError)
    finally:
        fs.close()
        n.stop()
