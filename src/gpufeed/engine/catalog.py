"""The catalog interface: every metadata operation the engine performs.

The engine keeps object data in immutable files (:mod:`._blobs`) and all
metadata (buckets, object versions, multipart uploads and their parts) in a
catalog. It talks to the catalog only through the three classes here, which
the SQLite catalog (:class:`gpufeed.engine._sqlite.SqliteCatalog`, the
default) and the PostgreSQL one (:class:`gpufeed.engine._postgres.PostgresCatalog`)
implement; both pass one conformance suite
(:class:`gpufeed.testing.catalog.CatalogTests`), and :mod:`._catalogs` picks
one from the node's settings.

Shape, after Garage's object / version / upload tables and 3FS's ``ChunkMetaStore``: plain reads
(:class:`CatalogReader`), consistent multi-statement reads (:meth:`Catalog.snapshot`), and one
serialised write transaction at a time (:meth:`Catalog.write`) whose commit is the moment a change
becomes visible. Records are the engine's own frozen dataclasses (:mod:`.types`); the catalog never
sees a data file, only blob ids and part file names, and learns where blobs live from the
``blob_path`` function it was made with (to fill :attr:`ObjectInfo.path`).

Contract every implementation keeps:

- Keys compare as UTF-8 bytes (S3 listing order); a key that is not valid
  UTF-8 makes :meth:`CatalogReader.object` raise ``InvalidArgument``.
- A write transaction commits when its block ends normally and rolls back on
  an exception; failures of the database are raised as ``InternalError``.
  Functions registered with :meth:`CatalogWriter.on_commit` run after the
  commit, still serialised with other writers, in commit order.
- Any use after :meth:`Catalog.close` raises ``InternalError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cached_property

from ..errors import InternalError, NoSuchBucket
from ._membership import LocalMembership, Membership
from .types import (
    AccessKeyInfo,
    BucketInfo,
    ChunkRecord,
    LifecycleRule,
    ObjectInfo,
    PartInfo,
    SnapshotInfo,
    TenantInfo,
    UploadInfo,
)

__all__ = [
    "Catalog", "CatalogReader", "CatalogWriter", "PartRecord", "CompletedUpload", "ObjectUse", "LiveFiles",
    "require_bucket",
]


@dataclass(frozen=True, slots=True)
class PartRecord:
    """A part as the catalog stores it: the public :class:`PartInfo` and ``file``,
    the part file's name under ``uploads/<upload_id>/`` (changes on every re-upload)."""

    info: PartInfo
    file: str


@dataclass(frozen=True, slots=True)
class CompletedUpload:
    """A multipart upload that completed: what a repeated CompleteMultipartUpload
    answers, and the part layout of the object version it made.

    Attributes:
        bucket, key, upload_id: the upload.
        etag: the object's ETag (``<hex md5>-N``).
        blob_id: the data file of the version it made.
        completed: Unix s of the completion.
        parts: the parts joined, in object order (their upload part numbers,
            ETags, sizes in bytes and checksums).
    """

    bucket: str
    key: str
    upload_id: str
    etag: str
    blob_id: str
    completed: float
    parts: tuple[PartInfo, ...]


@dataclass(frozen=True, slots=True)
class ObjectUse:
    """What a kv bucket's eviction needs of one object.

    Attributes:
        key: object key.
        size: bytes.
        blob_id: the current version's data file id.
        last_modified: Unix s of the write.
        last_used: Unix s of the last recorded read or write, whichever is later.
    """

    key: str
    size: int
    blob_id: str
    last_modified: float
    last_used: float


@dataclass(frozen=True, slots=True)
class LiveFiles:
    """Every data file a catalog row names, for the start-up sweep.

    Attributes:
        blobs: blob ids of all object versions and snapshot entries.
        parts: ``upload_id -> part file names``; every open upload is a key,
            with an empty set when it has no parts.
    """

    blobs: set[str]
    parts: dict[str, set[str]]


class CatalogReader(ABC):
    """Read operations; each sees the latest committed state (or, inside
    :meth:`Catalog.snapshot` and :meth:`Catalog.write`, that one state)."""

    # buckets -------------------------------------------------------------
    @abstractmethod
    def bucket(self, name: str) -> BucketInfo | None:
        """The bucket ``name``, or ``None``."""

    @abstractmethod
    def buckets(self) -> list[BucketInfo]:
        """Every bucket, by name (byte order)."""

    @abstractmethod
    def bucket_usage(self, name: str) -> tuple[int, int]:
        """``(bytes, objects)``: the summed sizes and the count of the bucket's objects."""

    @abstractmethod
    def bucket_has_objects(self, name: str) -> bool:
        """Whether the bucket holds at least one object."""

    @abstractmethod
    def bucket_has_uploads(self, name: str) -> bool:
        """Whether the bucket has at least one multipart upload in progress."""

    # objects -------------------------------------------------------------
    @abstractmethod
    def object(self, bucket: str, key: str) -> ObjectInfo | None:
        """The current version of ``bucket/key``, or ``None`` (also when the bucket is missing).

        Raises:
            InvalidArgument: ``key`` is not valid UTF-8.
        """

    @abstractmethod
    def scan_objects(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                     limit: int) -> Generator[ObjectInfo, None, None]:
        """Objects of ``bucket`` with ``start <= key`` (``<`` unless ``inclusive``)
        and ``key < end`` (no bound when ``end`` is ``None``), in byte order of
        key, at most ``limit``.

        Lazy: rows are read as the iterator advances, so a caller that stops
        early reads no more; close the iterator (``contextlib.closing``) when
        stopping early.
        """

    @abstractmethod
    def version(self, bucket: str, key: str, version_id: str) -> ObjectInfo | None:
        """The version ``version_id`` of ``bucket/key``, current or not, a delete
        marker included, or ``None``.

        Raises:
            InvalidArgument: ``key`` is not valid UTF-8.
        """

    @abstractmethod
    def noncurrent(self, bucket: str, key: str, limit: int = 1) -> list[ObjectInfo]:
        """Up to ``limit`` of the key's versions that are not in :meth:`object`
        (noncurrent versions and delete markers, the latest one included), newest first."""

    @abstractmethod
    def scan_noncurrent(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                        limit: int) -> Generator[ObjectInfo, None, None]:
        """Like :meth:`scan_objects` over the versions :meth:`noncurrent` holds,
        by key, newest first within a key; lazy."""

    @abstractmethod
    def object_uses(self, bucket: str) -> list[ObjectUse]:
        """Every object of ``bucket``, least recently used first (ties by key)."""

    @abstractmethod
    def live_files(self) -> LiveFiles:
        """Every blob id and part file a row names (snapshot entries included)."""

    # snapshots -------------------------------------------------------------
    @abstractmethod
    def bucket_snapshot(self, bucket: str, name: str) -> SnapshotInfo | None:
        """The snapshot ``name`` of ``bucket``, or ``None``."""

    @abstractmethod
    def bucket_snapshots(self, bucket: str) -> list[SnapshotInfo]:
        """The bucket's snapshots, oldest first (ties by name)."""

    @abstractmethod
    def snapshot_object(self, bucket: str, snapshot: str, key: str) -> ObjectInfo | None:
        """The version of ``key`` that snapshot ``snapshot`` of ``bucket`` recorded
        (every field as it was then, ``path`` filled), or ``None``.

        Raises:
            InvalidArgument: ``key`` is not valid UTF-8.
        """

    @abstractmethod
    def scan_snapshot(self, bucket: str, snapshot: str, start: str, *, inclusive: bool, end: str | None,
                      limit: int) -> Generator[ObjectInfo, None, None]:
        """Like :meth:`scan_objects` over the entries of one snapshot; lazy."""

    # multipart -------------------------------------------------------------
    @abstractmethod
    def upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo | None:
        """The upload ``upload_id`` if it is one for ``bucket/key``, else ``None``."""

    @abstractmethod
    def uploads(self, bucket: str) -> list[UploadInfo]:
        """The bucket's uploads in progress, by key, then start time."""

    @abstractmethod
    def parts(self, upload_id: str) -> list[PartRecord]:
        """The upload's parts, by part number."""

    @abstractmethod
    def part_file(self, upload_id: str, part_number: int) -> str | None:
        """The file name of one part, or ``None`` when it was not uploaded."""

    @abstractmethod
    def idle_uploads(self, before: float) -> list[UploadInfo]:
        """Uploads of every bucket untouched since ``before`` (Unix s): started
        before it, and no part uploaded at or after it. By bucket, key, start time."""

    # lifecycle -------------------------------------------------------------
    @abstractmethod
    def lifecycle(self, bucket: str) -> list[LifecycleRule] | None:
        """The bucket's lifecycle rules in the order they were set, or ``None`` when
        it has no configuration (also when the bucket is missing)."""

    @abstractmethod
    def lifecycles(self) -> dict[str, list[LifecycleRule]]:
        """``bucket -> rules`` of every bucket that has a lifecycle configuration."""

    # tenants and access keys --------------------------------------------------
    @abstractmethod
    def quota(self, scope: str, name: str) -> tuple[int, int]:
        """``(max_bytes, max_objects)`` of a ``"tenant"`` or ``"bucket"``; 0 = no limit."""

    @abstractmethod
    def usage(self, bucket: str) -> tuple[int, int]:
        """``(bytes, versions)`` a bucket holds: every version with data, current
        or not (delete markers not counted), kept exact by every write."""

    @abstractmethod
    def parts_usage(self, bucket: str) -> int:
        """Bytes of the parts of the bucket's multipart uploads in progress."""

    @abstractmethod
    def tenant_parts_usage(self, tenant: str) -> int:
        """:meth:`parts_usage` summed over the buckets ``tenant`` owns."""

    @abstractmethod
    def tenant_usage(self, tenant: str) -> tuple[int, int]:
        """:meth:`usage` summed over the buckets ``tenant`` owns."""

    @abstractmethod
    def tenant(self, name: str) -> TenantInfo | None:
        """The tenant ``name``, or ``None``."""

    @abstractmethod
    def tenants(self) -> list[TenantInfo]:
        """Every tenant the catalog holds, by name."""

    @abstractmethod
    def access_key(self, access_key: str) -> tuple[AccessKeyInfo, str] | None:
        """The key and its sealed secret as stored, or ``None`` (revoked keys included)."""

    @abstractmethod
    def access_keys(self, tenant: str | None = None) -> list[AccessKeyInfo]:
        """The keys of ``tenant`` (of every tenant when ``None``), oldest first, revoked ones included."""

    # bucket configuration documents -------------------------------------------
    @abstractmethod
    def bucket_config(self, bucket: str, name: str) -> str | None:
        """The bucket's configuration document ``name`` (``"cors"``, ``"tagging"``, ...)
        as stored, or ``None`` when it has none (also when the bucket is missing)."""

    # completed uploads -------------------------------------------------------
    @abstractmethod
    def completed_upload(self, upload_id: str) -> CompletedUpload | None:
        """The record of the completed upload ``upload_id``, or ``None``."""

    @abstractmethod
    def completion_of(self, blob_id: str) -> CompletedUpload | None:
        """The record of the upload whose completion made the version ``blob_id``, or ``None``."""

    # chunks and manifests ----------------------------------------------------
    @abstractmethod
    def manifest(self, blob_id: str) -> tuple[int, list[ChunkRecord]] | None:
        """The manifest of ``blob_id``: ``(size in bytes, its chunks in order)``,
        or ``None`` when no manifest has that id."""

    @abstractmethod
    def chunk(self, chunk_id: str) -> ChunkRecord | None:
        """The chunk ``chunk_id``, if it exists."""

    @abstractmethod
    def find_chunk(self, domain: str, digest: bytes) -> ChunkRecord | None:
        """The shared chunk of dedup ``domain`` whose data has ``digest``, if any."""

    @abstractmethod
    def blob_referenced(self, blob_id: str) -> bool:
        """Whether a current object, a noncurrent version or a snapshot entry names ``blob_id``."""

    @abstractmethod
    def unmanifested_blobs(self) -> list[tuple[str, int, str]]:
        """``(blob id, size in bytes, bucket)`` of object versions whose blob has no
        manifest (data written by a gpufeed that kept one plain file per version)."""

    @abstractmethod
    def orphan_manifests(self) -> list[str]:
        """Manifests that no object version nor snapshot entry names (left by a
        crash between a version's removal and the release of its data)."""

    @abstractmethod
    def data_files(self) -> set[str]:
        """Ids of every data file a chunk lives in that this node holds (every one
        in SQLite; in a catalog shared by a cluster, those whose chunks name this
        node as their :attr:`~.types.ChunkRecord.holder`)."""

    def unheld_files(self) -> set[str]:
        """Ids of data files whose chunks name no holder (a shared catalog's rows
        written before holders were recorded); empty where one node holds all."""
        return set()

    # Copies of data files on other cluster nodes (:mod:`._pgcopies`); a catalog that
    # one node opens keeps none, so these default to "none".
    def copy_files(self) -> set[str]:
        """Ids of the data files this node holds as copies of another node's."""
        return set()

    def file_copies(self, file: str) -> list[str]:
        """Node ids holding a copy of data file ``file`` besides its chunks' holder."""
        return []

    def file_records(self, file: str) -> list[ChunkRecord]:
        """The chunks that live in data file ``file``, by offset."""
        return []

    def under_replicated(self, live: list[str], factor: int) -> int:
        """Chunks with fewer than ``factor`` copies on the nodes ``live``."""
        return 0

    def under_replicated_files(self, live: list[str], factor: int, after: str, limit: int) -> list[str]:
        """Ids (after ``after``, at most ``limit``, in order) of data files with a
        chunk that has fewer than ``factor`` copies on the nodes ``live``."""
        return []

    @abstractmethod
    def file_chunks(self, file: str) -> list[str]:
        """Ids of the chunks that live in data file ``file``."""

    @abstractmethod
    def parts_total(self) -> int:
        """Bytes of every part of every multipart upload in progress."""

    @abstractmethod
    def chunk_totals(self) -> tuple[int, int, int]:
        """``(chunks, stored bytes, data bytes)`` over every chunk."""

    @abstractmethod
    def scan_chunks(self, after: str, limit: int) -> list[ChunkRecord]:
        """Up to ``limit`` chunks with ids greater than ``after``, in id order (for scrub)."""

    @abstractmethod
    def chunk_users(self, chunk_id: str, limit: int = 10) -> list[tuple[str, str, str]]:
        """Up to ``limit`` ``(bucket, key, version_id)`` whose data includes ``chunk_id``."""

    @abstractmethod
    def damaged_chunks(self) -> dict[str, tuple[str, float]]:
        """``chunk_id -> (reason, when found, Unix s)`` of every chunk marked damaged."""

    @abstractmethod
    def bucket_data_usage(self, bucket: str) -> tuple[int, int, int]:
        """``(logical bytes, stored bytes, chunks)`` of ``bucket``: logical sums every
        version with data; stored and chunks count the chunks the bucket stored
        (a chunk that dedup shares with other buckets counts in the one that
        stored it first, once). Kept as running totals: no scan."""


class CatalogWriter(CatalogReader):
    """The open write transaction: reads see its own changes."""

    # chunks and manifests ----------------------------------------------------
    def add_file_copies(self, file: str, nodes: list[str]) -> None:
        """Record that ``nodes`` hold a copy of data file ``file`` (while a chunk names it).

        Raises:
            InternalError: this catalog keeps no copies (one node opens it).
        """
        if nodes:
            raise InternalError("this catalog is one node's: it records no copies on other nodes")

    @abstractmethod
    def insert_chunk(self, record: ChunkRecord, refs: int, bucket: str = "") -> None:
        """Add a chunk with ``refs`` references (the caller made its id unique),
        stored by ``bucket`` (its stored bytes count there; see :meth:`bucket_data_usage`)."""

    @abstractmethod
    def add_chunk_refs(self, chunk_id: str, n: int) -> bool:
        """Add ``n`` references to a chunk; ``False`` when it no longer exists."""

    @abstractmethod
    def insert_manifest(self, blob_id: str, size: int, chunk_ids: list[str]) -> None:
        """Record the manifest of ``blob_id``: its chunks in order (the caller
        took one reference on each chunk per appearance)."""

    @abstractmethod
    def release_manifest(self, blob_id: str) -> tuple[list[str], int]:
        """Drop the manifest of ``blob_id`` and one reference per appearance of
        each of its chunks; chunks left without references are deleted.

        Returns:
            ``(files, stored)``: ids of data files no chunk lives in any more (to
            unlink after the commit) and the stored bytes of the chunks deleted.
        """

    @abstractmethod
    def repair_chunk(self, chunk_id: str, record: ChunkRecord) -> str | None:
        """Point chunk ``chunk_id`` at a fresh, good copy of its data (``record``'s
        file, offset, stored length, codec and sums; its id, digest and
        references stay) and clear its damage mark.

        Returns:
            The data file it lived in before (to unlink after the commit when no
            other chunk uses it), or ``None`` when the chunk no longer exists.
        """

    @abstractmethod
    def mark_damaged(self, chunk_id: str, reason: str, when: float) -> None:
        """Record a chunk as damaged (the first reason found is kept)."""

    @abstractmethod
    def clear_damaged(self, chunk_id: str) -> None:
        """Forget that a chunk was damaged (it was repaired or released)."""

    @abstractmethod
    def on_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` right after this transaction commits (never if it rolls
        back), serialised with other writers, so in-memory state that mirrors
        the catalog changes in commit order. ``fn`` must not raise."""

    # buckets -------------------------------------------------------------
    @abstractmethod
    def insert_bucket(self, info: BucketInfo) -> None:
        """Add a bucket (the caller checked that none has its name)."""

    @abstractmethod
    def set_bucket_limits(self, name: str, capacity_bytes: int, ttl_s: float) -> None:
        """Change a bucket's ``capacity_bytes`` and ``ttl_s``."""

    @abstractmethod
    def insert_tenant(self, info: TenantInfo) -> None:
        """Add a tenant (the caller checked the name is free)."""

    @abstractmethod
    def delete_tenant(self, name: str) -> None:
        """Remove a tenant, its quota and every access key of it (the caller checked it owns no bucket)."""

    @abstractmethod
    def set_quota(self, scope: str, name: str, max_bytes: int, max_objects: int) -> None:
        """Set the quota of a ``"tenant"`` or ``"bucket"`` (both 0: none). A
        bucket's is removed with the bucket."""

    @abstractmethod
    def insert_access_key(self, info: AccessKeyInfo, sealed_secret: str) -> None:
        """Add an access key with its secret sealed by the engine (stored as given)."""

    @abstractmethod
    def revoke_access_key(self, access_key: str, when: float) -> bool:
        """Mark a valid key revoked at ``when`` (Unix s).

        Returns:
            Whether a valid key was revoked.
        """

    @abstractmethod
    def set_bucket_versioning(self, name: str, state: str) -> None:
        """Set a bucket's versioning state (one of :data:`~gpufeed.engine.types.VERSIONING_STATES`)."""

    @abstractmethod
    def set_bucket_lock(self, name: str, mode: str, days: int, years: int) -> None:
        """Turn object lock on for a bucket with this default retention (``mode`` ``""``: none)."""

    @abstractmethod
    def delete_bucket(self, name: str) -> None:
        """Remove a bucket row, its lifecycle configuration, configuration
        documents, usage and quota (the caller checked it is empty)."""

    @abstractmethod
    def set_lifecycle(self, bucket: str, rules: list[LifecycleRule]) -> None:
        """Make ``rules`` (kept in this order) the bucket's whole lifecycle
        configuration, replacing any (the caller checked the bucket exists and
        the rules are valid). Fields of :class:`LifecycleRule` round-trip exactly."""

    @abstractmethod
    def delete_lifecycle(self, bucket: str) -> bool:
        """Remove the bucket's lifecycle configuration.

        Returns:
            Whether it had one.
        """

    @abstractmethod
    def set_bucket_config(self, bucket: str, name: str, value: str) -> None:
        """Make ``value`` the bucket's configuration document ``name``, replacing
        any (the caller checked the bucket exists). Round-trips exactly."""

    @abstractmethod
    def delete_bucket_config(self, bucket: str, name: str) -> bool:
        """Remove the bucket's configuration document ``name``.

        Returns:
            Whether it had one.
        """

    # objects -------------------------------------------------------------
    @abstractmethod
    def put_object(self, info: ObjectInfo) -> None:
        """Make ``info`` the current version of its key (replacing any); its
        last use is ``info.last_modified``. ``info.path`` is not stored."""

    @abstractmethod
    def insert_noncurrent(self, info: ObjectInfo) -> None:
        """Add a version that is not in the ``objects`` place: a noncurrent
        version, or a delete marker (the key's latest when ``info.is_latest``).
        The caller keeps ``(bucket, key, version_id)`` and ``(bucket, key, seq)`` unique."""

    @abstractmethod
    def delete_noncurrent(self, bucket: str, key: str, version_id: str) -> bool:
        """Remove a version :meth:`insert_noncurrent` added.

        Returns:
            Whether a row was removed.
        """

    @abstractmethod
    def set_latest_marker(self, bucket: str, key: str, version_id: str | None) -> None:
        """Make the delete marker ``version_id`` the key's latest version and no
        other (``None``: no delete marker of the key is latest)."""

    @abstractmethod
    def update_version(self, info: ObjectInfo) -> bool:
        """Store the retention, legal hold and tags of ``info`` on the version
        ``(info.bucket, info.key, info.version_id)``, wherever it is.

        Returns:
            Whether the version exists.
        """

    @abstractmethod
    def delete_object(self, bucket: str, key: str, blob_id: str | None = None) -> bool:
        """Remove ``bucket/key`` (only if its version is ``blob_id``, when given).

        Returns:
            Whether a row was removed.
        """

    @abstractmethod
    def delete_versions(self, bucket: str, versions: list[tuple[str, str]]) -> None:
        """Remove each ``(key, blob_id)`` of ``bucket`` whose version is still that blob."""

    @abstractmethod
    def set_last_used(self, bucket: str, times: dict[str, float]) -> None:
        """Record read times, ``key -> Unix s``, of objects of ``bucket`` (missing keys are skipped)."""

    # snapshots -------------------------------------------------------------
    @abstractmethod
    def insert_snapshot(self, info: SnapshotInfo) -> SnapshotInfo:
        """Record the bucket's current objects (every row :meth:`scan_objects`
        reads, with all their fields) as snapshot ``info.name``, in this
        transaction (the caller checked the bucket exists and the name is free).

        Returns:
            ``info`` with its ``objects`` and ``bytes`` counted.
        """

    @abstractmethod
    def delete_snapshot(self, bucket: str, name: str) -> list[str]:
        """Remove a snapshot and its entries.

        Returns:
            The distinct blob ids its entries named (the caller frees those no
            other row names, :meth:`referenced_blobs`).
        """

    @abstractmethod
    def referenced_blobs(self, blob_ids: list[str]) -> set[str]:
        """Those of ``blob_ids`` that some row still names: a current object, a
        noncurrent version or a snapshot entry, of any bucket."""

    # multipart -------------------------------------------------------------
    @abstractmethod
    def insert_upload(self, info: UploadInfo) -> None:
        """Add an upload."""

    @abstractmethod
    def put_part(self, upload_id: str, record: PartRecord) -> None:
        """Add a part, replacing one of the same number."""

    @abstractmethod
    def delete_upload(self, upload_id: str) -> None:
        """Remove an upload and all its parts."""

    # completed uploads -------------------------------------------------------
    @abstractmethod
    def insert_completed(self, record: CompletedUpload) -> None:
        """Remember a completed upload (replacing a record of the same id)."""

    @abstractmethod
    def prune_completed(self, before: float) -> int:
        """Forget the completed uploads finished before ``before`` (Unix s) whose
        version is no longer the current one of its key.

        Returns:
            How many records were removed.
        """


class Catalog(CatalogReader):
    """A catalog: plain reads (each statement sees the latest commit), snapshots and writes."""

    @abstractmethod
    def snapshot(self) -> AbstractContextManager[CatalogReader]:
        """A read transaction: everything read inside sees one committed state."""

    @abstractmethod
    def write(self) -> AbstractContextManager[CatalogWriter]:
        """The write transaction; one at a time across threads.

        Commits when the block ends normally, rolls back on an exception.

        Raises:
            InternalError: the database failed (disk full, I/O error), or the catalog is closed.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the database; idempotent. Later calls raise ``InternalError``."""

    @property
    def holder(self) -> str:
        """The node id new chunks are recorded as held by; ``""`` where one node
        holds every data file (SQLite)."""
        return ""

    def claim_files(self, files: set[str]) -> int:
        """Record this node as the holder of ``files`` among :meth:`unheld_files`
        (found in its folder). Returns the chunks claimed."""
        return 0

    def drop_file_copies(self, files: set[str]) -> int:
        """Forget this node's copies of ``files`` (found missing from its folder). Returns the rows removed."""
        return 0

    def files_held(self, after: str, limit: int) -> list[str]:
        """Data files this node holds as holder or copy, after ``after`` (a cluster's catalog; else none)."""
        return []

    def give_up_file(self, file: str, live: list[str], factor: int, prefer: list[str]) -> bool:
        """Stop holding ``file`` when ``factor`` other live nodes hold it (a cluster's catalog; else False)."""
        return False

    @cached_property
    def membership(self) -> Membership:
        """The clusters' members (:mod:`._membership`). By default kept in this
        process (:class:`~._membership.LocalMembership`): a catalog that one node
        opens has that node as its only member. A catalog that several nodes
        share keeps them in its database."""
        return LocalMembership()


def require_bucket(reader: CatalogReader, name: str) -> BucketInfo:
    """The bucket ``name`` as ``reader`` sees it.

    Raises:
        NoSuchBucket: it does not exist.
    """
    info = reader.bucket(name)
    if info is None:
        raise NoSuchBucket(f"bucket {name!r} does not exist", bucket=name)
    return info
