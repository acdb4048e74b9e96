"""An fsspec filesystem for ``gpufeed://BUCKET/KEY`` URLs over the fast path.

pandas, pyarrow, Hugging Face ``datasets``, zarr and anything else that takes an
fsspec URL read and write a gpufeed node through this class, with no S3 client
in between. fsspec finds it through the ``fsspec.specs`` entry point that
gpufeed's ``pyproject.toml`` declares, so after ``pip install gpufeed``::

    fs = fsspec.filesystem("gpufeed", endpoint="gpufeed+shm:///data/gpufeed.sock")
    df = pandas.read_parquet("gpufeed://bucket/table.parquet",
                             storage_options={"endpoint": "gpufeed+tcp://10.0.0.5:9400"})

work without importing gpufeed first.

URL form: ``gpufeed://BUCKET/KEY``. The node is not part of the URL (a Unix
socket path does not fit in one): it is the ``endpoint`` storage option, else
the ``GPUFEED_URL`` environment variable (the one the CLI reads), as
``gpufeed+tcp://HOST:PORT`` or ``gpufeed+shm:///path/gpufeed.sock``. The key
is ``access_key`` / ``secret_key``, else the environment as
:class:`~gpufeed.client.Client` reads it (``GPUFEED_ACCESS_KEY`` /
``GPUFEED_SECRET_KEY``, then ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``).

Layout, as s3fs: the top level lists buckets (``mkdir``/``rmdir`` of a bare
bucket name create and delete buckets); below, directories are the ``/`` in
keys and exist while a key is under them. Reads land with few copies: ranges
are read with ``get_into`` into memory allocated once (the client's registered
memory on shm), ``readinto`` and ``get_file`` land bytes straight in the
caller's buffer or the local file's pages, and ``cat_ranges`` reads many small
ranges in one round trip (``get_many_into``). A file opened for writing is
buffered and written with one atomic ``put`` when it closes (the fast path has
no multipart upload): either the whole file is visible or nothing.

Errors come out as the ``OSError`` family: missing buckets and keys as
``FileNotFoundError``, refusals as ``PermissionError``, an existing bucket as
``FileExistsError``, a non-empty bucket as ``OSError(ENOTEMPTY)``, a lost node
as ``ConnectionError``.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from datetime import UTC, datetime
from typing import Any

try:
    from fsspec.callbacks import DEFAULT_CALLBACK
    from fsspec.registry import register_implementation
    from fsspec.spec import AbstractFileSystem
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is missing
    raise ModuleNotFoundError(f"gpufeed:// URLs need fsspec ({exc}): pip install 'gpufeed[fsspec]'",
                              name=exc.name) from exc

from ..errors import InvalidArgument, InvalidRange, NotFoundError
from ._client import Client, ListEntry, ObjectMeta, ReadRequest, parse_url
from ._fsfile import GpufeedFile, fs_error, oserrors

__all__ = ["GpufeedFileSystem", "GpufeedFile", "gopen"]

#: The environment variable naming the node when no ``endpoint`` is given.
URL_ENV = "GPUFEED_URL"
#: Reads at least this large go into the client's pooled memory (``Client.alloc``).
_POOLED_MIN_BYTES = 256 << 10  # 256 KiB
#: Items and bytes per batch read of :meth:`GpufeedFileSystem.cat_ranges`.
_BATCH_ITEMS = 512
_BATCH_BYTES = 64 << 20  # 64 MiB


def _file_info(bucket: str, key: str, size: int, etag: str, last_modified: float,
               **more) -> dict:
    """fsspec's info dict of an object (``mtime`` as pyarrow reads it)."""
    return {"name": f"{bucket}/{key}", "size": size, "type": "file", "etag": etag,
            "mtime": datetime.fromtimestamp(last_modified, tz=UTC), **more}


def _dir_info(name: str) -> dict:
    return {"name": name, "size": 0, "type": "directory"}


def _meta_info(meta: ObjectMeta) -> dict:
    return _file_info(meta.bucket, meta.key, meta.size, meta.etag, meta.last_modified,
                      content_type=meta.content_type, version_id=meta.version_id)


class GpufeedFileSystem(AbstractFileSystem):
    """fsspec filesystem over one gpufeed node's fast path (see the module docstring).

    Instances are cached by fsspec per set of arguments and are picklable (a
    DataLoader worker or a dask task rebuilds its own from the arguments); the
    connection opens on first use and is remade in a forked child and after
    the node went away.

    Args:
        endpoint: the node, ``gpufeed+tcp://HOST:PORT`` or
            ``gpufeed+shm:///path/gpufeed.sock``; default ``$GPUFEED_URL``.
        access_key, secret_key: the key (both or neither; neither: the
            environment, as :class:`~gpufeed.client.Client`).
        connections: pooled connections (the client's default when ``None``).
        request_timeout_s: a request making no progress for this long fails
            with ``ConnectionError`` (seconds).
        **kwargs: fsspec's own options (``use_listings_cache``,
            ``listings_expiry_time``, ``skip_instance_cache``, ...).

    Raises:
        ValueError: no node named (neither ``endpoint`` nor ``$GPUFEED_URL``), or a
            malformed one.
    """

    protocol = "gpufeed"
    root_marker = ""

    def __init__(self, endpoint: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, *, connections: int | None = None,
                 request_timeout_s: float | None = 60.0, **kwargs) -> None:
        super().__init__(**kwargs)
        endpoint = endpoint or os.environ.get(URL_ENV)
        if not endpoint:
            raise ValueError(f"gpufeed:// needs the node: pass endpoint= (storage_options={{'endpoint': ...}}) "
                             f"or set {URL_ENV} (gpufeed+tcp://HOST:PORT or gpufeed+shm:///path/gpufeed.sock)")
        parse_url(endpoint)  # InvalidArgument (a ValueError) for a malformed one
        self.endpoint = endpoint
        self._client_args: dict[str, Any] = {"access_key": access_key, "secret_key": secret_key,
                                             "connections": connections, "request_timeout_s": request_timeout_s}
        self._conn: Client | None = None
        self._conn_pid = os.getpid()
        self._lock = threading.Lock()

    # --- the connection ----------------------------------------------------------------
    @property
    def client(self) -> Client:
        """The :class:`~gpufeed.client.Client` this filesystem reads through
        (opened on first use; remade in a forked child or after a lost connection).

        Raises:
            ConnectionError: the node cannot be reached.
            PermissionError: the node refused the key.
        """
        pid = os.getpid()
        if pid != self._conn_pid:  # a forked child: the parent's client and lock are not ours
            self._lock, self._conn, self._conn_pid = threading.Lock(), None, pid
        conn = self._conn
        if conn is not None and not conn.closed and not conn.lost_connection:
            return conn
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed or conn.lost_connection:
                if conn is not None:
                    conn.close()
                with oserrors(self.endpoint):
                    conn = self._conn = Client(self.endpoint, **self._client_args)
            return conn

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        with self._lock:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None

    # --- paths -------------------------------------------------------------------------
    def split_path(self, path: str) -> tuple[str, str]:
        """``"gpufeed://bucket/a/b"`` or ``"bucket/a/b"`` -> ``("bucket", "a/b")``."""
        bucket, _, key = self._strip_protocol(path).partition("/")
        return bucket, key

    # --- listing and metadata ----------------------------------------------------------
    def ls(self, path: str, detail: bool = True, refresh: bool = False, **kwargs) -> list:
        """List a directory: buckets at the top, keys and subdirectories below.

        A path naming an object lists that object alone.

        Raises:
            FileNotFoundError: no such bucket, or nothing at or under ``path``.
        """
        path = self._strip_protocol(path)
        entries = None if refresh else self.dircache.get(path)
        if entries is None:
            bucket, key = self.split_path(path)
            with oserrors(path):
                if not bucket:
                    entries = [_dir_info(b) for b in self.client.list_buckets()]
                else:
                    entries = self._list_dir(bucket, key)
                    if not entries and key:
                        info = self.info(path)  # a file, or FileNotFoundError
                        return [info] if detail else [info["name"]]
            self.dircache[path] = entries
        return entries if detail else [e["name"] for e in entries]

    def _list_dir(self, bucket: str, key: str) -> list[dict]:
        prefix = f"{key}/" if key else ""
        out = []
        for e in self.client.list(bucket, prefix, "/"):
            if e.is_prefix:
                out.append(_dir_info(f"{bucket}/{e.key.rstrip('/')}"))
            elif e.key != prefix:  # "dir/" itself: a directory marker some S3 tools write
                out.append(_entry_info(bucket, e))
        return out

    def info(self, path: str, **kwargs) -> dict:
        """``{"name", "size", "type"}`` (``"file"`` or ``"directory"``), and for
        objects ``etag``, ``mtime`` (UTC ``datetime``), ``content_type``, ``version_id``.

        Raises:
            FileNotFoundError: nothing at or under ``path``.
            PermissionError: the node refused.
        """
        path = self._strip_protocol(path)
        bucket, key = self.split_path(path)
        if not bucket:
            return _dir_info("")
        if key:
            if path in self.dircache:
                return _dir_info(path)
            cached = self._ls_from_cache(path)  # FileNotFoundError: the cached parent lacks it
            if cached:
                return cached[0]
        with oserrors(path):
            if not key:  # NoSuchBucket / AccessDenied from the listing
                next(iter(self.client.list(bucket, page_size=1)), None)
                return _dir_info(bucket)
            try:
                return _meta_info(self.client.head(bucket, key))
            except NotFoundError:
                if next(iter(self.client.list(bucket, f"{key}/", page_size=1)), None) is None:
                    raise
            return _dir_info(path)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False,
             detail: bool = False, **kwargs):
        """Every object under ``path`` (and its directories with ``withdirs``),
        from one flat listing of the bucket's prefix rather than a walk; none
        for a missing bucket or path, as fsspec's ``find``."""
        path = self._strip_protocol(path)
        bucket, key = self.split_path(path)
        if maxdepth is not None or not bucket:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        prefix = f"{key}/" if key else ""
        out: dict[str, dict] = {}
        try:
            with oserrors(path):
                entries = list(self.client.list(bucket, prefix))
        except FileNotFoundError:
            return {} if detail else []
        for e in entries:
            if withdirs:
                parts = e.key[len(prefix):].split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    name = "/".join([path, *parts[:i]])
                    out.setdefault(name, _dir_info(name))
            if not e.key.endswith("/"):
                info = _entry_info(bucket, e)
                out[info["name"]] = info
        if out or not key:
            if withdirs:
                out[path] = _dir_info(path)
        else:
            try:
                info = self.info(path)
            except FileNotFoundError:
                info = {}
            if info.get("type") == "file":
                out[path] = info
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    def ukey(self, path: str) -> str:
        """The object's ETag (changes whenever its bytes do)."""
        return self.info(path)["etag"]

    def modified(self, path: str) -> datetime:
        """When the object was last written (UTC)."""
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, "directories have no modification time", path)
        return info["mtime"]

    # --- reads -------------------------------------------------------------------------
    def _scratch(self, nbytes: int) -> memoryview:
        """Memory for an ``nbytes`` read. From 256 KiB it is the client's pooled
        memory (:meth:`Client.alloc`): already faulted in when reused (fresh
        pages cost about as much as the read on small VMs), and on shm the node
        writes into it directly (one copy, file to buffer). Smaller: a ``bytearray``."""
        if nbytes >= _POOLED_MIN_BYTES:
            try:
                return self.client.alloc(nbytes)
            except InvalidArgument:  # the node's (or kernel's) shared memory is spent: read staged
                pass
        return memoryview(bytearray(nbytes))

    def _size(self, path: str) -> int:
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, "a directory has no bytes", path)
        return info["size"]

    def _span(self, path: str, start: int | None, end: int | None,
              size: int | None = None) -> tuple[int, int]:
        """``(offset, length)`` of the slice ``[start:end]`` of an object; looks
        its size up (unless given) only for a negative or missing bound."""
        start = start or 0
        if start >= 0 and end is not None and end >= 0:
            return start, max(0, end - start)
        size = self._size(path) if size is None else size
        start = max(0, size + start) if start < 0 else min(start, size)
        end = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
        return start, max(0, end - start)

    def _read_range(self, path: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` (fewer at the end; ``b""`` past it)."""
        if length <= 0:
            return b""
        bucket, key = self.split_path(path)
        buf = self._scratch(length)
        with oserrors(path):
            try:
                got = self.client.get_into(bucket, key, buf, offset=offset, length=length)
            except InvalidRange:  # offset at or past the end: an empty slice, as Python's
                return b""
        return bytes(buf[:got])

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs) -> bytes:
        """The object's bytes ``[start:end]`` (Python slice rules, negative from the end).

        Raises:
            FileNotFoundError: no such object.
            IsADirectoryError: ``path`` is a directory.
        """
        path = self._strip_protocol(path)
        offset, length = self._span(path, start, end)
        return self._read_range(path, offset, length)

    def cat_ranges(self, paths: list, starts, ends, max_gap=None, on_error: str = "return",
                   **kwargs) -> list:
        """Byte ranges of many objects, read in batches of one round trip each
        (``get_many_into``: 512 ranges or 64 MiB a batch).

        Args:
            paths: the objects (one per range; repeats are fine).
            starts, ends: an int for all, or one bound per range (slice rules).
            max_gap: unused (the batch costs one round trip whatever the gaps).
            on_error: ``"return"``: a failed range's entry is its exception;
                else the first failure raises.

        Returns:
            ``bytes`` per range, or exceptions (``on_error="return"``).
        """
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        starts = starts if isinstance(starts, list) else [starts] * len(paths)
        ends = ends if isinstance(ends, list) else [ends] * len(paths)
        if len(starts) != len(paths) or len(ends) != len(paths):
            raise ValueError("paths, starts and ends differ in length")
        out: list = [b""] * len(paths)
        todo: list[tuple[int, str, int, int]] = []
        paths = [self._strip_protocol(p) for p in paths]
        sizes = self._sizes([p for p, s, e in zip(paths, starts, ends)
                             if e is None or e < 0 or (s is not None and s < 0)])
        for i, (path, start, end) in enumerate(zip(paths, starts, ends)):
            try:
                size = sizes.get(path)
                if isinstance(size, BaseException):
                    raise size
                offset, length = self._span(path, start, end, size)
            except Exception as exc:
                if on_error != "return":
                    raise
                out[i] = exc
                continue
            if length > 0:
                todo.append((i, path, offset, length))
        batches = []
        while todo:  # every batch in flight at once; each lands in one buffer
            batch, todo = _next_batch(todo)
            batches.append(self._submit_batch(batch))
        for batch, scratch, fut, errors in batches:
            self._finish_batch(batch, scratch, fut, errors, out, on_error)
        return out

    def _sizes(self, paths: list[str]) -> dict[str, int | BaseException]:
        """Sizes of objects, from the listing cache or heads all in flight at once
        (an entry is the error for an object that cannot be had)."""
        out: dict[str, int | BaseException] = {}
        futures = {}
        for path in dict.fromkeys(paths):
            try:
                cached = self._ls_from_cache(path) if self.split_path(path)[1] else None
            except FileNotFoundError as exc:
                out[path] = exc
                continue
            if cached and len(cached) == 1 and cached[0]["name"] == path and cached[0]["type"] == "file":
                out[path] = cached[0]["size"]
            else:
                futures[path] = self.client.submit_head(*self.split_path(path))
        for path, fut in futures.items():
            try:
                out[path] = fut.result().size
            except Exception as exc:
                out[path] = fs_error(exc, path)
        return out

    def cat(self, path, recursive: bool = False, on_error: str = "raise", **kwargs):
        """Whole objects: one, or ``{path: bytes}`` of many (a list, a glob,
        ``recursive``), the many read with :meth:`cat_ranges` (heads in flight
        together, then batched reads)."""
        paths = self.expand_path(path, recursive=recursive)
        if len(paths) == 1 and not isinstance(path, list) and paths[0] == self._strip_protocol(path):
            return self.cat_file(paths[0], **kwargs)
        if recursive:  # the expansion holds directories too: each is the parent of something in it
            parents = {p.rpartition("/")[0] for p in paths}
            paths = [p for p in paths if p not in parents]
        data = self.cat_ranges(paths, None, None, on_error="return" if on_error != "raise" else "raise")
        return {p: d for p, d in zip(paths, data) if on_error != "omit" or not isinstance(d, BaseException)}

    def _submit_batch(self, batch: list[tuple[int, str, int, int]]) -> tuple:
        """Start one batch read; every range lands in its slice of one buffer."""
        scratch = self._scratch(sum(n for _, _, _, n in batch))
        reqs, at = [], 0
        for _, path, offset, n in batch:
            reqs.append(ReadRequest(*self.split_path(path), scratch[at:at + n], offset, n))
            at += n
        errors: list = []
        with oserrors(batch[0][1]):
            return batch, scratch, self.client.submit_get_many_into(reqs, errors_out=errors), errors

    def _finish_batch(self, batch: list, scratch: memoryview, fut, errors: list, out: list,
                      on_error: str) -> None:
        with oserrors(batch[0][1]):
            got = fut.result()
        at = 0
        for (i, path, _, want), n, err in zip(batch, got, errors):
            buf, at = scratch[at:at + want], at + want
            if err is None:
                out[i] = bytes(buf[:n])
            elif isinstance(err, InvalidRange):
                out[i] = b""
            elif on_error == "return":
                out[i] = fs_error(err, path)
            else:
                raise fs_error(err, path)

    def get_file(self, rpath: str, lpath: str, callback=DEFAULT_CALLBACK, outfile=None, **kwargs) -> None:
        """Download one object into a local file: the bytes land straight in
        the file's pages (the file is mapped and read into with ``get_into``)."""
        if outfile is not None or not isinstance(lpath, (str, os.PathLike)):  # a file object
            return super().get_file(rpath, lpath, callback=callback, outfile=outfile, **kwargs)
        rpath = self._strip_protocol(rpath)
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return None
        size = self._size(rpath)
        os.makedirs(os.path.dirname(os.path.abspath(lpath)), exist_ok=True)
        callback.set_size(size)
        bucket, key = self.split_path(rpath)
        done = False
        try:
            with open(lpath, "wb+") as f:
                got = 0
                if size:
                    f.truncate(size)
                    m = mmap.mmap(f.fileno(), size)
                    try:
                        with oserrors(rpath):
                            got = self.client.get_into(bucket, key, memoryview(m))
                    finally:
                        try:
                            m.close()
                        except BufferError:  # a failed read's traceback still holds a view; freed with it
                            pass
                    if got < size:  # the object shrank meanwhile
                        f.truncate(got)
            done = True
        finally:
            if not done:  # never leave a file of unread (zero) bytes behind
                with contextlib.suppress(OSError):
                    os.unlink(lpath)
        callback.relative_update(got)
        return None

    # --- writes ------------------------------------------------------------------------
    def pipe(self, path, value=None, **kwargs) -> None:
        """Write one object (``path``, ``value``) or many (``{path: bytes}``, all
        puts in flight at once; each is atomic, the set is not)."""
        if not isinstance(path, dict):
            return super().pipe(path, value, **kwargs)
        if kwargs.get("mode") == "create":
            return super().pipe(path, **kwargs)
        futures = []
        for name, data in path.items():
            name = self._strip_protocol(name)
            futures.append((name, self.client.submit_put(*self.split_path(name), data)))
        for name, fut in futures:
            with oserrors(name):
                fut.result()
            self.invalidate_cache(name)
        return None

    def pipe_file(self, path: str, value, mode: str = "overwrite", **kwargs) -> None:
        """Write ``value`` (any buffer) as the whole object, atomically.

        Args:
            mode: ``"overwrite"``, or ``"create"`` to refuse an existing object
                (``FileExistsError``; checked before the write, not atomically).
        """
        path = self._strip_protocol(path)
        if mode == "create" and self.exists(path):
            raise FileExistsError(errno.EEXIST, "the object exists", path)
        bucket, key = self.split_path(path)
        with oserrors(path):
            self.client.put(bucket, key, value, content_type=kwargs.get("content_type"))
        self.invalidate_cache(path)

    def put_file(self, lpath: str, rpath: str, callback=DEFAULT_CALLBACK, mode: str = "overwrite",
                 **kwargs) -> None:
        """Upload a local file as one object, sent from the file's mapped pages."""
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            if not self.split_path(rpath)[1]:
                self.makedirs(rpath, exist_ok=True)
            return
        if mode == "create" and self.exists(rpath):
            raise FileExistsError(errno.EEXIST, "the object exists", rpath)
        size = os.path.getsize(lpath)
        callback.set_size(size)
        bucket, key = self.split_path(rpath)
        with open(lpath, "rb") as f, oserrors(rpath):
            if size == 0:
                self.client.put(bucket, key, b"")
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m, memoryview(m) as mv:
                    self.client.put(bucket, key, mv)
        callback.relative_update(size)
        self.invalidate_cache(rpath)

    def cp_file(self, path1: str, path2: str, **kwargs) -> None:
        """Copy an object (read, then put: the fast path has no server-side copy);
        a directory needs nothing (it is implied by the keys copied under it)."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.info(path1)["type"] == "directory":
            return
        self.pipe_file(path2, self.cat_file(path1))

    def _open(self, path: str, mode: str = "rb", block_size=None, autocommit: bool = True,
              cache_options=None, **kwargs) -> GpufeedFile:
        path = self._strip_protocol(path)
        if mode == "xb":
            if self.exists(path):
                raise FileExistsError(errno.EEXIST, "the object exists", path)
            mode = "wb"
        if mode == "rb" and kwargs.get("size") is None:
            info = self.info(path)
            if info["type"] != "file":
                raise IsADirectoryError(errno.EISDIR, "a directory cannot be opened", path)
            kwargs["size"] = info["size"]
        return GpufeedFile(self, path, mode, block_size=block_size, autocommit=autocommit,
                           cache_options=cache_options, **kwargs)

    # --- buckets, directories, deletes -------------------------------------------------
    def mkdir(self, path: str, create_parents: bool = True, **kwargs) -> None:
        """A bare bucket name creates the bucket; a deeper path needs nothing
        (directories are implied by keys) but its bucket, which ``create_parents``
        creates when missing.

        Raises:
            FileExistsError: the bucket exists (bare bucket name).
            FileNotFoundError: no bucket and not ``create_parents``.
        """
        path = self._strip_protocol(path)
        bucket, key = self.split_path(path)
        if not bucket:
            raise FileExistsError(errno.EEXIST, "the root exists", path)
        if not key or create_parents:
            try:
                with oserrors(bucket):
                    self.client.create_bucket(bucket)
            except FileExistsError:
                if not key:
                    raise
            self.invalidate_cache("")
        else:
            self.info(bucket)  # FileNotFoundError without it

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """:meth:`mkdir` with parents; ``exist_ok`` accepts an existing bucket."""
        try:
            self.mkdir(path, create_parents=True)
        except FileExistsError:
            if not exist_ok:
                raise

    def rmdir(self, path: str) -> None:
        """Delete an empty bucket; a deeper (implied) directory needs nothing.

        Raises:
            OSError: ``ENOTEMPTY``, something is under ``path``.
            FileNotFoundError: no such bucket.
        """
        path = self._strip_protocol(path)
        bucket, key = self.split_path(path)
        with oserrors(path):
            if not key:
                self.client.delete_bucket(bucket)
            elif next(iter(self.client.list(bucket, f"{key}/", page_size=1)), None) is not None:
                raise OSError(errno.ENOTEMPTY, "the directory is not empty", path)
        self.invalidate_cache(path)

    def rm_file(self, path: str) -> None:
        """Delete one object (a missing one is no error, as S3's DeleteObject)."""
        path = self._strip_protocol(path)
        bucket, key = self.split_path(path)
        with oserrors(path):
            self.client.delete(bucket, key)
        self.invalidate_cache(path)

    def rm(self, path, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Delete objects (all requests in flight at once), then any bare bucket
        named (with ``recursive``, the bucket and everything in it).

        Raises:
            FileNotFoundError: nothing at ``path``.
            OSError: ``ENOTEMPTY``, a bucket that is not empty without ``recursive``.
        """
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        keys = [self.split_path(p) for p in paths]
        futures = [(f"{b}/{k}", self.client.submit_delete(b, k)) for b, k in keys if k]
        for name, fut in futures:
            with oserrors(name):
                fut.result()
            self.invalidate_cache(name)
        for bucket in sorted({b for b, k in keys if not k}):
            with oserrors(bucket):
                self.client.delete_bucket(bucket)
            self.invalidate_cache(bucket)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget cached listings of ``path`` and its parents (all when ``None``)."""
        if path is None:
            self.dircache.clear()
        else:
            path = self._strip_protocol(path)
            name = path
            self.dircache.pop(name, None)
            while name:
                name = self._parent(name)
                self.dircache.pop(name, None)
        super().invalidate_cache(path)


def _entry_info(bucket: str, e: ListEntry) -> dict:
    return _file_info(bucket, e.key, e.size, e.etag, e.last_modified)


def _next_batch(todo: list) -> tuple[list, list]:
    """The first batch of ``todo`` (up to ``_BATCH_ITEMS`` ranges and about ``_BATCH_BYTES``), and the rest."""
    total, n = 0, 0
    while n < len(todo) and n < _BATCH_ITEMS and (n == 0 or total + todo[n][3] <= _BATCH_BYTES):
        total += todo[n][3]
        n += 1
    return todo[:n], todo[n:]


# the entry point finds the class in a process that never imported gpufeed; this
# registers it in one that imported gpufeed from a tree not installed with it
register_implementation(GpufeedFileSystem.protocol, GpufeedFileSystem, clobber=True)


def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **storage_options):
    """Open a ``gpufeed://`` URL as a webdataset ``gopen`` handler.

    webdataset 1.0.2's ``gopen`` knows a fixed table of schemes (no fsspec
    fallback); register this one with
    ``webdataset.gopen.gopen_schemes["gpufeed"] = gpufeed.client.fs.gopen``.

    Args:
        url: ``gpufeed://BUCKET/KEY``.
        mode: ``"rb"`` or ``"wb"``.
        bufsize: unused (fsspec's block cache buffers).
        **storage_options: as :class:`GpufeedFileSystem` takes them.

    Returns:
        A binary file object.
    """
    return GpufeedFileSystem(**storage_options).open(url, mode)
