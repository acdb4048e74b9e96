"""``gpufeed bench kv`` at a tiny size: the in_memory limit row and each cached
row's TTFT as a ratio to it, beside the ratio to recompute."""

from __future__ import annotations

import json

import pytest

from gpufeed.bench.kv import run_kv_bench


@pytest.mark.slow
def test_tiny_kv_bench_reports_the_in_memory_limit(tmp_path):
    report = run_kv_bench(tokens=512, layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256,
                          vocab=1000, new_tokens=2, repeat=1, io_size=1 << 20, clients=0,
                          chunk_tokens=128, json_path=str(tmp_path / "kv.json"), quiet=True)
    assert json.loads((tmp_path / "kv.json").read_text()) == json.loads(json.dumps(report))
    rows = {r["path"]: r for r in report["results"]}
    assert list(rows)[:2] == ["recompute", "in_memory"]
    mem = rows["in_memory"]
    assert mem["cached_tokens"] == report["params"]["cached_tokens"] == 384
    assert mem["same_output"] is True and mem["ttft_s"] > 0 and mem["runs"] == 2 * 3
    assert mem["speedup"] == pytest.approx(rows["recompute"]["ttft_s"] / mem["ttft_s"])
    for path in ("cached_shm", "cached_tcp"):
        r = rows[path]
        assert r["same_output"] is True
        assert r["ttft_vs_in_memory"] == pytest.approx(r["ttft_s"] / r["in_memory_ttft_s"])
        assert mem["ttft_s"] <= r["in_memory_ttft_s"]  # the row: best of every in-memory run
        assert r["speedup"] == pytest.approx(rows["recompute"]["ttft_s"] / r["ttft_s"])
    targets = {t["target"]: t for t in report["targets"]}
    assert set(targets) == {"cached_shm TTFT / in_memory TTFT", "cached_tcp TTFT / in_memory TTFT"}
    for t in targets.values():
        assert t["compare"] == "<=" and t["want"] == 1.1 and t["met"] == (t["got"] <= 1.1)
    assert report["command"].startswith("gpufeed bench kv --tokens 512 ")
