"""Multipart uploads: upload rows, part files, and joining parts into an object.

Part files live under ``uploads/<upload_id>/<part_number:05d>.<id>`` (a fresh
``<id>`` per upload of a part, so a re-upload never overwrites a file a
catalog row still names) and follow the same write protocol as blobs: temp
file, fsync, rename, then the catalog commit. Completion builds the object by
kernel copies of the part files and publishes it like any put, dropping the
upload in the same catalog transaction. The public API and its documentation
are :class:`gpufeed.engine.Engine`'s multipart methods, which call this.

Source: "Uploading and copying objects using multipart upload", Amazon S3 User Guide,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import TYPE_CHECKING

from ..checksums import UPLOAD_CHECKSUM_ALGORITHM, UPLOAD_CHECKSUM_TYPE, multipart_checksums
from ..errors import (
    EntityTooSmall,
    HolderUnavailable,
    InternalError,
    InvalidArgument,
    InvalidPart,
    InvalidPartOrder,
    MalformedXML,
    NoSuchUpload,
    StorageFull,
)
from ._blobs import BlobFiles, new_id, remove_quietly
from ._names import check_key, check_str_map, check_text
from ._room import folder_bytes, removing
from ._tenants import check_quota
from ._versions import check_tags, lock_of_new
from ._writes import PendingWrite, WritePath
from .catalog import Catalog, CatalogReader, CatalogWriter, CompletedUpload, PartRecord, require_bucket
from .types import ObjectInfo, PartInfo, Retention, UploadInfo

if TYPE_CHECKING:
    from ._partcopies import PartPeers
    from ._room import NodeRoom

__all__ = ["Multipart", "MIN_PART_BYTES", "MAX_PARTS", "COMPLETED_KEEP_S"]

#: Smallest part other than the last one (S3: 5 MiB).
MIN_PART_BYTES = 5 << 20
#: Highest part number S3 accepts.
MAX_PARTS = 10_000

#: How long a completed upload is remembered after its version stopped being
#: the current one (a repeated CompleteMultipartUpload answers it meanwhile), s.
COMPLETED_KEEP_S = 24 * 3600.0

_DEFAULT_TYPE = "application/octet-stream"
_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC

def get_upload(reader: CatalogReader, bucket: str, key: str, upload_id: str) -> UploadInfo:
    """The upload ``upload_id`` of ``bucket/key``.

    Raises:
        NoSuchUpload: a malformed id, or no such upload for this bucket and key.
    """
    if not isinstance(upload_id, str) or not _UPLOAD_ID_RE.fullmatch(upload_id):
        raise NoSuchUpload(f"no upload {upload_id!r}", upload_id=upload_id)
    info = reader.upload(bucket, key, upload_id)
    if info is None:
        raise NoSuchUpload(f"no upload {upload_id!r} for {bucket}/{key}", upload_id=upload_id)
    return info


def _choose_parts(have: dict[int, PartRecord], parts: list[tuple[int, str]]) -> list[PartRecord]:
    """The uploaded parts named by ``[(part_number, etag), ...]``, checked as S3 does.

    Raises:
        InvalidPartOrder, InvalidPart, EntityTooSmall: see
            :meth:`gpufeed.engine.Engine.complete_multipart_upload`.
    """
    prev = 0
    chosen: list[PartRecord] = []
    for number, given in parts:
        if not isinstance(number, int) or number <= prev:
            raise InvalidPartOrder(f"part numbers must ascend; {number!r} follows {prev}")
        prev = number
        etag = given.strip().strip('"') if isinstance(given, str) else ""
        found = have.get(number)
        if found is None or found.info.etag != etag:
            raise InvalidPart(f"part {number} with ETag {given!r} was not uploaded", part_number=number)
        chosen.append(found)
    for rec in chosen[:-1]:
        if rec.info.size < MIN_PART_BYTES:
            raise EntityTooSmall(
                f"part {rec.info.part_number} is {rec.info.size} bytes; all but the last must be >= {MIN_PART_BYTES}",
                part_number=rec.info.part_number, size=rec.info.size,
            )
    return chosen


def _joined_etag_and_checksums(chosen: list[PartRecord], checksum_type: str | None) -> tuple[str, dict[str, str]]:
    """The multipart ETag ``<hex md5 of the binary part MD5s>-N`` and the object's
    checksums (composite or full-object, see :func:`gpufeed.checksums.multipart_checksums`)."""
    joined = hashlib.md5(b"".join(bytes.fromhex(rec.info.etag) for rec in chosen)).hexdigest()
    checksums = multipart_checksums([(rec.info.checksums, rec.info.size) for rec in chosen], checksum_type)
    return f"{joined}-{len(chosen)}", checksums


def _same_parts(done: CompletedUpload, parts: list[tuple[int, str]]) -> bool:
    """Whether ``[(part_number, etag)]`` names exactly the parts ``done`` joined."""
    given = [(n, e.strip().strip('"') if isinstance(e, str) else e) for n, e in parts]
    return given == [(p.part_number, p.etag) for p in done.parts]


#: Most noncurrent versions of a key searched for a repeated completion's version.
_REPEAT_SEARCH = 10000


def _repeat_answer(reader: CatalogReader, done: CompletedUpload) -> ObjectInfo:
    """What a repeated completion returns: the version it made while that is
    the key's current or one of its (newest :data:`_REPEAT_SEARCH`) noncurrent
    versions, else that version's record as completed (``path`` and
    ``blob_id`` empty, version id ``null``)."""
    current = reader.object(done.bucket, done.key)
    if current is not None and current.blob_id == done.blob_id:
        return current
    for v in reader.noncurrent(done.bucket, done.key, _REPEAT_SEARCH):
        if not v.delete_marker and v.blob_id == done.blob_id:
            return v
    # The upload's checksum type is gone with its row: each algorithm's default
    # (FULL_OBJECT for CRC64NVME, COMPOSITE otherwise).
    checksums = _joined_etag_and_checksums([PartRecord(p, "") for p in done.parts], None)[1]
    return ObjectInfo(done.bucket, done.key, sum(p.size for p in done.parts), done.etag, done.completed,
                      checksums=checksums)


def _record_copies(w: CatalogWriter, upload_id: str, file: str, nodes: list[str]) -> None:
    """Record the nodes holding part file ``file`` where the catalog keeps that
    (a cluster's shared catalog, ``part_copies``)."""
    add = getattr(w, "add_part_copies", None)
    if add is not None and all(nodes):
        add(upload_id, file, nodes)


class Multipart:
    """The multipart operations of one engine.

    Args:
        catalog: the engine's catalog.
        files: the engine's data folder.
        writes: the engine's write path (pending writes for parts and joins,
            and the object commit).

    Attributes:
        peers: the other nodes of the cluster that parts are copied to, fetched
            from and deleted on (:mod:`._partcopies`); ``None``: this node alone.
        room: a cluster node's own figures (:mod:`._room`): a part's file is
            admitted by them (``StorageFull`` when it does not fit, its bytes
            counted from then on, and uncounted when it is deleted); ``None``:
            the engine's capacity check (:meth:`~._chunks.ChunkStore.check_room`).
    """

    def __init__(self, catalog: Catalog, files: BlobFiles, writes: WritePath) -> None:
        self._cat = catalog
        self._files = files
        self._writes = writes
        self.peers: PartPeers | None = None
        self.room: NodeRoom | None = None

    def create(self, bucket: str, key: str, content_type: str | None, metadata: dict[str, str] | None,
               headers: dict[str, str] | None, tags: dict[str, str] | None = None,
               retention: Retention | None = None) -> UploadInfo:
        """Start an upload (its directory first, then its row)."""
        check_key(key)
        ct = content_type or _DEFAULT_TYPE
        check_str_map(metadata)
        check_str_map(headers)
        tags = check_tags(tags) if tags else {}
        require_bucket(self._cat, bucket)
        upload_id = new_id()
        self._files.new_upload_dir(upload_id)
        now = time.time()
        info = UploadInfo(bucket, key, upload_id, now, ct, dict(metadata or {}), dict(headers or {}), tags,
                          retention or Retention())
        try:
            with self._cat.write() as w:
                b = require_bucket(w, bucket)
                lock_of_new(b, retention, now)  # refuse lock settings the completion would refuse
                w.insert_upload(info)
        except BaseException:
            self._files.remove_upload_dir(upload_id)
            raise
        return info

    def begin_part(self, bucket: str, key: str, upload_id: str, part_number: int) -> PendingWrite:
        """A pending write for one part; its ``commit()`` returns a :class:`PartInfo`."""
        if not isinstance(part_number, int) or not 1 <= part_number <= MAX_PARTS:
            raise InvalidArgument(f"part number must be 1..{MAX_PARTS}, not {part_number!r}")
        get_upload(self._cat, bucket, key, upload_id)
        self._writes.chunks.check_room(0)  # full already: refuse before any data arrives

        def finish(pw, tmp, etag, md5_digest, *, checksums, **_kw):
            return self._publish_part(bucket, key, upload_id, part_number, tmp, pw.size, etag, checksums)

        return self._writes.begin("md5", finish)

    def _publish_part(self, bucket: str, key: str, upload_id: str, part_number: int, tmp: str,
                      size: int, etag: str, checksums: dict[str, str] | None) -> PartInfo:
        check_str_map(checksums)
        room = self.room
        try:
            if room is not None:
                room.reserve(size)  # counted at once: parts and copies arriving together cannot pass it
            else:
                self._writes.chunks.check_room(size)
        except StorageFull:
            remove_quietly(tmp)
            raise
        try:
            file = f"{part_number:05d}.{new_id()}"
            path = self._place_part(tmp, upload_id, file)
            info = self._commit_part(bucket, key, upload_id, part_number, file, path,
                                     PartInfo(part_number, etag, size, time.time(), dict(checksums or {})))
            if room is not None:
                room.add_file(path, size)
        finally:
            if room is not None:
                room.release(size)
        return info

    def _commit_part(self, bucket: str, key: str, upload_id: str, part_number: int, file: str, path: str,
                     info: PartInfo) -> PartInfo:
        """Copy the part file at ``path`` to the other nodes (in a cluster) and commit
        its row; the file and its copies are deleted when either fails, and the
        file of the part it replaces (here and on the other nodes) once it commits."""
        peers = self.peers
        pushed: list[str] = []
        try:
            if peers is not None:  # copies on other nodes before the part is acknowledged
                pushed = peers.push(bucket, key, upload_id, file, path, info.etag)
            with self._cat.write() as w:
                get_upload(w, bucket, key, upload_id)
                old = w.part_file(upload_id, part_number)
                w.put_part(upload_id, PartRecord(info, file))
                if peers is not None:  # where its copies are (the cluster status counts them)
                    _record_copies(w, upload_id, file, [self._cat.holder, *pushed])
                check_quota(w, require_bucket(w, bucket))
        except BaseException:
            remove_quietly(path)
            if peers is not None and pushed:
                peers.drop(bucket, key, upload_id, [file])
            raise
        if old is not None:
            self._remove_part_files([self._files.part_path(upload_id, old)])
            if peers is not None:
                peers.drop(bucket, key, upload_id, [old])
        return info

    def _place_part(self, tmp: str, upload_id: str, file: str) -> str:
        """Rename a part's finished temp file into its upload's folder; in a cluster,
        the folder is made when this node has none (another node started the upload)."""
        for _ in range(2 if self.peers is not None else 1):
            if self.peers is not None:
                self._files.ensure_upload_dir(upload_id)
            try:
                return self._files.publish_part(tmp, upload_id, file)
            except FileNotFoundError:  # the folder went (the upload ended, or a sweep took it empty)
                continue
        remove_quietly(tmp)
        raise NoSuchUpload(f"upload {upload_id} was completed or aborted", upload_id=upload_id)

    def get(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        """The upload's row (see :func:`get_upload`)."""
        return get_upload(self._cat, bucket, key, upload_id)

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[PartInfo]:
        """The parts uploaded so far, by part number."""
        with self._cat.snapshot() as c:
            get_upload(c, bucket, key, upload_id)
            return [rec.info for rec in c.parts(upload_id)]

    def complete(self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]], *,
                 if_match: str | None, if_none_match: str | None) -> ObjectInfo:
        """Join the chosen parts into the object and drop the upload (one catalog transaction)."""
        if not parts:
            raise MalformedXML("CompleteMultipartUpload needs at least one part")
        try:
            with self._cat.snapshot() as c:
                upload = get_upload(c, bucket, key, upload_id)
                have = {rec.info.part_number: rec for rec in c.parts(upload_id)}
        except NoSuchUpload:
            repeated = self._completed_as(bucket, key, upload_id, parts)  # a retry of one that committed
            if repeated is None:
                raise
            return repeated
        try:
            return self._join(bucket, key, upload, _choose_parts(have, parts), if_match, if_none_match)
        except (NoSuchUpload, InvalidPart):
            repeated = self._completed_as(bucket, key, upload_id, parts)  # a completion at the same time won
            if repeated is None:
                raise
            return repeated

    def _completed_as(self, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]]) -> ObjectInfo | None:
        """The answer of the completion of ``upload_id`` with the same parts that
        already committed (a retry, or one at the same time through another
        node), its leftover part files deleted; ``None`` when there is none."""
        with self._cat.snapshot() as c:
            done = c.completed_upload(upload_id)
            if done is None or (done.bucket, done.key) != (bucket, key) or not _same_parts(done, parts):
                return None
            repeated = _repeat_answer(c, done)
        self.forget_parts(bucket, key, upload_id)  # a node that died mid-completion left them
        return repeated

    def _join(self, bucket: str, key: str, upload: UploadInfo, chosen: list[PartRecord], if_match: str | None,
              if_none_match: str | None) -> ObjectInfo:
        """Write the object from the ``chosen`` parts and drop the upload in the same
        catalog transaction (see :meth:`complete`)."""
        upload_id = upload.upload_id
        # The part rows read above are the ones committed with (drop_upload checks
        # each part's file is unchanged), so these checksums describe its bytes.
        headers = dict(upload.headers)
        checksum_type = headers.pop(UPLOAD_CHECKSUM_TYPE, None)
        headers.pop(UPLOAD_CHECKSUM_ALGORITHM, None)
        etag, composite = _joined_etag_and_checksums(chosen, checksum_type)
        files = {rec.info.part_number: rec.file for rec in chosen}

        def drop_upload(w: CatalogWriter, info: ObjectInfo) -> None:
            get_upload(w, bucket, key, upload_id)
            for number, file in files.items():
                if w.part_file(upload_id, number) != file:
                    raise InvalidPart(f"part {number} was replaced meanwhile", part_number=number)
            w.delete_upload(upload_id)
            w.prune_completed(info.last_modified - COMPLETED_KEEP_S)
            w.insert_completed(CompletedUpload(bucket, key, upload_id, etag, info.blob_id, info.last_modified,
                                               tuple(rec.info for rec in chosen)))

        def finish(pw, tmp, _etag, _md5, **_kw):
            return self._writes.publish_object(
                bucket, key, tmp, pw.size, etag,
                content_type=upload.content_type, metadata=upload.metadata, checksums=composite,
                headers=headers, if_match=if_match, if_none_match=if_none_match, extra=drop_upload,
                tags=upload.tags, retention=upload.retention if upload.retention != Retention() else None,
            )

        with self._writes.begin(None, finish) as pw:
            fetched = self._fetch_missing(pw, upload, chosen)
            for rec in chosen:
                self._append_part(pw, upload, rec, rec.file in fetched)
            info = pw.commit()
        self.forget_parts(bucket, key, upload_id)
        return info

    def _remove_part_files(self, paths: list[str]) -> None:
        """Delete part files of this node's folder (their bytes stop counting in :attr:`room`)."""
        with removing(self.room) as gone:
            for path in paths:
                try:
                    size = os.stat(path).st_size
                    os.unlink(path)
                    gone(size)
                except FileNotFoundError:
                    pass

    def forget_parts(self, bucket: str, key: str, upload_id: str) -> None:
        """Delete an ended upload's part files here and (in a cluster) on the other nodes."""
        with removing(self.room) as gone:
            gone(folder_bytes(self._files.upload_dir(upload_id)))
            self._files.remove_upload_dir(upload_id)
        if self.peers is not None:
            self.peers.drop(bucket, key, upload_id, [])

    def _fetch_missing(self, pw: PendingWrite, upload: UploadInfo, chosen: list[PartRecord]) -> set[str]:
        """In a cluster, write the parts of ``chosen`` whose file this node lacks at
        their places in ``pw`` (past its end: :meth:`_append_part` counts them in
        order) from other nodes' copies, a bounded number at once, each checked
        against its MD5. Returns the files fetched.

        Raises:
            HolderUnavailable: a part reached no node that has it (the others stopped).
            NoSuchUpload, InvalidPart: the upload ended, or a part was replaced, meanwhile.
        """
        if self.peers is None:
            return set()
        wants: list[tuple[str, str, int, int]] = []
        offset = pw.size
        for rec in chosen:
            if not os.path.isfile(self._files.part_path(upload.upload_id, rec.file)):
                wants.append((rec.file, rec.info.etag, rec.info.size, offset))
            offset += rec.info.size
        self._fetch(upload, chosen, wants, pw.fileno())
        return {w[0] for w in wants}

    def _fetch(self, upload: UploadInfo, recs: list[PartRecord], wants: list[tuple[str, str, int, int]],
               fd: int) -> None:
        """``peers.fetch_parts`` of ``wants``; a failure answers an ended upload or
        a replaced part of ``recs`` as such (an abort or a new upload took it)."""
        assert self.peers is not None
        try:
            self.peers.fetch_parts(upload.bucket, upload.key, upload.upload_id, wants, fd)
        except HolderUnavailable:
            self._check_unchanged(upload, [r for r in recs if r.file in {w[0] for w in wants}])
            raise

    def _append_part(self, pw: PendingWrite, upload: UploadInfo, rec: PartRecord, fetched: bool) -> None:
        """Count one part onto the end of ``pw``: one :meth:`_fetch_missing` wrote
        there already, else a kernel copy of this node's file (or, in a cluster,
        when this node's file went meanwhile, the bytes of another node's copy)."""
        number, size, upload_id = rec.info.part_number, rec.info.size, upload.upload_id
        if fetched:
            pw.wrote(size)
            return
        try:
            sfd = os.open(self._files.part_path(upload_id, rec.file), _OPEN_READ)
        except FileNotFoundError as exc:
            if self.peers is not None:
                self._fetch(upload, [rec], [(rec.file, rec.info.etag, size, pw.size)], pw.fileno())
                pw.wrote(size)
                return
            raise InvalidPart(f"part {number} is not in this node's data folder: it was replaced or removed "
                              "meanwhile", part_number=number) from exc
        try:
            if pw.write_from_fd(sfd, 0, size) != size:
                raise InternalError(f"part file {rec.file} of upload {upload_id} is short")
        finally:
            os.close(sfd)

    def _check_unchanged(self, upload: UploadInfo, recs: list[PartRecord]) -> None:
        """Raise what a completion answers when its upload ended, or one of its parts
        ``recs`` was uploaded again, since it read them (one catalog snapshot).

        Raises:
            NoSuchUpload: the upload was completed or aborted meanwhile.
            InvalidPart: a part was replaced meanwhile.
        """
        with self._cat.snapshot() as c:
            get_upload(c, upload.bucket, upload.key, upload.upload_id)
            for rec in recs:
                if c.part_file(upload.upload_id, rec.info.part_number) != rec.file:
                    raise InvalidPart(f"part {rec.info.part_number} was replaced meanwhile",
                                      part_number=rec.info.part_number)

    def parts_of(self, info: ObjectInfo) -> list[PartInfo]:
        """The parts the version ``info`` was completed from, in object order (``[]``: not multipart)."""
        done = self._cat.completion_of(info.blob_id) if info.blob_id else None
        return list(done.parts) if done is not None else []

    def abort(self, bucket: str, key: str, upload_id: str) -> None:
        """Drop an upload, its rows, then its part files."""
        with self._cat.write() as w:
            get_upload(w, bucket, key, upload_id)
            w.delete_upload(upload_id)
        self.forget_parts(bucket, key, upload_id)

    def list_uploads(self, bucket: str, prefix: str) -> list[UploadInfo]:
        """Uploads in progress whose key starts with ``prefix``, by key then start time."""
        check_text(prefix, "prefix")
        with self._cat.snapshot() as c:
            require_bucket(c, bucket)
            rows = c.uploads(bucket)
        return [u for u in rows if u.key.startswith(prefix)]
