"""The storage engine: buckets and objects on a local data folder, catalog in
SQLite (or in a PostgreSQL database, :mod:`._catalogs`).

No network here; the S3 front (``gpufeed.s3``) and the fast path
(``gpufeed.wire``) both call this.

On-disk layout under ``data_dir``::

    catalog.sqlite3          buckets, object versions, uploads, parts (WAL mode);
                             or catalog.postgresql + node.id when the catalog is
                             in a PostgreSQL database (:mod:`._catalogs`)
    blobs/ab/cd/<blob_id>    one immutable file per object version (blob_id = uuid4 hex)
    uploads/<upload_id>/<part_number:05d>.<id>   multipart parts (a fresh <id>
                             per upload of a part, so a re-upload never overwrites
                             a file a catalog row still names)
    tmp/                     files being written; emptied on start
    lock                     flock'ed by the one Engine that has the folder open

Every folder is created ``0700`` and every file ``0600``: the data folder is
private to the node's user (:mod:`._private`; more open modes found at start
are reported in :attr:`Engine.permission_warnings`).

Write protocol (atomic, durable): data goes to a file in ``tmp/``, is fsynced,
renamed into ``blobs/``, the directory is fsynced, then the catalog row is
committed (``synchronous=FULL``). Only the commit makes an object visible. On
start, ``tmp/`` is emptied and blob files that no catalog row references
(object versions and snapshot entries alike) are deleted, so a crash at any
point leaves no visible partial object and no leaked file. Object keys never
become file names, so no key can escape the data folder. The old blob of an
overwritten or deleted object is unlinked after the commit when no other row
(a snapshot entry, a restored version) still names it (:mod:`._release`; a
crash in between leaves it unreferenced, so the next start deletes it).
Multipart part files follow the same protocol under ``uploads/``.

Why our own engine rather than a library: this is the product core. The fast
path needs what generic object stores hide: one immutable file per version
whose path it can ``preadv``/``sendfile`` from directly, writes straight into
a temp file descriptor from shared memory, kernel-side copies for multipart
and copy, and a point lookup in microseconds.

The engine is split by concern; this module holds :class:`Engine`, the API
the fronts call, which delegates to:

- :mod:`.catalog`: the interface to the metadata store, every operation the
  engine performs; :mod:`._sqlite` implements it over SQLite, :mod:`._postgres`
  over PostgreSQL; :mod:`._catalogs` picks one from the node's settings.
- :mod:`._blobs`: data files, renames, fsyncs, the start-up sweep.
- :mod:`._writes`: the write path: :class:`PendingWrite` (temp file, ETag
  hashing) and the object commit (publish the blob, commit its row).
- :mod:`._kvpolicy`: capacity, LRU and TTL of kv buckets, as hooks the
  engine calls on read, commit and delete.
- :mod:`._versions`: object versions, delete markers, object lock and tags
  (the rules); :mod:`._versioning` holds the calls that name versions, mixed
  into :class:`Engine`.
- :mod:`._multipart`: uploads, parts and their completion; :mod:`._partcopies`:
  part files on the other nodes of a cluster.
- :mod:`._lifecycle`: bucket lifecycle rules and the pass that applies them.
- :mod:`._snapshots` (with :mod:`._restore`, :mod:`._snapshot_schedule`):
  bucket snapshots; :mod:`._release`: the test every path that frees data asks.
- :mod:`._listing`: paging through keys.
- :mod:`._names`: S3 naming rules, key-space arithmetic.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from ..errors import (
    BucketAlreadyExists,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    DataFolderInUse,
    InvalidArgument,
    NoSuchTenant,
)
from ._blobs import BlobFiles
from ._catalogs import CatalogSettings, open_catalog
from ._chunks import ChunkStore
from ._copies import ObjectCopies
from ._dataservices import DataServices
from ._directories import check_name_for_kind
from ._kvpolicy import KVBucketPolicy, check_policy
from ._lifecycle import Lifecycle, LifecycleCalls
from ._listing import read_page, start_position
from ._membership import Membership
from ._multipart import MAX_PARTS, MIN_PART_BYTES, Multipart
from ._names import MAX_KEY_BYTES, check_key, check_text
from ._partcopies import PartCopyCalls
from ._private import FILE_MODE, check_private, make_private_dirs
from ._reads import ObjectReads
from ._replica import ReplicaTarget
from ._replicas import ReplicaCalls
from ._scrub import ScrubRunner
from ._snapshot_schedule import ScheduledSnapshots
from ._snapshots import SnapshotCalls
from ._sqlite import SqliteCatalog
from ._tenants import MasterKey, TenantAdmin, check_tenant_name, owner_of
from ._versioning import VersionedObjects
from ._writes import PendingWrite, WritePath, check_hash_kind, feed
from .catalog import Catalog, require_bucket
from .types import (
    DEFAULT_TENANT,
    ETAG_POLICIES,
    BucketInfo,
    ListResult,
    ObjectInfo,
    PartInfo,
    Retention,
    UploadInfo,
)

__all__ = ["Engine", "PendingWrite", "MAX_KEY_BYTES", "MIN_PART_BYTES", "MAX_PARTS"]


class Engine(VersionedObjects, TenantAdmin, LifecycleCalls, DataServices, ObjectCopies, ObjectReads, ReplicaCalls,
             SnapshotCalls, ScheduledSnapshots, ReplicaTarget, PartCopyCalls):
    """A storage node's engine over ``data_dir``. Thread-safe.

    Args:
        data_dir: folder for catalog and data (created ``0700`` if missing;
            everything the engine makes in it is private to the user, see
            :attr:`permission_warnings`).
        fsync: fsync data, directories and catalog before a write returns
            (``synchronous=FULL``); with ``False`` writes are still atomic and
            survive a process crash, but not a power loss.
        master_key: 32 bytes that seal access key secrets; ``None`` uses
            ``data_dir/master.key`` (made on first use; see :mod:`._tenants`).
        capacity_bytes: most bytes of object data the folder may hold on disk
            (after compression and dedup); 0: no limit but the disk's. Writes
            past it raise StorageFull; reads go on.
        catalog_check: the SQLite catalog's integrity check on open: ``"quick"``,
            ``"full"`` or ``"off"`` (:mod:`._catalogcheck`); when ``catalog``
            is given, its ``check`` is used instead.
        catalog: where the catalog lives (:class:`~._catalogs.CatalogSettings`);
            ``None``: SQLite in ``data_dir/catalog.sqlite3``.

    Raises:
        DataFolderInUse: ``data_dir`` is in use by another open Engine (an
            exclusive ``flock`` on ``data_dir/lock``, which holds the pid of
            its process; the message names it).
        CatalogDamaged: the catalog fails its check, or is missing while data
            files exist; nothing in ``data_dir`` was changed (the message names
            ``gpufeed catalog recover``).
        CatalogTooNew: a newer gpufeed wrote the catalog.
        CatalogInUse: a PostgreSQL catalog belongs to another deployment.
        CatalogUnavailable: a PostgreSQL catalog's database cannot be reached.
        InternalError: the catalog cannot be opened.

    All methods raise the typed errors of :mod:`gpufeed.errors`. Usable as a
    context manager (closes on exit).
    """

    def __init__(self, data_dir: str | Path, *, fsync: bool = True, master_key: bytes | None = None,
                 capacity_bytes: int = 0, catalog_check: str = "quick",
                 catalog: CatalogSettings | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        make_private_dirs(self.data_dir)
        self._lock_fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.pread(self._lock_fd, 32, 0).decode("ascii", "replace").strip()
            os.close(self._lock_fd)
            by = f" (process {holder})" if holder.isdigit() else ""
            raise DataFolderInUse(f"data folder {self.data_dir} is in use by another gpufeed node{by}") from exc
        # The holder's pid, for the message above in whoever tries next.
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        try:
            self._files = BlobFiles(self.data_dir, fsync=fsync)
            settings = catalog or CatalogSettings(check=catalog_check)
            # Every metadata operation below goes through the Catalog interface.
            self._cat: Catalog = open_catalog(settings, data_dir=self.data_dir, blob_path=self._files.blob_path,
                                              data_folders=(self._files.blobs, self._files.uploads), fsync=fsync)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._closed = False
        self._master = MasterKey(self.data_dir, master_key, has_sealed=lambda: bool(self._cat.access_keys()))
        self._key_cache: dict[str, tuple[str, str] | None] = {}
        self._key_cache_lock = threading.Lock()
        self._key_gen = 0
        self._owners: dict[str, str] = {}  # bucket -> tenant, see bucket_owner
        self._owner_gen = 0
        #: What start-up recovery did: the sweep's removals (``"tmp"``, ``"blobs"``,
        #: ``"uploads"``, ``"parts"``), versions adopted from one-file-per-version data
        #: (``"adopted"``, ``"missing"``), manifests no version named (``"orphan_manifests"``)
        #: and data files the catalog names that are not on disk (``"missing_files"``,
        #: their chunks marked damaged); on a cluster's catalog with rows that name no
        #: holder, the data files found here and claimed for this node (``"claimed_files"``);
        #: replica staging folders and chunk temp files removed (``"replica_staging"``);
        #: copies of other nodes' data files the catalog names here but the folder lacks
        #: (``"missing_copies"``, forgotten: re-replication makes new ones).
        self._chunks = ChunkStore(self._files, self._cat, capacity_bytes)
        self._files.release = self._chunks.release
        self.recovered = self._recover()
        #: Warnings about folders or files in ``data_dir`` that other local users
        #: may read (more open than ``0700``/``0600``), found at start; also logged.
        self.permission_warnings: list[str] = check_private(self.data_dir)
        self._kv = KVBucketPolicy(self._cat, self._files)
        self._writes = WritePath(self._files, self._cat, self._kv, self._chunks)
        self._multipart = Multipart(self._cat, self._files, self._writes)
        self._lifecycle = Lifecycle(self._cat, self._files, self._kv.on_delete)
        self._lifecycle.forget_upload = self._multipart.forget_parts
        self.scrubber = ScrubRunner(self.scrub, str(self.data_dir / "scrub.json"))

    def _recover(self) -> dict[str, int]:
        counts = self._chunks.recover()
        live = self._cat.live_files()
        data = self._cat.data_files()  # the files this node holds
        unheld = self._cat.unheld_files()  # no holder recorded: kept, and claimed when found here
        copies = self._cat.copy_files()  # copies of other nodes' files: kept; a missing one is forgotten
        present: set[str] = set()
        counts.update(self._files.sweep(data | unheld | copies, live.parts, present=present))
        if unheld:
            counts["claimed_files"] = self._cat.claim_files(present & unheld)
        if copies - present - data:
            counts["missing_copies"] = self._cat.drop_file_copies(copies - present - data)
        counts["missing_files"] = self._chunks.mark_missing(data - present)
        counts["replica_staging"] = self.sweep_staging()
        return counts

    @property
    def membership(self) -> Membership:
        """The cluster membership its catalog keeps (:mod:`._membership`)."""
        return self._cat.membership

    @property
    def catalog_is_shared(self) -> bool:
        """Whether the catalog is one several nodes can open (PostgreSQL), not the folder's own SQLite."""
        return not isinstance(self._cat, SqliteCatalog)

    def watch_commits(self, fn: Callable[[], None]) -> bool:
        """Call ``fn()`` after every commit of the catalog, before the write that
        made it returns (under the catalog's write lock: keep it short).

        Returns:
            ``True``; ``False`` (and ``fn`` is never called) when this node does
            not make every commit itself: a PostgreSQL catalog, which other
            nodes may write too.
        """
        listeners = getattr(self._cat, "commit_listeners", None)
        if listeners is None:
            return False
        listeners.append(fn)
        return True

    def close(self) -> None:
        """Close the catalog connections, stop helper threads, release ``data_dir``; idempotent.

        Writes still pending are not committed; their temp files are removed at the next start.
        """
        if self._closed:
            return
        self._closed = True
        self.scrubber.stop()
        if self.repairs is not None:
            self.repairs.stop()
        if self._chunks.fetched is not None:
            self._chunks.fetched.close()
        self._kv.flush()
        self._cat.close()
        self._writes.close()
        self._chunks.close()
        self._files.open_files.close()
        os.close(self._lock_fd)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    # buckets -----------------------------------------------------------
    def create_bucket(self, name: str, *, kind: str = "standard", capacity_bytes: int = 0,
                      ttl_s: float = 0.0, object_lock: bool = False, owner: str = DEFAULT_TENANT,
                      etag_policy: str = "md5") -> BucketInfo:
        """Create a bucket.

        A ``"kv"`` bucket is a cache: a put never fails for lack of room.
        When a put commits and the bucket's object bytes would exceed
        ``capacity_bytes``, objects are evicted in the same catalog
        transaction, expired ones first, then least recently used (LRU:
        the last read, i.e. :meth:`head_object`, which every read path
        calls, or write); the only put it refuses is one larger than the
        whole capacity. Objects written more than ``ttl_s`` seconds ago are
        invisible (head, get and list treat them as missing) and are deleted
        when next looked up or at the next put's eviction pass. Standard
        buckets never lose an object. The kind is fixed at creation; see
        :meth:`set_bucket_policy` for the limits.

        Args:
            name: bucket name (S3 general-purpose naming rules; directory
                bucket naming rules for kind ``"directory"``).
            kind: ``"standard"``, ``"kv"`` or ``"directory"`` (S3 Express rules
                on the S3 front, see :mod:`._directories`).
            capacity_bytes: kv: the most bytes of object data kept; 0 = unlimited.
            ttl_s: kv: seconds an object lives after its last write; 0 = forever.
            object_lock: make the bucket with object lock (WORM; its versioning
                is ``"Enabled"`` for good); standard buckets only.
            owner: the tenant that owns it.
            etag_policy: how writes are hashed, fixed at creation
                (:attr:`BucketInfo.etag_policy`: ``"md5"``, ``"fast"``, ``"none"``).

        Returns:
            The new bucket.

        Raises:
            InvalidBucketName: the name breaks an S3 naming rule.
            BucketAlreadyOwnedByYou: it exists already, owned by ``owner``.
            BucketAlreadyExists: it exists, owned by another tenant.
            NoSuchTenant: no tenant ``owner``.
            InvalidArgument: an unknown kind, negative limits, a kv bucket with
                neither limit or with object lock, or a standard bucket with a limit.
        """
        check_name_for_kind(name, kind)
        capacity_bytes, ttl_s = check_policy(kind, capacity_bytes, ttl_s)
        if object_lock and kind != "standard":
            raise InvalidArgument("only standard buckets can have object lock")
        if etag_policy not in ETAG_POLICIES:
            raise InvalidArgument(f"etag policy must be one of {ETAG_POLICIES}, not {etag_policy!r}")
        check_tenant_name(owner)
        info = BucketInfo(name, time.time(), kind, capacity_bytes, ttl_s,
                          versioning="Enabled" if object_lock else "", object_lock=bool(object_lock),
                          owner="" if owner == DEFAULT_TENANT else owner, etag_policy=etag_policy)
        with self._cat.write() as w:
            if owner != DEFAULT_TENANT and w.tenant(owner) is None:
                raise NoSuchTenant(f"tenant {owner!r} does not exist")
            have = w.bucket(name)
            if have is not None and owner_of(have.owner) != owner:
                raise BucketAlreadyExists("The requested bucket name is not available. The bucket namespace is "
                                          "shared by all users of the system. Please select a different name "
                                          "and try again.", bucket=name)
            if have is not None:
                raise BucketAlreadyOwnedByYou(f"bucket {name!r} exists", bucket=name)
            w.on_commit(lambda: self._forget_owner(name))
            w.insert_bucket(info)
            self._kv.on_create_bucket(w, info)
        return info

    def set_bucket_policy(self, name: str, *, capacity_bytes: int | None = None,
                          ttl_s: float | None = None) -> BucketInfo:
        """Change a kv bucket's limits (``None`` keeps one). Shrinking the capacity
        evicts (LRU) in the same transaction; a shorter TTL hides older objects at once.

        Returns:
            The bucket with its new limits.

        Raises:
            NoSuchBucket: it does not exist.
            InvalidArgument: not a kv bucket, or limits as for :meth:`create_bucket`.
        """
        with self._cat.write() as w:
            b = require_bucket(w, name)
            if b.kind != "kv":
                raise InvalidArgument(f"bucket {name!r} is {b.kind!r}; only kv buckets have an eviction policy")
            cap, ttl = check_policy(b.kind, b.capacity_bytes if capacity_bytes is None else capacity_bytes,
                                    b.ttl_s if ttl_s is None else ttl_s)
            blobs = self._kv.set_limits(w, name, cap, ttl)
        self._files.remove_blobs(blobs)
        return BucketInfo(name, b.created, b.kind, cap, ttl)

    def bucket_stats(self, name: str) -> dict:
        """Counters of a bucket (first dropping expired objects of a kv bucket).

        Returns:
            ``{"kind", "capacity_bytes", "ttl_s", "etag_policy", "data", "bytes", "objects",
            "evictions", "expirations"}``: ``bytes``/``objects`` are the live object data;
            ``data`` is how it is stored (:meth:`data_stats`);
            ``evictions``/``expirations`` count objects dropped for room / by TTL
            since this engine started (always 0 for standard buckets).

        Raises:
            NoSuchBucket: it does not exist.
        """
        info = self.head_bucket(name)
        out = {"kind": info.kind, "capacity_bytes": info.capacity_bytes, "ttl_s": info.ttl_s,
               "etag_policy": info.etag_policy, "data": self.data_stats(name)}
        if info.kind != "kv":
            size, count = self._cat.bucket_usage(name)
            return out | {"bytes": size, "objects": count, "evictions": 0, "expirations": 0}
        return out | self._kv.stats(name)

    def delete_bucket(self, name: str) -> None:
        """Delete an empty bucket.

        Raises:
            NoSuchBucket: it does not exist.
            BucketNotEmpty: it holds objects, versions (delete markers
                included), open multipart uploads or snapshots.
        """
        with self._cat.write() as w:
            require_bucket(w, name)
            self._check_no_snapshots(w, name)
            if w.bucket_has_objects(name):
                raise BucketNotEmpty(f"bucket {name!r} holds objects", bucket=name)
            if w.bucket_has_uploads(name):
                raise BucketNotEmpty(f"bucket {name!r} has multipart uploads in progress", bucket=name)
            w.delete_bucket(name)
            self._kv.on_delete_bucket(w, name)
            def forget() -> None:
                self._forget_owner(name)
                self._chunks.forget_policy(name)
            w.on_commit(forget)

    def head_bucket(self, name: str) -> BucketInfo:
        """Look a bucket up.

        Raises:
            NoSuchBucket: it does not exist.
        """
        return require_bucket(self._cat, name)

    def list_buckets(self, owner: str | None = None) -> list[BucketInfo]:
        """The buckets of tenant ``owner`` (every bucket when ``None``), sorted by name."""
        buckets = self._cat.buckets()
        return buckets if owner is None else [b for b in buckets if owner_of(b.owner) == owner]

    # objects -----------------------------------------------------------
    def begin_put(self, bucket: str, key: str, *, etag: str = "md5") -> PendingWrite:
        """Start writing an object.

        Args:
            bucket: bucket name.
            key: object key.
            etag: ``"md5"`` (S3 compatible, ~0.6 GB/s of CPU) or ``"xxh3"``
                (fast path; ETag ``x<hex xxh3-128>``, tens of GB/s). The
                bucket's ETag policy overrides it: ``"fast"`` hashes with
                xxh3, ``"none"`` not at all (ETag ``n<blob id>``).

        Returns:
            A :class:`PendingWrite`; nothing is visible until its ``commit()``.

        Raises:
            NoSuchBucket: the bucket does not exist.
            KeyTooLong: key over 1,024 UTF-8 bytes.
            InvalidArgument: empty or non-UTF-8 key, unknown ``etag`` kind.
            StorageFull: the data folder is at its capacity.
        """
        check_key(key)
        check_hash_kind(etag)
        self._chunks.check_room(0)  # full already: refuse before any data arrives
        policy = require_bucket(self._cat, bucket).etag_policy
        kind: str | None = etag if policy == "md5" else "xxh3" if policy == "fast" else None

        def finish(pw, tmp, etag_value, md5_digest, **kw):
            return self._writes.publish_object(bucket, key, tmp, pw.size, etag_value, block_sums=pw.block_sums, **kw)

        return self._writes.begin(kind, finish)

    def put_object(
        self,
        bucket: str,
        key: str,
        data: bytes | bytearray | memoryview | Iterable | BinaryIO,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        checksums: dict[str, str] | None = None,
        content_md5: str | None = None,
        etag: str = "md5",
        headers: dict[str, str] | None = None,
        if_match: str | None = None,
        if_none_match: str | None = None,
        tags: dict[str, str] | None = None,
        retention: Retention | None = None,
    ) -> ObjectInfo:
        """Write a whole object from a buffer, an iterable of buffers or a binary file.

        Atomic: either the whole object is written, or nothing is visible.

        Args:
            data: a buffer; an iterable of buffers; or a binary file object
                (read with ``readinto`` in 8 MiB chunks into one reused buffer).
            content_type, metadata, checksums, content_md5, headers, if_match,
                if_none_match, tags, retention: as for :meth:`PendingWrite.commit`.
            etag: ``"md5"`` or ``"xxh3"`` (see :meth:`begin_put`).

        Returns:
            The new object's :class:`ObjectInfo`.

        Raises:
            NoSuchBucket, KeyTooLong, InvalidArgument, BadDigest, PreconditionFailed:
                see :meth:`begin_put` and :meth:`PendingWrite.commit`.
            TypeError: ``data`` is a ``str`` or not bytes-like.
        """
        pw = self.begin_put(bucket, key, etag=etag)
        with pw:
            feed(pw, data)
            return pw.commit(
                content_type=content_type, metadata=metadata, checksums=checksums, content_md5=content_md5,
                headers=headers, if_match=if_match, if_none_match=if_none_match, tags=tags, retention=retention,
            )

    def list_objects(
        self,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        continuation_token: str | None = None,
        max_keys: int = 1000,
        snapshot: str | None = None,
    ) -> ListResult:
        """List keys in UTF-8 byte order (S3 ListObjectsV2 semantics).

        With a delimiter, keys whose remainder after ``prefix`` contains it are
        rolled up into one common prefix (up to and including the first
        delimiter); each common prefix counts as one entry towards
        ``max_keys``, and the listing seeks past all keys under it instead of
        reading them. One page is read in one catalog snapshot.

        Args:
            bucket: bucket name.
            prefix: only keys starting with this.
            delimiter: any non-empty string rolls keys up; ``""`` for none.
            start_after: only entries after this one (also the v1 ``marker``).
                When it is itself a common prefix under ``delimiter`` (a v1
                ``NextMarker`` such as ``"b/"``), every key under it is skipped
                too, so the prefix is not rolled up and returned again.
            continuation_token: ``next_token`` of the previous page; takes
                precedence over ``start_after``.
            max_keys: page size, 0..1000 (larger values are clipped to 1000; 0
                returns an empty, non-truncated page).
            snapshot: list the keys snapshot ``snapshot`` recorded instead
                (NoSuchSnapshot when it has none of that name).

        Returns:
            One :class:`ListResult` page.

        Raises:
            NoSuchBucket: the bucket does not exist.
            InvalidArgument: negative ``max_keys``, a token we did not make,
                non-UTF-8 arguments.

        Source: "ListObjectsV2", Amazon S3 API Reference,
        https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html
        """
        check_text(prefix, "prefix")
        check_text(delimiter, "delimiter")
        check_text(start_after, "start_after")
        if not isinstance(max_keys, int) or max_keys < 0:
            raise InvalidArgument(f"max_keys must be an int >= 0, not {max_keys!r}")
        max_keys = min(max_keys, 1000)
        pos = start_position(prefix, delimiter, start_after, continuation_token)
        if snapshot is not None:
            return self._list_snapshot(bucket, snapshot, pos, prefix=prefix, delimiter=delimiter, max_keys=max_keys)
        hidden_before = self._kv.hidden_before(bucket, time.time())
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            if max_keys == 0:
                return ListResult([], [], False)
            return read_page(c, bucket, pos, prefix=prefix, delimiter=delimiter, max_keys=max_keys,
                             hidden_before=hidden_before)

    # multipart (see ._multipart) ----------------------------------------------
    def create_multipart_upload(
        self, bucket: str, key: str, *, content_type: str | None = None,
        metadata: dict[str, str] | None = None, headers: dict[str, str] | None = None,
        tags: dict[str, str] | None = None, retention: Retention | None = None,
    ) -> UploadInfo:
        """Start a multipart upload.

        ``content_type``, ``metadata``, ``headers``, ``tags`` and ``retention``
        (as for :meth:`PendingWrite.commit`) are those of the object it
        completes into; tags and lock settings are checked here.

        Returns:
            The upload (its ``upload_id`` is 32 hex digits).

        Raises:
            NoSuchBucket, KeyTooLong, InvalidArgument: as for :meth:`begin_put`.
            InvalidTag, InvalidRequestError: as for :meth:`PendingWrite.commit`.
        """
        return self._multipart.create(bucket, key, content_type, metadata, headers, tags, retention)

    def begin_part(self, bucket: str, key: str, upload_id: str, part_number: int) -> PendingWrite:
        """Like :meth:`begin_put` for a part; ``commit()`` returns a :class:`PartInfo`.

        A part's ETag is always the hex MD5 of its bytes. Uploading a part
        number again replaces that part. ``commit(checksums=...)`` stores the
        part's ``x-amz-checksum-*`` values (the caller has checked them);
        completion combines them (see :meth:`complete_multipart_upload`).

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
            InvalidArgument: part number outside 1..10000.
        """
        return self._multipart.begin_part(bucket, key, upload_id, part_number)

    def upload_part(self, bucket: str, key: str, upload_id: str, part_number: int, data,
                    *, content_md5: str | None = None, checksums: dict[str, str] | None = None) -> PartInfo:
        """Upload one part from a buffer, an iterable of buffers or a binary file.

        ``checksums``: the part's ``{"crc32": b64, ...}``, stored as given.

        Raises:
            NoSuchUpload, InvalidArgument: as for :meth:`begin_part`.
            BadDigest: ``content_md5`` does not match.
        """
        pw = self.begin_part(bucket, key, upload_id, part_number)
        with pw:
            feed(pw, data)
            return pw.commit(content_md5=content_md5, checksums=checksums)

    def head_multipart_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        """The upload ``upload_id`` of ``bucket/key``: its start time, metadata and headers.

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
        """
        return self._multipart.get(bucket, key, upload_id)

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        """The parts uploaded so far, by part number.

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
        """
        return self._multipart.list_parts(bucket, key, upload_id)

    def complete_multipart_upload(
        self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]], *,
        if_match: str | None = None, if_none_match: str | None = None,
    ) -> ObjectInfo:
        """Join parts ``[(part_number, etag), ...]`` into the object.

        The object file is built by kernel copies (``copy_file_range``) of the
        part files, then published like any put; the upload and its part files
        are then removed. The ETag is ``<hex md5 of the concatenated binary
        part MD5s>-N``. Part ETags may be given with or without quotes.

        Checksums: for each algorithm every chosen part was uploaded with, the
        object gets S3's composite checksum ``<b64 of H(part digests)>-N``
        (S3 "checksum of checksums") or, for the CRCs of an upload whose
        headers name the ``FULL_OBJECT`` type under
        :data:`gpufeed.checksums.UPLOAD_CHECKSUM_TYPE` (and always for
        CRC64NVME), the CRC of the whole object combined from the part CRCs
        (:func:`gpufeed.checksums.multipart_checksums`); algorithms only some
        parts have are dropped.
        ``if_match`` / ``if_none_match``: as for :meth:`PendingWrite.commit`.

        Repeating a completion that succeeded, with the same parts, returns the
        version it made again (its record as completed, with an empty ``path``,
        once it is no longer current); completions are remembered while their
        version is current and for ``COMPLETED_KEEP_S`` (24 h) after.

        Returns:
            The new object's :class:`ObjectInfo`.

        Raises:
            NoSuchUpload: no such upload (aborted, or never started; a completed
                one repeated with other parts or after it was forgotten).
            MalformedXML: ``parts`` is empty.
            InvalidPart: an unknown part, or an ETag that does not match.
            InvalidPartOrder: part numbers not strictly ascending.
            EntityTooSmall: a part other than the last is under 5 MiB.
            PreconditionFailed, NoSuchKey: a condition does not hold (the
                upload stays open, as in S3).

        Source: "CompleteMultipartUpload", Amazon S3 API Reference,
        https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html
        """
        return self._multipart.complete(bucket, key, upload_id, parts, if_match=if_match,
                                        if_none_match=if_none_match)

    def object_parts(self, info: ObjectInfo) -> list[PartInfo]:
        """The parts the version ``info`` was completed from, in object order
        (S3 GetObject ``partNumber`` n is the n-th); ``[]`` for a version that
        no multipart completion made (a put, a copy)."""
        return self._multipart.parts_of(info)

    def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        """Drop an upload and its parts.

        Raises:
            NoSuchUpload: no such upload for this bucket and key.
        """
        self._multipart.abort(bucket, key, upload_id)

    def list_multipart_uploads(self, bucket: str, prefix: str = "") -> list[UploadInfo]:
        """Uploads in progress whose key starts with ``prefix``, by key then start time.

        Raises:
            NoSuchBucket: the bucket does not exist.
        """
        return self._multipart.list_uploads(bucket, prefix)
