"""LMCache remote-storage plugin: LMCache (and vLLM through it) keeps KV chunks in a gpufeed node.

Interface followed: LMCache 0.5.6 (the release pip installs for CPython 3.11),
its "remote storage plugin" framework:

* ``lmcache/v1/storage_backend/connector/base_connector.py``: ``RemoteConnector``,
  the abstract connector (``exists``/``exists_sync``/``get``/``put``/``list``/
  ``close`` and the batched forms, each announced by a ``support_*()`` method).
* ``lmcache/v1/storage_backend/connector/__init__.py``: ``ConnectorManager``
  imports ``extra_config["remote_storage_plugin.<name>.module_path"]`` and
  ``.class_name`` for every ``<name>`` in ``remote_storage_plugins``. A
  ``RemoteConnector`` subclass is wrapped in ``DynamicConnectorAdapter``, which
  builds it as ``cls(loop=..., local_cpu_backend=..., config=...)`` (no plugin
  name); a ``ConnectorAdapter`` subclass is built as ``cls()`` and gets a
  ``ConnectorContext`` (plugin name included).
* ``lmcache/v1/storage_backend/remote_backend.py``: ``RemoteBackend`` drives the
  connector from its event loop thread, through ``InstrumentedRemoteConnector``
  (``instrumented_connector.py``), which calls ``ref_count_down()`` on every
  MemoryObj after ``put``/``batched_put`` return: this plugin never does.

Configuration (``extra_config``, ``<name>`` being the entry of
``remote_storage_plugins``; see :class:`PluginSettings` for every field)::

    remote_storage_plugins: ["gpufeed"]
    extra_config:
      remote_storage_plugin.gpufeed.module_path: gpufeed.ai.kvcache.lmcache
      remote_storage_plugin.gpufeed.class_name: GpufeedConnector
      remote_storage_plugin.gpufeed.url: gpufeed+shm:///run/gpufeed/gpufeed.sock

Objects: one per LMCache key, in a *kv bucket* of the node (it evicts least
recently used objects to stay within ``capacity_bytes`` instead of refusing a
put). The object key is ``key_prefix + CacheEngineKey.to_string()``
(``model@world_size@worker_id@chunk_hash_hex@dtype[@tags]``), or
``key_prefix + "h/" + XXH3-128 hex`` of it when that is over the node's 1,024
bytes or not valid UTF-8. The object is a header (magic, version, the
MemoryObj's format, shapes and dtypes, payload length, XXH3-64 of the payload,
the full key string) then ``MemoryObj.byte_array``; the format is in
:mod:`gpufeed.ai.kvcache._lmcache_format` and ``docs/kvcache-lmcache.md``.

Reads never return wrong KV and never raise into LMCache: a missing object, a
short one, a bad header, a header for another key and a checksum mismatch are
all misses (``None`` / ``False``; a corrupt object is deleted so the next put
replaces it). A node that cannot be reached or times out is logged once as a
warning, counted in :attr:`GpufeedConnector.metrics` (``node_errors``) and
served as misses (puts dropped) until a reconnect, tried at most every
``retry_interval_s``.

Data path: one batch read (``GETV``) per ``get``/``batched_get`` (header and
payload of every key as items, per-item errors, so a missing key costs no extra
round trip) straight into the MemoryObjs LMCache's CPU allocator hands out
(over TCP the socket receives into them; over shm the node writes into the
client's staging region and the client copies once, because LMCache's memory
is not shared with the node). On shm the node also returns the XXH3-64 of each
payload as it lands (``digest``), so the plugin does not hash it again; over
TCP it hashes the payload itself. Puts copy header and payload into one buffer
from :meth:`Client.alloc` (shared with the node on shm) and are pipelined with
``Client.submit_put``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import xxhash
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from ...client import Client, ReadRequest
from ...errors import (
    BucketAlreadyOwnedByYou,
    GpufeedError,
    InvalidRange,
    NoSuchBucket,
    NotFoundError,
)
from .._session import NodeSession
from ._lmcache_format import ObjectFormatError, ObjectHeader, header_len, payload_checksum
from ._lmcache_settings import PluginSettings
from ._metrics import ConnectorMetrics

__all__ = ["GpufeedConnector", "GpufeedConnectorAdapter", "PluginSettings", "ConnectorMetrics",
           "PLUGIN_TYPE"]

log = logging.getLogger("gpufeed.kvcache.lmcache")

#: Plugin type the adapter answers to (``remote_storage_plugins: ["gpufeed", "gpufeed.b"]``).
PLUGIN_TYPE = "gpufeed"
#: The node's object-key limit (bytes of UTF-8); longer LMCache keys are hashed.
MAX_KEY_BYTES = 1024
#: Keys per batch read on TCP (batches spread over the pooled connections).
TCP_BATCH_KEYS = 4


def _plugin_name(config) -> str:
    """The ``remote_storage_plugins`` entry whose module_path is this module.

    Raises ValueError: none, or several (then use :class:`GpufeedConnectorAdapter`,
    which is told its instance name).
    """
    extra = getattr(config, "extra_config", None) or {}
    names = [n for n in (getattr(config, "remote_storage_plugins", None) or [])
             if extra.get(f"remote_storage_plugin.{n}.module_path") == __name__]
    if len(names) != 1:
        raise ValueError(f"expected one remote_storage_plugins entry with module_path {__name__}, "
                         f"found {names}; for several gpufeed nodes use class_name "
                         "GpufeedConnectorAdapter and plugin names gpufeed.<instance>")
    return names[0]


def _u8(buf) -> np.ndarray:
    """A flat uint8 view of a contiguous buffer (``MemoryObj.byte_array`` is a ``<B`` view)."""
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)


def _layout(obj: MemoryObj) -> tuple:
    """``(fmt value, shapes, dtypes)`` of a MemoryObj, comparable with a header's."""
    return (obj.get_memory_format().value, tuple(tuple(s) for s in obj.get_shapes()),
            tuple(obj.get_dtypes()))


@dataclass(slots=True)
class _Read:
    """One key of a batch read: the header lands in ``hdr``, the payload in ``obj``."""

    kstr: str
    okey: str
    hdr: bytearray
    obj: MemoryObj


class GpufeedConnector(RemoteConnector):
    """LMCache ``RemoteConnector`` storing each KV chunk as one object on a gpufeed node.

    Built by LMCache (``DynamicConnectorAdapter`` or :class:`GpufeedConnectorAdapter`);
    every method is called from LMCache's storage event loop (``async`` ones) or
    its worker threads (``*_sync``, ``batched_contains``). Settings: :class:`PluginSettings`.

    Args:
        loop: LMCache's storage event loop.
        local_cpu_backend: LMCache's ``LocalCPUBackend``: the allocator of the
            MemoryObjs reads land in (and, with ``.config``/``.metadata``, the chunk
            layout: ``[2, layers, chunk_tokens, kv_heads * head_dim]`` per group for
            ``KV_2LTD``).
        config: the ``LMCacheEngineConfig`` (its ``extra_config`` holds the settings).
        plugin_name: this instance's ``remote_storage_plugins`` entry; found from
            ``module_path`` when not given.

    Raises:
        ValueError: missing or malformed settings. A node that is down is not an
            error: the connector serves misses and reconnects later.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, config, *,
                 plugin_name: str | None = None) -> None:
        super().__init__(config, local_cpu_backend.metadata)
        self.plugin_name = plugin_name or _plugin_name(config)
        self.settings = PluginSettings.from_extra_config(config.extra_config, self.plugin_name)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.metrics = ConnectorMetrics()
        self._want = (self.meta_fmt.value, tuple(tuple(s) for s in self.meta_shapes),
                      tuple(self.meta_dtypes))
        self._shm_batch_keys = 1  # set by _client_kwargs
        self._session = NodeSession(self.settings.url, connect_kw=self._client_kwargs(),
                                    prepare=self._create_bucket,
                                    retry_interval_s=self.settings.retry_interval_s,
                                    on_down=self._down)
        self._node()  # connect now when we can (a failure is only counted)

    def __repr__(self) -> str:
        return f"<GpufeedConnector {self.plugin_name} {self.settings.url} bucket={self.settings.bucket}>"

    # --- node plumbing -----------------------------------------------------------------
    def _client_kwargs(self) -> dict:
        s = self.settings
        obj_bytes = 4096 + self.full_chunk_size_bytes  # header + a full chunk
        slot = max(4 << 20, (obj_bytes + (1 << 20) - 1) >> 20 << 20)  # whole MiB, >= 4 MiB
        staging = s.staging_bytes or max(64 << 20, 8 * slot)
        # A batch read stages at most half the slots (Client.submit_get_many_into):
        # batches that fit are staged whole and verified with the node's digests.
        self._shm_batch_keys = max(1, staging // slot // 2)
        kw = dict(timeout_s=s.connect_timeout_s, request_timeout_s=s.request_timeout_s,
                  slot_bytes=slot, staging_bytes=staging)
        if s.connections:
            kw["connections"] = s.connections
        return kw

    def _node(self) -> Client | None:
        """The connected client with the bucket ready, or None while the node is down."""
        return self._session.client()

    def _create_bucket(self, client: Client) -> None:
        s = self.settings
        try:
            client.create_bucket(s.bucket, kind="kv", capacity_bytes=s.capacity_bytes, ttl_s=s.ttl_s)
        except BucketAlreadyOwnedByYou:
            self._check_bucket(client)

    def _check_bucket(self, client: Client) -> None:
        """Warn when the bucket exists but is not a kv bucket: it never evicts, so puts
        start failing when the node's disk fills (``capacity_bytes`` applies only to a
        bucket this plugin creates)."""
        try:
            kind = client.bucket_stats(self.settings.bucket).get("kind", "standard")
        except (GpufeedError, OSError):
            return
        if kind != "kv":
            log.warning("lmcache plugin: bucket %s on %s is a %s bucket, not a kv bucket: it "
                        "never evicts, so puts fail once the node's disk is full; use a new "
                        "bucket name to let the plugin create a kv bucket", self.settings.bucket,
                        self.settings.url, kind)

    async def _anode(self) -> Client | None:
        """:meth:`_node` without blocking the event loop on a (re)connect."""
        return await self._session.aclient()

    def _down(self, exc: BaseException) -> None:
        self.metrics.add(node_errors=1)
        log.warning("lmcache plugin: gpufeed node %s unavailable (%s: %s); serving misses, "
                    "retrying in %.0f s", self.settings.url, type(exc).__name__, exc,
                    self.settings.retry_interval_s)

    def _failed(self, client: Client, exc: BaseException) -> None:
        self._session.failed(exc, client)

    # --- keys --------------------------------------------------------------------------
    def _object_key(self, kstr: str) -> str:
        okey = self.settings.key_prefix + kstr
        try:
            fits = len(okey.encode("utf-8")) <= MAX_KEY_BYTES
        except UnicodeEncodeError:  # lone surrogates: no UTF-8 form
            fits = False
        if fits:
            return okey
        digest = xxhash.xxh3_128_hexdigest(kstr.encode("utf-8", "surrogatepass"))
        return f"{self.settings.key_prefix}h/{digest}"

    def _header_len(self, kstr: str) -> int:
        """Header bytes of an object of the configured layout under ``kstr``."""
        return header_len(len(self.meta_shapes), len(kstr.encode("utf-8", "surrogatepass")))

    # --- reads -------------------------------------------------------------------------
    def _allocate(self, shapes, dtypes, fmt) -> MemoryObj | None:
        """A MemoryObj from LMCache's CPU allocator, or None when it has no room after
        evicting (``busy_loop=False``: waiting for room would block LMCache's event
        loop, and a batch would wait on the memory it holds itself)."""
        return self.local_cpu_backend.allocate(shapes, dtypes, fmt, busy_loop=False)

    def _batches(self, client: Client, reads: list[_Read]) -> list[list[_Read]]:
        per = self._shm_batch_keys if client.supports_server_digests else TCP_BATCH_KEYS
        return [reads[i:i + per] for i in range(0, len(reads), per)]

    async def _read(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj | None]:
        """Batch-read ``keys`` into fresh MemoryObjs of the configured layout; ``None``
        for each key that is missing, corrupt or could not be read. Never raises."""
        out: list[MemoryObj | None] = [None] * len(keys)
        client = await self._anode()
        if client is None or not keys:
            return out
        reads: list[_Read | None] = []
        for key in keys:
            obj = self._allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            if obj is None:
                self.metrics.add(alloc_failures=1)
                reads.append(None)
                continue
            kstr = key.to_string()
            reads.append(_Read(kstr, self._object_key(kstr), bytearray(self._header_len(kstr)), obj))
        todo = [r for r in reads if r is not None]
        digests = client.supports_server_digests
        plen = self.full_chunk_size_bytes
        bucket = self.settings.bucket
        jobs = []
        try:
            for batch in self._batches(client, todo):
                items: list[ReadRequest] = []
                for r in batch:
                    hl = len(r.hdr)
                    items.append(ReadRequest(bucket, r.okey, r.hdr, 0, hl))
                    items.append(ReadRequest(bucket, r.okey, r.obj.byte_array, hl, plen,
                                             plen if digests else 0))
                errs: list = []
                sums: list = []
                jobs.append((batch, client.submit_get_many_into(items, errors_out=errs,
                                                                digests_out=sums), errs, sums))
        except (GpufeedError, OSError) as exc:
            self._failed(client, exc)
        results: dict[int, MemoryObj | None] = {}
        for batch, fut, errs, sums in jobs:
            try:
                ns = await asyncio.wrap_future(fut)
            except (GpufeedError, OSError) as exc:
                self._failed(client, exc)
                continue
            need_hash = any(sums[2 * j + 1] is None for j in range(len(batch)))
            args = (client, batch, ns, errs, sums)
            done, drop = (await asyncio.to_thread(self._finish, *args)) if need_hash \
                else self._finish(*args)
            results.update(zip(map(id, batch), done))
            if drop:
                await asyncio.to_thread(self._drop, client, drop)
        for i, read in enumerate(reads):
            if read is None:
                continue
            got = results.get(id(read))
            if got is None and id(read) not in results:
                read.obj.ref_count_down()  # its batch failed as a whole
            out[i] = got
        return out

    def _finish(self, client: Client, batch: list[_Read], ns: list[int], errs: list,
                sums: list) -> tuple[list[MemoryObj | None], list[str]]:
        """Check each read of a completed batch: a MemoryObj or None per read (the
        MemoryObj of a failed read is released), and the corrupt objects' keys."""
        out: list[MemoryObj | None] = []
        drop: list[str] = []
        for j, r in enumerate(batch):
            got = None
            try:
                got = self._check(client, r, ns[2 * j:2 * j + 2], errs[2 * j:2 * j + 2], sums[2 * j + 1])
            except ObjectFormatError as exc:
                log.warning("lmcache plugin: %s/%s: %s; treated as a miss", self.settings.bucket,
                            r.okey, exc)
                self.metrics.add(corrupt=1)
                drop.append(r.okey)
            if got is not r.obj:
                r.obj.ref_count_down()
            if got is not None:
                self.metrics.add(hits=1, bytes_read=got.get_size())
            out.append(got)
        return out, drop

    def _check(self, client: Client, r: _Read, ns: list[int], errs: list,
               sums: list[int] | None) -> MemoryObj | None:
        """The MemoryObj holding ``r``'s verified bytes (``r.obj``, or a new one of the
        stored layout), or None for a missing key or an unreachable node.

        Raises:
            ObjectFormatError: the object is short, its header is bad or for another
                key, or the payload's checksum differs.
        """
        err = errs[0] or errs[1]
        if err is not None:
            if isinstance(err, NotFoundError) and not isinstance(err, NoSuchBucket) \
                    and errs[0] is not None:
                self.metrics.add(misses=1)
                return None
            if isinstance(err, InvalidRange):
                raise ObjectFormatError("the object is shorter than its header")
            self._failed(client, err)
            return None
        hl = len(r.hdr)
        if ns[0] != hl:
            raise ObjectFormatError(f"the object is {ns[0]} bytes, shorter than a header")
        h = ObjectHeader.unpack(r.hdr)
        if h.key != r.kstr:
            raise ObjectFormatError(f"the header is for key {h.key!r}")
        if h.header_len != hl or h.payload_len != ns[1]:
            raise ObjectFormatError(f"{ns[1]} payload bytes after {hl} header bytes; the header "
                                    f"says {h.payload_len} after {h.header_len}")
        payload = memoryview(r.obj.byte_array).cast("B")[:ns[1]]
        if sums and len(sums) == 1:
            digest = sums[0]
            self.metrics.add(node_digests=1)
        else:
            digest = payload_checksum(payload)
        if digest != h.checksum:
            raise ObjectFormatError(f"payload checksum {digest:#018x} != header {h.checksum:#018x}")
        if (h.fmt, h.shapes, h.dtypes) == _layout(r.obj) and h.payload_len == len(payload):
            return r.obj
        # Another layout (an unfull last chunk, with save_unfull_chunk): a MemoryObj of
        # the stored layout, the verified bytes copied over.
        try:
            fmt = MemoryFormat(h.fmt)
        except ValueError:
            raise ObjectFormatError(f"unknown LMCache memory format {h.fmt}") from None
        # check the declared layout before asking LMCache's allocator for it: a hostile
        # header must not make it evict its whole cache to fit an absurd size
        declared = sum(math.prod(s) * dt.itemsize for s, dt in zip(h.shapes, h.dtypes))
        if declared != h.payload_len or h.payload_len > self.full_chunk_size_bytes:
            raise ObjectFormatError(f"layout {h.shapes} {h.dtypes} is {declared} bytes, the payload "
                                    f"{h.payload_len} (a chunk holds at most {self.full_chunk_size_bytes})")
        new = self._allocate([torch.Size(s) for s in h.shapes], list(h.dtypes), fmt)
        if new is None:
            self.metrics.add(alloc_failures=1)
            return None
        if new.get_size() != h.payload_len:
            new.ref_count_down()
            raise ObjectFormatError(f"layout {h.shapes} {h.dtypes} is not {h.payload_len} bytes")
        _u8(new.byte_array)[:] = _u8(payload)
        return new

    def _drop(self, client: Client, okeys: list[str]) -> None:
        """Delete corrupt objects so the next put replaces them (best effort)."""
        for okey in okeys:
            try:
                client.delete(self.settings.bucket, okey)
            except (GpufeedError, OSError):
                return

    def _probe_start(self, client: Client, keys: Sequence[CacheEngineKey]):
        """Submit one batch read of the headers of ``keys``: ``(reads, future, errors)``."""
        reads = []
        for key in keys:
            kstr = key.to_string()
            reads.append((kstr, self._object_key(kstr), bytearray(self._header_len(kstr))))
        items = [(self.settings.bucket, okey, hdr, 0, len(hdr)) for _k, okey, hdr in reads]
        errs: list = []
        return reads, client.submit_get_many_into(items, errors_out=errs), errs

    def _probe_count(self, client: Client, reads: list, ns: list[int], errs: list) -> int:
        """How many leading reads of :meth:`_probe_start` found a valid header for their key."""
        for i, (kstr, _okey, hdr) in enumerate(reads):
            err = errs[i]
            if err is not None:
                if isinstance(err, NoSuchBucket) or not isinstance(err, (NotFoundError, InvalidRange)):
                    self._failed(client, err)
                return i
            try:
                if ns[i] != len(hdr) or ObjectHeader.unpack(hdr).key != kstr:
                    return i
            except ObjectFormatError:
                return i
        return len(reads)

    async def _probe(self, keys: Sequence[CacheEngineKey]) -> int:
        """How many leading ``keys`` have a valid header on the node (one batch read of
        the headers; the payload is checked when it is read). Never raises."""
        client = await self._anode()
        if client is None or not keys:
            return 0
        try:
            reads, fut, errs = self._probe_start(client, keys)
            ns = await asyncio.wrap_future(fut)
        except (GpufeedError, OSError) as exc:
            self._failed(client, exc)
            return 0
        return self._probe_count(client, reads, ns, errs)

    def _probe_sync(self, keys: Sequence[CacheEngineKey]) -> int:
        """:meth:`_probe`, blocking (any thread; never LMCache's event loop)."""
        client = self._node()
        if client is None or not keys:
            return 0
        try:
            reads, fut, errs = self._probe_start(client, keys)
            ns = fut.result()
        except (GpufeedError, OSError) as exc:
            self._failed(client, exc)
            return 0
        return self._probe_count(client, reads, ns, errs)

    # --- RemoteConnector: lookups --------------------------------------------------------
    async def exists(self, key: CacheEngineKey) -> bool:
        """Whether the node holds a valid header for ``key`` (one small read)."""
        return await self._probe([key]) == 1

    def exists_sync(self, key: CacheEngineKey) -> bool:
        """:meth:`exists` from a thread other than the event loop's."""
        return self._probe_sync([key]) == 1

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """Leading keys present (one batch read of their headers), from a thread
        other than the event loop's."""
        return self._probe_sync(keys)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        """Leading keys present (``pin`` is not supported by the node: objects may still
        be evicted before they are read, which the read then reports as a miss)."""
        return await self._probe(keys)

    # --- RemoteConnector: reads ----------------------------------------------------------
    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        """The verified MemoryObj of ``key`` (from LMCache's CPU allocator; the caller
        owns one reference), or None."""
        return (await self._read([key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """One MemoryObj or None per key, read in one round trip per batch."""
        return await self._read(keys)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str,
                                       keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """The MemoryObjs of the leading keys that were read whole; the ones after the
        first miss are released."""
        out: list[MemoryObj] = []
        ended = False
        for obj in await self._read(keys):
            ended = ended or obj is None
            if not ended:
                out.append(obj)
            elif obj is not None:
                obj.ref_count_down()
        return out

    # --- RemoteConnector: writes ---------------------------------------------------------
    def _encode(self, client: Client, key: CacheEngineKey, obj: MemoryObj) -> tuple[str, memoryview]:
        """``(object key, object bytes)`` of a MemoryObj, in memory from ``client.alloc``.

        Raises:
            ObjectFormatError: a MemoryObj the format cannot describe (no tensor dtype,
                more than 4 dims or 8 groups).
        """
        kstr = key.to_string()
        payload = memoryview(obj.byte_array).cast("B")
        fmt, shapes, dtypes = _layout(obj)
        h = ObjectHeader(fmt, shapes, dtypes, kstr, len(payload), payload_checksum(payload))
        hl = h.header_len
        buf = client.alloc(hl + len(payload))
        h.pack_into(buf[:hl])
        buf[hl:] = payload
        return self._object_key(kstr), buf

    async def _write(self, keys: Sequence[CacheEngineKey], objs: Sequence[MemoryObj]) -> None:
        """Write each object (pipelined); failures are counted and logged, never raised."""
        client = await self._anode()
        if client is None:
            self.metrics.add(put_errors=len(keys))
            return

        def encode_all():
            out = []
            for key, obj in zip(keys, objs):
                try:
                    out.append(self._encode(client, key, obj))
                except ObjectFormatError as exc:
                    log.warning("lmcache plugin: cannot store %s: %s", key.to_string(), exc)
                    self.metrics.add(put_errors=1)
            return out

        def encode_and_submit():
            # off the event loop: over TCP a put sends its payload inline (sendall)
            return [(buf, client.submit_put(self.settings.bucket, okey, buf))
                    for okey, buf in encode_all()]

        try:
            futs = await asyncio.to_thread(encode_and_submit)
        except (GpufeedError, OSError) as exc:
            self.metrics.add(put_errors=len(keys))
            self._failed(client, exc)
            return
        for buf, fut in futs:
            try:
                await asyncio.wrap_future(fut)
            except (GpufeedError, OSError) as exc:
                self.metrics.add(put_errors=1)
                self._failed(client, exc)
            else:
                self.metrics.add(puts=1, bytes_written=len(buf))

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (atomic on the node: whole or not at all).
        The caller keeps its reference (LMCache releases it after this returns)."""
        await self._write([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """Store every object, all puts in flight together."""
        await self._write(keys, memory_objs)

    def remove_sync(self, key: CacheEngineKey) -> bool:
        """Delete ``key``'s object; False when the node cannot be reached."""
        client = self._node()
        if client is None:
            return False
        try:
            client.delete(self.settings.bucket, self._object_key(key.to_string()))
            return True
        except (GpufeedError, OSError) as exc:
            self._failed(client, exc)
            return False

    # --- RemoteConnector: the rest -------------------------------------------------------
    async def list(self) -> list[str]:
        """Object keys under ``key_prefix`` with the prefix removed (hashed long keys
        show as ``h/<hex>``); empty while the node is down."""
        client = await self._anode()
        if client is None:
            return []
        prefix = self.settings.key_prefix
        try:
            entries = await asyncio.to_thread(lambda: list(client.list(self.settings.bucket, prefix)))
        except (GpufeedError, OSError) as exc:
            self._failed(client, exc)
            return []
        return [e.key[len(prefix):] for e in entries]

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """LMCache's health check: 0 when the node answers, 1 when it does not (the
        interface wants an error code)."""
        client = await self._anode()
        if client is None:
            return 1
        try:
            await asyncio.to_thread(client.bucket_stats, self.settings.bucket)
        except (GpufeedError, OSError) as exc:
            self._failed(client, exc)
            return 1
        return 0

    async def close(self) -> None:
        """Close the node connection. Idempotent."""
        await asyncio.to_thread(self._session.close)


class GpufeedConnectorAdapter(ConnectorAdapter):
    """LMCache ``ConnectorAdapter`` for plugin names ``gpufeed`` and ``gpufeed.<instance>``.

    Use it as ``class_name`` when LMCache talks to several gpufeed nodes (one
    ``remote_storage_plugins`` entry each): unlike ``DynamicConnectorAdapter``,
    it passes the instance name, so each connector reads its own settings.
    """

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return GpufeedConnector(context.loop, context.local_cpu_backend, context.config,
                                plugin_name=context.plugin_name)
