"""The shipped fast-path fuzzer (``gpufeed.testing.wire_fuzz``) against a live node,
over TCP and over the Unix socket: 0 crashes, 0 hangs, 0 InternalError, every
complete frame answered; the node's resources after the run stay within a stated
bound of before."""

from __future__ import annotations

import os
import time

import pytest

from gpufeed.client import Client
from gpufeed.testing.node import start_node
from gpufeed.testing.wire_fuzz import make_cases, node_resources, run_fuzz

#: Cases per transport (each on a connection of its own; about a second per thousand).
CASES = 3000
#: What a run may leave behind in the node (threads: its pools start lazily).
MAX_GROWTH = {"rss_bytes": 64 << 20, "threads": 8, "fds": 16}


@pytest.fixture(scope="module")
def fuzz_node(tmp_path_factory):
    """A node with small limits, so the fuzz meets them: 1 MiB metadata, 2 s header
    timeout, 64 MiB of shared memory per client and 128 MiB per node, no pool."""
    proc = start_node(tmp_path_factory.mktemp("fuzz") / "data", env={
        "GPUFEED_WIRE_MAX_META_BYTES": "1MiB", "GPUFEED_WIRE_HEADER_TIMEOUT_S": "2",
        "GPUFEED_WIRE_CLIENT_MEMORY_BYTES": "64MiB", "GPUFEED_WIRE_NODE_MEMORY_BYTES": "128MiB",
        "GPUFEED_REGION_POOL_BYTES": "0"})
    yield proc
    assert proc.stop() == 0, proc.log_path.read_text()


def test_cases_are_reproducible_and_varied():
    a = make_cases(300, shm=True, seed=3)
    b = make_cases(300, shm=True, seed=3)
    assert [(c.name, c.data) for c in a] == [(c.name, c.data) for c in b]
    kinds = {c.name.split(":")[0].split(" of ")[0] for c in a}
    assert len(kinds) > 20
    assert any(c.fds for c in a) and any(not c.complete for c in a)
    for c in a:  # each case makes its descriptors when sent
        for fd in c.fds() if c.fds else []:
            os.close(fd)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_fuzz_gets_typed_answers_and_leaves_the_node_healthy(fuzz_node, transport):
    url = fuzz_node.tcp_url if transport == "tcp" else fuzz_node.shm_url
    before = node_resources(fuzz_node.pid)
    report = run_fuzz(url, CASES, seed=12, timeout_s=10, node_pid=fuzz_node.pid, max_meta=1 << 20)
    assert not report.crashed, fuzz_node.log_path.read_text()[-4000:]
    assert report.hangs == [] and report.internal == [] and report.unanswered == []
    assert report.unrefused == []  # nothing served before (or without) a good AUTH
    assert report.codes["AccessDenied"] and report.codes["SignatureDoesNotMatch"]
    assert report.cases == CASES and report.answered > CASES * 0.9
    assert report.seconds < 60
    assert report.codes["ProtocolError"] and report.codes["InvalidArgument"]
    time.sleep(0.5)  # connection threads end as their sockets close
    after = node_resources(fuzz_node.pid)
    for key, bound in MAX_GROWTH.items():
        assert after[key] - before[key] <= bound, (key, before, after)
    with Client(url) as c:  # and it still serves
        assert "fuzz" in c.list_buckets()
        c.put("fuzz", "after", b"z" * 64)
        assert bytes(c.get("fuzz", "after")) == b"z" * 64
