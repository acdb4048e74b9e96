"""Client memory on the shm transport: regions a client registers, regions the
server lends, and when lent memory may go back to the pool for the next client.

The rules for reuse are drawn in :mod:`gpufeed.wire._regions` (and
``docs/wire-protocol.md``): a lent region is zeroed and pooled only once no
process can still see it and no request of its client process is running.
:class:`Lending` keeps that bookkeeping for the whole server; a
:class:`ClientMemory` holds what one connection has mapped.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import select
import threading
from concurrent.futures import ThreadPoolExecutor

from ..config import host_memory_bytes
from ..errors import InternalError, InvalidArgument
from ._regions import RegionPool, ServerRegion

__all__ = ["ClientMemory", "Descriptor", "Lending", "MappedRegion", "MAX_REGION_BYTES", "MAX_LENT_BYTES"]

#: Largest region a client may register or ask for: the server maps regions
#: populated, so an absurd size must not exhaust the host's memory.
MAX_REGION_BYTES = host_memory_bytes() // 2
#: Default of the most shared memory mapped for all clients together (regions
#: are populated when lent or registered): ``NodeConfig.wire.node_memory_bytes``.
MAX_LENT_BYTES = host_memory_bytes() * 3 // 4


def check_region_size(size: int, *, least: int = 0) -> None:
    """The server maps regions populated: refuse sizes that could exhaust the host.

    Args:
        size: bytes asked for.
        least: the smallest size accepted (1 for a registered region: an empty
            file cannot be mapped).

    Raises:
        InvalidArgument: ``size`` is under ``least`` or over :data:`MAX_REGION_BYTES`.
    """
    if not least <= size <= MAX_REGION_BYTES:
        raise InvalidArgument(f"region size {size} is out of range ({least} to half the "
                              f"host's memory, {MAX_REGION_BYTES} bytes)")


class Descriptor:
    """A file descriptor closed when the last reference to this object goes.

    Args:
        fd: the descriptor (owned from here on).
    """

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


class MappedRegion:
    """A client memory region mapped into the server: the client's memfd, a
    :class:`ServerRegion` the server lent on this connection (``owned``), or a
    lent region the client registered again on another of its connections
    (``alias``, valid only while that lending lasts). Lent ones share the
    ServerRegion's mapping.

    A client memfd is mapped populated (every page faulted in now, so reads land
    in it at memory speed), except a ``fresh`` one (memory the client writes
    once, such as a batch tensor): the node keeps a descriptor of it, reads into
    it through :mod:`gpufeed.wire._staged` (``pwrite``, no page of it mapped in
    the node), and maps it unpopulated for the rare op that needs a view.

    Args:
        fd: the client's memfd (``None`` for a lent region); the caller keeps it.
        size: bytes the client may address.
        owned: the region lent on this connection.
        alias: the region lent on another connection of the same client.
        fresh: the client registered ``fd`` as fresh memory.

    Attributes:
        fd: a descriptor of a fresh client memfd (this region's own), else ``None``.

    Raises:
        InvalidArgument: the memfd is smaller than ``size``.
    """

    __slots__ = ("mm", "mv", "size", "owned", "alias", "lend_no", "key", "fd")

    def __init__(self, fd: int | None, size: int, owned: ServerRegion | None = None,
                 alias: ServerRegion | None = None, *, fresh: bool = False) -> None:
        self.owned, self.alias = owned, alias
        self.fd: Descriptor | None = None
        #: ``(st_dev, st_ino)`` of a client's memfd (``None`` for lent regions): a
        #: memfd registered on several connections is counted once
        self.key: tuple[int, int] | None = None
        lent = owned or alias
        if lent is not None:
            self.mm, self.size, self.lend_no = lent.mm, size, lent.lends
            self.mv = memoryview(self.mm)
            return
        assert fd is not None
        self.lend_no = 0
        st = os.fstat(fd)
        if st.st_size < size:
            raise InvalidArgument(f"region of {size} bytes is larger than its memfd ({st.st_size})")
        if size <= 0:
            raise InvalidArgument("an empty region cannot be mapped (size must be at least 1 byte)")
        self.key = (st.st_dev, st.st_ino)
        flags = mmap.MAP_SHARED | (0 if fresh else getattr(mmap, "MAP_POPULATE", 0))
        self.mm = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.mv = memoryview(self.mm)
        self.size = size
        if fresh:
            self.fd = Descriptor(os.dup(fd))

    def stale(self) -> bool:
        """An alias whose lending has ended (the region went back for reuse)."""
        a = self.alias
        return a is not None and (not a.live or a.lends != self.lend_no)

    def view(self, offset: int, length: int) -> memoryview:
        """``length`` bytes at ``offset`` of the region.

        Raises:
            InvalidArgument: the range is not inside the region.
        """
        self.check(offset, length)
        return self.mv[offset : offset + length]

    def check(self, offset: int, length: int) -> None:
        """Raise InvalidArgument unless ``[offset, offset + length)`` is inside the region."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise InvalidArgument(
                f"[{offset}, {offset + length}) is outside the registered region ({self.size} bytes)"
            )

    def staged_fd(self, offset: int, length: int) -> "Descriptor | None":
        """The descriptor to ``pwrite`` ``length`` bytes at ``offset`` into, for a
        fresh region (:mod:`gpufeed.wire._staged`); ``None``: write into :meth:`view`.
        Hold the returned object while writing: the descriptor closes with the last
        reference to it, so an UNREGISTER that races a read never lets the read's
        number reach another file.

        Raises:
            InvalidArgument: the range is not inside the region.
        """
        self.check(offset, length)
        return self.fd

    def close(self) -> None:
        """Drop this connection's view; a lent region's mapping stays with its owner."""
        self.fd = None  # closed once no read still running on it holds it
        try:
            self.mv.release()
            if self.owned is None and self.alias is None:
                self.mm.close()
        except BufferError:  # a worker still holds a slice; the GC closes it later
            pass


class ClientMemory:
    """What one connection has mapped, and the client process behind it.

    Attributes:
        regions: region id -> mapped region, as registered on this connection.
        no_reuse: ids (``id()``) of lent regions a forked child may map: never lent again.
        peer_pid: the client's pid (0 when unknown).
        pidfd: a pidfd of the client process, to learn when it exits (``None``
            when it cannot be watched).
    """

    __slots__ = ("regions", "no_reuse", "peer_pid", "pidfd")

    def __init__(self, peer_pid: int = 0, pidfd: int | None = None) -> None:
        self.regions: dict[int, MappedRegion] = {}
        self.no_reuse: set[int] = set()
        self.peer_pid = peer_pid
        self.pidfd = pidfd

    @property
    def client(self) -> int:
        """Whose memory this is: the client's pid, or this record's id when the pid
        is unknown (such a connection is a client of its own)."""
        return self.peer_pid or id(self)

    def region(self, region_id: int) -> MappedRegion:
        """The region registered as ``region_id`` on this connection.

        Raises:
            InvalidArgument: no such region, or its lending has ended.
        """
        region = self.regions.get(region_id)
        if region is None:
            raise InvalidArgument(f"region {region_id} is not registered on this connection")
        if region.stale():
            raise InvalidArgument(f"region {region_id} was released (its memory went back to the node)")
        return region


def _regions_of(mem: ClientMemory) -> list[MappedRegion]:
    """A snapshot of ``mem``'s regions (its connection's thread may change them)."""
    for _ in range(3):
        try:
            return list(mem.regions.values())
        except RuntimeError:
            continue
    return list(mem.regions.copy().values())


def _polled(fd: int, events: int) -> int:
    """The events of ``events`` (plus POLLHUP/POLLERR) that ``fd`` has now (no waiting)."""
    poller = select.poll()
    poller.register(fd, events)
    return sum(ev for _fd, ev in poller.poll(0))


def _exited(pidfd: int) -> bool:
    """The process behind ``pidfd`` has exited (no waiting)."""
    return bool(_polled(pidfd, select.POLLIN) & select.POLLIN)


class Lending:
    """Regions lent to clients, and their way back into the pool.

    Args:
        pool_bytes: capacity of the pool of zeroed regions kept for reuse, bytes.
        stopping: set when the server stops (lent regions are then freed, not pooled).
        client_bytes: most shared memory one client process may have mapped in the
            node (registered memfds, each counted once, plus lent regions), bytes.
        node_bytes: the same for all clients together, plus lent regions parked or
            waiting for their process to exit, bytes.

    Thread-safe. Clients of one process share a key, their pid: a region lent
    to a process is reused only when nothing of that process is running.
    """

    def __init__(self, pool_bytes: int, stopping: threading.Event, *,
                 client_bytes: int = MAX_REGION_BYTES, node_bytes: int = MAX_LENT_BYTES) -> None:
        self.pool = RegionPool(pool_bytes)
        self.client_bytes = client_bytes
        self.node_bytes = node_bytes
        self._reserved: dict[ClientMemory, int] = {}  # bytes being mapped, not yet in regions
        self._stopping = stopping
        self._busy_lock = threading.Condition()
        self._clients: set[ClientMemory] = set()
        self._peer_busy: dict[int, int] = {}  # running requests per client pid (any connection)
        self._lent_by_key: dict[tuple[int, int], ServerRegion] = {}  # (st_dev, st_ino) -> lent region
        self._parked: list[tuple[ClientMemory, ServerRegion]] = []  # unmapped, waiting for idle
        self._zeroer = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-zero")
        # closed connections' lent regions, until their process exits: (pidfd, client, regions)
        self._waiting: list[tuple[int, ClientMemory, list[ServerRegion]]] = []
        self._reaper: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    # --- connections -------------------------------------------------------------
    def attach(self, peer_pid: int = 0, pidfd: int | None = None) -> ClientMemory:
        """The memory record of a new connection (its regions count as lent)."""
        mem = ClientMemory(peer_pid, pidfd)
        with self._busy_lock:
            self._clients.add(mem)
        return mem

    def detach(self, mem: ClientMemory) -> None:
        """A connection closed. What it lent stays allocated (its process may still
        use it) until that process exits, then is zeroed and pooled; without a way
        to watch the process (no pidfd) it is freed now."""
        lent = []
        for region in mem.regions.values():
            region.close()
            if region.owned is not None:
                if id(region.owned) in mem.no_reuse:
                    self._free_lent(region.owned)
                else:
                    lent.append(region.owned)
        mem.regions.clear()
        pidfd, mem.pidfd = mem.pidfd, None
        if lent and pidfd is not None and not self._stopping.is_set():
            self._wait_for_exit(pidfd, mem, lent)
        else:
            for r in lent:
                self._free_lent(r)
            if pidfd is not None:
                os.close(pidfd)
        with self._busy_lock:
            self._clients.discard(mem)
        if self._parked:
            self._flush_parked()

    def _wait_for_exit(self, pidfd: int, mem: ClientMemory, lent: list[ServerRegion]) -> None:
        """Keep ``lent`` until the process behind ``pidfd`` exits; past the pool's
        capacity the oldest waiting regions are freed instead."""
        with self._busy_lock:
            self._waiting.append((pidfd, mem, lent))
            held = sum(r.size for _f, _c, rs in self._waiting for r in rs)
            drop = []
            while held > self.pool.capacity_bytes and self._waiting:
                old_fd, _c, old = self._waiting.pop(0)  # oldest first: freed, not pooled
                held -= sum(r.size for r in old)
                drop.append((old_fd, old))
        for old_fd, old in drop:
            os.close(old_fd)
            for r in old:
                self._free_lent(r)
        self._start_reaper()
        os.write(self._wake_w, b"x")

    # --- requests ----------------------------------------------------------------
    def request_started(self, mem: ClientMemory) -> None:
        """A request of this client is running (regions of its process stay lent)."""
        with self._busy_lock:
            key = mem.peer_pid
            self._peer_busy[key] = self._peer_busy.get(key, 0) + 1

    def request_done(self, mem: ClientMemory) -> None:
        """A request counted by :meth:`request_started` ended."""
        with self._busy_lock:
            key = mem.peer_pid
            left = self._peer_busy.get(key, 1) - 1
            if left:
                self._peer_busy[key] = left
            else:
                self._peer_busy.pop(key, None)
            idle = left == 0
            self._busy_lock.notify_all()
        if idle and self._parked:
            self._flush_parked()

    # --- region ops --------------------------------------------------------------
    def register(self, mem: ClientMemory, region_id: int, size: int, fd: int, *, fresh: bool = False) -> None:
        """Map a client's memfd (or a region lent to its process on another
        connection) as ``region_id`` (``fresh``: see :class:`MappedRegion`). The
        caller keeps and closes ``fd``.

        Raises:
            InvalidArgument: a bad size (0 included), a taken id, a memfd not
                sealed against shrinking (shrinking it would SIGBUS the server), or
                the client's or the node's limit on mapped memory would be passed.
        """
        check_region_size(size, least=1)
        if region_id in mem.regions:
            raise InvalidArgument(f"region {region_id} is already registered")
        st = os.fstat(fd)
        with self._busy_lock:
            lent = self._lent_by_key.get((st.st_dev, st.st_ino))
        if lent is not None and lent.live:  # a lent region, on another connection
            if size > lent.size:
                raise InvalidArgument(f"region of {size} bytes is larger than its memfd "
                                      f"({lent.size})")
            mem.regions[region_id] = MappedRegion(None, size, alias=lent)
            return
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if not seals & fcntl.F_SEAL_SHRINK:
            raise InvalidArgument("a region must be a memfd sealed against shrinking "
                                  "(MFD_ALLOW_SEALING, then F_ADD_SEALS F_SEAL_SHRINK)")
        # a memfd this client has mapped already (on another connection) costs nothing more
        extra = 0 if self._maps(mem, (st.st_dev, st.st_ino)) else size
        self._reserve(mem, extra)
        try:
            mem.regions[region_id] = MappedRegion(fd, size, fresh=fresh)
        finally:
            self._unreserve(mem, extra)

    def unregister(self, mem: ClientMemory, region_id: int, unmapped: bool) -> None:
        """Drop ``region_id``; a lent one the client has unmapped is pooled once
        no request of its process can touch it, else freed (never lent again)."""
        region = mem.regions.pop(region_id, None)
        if region is None:
            return
        region.close()
        if region.owned is None:
            return
        if unmapped and id(region.owned) not in mem.no_reuse:
            with self._busy_lock:
                self._parked.append((mem, region.owned))
            self._flush_parked()
        else:  # the client may still map it: free it, never lend it again
            self._free_lent(region.owned)

    def lend(self, mem: ClientMemory, region_id: int, size: int) -> tuple[ServerRegion, bool]:
        """Lend a region of at least ``size`` bytes as ``region_id`` (pooled if one
        fits, else fresh).

        Returns:
            ``(region, reused)``; the caller sends ``region.fd`` to the client.

        Raises:
            InvalidArgument: a taken id, a bad size, or the client's or the node's
                limit on mapped memory (``client_bytes``, ``node_bytes``) would be passed.
            InternalError: the memory cannot be allocated.
        """
        if region_id in mem.regions:
            raise InvalidArgument(f"region {region_id} is already registered")
        check_region_size(size)
        self._reserve(mem, max(size, 1))
        try:
            try:
                owned, reused = self.pool.take(size)
            except OSError as exc:
                raise InternalError(f"cannot allocate a {size}-byte region: {exc}") from exc
            with self._busy_lock:
                owned.lends += 1
                owned.live = True
                self._lent_by_key[owned.key] = owned
            mem.regions[region_id] = MappedRegion(None, owned.size, owned)
        finally:
            self._unreserve(mem, max(size, 1))
        return owned, reused

    # --- limits on mapped memory ------------------------------------------------
    def _reserve(self, mem: ClientMemory, size: int) -> None:
        """Count ``size`` more bytes for ``mem``'s client while they are mapped.

        Raises:
            InvalidArgument: the client's or the node's limit would be passed.
        """
        if size <= 0:
            return
        with self._busy_lock:
            mine, everyone = self._usage_locked(mem.client)
            if mine + size > self.client_bytes:
                raise InvalidArgument(
                    f"this client has {mine} bytes of shared memory mapped in the node; {size} more "
                    f"would pass the limit per client of {self.client_bytes} "
                    f"(GPUFEED_WIRE_CLIENT_MEMORY_BYTES)")
            if everyone + size > self.node_bytes:
                raise InvalidArgument(
                    f"the node has {everyone} bytes of client shared memory mapped; {size} more "
                    f"would pass its limit of {self.node_bytes} (GPUFEED_WIRE_NODE_MEMORY_BYTES)")
            self._reserved[mem] = self._reserved.get(mem, 0) + size

    def _unreserve(self, mem: ClientMemory, size: int) -> None:
        """Undo :meth:`_reserve` once the region is in ``mem.regions`` (or failed)."""
        if size <= 0:
            return
        with self._busy_lock:
            left = self._reserved.get(mem, 0) - size
            if left > 0:
                self._reserved[mem] = left
            else:
                self._reserved.pop(mem, None)

    def _maps(self, mem: ClientMemory, key: tuple[int, int]) -> bool:
        """``mem``'s client has the memfd ``key`` mapped on some connection."""
        with self._busy_lock:
            clients = [c for c in self._clients if c.client == mem.client]
        return any(r.key == key for c in clients for r in _regions_of(c))

    def _usage_locked(self, client: int) -> tuple[int, int]:
        """``(bytes mapped for client, bytes mapped for everyone)`` (under
        ``_busy_lock``): lent regions, client memfds counted once, and
        reservations; the node's total also counts regions parked or waiting."""
        mine = everyone = 0
        memfds: dict[tuple[int, int], tuple[int, bool]] = {}  # key -> (size, client's)
        for c in self._clients:
            is_mine = c.client == client
            for r in _regions_of(c):
                if r.owned is not None:
                    everyone += r.owned.size
                    mine += r.owned.size if is_mine else 0
                elif r.key is not None:
                    size, seen_mine = memfds.get(r.key, (0, False))
                    memfds[r.key] = (max(size, r.size), seen_mine or is_mine)
        for size, is_mine in memfds.values():
            everyone += size
            mine += size if is_mine else 0
        for c, size in self._reserved.items():
            everyone += size
            mine += size if c.client == client else 0
        for _f, c, rs in self._waiting:
            held = sum(r.size for r in rs)
            everyone += held
            mine += held if c.client == client else 0
        for c, parked in self._parked:
            everyone += parked.size
            mine += parked.size if c.client == client else 0
        return mine, everyone

    def forked(self, mem: ClientMemory) -> None:
        """The client forked: a child may map what was lent so far, and the parent's
        exit or unmap says nothing about the child, so none of it is reused."""
        mem.no_reuse.update(id(r.owned) for r in mem.regions.values() if r.owned is not None)
        mine = []
        if mem.peer_pid:  # and what earlier, closed connections of this process left waiting
            with self._busy_lock:
                mine = [e for e in self._waiting if e[1].peer_pid == mem.peer_pid]
                for e in mine:
                    self._waiting.remove(e)
        for pidfd, _c, lent in mine:
            os.close(pidfd)
            for r in lent:
                self._free_lent(r)

    def lent_bytes(self) -> int:
        """Bytes of lent regions not back in the pool: registered, parked, waiting."""
        with self._busy_lock:
            clients = list(self._clients)
        total = sum(r.size for c in clients for r in _regions_of(c) if r.owned is not None)
        with self._busy_lock:
            total += sum(r.size for _f, _c, rs in self._waiting for r in rs)
            total += sum(r.size for _c, r in self._parked)
        return total

    def usage(self) -> dict[str, int]:
        """Shared memory now, for metrics: ``clients`` (connections attached),
        ``regions_lent`` and ``lent_bytes`` (server regions lent and not yet back
        in the pool: mapped, parked or waiting for their process), and
        ``mapped_bytes`` (everything mapped for clients: lent regions, client
        memfds counted once, reservations, parked and waiting regions)."""
        with self._busy_lock:
            lent = [r.owned for c in self._clients for r in _regions_of(c) if r.owned is not None]
            lent += [r for _f, _c, rs in self._waiting for r in rs]
            lent += [r for _c, r in self._parked]
            _, mapped = self._usage_locked(-1)  # -1: no client's own share
            clients = len(self._clients)
        return {"clients": clients, "regions_lent": len(lent), "lent_bytes": sum(r.size for r in lent),
                "mapped_bytes": mapped}

    # --- reuse (see _regions.py for the rules) -------------------------------------
    def _flush_parked(self) -> None:
        """Zero and pool parked regions whose client process has nothing running on
        any of its connections (open or closed: a region is mapped on each)."""
        with self._busy_lock:
            ready = [(c, r) for c, r in self._parked if c.peer_pid not in self._peer_busy]
            self._parked = [(c, r) for c, r in self._parked if c.peer_pid in self._peer_busy]
            for _c, r in ready:  # from here on, registrations elsewhere are stale
                self._retire_locked(r)
        if ready:
            self._give_back([r for _c, r in ready])

    def _retire_locked(self, region: ServerRegion) -> None:
        """End a lending (under ``_busy_lock``): aliases of it stop resolving."""
        region.live = False
        if self._lent_by_key.get(region.key) is region:
            del self._lent_by_key[region.key]

    def _free_lent(self, region: ServerRegion) -> None:
        """A lent region that is never lent again: retire it and drop our mapping."""
        with self._busy_lock:
            self._retire_locked(region)
        region.close()

    def _give_back(self, regions: list[ServerRegion]) -> None:
        try:
            self._zeroer.submit(self.pool.give_back, regions)
        except RuntimeError:  # stopping
            for r in regions:
                self._free_lent(r)

    def _start_reaper(self) -> None:
        with self._busy_lock:
            if self._reaper is not None:
                return
            self._reaper = threading.Thread(target=self._reap_loop, name="gpufeed-reap", daemon=True)
            self._reaper.start()

    def _reap_loop(self) -> None:
        """Watch the pidfds of clients whose closed connections lent regions; pool
        those regions when the process exits (all its mappings are gone then)."""
        while not self._stopping.is_set():
            with self._busy_lock:
                watch = list(self._waiting)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            for pidfd, _c, _r in watch:
                poller.register(pidfd, select.POLLIN)
            ready = {fd for fd, ev in poller.poll(1000) if ev & select.POLLIN}
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
            done, pending = self._exited_waiting(ready)
            for pidfd, _mem, lent in done:
                os.close(pidfd)
                self._give_back(lent)
            if pending:
                with self._busy_lock:
                    self._busy_lock.wait(0.05)

    def _exited_waiting(self, ready: set[int]) -> tuple[list, bool]:
        """Take the waiting entries whose process has exited and has nothing
        running; returns them, and whether an exited one still has work running."""
        done, pending = [], False
        with self._busy_lock:
            for entry in list(self._waiting):
                # re-check this very pidfd: a number seen ready may have been
                # closed and reused for another process's pidfd meanwhile
                if entry[0] not in ready or not _exited(entry[0]):
                    continue
                # the process has exited; its reads (on any of its connections)
                # may still be running on the pool: wait for them
                if entry[1].peer_pid in self._peer_busy:
                    pending = True
                    continue
                self._waiting.remove(entry)
                for r in entry[2]:
                    self._retire_locked(r)
                done.append(entry)
        return done, pending

    def close(self) -> None:
        """Free every lent and pooled region and stop the helper threads (after
        ``stopping`` is set and every connection is detached)."""
        os.write(self._wake_w, b"x")
        with self._busy_lock:  # _start_reaper starts the thread under this lock: never a thread not yet started
            reaper = self._reaper
        if reaper is not None:
            reaper.join(timeout=5)
        with self._busy_lock:
            waiting, self._waiting = self._waiting, []
        for pidfd, _c, lent in waiting:
            os.close(pidfd)
            for r in lent:
                self._free_lent(r)
        self._zeroer.shutdown(wait=True)
        self.pool.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
