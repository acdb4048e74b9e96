"""Scrub: read every chunk the catalog names and check it, the way a read does
(block sums; a compressed chunk must also decompress to its size; a shared
chunk's data must also match its digest), at a bounded rate.

Damaged and missing chunks are marked in the catalog (reads of them fail at
once with :class:`~gpufeed.errors.DamagedObject`) and reported with the object
versions that use them; a chunk marked damaged that now checks out is
cleared. On a cluster node (a catalog shared through PostgreSQL) the chunks
whose data files this node holds are checked
(:attr:`~.types.ChunkRecord.holder`), and those of the copies of other nodes'
data files it keeps (``file_copies``); only the holder's damage is marked.
With a ``repair`` function (a cluster node: :func:`._repair.repair`), each
data file with a damaged chunk is then rebuilt from another node's good copy
(the report's ``repaired``); one that cannot be stays marked damaged, with
the reason in its entry, and a copy that cannot be is dropped
(``dropped_copies``). Data files no chunk names are reported as orphans (they are deleted
at the next start; scrub never deletes, because a write in progress publishes
its files before its commit).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import CatalogUnavailable
from ._chunkreads import ChunkDamage, ReadStep, chunk_sums, run_step
from ._chunks import ChunkStore
from ._codecs import chunk_digest
from ._private import FILE_MODE
from .catalog import Catalog
from .types import ChunkRecord

if TYPE_CHECKING:
    from ._repair import Repair

__all__ = ["ScrubReport", "ScrubRunner", "scrub", "check_chunk", "check_chunk_fd"]

log = logging.getLogger("gpufeed.engine")

_PAGE = 512  # chunks read from the catalog at a time
_STEP = 8 << 20  # bytes read at a time


@dataclass
class ScrubReport:
    """What a scrub found.

    Attributes:
        chunks: chunks checked.
        bytes: stored bytes read.
        seconds: wall time.
        damaged: ``{"chunk", "reason", "objects": [[bucket, key, version_id], ...]}``
            of each chunk that failed (missing files included) and was not
            repaired; ``"repair"``: why no repair was made (a cluster node);
            ``"copy": True``: a chunk of a copy this node keeps (never marked).
        cleared: chunks marked damaged before that now check out.
        repaired: ``{"chunk", "file", "reason", "from", "copy", "fetched_bytes"}``
            of each damaged chunk whose data file was rebuilt with good bytes
            from node ``from`` (``copy``: the file is this node's copy of
            another node's; ``fetched_bytes``: the stored bytes fetched, its bad
            blocks only when they were few).
        dropped_copies: ``{"chunk", "file", "reason", "repair"}`` of each damaged
            chunk of a copy that could not be repaired (the copy was dropped).
        orphan_files: data files in the folder that no chunk names.
        complete: the walk reached the end (not stopped).
    """

    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    damaged: list[dict] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    repaired: list[dict] = field(default_factory=list)
    dropped_copies: list[dict] = field(default_factory=list)
    orphan_files: list[str] = field(default_factory=list)
    complete: bool = False

    def as_dict(self) -> dict:
        """JSON-ready form."""
        return {"chunks": self.chunks, "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "damaged": self.damaged, "cleared": self.cleared, "repaired": self.repaired,
                "dropped_copies": self.dropped_copies, "orphan_files": self.orphan_files,
                "complete": self.complete}


def check_chunk(store: ChunkStore, c: ChunkRecord) -> str | None:
    """Read and check one chunk the way a read does (:func:`check_chunk_fd`).
    Returns ``None`` when good, else the reason."""
    try:
        fd = os.open(store.file_path(c.file), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "data file is missing"
    try:
        return check_chunk_fd(fd, c)
    finally:
        os.close(fd)


def check_chunk_fd(fd: int, c: ChunkRecord) -> str | None:
    """Check chunk ``c`` in the open data file ``fd`` the way a read does
    (:func:`._chunkreads.run_step`, raw data in 8 MiB steps through one buffer);
    a shared chunk's data must also match its digest. Returns ``None`` when
    good, else the reason."""
    try:
        size = os.fstat(fd).st_size
        if c.file_offset + c.stored > size:
            return f"data file has {size} bytes, the chunk needs {c.file_offset + c.stored}"
        if not c.sums and c.stored:
            return "the chunk has no block sums"
        sums = chunk_sums(c)
        whole = bool(c.codec) or c.domain is not None  # decoded at once, or digested whole
        buf = memoryview(bytearray(c.size if whole else min(c.size, _STEP)))
        for rel in range(0, c.size, len(buf) or 1):
            run_step(ReadStep(fd, c, sums, rel, buf[:min(len(buf), c.size - rel)], True))
        if c.domain is not None and chunk_digest(buf, "blake3" if len(c.digest) == 32 else "xxh3") != c.digest:
            return "data does not match its digest"
        return None
    except ChunkDamage as exc:
        return exc.reason
    except OSError as exc:
        return f"read failed: {exc}"


def scrub(store: ChunkStore, catalog: Catalog, *, rate_bytes_s: float = 0, stop: threading.Event | None = None,
          progress: Callable[[int, int], None] | None = None,
          repair: Callable[[str], "Repair"] | None = None) -> ScrubReport:
    """Check every chunk this node holds once, its copies' included.

    Args:
        store: the engine's chunk store.
        catalog: its catalog.
        rate_bytes_s: most bytes read per second (0: as fast as the disk goes).
        stop: set it to end the walk early (``complete`` is then False).
        progress: called with ``(chunks done, bytes done)`` after each chunk.
        repair: ``repair(file)`` rebuilds a data file with a damaged chunk from
            another node (:func:`._repair.repair`); ``None``: nothing is repaired.

    Returns:
        The :class:`ScrubReport`.
    """
    rep = ScrubReport()
    t0 = time.monotonic()
    known = catalog.damaged_chunks()
    copies = catalog.copy_files()
    found: dict[str, list[dict]] = {}  # data file -> its damaged chunks' entries
    after = ""
    while True:
        page = catalog.scan_chunks(after, _PAGE)
        for c in page:
            if stop is not None and stop.is_set():
                rep.seconds = time.monotonic() - t0
                return rep
            copy = c.holder != catalog.holder
            if copy and c.file not in copies:
                continue  # another node's data file (or none recorded): its holder scrubs it
            _check_one(store, catalog, c, copy, known, rep, found)
            if progress is not None:
                progress(rep.chunks, rep.bytes)
            if rate_bytes_s > 0:
                ahead = rep.bytes / rate_bytes_s - (time.monotonic() - t0)
                if ahead > 0:
                    (stop.wait(ahead) if stop is not None else time.sleep(ahead))
        if len(page) < _PAGE:
            break
        after = page[-1].chunk_id
    _settle(store, rep, found, repair)
    live = catalog.data_files() | catalog.copy_files()
    rep.orphan_files = sorted(f for f in store.files.list_data_files() if f not in live)
    rep.complete = True
    rep.seconds = time.monotonic() - t0
    if rep.repaired:
        log.warning("scrub: %d damaged chunks repaired from other nodes (%s)", len(rep.repaired),
                    ", ".join(f"{d['chunk']} from {d['from']}" for d in rep.repaired[:5]))
    if rep.dropped_copies:
        log.warning("scrub: %d damaged chunks in copies that could not be repaired; those copies were dropped (%s)",
                    len(rep.dropped_copies), ", ".join(d["file"] for d in rep.dropped_copies[:5]))
    if rep.damaged:
        log.error("scrub: %d damaged chunks (%s)", len(rep.damaged),
                  ", ".join(d["chunk"] for d in rep.damaged[:5]))
    return rep


def _check_one(store: ChunkStore, catalog: Catalog, c: ChunkRecord, copy: bool, known: dict,
               rep: ScrubReport, found: dict[str, list[dict]]) -> None:
    """Check chunk ``c`` (in a copy this node keeps, or held here): count it, note
    its damage in ``found``; only a holder's chunk is marked or cleared."""
    reason = check_chunk(store, c)
    rep.chunks += 1
    rep.bytes += c.stored
    if reason is not None:
        users = [list(u) for u in catalog.chunk_users(c.chunk_id)]
        entry: dict = {"chunk": c.chunk_id, "reason": reason, "objects": users}
        if copy:
            entry["copy"] = True
        found.setdefault(c.file, []).append(entry)
        if not copy and c.chunk_id not in known:
            store.report_damage(c.chunk_id, reason, counted=False)
    elif not copy and c.chunk_id in known:
        store.clear_damage(c.chunk_id)
        rep.cleared.append(c.chunk_id)


def _settle(store: ChunkStore, rep: ScrubReport, found: dict[str, list[dict]],
            repair: Callable[[str], "Repair"] | None) -> None:
    """Repair each data file of ``found`` (when ``repair`` is given) and sort its
    entries into the report: repaired, dropped copies, or still damaged."""
    for file, entries in found.items():
        done = repair(file) if repair is not None else None
        copy = bool(entries[0].get("copy"))
        if done is not None and done.error is None and not done.bad:  # freed, or good again meanwhile
            for e in entries:
                if not copy and e["chunk"] in store.damaged:
                    store.clear_damage(e["chunk"])
            continue
        for e in entries:
            if done is not None and done.repaired:
                rep.repaired.append({"chunk": e["chunk"], "file": file, "reason": e["reason"],
                                     "from": done.fetched.get(e["chunk"], ""), "copy": copy,
                                     "fetched_bytes": done.fetched_bytes.get(e["chunk"], 0)})
                continue
            if done is not None:
                e["repair"] = done.error
            if done is not None and done.dropped:
                rep.dropped_copies.append({"chunk": e["chunk"], "file": file, "reason": e["reason"],
                                           "repair": done.error})
            else:
                rep.damaged.append(e)


class ScrubRunner:
    """Scrubs in the background, one at a time: on demand (:meth:`start`) and,
    once :meth:`schedule` is called, every ``interval_s`` seconds after the last
    complete one (its time is kept in ``<data_dir>/scrub.json`` with its report,
    so a restart does not scrub again early).

    Args:
        run: ``run(rate_bytes_s, stop, progress) -> ScrubReport`` (the engine's scrub).
        state_path: where the last report is kept.
    """

    def __init__(self, run: Callable[..., ScrubReport], state_path: str) -> None:
        self._run = run
        self._path = state_path
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: threading.Thread | None = None
        self._progress = (0, 0)
        self._started = 0.0
        self._cancel = threading.Event()  # ends the scrub in progress (stop() ends the schedule too)
        self.last: dict | None = self._load()

    def _load(self) -> dict | None:
        try:
            with open(self._path) as f:
                got = json.load(f)
            return got if isinstance(got, dict) else None
        except (OSError, ValueError):
            return None

    def start(self, rate_bytes_s: float = 0) -> bool:
        """Start a scrub now unless one runs. Returns whether one was started."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            self._progress, self._started = (0, 0), time.time()
            self._cancel = threading.Event()
            self._thread = threading.Thread(target=self._scrub, args=(rate_bytes_s, self._cancel),
                                            name="gpufeed-scrub", daemon=True)
            self._thread.start()
            return True

    def cancel(self) -> bool:
        """End the scrub in progress (its report is not kept). Returns whether one ran."""
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            self._cancel.set()
        self.wait(10.0)
        return running

    def _scrub(self, rate: float, cancel: threading.Event) -> None:
        try:
            rep = self._run(rate_bytes_s=rate, stop=cancel,
                            progress=lambda n, b: setattr(self, "_progress", (n, b)))
        except CatalogUnavailable as exc:  # the database is away: the next pass scrubs
            log.warning("scrub stopped: %s", exc.message)
            return
        except Exception:  # noqa: BLE001 - the engine closed under it, or the disk failed: logged
            if not cancel.is_set():
                log.exception("scrub failed")
            return
        if not rep.complete:
            return
        out = {"finished": time.time(), "started": self._started, **rep.as_dict()}
        self.last = out
        try:
            tmp = self._path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
            os.fchmod(fd, FILE_MODE)
            with os.fdopen(fd, "w") as f:  # private: it names damaged objects
                json.dump(out, f)
            os.replace(tmp, self._path)
        except OSError as exc:
            log.error("could not keep the scrub report: %s", exc)

    def status(self) -> dict:
        """``{"running", "chunks", "bytes", "started_at", "last"}``: the scrub in
        progress (chunks and bytes checked so far, Unix s it started) and the
        last complete report."""
        running = self._thread is not None and self._thread.is_alive()
        n, b = self._progress
        return {"running": running, "chunks": n if running else 0, "bytes": b if running else 0,
                "started_at": self._started if running else 0.0, "last": self.last}

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the scrub in progress; True when none runs any more."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)
            return not t.is_alive()
        return True

    def schedule(self, interval_s: float, rate_bytes_s: float) -> None:
        """Scrub every ``interval_s`` seconds (> 0) at ``rate_bytes_s``, counting
        from the last complete scrub (or from now, when there was none)."""
        def loop() -> None:
            while not self._stop.is_set():
                last = (self.last or {}).get("finished", 0.0) or first
                due = last + interval_s - time.time()
                if due > 0:
                    self._stop.wait(min(due, 3600.0))
                    continue
                self.start(rate_bytes_s)
                self.wait()
                if not (self.last or {}).get("finished", 0.0) > last:
                    self._stop.wait(min(interval_s, 3600.0))  # failed: try again later
        first = time.time()
        self._timer = threading.Thread(target=loop, name="gpufeed-scrub-schedule", daemon=True)
        self._timer.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the scrub in progress and the schedule."""
        self._stop.set()
        self._cancel.set()
        for t in (self._thread, self._timer):
            if t is not None and t.is_alive():
                t.join(timeout_s)
