"""This process's async saves in flight, per checkpoint location: deletes and
loads there wait for them."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, wait

from ._format import Location

__all__ = ["track", "wait_for_saves"]

#: Async plain saves of this process not yet done, per location ``(node_url, bucket, prefix)``:
#: deletes there wait for them (a save skips chunks already stored, so deleting a step
#: while it runs could remove a chunk the new step is about to commit).
_inflight: dict[tuple[str, str, str], set[Future]] = {}
_inflight_lock = threading.Lock()


def track(key: tuple[str, str, str], fut: Future) -> None:
    with _inflight_lock:
        _inflight.setdefault(key, set()).add(fut)

    def done(f: Future) -> None:
        with _inflight_lock:
            pending = _inflight.get(key)
            if pending is not None:
                pending.discard(f)
                if not pending:
                    _inflight.pop(key, None)
    fut.add_done_callback(done)


def wait_for_saves(loc: Location) -> None:
    """Block until this process's async saves to ``loc`` are done (their errors stay
    in their Futures)."""
    if threading.current_thread().name.startswith("gpufeed-save"):
        return  # called from a save itself: waiting would deadlock
    with _inflight_lock:
        pending = list(_inflight.get((loc.node_url, loc.bucket, loc.prefix), ()))
    if pending:
        wait(pending)


def _after_fork_in_child() -> None:
    """A forked child inherits the table but not the saves."""
    _inflight.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
