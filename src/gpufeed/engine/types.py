"""Plain records the engine returns. Frozen dataclasses, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "BucketInfo", "ObjectInfo", "ListResult", "UploadInfo", "PartInfo", "LifecycleRule", "LifecycleResult",
    "DeleteResult", "VersionListResult", "Retention", "VERSIONING_STATES", "LOCK_MODES", "TenantInfo",
    "AccessKeyInfo", "DEFAULT_TENANT", "ETAG_POLICIES", "DeleteConditions", "ChunkRecord",
    "DataPolicy", "DEFAULT_CHUNK_BYTES", "SnapshotInfo", "SnapshotDiff", "RestoreResult", "SNAPSHOT_KINDS",
    "FetchChunk",
]

#: The tenant that owns buckets made without one, and the node's configured key.
DEFAULT_TENANT = "default"

#: Bucket versioning states: ``""`` (never enabled: every object is version
#: ``null`` and a put replaces it), ``"Enabled"``, ``"Suspended"``.
VERSIONING_STATES = ("", "Enabled", "Suspended")
#: ETag policies of a bucket (see :attr:`BucketInfo.etag_policy`).
ETAG_POLICIES = ("md5", "fast", "none")
#: How a snapshot was made: by a call (``"manual"``) or by a bucket's schedule.
SNAPSHOT_KINDS = ("manual", "hourly", "daily", "replication")
#: Object lock retention modes (S3 ``ObjectLockRetentionMode``).
LOCK_MODES = ("GOVERNANCE", "COMPLIANCE")


@dataclass(frozen=True, slots=True)
class BucketInfo:
    """A bucket.

    Attributes:
        name: bucket name.
        created: Unix time in seconds.
        kind: ``"standard"`` (objects stay until deleted) or ``"kv"`` (a cache:
            objects are evicted least-recently-used first to stay within
            ``capacity_bytes``, and expire ``ttl_s`` after their last write).
        capacity_bytes: kv: the most bytes of object data the bucket holds; 0 = unlimited.
        ttl_s: kv: seconds an object stays visible after its last write; 0 = forever.
        versioning: ``""`` (never enabled), ``"Enabled"`` or ``"Suspended"``.
        object_lock: the bucket has object lock (WORM); its versioning is
            ``"Enabled"`` for good.
        lock_mode: default retention mode of new versions (``"GOVERNANCE"``,
            ``"COMPLIANCE"``), ``""`` for none.
        lock_days, lock_years: default retention period; one of them is
            non-zero when ``lock_mode`` is set.
        owner: the tenant owning the bucket (:data:`DEFAULT_TENANT` for ``""``).
        etag_policy: how object writes are hashed (one of :data:`ETAG_POLICIES`):
            ``"md5"`` (S3's ETag: hex MD5 of a single-part object), ``"fast"``
            (``x<hex xxh3-128>``, tens of GB/s), ``"none"`` (no hashing of the
            data; the ETag is ``n<version's blob id>``, unique per version).
    """

    name: str
    created: float
    kind: str = "standard"
    capacity_bytes: int = 0
    ttl_s: float = 0.0
    versioning: str = ""
    object_lock: bool = False
    lock_mode: str = ""
    lock_days: int = 0
    lock_years: int = 0
    owner: str = ""
    etag_policy: str = "md5"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """Metadata of one object version as stored in the catalog.

    Attributes:
        bucket: bucket name.
        key: object key (``str``, up to 1,024 UTF-8 bytes).
        size: length in bytes.
        etag: ETag without quotes: hex MD5 for single-part S3 puts,
            ``<hex md5 of part md5s>-N`` for multipart, ``x<hex xxh3-128>`` for
            fast-path puts that skip MD5.
        last_modified: Unix time, seconds (float).
        content_type: the ``Content-Type`` given at upload.
        metadata: user metadata (``x-amz-meta-*`` without the prefix, lower-case names).
        checksums: ``{"crc32c": b64, "sha256": b64, ...}`` as sent by the client;
            for a multipart object, the composite ``"<b64>-N"`` of the part checksums.
        blob_id: identifier of the immutable data file (changes on every overwrite).
        path: absolute path of the immutable data file holding exactly ``size`` bytes.
        headers: standard HTTP headers given at upload and returned on reads
            (``Cache-Control``, ``Content-Disposition``, ``Content-Encoding``,
            ``Content-Language``, ``Expires``, ``x-amz-website-redirect-location``),
            names as the front spells them; the engine stores them verbatim.
        version_id: ``"null"`` for the version of an unversioned or
            versioning-suspended bucket, else 32 hex digits.
        seq: orders the versions of one key (larger is newer); internal.
        delete_marker: the version is a delete marker (no data; ``size`` 0).
        is_latest: the version is the key's current one.
        lock_mode: retention mode (``"GOVERNANCE"``, ``"COMPLIANCE"``) or ``""``.
        lock_until: retain-until date, Unix s; 0 without retention.
        legal_hold: a legal hold is on.
        tags: the version's tag set (``key -> value``).
    """

    bucket: str
    key: str
    size: int
    etag: str
    last_modified: float
    content_type: str = "application/octet-stream"
    metadata: dict[str, str] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    blob_id: str = ""
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    version_id: str = "null"
    seq: int = 0
    delete_marker: bool = False
    is_latest: bool = True
    lock_mode: str = ""
    lock_until: float = 0.0
    legal_hold: bool = False
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Retention:
    """Object lock settings of a new version (S3 ``x-amz-object-lock-*``).

    Attributes:
        mode: ``"GOVERNANCE"``, ``"COMPLIANCE"`` or ``""`` (the bucket's default applies).
        until: retain-until date, Unix s (0 with ``mode`` ``""``).
        legal_hold: put a legal hold on the version.
    """

    mode: str = ""
    until: float = 0.0
    legal_hold: bool = False


@dataclass(frozen=True, slots=True)
class DeleteConditions:
    """Conditions of a delete (S3 DeleteObject ``If-Match``,
    ``x-amz-if-match-last-modified-time``, ``x-amz-if-match-size``): the version
    the delete targets must have all that are given.

    Attributes:
        etag: its ETag (no quotes), or ``"*"`` for any.
        last_modified: its last-modified time, Unix s (compared to the second, as HTTP dates are).
        size: its size in bytes.
    """

    etag: str | None = None
    last_modified: float | None = None
    size: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """What a delete did (S3 DeleteObject's response headers).

    Attributes:
        version_id: the version removed, or the delete marker made; ``None``
            in a never-versioned bucket.
        delete_marker: a delete marker was made, or the version removed was one.
    """

    version_id: str | None
    delete_marker: bool


@dataclass(frozen=True, slots=True)
class VersionListResult:
    """One page of ListObjectVersions.

    Attributes:
        versions: versions and delete markers, by key, newest first within a key.
        common_prefixes: rolled-up prefixes, sorted.
        is_truncated: more results exist.
        next_key_marker, next_version_id_marker: where the next page starts
            (``None`` when done; the version marker is ``None`` after a prefix).
    """

    versions: list[ObjectInfo]
    common_prefixes: list[str]
    is_truncated: bool
    next_key_marker: str | None = None
    next_version_id_marker: str | None = None


@dataclass(frozen=True, slots=True)
class ListResult:
    """One page of a listing (S3 ListObjectsV2 semantics).

    Attributes:
        objects: objects in UTF-8 byte order of key.
        common_prefixes: rolled-up prefixes when a delimiter was given, sorted.
        is_truncated: more results exist.
        next_token: opaque continuation token for the next page (``None`` when done).
        next_marker: last key or prefix returned (ListObjects v1 ``NextMarker``).
    """

    objects: list[ObjectInfo]
    common_prefixes: list[str]
    is_truncated: bool
    next_token: str | None = None
    next_marker: str | None = None


@dataclass(frozen=True, slots=True)
class UploadInfo:
    """An in-progress multipart upload. ``initiated`` is Unix seconds; ``headers``
    and ``tags`` as for :class:`ObjectInfo`, ``retention`` the object lock
    settings (all given the completed object)."""

    bucket: str
    key: str
    upload_id: str
    initiated: float
    content_type: str = "application/octet-stream"
    metadata: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    retention: Retention = field(default_factory=Retention)


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One uploaded part: ``part_number`` 1..10000, ``etag`` hex MD5 (no quotes), ``size`` bytes,
    ``checksums`` ``{"crc32": b64, ...}`` as sent with the part (checked by the front)."""

    part_number: int
    etag: str
    size: int
    last_modified: float
    checksums: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LifecycleRule:
    """One bucket lifecycle rule, of the kinds gpufeed applies (S3 ``LifecycleRule``).

    "N days after" means: the time plus N days, rounded up to the next midnight
    UTC, as S3 computes it.

    Attributes:
        id: the rule's ``ID``, 1 to 255 characters, unique in its bucket.
        enabled: ``Status`` ``Enabled`` (applied) or ``Disabled`` (kept, not applied).
        prefix: keys (of objects and uploads) the rule applies to start with
            this; ``""`` for every key.
        expiration_days: ``Expiration`` ``Days``: current objects expire N days
            after their last write (deleted; in a versioned bucket a delete
            marker becomes the latest version instead); ``None`` when not set.
        expiration_date: ``Expiration`` ``Date``: current objects expire (as
            for ``expiration_days``) once this time has come, Unix s (a midnight
            UTC); ``None`` when not set.
        abort_days: ``AbortIncompleteMultipartUpload`` ``DaysAfterInitiation``:
            multipart uploads are aborted N days after they were started; ``None``
            when not set.
        legacy_prefix: the rule gave its prefix in the rule-level ``Prefix``
            element S3 deprecated, not in a ``Filter`` (answered back the same way).
        noncurrent_days: ``NoncurrentVersionExpiration`` ``NoncurrentDays``:
            noncurrent versions (delete markers included) are removed for good N
            days after they became noncurrent (when the next newer version was
            made); ``None`` when not set.
        newer_noncurrent: ``NoncurrentVersionExpiration``
            ``NewerNoncurrentVersions``: that many newest noncurrent versions of
            each key are kept whatever their age, 1 to 100; ``None`` when not set.
        expired_object_delete_marker: ``Expiration``
            ``ExpiredObjectDeleteMarker``: ``True`` removes a delete marker that
            is its key's only version; ``False`` as given (no action); ``None``
            when not set. Never set together with ``expiration_days`` or
            ``expiration_date`` (``Days`` alone also removes such markers once
            they are that old).

    Source: "LifecycleRule", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleRule.html
    """

    id: str
    enabled: bool = True
    prefix: str = ""
    expiration_days: int | None = None
    expiration_date: float | None = None
    abort_days: int | None = None
    legacy_prefix: bool = False
    noncurrent_days: int | None = None
    newer_noncurrent: int | None = None
    expired_object_delete_marker: bool | None = None


@dataclass(frozen=True, slots=True)
class LifecycleResult:
    """What one pass of lifecycle rules did (:meth:`gpufeed.engine.Engine.apply_lifecycle`).

    Attributes:
        expired_objects: current objects expired by ``Expiration`` rules
            (deleted, or given a delete marker in a versioned bucket).
        aborted_uploads: multipart uploads aborted, by rules or as idle.
        noncurrent_expired: noncurrent versions (delete markers included)
            removed for good by ``NoncurrentVersionExpiration`` rules.
        delete_markers_removed: delete markers removed because they were their
            key's only version (``ExpiredObjectDeleteMarker``, or ``Days``).
        locked_skipped: noncurrent versions that were due but kept because
            object lock protects them (retention or legal hold).
    """

    expired_objects: int = 0
    aborted_uploads: int = 0
    noncurrent_expired: int = 0
    delete_markers_removed: int = 0
    locked_skipped: int = 0


@dataclass(frozen=True, slots=True)
class TenantInfo:
    """A tenant: a name owning buckets and access keys.

    Attributes:
        name: 1-63 of ``[a-z0-9_-]``, starting with a letter or digit.
        created: Unix s.
    """

    name: str
    created: float


@dataclass(frozen=True, slots=True)
class AccessKeyInfo:
    """An access key as listed (never its secret).

    Attributes:
        access_key: the access key id (20 upper-case letters and digits, ``GF`` first).
        tenant: the tenant it acts for.
        created: Unix s.
        revoked: Unix s of its revocation; 0 while it is valid.
    """

    access_key: str
    tenant: str
    created: float
    revoked: float = 0.0


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One chunk of object data as the catalog records it.

    A chunk is a run of an object's bytes, stored raw or compressed in a data
    file (``blobs/ab/cd/<file>``). Chunks of deduplicating buckets are found
    by ``(domain, digest)`` and shared by every manifest that holds the same
    bytes; other chunks belong to one manifest.

    Attributes:
        chunk_id: unique id (random hex; ``<blob_id>`` or ``<blob_id>.<n>`` for
            chunks that belong to one manifest).
        file: id of the data file that holds the stored bytes.
        file_offset: where the stored bytes start in that file, bytes.
        stored: length of the stored bytes (compressed length when ``codec``), bytes.
        size: length of the chunk's data, bytes.
        codec: ``""`` (raw), ``"lz4"`` or ``"zstd"``.
        digest: BLAKE3 (32 bytes) or xxh3-128 (16 bytes) of the data; for a raw
            chunk that belongs to one manifest, xxh3-128 of ``sums``.
        sums: the block sums of the stored bytes, checked on every read: for
            ``sum_kind`` 1 the running CRC32C at the end of every 4 KiB block
            (little-endian, 4 bytes each; the last block may be short), for
            ``sum_kind`` 0 (legacy) the xxh3-64 of every 64 KiB block (8 bytes
            each); see :mod:`gpufeed.engine._blocksums`.
        domain: dedup domain (the owning tenant) of a shared chunk, else ``None``.
        sum_kind: the format of ``sums``.
        holder: the node id whose data folder holds the data file (a PostgreSQL
            catalog shared by a cluster's nodes records it; ``""`` in SQLite,
            where one node holds every file, and for rows written before holders
            were recorded).
    """

    chunk_id: str
    file: str
    file_offset: int
    stored: int
    size: int
    codec: str
    digest: bytes
    sums: bytes
    domain: str | None = None
    sum_kind: int = 1
    holder: str = ""


class FetchChunk(Protocol):
    """How a node fetches chunks other nodes of its cluster hold
    (:meth:`gpufeed._peers.PeerLink.fetch`, installed with
    :meth:`~gpufeed.engine.Engine.use_peers`)."""

    def __call__(self, c: ChunkRecord, nodes: list[str], fd: int, span: tuple[int, int] | None = None) -> None:
        """Write chunk ``c``'s stored bytes (``span``: only the ``(offset,
        length)`` bytes of them) at their place (``c.file_offset`` + offset) of
        ``fd``, asking the nodes ``nodes`` (its holder, then the nodes with a
        copy) in turn until one sends them; unchecked.

        Raises:
            HolderUnavailable: no node is live, or none answered in time.
            DamagedObject: every node that answered reports the chunk damaged.
        """


#: Chunk size of a bucket's data unless it asks otherwise, bytes.
DEFAULT_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class DataPolicy:
    """How a bucket stores object data (its data services). Set with
    :meth:`gpufeed.engine.Engine.set_bucket_data`; applies to versions written
    afterwards (stored data keeps the form it was written in).

    Attributes:
        compression: ``"off"``, ``"lz4"`` or ``"zstd"``: per chunk, and a chunk that
            does not shrink by at least 3 % is kept raw.
        level: zstd level (1-19).
        dedup: store identical chunks once across every object and version of
            the buckets of the same tenant that also deduplicate.
        chunking: ``"fixed"`` (``chunk_bytes`` each) or ``"cdc"`` (content-defined,
            FastCDC, average ``chunk_bytes``, default 256 KiB, for dedup across
            shifted data; only with ``dedup``).
        chunk_bytes: chunk size (fixed) or average chunk size (cdc), bytes;
            64 KiB-64 MiB (cdc: 64 KiB-1 MiB).
        digest: ``"blake3"`` or ``"xxh3"`` (xxh3-128, faster, not cryptographic):
            the digest a deduplicated chunk is found by.
        verify: check every chunk read against its block sums (``False``: raw
            speed, unchecked reads; bucket stats say so).

    A raw (uncompressed) object in a bucket that does not deduplicate is one
    chunk in one data file, whatever ``chunk_bytes``: it reads and maps like a
    plain file.
    """

    compression: str = "off"
    level: int = 3
    dedup: bool = False
    chunking: str = "fixed"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    digest: str = "blake3"
    verify: bool = True


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A read-only record of a bucket's current objects at one instant.

    Attributes:
        bucket: the bucket.
        name: the snapshot's name (unique within the bucket).
        created: Unix s of the instant it records.
        kind: one of :data:`SNAPSHOT_KINDS` (scheduled ones are pruned by their schedule;
            ``replication`` ones by their replication rule, :mod:`gpufeed.replication`).
        objects: how many objects it holds.
        bytes: their summed sizes (logical bytes; their data is shared with
            every other row naming the same blob).
    """

    bucket: str
    name: str
    created: float
    kind: str = "manual"
    objects: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """Keys that differ between a base (a snapshot) and a target (a snapshot or
    the live bucket), each list in UTF-8 byte order of key.

    Attributes:
        added: keys in the target only.
        changed: keys in both whose data differs (another blob or ETag).
        removed: keys in the base only.
        retagged: keys in both with the same data whose tag set differs
            (PutObjectTagging and DeleteObjectTagging change a version's tags
            in place).
    """

    added: list[str]
    changed: list[str]
    removed: list[str]
    retagged: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What a restore did.

    Attributes:
        restored: keys made current again from the snapshot.
        deleted: keys deleted (delete markers in a versioned bucket) because the
            snapshot does not hold them.
        unchanged: keys whose current version already was the snapshot's.
    """

    restored: int
    deleted: int
    unchanged: int
