"""The engine's shared open-file cache: deleted and overwritten versions give their
disk space back once their last reader is done, over the fast path and S3."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from gpufeed.client import Client

MiB = 1 << 20


def deleted_held(pid: int) -> list[str]:
    """Files the process holds open that were unlinked."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.endswith(" (deleted)") and "/blobs/" in target:
            out.append(target)
    return out


def wait_released(pid: int, timeout_s: float = 2.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        held = deleted_held(pid)
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.02)


def blob_bytes(data_dir) -> int:
    total = 0
    for root, _dirs, files in os.walk(os.path.join(data_dir, "blobs")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_deleted_and_overwritten_versions_release_their_files(node, transport):
    url = node.tcp_url if transport == "tcp" else node.shm_url
    bucket = "openfiles-" + uuid.uuid4().hex[:8]
    pid = node.proc.pid
    with Client(url) as c:
        c.create_bucket(bucket)
        keys = [f"k{i}" for i in range(20)]
        for k in keys:
            c.put(bucket, k, os.urandom(MiB))
        buf = c.alloc(MiB) if transport == "shm" else bytearray(MiB)
        for k in keys:
            assert c.get_into(bucket, k, buf) == MiB  # the node now caches each file open
        for k in keys[:10]:
            c.put(bucket, k, b"new")  # overwrite: the old version must go
        for k in keys[10:]:
            c.delete(bucket, k)
        assert wait_released(pid) == []
        assert [e.key for e in c.list(bucket)] == keys[:10]
        for k in keys[:10]:
            assert c.get(bucket, k) == b"new"
            c.delete(bucket, k)
        assert wait_released(pid) == []


def test_s3_reads_share_the_cache_and_release_on_delete(node, s3):
    bucket = "openfiles-s3-" + uuid.uuid4().hex[:8]
    s3.create_bucket(Bucket=bucket)
    body = os.urandom(2 * MiB)
    s3.put_object(Bucket=bucket, Key="a", Body=body)
    with Client(node.tcp_url) as c:
        assert c.get(bucket, "a") == body  # cached open by the fast path
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == body
    s3.delete_object(Bucket=bucket, Key="a")
    assert wait_released(node.proc.pid) == []


def test_a_reader_keeps_a_deleted_version_until_it_is_done(tmp_path):
    """In-process: a handle taken before the delete still reads the old bytes; the
    file closes when the handle does."""
    from gpufeed.engine import Engine

    with Engine(tmp_path / "d", fsync=False) as e:
        e.create_bucket("bkt")
        e.put_object("bkt", "k", b"old bytes")
        h = e.open_version("bkt", "k")
        e.put_object("bkt", "k", b"new")
        assert os.pread(h.fd, 100, 0) == b"old bytes"
        assert e.open_files() == 1  # forgotten by the cache, still held
        fd = h.fd
        h.close()
        assert e.open_files() == 0
        with pytest.raises(OSError):
            os.fstat(fd)
        with e.open_version("bkt", "k") as h2:
            assert os.pread(h2.fd, 100, 0) == b"new"
        assert e.open_files() == 1  # cached for the next reader
