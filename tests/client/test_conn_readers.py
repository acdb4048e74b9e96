"""Who reads a connection's replies: the waiting thread (leader/follower), or the
receiver thread when nobody waits. A scripted server on a socket pair answers
in the order each test chooses."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from gpufeed.client._conn import Connection
from gpufeed.client._types import then
from gpufeed.errors import TransportError
from gpufeed.wire import protocol as p
from gpufeed.wire._frames import FrameIO


@pytest.fixture
def pair():
    """``(server FrameIO, client Connection)`` over a Unix socket pair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = FrameIO(a, "shm")
    client = Connection(b, True, request_timeout_s=20)
    yield server, client
    client.close()
    a.close()


def _read_requests(server: FrameIO, n: int) -> list[tuple[int, p.Head]]:
    """``(request id, request)`` of the next ``n`` HEAD requests."""
    out = []
    for _ in range(n):
        hdr = server.recv_header()
        assert hdr is not None
        op, meta_len, rid, _plen = p.unpack_header(hdr)
        assert op == p.Op.HEAD
        out.append((rid, p.decode(p.Head, server.recv_meta(meta_len))))
    return out


def _answer(server: FrameIO, rid: int, req: p.Head) -> None:
    """A HEAD reply whose etag is the requested key (so each reply is told apart)."""
    server.reply(p.Op.HEAD, rid, p.ObjectMeta(req.bucket, req.key, 1, req.key, 0.0))


def test_many_waiting_threads_each_get_their_own_reply_in_any_order(pair):
    server, client = pair
    n = 16
    results: dict[int, str] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(n + 1)

    def ask(i: int) -> None:
        try:
            fut = client.request(p.Op.HEAD, p.Head("b", f"k{i}"))
            start.wait()
            results[i] = fut.result().etag
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    reqs = _read_requests(server, n)
    start.wait()
    time.sleep(0.3)  # every thread waits: one reads (the leader), the others follow
    for rid, req in reversed(reqs):  # the last asked is answered first
        _answer(server, rid, req)
    for t in threads:
        t.join(timeout=20)
    assert not errors
    assert results == {i: f"k{i}" for i in range(n)}


def test_a_lone_request_is_read_on_the_waiting_thread(pair):
    server, client = pair
    fut = client.request(p.Op.HEAD, p.Head("b", "k"))
    completed_on = []
    derived = then(fut, lambda r: completed_on.append(threading.get_ident()) or r.etag)

    def answer_later() -> None:  # the reply arrives while this thread already waits for it
        ((rid, req),) = _read_requests(server, 1)
        deadline = time.monotonic() + 20
        while not client._token.locked() and time.monotonic() < deadline:
            time.sleep(0.001)  # until the waiting thread holds the read token
        _answer(server, rid, req)

    t = threading.Thread(target=answer_later)
    t.start()
    assert derived.result() == "k"
    t.join(20)
    assert completed_on == [threading.get_ident()]


def test_a_future_with_only_a_callback_completes(pair):
    server, client = pair
    fut = client.request(p.Op.HEAD, p.Head("b", "cb"))
    done = threading.Event()
    fut.add_done_callback(lambda f: done.set())
    ((rid, req),) = _read_requests(server, 1)
    _answer(server, rid, req)
    assert done.wait(20)  # nobody called result(): the receiver thread read it
    assert fut.result(timeout=0).etag == "cb"


def test_a_reply_nobody_waits_for_is_read_and_a_timed_wait_sees_it(pair):
    server, client = pair
    fut = client.request(p.Op.HEAD, p.Head("b", "timed"))
    ((rid, req),) = _read_requests(server, 1)
    _answer(server, rid, req)
    assert fut.result(timeout=20).etag == "timed"  # a timed wait does not read


def test_an_awaited_future_completes(pair):
    server, client = pair

    async def main() -> str:
        fut = client.request(p.Op.HEAD, p.Head("b", "aio"))
        ((rid, req),) = await asyncio.to_thread(_read_requests, server, 1)
        _answer(server, rid, req)
        return (await asyncio.wrap_future(fut)).etag

    assert asyncio.run(main()) == "aio"


def test_an_idle_connection_learns_the_server_closed_it(pair):
    server, client = pair
    fut = client.request(p.Op.HEAD, p.Head("b", "k"))
    ((rid, req),) = _read_requests(server, 1)
    _answer(server, rid, req)
    fut.result()
    server.sock.shutdown(socket.SHUT_RDWR)
    for _ in range(2000):
        if client.closed:
            break
        threading.Event().wait(0.01)
    assert client.closed
    with pytest.raises(TransportError):
        client.request(p.Op.HEAD, p.Head("b", "k"))


def test_waiters_fail_when_the_server_goes_away_mid_wait(pair):
    server, client = pair
    futs = [client.request(p.Op.HEAD, p.Head("b", f"k{i}")) for i in range(3)]
    _read_requests(server, 3)
    failures: list[BaseException] = []

    def wait(f) -> None:
        try:
            f.result()
        except TransportError as exc:
            failures.append(exc)

    threads = [threading.Thread(target=wait, args=(f,)) for f in futs]
    for t in threads:
        t.start()
    server.sock.shutdown(socket.SHUT_RDWR)
    for t in threads:
        t.join(timeout=20)
    assert len(failures) == 3
