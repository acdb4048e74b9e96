"""What the socket transports share: a pool of multiplexed connections, a
thread pool for blocking work, fork safety, and pooled :meth:`alloc` memory.

A transport that keeps no connections of its own (a cluster-routing one that
delegates to per-node transports) implements :class:`~.base.Transport`
directly instead.
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import sys
import threading
import weakref
from array import array
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ...config import host_memory_bytes
from ...errors import InvalidArgument, NotImplementedByGpufeed, RequestTimeout, TransportError
from ...wire import protocol as p
from .._auth import Credentials, authenticate
from .._conn import Connection
from .base import Transport, TransportOptions

__all__ = ["PooledTransport", "MAX_ALLOC_BYTES", "fork_generation"]

#: Largest single alloc(): half of physical memory (the node refuses larger regions too).
MAX_ALLOC_BYTES = host_memory_bytes() // 2

#: Bumped in every forked child: a transport made before the fork must not touch the
#: parent's connections (its receiver threads do not exist in the child).
_FORK_GENERATION = [0]


def _bump_fork_generation() -> None:
    _FORK_GENERATION[0] += 1


os.register_at_fork(after_in_child=_bump_fork_generation)


def fork_generation() -> int:
    """How many forks deep this process is (0 in the process that started)."""
    return _FORK_GENERATION[0]


class PooledTransport(Transport):
    """Connections to one node plus pooled memory; subclasses add the data path.

    Args:
        address: the node's address, as :meth:`_open_socket` takes it.
        options: connections (``None``: :attr:`default_connections`; each
            carries many requests in flight), timeouts, ``max_idle_bytes``.

    Raises:
        TransportError: the node cannot be reached.
    """

    default_connections = 1
    #: the connections carry file descriptors (Unix sockets)
    passes_fds = False

    def __init__(self, address, options: TransportOptions) -> None:
        self._closed = False
        self._generation = _FORK_GENERATION[0]
        self.address = address
        self.conns: list[Connection] = []
        #: optional ops the node announced in HELLO (``"alloc_region"``, ``"map"``)
        self.features: set[str] = set()
        #: regions registered with the node (shm); reads into them land directly
        self.regions: list = []
        self.regions_lock = threading.Lock()
        self._rr = itertools.count()
        self._idle: list = []        # alloc() regions whose buffers are gone, for reuse
        # regions whose buffers just went (appended by finalizers, which take no lock:
        # one can run inside any allocation, on a thread that holds regions_lock)
        self._returned: collections.deque = collections.deque()
        self._quarantine: list = []  # memory of requests that failed without a reply
        self._retire: list = []      # regions over the idle cap, to release
        self.max_idle_bytes = options.max_idle_bytes
        self._exec: ThreadPoolExecutor | None = None
        #: the key every connection proves (kept for connections opened later)
        self.credentials: Credentials = options.credentials
        self._allow_unauthenticated = options.allow_unauthenticated
        try:
            for _ in range(options.connections or self.default_connections):
                for attempt in (0, 1):
                    conn = Connection(self._open_socket(address, options.timeout_s),
                                      self.passes_fds, options.request_timeout_s)
                    self.conns.append(conn)
                    try:
                        self.features = self.handshake(conn)
                        break
                    except TransportError:
                        # The node closes a connection whose first frame is late (its
                        # header timeout): this process was held up between connecting
                        # and sending HELLO (a garbage collection joining DataLoader
                        # workers, say). A second, fresh connection is tried once.
                        if attempt or not isinstance(conn.error, RequestTimeout):
                            raise
                        self.conns.remove(conn)
                        conn.close()
        except BaseException:
            self.close()
            raise

    def handshake(self, conn: Connection) -> set[str]:
        """HELLO, then AUTH, on a new connection; returns the node's features.

        Raises:
            TransportError: the node does not authenticate (and that was not
                allowed), or failed to prove it holds the secret.
            InvalidAccessKeyId, SignatureDoesNotMatch: the node refused the key.
        """
        hello = conn.call(p.Op.HELLO, p.Hello("gpufeed-python"))
        self.tenant = authenticate(conn, hello, self.credentials, self.name,
                                   allow_unauthenticated=self._allow_unauthenticated)
        return set(hello.features)

    # --- connections -------------------------------------------------------------------
    def _open_socket(self, address, timeout_s: float) -> socket.socket:
        """A connected socket to the node. Raises TransportError."""
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def supports_versions(self) -> bool:
        return "versions" in self.features

    @property
    def supports_snapshots(self) -> bool:
        return "snapshots" in self.features

    @property
    def lost_connection(self) -> bool:
        """A connection failed (timeout, node gone): requests of it got no reply, so
        the node may still write into memory they named; pooled memory is then not
        handed out again."""
        return any(conn.closed for conn in self.conns)

    def check_process(self) -> None:
        """Raises TransportError in a process forked after this transport was made."""
        if self._generation != _FORK_GENERATION[0]:
            raise TransportError("this Client was created before os.fork(); its connections "
                                 "belong to the parent process: create a new Client in the child")

    def conn(self) -> Connection:
        """The first idle connection (a lone caller keeps to one, and so to the
        node's cache of what that connection opened), else the least busy.
        Raises TransportError when closed or forked."""
        if self._closed:
            raise TransportError("the client is closed")
        self.check_process()
        conns = self.conns
        for c in conns:
            if not c.inflight:
                return c
        return min(conns, key=lambda c: (c.inflight, next(self._rr) % 7))

    def find_region(self, mv: memoryview):
        """``(region, offset)`` when ``mv`` lies in memory registered with the node;
        ``None`` here (no registered memory)."""
        return None

    def request(self, op: int, meta) -> Future:
        return self.conn().request(op, meta)

    def submit_get_ranges_into(self, bucket: str, key: str, dest: memoryview, offsets: bytes,
                               lengths: list[int], version_id: str | None = None,
                               snapshot: str | None = None) -> Future:
        """GETR: into ``dest`` where it lies in registered memory (the node writes
        there), else as the reply's payload, each range received into its place."""
        if "ranges" not in self.features:
            raise NotImplementedByGpufeed("this node has no GETR (get_ranges_into); use get_many_into")
        lens = array("I", lengths)
        if sys.byteorder != "little":
            lens.byteswap()
        found = self.find_region(dest)
        if found is not None:
            region, off = found
            return self.conn().request(p.Op.GETR, p.GetRanges(bucket, key, offsets, lens.tobytes(), region.region_id,
                                                              off, version_id, snapshot))
        dests, pos = [], 0
        for n in lengths:
            dests.append(dest[pos:pos + n])
            pos += n
        return self.conn().request(p.Op.GETR, p.GetRanges(bucket, key, offsets, lens.tobytes(), -1, 0,
                                                          version_id, snapshot), dests=dests)

    def executor_submit(self, fn, *args) -> Future:
        if self._closed:
            raise TransportError("the client is closed")
        self.check_process()  # a forked child has none of the parent's threads
        if self._exec is None:
            with self.regions_lock:
                if self._exec is None:
                    self._exec = ThreadPoolExecutor(8, thread_name_prefix="gpufeed-client")
        return self._exec.submit(fn, *args)

    # --- pooled alloc() memory ---------------------------------------------------------
    def _fresh_region(self, nbytes: int):
        """New memory for :meth:`alloc`: an object with ``size``, ``mm`` (an mmap) and
        ``close()``."""
        raise NotImplementedError

    def alloc(self, nbytes: int) -> memoryview:
        if nbytes > MAX_ALLOC_BYTES:
            raise InvalidArgument(f"cannot allocate {nbytes} bytes: at most half of this host's "
                                  f"memory ({MAX_ALLOC_BYTES} bytes) in one buffer")
        if self._closed:
            raise TransportError("the client is closed")
        self.check_process()
        region = self._take_idle(nbytes)
        if self._retire:
            self._retire_regions()
        if region is None:
            region = self._fresh_region(nbytes)
        owner = np.frombuffer(region.mm, dtype=np.uint8, count=nbytes)
        weakref.finalize(owner, self._recycle, region)
        return memoryview(owner)  # type: ignore[arg-type]  # numpy arrays are buffers

    def _take_idle(self, nbytes: int):
        """A pooled region of at least ``nbytes`` and at most about twice that."""
        if self.lost_connection:
            return None
        with self.regions_lock:
            self._pool_returned()
            fits = [r for r in self._idle if nbytes <= r.size <= max(2 * nbytes, 1 << 20)]
            if not fits:
                return None
            best = min(fits, key=lambda r: r.size)
            self._idle.remove(best)
            return best

    def _recycle(self, region) -> None:
        """Finalizer of an alloc() buffer: queue the region for reuse. Takes no
        lock (see ``_returned``); the next :meth:`alloc` pools it."""
        if self._closed or self.lost_connection:
            region.close()
            return
        self._returned.append(region)

    def _pool_returned(self) -> None:
        """Move returned regions to the idle pool, bounded (``regions_lock`` held)."""
        if not self._returned:
            return
        while self._returned:
            self._idle.append(self._returned.popleft())
        idle = sum(r.size for r in self._idle)
        while idle > self.max_idle_bytes and len(self._idle) > 1:
            old = self._idle.pop(0)
            idle -= old.size
            self._retire.append(old)

    def _retire_regions(self) -> None:
        """Release regions the pool dropped (not done in finalizers: they may run
        on any thread, including one reading a connection's replies)."""
        with self.regions_lock:
            retire, self._retire = self._retire, []
            for region in retire:
                if region in self.regions:
                    self.regions.remove(region)
        for region in retire:
            self._release_region(region)

    def _release_region(self, region) -> bool:
        """Give ``region`` up; True when it is gone (subclasses tell the node)."""
        region.close()
        return True

    def quarantine(self, buf) -> None:
        """Keep ``buf`` out of the pool until close: the node may still use it."""
        self._quarantine.append(buf)

    # --- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close connections and release regions. Idempotent. In a forked child it
        does nothing (the connections belong to the parent)."""
        if self._closed:
            return
        self._closed = True
        if self._generation != _FORK_GENERATION[0]:
            return
        if self._exec is not None:
            self._exec.shutdown(wait=True)
        with self.regions_lock:
            self._pool_returned()
            regions = list(dict.fromkeys(self.regions + self._idle + self._retire))
            self.regions, self._idle, self._retire = [], [], []
        kept = False
        for region in regions:
            kept |= not self._release_region(region)
        if kept:
            self._kept_after_close()
        for conn in self.conns:
            conn.close()

    def _kept_after_close(self) -> None:
        """Called by :meth:`close` when some region outlives it (buffers still use it)."""
