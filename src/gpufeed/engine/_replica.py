"""Replica buckets: the receiving side of replication to a second site, mixed
into :class:`~gpufeed.engine.Engine`.

A bucket becomes a replica when a replication source claims it
(:meth:`ReplicaTarget.claim_replica`); the mark is its configuration document
``gpufeed-replica`` (JSON: ``source``, ``since``, ``snapshot`` (the last
source snapshot applied whole), ``snapshot_created``, ``rounds``,
``chunks_received``, ``duplicate_chunks``), kept by the catalog with the
bucket's other documents. While the mark is there:

- S3 and fast-path writes to the bucket are refused: :meth:`authorize` of both
  fronts answers ``AccessDenied`` for the actions in
  :data:`REPLICA_REFUSED_ACTIONS`, naming ``gpufeed replicate failover``.
  Reads work as on any bucket.
- Data arrives only through the calls below, which the admin API serves to
  the source node (:mod:`gpufeed.s3._admin_replication`):

  1. :meth:`replica_lacking`: which of these chunk digests are not staged;
  2. :meth:`replica_put_chunk`: one chunk, checked against its BLAKE3 digest,
     written to ``replica-staging/<bucket>/<hex digest>`` in the data folder
     (a temp name, fsynced, then renamed: a chunk is staged whole or not at all);
  3. :meth:`replica_commit`: a new version of a key from staged chunks and
     ranges of its current version (checked against their digests), in
     order, through the ordinary write path: the version is visible only once
     all its bytes are in (atomic as every put);
  4. :meth:`replica_delete`: a key the source no longer has;
     :meth:`replica_retag`: a key whose tags alone changed gets them in place;
  5. :meth:`replica_end_round`: the source snapshot is applied whole; the
     staged chunks are removed.

  Staged chunks stay until the round ends, so a transfer resumed after a
  broken connection (either side restarted) asks again and never needs a
  chunk it sent before.
- :meth:`promote_replica` (failover) removes the mark and the staging: the
  bucket is an ordinary, writable bucket from then on. A chunk that was being
  staged as the bucket was promoted may land after that; the engine's start
  (:meth:`sweep_staging`) removes the staging of every bucket that is not a
  replica, and the temp files of chunks cut off mid-write.

A claim is refused when the bucket holds objects and is not already the
replica of the same source: nothing of what it holds is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import blake3

from ..errors import (
    AccessDenied,
    BadDigest,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    InvalidArgument,
    InvalidRequestError,
)
from ._blobs import BlobFiles, fsync_dir, remove_quietly
from ._private import FILE_MODE, make_private_dirs
from ._tenants import BucketMemo
from .catalog import Catalog, require_bucket
from .types import DEFAULT_TENANT, BucketInfo, DeleteConditions, DeleteResult, ObjectInfo

if TYPE_CHECKING:
    from ._handles import ObjectHandle
    from ._writes import PendingWrite

__all__ = ["ReplicaTarget", "REPLICA_CONFIG", "ADDING_CONFIG", "REPLICA_REFUSED_ACTIONS", "MAX_REPLICA_CHUNK_BYTES",
           "MAX_LACK_DIGESTS", "STAGING_DIR"]

#: The bucket configuration document that marks a replica.
REPLICA_CONFIG = "gpufeed-replica"
#: Set on a source bucket while a rule to it is being added (``{"source": rule id}``):
#: a claim that finds its own source id there is a claim of the source bucket itself.
ADDING_CONFIG = "gpufeed-replication-adding"
#: What a replica was when failover promoted it (its last mark and ``promoted_at``).
PROMOTED_CONFIG = "gpufeed-replica-promoted"
#: Folder of the data folder where received chunks wait for their version's commit.
STAGING_DIR = "replica-staging"
#: Largest chunk :meth:`ReplicaTarget.replica_put_chunk` accepts, bytes.
MAX_REPLICA_CHUNK_BYTES = 16 << 20  # 16 MiB
#: Most digests one :meth:`ReplicaTarget.replica_lacking` call may ask about.
MAX_LACK_DIGESTS = 10_000
#: Most chunks one committed version may name.
MAX_COMMIT_CHUNKS = 1 << 20
#: S3 actions refused on a replica bucket (its content changes only by replication).
REPLICA_REFUSED_ACTIONS = frozenset({
    "s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObjectTagging",
    "s3:PutObjectVersionTagging", "s3:DeleteObjectTagging", "s3:DeleteObjectVersionTagging",
    "s3:PutObjectRetention", "s3:PutObjectLegalHold", "s3:PutObjectAcl", "s3:PutObjectVersionAcl",
    "s3:DeleteBucket", "s3:AbortMultipartUpload",
})
_HEX = frozenset("0123456789abcdef")
_RECEIVED_LOG = ".received"


def _check_digest(digest: object) -> str:
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        raise InvalidArgument(f"a chunk digest is 64 lowercase hex characters (BLAKE3-256), not {digest!r}",
                              argument_name="digest", argument_value=str(digest)[:80])
    return digest


def _commit_item(item: object) -> tuple[str, tuple[int, int] | None]:
    """A commit's chunk: ``(digest, None)`` staged, ``(digest, (offset, length))`` from the current version."""
    if isinstance(item, str):
        return _check_digest(item), None
    if isinstance(item, dict) and set(item) == {"digest", "offset", "length"}:
        off, length = item["offset"], item["length"]
        if (all(isinstance(v, int) and not isinstance(v, bool) for v in (off, length))
                and off >= 0 and 0 <= length <= MAX_REPLICA_CHUNK_BYTES):
            return _check_digest(item["digest"]), (off, length)
    raise InvalidArgument("a commit's chunk is a digest or {digest, offset, length} of the current version "
                          f"(length at most {MAX_REPLICA_CHUNK_BYTES}), not {str(item)[:80]!r}")


class ReplicaTarget:
    """Replica calls, mixed into :class:`~gpufeed.engine.Engine`."""

    _cat: Catalog
    _files: BlobFiles
    data_dir: Path
    if TYPE_CHECKING:
        def create_bucket(self, name: str, *, kind: str = "standard", capacity_bytes: int = 0,
                          ttl_s: float = 0.0, object_lock: bool = False, owner: str = DEFAULT_TENANT,
                          etag_policy: str = "md5") -> BucketInfo:
            """:meth:`~gpufeed.engine.Engine.create_bucket`."""

        def begin_put(self, bucket: str, key: str, *, etag: str = "md5") -> PendingWrite:
            """:meth:`~gpufeed.engine.Engine.begin_put`."""

        def open_version(self, bucket: str, key: str, version_id: str | None = None, *,
                         snapshot: str | None = None) -> ObjectHandle:
            """:meth:`~gpufeed.engine._reads.ObjectReads.open_version`."""

        def put_object_tagging(self, bucket: str, key: str, tags: dict[str, str], *,
                               version_id: str | None = None) -> ObjectInfo:
            """:meth:`~gpufeed.engine._versioning.VersionedObjects.put_object_tagging`."""

        def delete_object(self, bucket: str, key: str, version_id: str | None = None, *,
                          bypass_governance: bool = False,
                          conditions: DeleteConditions | None = None) -> DeleteResult:
            """:meth:`~gpufeed.engine._versioning.VersionedObjects.delete_object`."""

    # the mark ---------------------------------------------------------------------
    def _replica_memo(self) -> BucketMemo[dict]:
        memo = self.__dict__.get("_replica_memo_")
        if memo is None:
            memo = self.__dict__.setdefault("_replica_memo_", BucketMemo[dict]())
        return memo

    def replica_of(self, bucket: str) -> dict | None:
        """The bucket's replica mark (see the module docstring), or ``None`` when it
        is not a replica (or does not exist). Answered from memory after the first
        lookup; every change of the mark forgets it."""
        memo = self._replica_memo()
        found, mark = memo.get(bucket)
        if found:
            return mark
        gen = memo.gen
        doc = self._cat.bucket_config(bucket, REPLICA_CONFIG)
        mark = json.loads(doc) if doc else None
        memo.put(bucket, mark, gen)
        return mark

    def check_writable(self, bucket: str, action: str) -> None:
        """Refuse an S3 or fast-path write to a replica bucket.

        Raises:
            AccessDenied: ``action`` is in :data:`REPLICA_REFUSED_ACTIONS` and the
                bucket is a replica (the message says how to make it writable).
        """
        if action in REPLICA_REFUSED_ACTIONS and self.replica_of(bucket) is not None:
            raise AccessDenied(f"bucket {bucket!r} is a read-only replica of another site; it changes only "
                               "by replication until 'gpufeed replicate failover' promotes it", bucket=bucket)

    def _set_mark(self, bucket: str, mark: dict | None, promoted: dict | None = None) -> None:
        """Set (or with ``None`` remove) the replica mark; a new mark forgets what an
        earlier failover recorded, a promotion records ``promoted``."""
        with self._cat.write() as w:
            require_bucket(w, bucket)
            if mark is None:
                w.delete_bucket_config(bucket, REPLICA_CONFIG)
            else:
                w.set_bucket_config(bucket, REPLICA_CONFIG, json.dumps(mark, sort_keys=True))
                w.delete_bucket_config(bucket, PROMOTED_CONFIG)
            if promoted is not None:
                w.set_bucket_config(bucket, PROMOTED_CONFIG, json.dumps(promoted, sort_keys=True))
            w.on_commit(lambda: self._replica_memo().forget(bucket))

    def _require_replica(self, bucket: str, source: str | None = None) -> dict:
        """The bucket's mark.

        Raises:
            NoSuchBucket: no such bucket.
            InvalidRequestError: it is not a replica (or of another source than ``source``).
        """
        require_bucket(self._cat, bucket)
        self._replica_memo().forget(bucket)  # the source's calls read the catalog, not the memo
        mark = self.replica_of(bucket)
        if mark is None:
            raise InvalidRequestError(f"bucket {bucket!r} is not a replica (promoted, or never claimed)")
        if source is not None and mark.get("source") != source:
            raise InvalidRequestError(f"bucket {bucket!r} is the replica of another source "
                                      f"({mark.get('source')!r}, not {source!r})")
        return mark

    def claim_replica(self, bucket: str, source: str, *, owner: str = DEFAULT_TENANT) -> dict:
        """Make ``bucket`` the replica of ``source`` (made, owned by ``owner``, when missing).

        Args:
            bucket: the target bucket.
            source: the replication rule's id (at most 128 characters).
            owner: the tenant of a bucket this call makes.

        Returns:
            :meth:`replica_status`.

        Raises:
            BucketNotEmpty: the bucket holds objects (or snapshots) and is not
                already the replica of ``source``; nothing changed.
            InvalidRequestError: it is the replica of another source, or it is
                the source bucket itself (the same node, or a member of the
                same cluster: :data:`ADDING_CONFIG` names ``source`` there).
            InvalidArgument: a bad source id or bucket name.
        """
        if not isinstance(source, str) or not 0 < len(source) <= 128:
            raise InvalidArgument("a replication source id is a string of 1-128 characters")
        adding = self._cat.bucket_config(bucket, ADDING_CONFIG) if self._cat.bucket(bucket) is not None else None
        if adding and json.loads(adding).get("source") == source:
            raise InvalidRequestError(f"bucket {bucket!r} is the replication rule's own source bucket (the target "
                                      "is this node, or a node sharing its catalog); replicate to a bucket of "
                                      "another site. Nothing was changed", bucket=bucket)
        if self._cat.bucket(bucket) is None:
            try:
                self.create_bucket(bucket, owner=owner)
            except BucketAlreadyOwnedByYou:
                pass  # made meanwhile: checked below like any existing bucket
        mark = self.replica_of(bucket)
        if mark is not None:
            if mark.get("source") != source:
                raise InvalidRequestError(f"bucket {bucket!r} is already the replica of another source "
                                          f"({mark.get('source')!r}); promote or empty it first")
            return self.replica_status(bucket)
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            held = list(c.scan_objects(bucket, "", inclusive=True, end=None, limit=1))
            snaps = c.bucket_snapshots(bucket)
        if held or snaps:
            what = f"object {held[0].key!r}" if held else f"snapshot {snaps[0].name!r}"
            raise BucketNotEmpty(f"bucket {bucket!r} cannot become a replica: it is not empty (it holds "
                                 f"{what}); a replication target must be an empty or missing bucket. "
                                 "Nothing was changed", bucket=bucket)
        self._set_mark(bucket, {"source": source, "since": time.time(), "snapshot": "", "snapshot_created": 0.0,
                                "rounds": 0, "chunks_received": 0, "duplicate_chunks": 0})
        return self.replica_status(bucket)

    def replica_status(self, bucket: str) -> dict:
        """The mark, plus this round's ``staged_chunks``, ``round_chunks_received``
        and ``round_duplicate_chunks`` (chunks sent again although staged), and
        ``promoted`` (false). For a replica that failover promoted: its last mark,
        ``promoted`` (true) and ``promoted_at`` (Unix s).

        Raises:
            NoSuchBucket, InvalidRequestError: no such bucket; not a replica, nor one
                that was promoted.
        """
        require_bucket(self._cat, bucket)
        if self.replica_of(bucket) is None:
            doc = self._cat.bucket_config(bucket, PROMOTED_CONFIG)
            if doc:
                return {**json.loads(doc), "bucket": bucket, "promoted": True}
        mark = dict(self._require_replica(bucket))
        mark["promoted"] = False
        folder = self._staging(bucket)
        names = os.listdir(folder) if folder.is_dir() else []
        received = self._received(folder)
        mark.update(bucket=bucket, staged_chunks=sum(1 for n in names if len(n) == 64),
                    round_chunks_received=len(received), round_duplicate_chunks=len(received) - len(set(received)))
        return mark

    def sweep_staging(self) -> int:
        """At start: remove the staging folders of buckets that are gone or no
        longer replicas, and chunk temp files a killed node left in the others.

        Returns:
            The number of folders and temp files removed.
        """
        root = self.data_dir / STAGING_DIR
        removed = 0
        for name in sorted(os.listdir(root)) if root.is_dir() else []:
            folder = root / name
            if self._cat.bucket(name) is None or self.replica_of(name) is None:
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
                continue
            for entry in os.listdir(folder):
                if entry.startswith(".tmp-"):
                    remove_quietly(str(folder / entry))
                    removed += 1
        return removed

    # chunks -------------------------------------------------------------------------
    def _staging(self, bucket: str) -> Path:
        return self.data_dir / STAGING_DIR / bucket

    @staticmethod
    def _received(folder: Path) -> list[str]:
        """Every chunk received this round, once per arrival: the log, plus the
        staged chunks it lacks (a node killed between staging a chunk and
        logging it still received that chunk once)."""
        try:
            logged = (folder / _RECEIVED_LOG).read_text().split()
        except FileNotFoundError:
            logged = []
        try:
            staged = {n for n in os.listdir(folder) if len(n) == 64}
        except FileNotFoundError:
            staged = set()
        return logged + sorted(staged.difference(logged))

    def replica_lacking(self, bucket: str, source: str, digests: object) -> list[str]:
        """The digests of ``digests`` not staged for ``bucket``, in the order given.

        Raises:
            NoSuchBucket, InvalidRequestError: no such bucket; not ``source``'s replica.
            InvalidArgument: not a list of digests, or over :data:`MAX_LACK_DIGESTS`.
        """
        if not isinstance(digests, list) or len(digests) > MAX_LACK_DIGESTS:
            raise InvalidArgument(f"digests is a list of at most {MAX_LACK_DIGESTS} chunk digests")
        self._require_replica(bucket, source)
        folder = self._staging(bucket)
        return [d for d in map(_check_digest, digests) if not (folder / d).is_file()]

    def replica_put_chunk(self, bucket: str, source: str, digest: str, data: bytes) -> bool:
        """Stage one chunk (see the module docstring).

        Returns:
            ``False`` when it was staged already (kept; counted as a duplicate).

        Raises:
            NoSuchBucket, InvalidRequestError: no such bucket; not ``source``'s replica.
            InvalidArgument: a bad digest, or more than :data:`MAX_REPLICA_CHUNK_BYTES`.
            BadDigest: the data's BLAKE3-256 is not ``digest``.
        """
        _check_digest(digest)
        if len(data) > MAX_REPLICA_CHUNK_BYTES:
            raise InvalidArgument(f"a replicated chunk is at most {MAX_REPLICA_CHUNK_BYTES} bytes")
        self._require_replica(bucket, source)
        if blake3.blake3(data).hexdigest() != digest:
            raise BadDigest(f"the chunk's BLAKE3 digest is not {digest}", bucket=bucket)
        folder = self._staging(bucket)
        make_private_dirs(folder)
        path = folder / digest
        if path.is_file():
            self._log_received(folder, digest)
            return False
        tmp = folder / f".tmp-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self._files.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            remove_quietly(str(tmp))
            raise
        os.close(fd)
        os.replace(tmp, path)
        if self._files.fsync:
            fsync_dir(str(folder))
        self._log_received(folder, digest)  # after it is staged: a chunk cut off is not counted
        return True

    @staticmethod
    def _log_received(folder: Path, digest: str) -> None:
        fd = os.open(folder / _RECEIVED_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        with open(fd, "a") as log:
            log.write(digest + "\n")

    def replica_commit(self, bucket: str, source: str, key: str, chunks: object, *, size: object,
                       content_type: str | None = None, metadata: dict | None = None,
                       checksums: dict | None = None, headers: dict | None = None,
                       tags: dict | None = None) -> dict:
        """Make ``chunks`` (in order) the new current version of ``key``; atomic
        like every put. Each item is a staged chunk's digest, or
        ``{"digest", "offset", "length"}``: those bytes of the key's current
        version on this node (the unchanged part of a changed object), checked
        against the digest.

        Returns:
            ``{"key", "size", "etag"}`` of the new version.

        Raises:
            NoSuchBucket, InvalidRequestError: no such bucket; not ``source``'s replica;
                a chunk that is not staged, a staged chunk or bytes of the current
                version that are not their digest (a damaged staged chunk is removed,
                so it is asked for again; the message names the chunk; nothing is visible).
            InvalidArgument: a bad chunk list, or the chunks' bytes are not ``size``.
        """
        if not isinstance(chunks, list) or len(chunks) > MAX_COMMIT_CHUNKS:
            raise InvalidArgument(f"chunks is a list of at most {MAX_COMMIT_CHUNKS} items")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidArgument("size is the version's bytes, an integer >= 0")
        self._require_replica(bucket, source)
        items = [_commit_item(c) for c in chunks]
        folder = self._staging(bucket)
        for d, span in items:
            if span is None and not (folder / d).is_file():
                raise InvalidRequestError(f"chunk {d} of {key!r} is not staged on the target; send it first")
        current = self.open_version(bucket, key) if any(span for _, span in items) else None
        try:
            with self.begin_put(bucket, key) as pw:
                for d, span in items:
                    if span is None:  # staged: checked again, it may have rotted since it arrived
                        data = (folder / d).read_bytes()
                        if blake3.blake3(data).hexdigest() != d:
                            (folder / d).unlink(missing_ok=True)  # asked for again by the next lacking call
                            raise InvalidRequestError(f"chunk {d} of {key!r} staged on the target is damaged "
                                                      "(its bytes are not its digest); send it again")
                        pw.write(data)
                        continue
                    assert current is not None
                    buf = bytearray(span[1])
                    n = current.read_into(buf, span[0]) if span[1] else 0
                    if n != span[1] or blake3.blake3(buf).hexdigest() != d:
                        raise InvalidRequestError(f"chunk {d} of {key!r} is no longer in the target's current "
                                                  "version; send it")
                    pw.write(buf)
                info = pw.commit(content_type=content_type, metadata=metadata, checksums=checksums,
                                 headers=headers, tags=tags, expected_size=size)
        finally:
            if current is not None:
                current.close()
        return {"key": info.key, "size": info.size, "etag": info.etag}

    def replica_delete(self, bucket: str, source: str, key: str) -> None:
        """Delete ``key`` as the source did (a missing key is not an error).

        Raises:
            NoSuchBucket, InvalidRequestError: no such bucket; not ``source``'s replica.
        """
        self._require_replica(bucket, source)
        self.delete_object(bucket, key)

    def replica_retag(self, bucket: str, source: str, key: str, tags: object) -> None:
        """Replace the tag set of ``key``'s current version, as the source's
        PutObjectTagging or DeleteObjectTagging did (the data is unchanged,
        so no version is written).

        Raises:
            NoSuchBucket, InvalidRequestError: no such bucket; not ``source``'s replica.
            NoSuchKey: the target has no current version of ``key`` (the source
                then sends the whole version).
            InvalidArgument, InvalidTag: ``tags`` is not a tag set within S3's limits.
        """
        if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in tags.items()):
            raise InvalidArgument("tags is an object of string keys and values")
        self._require_replica(bucket, source)
        self.put_object_tagging(bucket, key, tags)

    def replica_end_round(self, bucket: str, source: str, snapshot: str, created: float) -> dict:
        """Record source snapshot ``snapshot`` (made at ``created``, Unix s) as
        applied whole and remove the staged chunks.

        Returns:
            :meth:`replica_status` after the change.

        Raises:
            NoSuchBucket, InvalidRequestError: no such bucket; not ``source``'s replica.
            InvalidArgument: a bad snapshot name or time.
        """
        if not isinstance(snapshot, str) or not 0 < len(snapshot) <= 128:
            raise InvalidArgument("snapshot is the source snapshot's name")
        if isinstance(created, bool) or not isinstance(created, (int, float)):
            raise InvalidArgument("created is the source snapshot's time, Unix seconds")
        mark = dict(self._require_replica(bucket, source))
        folder = self._staging(bucket)
        received = self._received(folder)
        mark.update(snapshot=snapshot, snapshot_created=float(created), rounds=int(mark.get("rounds", 0)) + 1,
                    chunks_received=int(mark.get("chunks_received", 0)) + len(received),
                    duplicate_chunks=int(mark.get("duplicate_chunks", 0)) + len(received) - len(set(received)))
        self._set_mark(bucket, mark)
        shutil.rmtree(folder, ignore_errors=True)
        return self.replica_status(bucket)

    def promote_replica(self, bucket: str) -> dict:
        """Failover: make the replica an ordinary, writable bucket (its mark and
        staged chunks go).

        Returns:
            The mark it had, plus ``bucket``.

        Raises:
            NoSuchBucket: no such bucket.
            InvalidRequestError: it is not a replica.
        """
        mark = dict(self._require_replica(bucket))
        self._set_mark(bucket, None, promoted={**mark, "promoted_at": time.time()})
        shutil.rmtree(self._staging(bucket), ignore_errors=True)
        mark["bucket"] = bucket
        return mark
