"""Keeping the data folder private to the node's user.

Object keys, metadata and data are visible to anyone who can read the data
folder, so every folder the engine makes is mode ``0700`` and every file
``0600`` (the catalog database, and with it SQLite's ``-wal`` and ``-shm``
files, which SQLite creates with the database file's mode; blobs, parts and
temp files; the lock file). Modes are given at creation, never by changing the
process umask (the engine is also a library inside other programs).

What already exists is never changed: an administrator may have opened a
folder on purpose (a backup group, say). :func:`open_paths` finds folders and
files more open than that, and the engine warns at start
(:attr:`gpufeed.engine.Engine.permission_warnings`). Sockets are skipped: the
fast path's socket is replaced at every start and guarded by its folder.

Source: open(2) and mkdir(2) (the mode argument is masked by the umask, which
only ever removes bits); "Files in the WAL mode", https://www.sqlite.org/tempfiles.html
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "make_private_dirs", "create_private_file", "open_paths", "describe",
           "check_private"]

log = logging.getLogger("gpufeed.engine")

#: Mode of every folder the engine creates: owner only.
DIR_MODE = 0o700
#: Mode of every file the engine creates: owner read and write.
FILE_MODE = 0o600
#: Permission bits that make something readable, writable or searchable by others.
_OPEN_BITS = stat.S_IRWXG | stat.S_IRWXO


def make_private_dirs(path: str | os.PathLike) -> None:
    """Create ``path`` and every missing folder above it with mode ``0700``.

    Folders that exist keep their mode. Unlike ``os.makedirs(path, mode)``,
    the intermediate folders get the private mode too.

    Raises:
        OSError: a folder cannot be created (``FileExistsError`` when a
            non-folder is in the way).
    """
    missing: list[str] = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def create_private_file(path: str | os.PathLike) -> None:
    """Create ``path`` empty with mode ``0600`` if it does not exist (an existing
    file is left as it is)."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))


def open_paths(root: str | os.PathLike, *, limit: int = 10) -> tuple[list[tuple[str, int]], int]:
    """Folders and files under ``root`` (and ``root`` itself) that other users
    may read, write or enter: any group or other permission bit set.

    Symbolic links are not followed; sockets are skipped.

    Args:
        root: the data folder.
        limit: how many offending paths to return (all are counted).

    Returns:
        ``([(path, mode), ...], count)``: at most ``limit`` paths with their
        permission bits, and how many there are in all.
    """
    found: list[tuple[str, int]] = []
    count = 0
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return found, count
    if st.st_mode & _OPEN_BITS:
        count += 1
        found.append((str(root), stat.S_IMODE(st.st_mode)))
    stack = [str(root)]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with it:
            for e in it:
                try:
                    est = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed meanwhile
                if stat.S_ISSOCK(est.st_mode) or stat.S_ISLNK(est.st_mode):
                    continue
                if est.st_mode & _OPEN_BITS:
                    count += 1
                    if len(found) < limit:
                        found.append((e.path, stat.S_IMODE(est.st_mode)))
                if stat.S_ISDIR(est.st_mode):
                    stack.append(e.path)
    return found, count


def describe(root: str | os.PathLike, found: list[tuple[str, int]], count: int) -> str:
    """One warning line for what :func:`open_paths` found (``""`` when nothing)."""
    if not count:
        return ""
    shown = ", ".join(f"{Path(p).relative_to(root) if p != str(root) else p} ({m:04o})" for p, m in found)
    more = f" and {count - len(found)} more" if count > len(found) else ""
    return (f"data folder {root} is open to other local users (folders should be 0700, files 0600): "
            f"{shown}{more}; run `chmod -R go-rwx {root}` to make it private")


def check_private(root: str | os.PathLike) -> list[str]:
    """Look for anything under ``root`` more open than ``0700``/``0600``; log a
    warning (logger ``gpufeed.engine``) when there is.

    Returns:
        The warning as a one-item list, or ``[]`` when ``root`` is private.
    """
    found, count = open_paths(root)
    message = describe(root, found, count)
    if not message:
        return []
    log.warning("%s", message)
    return [message]
