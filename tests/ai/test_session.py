"""NodeSession: the one reconnect state machine the AI integrations share, against
real nodes (one restarted)."""

from __future__ import annotations

import pytest

from gpufeed.ai._session import NodeSession
from gpufeed.client import Client
from gpufeed.errors import InvalidBucketName, TransportError
from gpufeed.testing.node import start_node


def test_prepares_once_per_connection_and_reuses_it(node):
    prepared = []
    s = NodeSession(node.tcp_url, prepare=prepared.append)
    c1, c2 = s.client(), s.client()
    assert c1 is c2 and prepared == [c1] and s.owns_client
    s.close()
    assert c1.closed and s.client() is None and s.closed


def test_a_fatal_prepare_error_reaches_the_caller(node):
    def bad_bucket(c: Client) -> None:
        c.create_bucket("NO_SUCH NAME")

    s = NodeSession(node.tcp_url, prepare=bad_bucket, fatal=(InvalidBucketName,))
    with pytest.raises(InvalidBucketName):
        s.client()
    s.close()


def test_a_down_node_is_counted_and_retried_after_the_interval(tmp_path, monkeypatch):
    downs: list[BaseException] = []
    s = NodeSession("gpufeed+tcp://127.0.0.1:1", retry_interval_s=60.0, on_down=downs.append)
    assert s.client() is None and len(downs) == 1
    assert s.client() is None and len(downs) == 1  # inside the retry interval: no new attempt
    with pytest.raises((TransportError, OSError)):
        s.require()  # require ignores the interval and raises
    assert len(downs) == 2


def test_a_borrowed_client_is_never_closed_and_is_prepared_again_after_a_failure(node):
    prepared = []
    with Client(node.tcp_url) as c:
        s = NodeSession(c, prepare=prepared.append)
        assert s.client() is c
        s.failed(TransportError("boom"))
        assert not c.closed and s.client() is c and prepared == [c, c]
        s.close()
        assert not c.closed


def test_a_stale_failure_does_not_drop_the_new_client(node):
    downs: list[BaseException] = []
    s = NodeSession(node.tcp_url, on_down=downs.append)
    old = s.client()
    s.failed(TransportError("first"), old)
    new = s.client()
    assert new is not old and old.closed
    s.failed(TransportError("late report about the old client"), old)
    assert s.client() is new and len(downs) == 1
    s.close()


def test_replace_lost_reconnects_after_a_node_restart(tmp_path):
    n = start_node(tmp_path / "data")
    try:
        s = NodeSession(n.shm_url, replace_lost=True)  # the socket path survives a restart
        c = s.require()
        c.create_bucket("session-bkt")
        n.stop()
        with pytest.raises((TransportError, OSError)):
            c.list_buckets()
        assert c.lost_connection
        n = start_node(tmp_path / "data")
        c2 = s.require()
        assert c2 is not c and c.closed
        assert "session-bkt" in c2.list_buckets()
        s.close()
    finally:
        n.stop()
