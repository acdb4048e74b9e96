"""The same-host shared-memory transport (``gpufeed+shm:///path/gpufeed.sock``).

The node writes object bytes straight into memory the client registered
(:meth:`ShmTransport.alloc`, lent by the node when it can); no socket carries
data. Buffers outside a registered region go through a staging region (one
extra memcpy). Objects can also be mapped copy-on-write (:meth:`map_object`).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future

from ..._memory import map_extents, map_file_private, populate_range, prefetch_range
from ...errors import GpufeedError, InternalError, InvalidArgument, InvalidRange, TransportError
from ...wire import protocol as p
from .._auth import Credentials, authenticate
from .._conn import Connection, connect_unix
from .._leases import Leases
from .._region import Region, SharedBuffer, StagingPool, address_of
from .._types import ReadRequest, then
from ._pooled import MAX_ALLOC_BYTES, PooledTransport
from ._shm_batch import submit_batch
from .base import TransportOptions

__all__ = ["ShmTransport"]

#: Node addresses (socket paths) whose closed transports left lent memory in use
#: in this process, with the key to authenticate with: the node keeps that memory
#: until this process exits, so a fork must be reported there (a child may map
#: it) on a connection of its own.
_CLOSED_WITH_LENT: dict[str, tuple[Credentials, bool]] = {}

#: Open transports whose node lends memory: told about every fork in this process.
_OPEN_LENDING: "weakref.WeakSet[ShmTransport]" = weakref.WeakSet()


def _report_fork_after_close() -> None:
    for address, (creds, allow_unauthenticated) in list(_CLOSED_WITH_LENT.items()):
        try:
            conn = Connection(connect_unix(address, 5.0), True, 5.0)
            try:
                hello = conn.call(p.Op.HELLO, p.Hello("gpufeed-python"))
                authenticate(conn, hello, creds, ShmTransport.name,
                             allow_unauthenticated=allow_unauthenticated)
                conn.call(p.Op.FORKED, p.Empty())
            finally:
                conn.close()
        except Exception:  # noqa: BLE001 - the node may be gone; nothing to protect then
            pass


def _after_fork_in_parent() -> None:
    """Report a fork to every node that lent this process memory: open transports
    on their own connections, closed ones on a connection of its own
    (``subprocess`` does not run fork hooks, and exec drops the mappings)."""
    for t in list(_OPEN_LENDING):
        t.forked()
    _report_fork_after_close()


os.register_at_fork(after_in_parent=_after_fork_in_parent)


class ShmTransport(PooledTransport):
    """Shared-memory data path over a Unix socket (default 1 connection).

    Args:
        address: the node's Unix socket path.
        options: see :class:`~._pooled.PooledTransport`; ``staging_bytes`` sizes
            the staging region for unregistered buffers, ``slot_bytes`` one slot.
    """

    name = "shm"
    default_connections = 1
    passes_fds = True

    def __init__(self, address: str, options: TransportOptions) -> None:
        self._region_ids = itertools.count(1)
        self.staging_bytes, self.slot_bytes = options.staging_bytes, options.slot_bytes
        self._staging: StagingPool | None = None
        self._staging_lock = threading.Lock()
        #: Regions the server lent from its pool (zeroed, already populated memory
        #: another client had finished with) rather than allocating fresh.
        self.regions_reused = 0
        #: read leases (``Client(leases=True)`` with a node that offers them), else None
        self.leases: Leases | None = None
        super().__init__(address, options)
        if "alloc_region" in self.features:
            _OPEN_LENDING.add(self)
        if options.leases and "lease" in self.features:
            self.leases = Leases(self._lease)

    def close(self) -> None:
        if self.leases is not None:
            self.leases.clear()  # their descriptors close now, not at the next garbage collection
        super().close()

    def _lease(self, bucket: str, key: str):
        """LEASE of the current version: ``(reply, [data_fd, counter_fd], connection)``."""
        conn = self.conn()
        reply, fds = conn.call(p.Op.LEASE, p.Head(bucket, key))
        return reply, fds, conn

    def _open_socket(self, address: str, timeout_s: float) -> socket.socket:
        return connect_unix(address, timeout_s)

    # --- capabilities ------------------------------------------------------------------
    @property
    def supports_map(self) -> bool:
        return "map" in self.features

    @property
    def supports_server_digests(self) -> bool:
        return True

    @property
    def supports_registered_alloc(self) -> bool:
        return True

    @property
    def max_batch_item_bytes(self) -> int | None:
        return self.slot_bytes

    # --- regions -----------------------------------------------------------------------
    def new_region(self, nbytes: int) -> Region:
        """A region registered on every connection: lent by the server when it can
        (from its pool of zeroed, already-populated memory when one fits), else a
        memfd of our own."""
        rid = next(self._region_ids)
        if "alloc_region" in self.features:
            reply, fd = self.conns[0].call(p.Op.ALLOC_REGION, p.AllocRegion(rid, nbytes))
            region = Region(rid, reply.size, fd=fd)
            self.regions_reused += bool(reply.reused)
            others = self.conns[1:]
        else:
            region = Region(rid, nbytes)
            others = self.conns
        try:
            for conn in others:
                conn.call(p.Op.REGISTER, p.Register(region.region_id, region.size), fds=[region.fd])
        except BaseException:
            self._release_region(region)
            raise
        if region.lent:
            region.drop_fd()  # mapped everywhere: no descriptor outlives this process's use
        with self.regions_lock:
            self.regions.append(region)
        return region

    _fresh_region = new_region

    def alloc_shared(self, nbytes: int) -> SharedBuffer:
        """A memfd of this client's own (never a lent one: another process may map
        it for as long as it likes), registered on every connection."""
        self.conn()  # TransportError when closed or in a forked child
        region = Region(next(self._region_ids), nbytes, name="gpufeed-shared")
        done: list[Connection] = []
        try:
            for conn in self.conns:  # fresh: the node writes into it by pwrite, maps none of it
                conn.call(p.Op.REGISTER, p.Register(region.region_id, region.size, True), fds=[region.fd])
                done.append(conn)
        except BaseException:
            self._unregister_shared(region, done)
            region.close()
            raise
        with self.regions_lock:
            self.regions.append(region)
        return SharedBuffer(region, self._unregister_shared)

    def _unregister_shared(self, region: Region, conns: list[Connection] | None = None) -> None:
        """Forget an :meth:`alloc_shared` region here and on the node (without
        waiting for the replies). After a lost connection nothing is sent: the
        node drops that connection's regions itself."""
        with self.regions_lock:
            if region in self.regions:
                self.regions.remove(region)
        if self._closed:
            return
        for conn in self.conns if conns is None else conns:
            if conn.closed:
                continue
            try:
                conn.request(p.Op.UNREGISTER, p.Unregister(region.region_id, False))
            except GpufeedError:
                pass

    def find_region(self, mv: memoryview) -> tuple[Region, int] | None:
        """``(region, offset)`` when ``mv`` lies inside a registered region."""
        if not self.regions:
            return None
        addr, n = address_of(mv)
        for region in self.regions:
            if region.contains(addr, n):
                return region, addr - region.address
        return None

    def staging_pool(self) -> StagingPool:
        """The staging slots (registered on first use)."""
        if self._staging is None:
            with self._staging_lock:
                if self._staging is None:
                    region = self.new_region(self.staging_bytes)
                    self._staging = StagingPool(region, self.slot_bytes)
        return self._staging

    def _release_region(self, region) -> bool:
        """Unmap ``region`` and unregister it everywhere, telling the server it is
        unmapped (a lent region can then be zeroed and lent to another client). A
        lent region that buffers still use stays registered: the server keeps it
        until this process exits."""
        unmapped = region.close()
        if region.lent and not unmapped:
            return False
        for conn in self.conns:
            try:
                conn.request(p.Op.UNREGISTER, p.Unregister(region.region_id, unmapped))
            except GpufeedError:
                pass
        return True

    def map_ahead(self, buf: memoryview) -> threading.Thread | None:
        found = self.find_region(buf)
        if found is None:
            return None
        region, offset = found
        end = offset + len(buf)
        with self.regions_lock:
            if offset >= region.mapped_from and end <= region.mapped_to:
                return None
            region.mapped_from = min(region.mapped_from, offset)
            region.mapped_to = max(region.mapped_to, end)
        thread = threading.Thread(target=populate_range, args=(region.address + offset, len(buf)),
                                  kwargs={"threads": 1, "write": False},
                                  name="gpufeed-map-ahead", daemon=True)
        thread.start()
        return thread

    def map_object(self, bucket: str, key: str, populate: bool,
                   version_id: str | None = None, snapshot: str | None = None) -> memoryview:
        if not self.supports_map:
            raise InvalidArgument("map_object needs gpufeed+shm:// to a node that supports MAP")
        if "map_extents" in self.features:
            view = self._map_extents(bucket, key, version_id, snapshot)
        else:
            view = self._map_one_file(bucket, key, version_id, snapshot)
        if populate and len(view):
            prefetch_range(address_of(view)[0], len(view))
        return view

    def _map_extents(self, bucket: str, key: str, version_id: str | None, snapshot: str | None) -> memoryview:
        """MAP_EXTENTS: the object's data files, mapped side by side copy-on-write."""
        reply, fds = self.conn().call(p.Op.MAP_EXTENTS, p.Head(bucket, key, version_id, snapshot))
        try:
            if not all(0 <= f < len(fds) for f, _o, _n in reply.extents) \
                    or sum(n for _f, _o, n in reply.extents) != reply.size:
                raise InternalError(f"{bucket}/{key}: the node's extents do not describe "
                                    f"{reply.size} bytes in {len(fds)} files")
            mapped = map_extents([(fds[f], offset, n) for f, offset, n in reply.extents],
                                 copy_on_write=True)
        except ValueError as exc:  # misaligned extents, or a data file shorter than its extent
            raise InternalError(f"{bucket}/{key}: cannot map the node's data files: {exc}") from exc
        except OSError as exc:
            raise InvalidArgument(f"cannot map {bucket}/{key} ({reply.size} bytes): {exc}") from exc
        finally:
            p.close_fds(fds)
        return mapped.view  # the mapping lives as long as this view and its slices

    def _map_one_file(self, bucket: str, key: str, version_id: str | None, snapshot: str | None) -> memoryview:
        """MAP (a node without MAP_EXTENTS): one data file, mapped copy-on-write."""
        reply, fd = self.conn().call(p.Op.MAP, p.Head(bucket, key, version_id, snapshot))
        try:
            if reply.size == 0:
                return memoryview(bytearray(0))
            if os.fstat(fd).st_size < reply.size:
                raise InternalError(f"{bucket}/{key}: data file is shorter than the object "
                                    f"({reply.size} bytes)")
            return map_file_private(fd, reply.size)
        except OSError as exc:
            raise InvalidArgument(f"cannot map {bucket}/{key} ({reply.size} bytes): {exc}") from exc
        finally:
            os.close(fd)

    # --- reads -------------------------------------------------------------------------
    def submit_get(self, bucket: str, key: str, offset: int, length: int | None,
                   version_id: str | None = None, snapshot: str | None = None) -> Future:
        return self.executor_submit(self.get, bucket, key, offset, length, version_id, snapshot)

    def get(self, bucket: str, key: str, offset: int, length: int | None,
            version_id: str | None = None, snapshot: str | None = None) -> memoryview:
        """Head (without ``length``), then a staged read into a new ``bytearray``,
        on the calling thread."""
        self.conn()  # TransportError when closed or in a forked child
        if length is None:
            size = self.conn().call(p.Op.HEAD, p.Head(bucket, key, version_id, snapshot)).size
            if offset >= size and not offset == size == 0:
                raise InvalidRange(f"offset {offset} is past the end of {bucket}/{key} ({size} bytes)")
            length = size - offset
        buf = bytearray(length)  # never in a region: staged, on this thread
        n = self.get_staged(bucket, key, memoryview(buf), offset, version_id, snapshot)
        return memoryview(buf)[:n]

    def submit_get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                        version_id: str | None = None, snapshot: str | None = None) -> Future:
        found = self.find_region(dest)
        if found is not None:
            region, off = found
            fut = self.conn().request(p.Op.GET, p.Get(bucket, key, offset, len(dest), region.region_id, off,
                                                      version_id=version_id, snapshot=snapshot))
            return then(fut, lambda r: r.n)
        return self.executor_submit(self.get_staged, bucket, key, dest, offset, version_id, snapshot)

    def get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                 version_id: str | None = None, snapshot: str | None = None) -> int:
        if self.leases is not None and version_id is None and snapshot is None:
            self.check_process()  # a forked child gets TransportError, as without leases
            got = self.leases.read_into(bucket, key, dest, offset)
            if got is not None:
                return got
        found = self.find_region(dest)
        if found is None:
            return self.get_staged(bucket, key, dest, offset, version_id, snapshot)
        region, off = found  # one request, its reply read on this thread (no derived Future)
        return self.conn().call(p.Op.GET, p.Get(bucket, key, offset, len(dest), region.region_id, off,
                                                version_id=version_id, snapshot=snapshot)).n

    def get_staged(self, bucket: str, key: str, dest: memoryview, offset: int,
                   version_id: str | None = None, snapshot: str | None = None) -> int:
        """A read into memory outside the regions, slot by slot through staging, up
        to half the slots in flight (on the executor, or the caller's thread for
        :meth:`get`; never holds a slot while it blocks for another)."""
        pool = self.staging_pool()
        if len(dest) == 0:
            return self.conn().request(p.Op.GET, p.Get(bucket, key, offset, 0, version_id=version_id,
                                                       snapshot=snapshot)).result().n
        depth = max(1, pool.nslots // 2)  # slots in flight
        window: list[tuple[int, int, int, Future]] = []  # (dest_off, slot, length, fut)
        total = pos = 0
        short = False
        try:
            while (pos < len(dest) and not short) or window:
                slot = None
                if pos < len(dest) and not short and len(window) < depth:
                    # block for a slot only while holding none (no hold-and-wait)
                    slot = pool.try_acquire() if window else pool.acquire()
                if slot is not None:
                    length = min(pool.slot_bytes, len(dest) - pos)
                    try:
                        fut = self.conn().request(p.Op.GET, p.Get(
                            bucket, key, offset + pos, length, pool.region.region_id, slot,
                            version_id=version_id, snapshot=snapshot))
                    except BaseException:
                        pool.release(slot)
                        raise
                    window.append((pos, slot, length, fut))
                    pos += length
                    continue
                d_off, s_off, ln, f = window.pop(0)
                try:
                    try:
                        n = f.result().n
                    except InvalidRange:
                        if d_off == 0:
                            raise
                        n = 0  # a later slot past the end of a shorter object
                    dest[d_off:d_off + n] = pool.region.view(s_off, n)
                finally:
                    pool.release(s_off)
                total += n
                short = short or n < ln
        finally:
            for _d, s_off, _l, f in window:
                try:
                    f.result()
                except GpufeedError:
                    pass
                pool.release(s_off)
        return total

    def submit_get_many_into(self, reqs: Sequence[ReadRequest], dests: Sequence[memoryview],
                             digests_out: list | None, errors_out: list | None) -> Future:
        return submit_batch(self, list(reqs), list(dests), digests_out, errors_out)

    # --- writes ------------------------------------------------------------------------
    def submit_put(self, bucket: str, key: str, data: memoryview, content_type: str | None,
                   metadata: dict[str, str]) -> Future:
        found = self.find_region(data)
        if found is not None:
            region, off = found
            return self.conn().request(p.Op.PUT, p.Put(bucket, key, len(data), region.region_id, off,
                                                       content_type, metadata))
        if 0 < len(data) <= self.slot_bytes:
            pool = self.staging_pool()
            slot = pool.acquire()
            pool.region.view(slot, len(data))[:] = data
            try:
                fut = self.conn().request(p.Op.PUT, p.Put(bucket, key, len(data),
                                                          pool.region.region_id, slot,
                                                          content_type, metadata))
            except BaseException:
                pool.release(slot)
                raise
            fut.add_done_callback(lambda _f: pool.release(slot))
            return fut
        tmp = None
        if len(data) <= MAX_ALLOC_BYTES:
            # Larger than a slot: one copy into pooled registered memory (alloc()
            # reuses it for the next put of a similar size), then the node writes
            # from there; through the socket it takes two more copies. If the node
            # lends no more memory, the payload goes through the socket.
            try:
                tmp = self.alloc(len(data))
            except InvalidArgument:
                pass
        if tmp is None:
            return self.conn().request(p.Op.PUT, p.Put(bucket, key, len(data), -1, 0, content_type,
                                                       metadata), payload=data)
        tmp[:] = data
        found = self.find_region(tmp)
        assert found is not None  # alloc() memory lies in a region
        region, off = found
        fut = self.conn().request(p.Op.PUT, p.Put(bucket, key, len(data), region.region_id, off,
                                                  content_type, metadata))
        hold = [tmp]  # until the node has the bytes; then back to the pool

        def done(f: Future) -> None:
            if isinstance(f.exception(), TransportError):
                # no reply: the node may still read this memory, so it must not
                # hold another put's bytes (kept until the transport closes)
                self.quarantine(hold[0])
            hold.clear()

        fut.add_done_callback(done)
        return fut

    # --- lifecycle ---------------------------------------------------------------------
    def forked(self) -> None:
        """In the parent after ``os.fork()``: the child may map the regions lent so
        far, so tell the node never to lend them again (see ``FORKED``)."""
        if self._closed or not any(r.lent for r in self.regions):
            return
        for conn in self.conns:
            try:
                conn.request(p.Op.FORKED, p.Empty())
            except GpufeedError:
                pass

    def _kept_after_close(self) -> None:
        _CLOSED_WITH_LENT[self.address] = (self.credentials, self._allow_unauthenticated)
