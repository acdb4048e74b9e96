"""The cluster-routing transport (``gpufeed+cluster://HOST:PORT``): reads go
straight to a cluster member that holds the object's data; everything else
goes to the node it was given.

Any member of a cluster serves any object (it fetches chunks it lacks from a
member that holds them, ``docs/cluster.md``), so routing is about load, never
about correctness: a read sent anywhere returns the same bytes. Per object
version this transport asks the given node once which live members hold all
of its data (op LOCATE, authorized as a read), caches the answer (at most
:attr:`RoutingOptions.locations` entries, each for
:attr:`RoutingOptions.location_ttl_s`), and reads from one of those holders
over a pooled TCP transport of its own (one per member, at most
:attr:`RoutingOptions.max_nodes`). Among an object's holders it picks by
rendezvous hashing of the object's name with a salt of this client's, so one
client's reads of many objects spread evenly over the holders and different
clients spread one hot object.

A routed read that fails because the member is gone (the connection failed:
``TransportError``), cannot serve now (``ServiceUnavailable``) or reports the
data damaged is sent again to the given node, which reads its own copy or
fetches one; a member whose connection failed is not routed to for
:attr:`RoutingOptions.retry_after_s`. A node outside a cluster (no
``"locate"`` in its HELLO, or a LOCATE answer naming no cluster) is used as a
plain client would use it.

Writes, listings, heads, deletes and bucket calls go to the given node.
"""

from __future__ import annotations

import collections
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ...errors import DamagedObject, GpufeedError, InvalidArgument, ServiceUnavailable, TransportError, error_from_code
from ...wire import protocol as p
from .._types import ReadRequest
from ._tcp import TcpTransport
from .base import Transport, TransportOptions

__all__ = ["ClusterTransport", "RoutingOptions"]

#: LOCATE requests one batch read sends at once (more wait for the next wave).
LOCATE_WAVE = 256
#: Threads that run reads needing a LOCATE first (they wait on the transports' own threads).
ROUTING_THREADS = 8
#: Errors after which a routed read is sent again to the given node.
_FALLBACK = (TransportError, ServiceUnavailable, DamagedObject)
_Key = tuple[str, str, "str | None", "str | None"]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RoutingOptions:
    """Limits of the cluster-routing transport.

    Attributes:
        max_nodes: most members besides the given node it keeps connections
            to (>= 0; 0 sends every read to the given node).
        locations: most object versions whose holders it caches (>= 1).
        location_ttl_s: seconds a cached location is used before it is asked
            again (> 0).
        retry_after_s: seconds a member whose connection failed is not routed
            to (>= 0).
    """

    max_nodes: int = 64
    locations: int = 65536
    location_ttl_s: float = 30.0
    retry_after_s: float = 5.0

    def check(self) -> None:
        """Raises InvalidArgument for a limit out of range."""
        if type(self.max_nodes) is not int or self.max_nodes < 0:
            raise InvalidArgument(f"max_nodes must be an int >= 0, not {self.max_nodes!r}")
        if type(self.locations) is not int or self.locations < 1:
            raise InvalidArgument(f"locations must be an int >= 1, not {self.locations!r}")
        if not self.location_ttl_s > 0:
            raise InvalidArgument(f"location_ttl_s must be > 0, not {self.location_ttl_s!r}")
        if not self.retry_after_s >= 0:
            raise InvalidArgument(f"retry_after_s must be >= 0, not {self.retry_after_s!r}")


class ClusterTransport(Transport):
    """Routes reads to members that hold the data; see the module docstring.

    Args:
        address: ``(host, port)`` of the given node's fast-path TCP port.
        options: as for :class:`~._tcp.TcpTransport` (used for every member's connections).
        routing: the limits (default :class:`RoutingOptions`).

    Raises:
        TransportError: the given node cannot be reached.
        InvalidArgument: a routing limit out of range.
    """

    name = "cluster"

    def __init__(self, address, options: TransportOptions, routing: RoutingOptions | None = None) -> None:
        self.routing = routing or RoutingOptions()
        self.routing.check()
        self._options = options
        self._given = TcpTransport(address, options)
        self.tenant = self._given.tenant
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[tuple[str, int], TcpTransport]] = {}
        self._members: dict[str, p.Member] = {}
        self._down: dict[str, float] = {}  # node id -> monotonic time it may be routed to again
        self._cache: collections.OrderedDict[_Key, tuple[float, list[str]]] = collections.OrderedDict()
        self._salt = secrets.token_bytes(8)
        #: the given node's id (``""`` until a LOCATE names it, or outside a cluster)
        self.given_node = ""
        #: the given node locates objects (it lists ``"locate"`` and is in a cluster)
        self.routes = "locate" in self._given.features
        #: reads sent per node id (``""``: the given node before its id is known),
        #: LOCATE requests sent, reads sent again to the given node
        self.reads: collections.Counter[str] = collections.Counter()
        self.locates = 0
        self.fallbacks = 0
        self._closed = False
        self._pool = ThreadPoolExecutor(ROUTING_THREADS, thread_name_prefix="gpufeed-route")

    def _submit(self, fn, *args) -> Future:
        if self._closed:
            raise TransportError("the client is closed")
        return self._pool.submit(fn, *args)

    # --- capabilities and state: the given node's ---------------------------------------
    @property
    def supports_versions(self) -> bool:
        return self._given.supports_versions

    @property
    def supports_snapshots(self) -> bool:
        return self._given.supports_snapshots

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def lost_connection(self) -> bool:
        return self._given.lost_connection

    @property
    def max_idle_bytes(self) -> int:
        return self._given.max_idle_bytes

    @max_idle_bytes.setter
    def max_idle_bytes(self, value: int) -> None:
        self._given.max_idle_bytes = value

    # --- what goes to the given node ------------------------------------------------------
    def request(self, op: int, meta) -> Future:
        return self._given.request(op, meta)

    def executor_submit(self, fn, *args) -> Future:
        return self._given.executor_submit(fn, *args)

    def submit_put(self, bucket: str, key: str, data: memoryview, content_type: str | None,
                   metadata: dict[str, str]) -> Future:
        return self._given.submit_put(bucket, key, data, content_type, metadata)

    def alloc(self, nbytes: int) -> memoryview:
        return self._given.alloc(nbytes)

    # --- locating -------------------------------------------------------------------------
    def _cached(self, name: _Key) -> list[str] | None:
        """The cached holders of ``name`` (``None``: not cached, or too old)."""
        with self._lock:
            hit = self._cache.get(name)
            if hit is None or time.monotonic() - hit[0] >= self.routing.location_ttl_s:
                return None
            self._cache.move_to_end(name)
            return hit[1]

    def _learn(self, name: _Key, reply: p.LocateReply, from_given: bool = True) -> list[str]:
        """Remember a LOCATE answer: the members, the given node's id, the holders."""
        with self._lock:
            if not reply.node:  # the node is in no cluster: read through it as a plain client
                self.routes = False
                return []
            if from_given:
                self.given_node = reply.node
            self._members = {m.node_id: m for m in reply.members}
            self._cache[name] = (time.monotonic(), list(reply.holders))
            self._cache.move_to_end(name)
            while len(self._cache) > self.routing.locations:
                self._cache.popitem(last=False)
            return list(reply.holders)

    def _locate_many(self, names: Sequence[_Key]) -> dict[_Key, list[str]]:
        """The holders of each of ``names`` (cached, else asked of the given node, in
        waves of :data:`LOCATE_WAVE`); a version the node cannot locate (it does not
        exist, the key may not read it) gets none, so the read produces the error.

        Raises:
            TransportError: the given node is gone.
        """
        out: dict[_Key, list[str]] = {}
        todo = []
        for name in dict.fromkeys(names):
            hit = self._cached(name) if self.routes else []
            if hit is None:
                todo.append(name)
            else:
                out[name] = hit
        for i in range(0, len(todo), LOCATE_WAVE):
            asked = self._locator()
            wave = [(n, asked.request(p.Op.LOCATE, p.Head(*n))) for n in todo[i:i + LOCATE_WAVE]]
            self.locates += len(wave)
            for name, fut in wave:
                try:
                    out[name] = self._learn(name, fut.result(), asked is self._given)
                except TransportError:
                    raise
                except GpufeedError:
                    out[name] = []
        return out

    def _locator(self) -> Transport:
        """Where to send LOCATE: the given node, or once its connection is lost, a
        live member this client can reach (the given node when there is none)."""
        if not self._given.lost_connection:
            return self._given
        now = time.monotonic()
        for node, m in list(self._members.items()):
            if node != self.given_node and m.live and m.wire_port and self._down.get(node, 0.0) <= now:
                t = self._transport(node)
                if t is not None and t is not self._given:
                    return t
        return self._given

    def _choose(self, name: _Key, holders: list[str]) -> str:
        """The holder of ``name`` to read from (``""``: the given node; passed over
        once its connection is lost, while another holder is reachable)."""
        now = time.monotonic()
        label = f"{name[0]}/{name[1]}".encode()
        best, best_score = "", -1
        given_lost = self._given.lost_connection
        for node in holders:
            m = self._members.get(node)
            if node == self.given_node and given_lost:
                continue
            if node != self.given_node and (m is None or not m.live or not m.wire_port
                                            or self._down.get(node, 0.0) > now):
                continue
            s = int.from_bytes(hashlib.blake2b(self._salt + node.encode() + b"\0" + label,
                                               digest_size=8).digest(), "big")
            if s > best_score:
                best, best_score = node, s
        return "" if best == self.given_node else best

    def _route(self, bucket: str, key: str, version_id: str | None, snapshot: str | None) -> str:
        """The node to read ``bucket/key`` from (``""``: the given node), located if need be."""
        if not self.routes:
            return ""
        name = (bucket, key, version_id, snapshot)
        holders = self._cached(name)
        return self._choose(name, self._locate_many([name])[name] if holders is None else holders)

    # --- members' transports ----------------------------------------------------------------
    def _transport(self, node: str) -> Transport | None:
        """The transport that reads from ``node``: the given node's for ``""``, for a
        member it knows no address of, or past ``max_nodes``; ``None`` when the
        member's connection failed (it is then passed over for ``retry_after_s``)."""
        m = self._members.get(node) if node else None
        if m is None:
            return self._given
        address = (m.host, m.wire_port)
        with self._lock:
            held = self._nodes.get(node)
            if held is not None and held[0] == address and not held[1].lost_connection:
                return held[1]
            full = held is None and len(self._nodes) >= self.routing.max_nodes
        if held is not None and held[0] == address:  # its connection failed since the last read
            self._failed(node)
            return None
        if full or self._closed:
            return self._given
        try:
            t = TcpTransport(address, self._options)
        except GpufeedError:
            self._failed(node)
            return None
        drop: TcpTransport | None
        with self._lock:
            old = self._nodes.get(node)
            if old is not None and old[0] == address and not self._closed:  # another thread connected first
                keep, drop = old[1], t
            else:
                self._nodes[node] = (address, t)
                keep, drop = t, (old[1] if old is not None else None)
        if drop is not None:  # the loser of a race, or a member's old address
            drop.close()
        return keep

    def _failed(self, node: str) -> None:
        """Member ``node``'s connection failed: not routed to for ``retry_after_s``."""
        with self._lock:
            self._down[node] = time.monotonic() + self.routing.retry_after_s
            held = self._nodes.pop(node, None)
        if held is not None:
            held[1].close()

    def _blocking(self, node: str, read: Callable[[Transport], _T]) -> _T:
        """``read(transport)`` of ``node`` on this thread; one that fails there for a
        reason :data:`_FALLBACK` names is done again on the given node."""
        t = self._transport(node)
        if t is None:
            self.fallbacks += 1
            t = self._given
        if t is self._given:
            self.reads[self.given_node] += 1
            return read(t)
        self.reads[node] += 1
        try:
            return read(t)
        except _FALLBACK as exc:
            if isinstance(exc, TransportError):
                self._failed(node)
            self.fallbacks += 1
            self.reads[self.given_node] += 1
            return read(self._given)

    def _routed(self, node: str, start: Callable[[Transport], Future], count: int = 1) -> Future:
        """Start a read on ``node`` (``start(transport)``); one that fails there for
        a reason :data:`_FALLBACK` names is started again on the given node."""
        t = self._transport(node)
        if t is None:
            self.fallbacks += count
            t = self._given
        self.reads[self.given_node if t is self._given else node] += count
        if t is self._given:
            return start(t)
        out: Future = Future()

        def again(exc: BaseException) -> None:
            if isinstance(exc, TransportError):
                self._failed(node)
            self.fallbacks += count
            self.reads[self.given_node] += count
            try:
                _chain(start(self._given), out)
            except BaseException as err:
                out.set_exception(err)

        def done(f: Future) -> None:
            exc = f.exception()
            if exc is None:
                out.set_result(f.result())
            elif isinstance(exc, _FALLBACK):
                again(exc)
            else:
                out.set_exception(exc)

        try:
            inner = start(t)
        except _FALLBACK as exc:
            again(exc)
            return out
        inner.add_done_callback(done)
        return out

    # --- reads --------------------------------------------------------------------------------
    def submit_get(self, bucket: str, key: str, offset: int, length: int | None,
                   version_id: str | None = None, snapshot: str | None = None) -> Future:
        return self._submit(self.get, bucket, key, offset, length, version_id, snapshot)

    def _read(self, name: _Key, read: Callable[[Transport], _T]) -> _T:
        """``read`` on the node :meth:`_route` picks for ``name``; when that was the
        given node and its connection is lost, once more on another holder."""
        node = self._route(*name)
        try:
            return self._blocking(node, read)
        except TransportError:
            if node or not self._given.lost_connection:
                raise
            again = self._route(*name)  # the given node is passed over now
            if not again:
                raise
            return self._blocking(again, read)

    def get(self, bucket: str, key: str, offset: int, length: int | None,
            version_id: str | None = None, snapshot: str | None = None) -> memoryview:
        return self._read((bucket, key, version_id, snapshot),
                          lambda t: t.get(bucket, key, offset, length, version_id, snapshot))

    def submit_get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                        version_id: str | None = None, snapshot: str | None = None) -> Future:
        name = (bucket, key, version_id, snapshot)
        holders = self._cached(name) if self.routes else []
        if holders is None:  # locating takes a round trip: on the client's threads
            return self._submit(self.get_into, bucket, key, dest, offset, version_id, snapshot)
        return self._routed(self._choose(name, holders),
                            lambda t: t.submit_get_into(bucket, key, dest, offset, version_id, snapshot))

    def get_into(self, bucket: str, key: str, dest: memoryview, offset: int,
                 version_id: str | None = None, snapshot: str | None = None) -> int:
        return self._read((bucket, key, version_id, snapshot),
                          lambda t: t.get_into(bucket, key, dest, offset, version_id, snapshot))

    def submit_get_ranges_into(self, bucket: str, key: str, dest: memoryview, offsets: bytes,
                               lengths: list[int], version_id: str | None = None,
                               snapshot: str | None = None) -> Future:
        def run() -> p.GetRangesReply:
            return self._read((bucket, key, version_id, snapshot), lambda t: t.submit_get_ranges_into(
                bucket, key, dest, offsets, lengths, version_id, snapshot).result())
        return self._submit(run)

    def submit_get_many_into(self, reqs: Sequence[ReadRequest], dests: Sequence[memoryview],
                             digests_out: list | None, errors_out: list | None) -> Future:
        return self._submit(self._get_many_again, reqs, dests, digests_out, errors_out)

    def _get_many_again(self, reqs: Sequence[ReadRequest], dests: Sequence[memoryview],
                        digests_out: list | None, errors_out: list | None) -> list[int]:
        """:meth:`_get_many`, once more (the given node passed over) when the given
        node's connection was lost under it."""
        try:
            return self._get_many(reqs, dests, digests_out, errors_out)
        except TransportError:
            if not self._given.lost_connection:
                raise
            return self._get_many(reqs, dests, digests_out, errors_out)

    def _get_many(self, reqs: Sequence[ReadRequest], dests: Sequence[memoryview],
                  digests_out: list | None, errors_out: list | None) -> list[int]:
        """A batch read, split into one batch per member that holds its items."""
        names = [(r.bucket, r.key, r.version_id, r.snapshot) for r in reqs]
        where = self._locate_many(names) if self.routes else {}
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            groups.setdefault(self._choose(name, where.get(name, [])), []).append(i)
        running = []
        for node, idx in groups.items():
            errs: list = [None] * len(idx)
            digs: list | None = [None] * len(idx) if digests_out is not None else None
            fut = self._routed(node, _batch_starter([reqs[i] for i in idx], [dests[i] for i in idx], digs, errs),
                               count=len(idx))
            running.append((idx, errs, digs, fut))
        n = [0] * len(reqs)
        failed: list = [None] * len(reqs)
        for idx, errs, digs, fut in running:
            for j, (i, got) in enumerate(zip(idx, fut.result())):
                n[i] = got
                if errs[j] is not None:
                    failed[i] = _renumbered(errs[j], j, i)
                if digs is not None and digests_out is not None:
                    digests_out[i] = digs[j]
        if errors_out is not None:
            errors_out[:] = failed
        else:
            first = next((e for e in failed if e is not None), None)
            if first is not None:
                raise first
        return n

    # --- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            nodes, self._nodes = list(self._nodes.values()), {}
        self._pool.shutdown(wait=False)
        for _, t in nodes:
            t.close()
        self._given.close()


def _batch_starter(reqs: list[ReadRequest], dests: list[memoryview], digs: list | None,
                   errs: list) -> Callable[[Transport], Future]:
    """Starts one member's part of a batch read on a transport."""
    return lambda t: t.submit_get_many_into(reqs, dests, digs, errs)


def _chain(src: Future, dst: Future) -> None:
    """Resolve ``dst`` as ``src`` resolves."""
    def done(f: Future) -> None:
        exc = f.exception()
        if exc is None:
            dst.set_result(f.result())
        else:
            dst.set_exception(exc)
    src.add_done_callback(done)


def _renumbered(err: GpufeedError, j: int, i: int) -> GpufeedError:
    """A sub-batch's error for its item ``j``, named as item ``i`` of the whole batch."""
    prefix = f"request {j} "
    message = err.message
    if message.startswith(prefix):
        message = f"request {i} " + message[len(prefix):]
    return error_from_code(err.code, message)
