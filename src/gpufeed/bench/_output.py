"""What every benchmark writes besides its table: progress on stderr, a one-line
summary, and the JSON file.

* :class:`BenchProgress` shows one line per phase on stderr (a bar where the
  phase knows its total, a spinner otherwise) and ends with a one-line
  summary. It draws nothing when stderr is not a terminal or when
  :func:`set_quiet` (``--quiet``) or ``GPUFEED_QUIET=1`` asks for silence, so
  it never mixes into piped output or JSON; the summary line is printed
  whenever the run is not quiet.
* :func:`write_json` writes a benchmark's report with the ``command`` that
  produced it (added when the report lacks one), so every JSON file under
  ``docs/bench`` says how to make it again.

Usage::

    with BenchProgress("kv") as progress:
        progress.step("recompute")  # ends when the next phase starts
        ...
        with progress.phase("upload", total=nbytes, bytes_=True) as advance:
            advance(len(chunk))
        progress.summary(summary_line("kv", report, json_path))
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["BenchProgress", "set_quiet", "is_quiet", "command_line", "write_json", "summary_line"]

T = TypeVar("T")
_quiet = False


def set_quiet(quiet: bool = True) -> None:
    """Silence (or restore) progress and summary lines for this process (``--quiet``)."""
    global _quiet
    _quiet = quiet


def is_quiet() -> bool:
    """True after :func:`set_quiet` or with env ``GPUFEED_QUIET`` set to a non-empty value other than 0."""
    return _quiet or os.environ.get("GPUFEED_QUIET", "") not in ("", "0")


class BenchProgress:
    """Progress of one benchmark run on stderr, one line per phase.

    Use it as a context manager, or call :meth:`start` and :meth:`close`
    (in a ``finally``) around a run whose body already sits in a ``try``.

    Args:
        name: the benchmark, shown before each phase (``"kv"``).
        quiet: True draws nothing and prints no summary; None (default)
            follows :func:`is_quiet`.
        enabled: draw (True) or not (False) whatever stderr is; None
            (default) draws only when stderr is a terminal. A quiet run never draws.

    Rich's live display also carries what the benchmark prints to stdout
    meanwhile, above the progress lines, so tables and phases do not tear.
    """

    def __init__(self, name: str, *, quiet: bool | None = None, enabled: bool | None = None) -> None:
        self.name = name
        self.quiet = is_quiet() if quiet is None else quiet
        self.enabled = not self.quiet and (sys.stderr.isatty() if enabled is None else enabled)
        self._started = time.perf_counter()
        self._summary: str | None = None
        self._progress: Any = None
        self._task: Any = None  # the phase started by step(), ended by the next step() or close()

    def start(self) -> BenchProgress:
        """Start drawing (when enabled); returns self. Calling it again does nothing."""
        if self.enabled and self._progress is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                SpinnerColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description}"),
                BarColumn(), TaskProgressColumn(), _amount_column(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False)
            self._progress.start()
            atexit.register(self.close)  # an error that ends the process still restores the terminal
        return self

    def close(self) -> None:
        """End the current phase and stop drawing; then print the summary, if one was set."""
        self._end(self._task)
        self._task = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            atexit.unregister(self.close)
        if self._summary is not None and not self.quiet:
            elapsed = time.perf_counter() - self._started
            print(f"{self._summary} ({elapsed:.1f} s)", file=sys.stderr, flush=True)
            self._summary = None

    def __enter__(self) -> BenchProgress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self, line: str) -> None:
        """Set the one-line summary that :meth:`close` prints on stderr (with the run's seconds)."""
        self._summary = line

    def done(self, line: str) -> None:
        """Set the summary and :meth:`close`: for runs that finish after their ``finally``."""
        self.summary(line)
        self.close()

    def _add(self, description: str, total: float | None, bytes_: bool) -> Any:
        if self._progress is None:
            return None
        unit = "bytes" if bytes_ else ("items" if total is not None else "")
        return self._progress.add_task(f"{self.name}: {description}", total=total, unit=unit)

    def _end(self, task: Any) -> None:
        if task is not None and self._progress is not None:
            total = self._progress.tasks[task].total  # tasks are numbered in order from 0
            self._progress.update(task, total=total or 1, completed=total or 1)
            self._progress.stop_task(task)

    def _advance(self, task: Any) -> Callable[[float], None]:
        if task is None:
            return _ignore
        progress = self._progress
        return lambda n: progress.advance(task, n)

    def step(self, description: str, total: float | None = None, bytes_: bool = False) -> Callable[[float], None]:
        """End the current phase and start the next; returns its ``advance(n)``.

        Args:
            description: what the phase does (``"recompute"``).
            total: units of work (bytes with ``bytes_``, else items); None
                shows a spinner and the elapsed time only.
            bytes_: ``total`` and ``advance`` count bytes (shown as MiB/GiB).
        """
        self._end(self._task)
        self._task = self._add(description, total, bytes_)
        return self._advance(self._task)

    def announcing(self, say: Callable[..., None]) -> Callable[..., None]:
        """Wrap a benchmark's ``say`` (e.g. ``console.print``): every line it prints
        that announces a phase (``"  kv_put ..."``: text ending in ``" ..."``)
        also starts that phase with :meth:`step`."""
        def wrapped(*args: Any, **kw: Any) -> None:
            say(*args, **kw)
            if len(args) == 1 and isinstance(args[0], str):
                from rich.text import Text

                text = Text.from_markup(args[0]).plain.strip()
                if text.endswith(" ..."):
                    self.step(text.removesuffix(" ...").strip())
        return wrapped

    @contextmanager
    def phase(self, description: str, total: float | None = None,
              bytes_: bool = False) -> Iterator[Callable[[float], None]]:
        """Show ``description`` while the block runs; yields ``advance(n)``
        (arguments as :meth:`step`). Ends the phase :meth:`step` started, if any."""
        self._end(self._task)
        self._task = None
        task = self._add(description, total, bytes_)
        try:
            yield self._advance(task)
        finally:
            self._end(task)

    def track(self, items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
        """Iterate ``items`` as one phase with a bar of ``total`` (default ``len(items)``)."""
        if total is None and hasattr(items, "__len__"):
            total = len(items)  # type: ignore[arg-type]
        with self.phase(description, total=total) as advance:
            for item in items:
                yield item
                advance(1)


def _ignore(_n: float) -> None:
    """``advance`` when nothing is drawn."""


def _amount_column() -> Any:
    """A rich column showing ``done/total`` as bytes (MiB, GiB) or items, per task."""
    from rich.progress import DownloadColumn, ProgressColumn
    from rich.text import Text

    class AmountColumn(ProgressColumn):
        def __init__(self) -> None:
            super().__init__()
            self._bytes = DownloadColumn(binary_units=True)

        def render(self, task: Any) -> Any:
            unit = task.fields.get("unit")
            if unit == "bytes":
                return self._bytes.render(task)
            if unit == "items" and task.total is not None:
                return Text(f"{int(task.completed)}/{int(task.total)}", style="progress.download")
            return Text("")

    return AmountColumn()


def summary_line(name: str, report: dict, json_path: str | os.PathLike | None = None) -> str:
    """One line about a finished benchmark: rows, targets met, where the JSON went.

    Args:
        name: the benchmark (``"kv"``).
        report: its report dict; ``results`` (a list) and ``targets`` (dicts
            with ``met``) are counted when present.
        json_path: where the JSON was written, if anywhere.

    Returns:
        e.g. ``"bench kv: 8 rows, 1 of 2 targets met, wrote docs/bench/kv.json"``.
    """
    parts = []
    results = report.get("results")
    if isinstance(results, list):
        parts.append(f"{len(results)} rows")
    targets = [t for t in report.get("targets") or [] if isinstance(t, dict)]
    if targets:
        parts.append(f"{sum(bool(t.get('met')) for t in targets)} of {len(targets)} targets met")
    if json_path:
        parts.append(f"wrote {json_path}")
    return f"bench {name}: " + (", ".join(parts) or "done")


def command_line() -> str | None:
    """This process's command as the user typed it, when it is the ``gpufeed`` CLI.

    Returns:
        ``"gpufeed bench io --size 1GiB ..."`` for ``gpufeed ...`` and
        ``python -m gpufeed ...``; None otherwise (a library call, a test).
    """
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    parent = Path(sys.argv[0]).parent.name if sys.argv and sys.argv[0] else ""
    if prog == "gpufeed" or (prog == "__main__.py" and parent == "gpufeed"):
        return shlex.join(["gpufeed", *sys.argv[1:]])
    return None


def write_json(path: str | os.PathLike, report: dict, command: str | None = None) -> Path:
    """Write a benchmark's report as indented JSON, with the command that made it.

    The report's own fields are kept as they are; ``command`` is added only
    when the report has none: ``command`` if given, else :func:`command_line`
    (nothing when neither is known).

    Args:
        path: the JSON file; its folder is created.
        report: the benchmark's report (a JSON-serializable dict); updated in place.
        command: the command line to record when the report lacks one.

    Returns:
        The path written.

    Raises:
        OSError: the file could not be written.
        TypeError: the report is not JSON-serializable.
    """
    if "command" not in report:
        cmd = command or command_line()
        if cmd:
            report["command"] = cmd
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return out
