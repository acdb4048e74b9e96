"""The fast path's limits (``NodeConfig.wire``): metadata size, connection caps,
header and idle timeouts, shared memory per client and per node. Each node here
runs with small caps set by environment variables."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import msgspec
import pytest

from gpufeed.client import Client
from gpufeed.errors import InvalidArgument, TransportError
from gpufeed.testing.node import start_node
from gpufeed.testing.wire_fuzz import (
    authenticate_raw,
    connect_raw,
    make_memfd,
    node_resources,
    raw_frame,
    read_answer,
)
from gpufeed.wire import protocol as p

HELLO = raw_frame(p.Op.HELLO, msgspec.msgpack.encode(["limits-test", 1]))


def _node(tmp_path, name: str, **env: str):
    return start_node(tmp_path / name, env={f"GPUFEED_WIRE_{k.upper()}": v for k, v in env.items()})


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """A node with small caps: 12 connections (6 per client), 1 s header timeout."""
    proc = _node(tmp_path_factory.mktemp("tight"), "data", max_connections="12",
                 max_connections_per_client="6", header_timeout_s="1")
    yield proc
    assert proc.stop() == 0, proc.log_path.read_text()


def _url(node, transport: str) -> str:
    return node.tcp_url if transport == "tcp" else node.shm_url


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _authed(url: str, timeout_s: float) -> socket.socket:
    """A raw connection that has authenticated (HELLO, AUTH) with the built-in key."""
    s = connect_raw(url, timeout_s)
    authenticate_raw(s, "tcp" if url.startswith("gpufeed+tcp://") else "shm")
    return s


def _until_served(url: str, timeout_s: float = 5.0) -> None:
    """Wait until a new connection to ``url`` is served (the node counts closed
    connections down as it notices them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = connect_raw(url, 5)
        _send(s, HELLO)
        answer = read_answer(s, time.monotonic() + 5)
        s.close()
        if answer == ("ok", ""):
            return
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)


def _wait_closed(sock: socket.socket, timeout_s: float) -> tuple[str, str] | None:
    """The error frame the node sent before closing ``sock`` (``None``: closed silently)."""
    answer = read_answer(sock, time.monotonic() + timeout_s)
    if answer is not None:
        assert read_answer(sock, time.monotonic() + timeout_s) is None  # then the close
    return answer


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_header_announcing_large_metadata_costs_nothing_and_times_out(tight, transport):
    before = node_resources(tight.pid)["rss_bytes"]
    socks = []
    for _ in range(5):
        s = connect_raw(_url(tight, transport), 5)
        s.sendall(p.HEADER.pack(p.MAGIC, p.VERSION, p.Op.HELLO, p.MAX_META, 1, 0))
        socks.append(s)
    time.sleep(0.3)
    assert node_resources(tight.pid)["rss_bytes"] - before < 16 << 20  # not 5 x 16 MiB
    started = time.monotonic()
    for s in socks:
        code, message = _wait_closed(s, 5)
        assert code == "RequestTimeout" and "frame" in message
        s.close()
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_silent_and_slow_connections_are_closed_with_an_error(tight, transport):
    silent = connect_raw(_url(tight, transport), 5)
    slow = connect_raw(_url(tight, transport), 5)
    started = time.monotonic()
    for i in range(3):  # one header byte every 0.3 s: the frame takes too long
        slow.sendall(HELLO[i:i + 1])
        time.sleep(0.3)
    code, message = _wait_closed(slow, 5)
    assert code == "RequestTimeout" and "stopped arriving" in message
    code, message = _wait_closed(silent, 5)
    assert code == "RequestTimeout" and "no request" in message
    assert time.monotonic() - started < 4
    silent.close()
    slow.close()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_connections_past_the_cap_are_refused_with_slowdown(tight, transport):
    held = []
    try:
        for _ in range(6):  # the per-client cap (one address / one process)
            s = connect_raw(_url(tight, transport), 5)
            s.sendall(HELLO)
            assert read_answer(s, time.monotonic() + 5) == ("ok", "")
            held.append(s)
        extra = connect_raw(_url(tight, transport), 5)
        _send(extra, HELLO)  # the node may have refused it already
        code, message = _wait_closed(extra, 5)
        extra.close()
        assert code == "SlowDown" and "per client" in message
        held[0].sendall(HELLO)  # the connections already open keep working
        assert read_answer(held[0], time.monotonic() + 5) == ("ok", "")
    finally:
        for s in held:
            s.close()
    _until_served(_url(tight, transport))


def test_node_wide_cap_refuses_every_client(tight):
    held = []
    try:
        for url in (tight.tcp_url, tight.shm_url):  # two clients: an address and a process
            for _ in range(6):
                s = connect_raw(url, 5)
                s.sendall(HELLO)
                assert read_answer(s, time.monotonic() + 5) == ("ok", "")
                held.append(s)
        with pytest.raises(TransportError, match="GPUFEED_WIRE_MAX_CONNECTIONS\\)"):
            Client(tight.tcp_url)
    finally:
        for s in held:
            s.close()
    _until_served(tight.tcp_url)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_sdk_clients_idle_longer_than_the_header_timeout_keep_working(tight, transport):
    with Client(_url(tight, transport)) as c:  # HELLO was its first frame
        c.create_bucket(b := "idle-" + uuid.uuid4().hex[:8])
        time.sleep(2.5)
        c.put(b, "k", b"v")
        assert bytes(c.get(b, "k")) == b"v"


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_idle_timeout_closes_with_a_clear_error_and_a_new_client_works(tmp_path, transport):
    proc = _node(tmp_path, "idle", idle_timeout_s="1", header_timeout_s="5")
    try:
        raw = connect_raw(_url(proc, transport), 5)
        raw.sendall(HELLO)
        assert read_answer(raw, time.monotonic() + 5) == ("ok", "")
        started = time.monotonic()
        code, message = _wait_closed(raw, 5)
        assert code == "RequestTimeout" and "idle" in message
        assert 0.9 < time.monotonic() - started < 3
        raw.close()
        with Client(_url(proc, transport)) as c:
            c.create_bucket("bkt")
            time.sleep(1.6)
            with pytest.raises(TransportError, match="idle"):
                c.list_buckets()
            assert c.lost_connection
        with Client(_url(proc, transport)) as c:  # the SDK's answer: a new Client
            assert c.list_buckets() == ["bkt"]
    finally:
        assert proc.stop() == 0, proc.log_path.read_text()


def _register(sock: socket.socket, region_id: int, size: int, fd: int) -> tuple[str, str] | None:
    socket.send_fds(sock, [raw_frame(p.Op.REGISTER, msgspec.msgpack.encode([region_id, size]))], [fd])
    return read_answer(sock, time.monotonic() + 10)


def test_registered_memory_is_capped_per_client(tmp_path):
    proc = _node(tmp_path, "mem", client_memory_bytes="40MiB", node_memory_bytes="1GiB")
    fds = [make_memfd(16 << 20) for _ in range(3)]
    a = _authed(proc.shm_url, 5)
    b = _authed(proc.shm_url, 5)
    try:
        before = node_resources(proc.pid)["rss_bytes"]
        assert _register(a, 1, 16 << 20, fds[0]) == ("ok", "")
        assert _register(b, 1, 16 << 20, fds[0]) == ("ok", "")  # the same memfd: counted once
        assert _register(a, 2, 16 << 20, fds[1]) == ("ok", "")
        code, message = _register(a, 3, 16 << 20, fds[2])
        assert code == "InvalidArgument" and "GPUFEED_WIRE_CLIENT_MEMORY_BYTES" in message
        a.sendall(raw_frame(p.Op.ALLOC_REGION, msgspec.msgpack.encode([9, 16 << 20])))
        code, message = read_answer(a, time.monotonic() + 10)
        assert code == "InvalidArgument" and "per client" in message
        # 32 MiB of memory (RSS counts fds[0] twice: it is mapped on two connections), not 64
        assert node_resources(proc.pid)["rss_bytes"] - before < 56 << 20
        a.sendall(raw_frame(p.Op.UNREGISTER, msgspec.msgpack.encode([2])))
        assert read_answer(a, time.monotonic() + 5) == ("ok", "")
        assert _register(a, 3, 16 << 20, fds[2]) == ("ok", "")  # room again
    finally:
        a.close()
        b.close()
        for fd in fds:
            os.close(fd)
        assert proc.stop() == 0, proc.log_path.read_text()


def test_lent_and_registered_memory_is_capped_per_node(tmp_path):
    proc = _node(tmp_path, "nodemem", client_memory_bytes="1GiB", node_memory_bytes="24MiB")
    fd = make_memfd(16 << 20)
    try:
        with Client(proc.shm_url) as c:
            with pytest.raises(InvalidArgument, match="GPUFEED_WIRE_NODE_MEMORY_BYTES"):
                c.alloc(32 << 20)
        s = _authed(proc.shm_url, 5)
        assert _register(s, 1, 16 << 20, fd) == ("ok", "")
        s.sendall(raw_frame(p.Op.ALLOC_REGION, msgspec.msgpack.encode([2, 16 << 20])))
        code, message = read_answer(s, time.monotonic() + 10)
        assert code == "InvalidArgument" and "its limit" in message
        s.close()
    finally:
        os.close(fd)
        assert proc.stop() == 0, proc.log_path.read_text()


@pytest.mark.parametrize("transport", ["shm"])
def test_registering_an_empty_region_is_invalid_argument(tight, transport):
    s = _authed(tight.shm_url, 5)
    for size, fd in [(0, make_memfd(0)), (0, make_memfd(4096))]:
        try:
            code, message = _register(s, 1, size, fd)
        finally:
            os.close(fd)
        assert code == "InvalidArgument", message
    s.close()


def _attack(url: str, stop: threading.Event, opened: list[int]) -> None:
    """Keep opening connections that say nothing, or send a header byte by byte."""
    socks: list[socket.socket] = []
    try:
        while not stop.is_set():
            try:
                s = connect_raw(url, 1)
            except OSError:
                time.sleep(0.01)
                continue
            socks.append(s)
            opened[0] += 1
            if len(socks) % 2:
                _send(s, HELLO[:3])
            if len(socks) > 60:
                for old in socks[:30]:
                    old.close()
                del socks[:30]
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow
def test_valid_clients_keep_working_beside_idle_and_slow_connections(tmp_path):
    proc = _node(tmp_path, "siege", max_connections="32", max_connections_per_client="32",
                 header_timeout_s="1")
    try:
        with Client(proc.tcp_url) as tcp, Client(proc.shm_url) as shm:
            tcp.create_bucket("bkt")
            tcp.put("bkt", "k", b"x" * 65536)
            for c in (tcp, shm):  # warm: the shm client's first get borrows its staging memory
                assert len(c.get("bkt", "k")) == 65536
            base = node_resources(proc.pid)
            stop, opened = threading.Event(), [0]
            attackers = [threading.Thread(target=_attack, args=(url, stop, opened))
                         for url in (proc.tcp_url, proc.shm_url, proc.tcp_url)]
            for t in attackers:
                t.start()
            lat, peak = [], dict(base)
            try:
                end = time.monotonic() + 5
                while time.monotonic() < end:
                    for c in (tcp, shm):
                        t0 = time.monotonic()
                        assert len(c.get("bkt", "k")) == 65536
                        lat.append(time.monotonic() - t0)
                    now = node_resources(proc.pid)
                    peak = {k: max(peak[k], now[k]) for k in peak}
                    time.sleep(0.01)
            finally:
                stop.set()
                for t in attackers:
                    t.join()
            lat.sort()
            p99 = lat[int(len(lat) * 0.99) - 1]
            assert opened[0] > 64  # the caps were passed many times over
            assert p99 < 1.0, f"p99 {p99:.3f} s over {len(lat)} gets"
            # one reader thread per connection, at most 32 of them; the heap stays put
            assert peak["threads"] <= base["threads"] + 32 + 4, (base, peak)
            assert peak["rss_bytes"] <= base["rss_bytes"] + (64 << 20), (base, peak)
        time.sleep(1.5)  # the attackers' leftovers time out
        with Client(proc.tcp_url) as c:
            assert len(c.get("bkt", "k")) == 65536
    finally:
        assert proc.stop() == 0, proc.log_path.read_text()


@pytest.mark.parametrize("pause_s,expected", [(0.1, "ok"), (0.45, "RequestTimeout")])
def test_large_metadata_arriving_in_pieces_is_served_within_the_header_timeout(tight, pause_s, expected):
    items = [["nobucket", f"key-{i:06d}", 0, 8] for i in range(8000)]
    frame = raw_frame(p.Op.GETV, msgspec.msgpack.encode([items]))
    assert len(frame) > 128 << 10  # past the size buffered at once
    s = _authed(tight.tcp_url, 5)
    try:
        step = len(frame) // 4 + 1  # four pieces: the last one 3 pauses after the first
        for i in range(0, len(frame), step):
            _send(s, frame[i:i + step])
            time.sleep(pause_s)
        answer = read_answer(s, time.monotonic() + 5)
        assert answer is not None and answer[0] == expected, answer
    finally:
        s.close()
