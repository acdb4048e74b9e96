"""Shared fixtures: one real `gpufeed serve` per test session on random loopback
ports, and a throwaway PostgreSQL server per test process for the PostgreSQL catalog."""

from __future__ import annotations

import os

import pytest

from gpufeed.testing.node import NodeProcess, start_node
from gpufeed.testing.postgres import PostgresMissing, PostgresServer


@pytest.fixture(scope="session")
def node(tmp_path_factory) -> NodeProcess:
    """A live node (subprocess) shared by the session: ``.s3_url``, ``.tcp_url``,
    ``.shm_url``, ``.access_key``, ``.secret_key``, ``.data_dir``, ``.proc``."""
    proc = start_node(tmp_path_factory.mktemp("node") / "data")
    yield proc
    code = proc.stop()
    assert code == 0, f"node exited with {code}:\n{proc.log_path.read_text()}"


@pytest.fixture
def fresh_node(tmp_path) -> NodeProcess:
    """A node of its own for tests that kill or restart it."""
    proc = start_node(tmp_path / "data")
    yield proc
    proc.stop()


@pytest.fixture
def s3(node):
    """boto3 S3 client for the session node."""
    client = node.boto3_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def s3_once(node):
    """boto3 S3 client for the session node that sends each request once: boto3
    retries a 400 ``BadDigest`` four times with back-off (against AWS too), so
    tests that expect one use this client."""
    client = node.boto3_client(retries={"max_attempts": 1, "mode": "standard"})
    yield client
    client.close()


@pytest.fixture(scope="session", autouse=True)
def _no_ambient_keys():
    """Keys in the shell that runs the tests (``AWS_ACCESS_KEY_ID`` for real AWS,
    say) would reach every ``Client(url)`` and every node started here: the
    tests run with the built-in key unless they pass one."""
    names = ("GPUFEED_ACCESS_KEY", "GPUFEED_SECRET_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    yield
    os.environ.update(saved)


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of this test process (each xdist worker starts its own),
    or a skip when PostgreSQL is not installed; ``GPUFEED_REQUIRE_POSTGRES=1``
    (set by ``.ci/run``) makes that a failure."""
    try:
        server = PostgresServer()
    except PostgresMissing as exc:
        if os.environ.get("GPUFEED_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"GPUFEED_REQUIRE_POSTGRES is set but {exc}")
        pytest.skip(str(exc))
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    yield server
    server.close()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a fresh, empty database of :func:`postgres_server`, dropped after the test."""
    url = postgres_server.create_database("t")
    yield url
    postgres_server.drop_database(url)
