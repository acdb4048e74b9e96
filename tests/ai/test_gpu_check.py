"""``gpufeed bench gpu`` (the GPU check): its CPU fallback end to end with the demo's
small model and a real node, and the clean exit on a machine without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from gpufeed.bench.gpu import PATHS, resolve_device
from gpufeed.cli import main

ROOT = Path(__file__).resolve().parents[2]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.mark.slow
def test_cpu_fallback_end_to_end(tmp_path):
    out = tmp_path / "gpu.json"
    res = CliRunner().invoke(main, ["bench", "gpu", "--device", "cpu", "--size", "small",
                                    "--repeat", "1", "--kv-tokens", "1024",
                                    "--workdir", str(tmp_path / "work"), "--json", str(out)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gpu" and report["failures"] == []
    assert report["command"].startswith("gpufeed bench gpu --device cpu --size small --repeat 1")
    assert report["device"]["device"] == "cpu" and report["device"]["torch"] == torch.__version__
    assert "cuda" in report["device"] and report["model"]["shards"] > 1
    rows = {r["path"]: r for r in report["results"]}
    skipped = [n for n in report["notes"] if "skipped" in n]
    loads = [p for p in PATHS if p in rows]
    assert len(loads) + len(skipped) == len(PATHS)
    assert {"shm", "tcp", "shm_map", "s3", "load_file", "host_to_device"} <= set(loads)
    assert {"checkpoint_save", "checkpoint_async_save", "checkpoint_load", "kv_put",
            "kv_reload_shm", "kv_reload_tcp"} <= set(rows)
    for r in report["results"]:
        assert r["seconds"] > 0 and r["gbps"] > 0 and r["bytes"] > 0, r
        assert r["kind"] in ("load", "limit", "checkpoint", "kv")
    model_bytes = report["model"]["bytes"]
    for p in loads:  # every tensor, bit for bit as in the files
        assert rows[p]["bytes"] == model_bytes
        assert rows[p]["verified"] is (None if p == "host_to_device" else True), p
    assert rows["load_file"]["vs_load_file"] == 1.0
    assert rows["checkpoint_save"]["verified"] is rows["checkpoint_load"]["verified"] is True
    assert rows["checkpoint_async_save"]["bytes_written"] > 0  # changed weights: not deduplicated
    assert 0 <= rows["checkpoint_async_save"]["block_s"] <= rows["checkpoint_async_save"]["seconds"]
    assert rows["kv_reload_shm"]["verified"] is rows["kv_reload_tcp"]["verified"] is True
    assert rows["kv_reload_shm"]["tokens"] == 1024
    assert not list((tmp_path / "work").glob("bench-gpu-*"))  # node stopped, data removed


@no_cuda
def test_no_cuda_says_so_and_exits_0(tmp_path):
    out = tmp_path / "gpu.json"
    res = CliRunner().invoke(main, ["bench", "gpu", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("no CUDA device: ") and "--device cpu" in res.output
    assert not out.exists()


@no_cuda
def test_script_without_cuda_exits_0(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--json",
                          str(tmp_path / "gpu.json")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("no CUDA device: ")
    assert not (tmp_path / "gpu.json").exists()


@no_cuda
def test_resolve_device_without_cuda():
    assert resolve_device("cpu") == ("cpu", "")
    dev, why = resolve_device(None)
    assert dev is None and "CPU-only build" in why or "no usable GPU" in why
    dev, why = resolve_device("cuda:0", allow_cpu=True)
    assert dev == "cpu" and why.startswith("no CUDA device: ")
    with pytest.raises(ValueError, match="cpu or cuda"):
        resolve_device("tpu")
