"""The file object of the ``gpufeed://`` fsspec filesystem (``fs.py``), and the one
place where gpufeed's errors become the ``OSError`` family fsspec users catch."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fsspec.spec import AbstractBufferedFile

from ..errors import (
    AccessError,
    BucketAlreadyExists,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    DamagedObject,
    InternalError,
    NotFoundError,
    TransportError,
)

if TYPE_CHECKING:
    from .fs import GpufeedFileSystem

__all__ = ["GpufeedFile", "oserrors", "fs_error"]


@contextmanager
def oserrors(path: str) -> Iterator[None]:
    """Translate gpufeed's errors into the ``OSError`` family, naming ``path``."""
    try:
        yield
    except NotFoundError as exc:
        raise FileNotFoundError(errno.ENOENT, f"{exc}", path) from exc
    except AccessError as exc:
        raise PermissionError(errno.EACCES, f"{exc}", path) from exc
    except (BucketAlreadyOwnedByYou, BucketAlreadyExists) as exc:
        raise FileExistsError(errno.EEXIST, f"{exc}", path) from exc
    except BucketNotEmpty as exc:
        raise OSError(errno.ENOTEMPTY, f"{exc}", path) from exc
    except (DamagedObject, InternalError) as exc:  # stored data failed its check, or the node failed
        raise OSError(errno.EIO, f"{exc}", path) from exc
    except TransportError as exc:  # the node cannot be reached: still a ConnectionError, now naming the path
        raise TransportError(f"{path}: {exc}") from exc


def fs_error(exc: BaseException, path: str) -> BaseException:
    """The exception :func:`oserrors` would raise for ``exc`` (for per-item results)."""
    try:
        with oserrors(path):
            raise exc
    except BaseException as out:  # noqa: B036 - returned, never swallowed
        return out


class GpufeedFile(AbstractBufferedFile):
    """A file of :class:`GpufeedFileSystem` (made by ``fs.open``).

    Reading: fsspec's block caches (``cache_type``, default ``"readahead"``)
    serve small reads; a read of at least ``block_size`` bytes skips the cache
    and lands in the caller's buffer (``readinto``) or a new one (``read``).
    Writing (``"wb"``, ``"ab"``, ``"xb"``): the bytes are buffered and written
    with one atomic put at :meth:`close`; a ``with`` block that raises writes
    nothing.
    """

    def __init__(self, fs: GpufeedFileSystem, path: str, mode: str = "rb", **kwargs) -> None:
        existing = b""
        if mode == "ab":
            try:
                existing = fs.cat_file(path)
            except FileNotFoundError:
                pass
        super().__init__(fs, path, mode, **kwargs)
        self.bucket, self.key = fs.split_path(path)
        if existing:
            self.buffer.write(existing)
            self.loc = len(existing)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs._read_range(self.path, start, min(end, self.size) - start)

    def readinto(self, b) -> int:
        """Read into ``b``; one of at least ``block_size`` bytes lands there
        straight from the node, without the cache."""
        out = memoryview(b).cast("B")
        n = min(len(out), max(0, self.size - self.loc)) if self.mode == "rb" else 0
        if n < self.blocksize or self.closed:
            return super().readinto(b)
        with oserrors(self.path):
            got = self.fs.client.get_into(self.bucket, self.key, out[:n], offset=self.loc)
        self.loc += got
        return got

    def read(self, length: int = -1) -> bytes:
        """Read ``length`` bytes (all that is left when negative)."""
        if self.mode == "rb" and not self.closed:
            n = max(0, self.size - self.loc) if length is None or length < 0 else length
            n = min(n, max(0, self.size - self.loc))
            if n >= self.blocksize:
                buf = self.fs._scratch(n)
                got = self.readinto(buf)
                return bytes(buf[:got])
        return super().read(length)

    def __exit__(self, exc_type, exc, tb) -> None:
        """Close; a file being written whose ``with`` body raised is discarded
        (nothing is written) rather than put half-written."""
        if exc_type is not None and self.mode != "rb":
            self.forced = True  # close() then skips the final flush, the one put
        self.close()

    def _initiate_upload(self) -> None:
        """Nothing to start: the object is written whole at close."""

    def _upload_chunk(self, final: bool = False) -> bool:
        if not final:
            return False  # keep buffering: one atomic put at close
        with self.buffer.getbuffer() as data, oserrors(self.path):
            self.fs.client.put(self.bucket, self.key, data)
        return True
