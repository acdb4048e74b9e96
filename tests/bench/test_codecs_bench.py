"""``gpufeed bench codecs`` at a small size: every row is there, random bf16 is skipped,
the corpus compresses, and the JSON holds the skip-cost target."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpufeed.cli import main


def test_small_codecs_bench(tmp_path):
    out = tmp_path / "codecs.json"
    result = CliRunner().invoke(main, ["bench", "codecs", "--size", "4MiB", "--chunk", "1MiB", "--codecs",
                                       "lz4,zstd:1", "--repeat", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["benchmark"] == "codecs" and report["params"]["chunk"] == 1 << 20
    rows = {(r["data"], r["codec"]): r for r in report["results"]}
    assert set(rows) == {(d, c) for d in ("corpus", "bf16_random", "bf16_normal") for c in ("lz4", "zstd:1")}
    assert all(r["chunks"] == 4 for r in rows.values())
    assert rows[("corpus", "lz4")]["ratio"] > 1.5 and rows[("corpus", "zstd:1")]["ratio"] > 2.5
    assert rows[("corpus", "zstd:1")]["skipped"] == 0 and rows[("corpus", "zstd:1")]["decompress_gbps"] > 0
    for codec in ("lz4", "zstd:1"):
        r = rows[("bf16_random", codec)]
        assert r["skipped"] == 4 and r["ratio"] == 1.0 and r["decompress_gbps"] is None
        assert r["skip_cost_vs_raw_write"] is not None
    assert rows[("bf16_normal", "zstd:1")]["ratio"] > 1.2 and rows[("bf16_normal", "lz4")]["skipped"] == 4
    assert {d["what"] for d in report["digests"]} >= {"xxh3-128 (chunk_digest)",
                                                      "block_sums (running CRC32C per 4 KiB)"}
    assert [c["avg_size"] for c in report["cdc"]] == [64 << 10, 256 << 10, 1 << 20]
    assert report["targets"][0]["target"] == "skip of random bf16 chunks, time vs writing them raw"


def test_codecs_bench_refuses_bad_settings():
    result = CliRunner().invoke(main, ["bench", "codecs", "--size", "8MiB", "--codecs", "zstd:30"])
    assert result.exit_code == 1 and "InvalidArgument" in result.output
