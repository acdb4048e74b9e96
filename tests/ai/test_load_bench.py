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
                             repeat=1, cold_repeat=1, paths=paths, first_loads=1, sweep=False,
                             console=Console(file=out, width=120))
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(report))
    rows = report["results"]
    caches = [r["cache"] for r in rows]
    assert caches == sorted(caches, key=lambda c: c != "warm") and "cold" in caches
    measured = {r["path"] for r in rows if r["cache"] == "warm"}  # a peer: one row per setting
    skipped = [n for n in report["notes"] if "skipped" in n]
    assert len(measured) + len(skipped) == len(paths)
    _check_peer_settings(report)
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


def _check_peer_settings(report: dict) -> None:
    """Each swept peer: one row per setting and cache, every row naming its setting,
    exactly one best per cache; the fresh-process load uses the best warm one."""
    from gpufeed.bench.peers import FST_THREADS, RUNAI_DEFAULT_CONCURRENCY, RUNAI_SETTINGS

    rows = report["results"]
    sweeps = report["params"]["sweeps"]
    if "--no-sweep" in report["command"]:  # each peer at its default concurrency, runai under each strategy
        assert sweeps["fastsafetensors"]["max_threads"] == [FST_THREADS[0]]
        assert [s["RUNAI_STREAMER_CONCURRENCY"] for s in sweeps["runai"]] == \
            [[RUNAI_DEFAULT_CONCURRENCY]] * len(RUNAI_SETTINGS)
    else:
        assert sweeps["fastsafetensors"]["max_threads"] == list(FST_THREADS)
    for r in rows:
        assert (r["setting"] is None) == (r["path"] not in ("runai", "fastsafetensors"))
    expected = {"runai": sum(len(s["RUNAI_STREAMER_CONCURRENCY"]) for s in sweeps["runai"]),
                "fastsafetensors": len(sweeps["fastsafetensors"]["max_threads"])}
    for path, n in expected.items():
        for cache in ("warm", "cold"):
            mine = [r for r in rows if r["path"] == path and r["cache"] == cache]
            if not mine:  # not installed: skipped
                continue
            assert len(mine) == n and len({r["setting"] for r in mine}) == n
            best = [r for r in mine if r["best_setting"]]
            assert len(best) == 1 and best[0]["gbps"] == max(r["gbps"] for r in mine)
            if cache == "warm":
                assert all(r["verified"] is True for r in mine)
                fresh = {r["setting"] for r in report["first_load"] if r["path"] == path}
                assert fresh == {best[0]["setting"]}
    runai = [r["setting"] for r in rows if r["path"] == "runai"]
    if runai:
        assert any("RUNAI_STREAMER_FS_STRATEGY=unset" in s and "CONCURRENCY=16" in s for s in runai)
        assert any("RUNAI_STREAMER_FS_STRATEGY=sync_buffered" in s for s in runai)
    assert report["params"]["sweep_repeat"] >= 1
