"""The gpufeed SDK: a fast-path client for one storage node.

The URL picks the transport:

* ``gpufeed+tcp://HOST:PORT``: object bytes arrive with ``recv_into`` straight
  into the caller's buffer; large reads are split across the pooled connections.
* ``gpufeed+shm:///path/to/gpufeed.sock`` (same host): the server writes
  object bytes straight into memory the client registered (``Client.alloc``);
  no socket carries data. Buffers outside a registered region go through a
  staging region (one extra memcpy).

Every blocking call has a ``submit_*`` form that returns a
``concurrent.futures.Future`` (many requests in flight), and
:class:`AsyncClient` gives ``async`` forms.
"""

from __future__ import annotations

import asyncio
import itertools
import mmap
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

import msgspec

from .._memory import map_file_private, populate_range, prefetch_range
from ..config import host_memory_bytes
from ..errors import (
    GpufeedError,
    InternalError,
    InvalidArgument,
    InvalidRange,
    ProtocolError,
    TransportError,
    error_from_code,
)
from ..wire import protocol as p
from ._conn import Connection, connect
from ._region import Region, StagingPool, address_of

__all__ = ["Client", "AsyncClient", "ReadRequest", "ListEntry", "ObjectMeta", "parse_url"]

ObjectMeta = p.ObjectMeta

#: Largest single alloc(): half of physical memory (the node refuses larger regions too).
MAX_ALLOC_BYTES = host_memory_bytes() // 2
#: Reads at least this large are split across TCP connections.
SPLIT_BYTES = 64 << 20  # 64 MiB


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """One read of a batch: bytes ``[offset, offset + length)`` of ``bucket/key``
    into ``dest`` (a writable contiguous buffer; ``length`` defaults to ``len(dest)``).

    ``digest`` > 0 asks the server for the XXH3-64 of each consecutive
    ``digest``-byte piece of the delivered bytes (see ``digests_out`` of
    :meth:`Client.submit_get_many_into`)."""

    bucket: str
    key: str
    dest: object
    offset: int = 0
    length: int | None = None
    digest: int = 0


@dataclass(frozen=True, slots=True)
class ListEntry:
    """A listed key (``is_prefix`` False) or a rolled-up common prefix (True)."""

    key: str
    size: int = 0
    etag: str = ""
    last_modified: float = 0.0
    is_prefix: bool = False


def parse_url(url: str) -> tuple[str, object]:
    """``gpufeed+tcp://h:p`` -> ``("tcp", (h, p))``; ``gpufeed+shm:///x.sock`` -> ``("shm", "/x.sock")``.

    Raises:
        InvalidArgument: any other form.
    """
    parts = urlsplit(url)
    if parts.scheme == "gpufeed+tcp":
        if not parts.hostname or not parts.port:
            raise InvalidArgument(f"{url!r}: expected gpufeed+tcp://HOST:PORT")
        return "tcp", (parts.hostname, parts.port)
    if parts.scheme == "gpufeed+shm":
        path = parts.netloc + parts.path if parts.netloc else parts.path
        if not path:
            raise InvalidArgument(f"{url!r}: expected gpufeed+shm:///path/to/gpufeed.sock")
        return "shm", path
    raise InvalidArgument(f"{url!r}: the scheme must be gpufeed+tcp or gpufeed+shm")


def _mv(buf) -> memoryview:
    """A flat byte view of any contiguous buffer, torch CPU tensors included."""
    if hasattr(buf, "untyped_storage") and not isinstance(buf, (bytes, bytearray, memoryview)):
        import torch  # only reached for tensors

        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise InvalidArgument("tensors must be contiguous and on the CPU")
        buf = buf.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        mv = memoryview(buf)
    except TypeError as exc:
        raise InvalidArgument(f"not a buffer: {type(buf).__name__}") from exc
    if not mv.c_contiguous:
        raise InvalidArgument("the buffer must be C-contiguous")
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


_MAX_OFFSET = (1 << 63) - 1


def _check(bucket, key, offset: int = 0, length: int | None = None) -> None:
    """Cheap argument checks so bad input is a typed error, never a dead connection."""
    if type(bucket) is not str or type(key) is not str:
        raise InvalidArgument("bucket and key must be str")
    if type(offset) is not int or not 0 <= offset <= _MAX_OFFSET:
        raise InvalidArgument(f"offset must be an int in [0, 2**63): {offset!r}")
    if length is not None and (type(length) is not int or not 0 <= length <= _MAX_OFFSET):
        raise InvalidArgument(f"length must be an int >= 0: {length!r}")


def _bucket_req(bucket, kind, capacity_bytes, ttl_s) -> p.BucketReq:
    """A CREATE_BUCKET request, checked so a bad argument is a typed error, not a dead connection."""
    if type(bucket) is not str or type(kind) is not str:
        raise InvalidArgument("bucket and kind must be str")
    if type(capacity_bytes) is not int or not 0 <= capacity_bytes <= _MAX_OFFSET:
        raise InvalidArgument(f"capacity_bytes must be an int >= 0: {capacity_bytes!r}")
    if type(ttl_s) not in (int, float) or not 0 <= ttl_s < float("inf"):
        raise InvalidArgument(f"ttl_s must be a number of seconds >= 0: {ttl_s!r}")
    return p.BucketReq(bucket, kind, capacity_bytes, float(ttl_s))


def _then(fut: Future, fn) -> Future:
    """A Future of ``fn(fut.result())``."""
    out: Future = Future()

    def done(f: Future) -> None:
        try:
            out.set_result(fn(f.result()))
        except BaseException as exc:
            out.set_exception(exc)

    fut.add_done_callback(done)
    return out


class _AnonRegion:
    """Anonymous memory for alloc() on TCP (huge pages where the kernel allows)."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.mm = mmap.mmap(-1, self.size)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass


#: Bumped in every forked child: a Client made before the fork must not touch the
#: parent's connections (its receive threads do not exist in the child).
_FORK_GENERATION = [0]


def _bump_fork_generation() -> None:
    _FORK_GENERATION[0] += 1


os.register_at_fork(after_in_child=_bump_fork_generation)

#: Nodes (shm URLs) whose closed Clients left lent memory in use in this process:
#: the node keeps it until this process exits, so a fork must be reported there
#: (a child may map it) on a connection of its own.
_CLOSED_WITH_LENT: set[str] = set()


def _report_fork_after_close() -> None:
    for url in list(_CLOSED_WITH_LENT):
        try:
            conn = Connection(connect("shm", parse_url(url)[1], 5.0), "shm", 5.0)
            try:
                conn.call(p.Op.HELLO, p.Hello("gpufeed-python"))
                conn.call(p.Op.FORKED, p.Empty())
            finally:
                conn.close()
        except Exception:  # noqa: BLE001 - the node may be gone; nothing to protect then
            pass


#: Open Clients whose node lends memory: told about every fork in this process.
_OPEN_LENDING: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_in_parent() -> None:
    """Report a fork to every node that lent this process memory: open Clients
    on their own connections, closed ones on a connection of its own
    (``subprocess`` does not run fork hooks, and exec drops the mappings)."""
    for c in list(_OPEN_LENDING):
        c._forked()
    _report_fork_after_close()


os.register_at_fork(after_in_parent=_after_fork_in_parent)


class Client:
    """Fast-path client of one gpufeed node. Thread-safe; not usable in a forked
    child (create a new one there).

    Args:
        url: ``gpufeed+tcp://HOST:PORT`` or ``gpufeed+shm:///path/gpufeed.sock``.
        connections: pooled connections (default 4 for TCP, 1 for shm; each
            carries many requests in flight).
        timeout_s: connect timeout, seconds.
        request_timeout_s: a request that makes no progress for this long (no
            reply bytes, or a send that cannot proceed) fails with TransportError.
        staging_bytes: size of the shm staging region for unregistered buffers.
        slot_bytes: size of one staging slot.
        max_idle_bytes: memory from :meth:`alloc` kept for reuse after its
            buffers are gone (bytes; default 4 GiB).

    Raises:
        TransportError: the node cannot be reached.
        InvalidArgument: a malformed URL.
    """

    def __init__(self, url: str, *, connections: int | None = None, timeout_s: float = 30.0,
                 request_timeout_s: float | None = 60.0,
                 staging_bytes: int = 64 << 20, slot_bytes: int = 4 << 20,
                 max_idle_bytes: int = 4 << 30) -> None:
        self._closed = False
        self._generation = _FORK_GENERATION[0]
        self.url = url
        self.transport, address = parse_url(url)
        n = connections or (4 if self.transport == "tcp" else 1)
        self._conns: list[Connection] = []
        self._features: set[str] = set()
        #: Regions the server lent from its pool (zeroed, already populated memory
        #: another client had finished with) rather than allocating fresh.
        self.regions_reused = 0
        try:
            for _ in range(n):
                conn = Connection(connect(self.transport, address, timeout_s), self.transport,
                                  request_timeout_s)
                self._conns.append(conn)
                self._features = set(conn.call(p.Op.HELLO, p.Hello("gpufeed-python")).features)
        except BaseException:
            self.close()
            raise
        self._rr = itertools.count()
        self._region_ids = itertools.count(1)
        self._regions: list[Region] = []
        self._regions_lock = threading.Lock()
        self._staging_bytes, self._slot_bytes = staging_bytes, slot_bytes
        self._staging: StagingPool | None = None
        self._idle: list = []    # alloc() regions whose buffers are gone, for reuse
        self._quarantine: list = []  # memory of requests that failed without a reply
        self._retire: list = []  # regions over the idle cap, to unregister
        #: Bytes of idle alloc() memory kept for reuse.
        self.max_idle_bytes = max_idle_bytes
        self._staging_lock = threading.Lock()
        self._exec: ThreadPoolExecutor | None = None
        if "alloc_region" in self._features:
            _OPEN_LENDING.add(self)

    # --- plumbing ----------------------------------------------------------------
    def _conn(self) -> Connection:
        if self._closed:
            raise TransportError("the client is closed")
        self._check_process()
        if len(self._conns) == 1:
            return self._conns[0]
        return min(self._conns, key=lambda c: (c.inflight, next(self._rr) % 7))

    def _check_process(self) -> None:
        if self._generation != _FORK_GENERATION[0]:
            raise TransportError("this Client was created before os.fork(); its connections "
                                 "belong to the parent process: create a new Client in the child")

    def _executor(self) -> ThreadPoolExecutor:
        if self._closed:
            raise TransportError("the client is closed")
        if self._exec is None:
            with self._regions_lock:
                if self._exec is None:
                    self._exec = ThreadPoolExecutor(8, thread_name_prefix="gpufeed-client")
        return self._exec

    def _call(self, op: int, meta):
        return self._conn().call(op, meta)

    def _new_region(self, nbytes: int) -> Region:
        """A region registered on every connection: lent by the server when it can
        (from its pool of zeroed, already-populated memory when one fits), else a
        memfd of our own."""
        rid = next(self._region_ids)
        if "alloc_region" in self._features:
            reply, fd = self._conns[0].call(p.Op.ALLOC_REGION, p.AllocRegion(rid, nbytes))
            region = Region(rid, reply.size, fd=fd)
            self.regions_reused += bool(reply.reused)
            others = self._conns[1:]
        else:
            region = Region(rid, nbytes)
            others = self._conns
        try:
            for conn in others:
                conn.call(p.Op.REGISTER, p.Register(region.region_id, region.size), fds=[region.fd])
        except BaseException:
            self._release_region(region)
            raise
        if region.lent:
            region.drop_fd()  # mapped everywhere: no descriptor outlives this process's use
        with self._regions_lock:
            self._regions.append(region)
        return region

    def _find_region(self, mv: memoryview) -> tuple[Region, int] | None:
        if self.transport != "shm" or not self._regions:
            return None
        addr, n = address_of(mv)
        for region in self._regions:
            if region.contains(addr, n):
                return region, addr - region.address
        return None

    def _staging_pool(self) -> StagingPool:
        if self._staging is None:
            with self._staging_lock:
                if self._staging is None:
                    region = self._new_region(self._staging_bytes)
                    self._staging = StagingPool(region, self._slot_bytes)
        return self._staging

    # --- memory --------------------------------------------------------------------
    def alloc(self, nbytes: int) -> memoryview:
        """Memory the server can write into directly (shm) or page-aligned memory (tcp).

        Reads whose destination lies in such a buffer land with one copy, file to
        buffer. Wrap it with ``numpy.frombuffer`` / ``torch.frombuffer``.

        Memory is pooled: when the last view of a buffer (including tensors made
        from it) is gone, its region goes back to the client's pool and a later
        ``alloc`` of a similar size reuses it, already registered with the server
        and already faulted in (populating fresh shared memory costs 0.5-1.3 s/GB
        on small VMs). Like ``numpy.empty``, the contents are not zeroed.

        On shm the server allocates the region (``ALLOC_REGION``) and keeps the
        regions of clients that are done with them (processes that exited, or
        regions a client unmapped) zeroed and populated in its own pool
        (``gpufeed serve --region-pool``), so even a fresh process's first
        ``alloc`` is usually cheap (``regions_reused`` counts those).

        Args:
            nbytes: size in bytes.

        Returns:
            A writable 1-D ``memoryview`` of ``nbytes`` bytes (its ``.obj`` is the
            owning ``numpy`` array).

        Raises:
            InvalidArgument: ``nbytes`` is not an int >= 0, is more than half the
                host's memory, or the memory cannot be had (the node's limit on
                shared memory lent to all clients, or the kernel's).
            TransportError: the client is closed, or was created before ``os.fork()``.
        """
        if type(nbytes) is not int or nbytes < 0:
            raise InvalidArgument("nbytes must be an int >= 0")
        if nbytes > MAX_ALLOC_BYTES:
            raise InvalidArgument(f"cannot allocate {nbytes} bytes: at most half of this host's "
                                  f"memory ({MAX_ALLOC_BYTES} bytes) in one buffer")
        if self._closed:
            raise TransportError("the client is closed")
        self._check_process()
        if self._retire:
            self._retire_regions()
        region = self._take_idle(nbytes)
        if region is None:
            if self.transport == "shm":
                region = self._new_region(nbytes)
            else:
                try:
                    region = _AnonRegion(nbytes)
                except OSError as exc:
                    raise InvalidArgument(f"cannot allocate {nbytes} bytes: {exc}") from exc
        owner = np.frombuffer(region.mm, dtype=np.uint8, count=nbytes)
        weakref.finalize(owner, self._recycle, region)
        return memoryview(owner)

    def map_ahead(self, buf: memoryview) -> threading.Thread | None:
        """Start mapping the pages of an :meth:`alloc` buffer into this process, in
        a background thread, while the node fills them.

        On shm the node writes into pages this process may not have mapped yet
        (a region it just lent): the first touch of each 4 KiB page would then
        take a minor fault (measured 0.36 s per GiB for first writes on the
        2-core VM). This maps them ahead with ``MADV_POPULATE_READ`` (the pages
        exist; shared writable mappings get them writable), with the GIL
        released, concurrently with the reads. Join the returned thread before
        handing the data on.

        Args:
            buf: a buffer from :meth:`alloc` (or a slice of one).

        Returns:
            The started thread, or ``None`` when there is nothing to do: TCP,
            a buffer outside the client's regions, or pages this client already
            mapped ahead (a reused buffer; re-walking mapped pages costs
            0.05-0.08 s per GiB for nothing).
        """
        found = self._find_region(buf)
        if found is None:
            return None
        region, offset = found
        end = offset + len(buf)
        with self._regions_lock:
            if offset >= region.mapped_from and end <= region.mapped_to:
                return None
            region.mapped_from = min(region.mapped_from, offset)
            region.mapped_to = max(region.mapped_to, end)
        address = region.address + offset
        thread = threading.Thread(target=populate_range, args=(address, len(buf)),
                                  kwargs={"threads": 1, "write": False},
                                  name="gpufeed-map-ahead", daemon=True)
        thread.start()
        return thread

    def _lost_connection(self) -> bool:
        """A connection failed (timeout, node gone): requests of it got no reply, so
        the node may still write into memory they named; pooled memory is then not
        handed out again."""
        return any(conn.closed for conn in self._conns)

    def _take_idle(self, nbytes: int):
        """A pooled region of at least ``nbytes`` and at most about twice that."""
        if self._lost_connection():
            return None
        with self._regions_lock:
            fits = [r for r in self._idle if nbytes <= r.size <= max(2 * nbytes, 1 << 20)]
            if not fits:
                return None
            best = min(fits, key=lambda r: r.size)
            self._idle.remove(best)
            return best

    def _recycle(self, region) -> None:
        """Finalizer of an alloc() buffer: keep the region for reuse (bounded)."""
        if self._closed or self._lost_connection():
            region.close()
            return
        with self._regions_lock:
            self._idle.append(region)
            idle = sum(r.size for r in self._idle)
            while idle > self.max_idle_bytes and len(self._idle) > 1:
                old = self._idle.pop(0)
                idle -= old.size
                self._retire.append(old)

    def _retire_regions(self) -> None:
        """Unregister regions the pool dropped (not done in finalizers: they may run
        on any thread, including the connection's receive thread)."""
        with self._regions_lock:
            retire, self._retire = self._retire, []
        for region in retire:
            if isinstance(region, Region):
                with self._regions_lock:
                    if region in self._regions:
                        self._regions.remove(region)
                self._release_region(region)
            else:
                region.close()

    def _release_region(self, region: Region) -> bool:
        """Unmap ``region`` and unregister it everywhere, telling the server it is
        unmapped (a lent region can then be zeroed and lent to another client). A
        lent region that buffers still use stays registered: the server keeps it
        until this process exits."""
        unmapped = region.close()
        if region.lent and not unmapped:
            return False
        for conn in self._conns:
            try:
                conn.request(p.Op.UNREGISTER, p.Unregister(region.region_id, unmapped))
            except GpufeedError:
                pass
        return True

    # --- buckets -------------------------------------------------------------------
    def create_bucket(self, bucket: str, *, kind: str = "standard", capacity_bytes: int = 0,
                      ttl_s: float = 0.0) -> None:
        """Create a bucket; ``kind="kv"`` makes a cache bucket that evicts least
        recently used objects to stay within ``capacity_bytes`` and hides objects
        ``ttl_s`` seconds after their last write (see ``Engine.create_bucket``).

        Raises InvalidBucketName, BucketAlreadyOwnedByYou, InvalidArgument (a kv
        bucket needs ``capacity_bytes > 0`` or ``ttl_s > 0``). A node older than
        this SDK ignores the policy and makes a standard bucket.
        """
        self._call(p.Op.CREATE_BUCKET, _bucket_req(bucket, kind, capacity_bytes, ttl_s))

    def bucket_stats(self, bucket: str) -> dict:
        """The bucket's policy and counters: ``{"kind", "capacity_bytes", "ttl_s",
        "bytes", "objects", "evictions", "expirations"}``. Raises NoSuchBucket."""
        return msgspec.structs.asdict(self._call(p.Op.BUCKET_STATS, p.BucketReq(bucket)))

    def delete_bucket(self, bucket: str) -> None:
        """Raises NoSuchBucket, BucketNotEmpty."""
        self._call(p.Op.DELETE_BUCKET, p.BucketReq(bucket))

    def list_buckets(self) -> list[str]:
        return list(self._call(p.Op.LIST_BUCKETS, p.Empty()).buckets)

    # --- objects -------------------------------------------------------------------
    def head(self, bucket: str, key: str) -> ObjectMeta:
        """Object metadata. Raises NoSuchBucket, NoSuchKey."""
        _check(bucket, key)
        return self._call(p.Op.HEAD, p.Head(bucket, key))

    def map_object(self, bucket: str, key: str, *, populate: bool = True) -> memoryview:
        """Map an object's stored bytes into this process: zero-copy, shm only.

        The node sends the current version's data file (opened read-only, with
        ``SCM_RIGHTS``) and this process maps it ``MAP_PRIVATE``: the view's
        pages *are* the node's page cache, so nothing is copied and processes
        that map the same object share one copy of it in memory. Writes to the
        view are copy-on-write: they change this process's pages only, never
        the stored object.

        The view is a snapshot of that version: a later overwrite (a new file)
        or delete (an unlink) does not change it; a deleted version's disk
        space is freed when the last mapping goes. The pages stay page cache:
        under memory pressure the kernel may drop clean ones and read them back
        from disk on the next touch (a copy from :meth:`get_into` into
        :meth:`alloc` memory never goes back to disk). Objects are not
        verified against their checksums on this path (reads of page-cached
        bytes, like ``get_into``).

        Args:
            bucket, key: the object.
            populate: map every page in now (``MADV_POPULATE_READ`` on up to 8
                threads, GIL released; pages not yet cached are read from disk,
                with readahead started first), so first touches take no page
                faults. ``False``: pages are mapped as they are touched.

        Returns:
            A writable byte ``memoryview`` of ``size`` bytes; the mapping goes
            when the last view of it (tensors made from it too) is gone, and no
            file descriptor is held meanwhile. An empty object gives an empty
            view.

        Raises:
            InvalidArgument: not the shm transport (``gpufeed+shm://``), a
                node without the MAP operation, or the mapping failed (address
                space or ``vm.max_map_count``).
            NoSuchBucket, NoSuchKey: nothing there.
            InternalError: the data file is shorter than the object.
            TransportError: the node went away.
        """
        _check(bucket, key)
        if self.transport != "shm" or "map" not in self._features:
            raise InvalidArgument("map_object needs gpufeed+shm:// to a node that supports MAP")
        reply, fd = self._conn().call(p.Op.MAP, p.Head(bucket, key))
        try:
            if reply.size == 0:
                return memoryview(bytearray(0))
            if os.fstat(fd).st_size < reply.size:
                raise InternalError(f"{bucket}/{key}: data file is shorter than the object "
                                    f"({reply.size} bytes)")
            view = map_file_private(fd, reply.size)
        except OSError as exc:
            raise InvalidArgument(f"cannot map {bucket}/{key} ({reply.size} bytes): {exc}") from exc
        finally:
            os.close(fd)
        if populate:
            prefetch_range(address_of(view)[0], reply.size)
        return view

    def submit_put(self, bucket: str, key: str, data, *, content_type: str | None = None,
                   metadata: dict[str, str] | None = None) -> Future:
        """Start a put; the Future resolves to the new :class:`ObjectMeta`.

        ``data`` must not change until the Future is done. Atomic: the whole
        object becomes visible, or nothing.
        """
        _check(bucket, key)
        mv = _mv(data)
        meta = dict(metadata or {})
        found = self._find_region(mv)
        if found is not None:
            region, off = found
            return self._conn().request(p.Op.PUT, p.Put(bucket, key, len(mv), region.region_id, off,
                                                        content_type, meta))
        if self.transport == "shm" and 0 < len(mv) <= self._slot_bytes:
            pool = self._staging_pool()
            slot = pool.acquire()
            pool.region.view(slot, len(mv))[:] = mv
            fut = self._conn().request(p.Op.PUT, p.Put(bucket, key, len(mv), pool.region.region_id,
                                                       slot, content_type, meta))
            fut.add_done_callback(lambda _f: pool.release(slot))
            return fut
        tmp = None
        if self.transport == "shm" and len(mv) <= MAX_ALLOC_BYTES:
            # Larger than a slot: one copy into pooled registered memory (alloc()
            # reuses it for the next put of a similar size), then the node writes
            # from there. Through the socket it took two more copies and ~20 %
            # less throughput (8 MiB KV chunks, measured). If the node lends no
            # more memory, the payload goes through the socket as before.
            try:
                tmp = self.alloc(len(mv))
            except InvalidArgument:
                pass
        if tmp is not None:
            tmp[:] = mv
            region, off = self._find_region(tmp)
            fut = self._conn().request(p.Op.PUT, p.Put(bucket, key, len(mv), region.region_id, off,
                                                       content_type, meta))
            hold = [tmp]  # until the node has the bytes; then back to the pool

            def done(f: Future) -> None:
                if isinstance(f.exception(), TransportError):
                    # no reply: the node may still read this memory, so it must not
                    # hold another put's bytes (kept until the client closes)
                    self._quarantine.append(hold[0])
                hold.clear()

            fut.add_done_callback(done)
            return fut
        return self._conn().request(p.Op.PUT, p.Put(bucket, key, len(mv), -1, 0, content_type, meta),
                                    payload=mv)

    def put(self, bucket: str, key: str, data, *, content_type: str | None = None,
            metadata: dict[str, str] | None = None) -> ObjectMeta:
        """Write a whole object from any buffer. Returns its metadata.

        Raises:
            NoSuchBucket, KeyTooLong, InvalidArgument, TransportError.
        """
        return self.submit_put(bucket, key, data, content_type=content_type, metadata=metadata).result()

    def get(self, bucket: str, key: str, *, offset: int = 0, length: int | None = None) -> memoryview:
        """Read an object (or ``length`` bytes from ``offset``) into new memory.

        Returns:
            A ``memoryview`` over a ``bytearray``.

        Raises:
            NoSuchBucket, NoSuchKey, InvalidRange.
        """
        _check(bucket, key, offset, length)
        want = -1 if length is None else length
        if self.transport == "tcp":
            _reply, buf = self._conn().request(p.Op.GET, p.Get(bucket, key, offset, want),
                                               alloc=True).result()
            return memoryview(buf)
        if length is None:
            size = self.head(bucket, key).size
            if offset < 0 or (offset >= size and not offset == size == 0):
                raise InvalidRange(f"offset {offset} is past the end of {bucket}/{key} ({size} bytes)")
            length = size - offset
        buf = bytearray(length)
        n = self.get_into(bucket, key, buf, offset=offset)
        return memoryview(buf)[:n]

    def submit_get_into(self, bucket: str, key: str, buffer, *, offset: int = 0,
                        length: int | None = None) -> Future:
        """Start :meth:`get_into`; the Future resolves to the bytes read."""
        _check(bucket, key, offset, length)
        dest = _mv(buffer)
        if dest.readonly:
            raise InvalidArgument("the destination buffer is read-only")
        if length is not None:
            if length > len(dest):
                raise InvalidArgument(f"length {length} exceeds the buffer ({len(dest)} bytes)")
            dest = dest[:length]
        found = self._find_region(dest)
        if found is not None:
            region, off = found
            fut = self._conn().request(p.Op.GET, p.Get(bucket, key, offset, len(dest),
                                                       region.region_id, off))
            return _then(fut, lambda r: r.n)
        if self.transport == "tcp" and (len(dest) < SPLIT_BYTES or len(self._conns) == 1):
            fut = self._conn().request(p.Op.GET, p.Get(bucket, key, offset, len(dest)), dests=[dest])
            return _then(fut, lambda r: r.n)
        return self._executor().submit(self._get_into_pieces, bucket, key, dest, offset)

    def get_into(self, bucket: str, key: str, buffer, *, offset: int = 0,
                 length: int | None = None) -> int:
        """Read object bytes from ``offset`` straight into ``buffer``.

        Args:
            buffer: writable contiguous buffer (bytearray, numpy array, tensor
                ``.numpy()``, a view from :meth:`alloc`).
            offset: first byte of the object to read.
            length: bytes to read (default ``len(buffer)``).

        Returns:
            Bytes read: less than requested only at the end of the object.

        Raises:
            NoSuchBucket, NoSuchKey, InvalidRange (offset past the end), TransportError.
        """
        return self.submit_get_into(bucket, key, buffer, offset=offset, length=length).result()

    def _get_into_pieces(self, bucket: str, key: str, dest: memoryview, offset: int) -> int:
        """Large TCP reads split over connections, or shm reads through staging."""
        if self.transport == "tcp":
            size = self.head(bucket, key).size
            want = max(0, min(len(dest), size - offset))
            if offset > size or (offset == size and size and len(dest)):
                # let the server produce the typed error
                return self._conn().request(p.Op.GET, p.Get(bucket, key, offset, len(dest)),
                                            dests=[dest]).result().n
            step = -(-want // len(self._conns))
            step = max(step, 1 << 20)
            futs = [conn.request(p.Op.GET, p.Get(bucket, key, offset + o, min(step, want - o)),
                                 dests=[dest[o:o + step]])
                    for conn, o in zip(itertools.cycle(self._conns), range(0, want, step))]
            return sum(f.result().n for f in futs)
        pool = self._staging_pool()
        if len(dest) == 0:
            return self._conn().request(p.Op.GET, p.Get(bucket, key, offset, 0)).result().n
        depth = max(1, pool.region.size // pool.slot_bytes // 2)  # slots in flight
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
                        fut = self._conn().request(p.Op.GET, p.Get(
                            bucket, key, offset + pos, length, pool.region.region_id, slot))
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

    def submit_get_many_into(self, requests: Sequence[ReadRequest | tuple], *,
                             digests_out: list | None = None,
                             errors_out: list | None = None) -> Future:
        """Start a batch read in one round trip; the Future resolves to the list of
        bytes read per request (see :meth:`get_many_into`).

        Args:
            requests: :class:`ReadRequest` or ``(bucket, key, dest, offset, length,
                digest)`` tuples (trailing fields optional).
            digests_out: a list that, before the Future resolves, holds one entry per
                request: the server's XXH3-64 digests (``int``, seed 0) of each
                ``digest``-byte piece of the bytes delivered into ``dest``, or ``None``
                where none were computed (``digest`` 0, the TCP transport, a request
                too large for one batch). The server hashes each piece right after it
                lands, on its own threads, while it is still in the CPU cache: a
                reader that checks stored checksums compares against these instead of
                hashing the bytes again, and hashes the ``None`` entries itself.
            errors_out: with a list here, a request that fails does not fail the
                batch: the list holds one entry per request, ``None`` or the typed
                error (``NoSuchKey``, ``InvalidRange``, ...), and the bytes-read
                entry of a failed request is -1. The other requests are served as
                usual (one round trip that doubles as an existence check).
        """
        reqs = [r if isinstance(r, ReadRequest) else ReadRequest(*r) for r in requests]
        if digests_out is not None:
            digests_out[:] = [None] * len(reqs)
        if errors_out is not None:
            errors_out[:] = [None] * len(reqs)
        dests: list[memoryview] = []
        for r in reqs:
            _check(r.bucket, r.key, r.offset, r.length)
            if r.digest < 0:
                raise InvalidArgument(f"digest piece size must be >= 0, not {r.digest}")
            dest = _mv(r.dest)
            if dest.readonly:
                raise InvalidArgument("a destination buffer is read-only")
            if r.length is not None:
                if r.length > len(dest):
                    raise InvalidArgument(f"length {r.length} exceeds its buffer ({len(dest)} bytes)")
                dest = dest[: r.length]
            dests.append(dest)
        if self.transport == "tcp":
            items = [p.Get(r.bucket, r.key, r.offset, len(d)) for r, d in zip(reqs, dests)]
            fut = self._conn().request(p.Op.GETV, p.GetV(items), dests=dests)
            return _then(fut, lambda reply: self._batch_result(reqs, reply, errors_out))

        # shm: destinations in registered regions are written directly; others are
        # packed into staging slots (acquired all at once: no hold-and-wait), and
        # anything that does not fit goes through _get_into_pieces on the side.
        items: list[p.Get | None] = [None] * len(reqs)
        bins: list[list[tuple[int, int]]] = []  # per slot: [(index, offset in slot)]
        fallback: list[int] = []
        pool = None
        used = 0
        for i, (r, dest) in enumerate(zip(reqs, dests)):
            found = self._find_region(dest)
            if found is not None:
                region, off = found
                items[i] = p.Get(r.bucket, r.key, r.offset, len(dest), region.region_id, off,
                                 r.digest)
                continue
            if pool is None:
                pool = self._staging_pool()
            max_bins = max(1, pool.nslots // 2)
            if len(dest) > pool.slot_bytes:
                fallback.append(i)
                continue
            if not bins or used + len(dest) > pool.slot_bytes:
                if len(bins) >= max_bins:
                    fallback.append(i)
                    continue
                bins.append([])
                used = 0
            bins[-1].append((i, used))
            used += len(dest)
        slots = pool.acquire_many(len(bins)) if bins else []
        staged: list[tuple[int, int]] = []  # (index, absolute offset in the staging region)
        for slot, members in zip(slots, bins):
            for i, at in members:
                r = reqs[i]
                items[i] = p.Get(r.bucket, r.key, r.offset, len(dests[i]), pool.region.region_id,
                                 slot + at, r.digest)
                staged.append((i, slot + at))
        batch = [it for it in items if it is not None]
        index = [i for i, it in enumerate(items) if it is not None]
        try:
            fut = self._conn().request(p.Op.GETV, p.GetV(batch)) if batch else None
            side = [self._executor().submit(self._get_into_pieces, reqs[i].bucket, reqs[i].key,
                                            dests[i], reqs[i].offset) for i in fallback]
        except BaseException:
            for slot in slots:
                pool.release(slot)
            raise

        batch_out: list = []  # [list of n] once the batch reply is in

        def batch_done(f: Future) -> None:
            # Copy staged bytes out and free the slots as soon as the batch reply
            # is in, before waiting for side reads: a batch never holds slots while
            # it waits for anything else (no hold-and-wait, no deadlock).
            try:
                reply = f.result()
                sub_errors = [] if errors_out is not None else None
                sub = self._batch_result([reqs[i] for i in index], reply, sub_errors)
                out = [0] * len(reqs)
                for j, i in enumerate(index):
                    out[i] = sub[j]
                    if sub_errors:
                        errors_out[i] = sub_errors[j]
                for i, at in staged:
                    n = out[i]
                    if n > 0:
                        dests[i][:n] = pool.region.view(at, n)
                if digests_out is not None:
                    for j, sums in reply.digests.items():
                        digests_out[index[j]] = sums
                batch_out.append(out)
            except BaseException as exc:
                batch_out.append(exc)
            finally:
                for slot in slots:
                    pool.release(slot)

        if fut is not None:
            fut.add_done_callback(batch_done)

        def finish() -> list[int]:
            out = [0] * len(reqs)
            if fut is not None:
                if isinstance(batch_out[0], BaseException):
                    raise batch_out[0]
                out = batch_out[0]
            for i, f in zip(fallback, side):  # already done: finish runs after every part
                exc = f.exception()
                if (errors_out is not None and isinstance(exc, GpufeedError)
                        and not isinstance(exc, (TransportError, ProtocolError))):
                    out[i], errors_out[i] = -1, exc
                else:
                    out[i] = f.result()
            return out

        # Complete when the batch reply and every side read are done. Callbacks
        # never block: the last one assembles the result (blocking here could
        # deadlock the receive thread that completes the other parts).
        result: Future = Future()
        parts = ([fut] if fut is not None else []) + side
        if not parts:
            result.set_result([])
            return result
        remaining = [len(parts)]
        lock = threading.Lock()

        def part_done(_f: Future) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                value = finish()
            except BaseException as exc:
                value, error = None, exc
            else:
                error = None
            # Break the closures' hold on the caller's buffers (futures keep their
            # callbacks), so pooled alloc() memory is reusable without a GC pass.
            reqs.clear()
            dests.clear()
            side.clear()
            parts.clear()
            batch_out.clear()
            staged.clear()
            if error is None:
                result.set_result(value)
            else:
                result.set_exception(error)

        for f in list(parts):
            f.add_done_callback(part_done)
        return result

    @staticmethod
    def _batch_result(reqs: list[ReadRequest], reply: p.GetVReply,
                      errors_out: list | None = None) -> list[int]:
        """Bytes per item (-1 for a failed one); raises the typed error of the first
        failed item unless ``errors_out`` is given (then filled, one entry per item)."""
        def err(i: int, code: str, msg: str) -> GpufeedError:
            return error_from_code(code, f"request {i} ({reqs[i].bucket}/{reqs[i].key}): {msg}")

        if errors_out is not None:
            errors_out[:] = [None] * len(reqs)
            for i, (code, msg) in reply.errors.items():
                errors_out[i] = err(i, code, msg)
        elif reply.errors:
            i, (code, msg) = min(reply.errors.items())
            raise err(i, code, msg)
        return list(reply.n)

    def get_many_into(self, requests: Sequence[ReadRequest | tuple], *,
                      digests_out: list | None = None,
                      errors_out: list | None = None) -> list[int]:
        """Read a batch of ranges, each into its own buffer, in one round trip;
        the server serves the items concurrently.

        Args:
            requests: :class:`ReadRequest` or ``(bucket, key, dest, offset, length,
                digest)`` tuples (trailing fields optional).
            digests_out: filled with server-computed piece digests (see
                :meth:`submit_get_many_into`).
            errors_out: filled with per-request errors instead of raising (see
                :meth:`submit_get_many_into`).

        Returns:
            Bytes read per request, in order (-1 for a failed one with ``errors_out``).

        Raises:
            The typed error of the first request that failed (its index in the
            message), unless ``errors_out`` is given; TransportError always raises.
        """
        return self.submit_get_many_into(requests, digests_out=digests_out,
                                         errors_out=errors_out).result()

    def delete(self, bucket: str, key: str) -> None:
        """Delete a key; a missing key is not an error. Raises NoSuchBucket."""
        _check(bucket, key)
        self._call(p.Op.DELETE, p.Delete(bucket, key))

    def list(self, bucket: str, prefix: str = "", delimiter: str = "", *,
             start_after: str = "", page_size: int = 1000) -> Iterator[ListEntry]:
        """Yield keys (and common prefixes when ``delimiter`` is set) in UTF-8
        byte order, paging transparently. Raises NoSuchBucket."""
        token = None
        while True:
            page = self._call(p.Op.LIST, p.List(bucket, prefix, delimiter, token, page_size,
                                                start_after))
            items = [ListEntry(e.key, e.size, e.etag, e.last_modified) for e in page.entries]
            items += [ListEntry(pfx, is_prefix=True) for pfx in page.prefixes]
            items.sort(key=lambda e: e.key.encode("utf-8", "surrogatepass"))
            yield from items
            if not page.is_truncated or not page.next_token:
                return
            token = page.next_token

    # --- lifecycle -----------------------------------------------------------------
    def _forked(self) -> None:
        """In the parent after ``os.fork()``: the child may map the regions lent so
        far, so tell the node never to lend them again (see ``FORKED``)."""
        if self._closed or not any(r.lent for r in self._regions):
            return
        for conn in self._conns:
            try:
                conn.request(p.Op.FORKED, p.Empty())
            except GpufeedError:
                pass

    def close(self) -> None:
        """Close connections and release regions. Idempotent. In a forked child it
        does nothing (the connections belong to the parent; use a new Client)."""
        if getattr(self, "_closed", False):
            return
        if getattr(self, "_generation", _FORK_GENERATION[0]) != _FORK_GENERATION[0]:
            self._closed = True
            return
        self._closed = True
        if getattr(self, "_exec", None) is not None:
            self._exec.shutdown(wait=True)
        lock = getattr(self, "_regions_lock", None)
        if lock is not None:  # else __init__ failed before the regions existed
            with lock:
                regions = list(dict.fromkeys(self._regions + self._idle + self._retire))
                self._regions, self._idle, self._retire = [], [], []
            # unmap what no buffer uses any more (and say so: the server may lend
            # it again); regions under live buffers stay mapped until those go
            kept = False
            for region in regions:
                if isinstance(region, Region):
                    kept |= not self._release_region(region)
                else:
                    region.close()
            if kept:  # lent memory still in use after close: a later fork must be reported
                _CLOSED_WITH_LENT.add(self.url)
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> "Client":
        if self._closed:
            raise TransportError("the client is closed")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:
            pass


class AsyncClient:
    """``asyncio`` form of :class:`Client`, with ``await``-able methods.

    Create it with ``await AsyncClient.connect(url, **kw)`` (connects in a thread),
    or ``AsyncClient(url_or_client, **kw)`` (connects right away, blocking).
    Requests are pipelined on the underlying connections.
    """

    def __init__(self, client: "Client | str", **kw) -> None:
        self.sync = Client(client, **kw) if isinstance(client, str) else client

    @classmethod
    async def connect(cls, url: str, **kw) -> "AsyncClient":
        return cls(await asyncio.to_thread(Client, url, **kw))

    async def map_object(self, bucket: str, key: str, **kw) -> memoryview:
        return await asyncio.to_thread(self.sync.map_object, bucket, key, **kw)

    async def head(self, bucket: str, key: str) -> ObjectMeta:
        return await asyncio.wrap_future(self.sync._conn().request(p.Op.HEAD, p.Head(bucket, key)))

    async def put(self, bucket: str, key: str, data, **kw) -> ObjectMeta:
        return await asyncio.wrap_future(self.sync.submit_put(bucket, key, data, **kw))

    async def get(self, bucket: str, key: str, **kw) -> memoryview:
        return await asyncio.to_thread(self.sync.get, bucket, key, **kw)

    async def get_into(self, bucket: str, key: str, buffer, **kw) -> int:
        return await asyncio.wrap_future(self.sync.submit_get_into(bucket, key, buffer, **kw))

    async def get_many_into(self, requests) -> list[int]:
        return await asyncio.wrap_future(self.sync.submit_get_many_into(requests))

    async def delete(self, bucket: str, key: str) -> None:
        await asyncio.wrap_future(self.sync._conn().request(p.Op.DELETE, p.Delete(bucket, key)))

    async def list(self, bucket: str, prefix: str = "", delimiter: str = "") -> list[ListEntry]:
        return await asyncio.to_thread(lambda: list(self.sync.list(bucket, prefix, delimiter)))

    async def create_bucket(self, bucket: str, *, kind: str = "standard", capacity_bytes: int = 0,
                            ttl_s: float = 0.0) -> None:
        req = _bucket_req(bucket, kind, capacity_bytes, ttl_s)
        await asyncio.wrap_future(self.sync._conn().request(p.Op.CREATE_BUCKET, req))

    async def bucket_stats(self, bucket: str) -> dict:
        reply = await asyncio.wrap_future(self.sync._conn().request(p.Op.BUCKET_STATS, p.BucketReq(bucket)))
        return msgspec.structs.asdict(reply)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
