"""The floors under ``bench io``'s small-read rows, measured in the same run.

* **Round trips**: a bare Python request/reply between two processes (64-byte
  messages, the size of a GET frame), over a Unix stream socket and over a
  loopback TCP connection (``TCP_NODELAY`` on both ends): what any Python
  client and server on this machine pay per request before doing any work.
  The shm single-get p50 is compared with the Unix one, the tcp p50 with the
  TCP one.
* **preadv**: a bare ``os.preadv`` loop in this process over the same random
  4 KiB offsets of the object's data file (page cache warm): the most 4 KiB
  reads per second one Python thread gets from the kernel. Compared with the
  batched 4 KiB IOPS of the fast path.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time

__all__ = ["echo_floor", "preadv_floor"]

_ECHO_SERVER = """
import os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
buf = bytearray(256)
while True:
    n = s.recv_into(buf)
    if not n:
        break
    s.sendall(memoryview(buf)[:n])
"""


def echo_floor(samples: int = 5000, message: int = 64, *, tcp: bool = False) -> tuple[float, float]:
    """p50 and p99 (µs) of a request/reply round trip to an echo server in
    another Python process.

    Args:
        samples: round trips timed (after 500 to warm up).
        message: bytes per request and reply.
        tcp: over a loopback TCP connection (``TCP_NODELAY`` on both ends)
            instead of a Unix stream socket.
    """
    a, b = _tcp_pair() if tcp else socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER, str(b.fileno())], pass_fds=[b.fileno()])
    b.close()
    try:
        msg, buf = b"x" * message, bytearray(message)
        lat = []
        for i in range(samples + 500):
            t0 = time.perf_counter()
            a.sendall(msg)
            got = 0
            while got < message:
                got += a.recv_into(memoryview(buf)[got:])
            if i >= 500:
                lat.append(time.perf_counter() - t0)
        lat.sort()
        return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
    finally:
        a.close()
        proc.wait(timeout=10)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of a connection over 127.0.0.1, ``TCP_NODELAY`` set on each."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def preadv_floor(path: str, size: int, seconds: float = 2.0, seed: int = 2) -> float:
    """4 KiB ``os.preadv`` calls per second over random aligned offsets of the
    first ``size`` bytes of ``path`` (one thread; the file's pages should be cached)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = [bytearray(4096)]
        r = random.Random(seed)
        limit = max(size - 4096, 1)
        done, t0 = 0, time.perf_counter()
        t_end = t0 + seconds
        while time.perf_counter() < t_end:
            for _ in range(256):
                os.preadv(fd, buf, r.randrange(0, limit) // 4096 * 4096)
            done += 256
        return done / (time.perf_counter() - t0)
    finally:
        os.close(fd)
