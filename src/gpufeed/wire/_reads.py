"""Running the engine's checked read steps for the fast path, fast: each step
``preadv``-s straight into the destination (GIL released) and checks its blocks
as they land; large reads run their steps on several threads; optional
per-piece XXH3-64 digests for the client over what landed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import xxhash

from ..engine import ChunkDamage, ReadStep, run_step

__all__ = ["SplitReader", "piece_digests", "SPLIT_BYTES"]

#: Reads at least this large run their steps on several threads.
SPLIT_BYTES = 32 << 20  # 32 MiB


def piece_digests(dest: memoryview, piece: int) -> list[int]:
    """XXH3-64 of each ``piece``-byte piece of ``dest`` (the last may be short;
    none for an empty ``dest``), native, GIL released."""
    return [xxhash.xxh3_64_intdigest(dest[o:o + piece]) for o in range(0, len(dest), piece)]


class SplitReader:
    """A thread pool for reads too large for one thread.

    Args:
        threads: pool threads (the calling thread works too).
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gpufeed-split")

    def run_steps(self, steps: list[ReadStep]) -> list[int]:
        """Run the read steps of one read: in parallel when they are
        :data:`SPLIT_BYTES` or more in all, else on this thread.

        Returns:
            Bytes of each step.

        Raises:
            ChunkDamage: a step failed its check (after every step ended).
        """
        if len(steps) < 2 or sum(len(s.dest) for s in steps) < SPLIT_BYTES:
            return [run_step(s) for s in steps]
        failed = self.run_checked(list(enumerate(steps)), parallel=True)
        if failed:
            raise next(iter(failed.values()))
        return [len(s.dest) for s in steps]

    def run_checked(self, tasks: list[tuple[int, ReadStep]], *, parallel: bool) -> dict[int, ChunkDamage]:
        """Run ``(owner, step)`` tasks, on this thread and the pool's (each runner
        taking the next task in turn: one pool job per thread rather than per
        task) when ``parallel``, else here.

        Returns:
            ``owner -> the first ChunkDamage`` of each owner with a step that
            failed its check; only once every task has ended (their views may
            then be released).

        Raises:
            Exception: the first error of any task other than ChunkDamage.
        """
        failed: dict[int, ChunkDamage] = {}
        nxt = itertools.count()

        def run() -> None:
            while (k := next(nxt)) < len(tasks):
                owner, step = tasks[k]
                if owner in failed:
                    continue
                try:
                    run_step(step)
                except ChunkDamage as exc:
                    failed.setdefault(owner, exc)

        if not parallel:
            run()
            return failed
        self._fan_out(run, len(tasks))
        return failed

    def _fan_out(self, run: Callable[[], None], tasks: int) -> None:
        """Run ``run`` on this thread and on ``min(tasks, threads) - 1`` pool threads
        (each runner takes the next task until none is left), and return once all
        have ended; a runner still queued when this thread's run ends is not needed.

        Raises:
            BaseException: the first error a runner raised (this thread's first).
        """
        futs = [self.pool.submit(run) for _ in range(min(tasks, self.threads) - 1)]
        error = None
        try:
            run()
        except BaseException as exc:  # the pool runners still finish the other tasks
            error = exc
        if error is None:
            for f in futs:  # a runner still queued behind other requests is not needed
                f.cancel()
        wait(futs)
        for f in futs:
            if error is None and not f.cancelled() and f.exception() is not None:
                error = f.exception()
        if error is not None:
            raise error

    def run_calls(self, calls: list[Callable[[], object]], *, parallel: bool) -> list:
        """Run ``calls``, on this thread and the pool's when ``parallel`` (each runner
        taking the next call in turn), else here, in order.

        Returns:
            Each call's result, only once every call has ended.

        Raises:
            Exception: the first error any call raised.
        """
        out: list = [None] * len(calls)
        nxt = itertools.count()

        def run() -> None:
            while (k := next(nxt)) < len(calls):
                out[k] = calls[k]()

        if not parallel or len(calls) < 2:
            run()
            return out
        self._fan_out(run, len(calls))
        return out

    def shutdown(self) -> None:
        """Wait for running reads and stop the pool."""
        self.pool.shutdown(wait=True)
