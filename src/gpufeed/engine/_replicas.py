"""Copies of data files on other nodes of a cluster: what a write pushes before
it commits, and what a node stores when another pushes a copy to it.

A write of a cluster node stages its data files in its own folder first
(:meth:`~._chunks.ChunkStore.stage`); :func:`replicate_staged` then hands every
new data file, with the records of the chunks in it, to the push function
the node installed (:meth:`~gpufeed.engine.Engine.use_peers`; over the fast
path, :mod:`gpufeed._replicas`), which places it on its nodes and returns
the nodes that hold a durable, checked copy (this node among them when it
keeps the file). Only then does the write's catalog transaction run,
recording those nodes (:func:`record_copies`, the ``file_copies`` table of
:mod:`._pgcopies`) with the version. A file this node does not keep gets the
first of its nodes as its chunks' holder, and this node's file is deleted
after the commit. A push that cannot reach enough nodes
raises before anything is recorded: the staged files are removed here, and
copies some nodes did take are named by no row (each node's orphan sweep
deletes them, ``docs/cluster.md``).

The receiving side (:func:`receive_copy`) writes the bytes to a temp file,
checks every chunk in it against the block sums (and a shared chunk's
digest) the pusher sent, fsyncs it and only then renames it into place, so
a data file present in a folder is always whole and checked: a node that
finds a file it does not hold as the holder can read it as a copy.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import DamagedObject, InternalError, InvalidArgument, StorageFull
from ._blobs import remove_quietly, write_all
from ._room import NodeRoom, Usage, remove_counted, removing
from ._scrub import check_chunk_fd
from .catalog import Catalog, CatalogWriter
from .types import ChunkRecord

if TYPE_CHECKING:
    from ._chunks import ChunkStore, Staged
    from ._multipart import Multipart

__all__ = ["PushFiles", "replicate_staged", "record_copies", "receive_copy", "copy_length", "COPY_MAX_BYTES",
           "ReplicaCalls", "Placed", "write_pieces", "refuse_payload"]

#: ``push([(file id, chunk records in it, by offset), ...]) -> {file id: node ids}``:
#: places each local data file on its nodes and returns, per file, the nodes that
#: hold it (this node's id among them when it keeps its file; empty lists when the
#: factor is 1: this node keeps it). Raises ServiceUnavailable, naming the file and
#: each node's failure, when a file could not reach enough nodes, and StorageFull
#: when too few nodes have room for it.
PushFiles = Callable[[list[tuple[str, list[ChunkRecord]]]], dict[str, list[str]]]


class Placed(dict[str, list[str]]):
    """``{file id: the other nodes with a copy}`` of a staged write, and what to do
    once its transaction commits (delete this node's files that it does not keep)."""

    def __init__(self) -> None:
        super().__init__()
        self.after_commit: list[Callable[[], None]] = []

#: Largest data file a node takes as a copy unless configured, bytes (its block
#: sums, 1/1024 of it, are held in memory while it is checked).
COPY_MAX_BYTES = 64 << 30  # 64 GiB


class ReplicaCalls:
    """The engine's calls for copies of data files on other cluster nodes, mixed
    into :class:`~gpufeed.engine.Engine` (the node's :mod:`gpufeed._replicas` uses them)."""

    _chunks: "ChunkStore"
    _cat: Catalog
    _multipart: "Multipart"

    def use_room(self, room: NodeRoom) -> None:
        """Judge writes through this node, parts uploaded to it and copies pushed to
        it by this cluster node's own figures (:mod:`._room`) instead of the
        catalog's stored bytes."""
        self._room: NodeRoom | None = room
        self._chunks.room = room.check_write
        self._multipart.room = room

    def room_usage(self) -> Usage | None:
        """This cluster node's used, capacity and free bytes (:mod:`._room`); ``None``
        when :meth:`use_room` was not called (outside a cluster on a shared catalog)."""
        room = getattr(self, "_room", None)
        return room.usage() if room is not None else None

    def room_moved(self) -> tuple[int, int]:
        """``(data files, bytes)`` this cluster node moved to other members since start
        while it drained (:mod:`gpufeed._drain`; ``(0, 0)`` without :meth:`use_room`)."""
        room = getattr(self, "_room", None)
        return (room.moved_files, room.moved_bytes) if room is not None else (0, 0)

    def receive_copy(self, file: str, records: list[ChunkRecord], length: int,
                     pieces: Iterable[memoryview]) -> bool:
        """Store a copy of another node's data file ``file``: :func:`receive_copy`
        (which documents the errors), with the limit :meth:`use_peers` set; refused
        with ``StorageFull`` (nothing kept) when it does not fit (:meth:`use_room`)."""
        room = getattr(self, "_room", None)
        reserved = 0
        if room is not None and not os.path.exists(self._chunks.file_path(file)):
            try:
                room.reserve(length)  # counted at once: copies received together cannot pass the capacity
            except StorageFull as exc:
                return refuse_payload(pieces, exc)
            reserved = length
        try:
            stored = receive_copy(self._chunks, file, records, length, pieces,
                                  getattr(self, "_copy_max_bytes", COPY_MAX_BYTES))
            if stored and room is not None:
                room.add_file(self._chunks.file_path(file), length)
        finally:
            if room is not None:
                room.release(reserved)
        return stored

    def data_file_path(self, file: str) -> str:
        """The path data file ``file`` has in this node's folder (whether or not it is there)."""
        return self._chunks.file_path(file)

    def file_records(self, file: str) -> list[ChunkRecord]:
        """The chunks that live in data file ``file``, by offset (empty: no chunk names it now)."""
        return self._cat.file_records(file)

    def file_holders(self, file: str) -> tuple[list[ChunkRecord], list[str]]:
        """The chunks in data file ``file`` (by offset) and the node ids holding it:
        the chunks' holder first, then the copies (both empty: no chunk names it)."""
        recs = self._cat.file_records(file)
        return recs, (self._chunks.holders(recs[0]) if recs else [])

    def damaged_chunk_ids(self) -> set[str]:
        """Ids of the chunks marked damaged in the catalog (one read)."""
        return set(self._cat.damaged_chunks())

    def under_replicated(self, live: list[str], factor: int) -> int:
        """Chunks with fewer than ``factor`` copies on the nodes ``live``."""
        return self._cat.under_replicated(live, factor)

    def under_replicated_parts(self, live: list[str], factor: int) -> int:
        """Parts of open multipart uploads with fewer than ``factor`` copies of their
        file on the nodes ``live``, as the catalog records them (0 where it records none)."""
        count = getattr(self._cat, "under_replicated_parts", None)
        return count(live, factor) if count is not None else 0

    def under_replicated_files(self, live: list[str], factor: int, after: str = "", limit: int = 1000) -> list[str]:
        """Data files (ids after ``after``, at most ``limit``) with a chunk that has fewer
        than ``factor`` copies on the nodes ``live``."""
        return self._cat.under_replicated_files(live, factor, after, limit)

    def free_unnamed_files(self, older_than_s: float) -> int:
        """Delete the data files in this node's folder that no chunk of the catalog
        names and that were last written more than ``older_than_s`` seconds ago
        (copies of deleted data, copies a refused write left behind). A write
        publishes its files before its commit names them, so ``older_than_s``
        must be longer than any write takes. Returns how many were deleted."""
        named = self._cat.data_files() | self._cat.copy_files() | self._cat.unheld_files()
        now = time.time()
        freed = 0
        with removing(getattr(self, "_room", None)) as gone:  # off the used bytes at once
            for f in self._chunks.files.list_data_files():
                path = self._chunks.file_path(f)
                try:
                    st = os.stat(path)
                    if f in named or now - st.st_mtime < older_than_s or self._cat.file_records(f):
                        continue
                except OSError:
                    continue
                remove_quietly(path)
                freed += 1
                gone(st.st_size)
        return freed

    def files_held(self, after: str = "", limit: int = 1000) -> list[str]:
        """Ids of the data files this node holds as their chunks' holder or as a copy,
        after ``after`` in id order (at most ``limit``; none outside a cluster)."""
        return self._cat.files_held(after, limit)

    def over_replicated_files(self, live: list[str], factor: int, after: str = "", limit: int = 1000) -> list[str]:
        """Data files this node holds (ids after ``after``, at most ``limit``) with a chunk
        that has more than ``factor`` copies on the nodes ``live`` (none outside a cluster)."""
        find = getattr(self._cat, "over_replicated_files", None)
        return find(live, factor, after, limit) if find is not None else []

    def give_up_file(self, file: str, live: list[str], factor: int, prefer: list[str]) -> bool:
        """Stop holding data file ``file`` here when ``factor`` other nodes of ``live``
        hold it (:meth:`~gpufeed.engine._postgres.PostgresCatalog.give_up_file`: as
        its holder, the first of ``prefer`` with a copy takes over), then delete this
        node's file (off its used bytes at once: :func:`~._room.removing`). Cached
        manifests are dropped (their chunk records may name this node as the
        holder). Returns whether it gave the file up."""
        path = self._chunks.file_path(file)
        with removing(getattr(self, "_room", None)) as gone:
            if not self._cat.give_up_file(file, live, factor, prefer):
                return False
            self._chunks.manifests.clear()
            try:
                gone(os.stat(path).st_size)
            except OSError:
                pass
            remove_quietly(path)
        self._chunks.files.open_files.forget([file])
        return True

    def record_file_copies(self, copies: dict[str, list[str]]) -> None:
        """Record, in one write transaction of its own, that the nodes ``copies[file]``
        hold copies of each data file ``file`` (nothing for a file no chunk names any more)."""
        with self._cat.write() as w:
            record_copies(w, copies)


def replicate_staged(store: "ChunkStore", st: "Staged", room: NodeRoom | None = None) -> Placed:
    """Place the data files a staged write made on their nodes (before its commit).
    A file this node does not keep gets the first node that holds it as its
    chunks' holder (the records in ``st`` are changed), and this node's file is
    deleted after the commit (off the used bytes of ``room``, this node's
    figures, at once when they counted it).

    Returns:
        ``{file id: the other nodes holding a copy}`` for :func:`record_copies`.

    Raises:
        ServiceUnavailable: too few nodes took a file (the staged files are
            removed; nothing is visible).
        StorageFull: too few nodes have room for a file (the same).
    """
    push = store.push
    placed = Placed()
    if push is None:
        return placed
    files: dict[str, list[ChunkRecord]] = {}
    for rec, _ in st.new.values():
        files.setdefault(rec.file, []).append(rec)
    for rec in st.repairs.values():
        files.setdefault(rec.file, []).append(rec)
    if not files:
        return placed
    try:
        got = push([(f, sorted(recs, key=lambda r: r.file_offset)) for f, recs in sorted(files.items())])
    except BaseException:
        remove_counted(room, st.paths)  # a recount may have counted them
        store.discard(st)
        raise
    me = store.holder
    for f, nodes in got.items():
        if not nodes or me in nodes:
            placed[f] = [n for n in nodes if n != me]
            continue
        placed[f] = nodes[1:]
        _hand_over(st, f, nodes[0])
        placed.after_commit.append(functools.partial(_drop_local, store, f, room))
    return placed


def _drop_local(store: "ChunkStore", file: str, room: NodeRoom | None) -> None:
    """Delete this node's file ``file`` (a write's file that other nodes hold), off the
    used bytes of ``room`` at once when they counted it."""
    remove_counted(room, [store.file_path(file)])
    store.files.open_files.forget([file])


def _hand_over(st: "Staged", file: str, holder: str) -> None:
    """Make ``holder`` the holder of the chunks of ``st`` that live in data file ``file``."""
    for cid, (rec, refs) in list(st.new.items()):
        if rec.file == file:
            st.new[cid] = (replace(rec, holder=holder), refs)
    for cid, rec in list(st.repairs.items()):
        if rec.file == file:
            st.repairs[cid] = replace(rec, holder=holder)


def record_copies(w: CatalogWriter, copies: dict[str, list[str]]) -> None:
    """Record the copies :func:`replicate_staged` made, in the write's transaction
    (a file the commit no longer names, a duplicate found meanwhile, gets no row),
    and what it asks to be done after the commit (:class:`Placed`)."""
    for file, nodes in sorted(copies.items()):
        if nodes:
            w.add_file_copies(file, nodes)
    for fn in getattr(copies, "after_commit", ()):
        w.on_commit(fn)


def copy_length(records: list[ChunkRecord]) -> int:
    """Bytes of a data file that hold ``records`` (the end of the last one)."""
    return max((r.file_offset + r.stored for r in records), default=0)


def receive_copy(store: "ChunkStore", file: str, records: list[ChunkRecord], length: int,
                 pieces: Iterable[memoryview], max_bytes: int = COPY_MAX_BYTES) -> bool:
    """Store a copy of data file ``file`` that another node pushed: its first
    ``length`` bytes arrive as ``pieces`` (always read to the end, so the
    connection stays framed); each chunk of ``records`` is checked in the
    temp file before it is fsynced and renamed into place.

    Returns:
        Whether the copy was stored (``False``: the file was here already; a
        data file in a folder is always whole, so it is kept as it is).

    Raises:
        InvalidArgument: ``file`` is not a data file id, ``length`` is over
        ``max_bytes`` or does not cover the records.
        DamagedObject: a chunk's bytes fail their check (nothing is kept).
        StorageFull: the disk is full.
        InternalError: the file system failed otherwise.
    """
    problem: InvalidArgument | None = None
    if not file or not all(ch.isalnum() for ch in file):
        problem = InvalidArgument(f"{file!r} is not a data file id")
    elif length > max_bytes:
        problem = InvalidArgument(f"a copy of {length} bytes is over this node's limit of {max_bytes} bytes "
                                  "(GPUFEED_CLUSTER_COPY_MAX_BYTES)")
    elif not records or copy_length(records) != length:
        problem = InvalidArgument(f"a copy of {length} bytes does not match the chunks it names")
    if problem is not None or os.path.exists(store.file_path(file)):
        return refuse_payload(pieces, problem)
    fd, tmp = store.files.new_temp()
    try:
        failure = write_pieces(fd, pieces)
        if failure is not None:
            if failure.errno == 28:  # ENOSPC
                raise StorageFull(f"the disk of the data folder is full: {failure}")
            raise InternalError(f"storing a copy of data file {file} failed: {failure}")
        for rec in records:
            reason = check_chunk_fd(fd, rec)
            if reason is not None:
                raise DamagedObject(f"the copy of chunk {rec.chunk_id} (data file {file}) failed its check "
                                    f"({reason}); nothing of it was kept", chunk=rec.chunk_id)
        if store.files.fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_quietly(tmp)
        raise
    os.close(fd)
    store.files.publish_blob(tmp, file)
    return True


def refuse_payload(pieces: Iterable[memoryview], problem: Exception | None) -> bool:
    """Read a pushed payload's ``pieces`` to the end without keeping them (so the
    connection stays framed), then raise ``problem``; ``False`` (nothing stored)
    when there is none (the file was here already).

    Raises:
        Exception: ``problem``, when given.
    """
    for _ in pieces:
        pass
    if problem is not None:
        raise problem
    return False


def write_pieces(fd: int, pieces: Iterable[memoryview], hasher=None) -> OSError | None:
    """Write ``pieces`` one after another from offset 0 (each also through
    ``hasher.update`` when given, until a write fails); every piece is read even
    after a failed write, whose error is returned (``None``: all written)."""
    pos = 0
    failure: OSError | None = None
    for piece in pieces:
        if failure is None:
            try:
                write_all(fd, piece, pos)
            except OSError as exc:
                failure = exc
            if hasher is not None:
                hasher.update(piece)
        pos += len(piece)
    return failure
