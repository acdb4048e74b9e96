"""Batch reads on the shared-memory transport.

Destinations inside registered regions are written by the node directly.
Others are packed into staging slots, all of a batch's slots acquired at once
(no hold-and-wait), at most half the pool per batch. A destination larger than
a slot, or one that no longer fits in the batch's share of slots, is read on
the side (:meth:`ShmTransport.get_staged` on the transport's threads).

No callback ever blocks: a batch's slots are freed as soon as its reply is in,
without waiting for side reads, and the last part to finish (reply or side
read) assembles the result. Callbacks run on the thread that reads a
connection's replies (a waiting caller or the receiver thread), and a
callback that waited for another reply would wait for the very thread that
must read it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from ...errors import GpufeedError, ProtocolError, TransportError
from ...wire import protocol as p
from .._types import ReadRequest
from ._results import batch_result

if TYPE_CHECKING:
    from .._region import StagingPool
    from ._shm import ShmTransport

__all__ = ["submit_batch"]


class _Plan:
    """Where each item of a batch goes: ``items[i]`` (or ``None`` for a side read),
    the slots bins, and the staged items' offsets in the staging region."""

    def __init__(self, n: int) -> None:
        self.items: list[p.Get | None] = [None] * n
        self.bins: list[list[tuple[int, int]]] = []  # per slot: [(index, offset in slot)]
        self.side: list[int] = []                    # indexes read on the side
        self.staged: list[tuple[int, int]] = []      # (index, offset in the staging region)
        self.slots: list[int] = []
        self.pool: StagingPool | None = None


def _plan(t: ShmTransport, reqs: list[ReadRequest], dests: list[memoryview]) -> _Plan:
    """Place each item: in its region, packed into a staging slot, or on the side."""
    plan = _Plan(len(reqs))
    used = 0
    for i, (r, dest) in enumerate(zip(reqs, dests)):
        found = t.find_region(dest)
        if found is not None:
            region, off = found
            plan.items[i] = p.Get(r.bucket, r.key, r.offset, len(dest), region.region_id, off,
                                  r.digest, r.version_id, r.snapshot)
            continue
        if plan.pool is None:
            plan.pool = t.staging_pool()
        pool = plan.pool
        if len(dest) > pool.slot_bytes:
            plan.side.append(i)
            continue
        if not plan.bins or used + len(dest) > pool.slot_bytes:
            if len(plan.bins) >= max(1, pool.nslots // 2):
                plan.side.append(i)
                continue
            plan.bins.append([])
            used = 0
        plan.bins[-1].append((i, used))
        used += len(dest)
    return plan


def _stage(plan: _Plan, reqs: list[ReadRequest], dests: list[memoryview]) -> None:
    """Take the batch's slots (blocks until they are all free) and point the staged
    items at them."""
    pool = plan.pool
    if pool is None or not plan.bins:
        return
    plan.slots = pool.acquire_many(len(plan.bins))
    for slot, members in zip(plan.slots, plan.bins):
        for i, at in members:
            r = reqs[i]
            plan.items[i] = p.Get(r.bucket, r.key, r.offset, len(dests[i]), pool.region.region_id,
                                  slot + at, r.digest, r.version_id, r.snapshot)
            plan.staged.append((i, slot + at))


def submit_batch(t: ShmTransport, reqs: list[ReadRequest], dests: list[memoryview],
                 digests_out: list | None, errors_out: list | None) -> Future:
    """Start a batch read; the Future resolves to bytes per item (see
    ``Client.submit_get_many_into``)."""
    plan = _plan(t, reqs, dests)
    _stage(plan, reqs, dests)
    index = [i for i, it in enumerate(plan.items) if it is not None]
    batch = [it for it in plan.items if it is not None]
    try:
        fut = t.conn().request(p.Op.GETV, p.GetV(batch)) if batch else None
        side = [t.executor_submit(t.get_staged, reqs[i].bucket, reqs[i].key, dests[i],
                                  reqs[i].offset, reqs[i].version_id, reqs[i].snapshot) for i in plan.side]
    except BaseException:
        _release_slots(plan)
        raise
    batch_out: list = []  # [list of n] (or the exception) once the batch reply is in
    # The batch's part is done once its reply is copied out, not when the reply
    # arrives: a reply that lands while _when_all registers its callbacks would
    # otherwise let finish() run (in this thread) before the copy has filled batch_out.
    copied: Future | None = None
    if fut is not None:
        copied = Future()

        def on_reply(f: Future, copied: Future = copied) -> None:
            try:
                batch_out.append(_batch_done(f, plan, reqs, dests, index, digests_out, errors_out))
            finally:  # whatever happened, the batch's part is over: never leave finish() waiting
                copied.set_result(None)

        fut.add_done_callback(on_reply)

    def finish() -> list[int]:
        out = [0] * len(reqs)
        if fut is not None:
            if isinstance(batch_out[0], BaseException):
                raise batch_out[0]
            out = batch_out[0]
        for i, f in zip(plan.side, side):  # already done: finish runs after every part
            exc = f.exception()
            if (errors_out is not None and isinstance(exc, GpufeedError)
                    and not isinstance(exc, (TransportError, ProtocolError))):
                out[i], errors_out[i] = -1, exc
            else:
                out[i] = f.result()
        return out

    def release() -> None:
        # Break the closures' hold on the caller's buffers (futures keep their
        # callbacks), so pooled alloc() memory is reusable without a GC pass.
        reqs.clear()
        dests.clear()
        side.clear()
        batch_out.clear()
        plan.staged.clear()

    return _when_all(([copied] if copied is not None else []) + side, finish, release)


def _batch_done(f: Future, plan: _Plan, reqs: list[ReadRequest], dests: list[memoryview],
                index: list[int], digests_out: list | None, errors_out: list | None):
    """On the batch reply: copy staged bytes out and free the slots at once, before
    any side read is done (a batch never holds slots while it waits for anything
    else). Returns bytes per item, or the exception to raise."""
    try:
        reply = f.result()
        sub_errors: list | None = [] if errors_out is not None else None
        sub = batch_result([reqs[i] for i in index], reply, sub_errors)
        out = [0] * len(reqs)
        for j, i in enumerate(index):
            out[i] = sub[j]
            if sub_errors and errors_out is not None:
                errors_out[i] = sub_errors[j]
        for i, at in plan.staged:
            n = out[i]
            if n > 0 and plan.pool is not None:
                dests[i][:n] = plan.pool.region.view(at, n)
        if digests_out is not None:
            for j, sums in reply.digests.items():
                digests_out[index[j]] = sums
        return out
    except BaseException as exc:
        return exc
    finally:
        _release_slots(plan)


def _release_slots(plan: _Plan) -> None:
    if plan.pool is not None:
        for slot in plan.slots:
            plan.pool.release(slot)


def _when_all(parts: list[Future], finish, release) -> Future:
    """A Future of ``finish()`` once every part is done (``release()`` runs after
    ``finish`` either way). Never blocks a completing thread."""
    result: Future = Future()
    if not parts:
        release()
        result.set_result([])
        return result
    remaining = [len(parts)]
    lock = threading.Lock()

    def part_done(_f: Future) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        try:
            value, error = finish(), None
        except BaseException as exc:
            value, error = None, exc
        release()
        parts.clear()
        if error is None:
            result.set_result(value)
        else:
            result.set_exception(error)

    for f in list(parts):
        f.add_done_callback(part_done)
    return result
