"""``gpufeed bench report``: the page over the real ``docs/bench`` results and over
synthetic ones (a ``train`` run, an unknown kind, broken files); and the page
opened in headless Chromium, where every plot must render."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpufeed.bench import _report_kinds
from gpufeed.bench._report_kinds import VIEWS, build_section
from gpufeed.bench.report import Source, load_sources, render_page, write_report
from gpufeed.cli import main

pytest.importorskip("matplotlib")

DOCS_BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
PATHS = ("gpufeed", "local", "s3_boto3", "s3fs", "s3torchconnector")
MACHINE = {"cpus": 2, "cpu_model": "Test CPU", "mem_gib": 8.0, "kernel": "6.1", "python": "3.11.7"}


def _train() -> dict:
    """A ``bench train --json`` report: AU falls as accelerators grow, later for gpufeed."""
    rows = []
    most = {"gpufeed": 8, "local": 8, "s3_boto3": 2, "s3fs": 2, "s3torchconnector": 4}
    for wl in ("unet3d", "cosmoflow"):
        for p in PATHS:
            for n in (1, 2, 4, 8, 16):
                rows.append({"workload": wl, "path": p, "accelerators": n,
                             "au": min(0.99, 0.99 * most[p] * 1.1 / n), "max_accelerators_au_ok": most[p],
                             "gbps": 0.1 * most[p] * min(n, most[p]), "cpu_s_per_gb": 2.0 / most[p],
                             "client_cpu_s_per_gb": 1.0 / most[p] ** 2})
    return {"benchmark": "train", "command": "gpufeed bench train --scale 0.01 --json train.json",
            "machine": MACHINE, "params": {"scale": 0.01}, "results": rows,
            "targets": [{"target": "unet3d accelerators vs boto3", "compare": ">=", "want": 2.0, "got": 4.0,
                         "met": True}]}


def _unknown() -> dict:
    return {"benchmark": "frobnicate", "machine": MACHINE, "objects": 7, "label": "x < y & z",
            "results": [{"path": "fast", "gbps": 3.0, "extra": {"deep": [1]}}, {"path": "slow", "gbps": 1.5}],
            "nested": {"a": {"b": 1}, "c": 2}, "values": [1, [2, 3], "four"],
            "targets": [{"target": "fast vs slow", "want": 1.5, "got": 2.0, "met": True}]}


def _synthetic(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.json").write_text(json.dumps(_train()))
    (folder / "frobnicate.json").write_text(json.dumps(_unknown()))
    (folder / "a-list.json").write_text("[1, 2, 3]")
    (folder / "empty.json").write_text("{}")
    (folder / "broken.json").write_text("{not json")
    (folder / "kv-odd.json").write_text(json.dumps({"benchmark": "kv", "results": "none today"}))
    (folder / "io-odd.json").write_text(json.dumps({"benchmark": "io", "params": {"size_bytes": 1024, "repeat": 1},
                                                    "results": [{"path": "local", "gbps": "fast"}]}))
    return folder


def _self_contained(page: str) -> None:
    """Nothing on the page loads anything from elsewhere."""
    assert not re.search(r"<(link|iframe|object|embed)\b", page, re.I)
    assert not re.search(r"<script[^>]*\ssrc=", page, re.I)
    assert not re.search(r"<img[^>]*\ssrc=[\"'](?!data:)", page, re.I)
    assert not re.search(r"(href|src)=[\"']?(https?:)?//", page, re.I)
    assert "@import" not in page and "url(http" not in page


@pytest.fixture(scope="module")
def real_page(tmp_path_factory) -> Path:
    """The page of every result in docs/bench, written once for this module's
    tests (plotting them all takes tens of seconds)."""
    return write_report(tmp_path_factory.mktemp("report") / "report.html", DOCS_BENCH)


def test_real_results_every_file_on_the_page(real_page):
    sources = load_sources(DOCS_BENCH)
    names = sorted(p.name for p in DOCS_BENCH.glob("*.json"))
    assert [s.name for s in sources] == names and names
    assert not [s.name for s in sources if s.error]
    page = real_page.read_text()
    _self_contained(page)
    assert 'class="note"' not in page  # each kind's view understood its file
    chunks = page.split("<section ")[1:]
    assert len(chunks) == len(sources)
    for s, chunk in zip(sources, chunks):
        assert f">{s.name} <small>({s.kind})" in chunk
        if s.kind in VIEWS and s.kind != "crash":  # crash has totals only: tables, no plots
            assert '<figure class="plot"' in chunk, s.name
    # every command is on the page: recorded in the file, or documented next to it
    commands = re.findall(r"<b>command</b>: <code>([^<]*)</code>", page)
    assert len(commands) == len(sources) and "not recorded" not in commands
    assert any("gpufeed bench io --size 1GiB --cold" in c for c in commands)
    assert "Intel(R) Xeon(R) Processor" in page  # the machine


def test_real_results_ratios_against_baselines():
    by = {s.name: s for s in load_sources(DOCS_BENCH)}
    demo = build_section("demo", by["demo-1gb.json"].data)
    t = next(t for t in demo.tables if t.caption.endswith("ratios against s3"))
    rows = {r[0]: r for r in t.rows}
    assert rows["s3"][2] == pytest.approx(1.0)
    gbps = {r["path"]: r["gbps"] for r in by["demo-1gb.json"].data["results"]}
    assert rows["shm"][2] == pytest.approx(gbps["shm"] / gbps["s3"], rel=1e-3)
    kv = build_section("kv", by["kv.json"].data)
    ttft = next(t for t in kv.tables if t.caption.endswith("ratios against recompute"))
    assert {r[0] for r in ttft.rows} == {"recompute", "in_memory", "cached_shm", "cached_tcp"}
    assert all(r[2] < 1 for r in ttft.rows if r[0] != "recompute")  # a cache beats recomputing
    ckpt = build_section("checkpoint", by["checkpoint.json"].data)
    assert {p.name for p in ckpt.plots} >= {"checkpoint-save", "checkpoint-stall"}
    # the loader-CPU plot states the loader's own CPU, as the run's target does
    data = by["train-resnet50-tensors.json"].data
    train = build_section("train", data)
    loader = next(t for t in train.tables if t.caption.startswith("resnet50: loader CPU"))
    got = {r[0]: r[1] for r in loader.rows}
    want = {r["path"]: r["client_cpu_s_per_gb"] for r in data["results"] if r["workload"] == "resnet50"}
    assert got["gpufeed"] == pytest.approx(statistics.median(
        [r["client_cpu_s_per_gb"] for r in data["results"] if r["path"] == "gpufeed"]))
    assert got["gpufeed"] / got["s3_boto3"] < 0.3 and set(got) == set(want)


def test_synthetic_train_unknown_and_broken_files(tmp_path):
    folder = _synthetic(tmp_path / "bench")
    sources = {s.name: s for s in load_sources(folder)}
    assert sources["broken.json"].error and sources["broken.json"].data is None
    train = build_section("train", sources["train.json"].data)
    names = {p.name for p in train.plots}
    assert {"train-au-unet3d", "train-au-cosmoflow", "train-acc-unet3d", "train-gbps-unet3d",
            "train-cpu-unet3d", "train-cpu-all-unet3d"} <= names
    loader = next(t for t in train.tables if t.caption.startswith("unet3d: loader CPU"))  # the loader's own
    assert {r[0]: r[2] for r in loader.rows}["gpufeed"] == pytest.approx((1 / 64) / (1 / 4))
    total = next(t for t in train.tables if t.caption.startswith("unet3d: loader + node CPU"))
    assert {r[0]: r[2] for r in total.rows}["gpufeed"] == pytest.approx((2 / 8) / (2 / 2))
    acc = next(t for t in train.tables if t.caption.startswith("unet3d: most accelerators kept"))
    ratio = {r[0]: r[2] for r in acc.rows}
    assert ratio["gpufeed"] == pytest.approx(4.0) and ratio["s3_boto3"] == pytest.approx(1.0)
    assert "AU floor 90%" in next(p.svg for p in train.plots if p.name == "train-au-unet3d")
    assert "AU floor 70%" in next(p.svg for p in train.plots if p.name == "train-au-cosmoflow")

    unknown = build_section("frobnicate", sources["frobnicate.json"].data)
    captions = [t.caption for t in unknown.tables]
    assert captions[0] == "Values" and {"results", "nested", "values", "Targets"} <= set(captions)
    assert [p.name for p in unknown.plots] == ["frobnicate-results-gbps"]

    page = write_report(tmp_path / "out" / "r.html", folder).read_text()
    _self_contained(page)
    assert "could not read this file: JSONDecodeError" in page
    assert "x &lt; y &amp; z" in page  # values are escaped
    assert "(frobnicate)" in page and "(train)" in page and "(a-list)" in page
    assert "gpufeed bench io --size 1024 --repeat 1 (rebuilt from the JSON" in page


def test_a_view_that_fails_falls_back_to_tables(monkeypatch):
    def broken(data, s):
        raise KeyError("shape")

    monkeypatch.setitem(_report_kinds.VIEWS, "kv", broken)
    sec = build_section("kv", {"benchmark": "kv", "results": [{"path": "a", "gbps": 1.0}]})
    assert "the kv view could not read this file (KeyError" in sec.notes[0]
    assert "results" in [t.caption for t in sec.tables] and sec.plots


def test_extra_sources_come_first(tmp_path):
    page = render_page([Source("demo (this run)", {"benchmark": "demo", "results": []}),
                        *load_sources(_synthetic(tmp_path))])
    assert page.index("<h2>demo (this run)") < page.index("<h2>train.json")


def test_cli_bench_report(tmp_path):
    out = tmp_path / "page" / "report.html"
    result = CliRunner().invoke(main, ["bench", "report", "--in", str(_synthetic(tmp_path / "b")),
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"report: {out.resolve()}" in result.output and out.read_text().startswith("<!DOCTYPE html>")
    empty = CliRunner().invoke(main, ["bench", "report", "--in", str(tmp_path / "nothing-here"),
                                      "--out", str(tmp_path / "x.html")])
    assert empty.exit_code == 1 and "no benchmark JSON files" in empty.output
    assert not (tmp_path / "x.html").exists()


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("GPUFEED_REQUIRE_CHROMIUM"):
            pytest.fail("GPUFEED_REQUIRE_CHROMIUM is set but chromium is not installed")
        pytest.skip("chromium is not installed (apt-get install chromium); set GPUFEED_REQUIRE_CHROMIUM=1 "
                    "to make this a failure")
    return exe


def test_every_plot_renders_in_headless_chromium(tmp_path, real_page):
    """Every plot of the real results (train runs among them) draws in a real
    browser; a kind the report does not know falls back to tables
    (:func:`test_synthetic_train_unknown_and_broken_files`)."""
    exe = _chromium()
    page = real_page
    assert "train" in {s.kind for s in load_sources(DOCS_BENCH)}
    expected = len(re.findall(r'<figure class="plot"', page.read_text()))
    assert expected >= 30
    proc = subprocess.run(
        [exe, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900", "--virtual-time-budget=5000",
         "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="render-check" data-plots="(\d+)" data-done="1">(.*?)</pre>', proc.stdout, re.S)
    assert m, proc.stdout[-2000:]
    checks = json.loads(html.unescape(m.group(2)))
    assert int(m.group(1)) == len(checks) == expected
    assert [c["plot"] for c in checks if not c["ok"]] == []
    assert all(c["width"] > 100 and c["height"] > 100 for c in checks)
