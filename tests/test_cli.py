"""The command line against a live node: mb, put, get, ls, rm, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid


def _gf(*args, url=None, cwd=None, check=True):
    env = {**os.environ}
    env.pop("GPUFEED_URL", None)
    if url:
        env["GPUFEED_URL"] = url
    out = subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True,
                         env=env, cwd=cwd, timeout=60)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_put_get_ls_rm(node, tmp_path):
    bucket = "cli-" + uuid.uuid4().hex[:8]
    src = tmp_path / "weights.bin"
    src.write_bytes(os.urandom(300_000))
    for url in (node.tcp_url, node.shm_url):
        _gf("mb", bucket, url=url, check=False)
        put = _gf("put", str(src), f"{bucket}/dir/w.bin", url=url)
        assert json.loads(put.stdout)["size"] == 300_000
        _gf("get", f"{bucket}/dir/w.bin", str(tmp_path / "back.bin"), url=url)
        assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
        assert "PRE dir/" in _gf("ls", bucket, url=url).stdout
        assert "dir/w.bin" in _gf("ls", "-r", bucket, url=url).stdout
        assert bucket in _gf("ls", url=url).stdout
        _gf("rm", f"{bucket}/dir/w.bin", url=url)
        assert "w.bin" not in _gf("ls", "-r", bucket, url=url).stdout


def test_cli_errors_are_clear(node, tmp_path):
    out = _gf("ls", "x", check=False)  # no URL anywhere
    assert out.returncode != 0 and "GPUFEED_URL" in out.stderr and "Traceback" not in out.stderr
    out = _gf("get", "no-such-bucket/k", url=node.tcp_url, check=False, cwd=tmp_path)
    assert out.returncode != 0 and "NoSuchBucket" in out.stderr and "Traceback" not in out.stderr
    out = _gf("ls", url="http://127.0.0.1:1", check=False)
    assert out.returncode != 0 and "gpufeed+tcp" in out.stderr and "Traceback" not in out.stderr
    out = _gf("ls", url="gpufeed+tcp://127.0.0.1:1", check=False)
    assert out.returncode != 0 and "cannot connect" in out.stderr and "Traceback" not in out.stderr


def test_checkpoint_ls_and_scrub(node):
    import torch

    from gpufeed.ai import checkpoint as ck
    from gpufeed.client import Client

    url = f"{node.tcp_url}/cli-ckpt/{uuid.uuid4().hex[:8]}"
    ck.save({"w": torch.arange(1 << 16, dtype=torch.float32)}, url, step=4, async_=False)
    assert json.loads(_gf("checkpoint", "ls", url, "--json").stdout) == {"steps": [4]}
    ok = json.loads(_gf("checkpoint", "scrub", url, "--json").stdout)
    assert ok["ok"] and ok["chunks_checked"] == 2 and ok["corrupt"] == []
    loc = ck.parse_checkpoint_url(url)
    with Client(node.tcp_url) as c:
        key = next(e.key for e in c.list(loc.bucket, prefix=loc.key("chunks/")) if e.size == 1 << 18)
        c.put(loc.bucket, key, bytes(1 << 18))
    bad = _gf("checkpoint", "scrub", url, check=False)
    assert bad.returncode == 1 and f"corrupt: {key}" in bad.stdout and "damaged steps [4]" in bad.stdout
