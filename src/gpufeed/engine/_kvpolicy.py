"""The kv bucket policy: capacity, LRU eviction and TTL expiry of cache buckets.

A ``"kv"`` bucket is a cache. :class:`KVBucketPolicy` keeps an in-memory
mirror of every kv bucket's objects (sizes, write times, read order) and is
the one place the engine asks about them, through hooks:

- :meth:`~KVBucketPolicy.on_read` when a lookup finds an object: moves it to
  the recent end, or deletes it if it has expired;
- :meth:`~KVBucketPolicy.on_commit` inside the write transaction of a new
  version: refuses an object larger than the capacity, evicts what the new
  version needs room for (expired objects first, then least recently used);
- :meth:`~KVBucketPolicy.on_delete` inside the transaction of a delete;
- :meth:`~KVBucketPolicy.on_create_bucket`, :meth:`~KVBucketPolicy.on_delete_bucket`,
  :meth:`~KVBucketPolicy.set_limits` for the bucket's life;
- :meth:`~KVBucketPolicy.hidden_before` for listings, :meth:`~KVBucketPolicy.stats`,
  and :meth:`~KVBucketPolicy.flush` on close.

The mirror changes only in catalog commit hooks (serialised with the writers,
so in commit order); reads reorder the LRU and note read times under a lock,
with no catalog write: read times reach ``objects.last_access`` at eviction
passes, when many have piled up, and on close, so LRU order survives a restart.
Evicted or expired blobs are unlinked after their commit.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections import OrderedDict

from ..errors import EntityTooLarge, GpufeedError, InvalidArgument, NoSuchBucket
from ._blobs import BlobFiles
from ._release import releasable
from .catalog import Catalog, CatalogReader, CatalogWriter
from .types import BucketInfo, ObjectInfo

__all__ = ["KVBucketPolicy", "check_policy", "KINDS"]

#: Bucket kinds: standard buckets never lose an object; kv buckets are caches;
#: directory buckets are standard buckets with S3 Express rules (:mod:`._directories`).
KINDS = ("standard", "kv", "directory")
_FLUSH_TOUCHED = 4096  # a kv bucket's unflushed read times are written to the catalog past this many


def check_policy(kind: str, capacity_bytes, ttl_s) -> tuple[int, float]:
    """Validate a bucket kind and its limits.

    Returns:
        ``(capacity_bytes, ttl_s)`` as int and float.

    Raises:
        InvalidArgument: an unknown kind, non-numeric or negative limits, a kv
            bucket with neither limit, or a standard or directory bucket with one.
    """
    if kind not in KINDS:
        raise InvalidArgument(f"bucket kind must be one of {KINDS}, not {kind!r}")
    try:
        if isinstance(capacity_bytes, bool):
            raise TypeError
        capacity_bytes = operator.index(capacity_bytes)
    except TypeError:
        raise InvalidArgument(f"capacity_bytes must be an int, not {capacity_bytes!r}") from None
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s):
        raise InvalidArgument(f"ttl_s must be a finite number of seconds, not {ttl_s!r}")
    if capacity_bytes < 0 or ttl_s < 0:
        raise InvalidArgument("capacity_bytes and ttl_s must be >= 0")
    if kind == "kv" and not (capacity_bytes or ttl_s):
        raise InvalidArgument("a kv bucket needs capacity_bytes > 0 or ttl_s > 0")
    if kind != "kv" and (capacity_bytes or ttl_s):
        raise InvalidArgument(f"{kind} buckets are never evicted; capacity_bytes and ttl_s need kind='kv'")
    return capacity_bytes, float(ttl_s)


class _KVBucket:
    """In-memory mirror of one kv bucket's committed objects, for eviction.

    Guarded by ``KVBucketPolicy._lock``.

    Attributes:
        capacity_bytes: byte budget of object data; 0 = unlimited.
        ttl_s: seconds an object is visible after its last write; 0 = forever.
        bytes: sum of the sizes of the objects in :attr:`lru`.
        lru: ``key -> (size, blob_id)``, least recently read or written first.
        writes: ``key -> last_modified``, oldest write first (TTL sweeps pop its front).
        touched: ``key -> Unix s`` of reads not yet written to the catalog.
        evictions, expirations: objects dropped for room / by TTL since the engine started.
    """

    __slots__ = ("capacity_bytes", "ttl_s", "bytes", "lru", "writes", "touched", "evictions", "expirations")

    def __init__(self, capacity_bytes: int, ttl_s: float) -> None:
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.bytes = 0
        self.lru: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self.writes: OrderedDict[str, float] = OrderedDict()
        self.touched: dict[str, float] = {}
        self.evictions = 0
        self.expirations = 0

    @classmethod
    def load(cls, reader: CatalogReader, info: BucketInfo) -> "_KVBucket":
        """A kv bucket's state from its catalog rows: totals recounted, LRU order
        from the last recorded read (or write) time."""
        st = cls(info.capacity_bytes, info.ttl_s)
        uses = reader.object_uses(info.name)
        for u in uses:
            st.lru[u.key] = (u.size, u.blob_id)
            st.bytes += u.size
        for u in sorted(uses, key=lambda u: u.last_modified):
            st.writes[u.key] = u.last_modified
        return st

    def add(self, key: str, size: int, blob_id: str, written: float) -> None:
        """A new version of ``key`` (replacing any): most recently used, newest write."""
        self.drop(key)
        self.lru[key] = (size, blob_id)
        self.writes[key] = written
        self.bytes += size

    def drop(self, key: str) -> None:
        """Forget ``key`` (if present)."""
        ent = self.lru.pop(key, None)
        if ent is not None:
            self.bytes -= ent[0]
        self.writes.pop(key, None)
        self.touched.pop(key, None)


class KVBucketPolicy:
    """Capacity, LRU and TTL of every kv bucket of one engine. Thread-safe.

    Args:
        catalog: the engine's catalog; the kv buckets in it are loaded now.
        files: the engine's data folder, whose :meth:`~BlobFiles.remove_blobs`
            unlinks the data of evicted and expired versions after their commit.
    """

    def __init__(self, catalog: Catalog, files: BlobFiles) -> None:
        self._cat = catalog
        self._files = files
        # kv buckets by name; the dict changes only in commit hooks.
        self._buckets: dict[str, _KVBucket] = {}
        self._lock = threading.Lock()
        for info in catalog.buckets():
            if info.kind == "kv":
                self._buckets[info.name] = _KVBucket.load(catalog, info)

    # bucket life -----------------------------------------------------------
    def on_create_bucket(self, w: CatalogWriter, info: BucketInfo) -> None:
        """A bucket is created in transaction ``w``: track it from the commit if it is kv."""
        if info.kind == "kv":
            st = _KVBucket(info.capacity_bytes, info.ttl_s)

            def track() -> None:
                self._buckets[info.name] = st
            w.on_commit(track)

    def on_delete_bucket(self, w: CatalogWriter, name: str) -> None:
        """A bucket is deleted in transaction ``w``: forget it from the commit."""
        if name in self._buckets:
            def forget() -> None:
                self._buckets.pop(name, None)
            w.on_commit(forget)

    def set_limits(self, w: CatalogWriter, name: str, capacity_bytes: int, ttl_s: float) -> list[str]:
        """New limits of kv bucket ``name``, written in ``w``; evicts (in ``w``) what
        no longer fits or has expired under them.

        Returns:
            The blob ids to unlink once ``w`` commits.
        """
        w.set_bucket_limits(name, capacity_bytes, ttl_s)
        st = self._buckets[name]
        # Plan against the new limits on a stand-in, so a rollback leaves ``st`` untouched.
        probe = _KVBucket(capacity_bytes, ttl_s)
        probe.lru, probe.writes, probe.bytes = st.lru, st.writes, st.bytes
        blobs = self._evict(w, name, st, self._plan(probe, time.time()))

        def apply() -> None:
            st.capacity_bytes, st.ttl_s = capacity_bytes, ttl_s
        w.on_commit(apply)
        return blobs

    # object hooks ------------------------------------------------------------
    def on_read(self, info: ObjectInfo) -> bool:
        """A lookup found ``info``: in a kv bucket, it becomes the most recently
        used, or, past the bucket's TTL, is deleted (its own transaction).

        Returns:
            Whether the object is visible (``False``: it had expired).
        """
        st = self._buckets.get(info.bucket)
        if st is None:
            return True
        now = time.time()
        if st.ttl_s and now - info.last_modified >= st.ttl_s:
            self._expire(info.bucket, info.key, info.blob_id)
            return False
        with self._lock:
            try:
                st.lru.move_to_end(info.key)
                st.touched[info.key] = now
            except KeyError:
                pass  # dropped since the lookup
        return True

    def on_commit(self, w: CatalogWriter, bucket: str, key: str, size: int, blob_id: str,
                  now: float, old_size: int) -> list[str]:
        """A new version of ``bucket/key`` (``size`` bytes, replacing one of
        ``old_size``) is being committed in ``w``: make room for it in ``w``.

        Returns:
            The blob ids evicted, to unlink once ``w`` commits.

        Raises:
            EntityTooLarge: the object alone exceeds the bucket's capacity.
        """
        st = self._buckets.get(bucket)
        if st is None:
            return []
        if st.capacity_bytes and size > st.capacity_bytes:
            raise EntityTooLarge(
                f"{size} bytes do not fit kv bucket {bucket!r} of {st.capacity_bytes} bytes", size=size,
            )
        evicted = self._evict(w, bucket, st, self._plan(st, now, key, size - old_size))
        if len(st.touched) > _FLUSH_TOUCHED:
            self._flush_touched(w, bucket, st)

        def added() -> None:
            with self._lock:
                st.add(key, size, blob_id, now)
        w.on_commit(added)
        return evicted

    def on_delete(self, w: CatalogWriter, bucket: str, key: str) -> None:
        """``bucket/key`` is deleted in ``w``: forget it from the commit."""
        st = self._buckets.get(bucket)
        if st is not None:
            def dropped() -> None:
                with self._lock:
                    st.drop(key)
            w.on_commit(dropped)

    def hidden_before(self, bucket: str, now: float) -> float | None:
        """Objects of ``bucket`` written at or before this Unix time have expired
        (invisible to listings); ``None`` when nothing expires."""
        st = self._buckets.get(bucket)
        return now - st.ttl_s if st is not None and st.ttl_s else None

    def stats(self, name: str) -> dict:
        """Counters of kv bucket ``name``, first dropping its expired objects.

        Returns:
            ``{"bytes", "objects", "evictions", "expirations"}``.

        Raises:
            NoSuchBucket: it is not (or no longer) a kv bucket.
        """
        blobs: list[str] = []
        with self._cat.write() as w:
            st = self._buckets.get(name)
            if st is None:
                raise NoSuchBucket(f"bucket {name!r} does not exist", bucket=name)
            if st.ttl_s:
                blobs = self._evict(w, name, st, self._plan(st, time.time()))
        self._files.remove_blobs(blobs)
        with self._lock:
            return {"bytes": st.bytes, "objects": len(st.lru), "evictions": st.evictions,
                    "expirations": st.expirations}

    def flush(self) -> None:
        """Write every pending read time to the catalog (on close); a failure only
        loses LRU order after a restart."""
        if any(st.touched for st in self._buckets.values()):
            try:
                with self._cat.write() as w:
                    for bucket, st in self._buckets.items():
                        self._flush_touched(w, bucket, st)
            except GpufeedError:
                pass

    # eviction ------------------------------------------------------------
    def _plan(self, st: _KVBucket, now: float, key: str | None = None,
              need: int = 0) -> tuple[list[str], list[str]]:
        """What to drop from kv bucket ``st`` so that ``need`` more bytes fit:
        ``(expired keys, evicted keys)``. Expired objects go first (oldest write
        first), then least recently used ones; ``key`` (being written) is spared.
        Caller is inside the write transaction, so ``st`` matches the catalog.
        """
        expired: list[str] = []
        evicted: list[str] = []
        with self._lock:
            total = st.bytes + need
            if st.ttl_s:
                cutoff = now - st.ttl_s
                for k, written in st.writes.items():
                    if written > cutoff:
                        break
                    if k != key:
                        expired.append(k)
                        total -= st.lru[k][0]
            cap = st.capacity_bytes
            if cap and total > cap:
                skip: set[str | None] = set(expired)
                skip.add(key)
                for k, (size, _) in st.lru.items():
                    if total <= cap:
                        break
                    if k not in skip:
                        evicted.append(k)
                        total -= size
        return expired, evicted

    def _evict(self, w: CatalogWriter, bucket: str, st: _KVBucket,
               plan: tuple[list[str], list[str]]) -> list[str]:
        """Delete the planned rows in ``w``; on commit, drop them from ``st`` and
        count them. Returns the blob ids to unlink once committed."""
        expired, evicted = plan
        if not expired and not evicted:
            return []
        with self._lock:
            victims = [(k, st.lru[k][1]) for k in (*expired, *evicted)]
        w.delete_versions(bucket, victims)
        if evicted:
            self._flush_touched(w, bucket, st)  # LRU order survives a restart when it matters

        def apply() -> None:
            with self._lock:
                for k, _ in victims:
                    st.drop(k)
                st.expirations += len(expired)
                st.evictions += len(evicted)
        w.on_commit(apply)
        return releasable(w, [b for _, b in victims])

    def _flush_touched(self, w: CatalogWriter, bucket: str, st: _KVBucket) -> None:
        """Write a kv bucket's pending read times to the catalog (in ``w``)."""
        with self._lock:
            touched, st.touched = st.touched, {}
        if touched:
            w.set_last_used(bucket, touched)

    def _expire(self, bucket: str, key: str, blob_id: str) -> None:
        """Delete one expired version found by a read (if it is still the current one)."""
        with self._cat.write() as w:
            gone = w.delete_object(bucket, key, blob_id)
            st = self._buckets.get(bucket)
            if gone and st is not None:
                def apply() -> None:
                    with self._lock:
                        st.drop(key)
                        st.expirations += 1
                w.on_commit(apply)
            freed = releasable(w, [blob_id] if gone else [])
        self._files.remove_blobs(freed)
