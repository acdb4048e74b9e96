"""``gpufeed bench model --size small``: its own node, the demo's ~57 MB model,
warm rows then cold rows in the JSON shape of ``bench io``."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from gpufeed.bench.model import run_model_bench


@pytest.mark.slow
def test_small_model_bench(tmp_path):
    out = io.StringIO()
    paths = ["shm", "shm_map", "tcp", "s3", "local_load_file", "local_load_file_lazy", "runai",
             "fastsafetensors", "readinto"]
    report = run_model_bench(size="small", workdir=tmp_path, json_path=tmp_path / "m.json",
                             repeat=1, cold_repeat=1, paths=paths, first_loads=1,
                             console=Console(file=out, width=120))
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(report))
    rows = report["results"]
    caches = [r["cache"] for r in rows]
    assert caches == sorted(caches, key=lambda c: c != "warm") and "cold" in caches
    measured = [r["path"] for r in rows if r["cache"] == "warm"]
    skipped = [n for n in report["notes"] if "skipped" in n]
    assert len(measured) + len(skipped) == len(paths)
    for r in rows:
        assert {"path", "cache", "seconds", "gbps"} <= set(r)
        assert r["seconds"] > 0 and r["gbps"] > 0
        assert r["verified"] in (True, None)
    assert {t["target"].split(",")[0] for t in report["targets"]} >= {"shm vs s3"}
    # one fresh-process load per way, each of the whole model
    ways = {r["way"] for r in report["first_load"]}
    assert {"shm, region pool on", "shm, region pool off", "shm zero-copy", "tcp",
            "load_file + clone", "load_file pread"} <= ways
    model_bytes = report["model"]["bytes"]
    assert {r["bytes"] for r in report["first_load"]} == {model_bytes}  # every tensor, every way
    fresh = [t for t in report["targets"] if "fresh process" in t["target"]]
    assert {t["target"].split(" vs ")[0] for t in fresh} == {
        "shm, region pool on", "shm, region pool off", "shm zero-copy"}
    assert {t["target"] for t in report["targets"]} >= {
        "shm_map vs s3, warm", "shm_map vs s3, cold"}
    assert not list(tmp_path.glob("bench-model-*"))  # node data removed
