"""Reading object files into client memory, fast: ``preadv`` straight into the
destination (GIL released), large reads split across threads, and optional
per-piece XXH3-64 digests computed while the bytes are still in the CPU cache.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor, wait

import xxhash

__all__ = ["ReadTask", "SplitReader", "pread_full", "read_task"]

#: Reads at least this large are split across threads.
SPLIT_BYTES = 32 << 20  # 32 MiB
#: Size of one piece of a split read.
PIECE_BYTES = 16 << 20  # 16 MiB
#: Largest read between two hash updates of a digest piece (fits a core's L2).
DIGEST_STEP_BYTES = 512 << 10  # 512 KiB

#: One read of a batch: ``(item index, fd, destination, file offset, digest piece
#: bytes or 0)``.
ReadTask = tuple[int, int, memoryview, int, int]


def pread_full(fd: int, mv: memoryview, offset: int) -> int:
    """``preadv`` until ``mv`` is full or EOF.

    Args:
        fd: a readable file descriptor.
        mv: the destination.
        offset: file offset of ``mv[0]``, bytes.

    Returns:
        Bytes read (fewer than ``len(mv)`` only at EOF).
    """
    total, n = 0, len(mv)
    while total < n:
        got = os.preadv(fd, [mv[total:]], offset + total)
        if got == 0:
            break
        total += got
    return total


def read_task(fd: int, dest: memoryview, offset: int, digest: int) -> tuple[int, list[int] | None]:
    """Read into ``dest``; with ``digest`` > 0 also hash each ``digest``-byte piece
    of what arrived (XXH3-64, GIL released) while it is still in the CPU cache.

    Returns:
        ``(bytes read, digests)``; digests is ``None`` when ``digest`` is 0, else
        one per piece that received any bytes.
    """
    if digest <= 0:
        return pread_full(fd, dest, offset), None
    # Read and hash in steps of at most DIGEST_STEP_BYTES, so each step is hashed
    # while it is still in the core's L2 cache (hashing a whole 4 MiB task after
    # it landed cost about twice as much throughput, measured).
    sums: list[int] = []
    got = 0
    for o in range(0, len(dest), digest):
        piece = dest[o:o + digest]
        if len(piece) <= DIGEST_STEP_BYTES:
            n = pread_full(fd, piece, offset + o)
            if n:
                sums.append(xxhash.xxh3_64_intdigest(piece[:n]))
        else:
            n = _read_hashed(fd, piece, offset + o, sums)
        got += n
        if n < len(piece):
            break  # EOF
    return got, sums


def _read_hashed(fd: int, piece: memoryview, offset: int, sums: list[int]) -> int:
    """Read one digest piece in L2-sized steps, hashing each step as it lands;
    appends the piece's digest to ``sums`` when any byte arrived."""
    h, n = xxhash.xxh3_64(), 0
    for s in range(0, len(piece), DIGEST_STEP_BYTES):
        step = piece[s:s + DIGEST_STEP_BYTES]
        k = pread_full(fd, step, offset + s)
        h.update(step[:k])
        n += k
        if k < len(step):
            break
    if n:
        sums.append(h.intdigest())
    return n


class SplitReader:
    """A thread pool for reads too large for one thread.

    Args:
        threads: pool threads (the calling thread works too).
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gpufeed-split")

    def read_into(self, fd: int, dest: memoryview, offset: int) -> int:
        """Read into ``dest`` from file offset ``offset``; reads of at least
        :data:`SPLIT_BYTES` are split into :data:`PIECE_BYTES` pieces read in
        parallel. Returns bytes read."""
        n = len(dest)
        if n < SPLIT_BYTES:
            return pread_full(fd, dest, offset)
        futs = [self.pool.submit(pread_full, fd, dest[o:o + PIECE_BYTES], offset + o)
                for o in range(0, n, PIECE_BYTES)]
        return sum(f.result() for f in futs)

    def run_tasks(self, tasks: list[ReadTask]) -> list[tuple[int, list[int] | None]]:
        """Run read tasks on this thread and the pool's, each runner taking the
        next task in turn: one pool job per thread rather than per task (fewer
        wake-ups and futures; measured 3-5 % faster on a 31-chunk KV read).

        Returns:
            :func:`read_task`'s result for each task, in order; only once every
            task has ended (their views may then be released).

        Raises:
            Exception: the first error of any task.
        """
        outs: list = [None] * len(tasks)
        nxt = itertools.count()

        def run() -> None:
            while (k := next(nxt)) < len(tasks):
                outs[k] = read_task(*tasks[k][1:])

        futs = [self.pool.submit(run) for _ in range(min(len(tasks), self.threads) - 1)]
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
        return outs

    def shutdown(self) -> None:
        """Wait for running reads and stop the pool."""
        self.pool.shutdown(wait=True)
