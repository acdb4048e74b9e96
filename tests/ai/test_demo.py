"""``gpufeed demo --size small`` end to end: its own node, a ~57 MB model, every path."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from gpufeed.bench.demo import run_demo


@pytest.mark.slow
def test_small_demo_end_to_end(tmp_path):
    out = io.StringIO()
    report = run_demo(size="small", workdir=tmp_path / "demo", json_path=tmp_path / "demo.json",
                      repeat=1, console=Console(file=out, width=120))
    assert json.loads((tmp_path / "demo.json").read_text()) == json.loads(json.dumps(report))
    paths = [r["path"] for r in report["results"]]
    assert paths == ["shm", "tcp", "shm_map", "s3", "local_load_file", "readinto"]
    assert {t["target"] for t in report["targets"]} >= {"shm zero-copy vs local load_file"}
    for r in report["results"]:
        assert r["seconds"] > 0 and r["gbps"] > 0 and r["cpu_s_per_gb"] >= 0
        assert r["verified"] in (True, None)
    assert report["model"]["shards"] > 1 and report["model"]["bytes"] > 40e6
    assert "identical" in out.getvalue() and "MISMATCH" not in out.getvalue()
    assert not list((tmp_path / "demo").glob("node-small/gpufeed.sock"))  # node stopped
