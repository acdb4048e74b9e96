"""Small GETs served from a per-connection cache of opened object versions.

Most of the node's time on a single small GET goes to deciding access and
opening the version (the bucket's policy, the catalog row, the manifest, the
data file; ``docs/small-reads.md``), not to the read. A connection that reads
the same objects again keeps what it opened, with the access decision that let
it, in its :class:`ReadCache`, for as long as the node's catalog commits
nothing:

* Every change that can change a read's answer (a put, delete or overwrite, a
  policy, key or tenant change, a chunk marked damaged, a lifecycle expiry) is
  a commit of the node's catalog, and :class:`CommitCount` counts commits
  (``Engine.watch_commits``: after the commit's own hooks have dropped the
  cached policies and keys, before the writer is answered). A GET that starts
  after a write was acknowledged sees the count moved and drops the whole
  cache before it looks anything up.
* A GET reads the count *before* it decides access and looks the object up,
  and the cache is tagged with that count, so a cached answer can only be
  older than its tag (then dropped unused at the next GET), never newer: the
  argument of :mod:`._leases`.
* Who asks does not change: a connection's key and tenant are fixed at AUTH,
  its source address too, and the key is still checked on every op
  (``Connection._check_principal``).
* Every byte served is still read and checked against its block sums on every
  GET, and every reply is counted in the metrics as before.
* kv buckets are never cached: reading an object there moves it in the
  bucket's LRU order and expires it past the TTL, by the clock, not by a commit.
* A cached version holds its data file open. So that a deleted or replaced
  version's space comes back at once (``engine._openfiles``), a sweeper thread
  drops every stale cache right after each commit, not at the connection's
  next request.

Only a node whose catalog commits are all its own (SQLite) caches: with a
shared PostgreSQL catalog, other nodes' commits would not move the count.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..engine import Engine, ObjectHandle
from . import protocol as p

if TYPE_CHECKING:  # pragma: no cover
    from ._conn import Connection
    from ._ops import Ops

__all__ = ["CommitCount", "ReadCache", "CachedGets"]

#: A cache key: (bucket, key, version_id, snapshot), as the GET named them.
_Name = tuple[str, str, "str | None", "str | None"]


class CommitCount:
    """The node's catalog commits, counted, and the read caches checked against the count.

    Call :meth:`bump` after every commit (``Engine.watch_commits``). A sweeper
    thread then drops every cache whose count is older (see the module docstring).

    Attributes:
        value: commits counted so far.
    """

    def __init__(self) -> None:
        self.value = 0
        self._caches: set[ReadCache] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._sweeper = threading.Thread(target=self._sweep, name="gpufeed-read-cache", daemon=True)
        self._sweeper.start()

    def bump(self) -> None:
        """Count one commit (runs under the catalog's write lock: only a flag is set)."""
        self.value += 1
        self._wake.set()

    def cache(self, entries: int) -> ReadCache:
        """A new connection's cache of at most ``entries`` object versions (> 0)."""
        cache = ReadCache(self, entries)
        with self._lock:
            self._caches.add(cache)
        return cache

    def forget(self, cache: ReadCache) -> None:
        """``cache``'s connection closed: the sweeper no longer looks at it."""
        with self._lock:
            self._caches.discard(cache)

    def _sweep(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            with self._lock:
                caches = list(self._caches)
            for cache in caches:  # one busy serving looks at the count when it lets go
                cache.drop_if_stale(wait=False)

    def close(self) -> None:
        """Stop the sweeper (the caches are closed with their connections). Idempotent."""
        self._stopping = True
        self._wake.set()
        if self._sweeper is not threading.current_thread():
            self._sweeper.join(timeout=5)


class ReadCache:
    """One connection's opened object versions, each with its access decision,
    valid while the node's commit count is :attr:`gen`.

    Used by the connection's reader thread, which holds :attr:`lock` from its
    first look at the cache until the reply is sent (a cached data file's
    descriptor may be in that reply); the sweeper takes the lock to drop a
    stale cache.

    Args:
        count: the node's commit count.
        entries: most versions kept open (the oldest opened goes first).
    """

    __slots__ = ("lock", "count", "gen", "entries", "_handles", "_plain")

    def __init__(self, count: CommitCount, entries: int) -> None:
        self.lock = threading.Lock()
        self.count = count
        self.entries = entries
        #: the commit count every cached answer was found under (-1: none yet)
        self.gen = -1
        self._handles: dict[_Name, ObjectHandle] = {}
        self._plain: dict[str, bool] = {}  # bucket -> not a kv bucket

    def renew(self, gen: int) -> None:
        """Under :attr:`lock`: start serving from commit count ``gen`` (read before
        any check of the request), dropping what was found under another."""
        if self.gen != gen:
            self._drop()
            self.gen = gen

    def get(self, name: _Name) -> ObjectHandle | None:
        """Under :attr:`lock`: the cached version of ``name``, if any."""
        return self._handles.get(name)

    def keep(self, name: _Name, h: ObjectHandle) -> None:
        """Under :attr:`lock`: cache ``h`` (authorized and opened under :attr:`gen`);
        the cache closes it."""
        if len(self._handles) >= self.entries:
            oldest = next(iter(self._handles))
            self._handles.pop(oldest).close()
        self._handles[name] = h

    def discard(self, name: _Name) -> None:
        """Under :attr:`lock`: close and forget the cached version of ``name``."""
        h = self._handles.pop(name, None)
        if h is not None:
            h.close()

    def plain(self, bucket: str) -> bool | None:
        """Under :attr:`lock`: whether ``bucket`` is known not to be a kv bucket
        (``None``: not known yet)."""
        return self._plain.get(bucket)

    def note_plain(self, bucket: str, plain: bool) -> None:
        """Under :attr:`lock`: remember whether ``bucket`` is not a kv bucket."""
        self._plain[bucket] = plain

    def drop_if_stale(self, *, wait: bool = True) -> None:
        """Close everything cached when the commit count has moved since; with
        ``wait`` False, only if the reader thread is not using the cache now
        (it then looks at the count itself once it lets go)."""
        if not self.lock.acquire(blocking=wait):
            return
        try:
            if self.gen != self.count.value:
                self._drop()
        finally:
            self.lock.release()

    def close(self) -> None:
        """The connection closed: close everything cached. Idempotent."""
        with self.lock:
            self._drop()
        self.count.forget(self)

    def _drop(self) -> None:
        handles = list(self._handles.values())
        self._handles.clear()
        self._plain.clear()
        self.gen = -1
        for h in handles:
            h.close()


class CachedGets:
    """The GET handler of small GETs on a connection's reader thread: what the
    connection's :class:`ReadCache` holds is served without a new access
    decision or open (see the module docstring); anything else as
    :meth:`Ops.get <gpufeed.wire._ops.Ops.get>` does, then cached.

    Args:
        ops: the node's op handlers (access decisions and the GET reply).
        engine: the node's engine.
    """

    def __init__(self, ops: Ops, engine: Engine) -> None:
        self.ops = ops
        self.engine = engine

    def get(self, conn: Connection, rid: int, req: p.Get) -> None:
        """Answer GET ``rid`` (the connection's reader thread only).

        Raises:
            NoSuchBucket, AccessDenied, NoSuchKey, DamagedObject, ...: as
                :meth:`Ops.get <gpufeed.wire._ops.Ops.get>`.
        """
        cache = conn.read_cache
        if cache is None:
            self.ops.get(conn, rid, req)
            return
        gen = cache.count.value  # first: a change the checks below miss moves it
        name = (req.bucket, req.key, req.version_id, req.snapshot)
        with cache.lock:
            cache.renew(gen)
            h = cache.get(name)
            if h is None:
                h, plain = self._open(conn, cache, req)
                if not plain:  # a kv bucket: served, not cached
                    try:
                        self.ops.serve_get(conn, rid, req, h)
                    finally:
                        h.close()
                    return
                cache.keep(name, h)
            try:
                self.ops.serve_get(conn, rid, req, h)
            except BaseException:
                cache.discard(name)  # opened afresh next time (a damaged chunk, a failed send)
                raise
        if cache.gen != cache.count.value:  # a commit while the lock was held: the sweeper may have missed it
            cache.drop_if_stale()

    def _open(self, conn: Connection, cache: ReadCache, req: p.Get) -> tuple[ObjectHandle, bool]:
        """Authorize and open what ``req`` names: the handle (the caller closes
        it, or caches it) and whether its bucket is not a kv bucket (may be cached)."""
        self.ops.allow_read(conn, req)
        h = self.engine.open_version(req.bucket, req.key, req.version_id, snapshot=req.snapshot)
        try:
            plain = cache.plain(req.bucket)
            if plain is None:
                plain = self.engine.head_bucket(req.bucket).kind != "kv"
                cache.note_plain(req.bucket, plain)
        except BaseException:
            h.close()
            raise
        return h, plain
