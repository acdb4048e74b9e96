"""The plain API: :func:`save` a nested state dict as one step, :func:`load` it back."""

from __future__ import annotations

import io
import itertools
import os
import pickle
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...client import Client
from ._chunks import ChunkRead, read_chunks
from ._format import (
    DEFAULT_CHUNK_BYTES,
    CheckpointError,
    CorruptCheckpoint,
    Entry,
    Location,
    check_step,
    dtype_of,
    parse_checkpoint_url,
    tensor_bytes,
)
from ._inflight import track, wait_for_saves
from ._staging import keep_staging, stage_flat
from ._steps import Checkpoints

if TYPE_CHECKING:
    import torch

__all__ = ["SaveResult", "save", "load", "read_entries", "SKELETON_KEY"]

#: Flat key under which :func:`save` stores the pickled skeleton of the state dict.
SKELETON_KEY = "__gpufeed_skeleton__"

# --- the plain API -------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorRef:
    """Stands for a tensor inside the pickled skeleton of a :func:`save`'d state dict."""

    key: str


@dataclass(frozen=True)
class SaveResult:
    """What a save did.

    Attributes:
        step: the committed step.
        bytes_total: bytes of every tensor and object of the state dict.
        bytes_written: bytes of chunks the node lacked and that were written.
        seconds: wall time of the save, staging excluded.
    """

    step: int
    bytes_total: int
    bytes_written: int
    seconds: float


def _flatten(state_dict) -> tuple[dict[str, object], bytes]:
    """Tensors of a nested structure as a flat dict, plus the pickled rest
    (tensors replaced by :class:`TensorRef`). A tensor met twice is stored once."""
    import torch

    flat: dict[str, object] = {}
    seen: dict[int, str] = {}

    def walk(obj, path: str):
        if isinstance(obj, torch.Tensor):
            if id(obj) in seen:
                return TensorRef(seen[id(obj)])
            key = path or "_"
            if key in flat or key == SKELETON_KEY:
                key = next(f"{key}#{i}" for i in itertools.count(1) if f"{key}#{i}" not in flat)
            flat[key] = obj
            seen[id(obj)] = key
            return TensorRef(key)
        if isinstance(obj, dict):
            out = type(obj)() if type(obj) is not dict else {}
            for k, v in obj.items():
                out[k] = walk(v, f"{path}.{k}" if path else str(k))
            return out
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            items = [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return obj

    skeleton = walk(state_dict, "")
    return flat, pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)


def _restore(skeleton, tensors: Mapping[str, object]):
    if isinstance(skeleton, TensorRef):
        return tensors[skeleton.key]
    if isinstance(skeleton, dict):
        out = type(skeleton)() if type(skeleton) is not dict else {}
        for k, v in skeleton.items():
            out[k] = _restore(v, tensors)
        return out
    if type(skeleton) in (list, tuple):
        items = [_restore(v, tensors) for v in skeleton]
        return items if isinstance(skeleton, list) else tuple(items)
    return skeleton

_save_pool: ThreadPoolExecutor | None = None
_save_pool_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child inherits the save thread's queue but not the thread."""
    global _save_pool
    _save_pool = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _background() -> ThreadPoolExecutor:
    """One thread: plain saves of a process commit in the order they were asked."""
    global _save_pool
    with _save_pool_lock:
        if _save_pool is None:
            _save_pool = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-save")
        return _save_pool


def save(state_dict, url: str | Location, *, step: int | None = None, async_: bool = True,
         client: Client | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
         overwrite: bool = True, reuse_staging: bool = True) -> Future:
    """Save a nested state dict as one checkpoint step; no process group needed.

    Tensors (any dtype, CPU or CUDA) anywhere inside dicts, lists and tuples
    are stored as content-addressed chunks; every other value (ints, floats,
    strings, optimizer ``param_groups``) is pickled with the structure, so
    :func:`load` gives back the same structure, integer keys included. Only
    chunks the node lacks are written. The step is stored through
    :class:`gpufeed.ai.dcp.Writer`, so ``dcp.load`` can read it too (flat keys).

    With ``async_=True`` the tensors are first copied to CPU memory (the call
    blocks for that copy only) and the upload runs in a background thread; saves
    from one process commit in call order. The copy goes into the buffers of the
    previous async save to the same URL when that save is done and the tensors
    have the same names, shapes and dtypes (``reuse_staging``): such saves block
    for one memcpy of the state dict into memory already touched.

    Args:
        state_dict: e.g. ``{"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}``.
        url: ``gpufeed+tcp://HOST:PORT/BUCKET/PREFIX`` (see :func:`parse_checkpoint_url`).
        step: the step number (>= 0); default: the latest committed step + 1.
        async_: return before the upload finishes.
        client: an open :class:`Client` to use.
        chunk_bytes: chunk size for large tensors, bytes.
        overwrite: replace an existing step of the same number.
        reuse_staging: keep this save's CPU copy for the next async save to the same
            URL (costs one state dict of host memory while kept; ``False`` frees it).

    Returns:
        A ``Future`` resolving to a :class:`SaveResult` once the step is committed
        (already resolved when ``async_`` is False).

    Raises:
        InvalidArgument: a bad URL or step. Storage errors surface from the Future.
    """
    import torch

    check_step(step)
    loc = url if isinstance(url, Location) else parse_checkpoint_url(url)
    flat, skeleton = _flatten(state_dict)
    staged = None
    if async_:
        flat = staged = stage_flat(flat, loc, reuse_staging)
        flat = dict(flat)
    flat[SKELETON_KEY] = skeleton

    def run() -> SaveResult:
        # imported here: on an async save, torch.distributed.checkpoint's first import
        # (1-2 s) happens on the save thread, not in the caller's training step
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict_saver import _save_state_dict

        from ._dcp import Writer

        writer = Writer(loc, step=step, client=client, chunk_bytes=chunk_bytes, overwrite=overwrite)
        t0 = time.perf_counter()
        try:
            # the private entry point skips dcp.save's "assuming a single process" warning
            with torch.no_grad():
                _save_state_dict(flat, storage_writer=writer, no_dist=True)
        except CheckpointException as exc:
            raise _unwrap(exc) from exc
        res = writer.result
        assert res is not None and res.step is not None  # finish() ran: the step is committed
        return SaveResult(res.step, res.bytes_total, res.bytes_written, time.perf_counter() - t0)

    if async_:
        fut = _background().submit(run)
        track((loc.node_url, loc.bucket, loc.prefix), fut)
        if reuse_staging and staged is not None:
            keep_staging(loc, staged, fut)
        return fut
    done: Future = Future()
    done.set_result(run())
    return done


def _unwrap(exc) -> BaseException:
    """The first rank's own error out of DCP's ``CheckpointException``."""
    for failure in exc.failures.values():
        err = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(err, BaseException):
            return err
    return CheckpointError(str(exc))


def load(url: str | Location, *, step: int | None = None, device="cpu", client: Client | None = None,
         verify: bool = True):
    """Load a step saved by :func:`save` (or by ``dcp.save`` with a :class:`gpufeed.ai.dcp.Writer`).

    Each tensor is allocated once and its chunks are read straight into its
    memory, then checked against their BLAKE3 names.

    Args:
        url: checkpoint URL.
        step: the step; default the latest committed one. This process's async
            saves to the same location are waited for first (read your writes).
        device: where tensors go (``"cpu"``, ``"cuda:0"``); read on CPU, then moved.
        client: an open :class:`Client` to use.
        verify: check every chunk's BLAKE3 (sizes are always checked).

    Returns:
        The state dict as saved (for ``dcp.save`` checkpoints: nested as the
        DCP planner recorded it, with ``str`` keys).

    Raises:
        CheckpointNotFound: no committed step (or not ``step``).
        MissingChunk: a chunk named by the manifest is gone (names key and tensor).
        CorruptCheckpoint: a chunk's size or hash is wrong, or the manifest is damaged.
    """
    import torch

    ck = Checkpoints(url, client=client)
    check_step(step)
    wait_for_saves(ck.loc)  # read your own writes: this process's async saves land first
    man = ck.manifest(step)
    tensors, objects = read_entries(ck.client, ck.loc, man.entries, verify=verify)
    if device is not None and torch.device(device).type != "cpu":
        tensors = {k: v.to(device) for k, v in tensors.items()}
    if SKELETON_KEY in objects:
        return _restore(pickle.loads(objects.pop(SKELETON_KEY)), tensors)
    from torch.distributed.checkpoint._traverse import set_element

    out: dict = {}
    for fqn, value in itertools.chain(tensors.items(), objects.items()):
        set_element(out, tuple(man.nesting.get(fqn, [fqn])), value)
    return out


def read_entries(client: Client, loc: Location, entries: Sequence[Entry], *,
                 verify: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read manifest entries: whole tensors (pieces of sharded ones stitched
    together) and unpickled objects. Returns ``(tensors, objects)`` by fqn."""
    import torch

    tensors: dict[str, torch.Tensor] = {}
    reads: list[ChunkRead] = []
    copies: list[tuple[torch.Tensor, torch.Tensor, Entry]] = []
    byte_bufs: dict[str, bytearray] = {}
    for e in entries:
        where = f"{loc}: tensor {e.fqn!r}"
        if e.kind == "bytes":
            buf = byte_bufs[e.fqn] = bytearray(e.nbytes)
            _plan(reads, e, memoryview(buf), where)
            continue
        if e.kind != "tensor":
            raise CorruptCheckpoint(f"{where}: unknown entry kind {e.kind!r}")
        dt = dtype_of(e.dtype, where)
        whole = tensors.get(e.fqn)
        if whole is None:
            whole = tensors[e.fqn] = torch.empty(e.shape, dtype=dt)
        view = whole
        for d, (o, n) in enumerate(zip(e.offsets, e.lengths)):
            view = view.narrow(d, o, n)
        if view.is_contiguous():
            _plan(reads, e, tensor_bytes(view)[0], where)
        else:
            tmp = torch.empty(e.lengths, dtype=dt)
            _plan(reads, e, tensor_bytes(tmp)[0], where)
            copies.append((view, tmp, e))
    read_chunks(client, loc, reads, verify=verify)
    for view, tmp, _e in copies:
        view.copy_(tmp)
    objects = {k: torch.load(io.BytesIO(v), weights_only=False) for k, v in byte_bufs.items()}
    return tensors, objects


def _plan(reads: list[ChunkRead], e: Entry, dest: memoryview, where: str) -> None:
    if sum(c.size for c in e.chunks) != len(dest) or e.nbytes != len(dest):
        raise CorruptCheckpoint(f"{where}: chunks hold {sum(c.size for c in e.chunks)} bytes, "
                                f"the entry needs {len(dest)}", fqn=e.fqn)
    pos = 0
    for c in e.chunks:
        reads.append(ChunkRead(c, dest[pos:pos + c.size], e.fqn))
        pos += c.size
