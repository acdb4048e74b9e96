"""``gpufeed bench report``: every benchmark's JSON on one self-contained HTML page.

The page holds, per JSON file (``docs/bench/*.json`` and any reports passed
in, such as the demo's own run): the exact command that produced it, the
machine it ran on, plots (inline SVG drawn by matplotlib, see
:mod:`gpufeed.bench._report_plots`) and tables stating each result as a ratio
against its baseline (see :mod:`gpufeed.bench._report_kinds`), and the
benchmark's targets. It loads nothing from elsewhere: no scripts, styles,
fonts or images outside the file, no network.

A small script at the end of the page measures every plot once the browser
has laid it out and writes the result into ``<pre id="render-check">`` (a
JSON list of ``{"plot", "ok", "width", "height"}``), so a headless browser's
``--dump-dom`` shows whether every plot rendered.

Where a JSON does not record its command, the command is looked up in the
repository's README.md and docs/*.md (a backquoted command naming the file);
failing that, for ``bench io`` it is rebuilt from the JSON's parameters and
marked so.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._report_kinds import Section, Table, build_section

__all__ = ["Source", "load_sources", "render_page", "write_report", "command_of"]


@dataclass
class Source:
    """One benchmark result on the page.

    Attributes:
        name: what the page calls it (the file name, or e.g. ``"demo (this run)"``).
        data: the parsed JSON (None when the file could not be parsed).
        path: the file it came from, if any.
        error: why the file could not be read or parsed.
    """

    name: str
    data: Any
    path: Path | None = None
    error: str | None = None

    @property
    def kind(self) -> str:
        """The ``benchmark`` field, else the file name without digits and sizes."""
        if isinstance(self.data, dict) and isinstance(self.data.get("benchmark"), str):
            return self.data["benchmark"]
        stem = Path(self.name).stem
        return re.sub(r"-\d+[a-z]*$", "", stem) or stem


def load_sources(in_dir: str | os.PathLike) -> list[Source]:
    """Read every ``*.json`` under ``in_dir`` (not recursive), sorted by name.

    Args:
        in_dir: the folder of benchmark results (``docs/bench``).

    Returns:
        One :class:`Source` per file; a file that cannot be read or parsed
        becomes a source with ``error`` set (never an exception). An absent
        folder gives an empty list.
    """
    folder = Path(in_dir)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            out.append(Source(path.name, json.loads(path.read_text()), path))
        except (OSError, ValueError) as exc:
            out.append(Source(path.name, None, path, f"{type(exc).__name__}: {exc}"))
    return out


def _documented_commands(root: Path) -> dict[str, str]:
    """File name -> the first backquoted command in README.md or docs/*.md that writes it."""
    out: dict[str, str] = {}
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for doc in docs:
        try:
            text = doc.read_text()
        except OSError:
            continue
        for cmd in re.findall(r"`([^`\n]*docs/bench/[\w.-]+\.json[^`\n]*)`", text):
            if re.search(r"\b(gpufeed|python|scripts/)", cmd):
                name = re.search(r"docs/bench/([\w.-]+\.json)", cmd)
                if name:
                    out.setdefault(name.group(1), f"{cmd} (as documented in {doc.relative_to(root)})")
    return out


def _io_command(data: dict) -> str | None:
    params: dict = data["params"] if isinstance(data.get("params"), dict) else {}
    if "size_bytes" not in params:
        return None
    cold = any(str(r.get("path", "")).endswith("_cold") for r in data.get("results") or [] if isinstance(r, dict))
    return (f"gpufeed bench io --size {params['size_bytes']} --repeat {params.get('repeat', 3)}"
            f"{' --cold' if cold else ''} (rebuilt from the JSON's params; the file records no command)")


def command_of(source: Source, documented: dict[str, str]) -> str:
    """The command that produced ``source``: recorded, documented, rebuilt, or a note saying none is known."""
    data = source.data if isinstance(source.data, dict) else {}
    if isinstance(data.get("command"), str):
        return data["command"]
    if source.path is not None and source.path.name in documented:
        return documented[source.path.name]
    if source.kind == "io" and (cmd := _io_command(data)):
        return cmd
    return "not recorded"


_HARDWARE = ("cpu_model", "cpus", "mem_gib", "kernel", "platform", "gpu", "device")


def _machine_text(machine: Any) -> str:
    if not isinstance(machine, dict):
        return "not recorded"
    keys = ("cpu_model", "cpus", "mem_gib", "kernel", "python", "torch", "gpufeed")
    parts = [f"{k}={machine[k]}" for k in keys if k in machine]
    parts += [f"{k}={v}" for k, v in machine.items() if k not in keys and not isinstance(v, (dict, list))]
    return ", ".join(parts) or "not recorded"


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in t.rows)
    return f"<table><caption>{html.escape(t.caption)}</caption><tr>{head}</tr>{body}</table>"


def _section_html(i: int, source: Source, section: Section | None, documented: dict[str, str]) -> str:
    anchor = f"s{i}"
    out = [f'<section id="{anchor}"><h2>{html.escape(source.name)} <small>({html.escape(source.kind)})</small></h2>']
    if source.error:
        out.append(f'<p class="note">could not read this file: {html.escape(source.error)}</p></section>')
        return "".join(out)
    assert section is not None
    data = source.data if isinstance(source.data, dict) else {}
    out.append(f"<p><b>command</b>: <code>{html.escape(command_of(source, documented))}</code></p>")
    out.append(f'<p class="machine"><b>machine</b>: {html.escape(_machine_text(data.get("machine")))}</p>')
    out += [f'<p class="note">{html.escape(n)}</p>' for n in section.notes]
    out += [f'<figure class="plot" data-plot="{html.escape(p.name)}">{p.svg}</figure>' for p in section.plots]
    out += [_table_html(t) for t in section.tables]
    out.append("</section>")
    return "\n".join(out)


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#222;padding:0 1em}
h2{border-bottom:1px solid #ccc;margin-top:2em} h2 small{color:#777;font-weight:normal}
code{background:#f4f4f4;padding:1px 4px;word-break:break-all}
figure.plot{display:inline-block;margin:.5em;vertical-align:top} figure.plot svg{max-width:100%;height:auto}
table{border-collapse:collapse;margin:.8em 0;font-size:.85em} caption{text-align:left;font-weight:bold}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right} td:first-child,th:first-child{text-align:left}
.note{color:#8a5300} .machine{color:#555;font-size:.9em} #render-check{display:none}
"""

_CHECK = """
(function () {
  var out = [];
  document.querySelectorAll('figure.plot').forEach(function (f) {
    var el = f.querySelector('svg, img');
    var r = el ? el.getBoundingClientRect() : {width: 0, height: 0};
    var drawn = el && (el.tagName.toLowerCase() === 'img' ? el.complete && el.naturalWidth > 0
                       : el.querySelectorAll('path, use, text').length > 0);
    out.push({plot: f.getAttribute('data-plot'), ok: !!(drawn && r.width > 0 && r.height > 0),
              width: r.width, height: r.height});
  });
  var pre = document.getElementById('render-check');
  pre.textContent = JSON.stringify(out);
  pre.setAttribute('data-done', '1');
})();
"""


def render_page(sources: Iterable[Source], *, repo_root: str | os.PathLike | None = None,
                title: str = "gpufeed benchmarks") -> str:
    """Build the HTML page for ``sources``.

    Args:
        sources: the benchmark results, in page order.
        repo_root: where README.md and docs/ are, to find commands the JSON
            files do not record (None: look nowhere).
        title: the page title.

    Returns:
        The page, one self-contained HTML document.
    """
    sources = list(sources)
    documented = _documented_commands(Path(repo_root)) if repo_root else {}
    sections = [None if s.error else build_section(s.kind, s.data) for s in sources]
    machines: dict[str, list[str]] = {}  # the hardware and OS; versions are in each section
    for s in sources:
        if isinstance(s.data, dict) and isinstance(s.data.get("machine"), dict):
            box = {k: v for k, v in s.data["machine"].items() if k in _HARDWARE}
            machines.setdefault(_machine_text(box), []).append(s.name)
    toc = "".join(f'<li><a href="#s{i}">{html.escape(s.name)}</a> ({html.escape(s.kind)})</li>'
                  for i, s in enumerate(sources))
    mach = "".join(f"<li>{html.escape(m)} <small>({html.escape(', '.join(names))})</small></li>"
                   for m, names in machines.items())
    body = "\n".join(_section_html(i, s, sec, documented) for i, (s, sec) in enumerate(zip(sources, sections)))
    nplots = sum(len(sec.plots) for sec in sections if sec)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
            f"<h1>{html.escape(title)}</h1>\n<p>{len(sources)} results, {nplots} plots; written "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}. Ratios are each row's value divided "
            f"by its baseline's (the grey bar).</p>\n<h3>Machines</h3><ul>{mach or '<li>not recorded</li>'}</ul>"
            f"\n<h3>Results</h3><ul>{toc}</ul>\n{body}\n"
            f'<pre id="render-check" data-plots="{nplots}"></pre>\n<script>{_CHECK}</script>\n</body></html>\n')


def write_report(out: str | os.PathLike, in_dir: str | os.PathLike | None = "docs/bench",
                 extra: Iterable[Source] = ()) -> Path:
    """Write the page for ``extra`` followed by every JSON under ``in_dir``.

    Args:
        out: the HTML file to write; its folder is created.
        in_dir: the folder of benchmark JSON files (None or absent: none).
            Commands the files do not record are looked up in the README.md
            and docs/ two folders up (the repository of ``docs/bench``).
        extra: results to put first, e.g. ``Source("demo (this run)", report)``.

    Returns:
        The path written.

    Raises:
        ImportError: matplotlib is not installed (it comes with ``gpufeed[bench]``).
        OSError: the page could not be written.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError("the report's plots need matplotlib: pip install 'gpufeed[bench]'") from exc
    sources = list(extra)
    root = None
    if in_dir is not None:
        sources += load_sources(in_dir)
        root = Path(in_dir).resolve().parent.parent
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(sources, repo_root=root), encoding="utf-8")
    return path
