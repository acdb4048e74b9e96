"""Data files of the engine: temp files, immutable blobs, multipart part files.

Everything here is about file names and durability (rename, fsync of the file
and of its directory); nothing here knows about buckets or keys, which never
become file names. The catalog (:mod:`.catalog`) decides which files are
live; :meth:`BlobFiles.sweep` deletes the rest on start.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ._openfiles import OpenFiles
from ._private import DIR_MODE, FILE_MODE, make_private_dirs

__all__ = [
    "BlobFiles", "new_id", "remove_quietly", "fsync_dir", "copy_range", "pread_full", "write_all", "write_all_v",
    "start_writeback",
]

_OPEN_TMP = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: Errors after which ``os.copy_file_range`` cannot work for this pair of files.
_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM}
_COPY_CHUNK = 8 << 20  # 8 MiB: read/write fallback chunk
_MAX_COPY = 1 << 30  # 1 GiB: largest single copy_file_range request
#: Most buffers passed to one ``os.pwritev`` (Linux's ``IOV_MAX`` is 1024).
_MAX_IOV = 1024
#: ``SYNC_FILE_RANGE_WRITE`` (linux/fs.h): start writeback of dirty pages, do not wait.
_SYNC_FILE_RANGE_WRITE = 2


def new_id() -> str:
    """A fresh random identifier: 32 lower-case hex digits (128 random bits)."""
    return os.urandom(16).hex()


def remove_quietly(path: str) -> None:
    """Unlink ``path``; a missing file is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_dir(path: str) -> None:
    """fsync a directory so that renames and creations in it are durable."""
    fd = os.open(path, _OPEN_DIR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_range(src_fd: int, src_off: int, dst_fd: int, dst_off: int, length: int) -> int:
    """Copy ``length`` bytes between two files by kernel copy, else pread/pwrite.

    Args:
        src_fd: source descriptor (readable).
        src_off: source offset, bytes.
        dst_fd: destination descriptor (writable).
        dst_off: destination offset, bytes.
        length: bytes to copy.

    Returns:
        Bytes copied; fewer than ``length`` only when the source ended first.
    """
    done = 0
    kernel = True
    while done < length:
        want = min(length - done, _MAX_COPY)
        n = 0
        if kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, want, src_off + done, dst_off + done)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
            if n == 0:  # end of source, or a file system that copies nothing: confirm by hand
                kernel = False
                continue
        else:
            chunk = os.pread(src_fd, min(want, _COPY_CHUNK), src_off + done)
            if not chunk:
                break
            n = write_all(dst_fd, memoryview(chunk), dst_off + done)
        done += n
    return done


def pread_full(fd: int, mv: memoryview, offset: int) -> int:
    """``os.preadv`` into all of ``mv`` from ``offset``, looping over short reads.

    Returns:
        Bytes read: ``len(mv)``, fewer only when the file ended first.
    """
    total, n = 0, len(mv)
    while total < n:
        got = os.preadv(fd, [mv[total:]], offset + total)
        if got == 0:
            break
        total += got
    return total


def write_all(fd: int, mv: memoryview, offset: int) -> int:
    """``os.pwrite`` all of ``mv`` at ``offset``, looping over short writes.

    Returns:
        ``mv.nbytes``.
    """
    total = mv.nbytes
    done = 0
    while done < total:
        done += os.pwrite(fd, mv[done:] if done else mv, offset + done)
    return total


def write_all_v(fd: int, views: list[memoryview], offset: int) -> int:
    """``os.pwritev`` all of ``views`` (byte views) at ``offset``, looping over short writes.

    Returns:
        The views' total length, bytes.
    """
    total = sum(v.nbytes for v in views)
    done = 0
    i = 0  # first view not completely written
    skip = 0  # bytes of views[i] already written
    while done < total:
        group = views[i:i + _MAX_IOV]
        if skip:
            group[0] = group[0][skip:]
        n = os.pwritev(fd, group, offset + done)
        done += n
        n += skip
        while i < len(views) and n >= views[i].nbytes:
            n -= views[i].nbytes
            i += 1
        skip = n
    return total


def _libc_sync_file_range():
    """libc's ``sync_file_range`` through ctypes (it releases the GIL), or None off Linux."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _libc_sync_file_range()


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``[offset, offset + nbytes)`` of ``fd`` to disk,
    without waiting (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux).

    A file written this way while it grows has little left to write when it is
    fsynced, so the final ``fsync`` of a large upload takes milliseconds instead of
    the whole file's writeback. Advisory: it guarantees nothing (``fsync`` still
    does) and does nothing where the call is missing or refused.
    """
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


class BlobFiles:
    """The data folders under ``root``: ``blobs/``, ``uploads/``, ``tmp/``.

    Every folder and file made here is private to the user (``0700``/``0600``,
    see :mod:`._private`); renames keep a file's mode.

    Args:
        root: the engine's data folder.
        fsync: fsync files and directories before they count as written.
    """

    def __init__(self, root: Path, *, fsync: bool, open_files: int = 512) -> None:
        self.fsync = fsync
        #: Open descriptors of blobs, shared by every reader (see :mod:`._openfiles`).
        self.open_files = OpenFiles(open_files)
        self.blobs = str(root / "blobs")
        self.uploads = str(root / "uploads")
        self.tmp = str(root / "tmp")
        for d in (self.blobs, self.uploads, self.tmp):
            make_private_dirs(d)
        if fsync:
            fsync_dir(str(root))
        self._known_dirs: set[str] = set()
        #: Frees the data of versions whose rows are gone (set by the engine to
        #: :meth:`~gpufeed.engine._chunks.ChunkStore.release`).
        self.release: Callable[[list[str]], None] = lambda ids: None

    # names --------------------------------------------------------------
    def blob_path(self, blob_id: str) -> str:
        """Absolute path of blob ``blob_id``: ``blobs/ab/cd/<blob_id>``."""
        return f"{self.blobs}/{blob_id[:2]}/{blob_id[2:4]}/{blob_id}"

    def upload_dir(self, upload_id: str) -> str:
        """Folder holding the part files of one multipart upload."""
        return f"{self.uploads}/{upload_id}"

    def part_path(self, upload_id: str, file: str) -> str:
        """Absolute path of a part file (``file`` is ``<part_number:05d>.<id>``)."""
        return f"{self.uploads}/{upload_id}/{file}"

    def remove_blobs(self, blob_ids: list[str]) -> None:
        """Free the data of object versions whose catalog rows are gone: hands
        them to :attr:`release` (the engine's chunk store, which drops their
        manifests and unlinks data files no chunk uses any more)."""
        if blob_ids:
            self.release(list(blob_ids))

    # writing ------------------------------------------------------------
    def new_temp(self) -> tuple[int, str]:
        """Create an empty temp file. Returns ``(fd, path)``; fd is read-write."""
        path = f"{self.tmp}/{new_id()}"
        return os.open(path, _OPEN_TMP, FILE_MODE), path

    def _ensure_dir(self, path: str) -> None:
        if path in self._known_dirs:
            return
        if not os.path.isdir(path):
            make_private_dirs(path)
            if self.fsync:  # make the new directory entries themselves durable
                parent = os.path.dirname(path)
                fsync_dir(parent)
                fsync_dir(os.path.dirname(parent))
        self._known_dirs.add(path)

    def publish_blob(self, tmp_path: str, blob_id: str) -> str:
        """Rename a finished (already fsynced) temp file to blob ``blob_id``.

        Returns:
            The blob's path.
        """
        path = self.blob_path(blob_id)
        d = os.path.dirname(path)
        self._ensure_dir(d)
        os.rename(tmp_path, path)
        if self.fsync:
            fsync_dir(d)
        return path

    def list_data_files(self) -> list[str]:
        """Ids of every data file under ``blobs/``."""
        out: list[str] = []
        for d1 in _subdirs(self.blobs):
            for d2 in _subdirs(d1):
                with os.scandir(d2) as it:
                    out += [e.name for e in it if e.is_file(follow_symlinks=False)]
        return out

    def new_upload_dir(self, upload_id: str) -> None:
        """Create (durably) the folder of a new multipart upload."""
        os.mkdir(self.upload_dir(upload_id), DIR_MODE)
        if self.fsync:
            fsync_dir(self.uploads)

    def ensure_upload_dir(self, upload_id: str) -> None:
        """Create (durably) the folder of an upload unless it is there (a node of a
        cluster keeps the part files it receives of an upload another node started)."""
        try:
            os.mkdir(self.upload_dir(upload_id), DIR_MODE)
        except FileExistsError:
            return
        if self.fsync:
            fsync_dir(self.uploads)

    def publish_part(self, tmp_path: str, upload_id: str, file: str) -> str:
        """Rename a finished temp file into an upload's folder.

        Raises:
            FileNotFoundError: the upload's folder is gone (upload aborted).
        """
        path = self.part_path(upload_id, file)
        os.rename(tmp_path, path)
        if self.fsync:
            fsync_dir(self.upload_dir(upload_id))
        return path

    def remove_upload_dir(self, upload_id: str) -> None:
        """Delete an upload's folder and its part files."""
        shutil.rmtree(self.upload_dir(upload_id), ignore_errors=True)

    # recovery -----------------------------------------------------------
    def sweep(self, live_blobs: set[str], live_parts: dict[str, set[str]], *,
              lost_found: str | None = None, present: set[str] | None = None) -> dict[str, int]:
        """Delete every file the catalog does not reference (run on start only).

        Args:
            live_blobs: blob ids referenced by an object row.
            live_parts: upload id -> part file names referenced by part rows,
                for every upload in the catalog.
            lost_found: when given, unreferenced blobs, upload folders and part
                files are moved under this folder (``blobs/<blob_id>``,
                ``uploads/<upload_id>/...``) instead of deleted (a recovered
                catalog may have lost the rows that named them); ``tmp/`` is
                emptied either way.
            present: when given, filled with the live blobs found on disk (so
                the caller learns which are missing without a second walk).

        Returns:
            Counts of what was removed (or moved): ``{"tmp": n, "blobs": n, "uploads": n, "parts": n}``.
        """
        removed = {"tmp": 0, "blobs": 0, "uploads": 0, "parts": 0}
        with os.scandir(self.tmp) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    remove_quietly(e.path)
                removed["tmp"] += 1
        for d1 in _subdirs(self.blobs):
            for d2 in _subdirs(d1):
                with os.scandir(d2) as it:
                    for e in it:
                        if e.name not in live_blobs:
                            _discard(e.path, lost_found, "blobs", e.name)
                            removed["blobs"] += 1
                        elif present is not None:
                            present.add(e.name)
        with os.scandir(self.uploads) as it:
            for e in it:
                parts = live_parts.get(e.name)
                if parts is None or not e.is_dir(follow_symlinks=False):
                    if lost_found is not None:
                        _discard(e.path, lost_found, "uploads", e.name)
                    elif e.is_dir(follow_symlinks=False):
                        shutil.rmtree(e.path, ignore_errors=True)
                    else:
                        remove_quietly(e.path)
                    removed["uploads"] += 1
                    continue
                with os.scandir(e.path) as pit:
                    for p in pit:
                        if p.name not in parts:
                            _discard(p.path, lost_found, f"uploads/{e.name}", p.name)
                            removed["parts"] += 1
        if self.fsync and any(removed.values()):
            for d in (self.tmp, self.uploads):
                fsync_dir(d)
        return removed


def _discard(path: str, lost_found: str | None, folder: str, name: str) -> None:
    """Unlink ``path``, or move it to ``lost_found/folder/name`` when ``lost_found`` is given."""
    if lost_found is None:
        remove_quietly(path)
        return
    dest = os.path.join(lost_found, folder)
    make_private_dirs(dest)
    os.rename(path, os.path.join(dest, name))


def _subdirs(path: str) -> list[str]:
    with os.scandir(path) as it:
        return [e.path for e in it if e.is_dir(follow_symlinks=False)]
