"""Chunks whose data file another node of the cluster holds: fetched from that
node when a read needs them, and checked before a byte of them is served.

A node of a cluster records, for each chunk, which node's data folder holds
its data file (:attr:`~.types.ChunkRecord.holder`). A read through another
node finds the chunk's record in the shared catalog and asks the holder for
the chunk's stored bytes (the fetch function the node installs with
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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import DamagedObject, HolderUnavailable
from ._scrub import check_chunk_fd
from .types import ChunkRecord

if TYPE_CHECKING:
    from ._chunks import ChunkStore

__all__ = ["FetchChunk", "fetch_chunk"]

#: ``fetch(chunk, fd)``: write the chunk's ``stored`` bytes at its ``file_offset``
#: of ``fd``. Raises HolderUnavailable (the holder is not live, or did not answer
#: in time) or DamagedObject (the holder reports the chunk damaged), each with a
#: message that names the holder and the reason.
FetchChunk = Callable[[ChunkRecord, int], None]


def fetch_chunk(store: "ChunkStore", c: ChunkRecord, bucket: str, key: str) -> int:
    """Fetch chunk ``c`` of object ``bucket/key`` from its holder and check it.

    Returns:
        A descriptor of a private unlinked file holding the chunk's stored bytes
        at ``c.file_offset`` (the caller closes it).

    Raises:
        HolderUnavailable: this node cannot reach the holder (not live, no
            answer in time, or this node fetches from no one).
        DamagedObject: the bytes the holder sent fail their check, or the holder
            reports the chunk damaged.
    """
    where = f"{bucket}/{key}: chunk {c.chunk_id} (held by node {c.holder})"
    fetch = store.remote
    if fetch is None:
        raise HolderUnavailable(f"{where}: this node reads only the data files it holds (it fetches from no "
                                "other node)", bucket=bucket, key=key, chunk=c.chunk_id)
    fd, path = store.files.new_temp()
    os.unlink(path)
    try:
        try:
            fetch(c, fd)
        except HolderUnavailable as exc:
            raise HolderUnavailable(f"{where}: {exc.message}", bucket=bucket, key=key, chunk=c.chunk_id) from None
        except DamagedObject as exc:
            raise DamagedObject(f"{where}: {exc.message}", chunk=c.chunk_id, bucket=bucket, key=key) from None
        reason = check_chunk_fd(fd, c)
        if reason is not None:
            raise DamagedObject(f"{where}: the bytes the holder sent failed their check ({reason}); nothing of "
                                "them was served", chunk=c.chunk_id, bucket=bucket, key=key)
        return fd
    except BaseException:
        os.close(fd)
        raise
