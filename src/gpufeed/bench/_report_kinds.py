"""One view per benchmark kind for ``gpufeed bench report``: which plots and
tables a benchmark's JSON becomes, each result stated against its baseline.

A view reads the JSON its benchmark writes (see each ``gpufeed.bench``
module's docstring) and adds plots and tables to a :class:`Section`. Kinds
without a view, JSON that is not a dict, and views that fail on an
unexpected shape all get :func:`generic_view`, which tables whatever is there
and never raises.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _report_plots as plots

__all__ = ["Section", "Table", "Plot", "build_section", "VIEWS"]

#: MLPerf Storage's accelerator-utilization floors, when a train JSON does not carry its own.
AU_THRESHOLDS = {"unet3d": 0.9, "resnet50": 0.9, "cosmoflow": 0.7}
MAX_TABLE_ROWS = 60


@dataclass
class Plot:
    """One rendered plot: ``name`` (unique in its section) and inline SVG text."""

    name: str
    svg: str


@dataclass
class Table:
    """A table: a caption, column names and rows of cells (numbers, text or None)."""

    caption: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Section:
    """What one benchmark JSON becomes on the page."""

    kind: str
    plots: list[Plot] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def bars(self, name: str, title: str, labels: Sequence[str], values: Sequence[Any], **kw: Any) -> None:
        """Add a bar plot (see :func:`gpufeed.bench._report_plots.bars`); nothing when empty."""
        if labels:
            with warnings.catch_warnings():  # layout hints about crowded axes: the plot still draws
                warnings.simplefilter("ignore", UserWarning)
                svg = plots.bars(title, labels, values, **kw)
            self.plots.append(Plot(f"{self.kind}-{name}", svg))

    def lines(self, name: str, title: str, series: dict, **kw: Any) -> None:
        """Add a line plot (see :func:`gpufeed.bench._report_plots.lines`); nothing when empty."""
        if any(series.values()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                svg = plots.lines(title, series, **kw)
            self.plots.append(Plot(f"{self.kind}-{name}", svg))

    def table(self, caption: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Add a table; nothing when it has no rows."""
        if rows:
            self.tables.append(Table(caption, columns, rows))


def _list(data: dict, key: str) -> list[dict]:
    v = data.get(key)
    return [r for r in v if isinstance(r, dict)] if isinstance(v, list) else []


def _ratio(v: Any, base: Any) -> float | None:
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (v, base))
    return v / base if ok and base else None


def compare(s: Section, name: str, title: str, rows: list[dict], *, label: Callable[[dict], str],
            value: str, baseline: str | None, unit: str, columns: Sequence[str] = (),
            log: bool = False) -> None:
    """A bar plot of ``row[value]`` per row and a table stating each as a ratio
    against the row labelled ``baseline``.

    Args:
        s: the section to add to.
        name: the plot's name within the section.
        title: plot title and table caption.
        rows: the benchmark's rows.
        label: a row's label (its bar).
        value: the key of the plotted number.
        baseline: the baseline row's label (None: no ratios).
        unit: the value's unit (``"GB/s"``, ``"s"``).
        columns: more keys shown in the table.
        log: logarithmic axis.
    """
    rows = [r for r in rows if value in r]
    labels = [label(r) for r in rows]
    base = next((r.get(value) for r, lab in zip(rows, labels) if lab == baseline), None)
    s.bars(name, title, labels, [r.get(value) for r in rows], ylabel=unit,
           baseline=baseline if baseline in labels else None, log=log)
    caption = f"{title}; ratios against {baseline}" if baseline in labels else title
    s.table(caption, ["row", f"{value} ({unit})", "vs baseline (x)", *columns],
            [[lab, r.get(value), _ratio(r.get(value), base), *(r.get(c) for c in columns)]
             for r, lab in zip(rows, labels)])


def _path(r: dict) -> str:
    return str(r.get("path", "?"))


def io_view(data: dict, s: Section) -> None:
    """``bench io``: large-read GB/s warm and cold against local files, CPU s/GB, 4 KiB latency, writes."""
    rows = _list(data, "results")
    warm = [r for r in rows if not _path(r).endswith("_cold")]
    cold = [r for r in rows if _path(r).endswith("_cold")]
    compare(s, "gbps-warm", "Large read GB/s, page-cached (baseline: local file read)", warm, label=_path,
            value="gbps", baseline="local", unit="GB/s", columns=["put_gbps", "p50_us", "p99_us", "iops_4k"])
    compare(s, "gbps-cold", "Large read GB/s, pages dropped (baseline: local file read)", cold, label=_path,
            value="gbps", baseline="local_cold", unit="GB/s")
    compare(s, "cpu", "CPU seconds per GB read (client + node; baseline: local)", rows, label=_path,
            value="cpu_s_per_gb", baseline="local", unit="CPU s/GB")
    compare(s, "p50", "Single 4 KiB get, p50 latency (baseline: local pread)", warm, label=_path,
            value="p50_us", baseline="local", unit="µs", log=True)
    writes = _list(data, "writes")
    compare(s, "writes", "Writes and HTTP gets, GB/s (baseline: local write + fsync)", writes, label=_path,
            value="gbps", baseline="local_write_fsync", unit="GB/s",
            columns=["bytes", "client_cpu_s_per_gb", "server_cpu_s_per_gb"])
    ratios = data.get("ratios")
    if isinstance(ratios, dict):
        s.table("Ratios the benchmark states", ["ratio", "value (x)"], [[k, v] for k, v in ratios.items()])


def demo_view(data: dict, s: Section) -> None:
    """``gpufeed demo``: model load GB/s per path against S3 and local ``load_file``; CPU s/GB."""
    rows = _list(data, "results")
    compare(s, "gbps", "Model load GB/s per path (baseline: boto3 from our S3 endpoint)", rows, label=_path,
            value="gbps", baseline="s3", unit="GB/s", columns=["seconds", "cpu_s_per_gb", "verified"])
    compare(s, "gbps-local", "Model load GB/s per path (baseline: local safetensors load_file)", rows,
            label=_path, value="gbps", baseline="local_load_file", unit="GB/s")
    compare(s, "cpu", "CPU seconds per GB loaded (client + node; baseline: s3)", rows, label=_path,
            value="cpu_s_per_gb", baseline="s3", unit="CPU s/GB")


def model_view(data: dict, s: Section) -> None:
    """``bench model``: warm and cold load GB/s per path (best setting) against local load_file; first loads."""
    rows = [r for r in _list(data, "results") if r.get("best_setting") in (None, True)]
    for cache in ("warm", "cold"):
        part = [r for r in rows if r.get("cache") == cache]
        compare(s, f"gbps-{cache}", f"Model load GB/s, {cache} (baseline: local safetensors load_file)", part,
                label=_path, value="gbps", baseline="local_load_file", unit="GB/s",
                columns=["cpu_s_per_gb", "setting"])
        compare(s, f"cpu-{cache}", f"CPU seconds per GB, {cache} (baseline: local load_file)", part, label=_path,
                value="cpu_s_per_gb", baseline="local_load_file", unit="CPU s/GB")
    by_way: dict[str, list[float]] = {}
    for r in _list(data, "first_load"):
        if isinstance(r.get("gbps"), (int, float)):
            by_way.setdefault(str(r.get("way", _path(r))), []).append(r["gbps"])
    first = [{"way": w, "gbps": statistics.median(v), "processes": len(v)} for w, v in by_way.items()]
    compare(s, "first-load", "First load in a fresh process, median GB/s (baseline: load_file + clone)", first,
            label=lambda r: r["way"], value="gbps", baseline="load_file + clone", unit="GB/s",
            columns=["processes"])


def checkpoint_view(data: dict, s: Section) -> None:
    """``bench checkpoint``: DCP save GB/s and the async stall against FileSystemWriter's best."""
    rows = _list(data, "results")
    best: dict = data["peer_best"] if isinstance(data.get("peer_best"), dict) else {}

    def label(r: dict) -> str:
        return f"{_path(r)} ({r['setting']})" if r.get("path") == "dcp_fs" and r.get("setting") else _path(r)

    def base(key: str) -> str | None:
        setting = (best.get(key) or {}).get("setting")
        return next((label(r) for r in rows if r.get("path") == "dcp_fs" and r.get("setting") == setting), None)

    saves = [r for r in rows if r.get("save_gbps") is not None]
    compare(s, "save", "Checkpoint save GB/s (baseline: FileSystemWriter's best)", saves, label=label,
            value="save_gbps", baseline=base("save"), unit="GB/s", columns=["sync_s"])
    compare(s, "stall", "Async save: seconds the training step is blocked (baseline: FileSystemWriter's best)",
            rows, label=label, value="async_block_s", baseline=base("async_stall"), unit="s", log=True,
            columns=["async_return_s", "staging_wait_s"])
    dedup = data.get("dedup")
    if isinstance(dedup, dict):
        s.table("Dedup over versions", ["field", "value"], [[k, v] for k, v in dedup.items()])


def kv_view(data: dict, s: Section) -> None:
    """``bench kv``: TTFT without a cache (recompute) and with it (in memory, reloaded over shm/tcp)."""
    rows = _list(data, "results")
    ttft = [r for r in rows if "ttft_s" in r]
    compare(s, "ttft", "Time to first token without cache (recompute) and with it", ttft, label=_path,
            value="ttft_s", baseline="recompute", unit="s", columns=["cached_tokens", "same_output"])
    compare(s, "ttft-mem", "Time to first token against the in-memory cache", ttft, label=_path,
            value="ttft_s", baseline="in_memory", unit="s")
    by = {_path(r): r for r in rows}
    reload = []
    for t in ("shm", "tcp"):
        if f"io_{t}" in by:
            reload.append({"path": f"io_{t}", "gbps": by[f"io_{t}"].get("gbps")})
        if f"cached_{t}" in by:
            reload.append({"path": f"cached_{t} reload", "gbps": by[f"cached_{t}"].get("reload_gbps")})
    compare(s, "reload", "KV reload GB/s against a plain large read of the same path", reload, label=_path,
            value="gbps", baseline="io_shm", unit="GB/s")
    conc = [r for r in rows if "aggregate_gbps" in r]
    compare(s, "concurrent", "Concurrent clients, aggregate GB/s", conc, label=_path, value="aggregate_gbps",
            baseline=None, unit="GB/s", columns=["clients", "p50_s", "p99_s", "errors"])


def train_view(data: dict, s: Section) -> None:
    """``bench train``: AU against emulated accelerators per path; most accelerators, GB/s, CPU s/GB per path."""
    rows = _list(data, "results") or next(
        (v for v in data.values() if isinstance(v, list) and v and isinstance(v[0], dict) and "au" in v[0]), [])
    thresholds: dict = data["thresholds"] if isinstance(data.get("thresholds"), dict) else {}
    for wl in dict.fromkeys(str(r.get("workload")) for r in rows):
        part = [r for r in rows if str(r.get("workload")) == wl]
        series: dict[str, list[tuple[Any, Any]]] = {}  # non-numbers are left out by the plot
        for r in part:
            series.setdefault(_path(r), []).append((r.get("accelerators"), r.get("au")))
        thr = thresholds.get(wl, AU_THRESHOLDS.get(wl))
        s.lines(f"au-{wl}", f"{wl}: accelerator utilization against emulated accelerators", series,
                xlabel="emulated accelerators", ylabel="AU (compute / wall)", threshold=thr,
                threshold_label=f"AU floor {thr:.0%}" if thr else "")
        per_path = []
        for p in series:
            pr = [r for r in part if _path(r) == p]
            top = max(pr, key=lambda r: r.get("accelerators") or 0)
            per_path.append({"path": p, "max_accelerators_au_ok": top.get("max_accelerators_au_ok"),
                             "gbps": _best(pr, "gbps"), "cpu_s_per_gb": _median(pr, "cpu_s_per_gb"),
                             "client_cpu_s_per_gb": _median(pr, "client_cpu_s_per_gb")})
        base = "s3_boto3" if any(r["path"] == "s3_boto3" for r in per_path) else None
        compare(s, f"acc-{wl}", f"{wl}: most accelerators kept above the AU floor (baseline: boto3)", per_path,
                label=_path, value="max_accelerators_au_ok", baseline=base, unit="accelerators")
        compare(s, f"acc-local-{wl}", f"{wl}: most accelerators above the AU floor (baseline: local files)",
                per_path, label=_path, value="max_accelerators_au_ok", baseline="local", unit="accelerators")
        compare(s, f"gbps-{wl}", f"{wl}: best GB/s per path (baseline: boto3)", per_path, label=_path,
                value="gbps", baseline=base, unit="GB/s")
        if any(r["client_cpu_s_per_gb"] is not None for r in per_path):  # files before the split have totals only
            compare(s, f"cpu-{wl}", f"{wl}: loader CPU seconds per GB (the training job's processes), median "
                    "(baseline: boto3)", per_path, label=_path, value="client_cpu_s_per_gb", baseline=base,
                    unit="CPU s/GB")
        compare(s, f"cpu-all-{wl}", f"{wl}: loader + node CPU seconds per GB, median (baseline: boto3)", per_path,
                label=_path, value="cpu_s_per_gb", baseline=base, unit="CPU s/GB")


def _median(rows: list[dict], field: str) -> float | None:
    """The median of ``field`` over the rows that hold a number there, else ``None``."""
    vals = [r[field] for r in rows if isinstance(r.get(field), (int, float))]
    return statistics.median(vals) if vals else None


def _best(rows: list[dict], field: str) -> float | None:
    """The largest ``field`` over the rows that hold a number there, else ``None``."""
    vals = [r[field] for r in rows if isinstance(r.get(field), (int, float))]
    return max(vals) if vals else None


def integrity_view(data: dict, s: Section) -> None:
    """``bench integrity``: damaged reads detected per path, and how long each path took."""
    compare(s, "seconds", "Reading every object back after damage, seconds (baseline: s3)",
            _list(data, "results"), label=_path, value="seconds", baseline="s3", unit="s",
            columns=["reads", "damaged", "detected", "wrong", "false_alarms"])
    if isinstance(data.get("scrub"), dict):
        s.table("Scrub", ["field", "value"], [[k, v] for k, v in data["scrub"].items()])


def data_view(data: dict, s: Section) -> None:
    """``bench data``: checked vs unchecked reads, compression per codec against none, dedup."""
    v = data.get("verify")
    if isinstance(v, dict):
        rows = [{"read": k.removesuffix("_gbps"), "gbps": v[k]} for k in v if k.endswith("_gbps")]
        compare(s, "verify", "shm read GB/s, checked and unchecked (baseline: unchecked)", rows,
                label=lambda r: r["read"], value="gbps", baseline="unchecked", unit="GB/s")
    comp = _list(data, "compression")
    for what in ("put_gbps", "get_gbps"):
        for kind in dict.fromkeys(str(r.get("data")) for r in comp):
            part = [r for r in comp if str(r.get("data")) == kind]
            compare(s, f"{what}-{kind}", f"{kind}: {what.split('_')[0]} GB/s per codec (baseline: off)", part,
                    label=lambda r: str(r.get("codec")), value=what, baseline="off", unit="GB/s",
                    columns=["ratio"] if what == "put_gbps" else [])
    if isinstance(data.get("dedup"), dict):
        s.table("Dedup", ["field", "value"], [[k, v] for k, v in data["dedup"].items()])


def codecs_view(data: dict, s: Section) -> None:
    """``bench codecs``: compress/decompress GB/s per codec and data set against memcpy; digests; CDC."""
    rows = _list(data, "results")
    memcpy = (data.get("baseline") or {}).get("memcpy_gbps") if isinstance(data.get("baseline"), dict) else None
    for what in ("compress_gbps", "decompress_gbps"):
        part = [{"row": f"{r.get('data')} {r.get('codec')}", what: r.get(what)} for r in rows]
        if memcpy:
            part.insert(0, {"row": "memcpy", what: memcpy})
        compare(s, what, f"{what.split('_')[0].capitalize()} GB/s per data set and codec (baseline: memcpy)",
                part, label=lambda r: r["row"], value=what, baseline="memcpy" if memcpy else None,
                unit="GB/s", log=True)
    s.table("Codecs", ["data", "codec", "ratio", "skipped", "skip_us"],
            [[r.get("data"), r.get("codec"), r.get("ratio"), r.get("skipped"), r.get("skip_us")] for r in rows])
    dig = [{"row": "memcpy", "gbps": memcpy}] if memcpy else []
    compare(s, "digests", "Digest GB/s (baseline: memcpy)", dig + _list(data, "digests"),
            label=lambda r: str(r.get("row", r.get("what"))), value="gbps", baseline="memcpy", unit="GB/s")
    s.table("Content-defined chunking", ["avg_size", "chunks", "mean_size", "mbps"],
            [[r.get("avg_size"), r.get("chunks"), r.get("mean_size"), r.get("mbps")] for r in _list(data, "cdc")])


def list_view(data: dict, s: Section) -> None:
    """``bench list``: ListObjectsV2 of one directory per bucket shape against the small general bucket."""
    rows = _list(data, "results")
    for key, what in (("s3_s", "S3 ListObjectsV2"), ("engine_s", "engine list_objects")):
        compare(s, key, f"{what} of one directory, seconds (baseline: general_small)", rows,
                label=lambda r: str(r.get("bucket")), value=key, baseline="general_small", unit="s",
                columns=["objects", "listed"])


def catalog_view(data: dict, s: Section) -> None:
    """``bench catalog``: operations per second of each op, PostgreSQL against SQLite."""
    rows = _list(data, "results")
    for op, threads in dict.fromkeys((r.get("op"), r.get("threads")) for r in rows):
        mine = [r for r in rows if r.get("op") == op and r.get("threads") == threads]
        compare(s, f"{op}-{threads}", f"{op}, {threads} thread(s), operations/s (baseline: sqlite)", mine,
                label=lambda r: str(r.get("catalog")), value="ops_per_s", baseline="sqlite", unit="ops/s",
                columns=["ops", "seconds"])


def crash_view(data: dict, s: Section) -> None:
    """``bench crash``: the totals over every kill -9 cycle."""
    if isinstance(data.get("results"), dict):
        s.table("Totals over every cycle", ["field", "value"], [[k, v] for k, v in data["results"].items()])
    s.table("Problems", ["problem"], [[p] for p in data.get("problems") or []])


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def generic_view(data: Any, s: Section) -> None:
    """Any JSON: scalars as one table, each list of dicts and each dict as tables,
    and a GB/s bar plot where rows carry ``path`` and ``gbps``. Never raises."""
    if not isinstance(data, dict):
        data = {"value": data}
    skip = {"benchmark", "command", "machine", "targets"}
    scalars = [[k, v] for k, v in data.items() if k not in skip and _scalar(v)]
    s.table("Values", ["field", "value"], scalars)
    for key, v in data.items():
        if key in skip or _scalar(v):
            continue
        if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
            cols = list(dict.fromkeys(k for r in v for k, x in r.items() if _scalar(x)))[:14]
            s.table(key, cols, [[r.get(c) for c in cols] for r in v[:MAX_TABLE_ROWS]])
            if "gbps" in cols and ("path" in cols or "name" in cols):
                compare(s, f"{key}-gbps", f"{key}: GB/s", [r for r in v if _scalar(r.get("gbps"))],
                        label=lambda r: str(r.get("path", r.get("name"))), value="gbps", baseline=None,
                        unit="GB/s")
        elif isinstance(v, dict):
            s.table(key, ["field", "value"], [[k, x if _scalar(x) else str(x)] for k, x in v.items()])
        elif isinstance(v, list):
            s.table(key, ["value"], [[x if _scalar(x) else str(x)] for x in v[:MAX_TABLE_ROWS]])


VIEWS: dict[str, Callable[[dict, Section], None]] = {
    "io": io_view, "demo": demo_view, "model": model_view, "checkpoint": checkpoint_view, "kv": kv_view,
    "train": train_view, "integrity": integrity_view, "data": data_view, "codecs": codecs_view,
    "list": list_view, "crash": crash_view, "catalog": catalog_view,
}


def build_section(kind: str, data: Any) -> Section:
    """The plots and tables for one benchmark JSON.

    Args:
        kind: the benchmark (the JSON's ``benchmark`` field); kinds without a
            view in :data:`VIEWS` get :func:`generic_view`.
        data: the parsed JSON.

    Returns:
        The section, with a ``targets`` table when the JSON has targets. A
        view that fails on an unexpected shape is replaced by the generic one,
        with a note saying why.
    """
    s = Section(kind)
    view = VIEWS.get(kind) if isinstance(data, dict) else None
    if view is not None:
        try:
            view(data, s)
        except Exception as exc:  # a shape this view does not know: show the data as tables
            s = Section(kind, notes=[f"the {kind} view could not read this file ({type(exc).__name__}: "
                                     f"{exc}); its data is shown as tables"])
            view = None
    if view is None:
        generic_view(data, s)
    targets = _list(data, "targets") if isinstance(data, dict) else []
    s.table("Targets", ["target", "want", "got", "met"],
            [[t.get("target"), f"{t.get('compare', '>=')} {t.get('want')}", t.get("got"),
              f"inconclusive: {t['inconclusive']}" if t.get("inconclusive") and not t.get("met") else t.get("met")]
             for t in targets])
    return s
