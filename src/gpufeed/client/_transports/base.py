"""The transport interface of the SDK: what :class:`~gpufeed.client.Client` asks
of the thing that moves bytes.

:class:`~gpufeed.client.Client` checks every argument, then delegates to one
:class:`Transport`. A transport receives only checked values (``str`` names,
ints in range, flat writable ``memoryview`` destinations) and may assume them.
Callers above the SDK (``gpufeed.ai``) ask the capability properties
(:attr:`Transport.supports_map`, :attr:`Transport.supports_server_digests`, ...)
through the client and never compare transport names, so a new transport
(UCX/RDMA, a cluster-routing one) plugs in by implementing this class and
registering its name in ``gpufeed.client._transports.TRANSPORTS``.

Modelled on httpx's ``_transports/base.py`` (the client validates and
delegates) and zarr's ``Store.supports_*`` properties.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ...errors import InvalidArgument, NotImplementedByGpufeed, TransportError
from .._auth import Credentials, resolve_credentials
from .._region import Region, SharedBuffer
from .._types import ReadRequest

__all__ = ["Transport", "TransportOptions"]


@dataclass(frozen=True, slots=True)
class TransportOptions:
    """Settings a :class:`~gpufeed.client.Client` passes to its transport; each
    transport reads the ones that apply to it.

    Attributes:
        connections: pooled connections; ``None``: the transport's default.
        timeout_s: connect timeout, seconds.
        request_timeout_s: a request that makes no progress for this long fails
            with TransportError; ``None`` waits forever.
        staging_bytes: bytes of staging memory for buffers the node cannot
            reach directly (shm).
        slot_bytes: bytes of one staging slot (shm).
        max_idle_bytes: bytes of :meth:`Transport.alloc` memory kept for reuse.
        credentials: the key each connection proves (AUTH); default: resolved
            from the environment (:func:`~gpufeed.client._auth.resolve_credentials`).
        allow_unauthenticated: talk to a node that does not authenticate
            (no ``"auth"`` in its HELLO) instead of refusing it.
        leases: serve small reads of current versions from read leases (shm
            to a node whose HELLO lists ``"lease"``; :mod:`gpufeed.client._leases`).
    """

    connections: int | None = None
    timeout_s: float = 30.0
    request_timeout_s: float | None = 60.0
    staging_bytes: int = 64 << 20  # 64 MiB
    slot_bytes: int = 4 << 20  # 4 MiB
    max_idle_bytes: int = 4 << 30  # 4 GiB
    credentials: Credentials = field(default_factory=resolve_credentials)
    allow_unauthenticated: bool = False
    leases: bool = False


class Transport(ABC):
    """Moves requests and object bytes between this process and one node.

    Every method takes arguments :class:`~gpufeed.client.Client` has already
    checked. Blocking work runs on the transport's own threads: each
    ``submit_*`` returns a ``concurrent.futures.Future`` at once.

    Attributes:
        name: short name users may read (``"tcp"``, ``"shm"``), also
            ``Client.transport``.
        regions_reused: regions the node lent from its pool of already
            populated memory (0 where nothing is lent).
        max_idle_bytes: bytes of :meth:`alloc` memory kept for reuse.
    """

    name: str = ""
    regions_reused: int = 0
    max_idle_bytes: int = 0
    #: the tenant the node says the key acts for (``None``: the node does not authenticate)
    tenant: str | None = None

    @abstractmethod
    def __init__(self, address, options: TransportOptions) -> None:
        """Connect to the node at ``address`` (what ``parse_url`` gives).

        Raises:
            TransportError: the node cannot be reached.
        """

    # --- capabilities ------------------------------------------------------------------
    @property
    def supports_map(self) -> bool:
        """:meth:`map_object` can map an object's stored bytes (zero-copy)."""
        return False

    @property
    def supports_server_digests(self) -> bool:
        """Batch reads honour ``ReadRequest.digest``: the node hashes pieces as they
        land, so a reader can skip hashing them itself."""
        return False

    @property
    def supports_registered_alloc(self) -> bool:
        """:meth:`alloc` returns memory the node writes into directly (reads into
        it take one copy, file to buffer); ``False``: plain page-aligned memory."""
        return False

    @property
    def supports_versions(self) -> bool:
        """Reads, heads, maps and deletes can name an object version
        (``version_id``), and deletes can bypass GOVERNANCE retention."""
        return False

    @property
    def supports_snapshots(self) -> bool:
        """Reads, heads, maps and listings can name a bucket snapshot (``snapshot``)."""
        return False

    @property
    def max_batch_item_bytes(self) -> int | None:
        """Largest destination outside :meth:`alloc` memory that a batch read serves
        inside its one round trip; larger ones are still read, with extra round
        trips on the side. ``None``: no limit."""
        return None

    # --- state ---------------------------------------------------------------------------
    @property
    @abstractmethod
    def closed(self) -> bool:
        """Closed by :meth:`close` (or unusable in this process after a fork)."""

    @property
    @abstractmethod
    def lost_connection(self) -> bool:
        """A connection failed (timeout, node gone); a client in this state should
        be closed and replaced."""

    # --- operations ------------------------------------------------------------------
    @abstractmethod
    def request(self, op: int, meta) -> Future:
        """Send a metadata-only request (``op`` from ``wire.protocol.Op``); the Future
        resolves to the decoded reply or raises the typed error the node sent."""

    @abstractmethod
    def executor_submit(self, fn, *args) -> Future:
        """Run blocking ``fn(*args)`` on the transport's threads."""

    @abstractmethod
    def submit_get(self, bucket: str, key: str, offset: int, length: int | None,
                   version_id: str | None = None, snapshot: str | None = None) -> Future:
        """Read into new memory; the Future resolves to a ``memoryview``.
        ``version_id``: that version (``None``: the current one); only passed
        when :attr:`supports_versions`, like every ``version_id`` here;
        ``snapshot``: as recorded by that bucket snapshot, only passed when
        :attr:`supports_snapshots`, like every ``snapshot`` here."""

    def get(self, bucket: str, key: str, offset: int, length: int | None,
            version_id: str | None = None, snapshot: str | None = None) -> memoryview:
        """Blocking :meth:`submit_get` (a transport may do it on the caller's thread)."""
        return self.submit_get(bucket, key, offset, length, version_id, snapshot).result()

    @abstractmethod
    def submit_get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                        version_id: str | None = None, snapshot: str | None = None) -> Future:
        """Read up to ``len(dest)`` bytes from ``offset``; resolves to the count."""

    def get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                 version_id: str | None = None, snapshot: str | None = None) -> int:
        """:meth:`submit_get_into` on the calling thread: the count of bytes read.
        Transports override it where a lone request can skip the Future chain."""
        return self.submit_get_into(bucket, key, dest, offset, version_id, snapshot).result()

    @abstractmethod
    def submit_get_many_into(self, reqs: Sequence[ReadRequest], dests: Sequence[memoryview],
                             digests_out: list | None, errors_out: list | None) -> Future:
        """Batch read (``dests[i]`` is the checked destination of ``reqs[i]``);
        resolves to bytes per item (see ``Client.submit_get_many_into``)."""

    def submit_get_ranges_into(self, bucket: str, key: str, dest: memoryview, offsets: bytes,
                               lengths: list[int], version_id: str | None = None,
                               snapshot: str | None = None) -> Future:
        """Read many ranges of one object into ``dest``, packed in order (the
        GETR op: ``offsets`` little-endian uint64 per range, ``lengths[i]`` its
        bytes); resolves to the ``GetRangesReply``.

        Raises:
            NotImplementedByGpufeed: the transport or node has no GETR.
        """
        raise NotImplementedByGpufeed(f"get_ranges_into needs a node and transport with GETR, not {self.name}")

    @abstractmethod
    def submit_put(self, bucket: str, key: str, data: memoryview, content_type: str | None,
                   metadata: dict[str, str]) -> Future:
        """Write a whole object; resolves to its ``ObjectMeta``."""

    @abstractmethod
    def alloc(self, nbytes: int) -> memoryview:
        """Pooled memory of ``nbytes`` (see ``Client.alloc``)."""

    def alloc_shared(self, nbytes: int) -> SharedBuffer:
        """Fresh memfd-backed memory another process can map (see
        ``Client.alloc_shared``); here not registered with the node."""
        if self.closed:
            raise TransportError("the client is closed")
        return SharedBuffer(Region(0, nbytes, name="gpufeed-shared"), None)

    def map_ahead(self, buf: memoryview) -> threading.Thread | None:
        """Start mapping the pages of an :meth:`alloc` buffer (see ``Client.map_ahead``);
        ``None`` when there is nothing to do."""
        return None

    def map_object(self, bucket: str, key: str, populate: bool,
                   version_id: str | None = None, snapshot: str | None = None) -> memoryview:
        """Map an object version's stored bytes (see ``Client.map_object``).

        Raises:
            InvalidArgument: the transport cannot map (:attr:`supports_map` False).
        """
        raise InvalidArgument(f"map_object needs a transport that supports MAP "
                              f"(gpufeed+shm://), not {self.name}")

    @abstractmethod
    def close(self) -> None:
        """Close connections and release memory. Idempotent."""
