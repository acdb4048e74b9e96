"""What every benchmark writes besides its table: progress and a summary line on
stderr (never on stdout, off when not a terminal or quiet) and JSON with its command."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpufeed.bench import _output
from gpufeed.bench._output import BenchProgress, command_line, set_quiet, summary_line, write_json
from gpufeed.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _loud(monkeypatch):
    monkeypatch.delenv("GPUFEED_QUIET", raising=False)
    monkeypatch.setattr(_output, "_quiet", False)


def test_write_json_adds_the_command_and_keeps_every_field(tmp_path, monkeypatch):
    report = {"benchmark": "x", "results": [{"gbps": 1.5}]}
    path = write_json(tmp_path / "sub" / "x.json", report, command="gpufeed bench x --fast")
    assert json.loads(path.read_text()) == {"benchmark": "x", "results": [{"gbps": 1.5}],
                                            "command": "gpufeed bench x --fast"}
    kept = write_json(tmp_path / "y.json", {"command": "theirs", "a": 1}, command="mine")
    assert json.loads(kept.read_text()) == {"command": "theirs", "a": 1}
    monkeypatch.setattr(sys, "argv", ["/venv/bin/gpufeed", "bench", "io", "--size", "1 GiB"])
    assert command_line() == "gpufeed bench io --size '1 GiB'"
    assert json.loads(write_json(tmp_path / "z.json", {}).read_text()) == {
        "command": "gpufeed bench io --size '1 GiB'"}
    monkeypatch.setattr(sys, "argv", ["/src/gpufeed/__main__.py", "demo"])
    assert command_line() == "gpufeed demo"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/pytest", "-q"])
    assert command_line() is None
    assert json.loads(write_json(tmp_path / "w.json", {"a": 1}).read_text()) == {"a": 1}


def test_summary_line():
    report = {"results": [1, 2, 3], "targets": [{"met": True}, {"met": False}]}
    assert summary_line("kv", report, "docs/bench/kv.json") == \
        "bench kv: 3 rows, 1 of 2 targets met, wrote docs/bench/kv.json"
    assert summary_line("crash", {"results": {"cycles": 3}}) == "bench crash: done"


def test_not_a_terminal_draws_nothing_but_the_summary(capsys):
    progress = BenchProgress("kv")  # capsys: stderr is not a terminal
    assert not progress.enabled
    with progress:
        advance = progress.step("recompute", total=3)
        advance(1)
        with progress.phase("upload", total=10, bytes_=True) as adv:
            adv(10)
        assert list(progress.track([1, 2], "items")) == [1, 2]
        progress.summary("bench kv: 8 rows")
    out, err = capsys.readouterr()
    assert out == "" and re.fullmatch(r"bench kv: 8 rows \(\d+\.\d s\)\n", err)


def test_quiet_prints_nothing(capsys, monkeypatch):
    BenchProgress("kv", quiet=True).done("bench kv: 8 rows")
    set_quiet(True)
    BenchProgress("kv").done("bench kv: 8 rows")
    set_quiet(False)
    monkeypatch.setenv("GPUFEED_QUIET", "1")
    with BenchProgress("kv", enabled=True) as p:
        assert p.quiet
        p.step("recompute")
        p.summary("bench kv: 8 rows")
    assert capsys.readouterr() == ("", "")


def test_phases_drawn_on_stderr_only(capsys):
    with BenchProgress("gpu", enabled=True) as p:
        say = p.announcing(print)
        say("[bold]gpufeed bench gpu[/]: 1.02 GB")  # not a phase
        say("  kv_put ...")
        advance = p.step("upload 2 files", total=2 << 20, bytes_=True)
        advance(2 << 20)
        p.summary("bench gpu: 3 rows")
    out, err = capsys.readouterr()
    assert "kv_put ..." in out and "gpu: " not in out  # stdout holds the benchmark's own lines only
    assert "gpu: kv_put" in err and "gpu: upload 2 files" in err and "2.0/2.0 MiB" in err
    assert "gpufeed bench gpu" not in err and err.rstrip().splitlines()[-1].startswith("bench gpu: 3 rows (")


def test_bench_cli_summary_on_stderr_and_quiet(tmp_path):
    args = ["bench", "codecs", "--size", "2MiB", "--chunk", "1MiB", "--codecs", "lz4", "--repeat", "1"]
    out = tmp_path / "codecs.json"
    result = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert re.fullmatch(rf"bench codecs: 3 rows, \d of 1 targets met, wrote {re.escape(str(out))} \(\S+ s\)\n",
                        result.stderr)
    assert "bench codecs:" not in result.stdout
    assert json.loads(out.read_text())["benchmark"] == "codecs"
    quiet = CliRunner().invoke(main, [*args, "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert not _output.is_quiet()  # --quiet held for that command only


@pytest.mark.slow
def test_demo_ends_by_writing_the_report(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(REPO)  # `make demo` runs here: docs/bench is on the page too
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["demo", "--size", "small", "--workdir", str(tmp_path / "demo"),
                                       "--repeat", "1", "--report", str(page)])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().splitlines()[-1] == f"report: {page.resolve()}"
    text = page.read_text()
    assert "<h2>demo (this run) <small>(demo)" in text
    assert all(f"<h2>{p.name} <small>" in text for p in (REPO / "docs" / "bench").glob("*.json"))
