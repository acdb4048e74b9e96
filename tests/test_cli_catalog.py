"""``gpufeed serve`` on a damaged catalog, and ``gpufeed catalog check|recover``, as an
operator runs them (subprocesses); the recovered node serves what was saved through boto3."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.engine import Engine
from gpufeed.testing.node import start_node

BUCKET = "salvage"
N = 400


def _gf(*args, env=None, timeout_s=60):
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout_s)


def _body(key: str) -> bytes:
    return f"the bytes of {key}".encode() * 10


@pytest.fixture
def damaged(tmp_path) -> Path:
    """A data folder of N objects whose catalog has a page of garbage in the middle of
    the objects table."""
    d = tmp_path / "data"
    with Engine(d, fsync=False) as e:
        e.create_bucket(BUCKET)
        for i in range(N):
            e.put_object(BUCKET, f"obj/{i:05d}", _body(f"obj/{i:05d}"))
    cat = d / "catalog.sqlite3"
    db = sqlite3.connect(f"file:{cat}?mode=ro", uri=True)
    leaves = [r[0] for r in db.execute(
        "SELECT pageno FROM dbstat WHERE name='objects' AND pagetype='leaf' ORDER BY path")]
    db.close()
    with open(cat, "r+b") as f:
        f.seek((leaves[len(leaves) // 2] - 1) * 4096)
        f.write(b"\x77" + bytes(range(256)) * 15 + bytes(255))  # no b-tree page type: garbage
    return d


def test_serve_refuses_a_damaged_catalog_in_one_paragraph(damaged):
    before = (damaged / "catalog.sqlite3").read_bytes()
    out = _gf("serve", "--data-dir", str(damaged), "--s3-port", "0", "--port", "0", "--socket", "")
    assert out.returncode == 1
    assert out.stdout == ""  # no endpoints line: the node never started
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: CatalogDamaged: the catalog ")
    assert f"gpufeed catalog recover --data-dir {damaged.resolve()}" in lines[0]
    assert (damaged / "catalog.sqlite3").read_bytes() == before


def test_check_recover_then_the_node_serves_the_salvaged_objects(damaged):
    out = _gf("catalog", "check", "--data-dir", str(damaged))
    assert out.returncode == 1 and "DAMAGED" in out.stdout and "gpufeed catalog recover" in out.stdout
    out = _gf("catalog", "check", "--data-dir", str(damaged), "--json", "--level", "quick")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["ok"] is False and report["problems"]

    out = _gf("catalog", "recover", "--data-dir", str(damaged), "--json")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    objects = next(t for t in rec["tables"] if t["table"] == "objects")
    assert rec["recovered"] and objects["damaged"] and 0 < objects["rows"] < N
    assert rec["moved"]["blobs"] == N - objects["rows"]
    assert rec["after"]["ok"]
    kept = Path(rec["kept"][0])
    assert kept.exists() and kept.name.startswith("catalog.sqlite3.damaged-")
    moved = [p for p in Path(rec["lost_found"]).rglob("*") if p.is_file()]
    assert len(moved) == N - objects["rows"]

    assert _gf("catalog", "check", "--data-dir", str(damaged)).returncode == 0
    out = _gf("catalog", "recover", "--data-dir", str(damaged))
    assert out.returncode == 0 and "nothing recovered" in out.stdout

    node = start_node(damaged, extra_args=["--catalog-check", "full"])
    try:
        s3 = node.boto3_client()
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            keys += [o["Key"] for o in page.get("Contents", [])]
        assert len(keys) == objects["rows"]
        for key in keys[::37]:
            assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == _body(key)
        s3.close()
    finally:
        assert node.stop() == 0
    # what was moved aside is still there after the node's start-up sweep
    assert len([p for p in Path(rec["lost_found"]).rglob("*") if p.is_file()]) == N - objects["rows"]


def test_recover_prints_a_readable_report(damaged):
    out = _gf("catalog", "recover", "--data-dir", str(damaged))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "kept the damaged file" in text and "lost+found" in text
    assert "objects" in text and "(damaged)" in text and "passes the full check" in text


def test_the_check_level_is_validated():
    out = _gf("serve", "--catalog-check", "sometimes")
    assert out.returncode == 2 and "quick" in out.stderr


def test_recover_of_an_unreadable_catalog_fails_loudly(damaged):
    """Nothing readable: a fresh catalog, every data file kept in lost+found,
    and exit 1 with a message saying so (never a quiet success)."""
    (damaged / "catalog.sqlite3").write_bytes(b"not a database at all\n" * 500)
    for p in damaged.glob("catalog.sqlite3-*"):
        p.unlink()
    out = _gf("catalog", "recover", "--data-dir", str(damaged))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "nothing could be read" in out.stderr and "lost+found" in out.stderr
    assert "Traceback" not in out.stderr
    assert any((damaged / "lost+found").rglob("*"))
