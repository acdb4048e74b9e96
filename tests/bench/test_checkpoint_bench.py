"""``gpufeed bench checkpoint`` at a tiny size: the peer (DCP's FileSystemWriter)
at every setting, each row naming it, and the ratios against its best."""

from __future__ import annotations

import json

import pytest

from gpufeed.bench.checkpoint import FS_THREAD_COUNTS, run_checkpoint_bench


@pytest.mark.slow
def test_tiny_checkpoint_bench_compares_with_the_peer_at_its_best(tmp_path):
    report = run_checkpoint_bench(size=8 << 20, versions=2, repeat=1, json_path=str(tmp_path / "c.json"),
                                  data_dir=str(tmp_path / "data"), quiet=True)
    assert json.loads((tmp_path / "c.json").read_text()) == json.loads(json.dumps(report))
    rows = report["results"]
    assert [r["path"] for r in rows[:2]] == ["gpufeed", "gpufeed_tcp"]
    fs = [r for r in rows if r["path"] == "dcp_fs"]
    assert [r["setting"] for r in fs[:len(FS_THREAD_COUNTS)]] == [
        f"thread_count={t}" for t in FS_THREAD_COUNTS]
    stager = fs[-1]
    assert len(fs) == len(FS_THREAD_COUNTS) + 1 and "async_stager=DefaultStager" in stager["setting"]
    assert stager["save_gbps"] is None and stager["background_staging"] is True
    assert all(r["setting"] for r in rows)
    best = report["peer_best"]
    measured = [r for r in fs if r["save_gbps"] is not None]
    assert best["save"]["save_gbps"] == max(r["save_gbps"] for r in measured)
    assert best["async_stall"]["async_block_s"] == min(r["async_block_s"] for r in fs)
    assert best["default"]["setting"] == "thread_count=1"
    for r in rows:
        if r["save_gbps"] is not None:
            assert r["save_vs_peer_best"] == pytest.approx(r["save_gbps"] / best["save"]["save_gbps"])
        assert r["async_block_vs_peer_best"] == pytest.approx(
            r["async_block_s"] / best["async_stall"]["async_block_s"])
    assert report["dedup"]["versions"] == 2
    assert not list((tmp_path / "data").glob("fs-*"))  # every FileSystemWriter folder removed
