"""How full a cluster node is: its used bytes, its capacity, its free bytes,
and whether a data file fits.

A cluster node's **used bytes** are the bytes of the files in its data
folder: the data files it holds as their chunks' holder, the copies it keeps
for other nodes, the part files of multipart uploads in progress, and the
data files of a write through it until the write has placed them elsewhere
(not the temp files of writes under way, in ``tmp/``: those take disk space,
which ``statvfs`` shows, until the write ends). They are counted by a walk
of the folder every ``count_interval_s`` seconds, plus the bytes of each
data file stored here since that walk began (:meth:`NodeRoom.add_file`: a
write's file it keeps, a copy another node pushed, a part file) that the
walk did not count (the walk notes the files whose status changed after it
began, so a file stored while it runs is counted once), less the bytes of
the files deleted since that the node counts off (:meth:`NodeRoom.removing`:
a completed, aborted or replaced part's, a data file moved off while
draining, a write's file that its targets hold, an orphan); another file
deleted since the walk, or one deleted while a walk runs, counts until the
next walk (after one deleted while a walk ran, the next comes as soon as a
recount may), so the figure errs towards full. One walk runs at a time; a
caller that finds one under way gets the figures until it ends. Before a
node says that a file does not fit, it walks the folder again (a
**recount**: the figures may count files deleted since the last walk),
unless its last walk ended less than ``RECOUNT_SPACING`` times that walk's
duration ago (so recounts take at most about a fifth of one core).

Its **capacity** is ``--capacity`` (``GPUFEED_CAPACITY``) when set, else the
size of the data folder's file system. Its **free bytes** are the smaller of
``capacity - used`` and the file system's free bytes (``statvfs``, read at
each call) less the **reserve** (``GPUFEED_CLUSTER_RESERVE``), never below 0.
A node is **full** when less than 1 % of its capacity, or less than 1 MiB,
is free (it may still take smaller files; placement asks of each file).

A data file of ``n`` bytes **fits** on a node when its free bytes are at
least ``n``. Placement (:mod:`gpufeed._replicas`) asks that of every node,
by the figures each publishes with its heartbeat
(:class:`~._membership.NodeInfo`, :func:`node_fits`); a node asked to store
a copy checks its own figures again (:meth:`NodeRoom.check_keep`) and
refuses one that does not fit with ``StorageFull``. A part of a multipart
upload (from UploadPart, or a copy another member pushed) is admitted the
same way (:meth:`NodeRoom.reserve` before its file lands in the upload's
folder, then :meth:`NodeRoom.add_file` and :meth:`NodeRoom.release`).

A node **drains** once its used bytes pass its **high-water mark**
(``high_water`` of its capacity, ``GPUFEED_CLUSTER_DRAIN_HIGH``, 0.9) and
until they are back at or under its **low-water mark** (``low_water``,
``GPUFEED_CLUSTER_DRAIN_LOW``, 0.8). While it drains, its **moving bytes**
are its used bytes less the low-water mark (0 otherwise); they are published
with its heartbeat, placement ranks a draining node after every member with
room that is not draining, and the node moves copies of its data files to
other members (:mod:`gpufeed._drain`), counting each file it gave up
(:meth:`NodeRoom.removing`, :meth:`NodeRoom.moved_off`) off its used bytes
at once.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StorageFull
from ._blobs import remove_quietly

if TYPE_CHECKING:
    from ._membership import NodeInfo

__all__ = ["Usage", "NodeRoom", "removing", "remove_counted", "node_fits", "node_draining", "is_full", "folder_bytes",
           "RECOUNT_SPACING"]

#: A node is full when less than this share of its capacity is free ...
FULL_BELOW = 0.01
#: ... or less than this many bytes.
FULL_BELOW_BYTES = 1 << 20  # 1 MiB
#: A recount (a walk before saying that a file does not fit) waits at least this
#: many times the last walk's duration after that walk ended.
RECOUNT_SPACING = 4.0


def folder_bytes(folder: str | Path, skip: tuple[str, ...] = ()) -> int:
    """Bytes of the regular files under ``folder``, but for its subfolders named in ``skip``
    (files that vanish during the walk are skipped)."""
    return _count_files(folder, skip, float("inf"))[0]


def _count_files(folder: str | Path, skip: tuple[str, ...], since: float) -> tuple[int, dict[str, float]]:
    """:func:`folder_bytes`, and ``{path: st_ctime}`` of the files it counted whose
    status changed at or after ``since`` (Unix s)."""
    total = 0
    recent: dict[str, float] = {}
    for root, dirs, files in os.walk(folder):
        if root == str(folder):
            dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
                if st.st_ctime >= since:
                    recent[path] = st.st_ctime
    return total, recent


def is_full(capacity_bytes: int, free_bytes: int) -> bool:
    """Whether a node with ``free_bytes`` of ``capacity_bytes`` free counts as full
    (less than 1 % or 1 MiB free; ``free_bytes`` < 0: not reported, never full)."""
    return 0 <= free_bytes < max(FULL_BELOW_BYTES, int(capacity_bytes * FULL_BELOW))


def node_fits(info: "NodeInfo", nbytes: int) -> bool:
    """Whether the member ``info`` has room for a data file of ``nbytes`` bytes, by
    the figures of its last heartbeat (one that reports none is taken to have room;
    it checks for itself when the file arrives)."""
    return info.free_bytes < 0 or info.free_bytes >= nbytes


def node_draining(info: "NodeInfo") -> bool:
    """Whether the member ``info`` was draining at its last heartbeat (it reported
    moving bytes: see the module's text)."""
    return info.moving_bytes > 0


def removing(room: "NodeRoom | None") -> AbstractContextManager[Callable[[int], None]]:
    """:meth:`NodeRoom.removing` of ``room``; without one, a block whose counts go nowhere."""
    return room.removing() if room is not None else nullcontext(_uncounted)


def remove_counted(room: "NodeRoom | None", paths: Iterable[str]) -> None:
    """Delete the files at ``paths`` (missing ones skipped), off the used bytes of
    ``room`` at once as far as its figures counted them (:meth:`NodeRoom.counted_bytes`
    within one :meth:`NodeRoom.removing` block)."""
    with removing(room) as gone:
        for path in paths:
            counted = room.counted_bytes(path) if room is not None else 0
            remove_quietly(path)
            gone(counted)


def _uncounted(nbytes: int) -> None:
    """Count nothing (:func:`removing` without a room)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """A node's figures, bytes.

    Attributes:
        used_bytes: bytes of the files in its data folder (see the module's text).
        capacity_bytes: ``--capacity``, else the size of its file system.
        free_bytes: what it can still take (see the module's text), >= 0.
        moving_bytes: while it drains, its used bytes less its low-water mark
            (bytes it still moves to other members); 0 when it does not drain.
    """

    used_bytes: int
    capacity_bytes: int
    free_bytes: int
    moving_bytes: int = 0

    @property
    def draining(self) -> bool:
        """Whether it drains (moves copies of its files to other members)."""
        return self.moving_bytes > 0

    @property
    def full(self) -> bool:
        """Whether less than 1 % of the capacity, or 1 MiB, is free (:func:`is_full`)."""
        return is_full(self.capacity_bytes, self.free_bytes)


class NodeRoom:
    """The used, capacity and free bytes of one node's data folder (thread-safe).

    Args:
        folder: the data folder.
        capacity_bytes: the configured capacity (0: the file system's size).
        reserve_bytes: bytes of the file system kept free (>= 0).
        count_interval_s: seconds between walks of the folder (>= 0; 0: a walk at every call).
        placing: whether new data files are placed on their nodes by
            :mod:`gpufeed._replicas` (replication factor > 1): a write's own
            staging then needs room on the disk only (:meth:`check_write`).
        statvfs: how the file system is asked (``os.statvfs``).
        high_water: share of the capacity past which the node drains (0 < ``high_water`` <= 1;
            only with ``placing``: with factor 1 a write stays on its writer, so nothing moves).
        low_water: share of the capacity at or under which it stops draining
            (0 <= ``low_water`` < ``high_water``).

    Attributes:
        moved_files, moved_bytes: data files (and their bytes) moved off since start.

    Raises:
        ValueError: a negative ``capacity_bytes`` or ``reserve_bytes``, or marks out of range.
    """

    def __init__(self, folder: str | Path, *, capacity_bytes: int = 0, reserve_bytes: int = 0,
                 count_interval_s: float = 60.0, placing: bool = True,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 high_water: float = 0.9, low_water: float = 0.8) -> None:
        if capacity_bytes < 0 or reserve_bytes < 0:
            raise ValueError("a node's capacity and reserve must be >= 0 bytes")
        if not 0 <= low_water < high_water <= 1:
            raise ValueError(f"a node's drain marks must be 0 <= low ({low_water}) < high ({high_water}) <= 1 "
                             "(GPUFEED_CLUSTER_DRAIN_LOW, GPUFEED_CLUSTER_DRAIN_HIGH)")
        self.high_water, self.low_water = high_water, low_water
        self._draining = False
        self.moved_files = self.moved_bytes = 0
        self._walking = False  # a walk of the folder is under way
        self._walks = 0  # walks begun since start
        self._walk_lock = threading.Lock()  # one walk at a time
        self.folder = str(folder)
        self.configured_bytes = capacity_bytes
        self.reserve_bytes = reserve_bytes
        self.count_interval_s = count_interval_s
        self.placing = placing
        self._statvfs = statvfs
        self._lock = threading.Lock()
        self._admit = threading.Lock()  # one check-and-reserve at a time (reserve, claim_staged)
        self._pending = 0  # bytes admitted and not yet counted as stored (released by their taker)
        self._walked = 0
        # (path, ctime, bytes) of files stored since the last walk began that it did not count
        self._added: list[tuple[str, float, int]] = []
        self._recent: dict[str, float] = {}  # path -> ctime of the files the last walk counted that changed during it
        self._freed = 0  # bytes of files deleted since the last walk ended (none overlapped a walk)
        self._walked_at = -float("inf")
        self._walk_took = 0.0  # s, the last walk's duration
        self._stale = False  # files were deleted while a walk ran: walk again as soon as a recount may
        self._walk_asked = -float("inf")  # monotonic s at which the last walk began
        self._walk_began = 0.0  # Unix s: files renamed into place before it are in the last walk's count

    def _disk(self) -> tuple[int, int]:
        """``(file system size, its bytes free to this process less the reserve)``."""
        st = self._statvfs(self.folder)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize - self.reserve_bytes

    def used(self, *, recount: bool = False) -> int:
        """The used bytes (a walk of the folder when the last is ``count_interval_s`` old,
        or with ``recount`` or after files were deleted while a walk ran (:meth:`removing`),
        unless the last ended less than ``RECOUNT_SPACING`` times its duration ago; while
        another thread walks it, the figures until that walk ends, or with ``recount``
        that walk's)."""
        asked = time.monotonic()
        with self._lock:
            walked_once = self._walked_at > -float("inf")
            if not self._due(asked, recount):
                return self._figure()
        # one walk at a time: a walk that ended after a newer one would put back a count that
        # misses the files stored between their starts (their add_file entries are gone)
        if not self._walk_lock.acquire(blocking=recount or not walked_once):
            with self._lock:
                return self._figure()  # the last walk and the counts since
        try:
            with self._lock:
                if self._walk_asked >= asked or not self._due(time.monotonic(), recount):
                    return self._figure()  # walked while this thread waited
                # a walk at its interval ends the counts of check_write too (a recount keeps them)
                checked = time.monotonic() - self._walked_at >= self.count_interval_s
                self._walking, self._walks, self._stale = True, self._walks + 1, False
                self._walk_asked = time.monotonic()
            began = self._mark_walk()
            try:
                walked, recent = _count_files(self.folder, ("tmp",), began)
            finally:
                with self._lock:
                    self._walking = False
            with self._lock:  # a file stored since the walk began is counted by it or by add_file, not both
                self._added = [(p, c, n) for p, c, n in self._added
                               if (c >= began and recent.get(p) != c) or (p == "" and not checked)]
                self._walked, self._walked_at, self._walk_began = walked, time.monotonic(), began
                self._recent, self._walk_took = recent, self._walked_at - self._walk_asked
                self._freed = 0  # deleted before the walk began: not in its count
                return self._figure()
        finally:
            self._walk_lock.release()

    @property
    def last_walk_s(self) -> float:
        """Seconds the last walk of the folder took (0 before the first)."""
        return self._walk_took

    def _due(self, now: float, recount: bool) -> bool:
        """Whether a walk is due at ``now`` (monotonic s; see :meth:`used`; under ``_lock``)."""
        since = now - self._walked_at
        return since >= self.count_interval_s or \
            ((recount or self._stale) and since >= RECOUNT_SPACING * self._walk_took)

    def _figure(self) -> int:
        """The used bytes by the last walk and the counts since (under ``_lock``)."""
        return max(0, self._walked + sum(n for _, _, n in self._added) - self._freed + self._pending)

    def _mark_walk(self) -> float:
        """Set the data folder's status-change time to now and return it (Unix s): files
        renamed into place later have one as late or later, by the file system's own
        clock, which may be a coarse one, a tick behind ``time.time()``
        (``time.time()`` when the folder's times cannot be set)."""
        try:
            os.utime(self.folder)
            return os.stat(self.folder).st_ctime
        except OSError:
            return time.time()

    def usage(self, *, recount: bool = False) -> Usage:
        """The node's figures now (``recount``: see :meth:`used`)."""
        size, disk_free = self._disk()
        capacity = self.configured_bytes or size
        used = self.used(recount=recount)
        with self._lock:
            if self.placing and used > capacity * self.high_water:
                self._draining = True
            elif used <= capacity * self.low_water:
                self._draining = False
            moving = max(0, used - int(capacity * self.low_water)) if self._draining else 0
        return Usage(used, capacity, max(0, min(capacity - used, disk_free)), moving)

    def moved_off(self, nbytes: int) -> None:
        """Count a data file of ``nbytes`` bytes that this node moved to other members
        and deleted in :attr:`moved_files` / :attr:`moved_bytes` (its bytes come off
        the used bytes through :func:`removing`)."""
        with self._lock:
            self.moved_files += 1
            self.moved_bytes += nbytes

    @contextmanager
    def removing(self) -> Iterator[Callable[[int], None]]:
        """Count files deleted from the folder in the block off the used bytes at its
        end: the block calls the function it gets with the bytes of each (each
        counted before: by a walk, or by :meth:`add_file`). They come off at once
        unless a walk of the folder was under way at any time during the block
        (it may or may not have counted them; the next walk does not, and it
        comes as soon as a recount may: :meth:`used`)."""
        with self._lock:
            walks, clean = self._walks, not self._walking
        freed = [0]

        def gone(nbytes: int) -> None:
            freed[0] += max(0, nbytes)

        yield gone
        with self._lock:
            if freed[0] and clean and not self._walking and self._walks == walks:
                self._freed += freed[0]
            elif freed[0]:
                self._stale = True  # the next walk counts them right: it comes as soon as a recount may

    def add_file(self, path: str, nbytes: int) -> None:
        """Count the data file of ``nbytes`` bytes at ``path``, just stored here, unless the
        last walk counted it: it began after the file was renamed into place (its status
        changed: ``st_ctime``), or found it renamed since it began."""
        try:
            changed = os.stat(path).st_ctime
        except OSError:
            return  # deleted meanwhile
        with self._lock:
            if changed >= self._walk_began and self._recent.get(path) != changed:
                self._added.append((path, changed, nbytes))

    def counted_bytes(self, path: str) -> int:
        """The bytes of the file at ``path`` that the used bytes count now: its size when
        the last walk or :meth:`add_file` counted it, else 0 (a write's file that no walk
        saw; to learn, before deleting it, what :meth:`removing` should count off)."""
        try:
            st = os.stat(path)
        except OSError:
            return 0
        with self._lock:
            seen = st.st_ctime < self._walk_began or self._recent.get(path) == st.st_ctime
            return st.st_size if seen or any(p == path for p, _, _ in self._added) else 0

    def _usage_for(self, nbytes: int) -> Usage:
        """:meth:`usage`, recounted (:meth:`used`) when ``nbytes`` do not fit by the figures."""
        u = self.usage()
        return u if u.free_bytes >= nbytes else self.usage(recount=True)

    def fits(self, nbytes: int) -> bool:
        """Whether a data file of ``nbytes`` bytes fits here now (recounted before saying no)."""
        return self._usage_for(nbytes).free_bytes >= nbytes

    def fits_staged(self, path: str, nbytes: int) -> bool:
        """Whether the data file of ``nbytes`` bytes at ``path``, in this node's folder
        already (a write's), may stay: its bytes are on the disk already, and in the
        used bytes when the last walk counted it (recounted before saying no)."""
        return self._staged_extra(path, nbytes) >= 0

    def _staged_extra(self, path: str, nbytes: int) -> int:
        """The bytes keeping the staged file at ``path`` adds to the used bytes,
        or -1 when it does not fit even recounted (:meth:`fits_staged`)."""
        for recount in (False, True):
            size, disk_free = self._disk()
            used = self.used(recount=recount)
            extra = 0 if self.counted_bytes(path) else nbytes
            if used + extra <= (self.configured_bytes or size) and disk_free >= 0:
                return extra
        return -1

    def claim_staged(self, path: str, nbytes: int) -> int:
        """:meth:`fits_staged`, and when it fits, the bytes it adds counted as
        used at once (pending), so that writes checked at the same time cannot
        together pass the capacity; the caller calls :meth:`release` with the
        answer once the file is counted (:meth:`add_file`) or gone.

        Returns:
            The bytes reserved (0: counted already), or -1: it does not fit.
        """
        with self._admit:
            extra = self._staged_extra(path, nbytes)
            if extra > 0:
                with self._lock:
                    self._pending += extra
            return extra

    def reserve(self, nbytes: int) -> None:
        """:meth:`check_keep`, and the bytes counted as used at once (pending)
        when they fit; the caller calls :meth:`release` once the file is
        counted (:meth:`add_file`) or was not kept.

        Raises:
            StorageFull: they do not fit.
        """
        with self._admit:
            self.check_keep(nbytes)
            with self._lock:
                self._pending += nbytes

    def release(self, nbytes: int) -> None:
        """Stop counting ``nbytes`` bytes :meth:`reserve` or :meth:`claim_staged` admitted."""
        if nbytes > 0:
            with self._lock:
                self._pending -= nbytes

    def check_keep(self, nbytes: int) -> None:
        """Refuse to keep ``nbytes`` more bytes here when they do not fit.

        Raises:
            StorageFull: they do not (the message gives the figures).
        """
        u = self._usage_for(nbytes)
        if u.free_bytes < nbytes:
            raise StorageFull(f"this node is full: {nbytes} bytes more do not fit in its {u.free_bytes} free "
                              f"bytes ({u.used_bytes} of {u.capacity_bytes} used, reserve {self.reserve_bytes}; "
                              "GPUFEED_CAPACITY, GPUFEED_CLUSTER_RESERVE)")

    def check_write(self, nbytes: int) -> None:
        """The check of a write through this node (:meth:`~._chunks.ChunkStore.check_room`):
        with placement, ``nbytes`` must fit on the disk above the reserve (the write's
        files go to the nodes with room, this one among them only when it has room);
        without, they must fit as :meth:`check_keep` says, and are counted as used
        from then on (until the next walk of the folder that is not a recount counts
        what was stored), so
        writes checked at the same time cannot together pass the capacity.

        Raises:
            StorageFull: they do not.
        """
        if not self.placing:
            with self._admit:
                self.check_keep(nbytes)
                with self._lock:
                    self._added.append(("", time.time(), nbytes))
            return
        _, disk_free = self._disk()
        if disk_free < nbytes:
            raise StorageFull(f"the disk of this node's data folder is full: {nbytes} bytes more do not fit in "
                              f"its {max(0, disk_free)} bytes free above the reserve of {self.reserve_bytes} "
                              "(GPUFEED_CLUSTER_RESERVE)")
