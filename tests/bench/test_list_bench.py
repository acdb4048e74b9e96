"""``gpufeed bench list`` at a small size (CI never builds the 1,000,000-object case):
every row lists the whole target directory, and the JSON holds the targets."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpufeed.cli import main


def test_small_list_bench(tmp_path):
    out = tmp_path / "list.json"
    result = CliRunner().invoke(main, ["bench", "list", "--dirs", "12", "--per-dir", "40", "--repeat", "2",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["benchmark"] == "list" and report["params"]["target_prefix"] == "dir00006/"
    rows = {r["bucket"]: r for r in report["results"]}
    assert list(rows) == ["general_small", "directory_small", "directory_big", "general_big"]
    assert rows["directory_big"]["objects"] == rows["general_big"]["objects"] == 12 * 40
    assert rows["directory_small"]["objects"] == 40 and rows["directory_small"]["kind"] == "directory"
    assert all(r["listed"] == 40 and r["engine_s"] > 0 and r["s3_s"] > 0 for r in rows.values())
    assert rows["general_small"]["engine_vs_baseline"] == 1.0
    assert {t["target"] for t in report["targets"]} == {
        "directory_big / directory_small, S3 ListObjectsV2", "directory_big / directory_small, engine list_objects"}
