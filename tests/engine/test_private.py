"""The data folder is private to the node's user: folders 0700, files 0600,
and a warning at start for anything more open."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from gpufeed.engine import Engine
from gpufeed.engine._private import make_private_dirs, open_paths


@pytest.fixture
def umask_022():
    """The usual umask, so that modes below come from the code, not the test runner."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def test_new_data_folder_is_private(tmp_path, umask_022):
    root = tmp_path / "new" / "data"
    with Engine(root, fsync=False) as eng:
        eng.create_bucket("bkt")
        eng.put_object("bkt", "k", b"x" * 100)
        eng.copy_object("bkt", "k", "bkt", "k2")
        up = eng.create_multipart_upload("bkt", "big")
        eng.upload_part("bkt", "big", up.upload_id, 1, b"p" * 10)
        pw = eng.begin_put("bkt", "pending")  # a temp file being written
        pw.write(b"t")
        assert eng.permission_warnings == []
        modes = _modes(root)
        pw.abort()
    assert modes["."] == 0o700
    names = set(modes)
    assert {"catalog.sqlite3", "catalog.sqlite3-wal", "catalog.sqlite3-shm", "lock", "blobs", "uploads",
            "tmp", f"uploads/{up.upload_id}"} <= names
    assert any(n.startswith("tmp/") for n in names)  # the pending write's file
    assert sum(n.count("/") == 3 and n.startswith("blobs/") for n in names) == 2  # blobs/ab/cd/<id>
    for name, mode in modes.items():
        is_dir = (root / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), f"{name} is {mode:04o}"
    # the folder above the data folder was made by us too: private as well
    assert stat.S_IMODE(os.lstat(root.parent).st_mode) == 0o700


def test_pre_existing_0755_folder_warns(tmp_path, umask_022, caplog):
    root = tmp_path / "data"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    with caplog.at_level(logging.WARNING, logger="gpufeed.engine"):
        eng = Engine(root, fsync=False)
    try:
        (message,) = eng.permission_warnings
        assert str(root) in message and "(0755)" in message and "chmod -R go-rwx" in message
        assert message in caplog.text
        # the folder is left as the administrator set it; what the engine made inside is private
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o755
        assert stat.S_IMODE(os.lstat(root / "catalog.sqlite3").st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(root / "blobs").st_mode) == 0o700
    finally:
        eng.close()


def test_open_file_inside_is_reported_and_counted(tmp_path, umask_022):
    root = tmp_path / "data"
    Engine(root, fsync=False).close()
    os.chmod(root / "catalog.sqlite3", 0o644)
    os.chmod(root / "blobs", 0o755)
    with Engine(root, fsync=False) as eng:
        (message,) = eng.permission_warnings
    assert "catalog.sqlite3 (0644)" in message and "blobs (0755)" in message
    os.chmod(root / "catalog.sqlite3", 0o600)
    os.chmod(root / "blobs", 0o700)
    with Engine(root, fsync=False) as eng:
        assert eng.permission_warnings == []


def test_open_paths_limit_and_sockets(tmp_path, umask_022):
    import socket

    root = tmp_path / "d"
    make_private_dirs(root / "a" / "b")
    for i in range(15):
        (root / f"f{i}").write_bytes(b"")  # 0644 under umask 022
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "sock"))  # sockets are skipped (the fast path replaces its own)
        found, count = open_paths(root, limit=4)
    assert count == 15 and len(found) == 4
    assert all(mode == 0o644 for _, mode in found)
    assert stat.S_IMODE(os.lstat(root / "a").st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(root / "a" / "b").st_mode) == 0o700
