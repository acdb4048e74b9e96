"""Read leases: a same-host client reads an object version in its own process.

A single 4 KiB get over the shm transport costs a round trip between two
Python processes (``docs/small-reads.md``: about ten steps of 15-30 µs each),
where the page cache answers in a few microseconds. A lease removes the round
trip for repeated small reads of one object: op LEASE sends the client the
current version's data file (read-only, ``SCM_RIGHTS``, as MAP does), its block
sums, and the node's **commit counter**, a 4096-byte memfd whose first 8 bytes
count the catalog's commits. The client then reads with ``pread`` and checks
each read against the sums itself, as the node would, for as long as the
counter is unchanged and at most ``lease_s`` seconds.

Why the counter makes this safe:

* Every change that can change a read's answer (a put, delete or overwrite,
  a policy, key or tenant change, a chunk marked damaged, a lifecycle expiry)
  is a commit of the node's SQLite catalog, and the counter moves right after
  the commit, before the writer is answered. A reader that starts after a
  write was acknowledged therefore sees the counter moved and asks again.
* The node reads the counter *before* it looks the object up, so a lease can
  only carry an older count than its data (it is then void at once), never a
  newer one.
* Data files are immutable and never truncated; a deleted version's file lives
  on while a descriptor holds it. A read inside a lease is the version that was
  current when the read began.
* The client checks every read against the block sums before it returns, so
  bit rot is caught as on GET; on a failed check it drops the lease and reads
  through GET, which reports and marks the damage.
* The node reads the counter before it checks the key and the access
  policy, and moves it only after a commit's cached policies and keys are
  dropped, so a lease is never granted under a policy or key older than its
  counter.
* ``lease_s`` bounds how long a client trusts a lease without the node: a
  node that was killed no longer moves its counter (the client also drops its
  leases when the connection closes).
* What a client gets cannot hurt others: the data file is a read-only
  descriptor with an open file description of its own (``fcntl`` flags on it
  do not reach the node's), and the counter's memfd is sealed against writes
  and resizing.

Only a node whose catalog commits are all its own (SQLite) offers leases: with
a shared PostgreSQL catalog other nodes' commits do not move this counter.
Only a version stored as one raw (uncompressed) chunk at offset 0 of one data
file, of at most :data:`MAX_LEASE_BYTES`, can be leased; anything else
(compressed, cut in several chunks, empty) is ``NotImplementedByGpufeed``, and
the client reads it with GET.

Our own code rather than a library's: the counter and the descriptors are
the fast path's own protocol (``docs/wire-protocol.md``, op LEASE).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from typing import TYPE_CHECKING

from ..engine._blocksums import SUM_KIND
from ..errors import InvalidArgument, NotImplementedByGpufeed
from . import protocol as p
from ._mapping import private_fd

if TYPE_CHECKING:  # pragma: no cover
    from ..engine import Engine
    from ._conn import Connection

__all__ = ["LeaseBoard", "MAX_LEASE_BYTES", "serve_lease"]

#: Largest object a lease covers, bytes (its sums, 1/1024 of it, travel in the reply).
MAX_LEASE_BYTES = 4 << 30

_PAGE = 4096
_F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # Linux 5.1


class LeaseBoard:
    """The node's commit counter in a shared-memory page.

    Args:
        ttl_s: the longest life of a lease, seconds (> 0).

    Attributes:
        fd: a read-only descriptor of the memfd, sent to clients with each lease
            (they map it ``PROT_READ``). The memfd is sealed: no new writable
            mapping, no ``write()``, no resize, by anyone; the node writes through
            the one mapping it made first.
        ttl_s: as given.

    Raises:
        OSError: the kernel lacks memfd seals (Linux < 5.1).
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        made = os.memfd_create("gpufeed-leases", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(made, _PAGE)
            self._mm = mmap.mmap(made, _PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            # Only this mapping may write, for good: no new writable mapping or write(),
            # not even through a descriptor opened again from /proc; no resize.
            fcntl.fcntl(made, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | _F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL)
            self.fd = os.open(f"/proc/self/fd/{made}", os.O_RDONLY | os.O_CLOEXEC)  # what clients get
        finally:
            os.close(made)
        self._count = memoryview(self._mm).cast("Q")
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        """The number of catalog commits counted so far."""
        return self._count[0]

    def bump(self) -> None:
        """Count one commit: every lease granted before it is void."""
        with self._lock:
            if self.fd >= 0:  # after close(): nothing to void
                self._count[0] += 1

    def close(self) -> None:
        """Void every lease for good (the count jumps by 2**32) and release the page.
        Clients keep their own mapping of it; idempotent."""
        with self._lock:
            if self.fd < 0:
                return
            self._count[0] += 1 << 32
            self._count.release()
            self._mm.close()
            os.close(self.fd)
            self.fd = -1


def serve_lease(engine: Engine, board: LeaseBoard, conn: Connection, rid: int, req: p.Head,
                generation: int) -> None:
    """Answer LEASE request ``rid``, already authorized for ``s3:GetObject`` after
    ``generation`` was read from ``board`` (so any change the authorization did
    not see voids the lease).

    Raises:
        InvalidArgument: not the shm transport, or a version or snapshot named
            (a lease covers the current version only).
        NotImplementedByGpufeed: the version is not one raw chunk at offset 0 of one
            file (compressed, several chunks, empty) or is larger than :data:`MAX_LEASE_BYTES`.
        NoSuchBucket, NoSuchKey, MethodNotAllowed: as GET.
    """
    if conn.transport != "shm":
        raise InvalidArgument("LEASE needs the shm transport (a descriptor cannot cross TCP)")
    if req.version_id is not None or req.snapshot is not None:
        raise InvalidArgument("a lease covers the current version only: read a version or a snapshot with GET")
    h = engine.open_version(req.bucket, req.key)
    try:
        chunks = h.manifest.chunks
        if (h.fd < 0 or len(chunks) != 1 or chunks[0].codec or chunks[0].file_offset != 0
                or (h.verify and chunks[0].sum_kind != SUM_KIND) or h.info.size > MAX_LEASE_BYTES):
            raise NotImplementedByGpufeed(f"{req.bucket}/{req.key} is not stored as one raw file of at "
                                          f"most {MAX_LEASE_BYTES} bytes: read it with GET")
        sums = h.manifest.sums[0].tobytes() if h.verify else b""
        reply = p.LeaseReply(h.info.size, h.info.etag, h.info.version_id, generation, board.ttl_s,
                             h.verify, sums)
        fd = private_fd(h.fd)  # its own open file description: the client's fcntl cannot touch ours
        try:
            conn.reply_with_fds(p.Op.LEASE, rid, reply, [fd, board.fd])
        finally:
            os.close(fd)
    finally:
        h.close()
