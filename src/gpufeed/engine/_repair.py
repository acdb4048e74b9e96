"""Repairs of a node's data files from the copies other nodes of a cluster hold.

A data file in a node's folder is either held by it (the chunks' holder,
:attr:`~.types.ChunkRecord.holder`) or a copy of another node's file (a row of
``file_copies``, :mod:`._pgcopies`). When a chunk in it fails its check (a
scrub, :mod:`._scrub`, or a read, :mod:`._handles`), :func:`repair` builds the
file again in a temp file: the bytes of the local file that are there, then,
for each chunk whose bytes there fail their check, good bytes from another
node that holds the file (the chunks' holder and the copies, each asked in
turn over the fetch function the node installed with
:meth:`~gpufeed.engine.Engine.use_peers`, :mod:`gpufeed._peers`). Of a chunk
whose damage is a few 4 KiB blocks (its running CRC32C sums name each bad
block: :data:`PATCH_RANGES` runs at most, together at most half its stored
bytes) only those blocks are fetched; otherwise, or when the patched chunk
still fails its check, the whole chunk is. Every chunk is checked whole
against the catalog's block sums, and a shared chunk's digest, before it is
kept. Only when every chunk of the temp file passes its check is it
fsynced and renamed over the data file (a reader that holds the damaged
file's descriptor keeps reading the old file, and finds it damaged as
before); the chunks' damaged marks are then cleared.

When no other node sends good bytes for a damaged chunk, the file is left as
it is: the holder's chunks stay marked damaged; a copy's ``file_copies`` row
is dropped and the file deleted, so the under-replicated count shows it and
re-replication makes a new copy elsewhere.

:class:`RepairQueue` runs the repairs that reads ask for, one file at a time
on a thread of its own, at most ``max_files`` files waiting
(``GPUFEED_CLUSTER_REPAIR_QUEUE``, :data:`QUEUE_FILES` unless set; a read that
finds the queue full asks nothing: the next scrub finds the file).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import DamagedObject, GpufeedError, HolderUnavailable
from ._blobs import remove_quietly, write_all
from ._blocksums import SUM_BLOCK, SUM_KIND, check_run, crc32c, sums_array
from ._replicas import copy_length
from ._scrub import check_chunk_fd
from .catalog import Catalog
from .types import ChunkRecord

if TYPE_CHECKING:
    from ._chunks import ChunkStore

__all__ = ["Repair", "repair", "RepairQueue", "QUEUE_FILES", "PATCH_RANGES", "bad_spans"]

log = logging.getLogger("gpufeed.engine")

#: Most data files waiting in a :class:`RepairQueue` unless configured.
QUEUE_FILES = 1024
#: Most runs of bad blocks of one chunk fetched as ranges; more: the whole chunk.
PATCH_RANGES = 64
_PATCH_GAP = 16  # good blocks between two bad ones fetched along with them rather than asked for apart
_COPY_STEP = 8 << 20  # 8 MiB: bytes copied from the local file at a time


@dataclass
class Repair:
    """What a repair of one data file did.

    Attributes:
        file: the data file's id.
        copy: whether this node holds it as a copy (``False``: as the chunks' holder).
        bad: ``{chunk id: reason}`` of the chunks whose local bytes failed their check.
        fetched: ``{chunk id: node id}`` the good bytes of each bad chunk came from.
        fetched_bytes: ``{chunk id: stored bytes}`` fetched from other nodes
            for each bad chunk (its bad blocks only, when its damage is a few blocks).
        error: why it could not be repaired (``None``: repaired, or nothing was bad).
        dropped: a copy that could not be repaired was dropped (row and file).
    """

    file: str
    copy: bool = False
    bad: dict[str, str] = field(default_factory=dict)
    fetched: dict[str, str] = field(default_factory=dict)
    fetched_bytes: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    dropped: bool = False

    @property
    def repaired(self) -> bool:
        """Whether bad chunks were found and the file now holds good bytes for each."""
        return bool(self.bad) and self.error is None


def repair(store: "ChunkStore", catalog: Catalog, file: str) -> Repair:
    """Check data file ``file`` of this node's folder and repair it from another
    node that holds it (see the module's text): on success the file is replaced
    whole and the damaged marks of its chunks are cleared (holder); on failure
    the holder's bad chunks are marked damaged, a copy is dropped.

    Returns:
        The :class:`Repair` (``error`` says why it failed; nothing raised for that).

    Raises:
        CatalogUnavailable: the catalog could not be read or written.
    """
    recs = catalog.file_records(file)
    me = store.holder
    copy = bool(recs) and recs[0].holder != me
    out = Repair(file, copy)
    if not recs or (copy and me not in catalog.file_copies(file)):
        return out  # freed meanwhile, or not this node's to judge
    try:
        _rebuild(store, file, recs, out)
    except OSError as exc:
        out.error = f"the data folder failed: {exc}"
    if not out.bad:
        return out
    if out.error is None:
        known = catalog.damaged_chunks()
        for c in recs:
            store.mapped_ok.discard(c.chunk_id)
            if not copy and c.chunk_id in known:
                store.clear_damage(c.chunk_id)
        if not catalog.file_records(file):
            remove_quietly(store.file_path(file))  # freed while it was repaired
        log.warning("data file %s (%s) repaired: %s", file, "a copy" if copy else "held here",
                    ", ".join(f"chunk {c} from node {n}" for c, n in sorted(out.fetched.items())))
        return out
    if copy:
        catalog.drop_file_copies({file})
        remove_quietly(store.file_path(file))
        store.files.open_files.forget([file])
        out.dropped = True
        log.warning("copy of data file %s is damaged and could not be repaired (%s); the copy was dropped",
                    file, out.error)
    else:
        for cid, reason in out.bad.items():
            store.report_damage(cid, reason, counted=False)
        log.error("data file %s is damaged and could not be repaired: %s", file, out.error)
    return out


def _rebuild(store: "ChunkStore", file: str, recs: list[ChunkRecord], out: Repair) -> None:
    """Fill ``out.bad`` and ``out.fetched``; publish the repaired file when every
    bad chunk got good bytes (else set ``out.error``)."""
    fd, tmp = store.files.new_temp()
    try:
        _copy_local(store.file_path(file), fd, copy_length(recs))
        for c in recs:
            reason = check_chunk_fd(fd, c)
            if reason is None:
                continue
            out.bad[c.chunk_id] = reason
            node, why = _fetch_good(store, c, fd, out)
            if node is None:
                out.error = f"chunk {c.chunk_id} ({reason}): {why}"
                break
            out.fetched[c.chunk_id] = node
        if out.bad and out.error is None:
            if store.files.fsync:
                os.fsync(fd)
        else:
            remove_quietly(tmp)
    except BaseException:
        os.close(fd)
        remove_quietly(tmp)
        raise
    os.close(fd)
    if out.bad and out.error is None:
        store.files.publish_blob(tmp, file)
        store.files.open_files.forget([file])  # new readers open the repaired file


def _copy_local(path: str, fd: int, length: int) -> None:
    """Copy the first ``length`` bytes of ``path`` to ``fd`` in 8 MiB steps, as
    far as they can be read (a missing file: none; a step the disk cannot
    read is left as zeros, so its chunks fail their check and are fetched),
    and size ``fd`` to ``length`` bytes."""
    os.ftruncate(fd, length)
    try:
        src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        buf = memoryview(bytearray(min(_COPY_STEP, length) or 1))
        pos = 0
        while pos < length:
            n = min(len(buf), length - pos)
            try:
                got = os.preadv(src, [buf[:n]], pos)
            except OSError:  # an unreadable stretch (a bad sector)
                pos += n
                continue
            if got <= 0:
                break  # the file is short: the rest stays zeros
            write_all(fd, buf[:got], pos)
            pos += got
    finally:
        os.close(src)


def _fetch_good(store: "ChunkStore", c: ChunkRecord, fd: int, out: Repair) -> tuple[str | None, str]:
    """Fetch chunk ``c``'s bad blocks, or its whole stored bytes, into ``fd``
    from another node that holds its data file, each in turn until one sends
    bytes that pass their check; counts the bytes in ``out.fetched_bytes``.

    Returns:
        ``(node id, "")``, or ``(None, why each node failed)``.
    """
    fetch = store.remote
    if fetch is None:
        return None, "this node fetches from no other node"
    nodes = [n for n in store.holders(c) if n and n != store.holder]
    spans = bad_spans(fd, c)
    failures: list[str] = []
    for node in nodes:
        try:
            if spans:
                for span in spans:
                    fetch(c, [node], fd, span)
                    out.fetched_bytes[c.chunk_id] = out.fetched_bytes.get(c.chunk_id, 0) + span[1]
                if check_chunk_fd(fd, c) is None:
                    return node, ""
                spans = []  # still bad (a bad block with a good sum, a bad digest): the whole chunk
            fetch(c, [node], fd)
            out.fetched_bytes[c.chunk_id] = out.fetched_bytes.get(c.chunk_id, 0) + c.stored
        except (HolderUnavailable, DamagedObject) as exc:
            failures.append(exc.message)
            continue
        reason = check_chunk_fd(fd, c)
        if reason is None:
            return node, ""
        failures.append(f"the bytes node {node} sent failed their check ({reason})")
    return None, "; ".join(failures) or "no other node holds a copy"


def bad_spans(fd: int, c: ChunkRecord) -> list[tuple[int, int]]:
    """The runs of chunk ``c``'s stored bytes in ``fd`` whose 4 KiB blocks fail
    their running CRC32C sums, as ``(offset into the stored bytes, length)``,
    runs closer than a few blocks joined; ``[]`` when the whole chunk is to be
    fetched instead (legacy sums, sums missing, more than :data:`PATCH_RANGES`
    runs, half its bytes or more, or the file cannot be read)."""
    if c.sum_kind != SUM_KIND or not c.stored or len(c.sums) < 4 * -(-c.stored // SUM_BLOCK):
        return []
    sums = sums_array(c.sums, c.sum_kind)
    bad: list[int] = []
    buf = memoryview(bytearray(min(c.stored, _COPY_STEP)))
    try:
        for start in range(0, c.stored, len(buf)):
            n = min(len(buf), c.stored - start)
            if os.preadv(fd, [buf[:n]], c.file_offset + start) != n:
                return []
            first = start // SUM_BLOCK
            if check_run([buf[:n]], sums, first, n) < 0:
                continue
            for i in range(first, first + -(-n // SUM_BLOCK)):  # the slow pass: name every bad block
                rel = (i - first) * SUM_BLOCK
                if crc32c(buf[rel:min(rel + SUM_BLOCK, n)], sums[i - 1] if i else 0) != sums[i]:
                    bad.append(i)
            if 2 * len(bad) * SUM_BLOCK >= c.stored:
                return []
    except OSError:
        return []
    spans: list[list[int]] = []
    for b in bad:
        if spans and b - spans[-1][1] <= _PATCH_GAP:
            spans[-1][1] = b + 1
        else:
            spans.append([b, b + 1])
    out = [(a * SUM_BLOCK, min(z * SUM_BLOCK, c.stored) - a * SUM_BLOCK) for a, z in spans]
    if not out or len(out) > PATCH_RANGES or 2 * sum(n for _, n in out) >= c.stored:
        return []
    return out


class RepairQueue:
    """Repairs the data files that reads found damaged, one at a time, on a
    thread that runs while files wait (see the module's text).

    Args:
        run: ``run(file)``: repair one file (:func:`repair` bound to the node's store and catalog).
        max_files: most files waiting; more are not queued.
    """

    def __init__(self, run: Callable[[str], Repair], max_files: int = QUEUE_FILES) -> None:
        self._run, self._max = run, max_files
        self._waiting: dict[str, None] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: Files this queue repaired since start.
        self.repaired = 0

    def request(self, file: str) -> bool:
        """Ask for a repair of data file ``file``. Returns whether it waits now."""
        with self._lock:
            if self._stop.is_set() or (file not in self._waiting and len(self._waiting) >= self._max):
                return False
            self._waiting[file] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="gpufeed-repair", daemon=True)
                self._thread.start()
            return True

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._waiting:
                    self._thread = None
                    return
                file = next(iter(self._waiting))
            try:
                if self._run(file).repaired:
                    self.repaired += 1
            except GpufeedError as exc:
                log.warning("repair of data file %s stopped: %s", file, exc.message)
            except Exception:  # noqa: BLE001 - the engine closed under it, or the disk failed: logged
                if not self._stop.is_set():
                    log.exception("repair of data file %s failed", file)
            with self._lock:
                self._waiting.pop(file, None)

    def wait(self, timeout_s: float = 10.0) -> bool:
        """Wait until no file waits. Returns whether none does."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)
        return not self._waiting

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the file in progress; files still waiting are not repaired."""
        self._stop.set()
        t = self._thread
        if t is not None and t.is_alive():
            t.join(timeout_s)
