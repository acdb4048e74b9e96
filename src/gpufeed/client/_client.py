"""The gpufeed SDK: a fast-path client for one storage node.

The URL picks the transport (see ``_transports/``):

* ``gpufeed+tcp://HOST:PORT``: object bytes arrive with ``recv_into`` straight
  into the caller's buffer; large reads are split across the pooled connections.
* ``gpufeed+shm:///path/to/gpufeed.sock`` (same host): the server writes
  object bytes straight into memory the client registered (``Client.alloc``);
  no socket carries data. Buffers outside a registered region go through a
  staging region (one extra memcpy).

:class:`Client` checks every argument, then delegates to its transport; code
above the SDK asks the capability properties (:attr:`Client.supports_map`,
...) instead of comparing transport names. Every blocking call has a
``submit_*`` form that returns a ``concurrent.futures.Future`` (many requests
in flight), and :class:`~gpufeed.client._async.AsyncClient` is built on those
forms only, so it refuses exactly the arguments :class:`Client` refuses.
Each connection authenticates once when it opens (``_auth.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import msgspec

from ..errors import InvalidArgument, NotImplementedByGpufeed, TransportError
from ..wire import protocol as p
from ._auth import resolve_credentials
from ._leases import Leases
from ._ranges import RangeReads
from ._region import SharedBuffer
from ._transports import TRANSPORTS, Transport, TransportOptions
from ._transports._pooled import MAX_ALLOC_BYTES
from ._types import (
    DeleteResult,
    ListEntry,
    ObjectMeta,
    ReadRequest,
    as_bytes,
    bucket_req,
    check_bucket,
    check_object,
    check_snapshot,
    check_version,
    parse_url,
    then,
    writable_dest,
)

__all__ = ["Client", "ReadRequest", "ListEntry", "ObjectMeta", "DeleteResult", "parse_url"]


class Client(RangeReads):
    """Fast-path client of one gpufeed node. Thread-safe; not usable in a forked
    child (create a new one there).

    Args:
        url: ``gpufeed+tcp://HOST:PORT``, ``gpufeed+shm:///path/gpufeed.sock`` or ``gpufeed+cluster://HOST:PORT``.
        access_key, secret_key: the key each connection proves it holds (both or
            neither). Neither: ``GPUFEED_ACCESS_KEY`` / ``GPUFEED_SECRET_KEY``,
            else ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, else the
            built-in default key (the one ``gpufeed serve`` accepts without settings).
        connections: pooled connections (default 4 for TCP, 1 for shm; each
            carries many requests in flight).
        timeout_s: connect timeout, seconds.
        request_timeout_s: a request that makes no progress for this long (no
            reply bytes, or a send that cannot proceed) fails with TransportError.
        staging_bytes: size of the shm staging region for unregistered buffers.
        slot_bytes: size of one staging slot.
        max_idle_bytes: memory from :meth:`alloc` kept for reuse after its
            buffers are gone (bytes; default 4 GiB).
        allow_unauthenticated: talk to a node that does not authenticate
            clients (its HELLO lists no ``"auth"``: a node older than
            authentication) instead of refusing it with TransportError.
        leases: over shm, serve :meth:`get_into` of a current version up to
            1 MiB from a read lease, in this process, checked, with no round
            trip (``docs/small-reads.md``); ignored elsewhere.

    Attributes:
        url: the URL it was made with.

    Raises:
        TransportError: the node cannot be reached, does not authenticate
            clients (unless allowed), or cannot prove it holds the key's secret.
        InvalidAccessKeyId: the node knows no valid key of that id (or it was revoked).
        SignatureDoesNotMatch: the secret is not the key's.
        InvalidArgument: a malformed URL, or only one of ``access_key`` / ``secret_key``.
    """

    def __init__(self, url: str, access_key: str | None = None, secret_key: str | None = None, *,
                 connections: int | None = None, timeout_s: float = 30.0,
                 request_timeout_s: float | None = 60.0,
                 staging_bytes: int = 64 << 20, slot_bytes: int = 4 << 20,
                 max_idle_bytes: int = 4 << 30, allow_unauthenticated: bool = False,
                 leases: bool = False) -> None:
        self.url = url
        name, address = parse_url(url)
        options = TransportOptions(connections, timeout_s, request_timeout_s, staging_bytes, slot_bytes,
                                   max_idle_bytes, resolve_credentials(access_key, secret_key),
                                   bool(allow_unauthenticated), bool(leases))
        self._t: Transport = TRANSPORTS[name](address, options)

    # --- what the transport can do -----------------------------------------------------
    @property
    def transport(self) -> str:
        """The transport's name (``"tcp"``, ``"shm"``), for display: branch on the
        ``supports_*`` properties instead."""
        return self._t.name

    @property
    def tenant(self) -> str | None:
        """The tenant the client's key acts for, as the node said when it accepted
        the key (``None``: the node does not authenticate)."""
        return self._t.tenant

    @property
    def leases(self) -> Leases | None:
        """The read leases (``leases=True`` over shm to a node that offers them), else None."""
        return getattr(self._t, "leases", None)

    @property
    def supports_map(self) -> bool:
        """:meth:`map_object` works (shm to a node with the MAP operation)."""
        return self._t.supports_map

    @property
    def supports_server_digests(self) -> bool:
        """Batch reads honour ``ReadRequest.digest``: the node hashes each piece as
        it lands (see :meth:`submit_get_many_into`), so a verifying reader need
        not overlap its own hashing with the next batch."""
        return self._t.supports_server_digests

    @property
    def supports_registered_alloc(self) -> bool:
        """:meth:`alloc` returns memory the node writes into directly (shm); on
        other transports it is plain page-aligned memory, no faster to read into
        than any other buffer."""
        return self._t.supports_registered_alloc

    @property
    def supports_versions(self) -> bool:
        """Reads, heads, maps and deletes can name an object version
        (``version_id``): the node lists the ``"versions"`` feature."""
        return self._t.supports_versions

    def _check_version(self, version_id, bypass_governance: bool = False) -> None:
        """Refuse a version argument this client cannot send.

        Raises:
            InvalidArgument: not a ``str`` (``bypass_governance``: not a ``bool``).
            NotImplementedByGpufeed: a version named to a node without versions
                (it would ignore the id and serve the current version).
        """
        check_version(version_id, bypass_governance)
        if (version_id is not None or bypass_governance) and not self._t.supports_versions:
            raise NotImplementedByGpufeed("this node's fast path does not serve object versions "
                                          "(its HELLO lists no 'versions' feature)")

    @property
    def supports_snapshots(self) -> bool:
        """Reads, heads, maps and listings can name a bucket snapshot
        (``snapshot``): the node lists the ``"snapshots"`` feature."""
        return self._t.supports_snapshots

    def _check_snapshot(self, snapshot) -> None:
        """Raises InvalidArgument (not a name) or NotImplementedByGpufeed (a node without snapshots)."""
        check_snapshot(snapshot)
        if snapshot is not None and not self._t.supports_snapshots:
            raise NotImplementedByGpufeed("this node's fast path does not serve snapshots "
                                          "(its HELLO lists no 'snapshots' feature)")

    @property
    def max_batch_item_bytes(self) -> int | None:
        """Largest destination outside :meth:`alloc` memory that a batch read serves
        in its one round trip (bytes; the shm staging slot). Larger items are read
        correctly, with extra round trips on the side. ``None``: no limit."""
        return self._t.max_batch_item_bytes

    @property
    def closed(self) -> bool:
        """:meth:`close` was called (or the client could not be used after a fork)."""
        return self._t.closed

    @property
    def lost_connection(self) -> bool:
        """A connection failed (a request timed out, the node went away). Requests
        on it failed; the client stops reusing pooled memory and should be closed
        and replaced by a new one."""
        return self._t.lost_connection

    @property
    def regions_reused(self) -> int:
        """Regions the node lent from its pool (zeroed, already populated memory
        another client had finished with) rather than allocating fresh."""
        return self._t.regions_reused

    @property
    def max_idle_bytes(self) -> int:
        """Bytes of idle :meth:`alloc` memory kept for reuse (settable)."""
        return self._t.max_idle_bytes

    @max_idle_bytes.setter
    def max_idle_bytes(self, value: int) -> None:
        self._t.max_idle_bytes = value

    # diagnostics for the wire tests: the transport's connections and regions
    @property
    def _conns(self) -> list:
        return getattr(self._t, "conns", [])

    @property
    def _regions(self) -> list:
        return getattr(self._t, "regions", [])

    def _find_region(self, mv: memoryview):
        find = getattr(self._t, "find_region", None)
        return find(mv) if find is not None else None

    # --- memory ------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> memoryview:
        """Memory the server can write into directly (shm) or page-aligned memory (tcp).

        Reads whose destination lies in such a buffer land with one copy, file to
        buffer. Wrap it with ``numpy.frombuffer`` / ``torch.frombuffer``.

        Memory is pooled: when the last view of a buffer (including tensors made
        from it) is gone, its region goes back to the client's pool and a later
        ``alloc`` of a similar size reuses it, already registered with the server
        and already faulted in (populating fresh shared memory costs 0.5-1.3 s/GB
        on small VMs). Like ``numpy.empty``, the contents are not zeroed.

        On shm the server allocates the region (``ALLOC_REGION``) and keeps the
        regions of clients that are done with them (processes that exited, or
        regions a client unmapped) zeroed and populated in its own pool
        (``gpufeed serve --region-pool``), so even a fresh process's first
        ``alloc`` is usually cheap (``regions_reused`` counts those).

        Args:
            nbytes: size in bytes.

        Returns:
            A writable 1-D ``memoryview`` of ``nbytes`` bytes (its ``.obj`` is the
            owning ``numpy`` array).

        Raises:
            InvalidArgument: ``nbytes`` is not an int >= 0, is more than half the
                host's memory, or the memory cannot be had (the node's limit on
                shared memory lent to all clients, or the kernel's).
            TransportError: the client is closed, or was created before ``os.fork()``.
        """
        if type(nbytes) is not int or nbytes < 0:
            raise InvalidArgument("nbytes must be an int >= 0")
        return self._t.alloc(nbytes)

    def alloc_shared(self, nbytes: int) -> SharedBuffer:
        """Fresh memory that other processes can map by its memfd, and that the
        node writes reads into directly on shm (:meth:`alloc` memory is pooled and
        never leaves this process; this is neither).

        Read into ``buf.view``, hand ``buf.fd`` on (``torch.UntypedStorage.
        _new_shared_fd_cpu(buf.fd, buf.nbytes)`` makes a storage that a DataLoader
        worker passes to its main process without a copy), then
        ``buf.close()`` once no read into it is in flight.

        Args:
            nbytes: size in bytes (>= 1).

        Returns:
            A :class:`~gpufeed.client._region.SharedBuffer`.

        Raises:
            InvalidArgument: ``nbytes`` is not an int >= 1, is more than half the
                host's memory, or the node refuses to map that much.
            TransportError: the client is closed, or was created before ``os.fork()``.
        """
        if type(nbytes) is not int or not 1 <= nbytes <= MAX_ALLOC_BYTES:
            raise InvalidArgument(f"nbytes must be an int in [1, {MAX_ALLOC_BYTES}]: {nbytes!r}")
        return self._t.alloc_shared(nbytes)

    def map_ahead(self, buf: memoryview) -> threading.Thread | None:
        """Start mapping the pages of an :meth:`alloc` buffer into this process, in
        a background thread, while the node fills them.

        On shm the node writes into pages this process may not have mapped yet
        (a region it just lent): the first touch of each 4 KiB page would then
        take a minor fault (measured 0.36 s per GiB for first writes on the
        2-core VM). This maps them ahead with ``MADV_POPULATE_READ`` (the pages
        exist; shared writable mappings get them writable), with the GIL
        released, concurrently with the reads. Join the returned thread before
        handing the data on.

        Args:
            buf: a buffer from :meth:`alloc` (or a slice of one).

        Returns:
            The started thread, or ``None`` when there is nothing to do: TCP,
            a buffer outside the client's regions, or pages this client already
            mapped ahead (a reused buffer; re-walking mapped pages costs
            0.05-0.08 s per GiB for nothing).
        """
        return self._t.map_ahead(buf)

    # --- buckets -----------------------------------------------------------------------
    def submit_create_bucket(self, bucket: str, *, kind: str = "standard", capacity_bytes: int = 0,
                             ttl_s: float = 0.0) -> Future:
        """Start :meth:`create_bucket`; the Future resolves when the bucket exists."""
        return then(self._t.request(p.Op.CREATE_BUCKET,
                                    bucket_req(bucket, kind, capacity_bytes, ttl_s)), _none)

    def create_bucket(self, bucket: str, *, kind: str = "standard", capacity_bytes: int = 0,
                      ttl_s: float = 0.0) -> None:
        """Create a bucket; ``kind="kv"`` makes a cache bucket that evicts least
        recently used objects to stay within ``capacity_bytes`` and hides objects
        ``ttl_s`` seconds after their last write (see ``Engine.create_bucket``).

        Raises InvalidBucketName, BucketAlreadyOwnedByYou, InvalidArgument (a kv
        bucket needs ``capacity_bytes > 0`` or ``ttl_s > 0``). A node older than
        this SDK ignores the policy and makes a standard bucket.
        """
        self.submit_create_bucket(bucket, kind=kind, capacity_bytes=capacity_bytes,
                                  ttl_s=ttl_s).result()

    def submit_bucket_stats(self, bucket: str) -> Future:
        """Start :meth:`bucket_stats`; the Future resolves to its ``dict``."""
        check_bucket(bucket)
        return then(self._t.request(p.Op.BUCKET_STATS, p.BucketReq(bucket)),
                    msgspec.structs.asdict)

    def bucket_stats(self, bucket: str) -> dict:
        """The bucket's policy and counters: ``{"kind", "capacity_bytes", "ttl_s",
        "bytes", "objects", "evictions", "expirations"}``. Raises NoSuchBucket."""
        return self.submit_bucket_stats(bucket).result()

    def submit_delete_bucket(self, bucket: str) -> Future:
        """Start :meth:`delete_bucket`; the Future resolves to ``None``."""
        check_bucket(bucket)
        return then(self._t.request(p.Op.DELETE_BUCKET, p.BucketReq(bucket)), _none)

    def delete_bucket(self, bucket: str) -> None:
        """Raises NoSuchBucket, BucketNotEmpty."""
        self.submit_delete_bucket(bucket).result()

    def submit_list_buckets(self) -> Future:
        """Start :meth:`list_buckets`; the Future resolves to the names."""
        return then(self._t.request(p.Op.LIST_BUCKETS, p.Empty()), lambda r: list(r.buckets))

    def list_buckets(self) -> list[str]:
        """Names of every bucket."""
        return self.submit_list_buckets().result()

    # --- objects -----------------------------------------------------------------------
    def submit_head(self, bucket: str, key: str, *, version_id: str | None = None,
                    snapshot: str | None = None) -> Future:
        """Start :meth:`head`; the Future resolves to the :class:`ObjectMeta`."""
        check_object(bucket, key)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        return self._t.request(p.Op.HEAD, p.Head(bucket, key, version_id, snapshot))

    def head(self, bucket: str, key: str, *, version_id: str | None = None,
             snapshot: str | None = None) -> ObjectMeta:
        """Object metadata: of the current version, or of version ``version_id``
        (``"null"`` or an id the node gave), or as bucket snapshot ``snapshot``
        recorded it (every read here takes ``snapshot``: NoSuchSnapshot when the
        bucket has none of that name). The result's ``version_id``,
        ``lock_mode``, ``lock_until`` and ``legal_hold`` describe that version.

        Raises:
            NoSuchBucket: no such bucket.
            NoSuchKey: no current version; when a delete marker is the latest
                version, ``details`` has ``delete_marker=True`` and its ``version_id``.
            NoSuchVersion: no version ``version_id`` of the key.
            MethodNotAllowed: ``version_id`` names a delete marker.
            InvalidArgument: a malformed version id.
            NotImplementedByGpufeed: a version named to a node without versions.
        """
        return self.submit_head(bucket, key, version_id=version_id, snapshot=snapshot).result()

    def submit_map_object(self, bucket: str, key: str, *, populate: bool = True,
                          version_id: str | None = None, snapshot: str | None = None) -> Future:
        """Start :meth:`map_object` (on the client's threads); the Future resolves
        to the view."""
        check_object(bucket, key)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        return self._t.executor_submit(self._t.map_object, bucket, key, populate, version_id, snapshot)

    def map_object(self, bucket: str, key: str, *, populate: bool = True,
                   version_id: str | None = None, snapshot: str | None = None) -> memoryview:
        """Map an object's stored bytes into this process: zero-copy, shm only
        (:attr:`supports_map`).

        The node sends the data files of the current version (or of version
        ``version_id``), opened read-only, with ``SCM_RIGHTS``, and this
        process maps them ``MAP_PRIVATE``, side by side in one address range
        when the object is stored in several pieces: the view's
        pages *are* the node's page cache, so nothing is copied and processes
        that map the same object share one copy of it in memory. Writes to the
        view are copy-on-write: they change this process's pages only, never
        the stored object.

        The view is a snapshot of that version: a later overwrite (a new file)
        or delete (an unlink) does not change it; a deleted version's disk
        space is freed when the last mapping goes. The pages stay page cache:
        under memory pressure the kernel may drop clean ones and read them back
        from disk on the next touch (a copy from :meth:`get_into` into
        :meth:`alloc` memory never goes back to disk). The node checks each
        chunk against its stored block sums the first time it maps it after
        it started, before it sends the files; later maps, and a page the
        kernel drops and reads back later, are not checked again
        (:meth:`get_into` always checks). Objects stored compressed or in
        content-defined chunks cannot be mapped (``InvalidRequest``: read them).

        Args:
            bucket, key: the object.
            populate: map every page in now (``MADV_POPULATE_READ`` on up to 8
                threads, GIL released; pages not yet cached are read from disk,
                with readahead started first), so first touches take no page
                faults. ``False``: pages are mapped as they are touched.
            version_id: map that version (``None``: the current one).

        Returns:
            A writable byte ``memoryview`` of ``size`` bytes; the mapping goes
            when the last view of it (tensors made from it too) is gone, and no
            file descriptor is held meanwhile. An empty object gives an empty
            view.

        Raises:
            InvalidArgument: not the shm transport (``gpufeed+shm://``), a
                node without the MAP operation, or the mapping failed (address
                space or ``vm.max_map_count``).
            NoSuchBucket, NoSuchKey: nothing there.
            NoSuchVersion, MethodNotAllowed: as for :meth:`head`.
            DamagedObject: the stored data failed its check.
            InvalidRequestError: the object is stored compressed or in
                content-defined chunks.
            InternalError: the data file is shorter than the object.
            TransportError: the node went away.
        """
        check_object(bucket, key)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        return self._t.map_object(bucket, key, populate, version_id, snapshot)

    def submit_put(self, bucket: str, key: str, data, *, content_type: str | None = None,
                   metadata: dict[str, str] | None = None) -> Future:
        """Start a put; the Future resolves to the new :class:`ObjectMeta`.

        ``data`` must not change until the Future is done. Atomic: the whole
        object becomes visible, or nothing.
        """
        check_object(bucket, key)
        return self._t.submit_put(bucket, key, as_bytes(data), content_type, dict(metadata or {}))

    def put(self, bucket: str, key: str, data, *, content_type: str | None = None,
            metadata: dict[str, str] | None = None) -> ObjectMeta:
        """Write a whole object from any buffer. Returns its metadata: in a
        versioned bucket ``version_id`` is the new version's id (``"null"`` where
        versioning was never enabled or is suspended), and the lock fields hold
        the retention an object-lock bucket's default gave it.

        Raises:
            NoSuchBucket, KeyTooLong, InvalidArgument, TransportError.
        """
        return self.submit_put(bucket, key, data, content_type=content_type, metadata=metadata).result()

    def submit_get(self, bucket: str, key: str, *, offset: int = 0, length: int | None = None,
                   version_id: str | None = None, snapshot: str | None = None) -> Future:
        """Start :meth:`get`; the Future resolves to the ``memoryview``."""
        check_object(bucket, key, offset, length)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        return self._t.submit_get(bucket, key, offset, length, version_id, snapshot)

    def get(self, bucket: str, key: str, *, offset: int = 0, length: int | None = None,
            version_id: str | None = None, snapshot: str | None = None) -> memoryview:
        """Read an object (or ``length`` bytes from ``offset``) into new memory.

        Args:
            version_id: read that version (``"null"`` or an id the node gave);
                ``None``: the current one.
            snapshot: read it as bucket snapshot ``snapshot`` recorded it.

        Returns:
            A ``memoryview`` over a ``bytearray``.

        Raises:
            NoSuchBucket, NoSuchKey, InvalidRange.
            DamagedObject: the stored data failed its check (no bytes are returned).
            NoSuchVersion, MethodNotAllowed, InvalidArgument,
                NotImplementedByGpufeed: a version id, as for :meth:`head`.
        """
        check_object(bucket, key, offset, length)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        return self._t.get(bucket, key, offset, length, version_id, snapshot)

    def submit_get_into(self, bucket: str, key: str, buffer, *, offset: int = 0, length: int | None = None,
                        version_id: str | None = None, snapshot: str | None = None) -> Future:
        """Start :meth:`get_into`; the Future resolves to the bytes read."""
        check_object(bucket, key, offset, length)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        return self._t.submit_get_into(bucket, key, writable_dest(buffer, length), offset,
                                       version_id, snapshot)

    def get_into(self, bucket: str, key: str, buffer, *, offset: int = 0, length: int | None = None,
                 version_id: str | None = None, snapshot: str | None = None) -> int:
        """Read object bytes from ``offset`` straight into ``buffer``.

        Args:
            buffer: writable contiguous buffer (bytearray, numpy array, tensor
                ``.numpy()``, a view from :meth:`alloc`).
            offset: first byte of the object to read.
            length: bytes to read (default ``len(buffer)``).
            version_id: read that version (``None``: the current one).
            snapshot: read it as bucket snapshot ``snapshot`` recorded it.

        Returns:
            Bytes read: less than requested only at the end of the object.

        Raises:
            NoSuchBucket, NoSuchKey, InvalidRange (offset past the end), TransportError.
            DamagedObject: the stored data failed its check; ``buffer`` may hold
                unchecked bytes and must not be used.
            NoSuchVersion, MethodNotAllowed, InvalidArgument,
                NotImplementedByGpufeed: a version id, as for :meth:`head`.
        """
        check_object(bucket, key, offset, length)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        return self._t.get_into(bucket, key, writable_dest(buffer, length), offset, version_id, snapshot)

    def submit_get_many_into(self, requests: Sequence[ReadRequest | tuple], *,
                             digests_out: list | None = None,
                             errors_out: list | None = None) -> Future:
        """Start a batch read in one round trip; the Future resolves to the list of
        bytes read per request (see :meth:`get_many_into`).

        Items of any size are read; on shm an item outside :meth:`alloc` memory
        larger than :attr:`max_batch_item_bytes` is read on the side, with
        extra round trips, and the Future resolves once every item is in.

        Args:
            requests: :class:`ReadRequest` or ``(bucket, key, dest, offset, length,
                digest, version_id, snapshot)`` tuples (trailing fields optional).
            digests_out: a list that, before the Future resolves, holds one entry per
                request: the server's XXH3-64 digests (``int``, seed 0) of each
                ``digest``-byte piece of the bytes delivered into ``dest``, or ``None``
                where none were computed (``digest`` 0, a transport without
                :attr:`supports_server_digests`, an item read on the side). The
                server hashes each piece right after it lands, on its own threads,
                while it is still in the CPU cache: a reader that checks stored
                checksums compares against these instead of hashing the bytes
                again, and hashes the ``None`` entries itself.
            errors_out: with a list here, a request that fails does not fail the
                batch: the list holds one entry per request, ``None`` or the typed
                error (``NoSuchKey``, ``InvalidRange``, ...), and the bytes-read
                entry of a failed request is -1. The other requests are served as
                usual (one round trip that doubles as an existence check).

        Raises:
            InvalidArgument: a malformed request (checked before anything is sent).
        """
        reqs = [r if isinstance(r, ReadRequest) else ReadRequest(*r) for r in requests]
        if digests_out is not None:
            digests_out[:] = [None] * len(reqs)
        if errors_out is not None:
            errors_out[:] = [None] * len(reqs)
        dests: list[memoryview] = []
        for r in reqs:
            check_object(r.bucket, r.key, r.offset, r.length)
            if type(r.digest) is not int or r.digest < 0:
                raise InvalidArgument(f"digest piece size must be >= 0, not {r.digest!r}")
            if r.version_id is not None:
                self._check_version(r.version_id)
            self._check_snapshot(r.snapshot)
            dests.append(writable_dest(r.dest, r.length, batch=True))
        return self._t.submit_get_many_into(reqs, dests, digests_out, errors_out)

    def get_many_into(self, requests: Sequence[ReadRequest | tuple], *,
                      digests_out: list | None = None,
                      errors_out: list | None = None) -> list[int]:
        """Read a batch of ranges, each into its own buffer, in one round trip;
        the server serves the items concurrently.

        Args:
            requests: :class:`ReadRequest` or ``(bucket, key, dest, offset, length,
                digest, version_id, snapshot)`` tuples (trailing fields optional).
            digests_out: filled with server-computed piece digests (see
                :meth:`submit_get_many_into`).
            errors_out: filled with per-request errors instead of raising (see
                :meth:`submit_get_many_into`).

        Returns:
            Bytes read per request, in order (-1 for a failed one with ``errors_out``).

        Raises:
            The typed error of the first request that failed (its index in the
            message), unless ``errors_out`` is given; TransportError always raises.
        """
        return self.submit_get_many_into(requests, digests_out=digests_out,
                                         errors_out=errors_out).result()

    def submit_delete(self, bucket: str, key: str, *, version_id: str | None = None,
                      bypass_governance: bool = False) -> Future:
        """Start :meth:`delete`; the Future resolves to the :class:`DeleteResult`."""
        check_object(bucket, key)
        self._check_version(version_id, bypass_governance)
        return self._t.request(p.Op.DELETE, p.Delete(bucket, key, version_id, bypass_governance))

    def delete(self, bucket: str, key: str, *, version_id: str | None = None,
               bypass_governance: bool = False) -> DeleteResult:
        """Delete a key, or one version of it, as S3 DeleteObject does; a missing
        key or version is not an error.

        Without ``version_id`` the object goes, or in a versioned bucket a new
        delete marker hides it (the versions stay). With ``version_id`` that
        version (or delete marker) is removed for good, unless object lock
        protects it.

        Args:
            version_id: the version to remove; ``None``: the key as a whole.
            bypass_governance: remove a version under GOVERNANCE retention
                (never COMPLIANCE retention, never a legal hold).

        Returns:
            The :class:`DeleteResult`: ``version_id`` of the version removed or
            the delete marker made (``None`` in a never-versioned bucket), and
            ``delete_marker``.

        Raises:
            NoSuchBucket: no such bucket.
            AccessDenied: the version is under retention or legal hold.
            InvalidArgument: a malformed version id.
            NotImplementedByGpufeed: a version or bypass sent to a node without versions.
        """
        return self.submit_delete(bucket, key, version_id=version_id,
                                  bypass_governance=bypass_governance).result()

    def submit_list(self, bucket: str, prefix: str = "", delimiter: str = "", *,
                    start_after: str = "", page_size: int = 1000, snapshot: str | None = None) -> Future:
        """Start :meth:`list` (on the client's threads); the Future resolves to the
        whole ``list`` of entries."""
        check_bucket(bucket)
        self._check_snapshot(snapshot)
        return self._t.executor_submit(
            lambda: list(self._pages(bucket, prefix, delimiter, start_after, page_size, snapshot)))

    def list(self, bucket: str, prefix: str = "", delimiter: str = "", *, start_after: str = "",
             page_size: int = 1000, snapshot: str | None = None) -> Iterator[ListEntry]:
        """Yield keys (and common prefixes when ``delimiter`` is set) in UTF-8
        byte order, paging transparently; of bucket snapshot ``snapshot`` when
        given. Raises NoSuchBucket (NoSuchSnapshot)."""
        check_bucket(bucket)
        self._check_snapshot(snapshot)
        return self._pages(bucket, prefix, delimiter, start_after, page_size, snapshot)

    def _pages(self, bucket: str, prefix: str, delimiter: str, start_after: str,
               page_size: int, snapshot: str | None = None) -> Iterator[ListEntry]:
        token = None
        while True:
            page = self._t.request(p.Op.LIST, p.List(bucket, prefix, delimiter, token, page_size,
                                                     start_after, snapshot)).result()
            items = [ListEntry(e.key, e.size, e.etag, e.last_modified) for e in page.entries]
            items += [ListEntry(pfx, is_prefix=True) for pfx in page.prefixes]
            items.sort(key=lambda e: e.key.encode("utf-8", "surrogatepass"))
            yield from items
            if not page.is_truncated or not page.next_token:
                return
            token = page.next_token

    # --- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close connections and release regions. Idempotent. In a forked child it
        does nothing (the connections belong to the parent; use a new Client)."""
        t = getattr(self, "_t", None)
        if t is not None:  # else __init__ failed (the transport cleaned up after itself)
            t.close()

    def __enter__(self) -> "Client":
        if self.closed:
            raise TransportError("the client is closed")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:
            pass


def _none(_reply) -> None:
    return None
