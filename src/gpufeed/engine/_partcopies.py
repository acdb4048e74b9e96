"""Part files of multipart uploads on the nodes of a cluster: the copies a
node takes of another node's parts, sends back, and deletes.

Any node of a cluster takes any part of any upload (the catalog's upload and
part rows are shared); the part file lands in the receiving node's
``uploads/<upload_id>/`` folder (made when the first part of the upload
arrives there), and the receiving node copies it, before the part's catalog
row commits, to ``factor - 1`` other live members through the
:class:`PartPeers` the node installs (:meth:`PartCopyCalls.use_part_peers`;
over the fast path's PART op, :mod:`gpufeed._partcopies`). A copy is stored
here by :meth:`PartCopyCalls.receive_part`: the bytes go to a temp file, their
MD5 must be the part's ETag, the file is fsynced and renamed into the
upload's folder under the same name, so a part file present in a folder is
always whole and checked. Completion on a node that lacks a part's file
fetches it from a node that has one (:meth:`PartCopyCalls.held_part` on the
sender). Abort, completion and a replaced part delete the files on every
node (:meth:`PartCopyCalls.drop_part_files`); a node that missed that (it was
down) deletes them at its next start (the start-up sweep keeps only the part
files a part row names) or by :meth:`PartCopyCalls.free_unnamed_parts`.
After a node is lost, the nodes find the parts they hold
(:meth:`PartCopyCalls.open_parts_here`) and which of them the others hold
(:meth:`PartCopyCalls.held_part_files`, PART ``has``) to copy them again
(:mod:`gpufeed._partrepair`).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from ..errors import BadDigest, InternalError, InvalidArgument, NoSuchKey, NoSuchUpload, StorageFull
from ._blobs import BlobFiles, remove_quietly
from ._multipart import get_upload
from ._replicas import COPY_MAX_BYTES, refuse_payload, write_pieces
from ._room import NodeRoom, folder_bytes, removing
from .catalog import Catalog, PartRecord
from .types import UploadInfo

if TYPE_CHECKING:
    from ._multipart import Multipart

__all__ = ["PartPeers", "PartCopyCalls", "check_part_file"]

_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
_PART_FILE_RE = re.compile(r"[0-9]{5}\.[0-9a-f]{32}")
_MD5_RE = re.compile(r"[0-9a-f]{32}")
_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC


class PartPeers(Protocol):
    """What the engine asks of the other nodes of its cluster about part files
    (:class:`gpufeed._partcopies.PartCopies` over the fast path)."""

    def push(self, bucket: str, key: str, upload_id: str, file: str, path: str, md5: str) -> list[str]:
        """Copy the part file at ``path`` (named ``file``, hex MD5 ``md5``) to
        ``factor - 1`` other live members; returns the node ids that took it.

        Raises:
            ServiceUnavailable: fewer members than that took it (naming each failure).
        """

    def fetch_parts(self, bucket: str, key: str, upload_id: str, wants: list[tuple[str, str, int, int]],
                    fd: int) -> None:
        """Write each part file of ``wants`` (``(file, hex MD5, size, offset)``) at
        its offset of ``fd``, as a live member that has it sends it with that MD5;
        a bounded number at once.

        Raises:
            HolderUnavailable: no live member sent one of them bytes that pass
                (naming each); the others were stopped (the caller discards ``fd``).
        """

    def drop(self, bucket: str, key: str, upload_id: str, files: list[str]) -> None:
        """Ask every other live member to delete the part files ``files`` of the
        upload (all of them, and its folder, when ``files`` is empty); a member that
        cannot be reached deletes them later (best effort, never raises)."""


def check_part_file(upload_id: str, file: str | None = None) -> None:
    """Refuse an upload id or part file name that is not one (a path, say).

    Raises:
        InvalidArgument: naming it.
    """
    if not isinstance(upload_id, str) or not _UPLOAD_ID_RE.fullmatch(upload_id):
        raise InvalidArgument(f"{upload_id!r} is not an upload id")
    if file is not None and (not isinstance(file, str) or not _PART_FILE_RE.fullmatch(file)):
        raise InvalidArgument(f"{file!r} is not a part file name")


class PartCopyCalls:
    """The engine's calls about part files on the nodes of a cluster, mixed into
    :class:`~gpufeed.engine.Engine` (the node's PART op and :mod:`gpufeed._partcopies` use them)."""

    _files: BlobFiles
    _cat: Catalog
    _multipart: "Multipart"

    def use_part_peers(self, peers: PartPeers | None) -> None:
        """Copy each part to other nodes before it is acknowledged, fetch parts this
        node lacks at completion, and delete the parts other nodes hold when an
        upload ends, through ``peers`` (``None``: this node's parts only)."""
        self._multipart.peers = peers

    def receive_part(self, bucket: str, key: str, upload_id: str, file: str, md5: str, length: int,
                     pieces: Iterable[memoryview]) -> bool:
        """Store a copy of part file ``file`` of an upload that another node pushed:
        its ``length`` bytes arrive as ``pieces`` (always read to the end, so the
        connection stays framed); their MD5 is checked against ``md5`` before the
        file is fsynced and renamed into the upload's folder.

        A cluster node admits it by its own figures first (:mod:`._room`, as a
        copy of a data file): one that does not fit is refused, its bytes read
        and dropped, and the pusher asks the next member.

        Returns:
            Whether the copy was stored (``False``: the file was here already).

        Raises:
            InvalidArgument: a malformed id, name or MD5, or ``length`` over
                this node's copy limit (``GPUFEED_CLUSTER_COPY_MAX_BYTES``).
            NoSuchUpload: no such upload (completed or aborted meanwhile).
            BadDigest: the bytes do not have MD5 ``md5`` (nothing is kept).
            StorageFull: it does not fit in this node's capacity, or the disk is full.
            InternalError: the file system failed otherwise.
        """
        problem: Exception | None = None
        limit = getattr(self, "_copy_max_bytes", COPY_MAX_BYTES)
        try:
            check_part_file(upload_id, file)
            if not isinstance(md5, str) or not _MD5_RE.fullmatch(md5):
                raise InvalidArgument(f"{md5!r} is not a hex MD5")
            if length > limit:
                raise InvalidArgument(f"a part of {length} bytes is over this node's limit of {limit} bytes "
                                      "(GPUFEED_CLUSTER_COPY_MAX_BYTES)")
            get_upload(self._cat, bucket, key, upload_id)
        except (InvalidArgument, NoSuchUpload) as exc:
            problem = exc
        path = self._files.part_path(upload_id, file) if problem is None else ""
        if problem is not None or os.path.exists(path):
            return refuse_payload(pieces, problem)
        room: NodeRoom | None = getattr(self, "_room", None)
        if room is not None:
            try:
                room.reserve(length)  # counted at once: copies received together cannot pass the capacity
            except StorageFull as exc:
                return refuse_payload(pieces, exc)
        try:
            self._store_part(upload_id, file, md5, pieces)
            if room is not None:
                room.add_file(path, length)
        finally:
            if room is not None:
                room.release(length)
        return True

    def _store_part(self, upload_id: str, file: str, md5: str, pieces: Iterable[memoryview]) -> None:
        """Write ``pieces`` to a temp file, check their MD5 is ``md5``, fsync and
        rename it into the upload's folder as ``file`` (see :meth:`receive_part`)."""
        fd, tmp = self._files.new_temp()
        try:
            digest = _write_hashed(fd, pieces, file)
            if digest != md5:
                raise BadDigest(f"the copy of part file {file} of upload {upload_id} has MD5 {digest}, not "
                                f"{md5}; nothing of it was kept")
            if self._files.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            remove_quietly(tmp)
            raise
        os.close(fd)
        self._files.ensure_upload_dir(upload_id)
        self._files.publish_part(tmp, upload_id, file)

    @contextmanager
    def held_part(self, bucket: str, key: str, upload_id: str, file: str) -> Iterator[tuple[int, int]]:
        """This node's part file ``file`` of an upload, open, as ``(fd, size)``
        (closed when the block ends). Unchecked: the asker checks its MD5.

        Raises:
            InvalidArgument: a malformed id or name.
            NoSuchKey: this node has no such part file.
        """
        check_part_file(upload_id, file)
        try:
            fd = os.open(self._files.part_path(upload_id, file), _OPEN_READ)
        except FileNotFoundError:
            raise NoSuchKey(f"part file {file} of upload {upload_id} is not on this node") from None
        try:
            yield fd, os.fstat(fd).st_size
        finally:
            os.close(fd)

    def held_part_files(self, upload_id: str, files: list[str]) -> list[str]:
        """The part files of ``files`` that are in this node's folder of the upload.

        Raises:
            InvalidArgument: a malformed id or name.
        """
        check_part_file(upload_id)
        for f in files:
            check_part_file(upload_id, f)
        return [f for f in files if os.path.isfile(self._files.part_path(upload_id, f))]

    def part_file_path(self, upload_id: str, file: str) -> str:
        """Where part file ``file`` of an upload is (or would be) in this node's folder.

        Raises:
            InvalidArgument: a malformed id or name.
        """
        check_part_file(upload_id, file)
        return self._files.part_path(upload_id, file)

    def record_part_copies(self, upload_id: str, file: str, nodes: list[str]) -> None:
        """Record, in a write transaction of its own, that the nodes ``nodes`` hold a
        copy of part file ``file`` of an upload (nothing once no part row of the open
        upload names it, or where the catalog keeps no copies)."""
        check_part_file(upload_id, file)
        with self._cat.write() as w:
            add = getattr(w, "add_part_copies", None)
            if add is not None:
                add(upload_id, file, nodes)

    def open_parts_here(self) -> list[tuple[UploadInfo, list[PartRecord]]]:
        """The open uploads that have part files in this node's folder, each with
        the parts whose file (the one its part row names) is here, by part number.
        One catalog query for the open uploads when this node has an upload
        folder, then one per such upload; none when it has none."""
        try:
            with os.scandir(self._files.uploads) as it:
                here = {e.name for e in it if e.is_dir(follow_symlinks=False) and _UPLOAD_ID_RE.fullmatch(e.name)}
        except FileNotFoundError:
            return []
        if not here:
            return []
        found = []
        for up in self._cat.idle_uploads(float("inf")):  # every open upload
            if up.upload_id not in here:
                continue
            recs = [r for r in self._cat.parts(up.upload_id)
                    if os.path.isfile(self._files.part_path(up.upload_id, r.file))]
            if recs:
                found.append((up, recs))
        return found

    def drop_part_files(self, bucket: str, key: str, upload_id: str, files: list[str]) -> int:
        """Delete this node's part files ``files`` of an upload that no part row
        names (a replaced part's, a refused part's), or, with ``files`` empty, the
        upload's whole folder once the upload has ended (completed or aborted).

        Returns:
            Files (or the folder) removed.

        Raises:
            InvalidArgument: a malformed id or name, or (``files`` empty) the upload is still open.
        """
        check_part_file(upload_id)
        for f in files:
            check_part_file(upload_id, f)
        room: NodeRoom | None = getattr(self, "_room", None)
        if not files:
            if self._cat.upload(bucket, key, upload_id) is not None:
                raise InvalidArgument(f"upload {upload_id} is still open: its part files stay")
            there = os.path.isdir(self._files.upload_dir(upload_id))
            with removing(room) as gone:
                gone(folder_bytes(self._files.upload_dir(upload_id)))
                self._files.remove_upload_dir(upload_id)
            return int(there)
        named = {rec.file for rec in self._cat.parts(upload_id)}
        removed = 0
        with removing(room) as gone:
            for f in files:
                if f in named:
                    continue
                path = self._files.part_path(upload_id, f)
                try:
                    size = os.stat(path).st_size
                    os.unlink(path)
                    removed += 1
                    gone(size)
                except FileNotFoundError:
                    pass
        return removed

    def free_unnamed_parts(self, older_than_s: float) -> int:
        """Delete the part files in this node's ``uploads/`` that no part row names
        and that were last written more than ``older_than_s`` seconds ago (those of
        ended uploads, replaced parts and refused copies that this node was not
        told of), and the upload folders left empty that long. A part file lands in
        its folder before its row commits, so ``older_than_s`` must be longer than
        any part's upload takes. Returns the files and folders deleted."""
        now = time.time()
        freed = 0
        with os.scandir(self._files.uploads) as it:
            dirs = [e for e in it if e.is_dir(follow_symlinks=False)]
        with removing(getattr(self, "_room", None)) as gone:
            for d in dirs:
                named = {rec.file for rec in self._cat.parts(d.name)} if _UPLOAD_ID_RE.fullmatch(d.name) else set()
                try:
                    old_dir = now - os.stat(d.path).st_mtime >= older_than_s  # before the unlinks touch it
                    with os.scandir(d.path) as it:
                        files = [e for e in it if e.name not in named]
                    for e in files:
                        st = e.stat(follow_symlinks=False)
                        if now - st.st_mtime >= older_than_s:
                            remove_quietly(e.path)
                            freed += 1
                            gone(st.st_size)
                    if old_dir:
                        os.rmdir(d.path)  # only when empty
                        freed += 1
                except OSError:
                    continue
        return freed


def _write_hashed(fd: int, pieces: Iterable[memoryview], file: str) -> str:
    """Write ``pieces`` one after another from offset 0 of ``fd`` and return their
    hex MD5; every piece is read even after a failed write.

    Raises:
        StorageFull, InternalError: a write failed.
    """
    h = hashlib.md5()
    failure = write_pieces(fd, pieces, h)
    if failure is not None:
        if failure.errno == 28:  # ENOSPC
            raise StorageFull(f"the disk of the data folder is full: {failure}")
        raise InternalError(f"storing a copy of part file {file} failed: {failure}")
    return h.hexdigest()
