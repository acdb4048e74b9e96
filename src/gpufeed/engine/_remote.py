"""Chunks whose data file another node of the cluster holds: fetched from that
node when a read needs them, and checked before a byte of them is served.

A node of a cluster records, for each chunk, which node's data folder holds
its data file (:attr:`~.types.ChunkRecord.holder`), and which other nodes
hold a copy of that file (:mod:`._replicas`). A read through a node that has
neither finds the chunk's record in the shared catalog and asks the holder,
then each node with a copy, for the chunk's stored bytes (the fetch function the node installs with
:meth:`~gpufeed.engine.Engine.use_peers`, over the fast path's TCP transport:
:mod:`gpufeed._peers`). The bytes land at the chunk's own offset of a private
temp file, unlinked at once (so the chunk's record reads it unchanged, and
nothing is left behind); the whole chunk is then checked against the block
sums (and a shared chunk's digest) that the catalog holds, exactly as scrub
checks a local chunk. Bytes that fail the check are never served: the read
fails with :class:`~gpufeed.errors.DamagedObject` naming bucket, key, chunk
and holder; the chunk is not marked damaged here (its holder's own reads and
scrub judge its file). A holder that is not live, or does not answer in time,
fails the read with :class:`~gpufeed.errors.HolderUnavailable` (503).
A node whose own file of a chunk (held or a copy) fails its check fetches
the chunk from the other nodes that hold it the same way
(:meth:`~._handles.ObjectHandle.fall_back`).

Fetched chunks are kept for the reads after (:class:`._fetched.FetchedChunks`): a node
keeps the most recently used ones, at most ``GPUFEED_CLUSTER_FETCH_CACHE``
stored bytes in all, in their unlinked temp files, so a run of range reads of
one large object through a node that holds no copy of it fetches the object
once, not once per read; reads that need a chunk while another read
fetches it wait for that fetch instead of starting their own. A chunk is kept under its id and its place (data
file, offset, stored length, codec): its bytes never change under those (a new
version is a new chunk; a repair that moves a chunk gives it another place),
so a kept chunk is never stale; every read of it is checked against its block
sums as a read of a local file is.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import DamagedObject, HolderUnavailable
from ._blocksums import SUM_BLOCK, check_run, sums_array
from ._scrub import check_chunk_fd
from .types import ChunkRecord, FetchChunk

if TYPE_CHECKING:
    from ._chunks import ChunkStore

__all__ = ["FetchChunk", "fetch_chunk", "fetch_checked", "private_temp", "check_span"]


def fetch_chunk(store: "ChunkStore", c: ChunkRecord, bucket: str, key: str) -> int:
    """Fetch chunk ``c`` of object ``bucket/key`` from a node that holds it, and check it:
    its holder first, then each node with a copy, until one sends bytes that pass.

    A chunk the node kept from an earlier fetch (:class:`._fetched.FetchedChunks`) is
    not fetched again; one fetched now is kept. Reads that need the chunk while
    another read fetches it wait for that fetch and share its bytes, or its
    error (:class:`._fetched.SharedFetches`).

    Returns:
        A descriptor of a private unlinked file holding the chunk's stored bytes
        at ``c.file_offset`` (the caller closes it).

    Raises:
        HolderUnavailable: no node that holds it could be read from (not live, no
            answer in time, or this node fetches from no one); the message names each.
        DamagedObject: every node that answered sent bytes that fail their check,
            or reports the chunk damaged.
    """
    kept = store.fetched
    place = (c.chunk_id, c.file, c.file_offset, c.stored, c.codec)
    fd = kept.get(place) if kept is not None else None
    if fd is not None:
        return fd

    def fetch() -> int:
        fd = private_temp(store)
        try:
            fetch_checked(store, c, bucket, key, fd)
        except BaseException:
            os.close(fd)
            raise
        if kept is not None:
            kept.put(place, fd, c.stored)
        return fd
    # reads that need the chunk while it is fetched wait for that fetch (its bytes, or its error)
    return kept.flights.fetch(("chunk", place), fetch) if kept is not None else fetch()


def private_temp(store: "ChunkStore") -> int:
    """A new temp file in the data folder's ``tmp/``, unlinked at once (its
    space returns when the descriptor closes)."""
    fd, path = store.files.new_temp()
    os.unlink(path)
    return fd


def fetch_checked(store: "ChunkStore", c: ChunkRecord, bucket: str, key: str, fd: int,
                  span: tuple[int, int] | None = None) -> None:
    """Write chunk ``c``'s stored bytes (``span``: only the ``(offset, length)``
    bytes of them, whole 4 KiB blocks or running to the end of a chunk with
    running CRC32C sums) at their place in ``fd``, from the chunk's holder,
    then each node with a copy, until one sends bytes that pass their check
    (the whole chunk, or the span's blocks, against the catalog's sums).

    Raises:
        HolderUnavailable, DamagedObject: as :func:`fetch_chunk`.
    """
    nodes = [n for n in store.holders(c) if n and n != store.holder]
    copies = [n for n in nodes if n != c.holder]
    where = f"{bucket}/{key}: chunk {c.chunk_id} (held by node {c.holder}" + \
        (f"; copies on {', '.join(copies)})" if copies else ")")
    fetch = store.remote
    if fetch is None:
        raise HolderUnavailable(f"{where}: this node reads only the data files it holds (it fetches from no "
                                "other node)", bucket=bucket, key=key, chunk=c.chunk_id)
    failures: list[HolderUnavailable | DamagedObject] = []
    for node in nodes:
        try:
            fetch(c, [node], fd, span)
            reason = check_chunk_fd(fd, c) if span is None else check_span(fd, c, span)
            if store.fetched is not None:
                store.fetched.count_fetched(c.stored if span is None else span[1])
            if reason is None:
                return
            sender = "the holder" if node == c.holder else f"node {node}"
            failures.append(DamagedObject(f"the bytes {sender} sent failed their check ({reason}); nothing of "
                                          "them was served"))
        except (HolderUnavailable, DamagedObject) as exc:
            failures.append(exc)
    message = f"{where}: " + "; ".join(f.message for f in failures)
    if failures and all(isinstance(f, DamagedObject) for f in failures):
        raise DamagedObject(message, chunk=c.chunk_id, bucket=bucket, key=key)
    raise HolderUnavailable(message if failures else f"{where}: no node holds it", bucket=bucket, key=key,
                            chunk=c.chunk_id)


def check_span(fd: int, c: ChunkRecord, span: tuple[int, int]) -> str | None:
    """Check the ``span`` (``(offset, length)`` of whole 4 KiB blocks, or running to
    the chunk's end) of chunk ``c``'s stored bytes in ``fd`` against its running
    CRC32C sums; ``None`` when good, else the reason."""
    start, n = span
    buf = bytearray(n)
    try:
        got = os.preadv(fd, [buf], c.file_offset + start)
    except OSError as exc:
        return f"read failed: {exc}"
    if got != n:
        return f"{got} of {n} bytes"
    bad = check_run([buf], sums_array(c.sums, c.sum_kind), start // SUM_BLOCK, n)
    return None if bad < 0 else f"block {bad} does not match its sum"
