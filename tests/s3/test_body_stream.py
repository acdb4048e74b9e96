"""``stream_body``: order, read-ahead bound, and failures that leave no worker
writing into a pending write the caller is about to abort."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufeed.errors import IncompleteBody, InternalError
from gpufeed.s3._body import _READ_AHEAD, stream_body
from gpufeed.s3._checksum import BodyDigests

PIECE = 256 << 10  # 256 KiB, about what aiohttp hands over per read


class _Body:
    """The two things stream_body uses of a RequestBody: ``chunks()`` and ``digests``."""

    def __init__(self, pieces: list[bytes], fail_after: int | None = None) -> None:
        self.pieces = pieces
        self.fail_after = fail_after
        self.digests = BodyDigests(checksums={"sha256": None})
        self.read = 0

    async def chunks(self):
        for i, p in enumerate(self.pieces):
            if self.fail_after is not None and i == self.fail_after:
                raise IncompleteBody("client went away")
            self.read += len(p)
            yield p
            await asyncio.sleep(0)


class _Pending:
    """Collects writes; optionally slow, or failing at the n-th write."""

    def __init__(self, delay_s: float = 0.0, fail_at: int | None = None) -> None:
        self.data = bytearray()
        self.delay_s = delay_s
        self.fail_at = fail_at
        self.writes = 0
        self.active = 0
        self.lock = threading.Lock()

    def write(self, buf) -> int:
        with self.lock:
            self.active += 1
        try:
            time.sleep(self.delay_s)
            self.writes += 1
            if self.fail_at is not None and self.writes == self.fail_at:
                raise InternalError("disk full")
            self.data += buf
            return len(buf)
        finally:
            with self.lock:
                self.active -= 1

    def write_many(self, bufs) -> int:
        return self.write(b"".join(bufs))


def _pieces(n: int) -> list[bytes]:
    return [bytes([i % 251]) * PIECE for i in range(n)]


def _run(body, pending) -> None:
    """Run stream_body; ``pending.active_at_return``: writes still running the
    moment it returned or raised (before the pool is shut down)."""

    async def main(ex):
        try:
            await stream_body(body, pending, ex)
        finally:
            pending.active_at_return = pending.active
            pending.writes_at_return = pending.writes

    with ThreadPoolExecutor(4) as ex:
        asyncio.run(main(ex))


def test_bytes_arrive_in_order_and_digests_see_them():
    pieces = _pieces(100)  # 25 MiB: several batches
    body, pending = _Body(pieces), _Pending()
    _run(body, pending)
    assert bytes(pending.data) == b"".join(pieces)
    assert body.digests._hashers["sha256"].digest() == hashlib.sha256(b"".join(pieces)).digest()


def test_read_ahead_is_bounded_when_the_disk_is_slow():
    pieces = _pieces(400)  # 100 MiB
    body, pending = _Body(pieces), _Pending(delay_s=0.02)
    seen = []

    async def main(ex):
        task = asyncio.ensure_future(stream_body(body, pending, ex))
        while not task.done():
            seen.append(body.read - len(pending.data))
            await asyncio.sleep(0.005)
        await task

    with ThreadPoolExecutor(4) as ex:
        asyncio.run(main(ex))
    assert bytes(pending.data) == b"".join(pieces)
    assert max(seen) <= _READ_AHEAD + 2 * (4 << 20) + PIECE  # the window, a batch in hand, one piece


@pytest.mark.parametrize("fail_at", [1, 3])
def test_write_failure_surfaces_and_nothing_keeps_writing(fail_at):
    body, pending = _Body(_pieces(200)), _Pending(delay_s=0.005, fail_at=fail_at)
    with pytest.raises(InternalError):
        _run(body, pending)
    assert pending.active_at_return == 0
    assert pending.writes == pending.writes_at_return == fail_at  # no write after the failure


def test_body_failure_waits_for_running_writes():
    body, pending = _Body(_pieces(100), fail_after=60), _Pending(delay_s=0.05)
    with pytest.raises(IncompleteBody):
        _run(body, pending)
    assert pending.active_at_return == 0
    assert pending.writes == pending.writes_at_return
