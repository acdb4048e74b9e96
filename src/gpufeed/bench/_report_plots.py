"""Plots for ``gpufeed bench report``, drawn with matplotlib (Agg canvas, no pyplot
state) and returned as inline SVG text, so the page needs no other file.

Two shapes cover every benchmark: :func:`bars` (one value per row, the
baseline row grey and every other bar labelled with its ratio to it) and
:func:`lines` (a y value against x per series, e.g. accelerator utilization
against emulated accelerators, with an optional threshold line).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["bars", "lines", "PALETTE"]

#: Bar and line colours; the baseline is always grey.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22"]
BASELINE_COLOR = "#9a9a9a"
_HEADER = re.compile(r"^.*?(?=<svg)", re.S)  # the XML prolog and DOCTYPE before <svg


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _svg(fig: Any) -> str:
    """The figure as an ``<svg>`` element (text kept as text, no metadata date)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "gpufeed"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return _HEADER.sub("", buf.getvalue(), count=1)


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _short(label: str, most: int = 32) -> str:
    """A tick label cut to ``most`` characters (the table beside the plot has it whole)."""
    return label if len(label) <= most else label[: most - 1] + "…"


def bars(title: str, labels: Sequence[str], values: Sequence[Any], *, ylabel: str,
         baseline: str | None = None, log: bool = False) -> str:
    """One bar per label; the baseline bar grey, the others annotated ``value (r x)``.

    Args:
        title: the plot's title.
        labels: one per bar (row names, e.g. paths).
        values: numbers; None or non-finite values draw no bar and say "n/a".
        ylabel: the axis label with its unit (``"GB/s"``).
        baseline: the label of the baseline bar, or None.
        log: logarithmic y axis (for values spanning decades).

    Returns:
        An ``<svg>`` element as text.
    """
    vals = [_finite(v) for v in values]
    base = vals[list(labels).index(baseline)] if baseline is not None and baseline in labels else None
    fig = _figure(max(4.5, 0.85 * len(labels) + 2.0), 3.4)
    ax = fig.add_subplot()
    xs = range(len(labels))
    colors = [BASELINE_COLOR if lab == baseline else PALETTE[i % len(PALETTE)]
              for i, lab in enumerate(labels)]
    drawn = ax.bar(xs, [v or 0.0 for v in vals], color=colors)
    for rect, v, lab in zip(drawn, vals, labels):
        if v is None:
            text = "n/a"
        elif lab == baseline:
            text = f"{v:.3g}\nbaseline"
        elif base:
            text = f"{v:.3g}\n{v / base:.2f}x"
        else:
            text = f"{v:.3g}"
        ax.annotate(text, (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                    ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(list(xs), [_short(str(s)) for s in labels], rotation=30 if len(labels) > 4 else 0,
                  ha="right" if len(labels) > 4 else "center", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log and any(v for v in vals if v):
        ax.set_yscale("log")
    ax.margins(y=0.25)
    return _svg(fig)


def lines(title: str, series: dict[str, Sequence[tuple[Any, Any]]], *, xlabel: str,
          ylabel: str, threshold: float | None = None, threshold_label: str = "") -> str:
    """One line with markers per series of (x, y) points.

    Args:
        title: the plot's title.
        series: name -> points; points are sorted by x.
        xlabel, ylabel: axis labels with units.
        threshold: a dashed horizontal line at this y (e.g. the AU target).
        threshold_label: the legend entry for that line.

    Returns:
        An ``<svg>`` element as text.
    """
    fig = _figure(6.0, 3.6)
    ax = fig.add_subplot()
    for i, (name, points) in enumerate(series.items()):
        pts = sorted((x, y) for x, y in points if _finite(x) is not None and _finite(y) is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    color=PALETTE[i % len(PALETTE)], label=name)
    if threshold is not None:
        ax.axhline(threshold, color=BASELINE_COLOR, linestyle="--", label=threshold_label or None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _svg(fig)
