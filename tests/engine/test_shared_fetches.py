"""Fetches shared by concurrent callers (:class:`gpufeed.engine._fetched.SharedFetches`):
the first caller for a key runs the fetch, the callers that ask while it runs
get their own descriptor of its file, or its error; a key asked afterwards is
fetched again. The fetch below holds until every other caller has joined it,
so the sharing does not depend on timing."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from gpufeed.engine._fetched import SharedFetches
from gpufeed.errors import HolderUnavailable
from gpufeed.testing.node import wait_for

CALLERS = 5


def _run_together(flights: SharedFetches, fetch) -> list[object]:
    """Call ``flights.fetch("k", fetch)`` from CALLERS threads; each result is an fd or an exception."""
    out: list[object] = [None] * CALLERS

    def call(i: int) -> None:
        try:
            out[i] = flights.fetch("k", fetch)
        except Exception as exc:
            out[i] = exc
    threads = [threading.Thread(target=call, args=(i,)) for i in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_callers_during_a_fetch_share_its_file_and_a_later_caller_fetches_again():
    flights = SharedFetches()
    runs: list[int] = []

    def fetch() -> int:
        runs.append(1)
        assert wait_for(lambda: flights.shared >= CALLERS - 1 or len(runs) > 1, 10)
        fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR)
        os.pwrite(fd, b"window bytes", 0)
        return fd

    fds = _run_together(flights, fetch)
    assert len(runs) == 1 and flights.shared == CALLERS - 1
    assert all(isinstance(fd, int) for fd in fds) and len(set(fds)) == CALLERS  # each its own descriptor
    for fd in fds:
        assert isinstance(fd, int)
        assert os.pread(fd, 100, 0) == b"window bytes"
        os.close(fd)
    fd = flights.fetch("k", fetch)  # the flight ended: a new one
    os.close(fd)
    assert len(runs) == 2


def test_callers_during_a_failed_fetch_get_its_error():
    flights = SharedFetches()
    runs: list[int] = []

    def fetch() -> int:
        runs.append(1)
        assert wait_for(lambda: flights.shared >= CALLERS - 1, 10)
        raise HolderUnavailable("node e5f4 did not answer")

    got = _run_together(flights, fetch)
    assert len(runs) == 1
    assert all(isinstance(e, HolderUnavailable) and "e5f4" in e.message for e in got)
    with pytest.raises(ValueError):  # nothing left behind: the next caller runs its own fetch
        flights.fetch("k", lambda: (_ for _ in ()).throw(ValueError("again")))
