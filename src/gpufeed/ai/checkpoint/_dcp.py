"""The ``torch.distributed.checkpoint`` Writer and Reader, public as
:mod:`gpufeed.ai.dcp` (usage there). Per-save state lives in a thread-local
(:class:`_Save`), staging buffers are lent to one save at a time
(:class:`_Staged`).

Source followed: ``torch/distributed/checkpoint/storage.py`` and
``filesystem.py`` (torch 2.13), the StorageWriter/StorageReader contract.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import pickle
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    Metadata,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import (
    StorageReader,
    StorageWriter,
    WriteResult,
)
from torch.futures import Future

from ...client import Client
from ...errors import InvalidArgument
from ._chunks import ChunkRead, ChunkUploader, read_chunks
from ._format import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_WORKERS,
    FORMAT,
    FORMAT_VERSION,
    CheckpointError,
    Chunk,
    CorruptCheckpoint,
    Entry,
    Location,
    Manifest,
    check_step,
    dtype_name,
    dtype_of,
    parse_checkpoint_url,
    tensor_bytes,
)
from ._session import open_location
from ._staging import NotPlainTensor, StagingMismatch, fast_copy, populate_tensors
from ._steps import Checkpoints

__all__ = ["Writer", "Reader", "WriteStats"]

#: Tensors resolved ahead of their uploads finishing, in bytes (bounds the
#: memory of GPU -> CPU copies while many puts are in flight).
_WINDOW_BYTES = 1 << 30  # 1 GiB


def _checkpoint_id(checkpoint_id, loc: Location) -> tuple[Location, int | None]:
    """``reset(checkpoint_id)``: an int (or digits) names the step; a URL the location."""
    if checkpoint_id is None:
        return loc, None
    if type(checkpoint_id) is int or (isinstance(checkpoint_id, str) and checkpoint_id.isdigit()):
        check_step(int(checkpoint_id))
        return loc, int(checkpoint_id)
    if isinstance(checkpoint_id, str) and checkpoint_id.startswith("gpufeed+"):
        return parse_checkpoint_url(checkpoint_id), None
    raise InvalidArgument(f"checkpoint_id {checkpoint_id!r}: give a step number or a gpufeed+ URL")


class WriteStats:
    """What the last save did: ``step`` (coordinator: the committed step), and
    ``bytes_total`` / ``bytes_written`` over all ranks (coordinator) or this rank."""

    def __init__(self, step: int | None, bytes_total: int, bytes_written: int) -> None:
        self.step, self.bytes_total, self.bytes_written = step, bytes_total, bytes_written

    def __repr__(self) -> str:
        return f"WriteStats(step={self.step}, bytes_total={self.bytes_total}, bytes_written={self.bytes_written})"


class _Located:
    """What Writer and Reader share: a checkpoint location, a lazily opened
    client (not pickled: DCP may ship the object to other processes) and the
    ``checkpoint_id`` / ``reset`` bookkeeping."""

    loc: Location
    step: int | None
    _client: Client | None
    _unpicklable: tuple[str, ...] = ("_client",)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in self._unpicklable:
            state[name] = None
        return state

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = open_location(self.loc, None, None, None)[1]
        return self._client

    @property
    def checkpoint_id(self) -> str:
        return str(self.loc) if self.step is None else f"{self.loc}@{self.step}"

    def _reset_location(self, checkpoint_id) -> None:
        loc, step = _checkpoint_id(checkpoint_id, self.loc)
        if loc is not self.loc:
            self.loc, self._client = loc, None
        if step is not None:
            self.step = step


@dataclasses.dataclass
class _Save:
    """The state of one save through a :class:`Writer`: DCP runs every call of a
    save (``reset`` .. ``finish``) on one thread, and ``dcp.async_save`` runs
    overlapping saves on different threads, so this lives in a thread-local."""

    loc: Location
    step: int | None
    client: Client | None
    save_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    is_coordinator: bool = True
    rank: int = 0
    reserved: int | None = None  # the step this save's coordinator claimed

    def get_client(self) -> Client:
        if self.client is None:
            self.client = open_location(self.loc, None, None, None)[1]
        return self.client


class _Staged:
    """One set of CPU staging buffers of :meth:`Writer.stage`, and who holds it.

    A set is lent to one save at a time: from :meth:`Writer.stage` until that
    save's ``write_data`` has put every chunk (or the staged state dict is
    garbage, when the save failed before writing). A stage while every kept set
    is lent copies into new memory, so an upload never reads bytes that a later
    stage is writing."""

    def __init__(self, state: dict) -> None:
        self.state = state
        self.ptrs = frozenset(_storage_ptrs(state))
        self.holder: object | None = None  # a token: the claim that holds it


def _storage_ptrs(obj) -> Iterator[int]:
    """Data pointers of the storages of every tensor inside ``obj``."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu" and obj.numel():
            yield obj.untyped_storage().data_ptr()
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _storage_ptrs(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _storage_ptrs(v)


class Writer(_Located, StorageWriter, AsyncStager):
    """A DCP ``StorageWriter`` that stores a step as content-addressed chunks.

    One Writer may serve overlapping saves (``dcp.async_save`` twice before the
    first finishes): each save keeps its own step, location and save id, each
    step is committed with its own values, and staging buffers are never
    shared between two saves in flight.

    Args:
        url: ``gpufeed+tcp://HOST:PORT/BUCKET/PREFIX`` or
            ``gpufeed+shm:///path/gpufeed.sock/BUCKET/PREFIX``.
        step: the step number; ``checkpoint_id=`` of ``dcp.save`` (an int) overrides
            it for that save; default: the latest committed step + 1, chosen by the
            coordinator (overlapping saves of one Writer get different steps).
        client: an open :class:`gpufeed.client.Client` (default: one pooled per process).
        bucket, prefix: override the URL's.
        chunk_bytes: large tensors are cut into chunks of this many bytes.
        workers: hashing/sending threads per rank.
        overwrite: replace an existing step of the same number (else ``CheckpointError``).
        cache_staged_state_dict: for ``dcp.async_save``: keep the CPU staging copy
            between saves so staging is one memcpy into touched pages (costs one
            state dict of host memory, two while saves overlap; reuse the same Writer).
        background_staging: for ``dcp.async_save``: copy in a background thread;
            :meth:`stage` returns a ``concurrent.futures.Future`` and ``async_save``
            returns at once with an ``AsyncSaveResponse`` (torch >= 2.9's DCP; on
            older DCP staging stays blocking). The caller must wait for
            ``response.staging_completion.result()`` (or :meth:`synchronize_staging`)
            before mutating the state dict (``optimizer.step()``), and for
            ``response.upload_completion`` for the save itself. Off by default:
            ``async_save`` then returns a plain Future as before.

    Raises:
        InvalidArgument: a malformed URL.
    """

    _synchronize_after_execute: bool = False  # async_save must not wait: the caller does
    #: Staging buffer sets kept between saves (more are made, and dropped, while all are lent).
    _KEEP_STAGED = 2

    def __init__(self, url: str | Location, *, step: int | None = None, client: Client | None = None,
                 bucket: str | None = None, prefix: str | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, workers: int = DEFAULT_WORKERS,
                 overwrite: bool = True, cache_staged_state_dict: bool = True,
                 background_staging: bool = False) -> None:
        check_step(step)
        self.loc = url if isinstance(url, Location) else parse_checkpoint_url(url, bucket=bucket, prefix=prefix)
        self._client = client
        self.step = step
        self.chunk_bytes, self.workers, self.overwrite = chunk_bytes, workers, overwrite
        self.cache_staged_state_dict = cache_staged_state_dict
        self.background_staging = background_staging and _dcp_accepts_staging_future()
        self._init_runtime()
        self._last_result: WriteStats | None = None

    def _init_runtime(self) -> None:
        """Locks, thread-locals and caches: made anew after unpickling."""
        self._staged: list[_Staged] = []
        self._stage_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stage_future: concurrent.futures.Future | None = None
        self._stage_lock = threading.Lock()
        self._lock = threading.Lock()  # staged-set claims, step reservations, the base location
        self._claim_lock = threading.Lock()  # one step choice at a time (it reads the node)
        self._reserved_steps: set[int] = set()
        self._tls = threading.local()

    # pickling (async_save with a process executor) drops the connection and the caches
    _unpicklable = ("_client", "_staged", "_stage_executor", "_stage_future", "_stage_lock", "_lock", "_claim_lock",
                    "_reserved_steps", "_tls")

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # --- per-save state ----------------------------------------------------------------------
    def _save(self) -> _Save:
        """This thread's save (``reset`` starts one; a save DCP did not reset uses the defaults)."""
        cur = getattr(self._tls, "save", None)
        if cur is None:
            cur = self._tls.save = _Save(self.loc, self.step, self._client)
        return cur

    @property
    def save_id(self) -> str:
        return self._save().save_id

    @property
    def result(self) -> WriteStats | None:
        """What the save finished last on this thread did, else the last save finished
        on any thread (``None`` before the first)."""
        mine = getattr(self._tls, "result", None)
        return mine if mine is not None else self._last_result

    def _finished(self, stats: WriteStats) -> None:
        self._tls.result = stats
        self._last_result = stats

    # --- StorageWriter ---------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | int | None = None) -> None:
        """Start a save: an int ``checkpoint_id`` names its step, a URL its location
        (kept for later saves, as DCP's file writers keep a path)."""
        loc, step = _checkpoint_id(checkpoint_id, self.loc)
        with self._lock:
            if loc is not self.loc:
                self.loc, self._client = loc, None
        self._tls.save = _Save(loc, step if step is not None else self.step,
                               self._client if loc is self.loc else None)
        self._tls.result = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        cur = self._save()
        cur.is_coordinator = is_coordinator
        cur.rank = kwargs.get("rank") or 0

    @property
    def is_coordinator(self) -> bool:
        return self._save().is_coordinator

    @property
    def rank(self) -> int:
        return self._save().rank

    def storage_meta(self) -> StorageMeta | None:
        cur = self._save()
        cid = str(cur.loc) if cur.step is None else f"{cur.loc}@{cur.step}"
        return StorageMeta(checkpoint_id=cid, save_id=cur.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Hash and put every item's bytes; the returned Future is already complete.
        Staging buffers this save was lent are given back once every chunk is put."""
        cur = self._save()
        up = ChunkUploader(cur.get_client(), cur.loc, chunk_bytes=self.chunk_bytes, workers=self.workers)
        results: list[WriteResult] = []
        window: deque = deque()
        window_bytes = 0
        lent: set[_Staged] = set()

        def drain_one() -> None:
            nonlocal window_bytes
            item, info, mv, futs, _owner = window.popleft()
            chunks, written = up.collect(futs)
            window_bytes -= len(mv)
            info.update(chunks=[[c.hash, c.size] for c in chunks], nbytes=len(mv), written=written)
            results.append(WriteResult(index=item.index, size_in_bytes=len(mv), storage_data=info))

        try:
            for item in plan.items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    assert isinstance(data, io.BytesIO)
                    mv, owner = data.getbuffer(), data
                    info: dict = {"kind": "bytes"}
                    window.append((item, info, memoryview(mv), up.submit(memoryview(mv)), owner))
                else:
                    td = item.tensor_data
                    assert td is not None and isinstance(data, torch.Tensor)
                    lent.update(self._lent_for(data))
                    tmv, towner = tensor_bytes(data)
                    info = {"kind": "tensor", "dtype": dtype_name(td.properties.dtype),
                            "lengths": list(td.chunk.sizes)}
                    window.append((item, info, tmv, up.submit(tmv), towner))
                window_bytes += len(window[-1][2])
                while window_bytes > _WINDOW_BYTES and len(window) > 1:
                    drain_one()
            while window:
                drain_one()
        finally:
            up.close()  # waits for every hash; puts were awaited by drain_one (or failed)
            window.clear()
            self._give_back(lent)
        stats = WriteStats(None, up.stats.bytes_total, up.stats.bytes_written)
        if not cur.is_coordinator:
            self._finished(stats)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator: write the manifest, then the commit marker (the step appears)."""
        cur = self._save()
        entries: list[Entry] = []
        storage: dict = {}
        total = written = 0
        for rank_results in results:
            for wr in rank_results:
                sd = wr.storage_data
                storage[wr.index] = sd
                chunks = [Chunk(h, n) for h, n in sd["chunks"]]
                total += sd["nbytes"]
                written += sd["written"]
                md = metadata.state_dict_metadata[wr.index.fqn]
                if isinstance(md, TensorStorageMetadata):
                    offsets = list(wr.index.offset) if wr.index.offset is not None else [0] * len(md.size)
                    entries.append(Entry(wr.index.fqn, "tensor", sd["nbytes"], chunks, dtype=sd["dtype"],
                                         shape=list(md.size), offsets=offsets, lengths=sd["lengths"]))
                else:
                    entries.append(Entry(wr.index.fqn, "bytes", sd["nbytes"], chunks))
        ck = Checkpoints(cur.loc, client=cur.get_client())
        step = self._claim_step(cur, ck)
        try:
            try:
                from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

                metadata.version = CURRENT_DCP_VERSION
            except ImportError:  # pragma: no cover - older torch
                pass
            metadata.storage_data = storage
            metadata.storage_meta = StorageMeta(checkpoint_id=f"{cur.loc}@{step}", save_id=cur.save_id)
            nesting = {}
            if isinstance(metadata.planner_data, dict):
                nesting = {k: list(v) for k, v in metadata.planner_data.items()
                           if isinstance(v, (tuple, list))}
            man = Manifest(FORMAT, FORMAT_VERSION, step, "blake3", self.chunk_bytes, time.time(),
                           len(results), entries, total, written, nesting,
                           pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL))
            ck.commit(man, overwrite=self.overwrite)
        finally:
            with self._lock:
                self._reserved_steps.discard(step)
        self._finished(WriteStats(step, total, written))

    def _claim_step(self, cur: _Save, ck: Checkpoints) -> int:
        """The step this save commits: its own, else one past the latest committed
        step and past every step other saves of this Writer are committing now.

        The latest step is read under the claim lock: a save that reads it while
        another holds a claim sees that claim, and one that reads it after the
        claim was given back (in ``finish``, after its commit) sees the commit."""
        with self._claim_lock:
            step = cur.step
            if step is None:
                latest = ck.latest()
                with self._lock:
                    step = max([-1 if latest is None else latest, *self._reserved_steps]) + 1
            with self._lock:
                self._reserved_steps.add(step)
        return step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, str) and checkpoint_id.startswith(("gpufeed+tcp://", "gpufeed+shm://",
                                                                             "gpufeed+cluster://"))

    # --- AsyncStager -----------------------------------------------------------------------
    def stage(self, state_dict):
        """A CPU copy of ``state_dict`` for ``dcp.async_save`` (pinned when CUDA exists).

        Blocking by default; with ``background_staging`` a ``concurrent.futures.Future``
        of the copy (DCP then uploads once it resolves). The copy goes into kept
        buffers that no save in flight is reading, else into new memory."""
        if not self.background_staging:
            return self._stage(state_dict)
        with self._stage_lock:
            if self._stage_future is not None:  # one copy at a time
                concurrent.futures.wait([self._stage_future])  # its error went to its own caller
            if self._stage_executor is None:
                self._stage_executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="gpufeed-dcp-stage")
            self._stage_future = self._stage_executor.submit(self._stage, state_dict)
            return self._stage_future

    def _stage(self, state_dict):
        # torch's own stagers use these helpers; they copy DTensor/ShardedTensor correctly
        from torch.distributed._state_dict_utils import (
            _copy_state_dict,
            _create_cpu_state_dict,
        )

        pin = torch.cuda.is_available()
        token = object()
        staged = self._claim_staged(token) if self.cache_staged_state_dict else None
        for _attempt in range(2):
            if staged is None:
                fresh = _create_cpu_state_dict(state_dict, pin_memory=pin)
                populate_tensors(fresh)  # fault pages in on all cores before the copy
                staged = _Staged(fresh)
                staged.holder = token
                if self.cache_staged_state_dict:
                    self._keep_staged(staged)
            try:
                out = fast_copy(state_dict, staged.state)
                break
            except StagingMismatch:
                self._drop_staged(staged)  # the state dict changed shape: stage into new buffers
                staged = None
            except NotPlainTensor:
                out = _copy_state_dict(state_dict, staged.state)
                break
        else:  # pragma: no cover - a fresh copy always matches
            raise CheckpointError("staging buffers do not fit the state dict")
        # a save that fails before writing gives the buffers back when its copy is garbage
        holder = _StagedDict(out) if type(out) is dict else out
        weakref.finalize(holder, self._release, staged, token)
        return holder

    def _claim_staged(self, token: object) -> _Staged | None:
        with self._lock:
            for st in self._staged:
                if st.holder is None:
                    st.holder = token
                    return st
        return None

    def _keep_staged(self, staged: _Staged) -> None:
        with self._lock:
            if len(self._staged) < self._KEEP_STAGED:
                self._staged.append(staged)

    def _drop_staged(self, staged: _Staged) -> None:
        with self._lock:
            if staged in self._staged:
                self._staged.remove(staged)

    @staticmethod
    def _release(staged: _Staged, token: object) -> None:
        if staged.holder is token:
            staged.holder = None

    def _lent_for(self, tensor) -> list[_Staged]:
        """The lent staging sets ``tensor`` lives in."""
        if not self._staged or not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return []
        ptr = tensor.untyped_storage().data_ptr()
        with self._lock:
            return [st for st in self._staged if st.holder is not None and ptr in st.ptrs]

    def _give_back(self, lent: set[_Staged]) -> None:
        with self._lock:
            for st in lent:
                st.holder = None

    def synchronize_staging(self) -> None:
        """Wait until the last :meth:`stage` copy is complete (at once when staging
        blocks); re-raises its error."""
        fut = self._stage_future
        if fut is not None:
            fut.result()

    def close(self) -> None:
        ex, self._stage_executor = self._stage_executor, None
        if ex is not None:
            ex.shutdown(wait=True)
        self._stage_future = None
        with self._lock:
            self._staged = []


class _StagedDict(dict):
    """A staged state dict (a ``dict`` that can be weakly referenced)."""

    __slots__ = ("__weakref__",)


def _dcp_accepts_staging_future() -> bool:
    """Whether this torch's ``dcp.async_save`` takes a Future from ``stage()``."""
    try:
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse  # noqa: F401
    except ImportError:  # pragma: no cover - older torch
        return False
    return True


class Reader(_Located, StorageReader):
    """A DCP ``StorageReader`` for steps written by :class:`Writer` (or ``gpufeed.ai.save``).

    Args:
        url: as for :class:`Writer`.
        step: the step to read; ``checkpoint_id=`` (an int) overrides it; default
            the latest committed step at :meth:`read_metadata`.
        client, bucket, prefix: as for :class:`Writer`.
        verify: check every chunk's BLAKE3 after reading (sizes are always checked).

    Raises (from ``dcp.load``, wrapped by DCP in ``CheckpointException`` on a process group):
        CheckpointNotFound: no committed step.
        MissingChunk: a chunk named by the manifest is gone (names key and tensor).
        CorruptCheckpoint: a size or hash differs.
    """

    def __init__(self, url: str | Location, *, step: int | None = None, client: Client | None = None,
                 bucket: str | None = None, prefix: str | None = None, verify: bool = True) -> None:
        check_step(step)
        self.loc = url if isinstance(url, Location) else parse_checkpoint_url(url, bucket=bucket, prefix=prefix)
        self._client = client
        self.step = step
        self.verify = verify
        self.storage_data: dict = {}
        self.manifest: Manifest | None = None
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id: str | os.PathLike | int | None = None) -> None:
        self._reset_location(checkpoint_id)
        self.storage_data = {}
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        ck = Checkpoints(self.loc, client=self.client)
        man = ck.manifest(self.step)
        self.manifest = man
        try:
            metadata = pickle.loads(man.dcp_metadata)
        except Exception as exc:
            raise CorruptCheckpoint(f"{ck.loc.step_key(man.step, 'manifest')}: DCP metadata does not "
                                    f"unpickle: {exc}") from exc
        if not isinstance(metadata, Metadata):
            raise CorruptCheckpoint(f"{ck.loc.step_key(man.step, 'manifest')}: no DCP metadata "
                                    f"(saved by gpufeed.ai.save? use gpufeed.ai.load)")
        meta = metadata.storage_meta
        if meta is None:
            meta = metadata.storage_meta = StorageMeta()
        meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise CorruptCheckpoint(f"{self.loc}: DCP metadata without storage_data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        # the step this rank resolved, for the coordinator to compare: with the
        # default step each rank finds "latest" itself, and a save that commits
        # between two ranks' reads would otherwise mix two steps in one load
        step = self.manifest.step if self.manifest is not None else None
        return dataclasses.replace(plan, storage_data=step)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        steps = {p.storage_data for p in plans}
        if len(steps) > 1:
            raise CheckpointError(f"{self.loc}: ranks resolved different steps {sorted(steps)} "
                                  f"(a save committed during the load); load again, or pass "
                                  f"step= (or checkpoint_id=) to pin one")
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read every item's chunks straight into its destination tensor (through a
        temporary only when resharding, a dtype change or a non-CPU target needs one)."""
        reads: list[ChunkRead] = []
        after: list[tuple] = []
        for item in plan.items:
            sd = self.storage_data[item.storage_index]
            fqn = item.storage_index.fqn
            chunks = [Chunk(h, n) for h, n in sd["chunks"]]
            if item.type == LoadItemType.BYTE_IO:
                buf = bytearray(sd["nbytes"])
                dest = memoryview(buf)
                after.append((item, buf, None, None))
            else:
                dt = dtype_of(sd["dtype"], f"{self.loc}: tensor {fqn!r}")
                target = planner.resolve_tensor(item).detach()
                whole = (all(o == 0 for o in item.storage_offsets)
                         and list(item.lengths) == list(sd["lengths"]))
                if (whole and target.device.type == "cpu" and target.dtype == dt
                        and target.is_contiguous() and list(target.shape) == list(sd["lengths"])):
                    dest = tensor_bytes(target)[0]
                    after.append((item, None, target, None))
                else:
                    tmp = torch.empty(sd["lengths"], dtype=dt)
                    dest = tensor_bytes(tmp)[0]
                    after.append((item, None, target, tmp))
            if sum(c.size for c in chunks) != len(dest):
                raise CorruptCheckpoint(f"{self.loc}: tensor {fqn!r}: chunks hold "
                                        f"{sum(c.size for c in chunks)} bytes, it needs {len(dest)}")
            pos = 0
            for c in chunks:
                reads.append(ChunkRead(c, dest[pos:pos + c.size], fqn))
                pos += c.size
        read_chunks(self.client, self.loc, reads, verify=self.verify)
        for item, buf, target, tmp in after:
            if buf is not None:
                planner.load_bytes(item, io.BytesIO(buf))
                continue
            if tmp is not None:
                src = tmp
                for d, (o, n) in enumerate(zip(item.storage_offsets, item.lengths)):
                    src = src.narrow(d, o, n)
                target.copy_(src)
            planner.commit_tensor(item, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return Writer.validate_checkpoint_id(checkpoint_id)
