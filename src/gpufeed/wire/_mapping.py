"""MAP and MAP_EXTENTS replies: an object version's data files as descriptors
(spec: ``docs/wire-protocol.md``, "MAP").

An object is stored as one or more ranges of data files; :func:`send_map`
takes them as ``(fd, offset, length)`` extents, whatever the store behind
them, and sends the client what it needs to map them side by side
(:func:`gpufeed._memory.map_extents`). MAP, the first form, carries exactly
one descriptor whose first ``size`` bytes are the object, so it can serve
only objects that are one file from offset 0; MAP_EXTENTS carries any number
of descriptors (more than one message's worth ride on payload bytes, see
:meth:`FrameIO.reply_with_fds`).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence

from ..errors import InternalError, NotImplementedByGpufeed
from . import protocol as p
from ._frames import FrameIO

__all__ = ["plan_extents", "send_map", "private_fd"]


def plan_extents(extents: Sequence[tuple[int, int, int]], size: int
                 ) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The descriptors to send and the reply's ``[file, offset, length]`` extents.

    Zero-length extents are dropped; an extent that continues the previous one
    in the same descriptor is merged with it; each descriptor is sent once,
    however many extents it holds (pass one descriptor per file).

    Args:
        extents: ``(fd, offset, length)`` in bytes, in the object's order.
        size: the object's size in bytes.

    Returns:
        ``(fds, extents)``: distinct descriptors in first-use order, and the
        extents with each descriptor replaced by its index in ``fds``.

    Raises:
        InternalError: the extents do not add up to ``size``, or break the
            alignment rules (offsets and every length but the last are page
            multiples): a fault of the store, never of the client.
    """
    page = mmap.PAGESIZE
    merged: list[list[int]] = []
    for fd, offset, length in extents:
        if length == 0:
            continue
        if merged and merged[-1][2] % page:
            raise InternalError(f"an extent of {merged[-1][2]} bytes ends mid-page "
                                f"before the object's last one")
        if offset < 0 or length < 0 or offset % page:
            raise InternalError(f"extent at offset {offset} ({length} bytes) is not page-aligned")
        last = merged[-1] if merged else None
        if last is not None and last[0] == fd and last[1] + last[2] == offset:
            last[2] += length
        else:
            merged.append([fd, offset, length])
    if sum(e[2] for e in merged) != size:
        raise InternalError(f"the object's extents hold {sum(e[2] for e in merged)} bytes, "
                            f"not its {size}")
    fds: list[int] = []
    index: dict[int, int] = {}
    out = []
    for fd, offset, length in merged:
        if fd not in index:
            index[fd] = len(fds)
            fds.append(fd)
        out.append((index[fd], offset, length))
    return fds, out


def private_fd(fd: int) -> int:
    """A new read-only descriptor of the file open as ``fd``, with an open file
    description of its own (through ``/proc/self/fd``): what a client does to
    the one it gets (``fcntl`` flags such as ``O_DIRECT``, its offset) cannot
    touch the node's cached descriptor. The caller closes it.

    Raises:
        OSError: the file cannot be opened again.
    """
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)


def send_map(conn: FrameIO, op: int, rid: int, size: int, etag: str,
             extents: Sequence[tuple[int, int, int]]) -> None:
    """Answer MAP or MAP_EXTENTS request ``rid`` with an object's data files.

    Args:
        conn: the shm connection to answer on.
        op: ``Op.MAP`` (one descriptor: the object must be one file from offset
            0) or ``Op.MAP_EXTENTS``.
        rid: the request id.
        size, etag: the object version's size in bytes and ETag.
        extents: where its bytes are, ``(fd, offset, length)`` in order; the
            caller keeps (and closes) its descriptors.

    Raises:
        InternalError: the extents are inconsistent (see :func:`plan_extents`).
        NotImplementedByGpufeed: MAP of an object stored in several pieces (the
            client must use MAP_EXTENTS, or read it with GET).
        OSError: the socket failed.
    """
    shared, planned = plan_extents(extents, size)
    if op != p.Op.MAP_EXTENTS and (len(planned) > 1 or (planned and planned[0][1] != 0)):
        raise NotImplementedByGpufeed(
            f"the object is stored in {len(planned)} pieces; mapping it needs a client that "
            f"speaks MAP_EXTENTS (HELLO feature \"map_extents\"); read it with GET instead")
    fds: list[int] = []
    try:
        fds.extend(private_fd(fd) for fd in shared)
        if op == p.Op.MAP_EXTENTS:
            conn.reply_with_fds(op, rid, p.MapExtentsReply(size, etag, len(fds), planned), fds)
            return
        if fds:
            conn.reply_with_fds(op, rid, p.MapReply(size, etag), fds)
            return
    finally:
        p.close_fds(fds)
    # An empty object held in no file: MAP's form still carries a descriptor.
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        conn.reply_with_fds(op, rid, p.MapReply(size, etag), [fd])
    finally:
        os.close(fd)
