"""Concurrent reads through a cluster node that holds no copy share its fetches
(``gpufeed serve --catalog postgresql://... --cluster NAME`` subprocesses on
one throwaway PostgreSQL, factor 1 so each chunk is on its writer only): GETs
that need the same 8 MiB window of a large raw chunk, or the same whole chunk,
while it is being fetched wait for that one fetch and serve its bytes.

To hold the fetch open until every GET has joined it, the holder (a node this
test started) is paused with SIGSTOP: the reading node's connection to it
waits (within the fetch timeout) until SIGCONT."""

from __future__ import annotations

import os
import threading
import urllib.request

from gpufeed.engine._partial import PARTIAL_MIN_BYTES, WINDOW_BYTES
from gpufeed.testing.node import NodeProcess, start_node, wait_for

ENV = {"GPUFEED_CLUSTER_HEARTBEAT_S": "0.2", "GPUFEED_CLUSTER_EXPIRY_S": "60",
       "GPUFEED_CLUSTER_FETCH_TIMEOUT_S": "60", "GPUFEED_CLUSTER_REPLICAS": "1"}
READERS = 6


def _member(path, url: str) -> NodeProcess:
    return start_node(path, extra_args=["--catalog", url, "--cluster", "c1", "--metrics-port", "0"], env=ENV)


def _gauges(node: NodeProcess) -> dict[str, float]:
    assert node.metrics_url
    text = urllib.request.urlopen(node.metrics_url, timeout=10).read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith(("gpufeed_fetch", "gpufeed_fetched_bytes"))}


def _concurrent_gets(holder: NodeProcess, reader: NodeProcess, bucket: str, key: str,
                     ranges: list[tuple[int, int]]) -> list[bytes]:
    """GET each range of ``bucket/key`` through ``reader`` at once while ``holder`` is
    paused, resuming it once every GET but the first waits for the first's fetch."""
    clients = [reader.boto3_client() for _ in ranges]
    got: list[bytes] = [b""] * len(ranges)
    errors: list[BaseException] = []
    shared = _gauges(reader)["gpufeed_fetch_shared"]

    def get(i: int) -> None:
        start, end = ranges[i]
        try:
            got[i] = clients[i].get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"].read()
        except BaseException as exc:  # reported below
            errors.append(exc)
    threads = [threading.Thread(target=get, args=(i,)) for i in range(len(ranges))]
    holder.pause()
    try:
        for t in threads:
            t.start()
        assert wait_for(lambda: _gauges(reader)["gpufeed_fetch_shared"] - shared >= len(ranges) - 1, 40)
    finally:
        holder.resume()
        for t in threads:
            t.join(60)
    assert not errors, errors
    return got


def test_concurrent_gets_of_one_window_or_one_chunk_fetch_it_once(tmp_path, postgres_url):
    a, b = _member(tmp_path / "a", postgres_url), _member(tmp_path / "b", postgres_url)
    try:
        s3a = a.boto3_client()
        s3a.create_bucket(Bucket="big")
        data = os.urandom(PARTIAL_MIN_BYTES + (6 << 20))  # one raw chunk of 70 MiB, held by a alone
        s3a.put_object(Bucket="big", Key="weights", Body=data)
        small = os.urandom(1 << 20)  # one chunk, fetched whole and kept
        s3a.put_object(Bucket="big", Key="small", Body=small)

        w = WINDOW_BYTES
        before = _gauges(b)
        ranges = [(2 * w + i * 100_000, 2 * w + i * 100_000 + 9_999) for i in range(READERS)]  # all in window 2
        got = _concurrent_gets(a, b, "big", "weights", ranges)
        assert got == [data[s:e + 1] for s, e in ranges]
        after = _gauges(b)
        assert after["gpufeed_fetched_bytes"] - before["gpufeed_fetched_bytes"] == w  # one window fetched
        assert after["gpufeed_fetch_shared"] - before["gpufeed_fetch_shared"] == READERS - 1

        before = after
        ranges = [(i * 1000, i * 1000 + 4095) for i in range(READERS)]
        got = _concurrent_gets(a, b, "big", "small", ranges)
        assert got == [small[s:e + 1] for s, e in ranges]
        after = _gauges(b)
        assert after["gpufeed_fetched_bytes"] - before["gpufeed_fetched_bytes"] == len(small)  # fetched once
        assert after["gpufeed_fetch_shared"] - before["gpufeed_fetch_shared"] == READERS - 1
        assert after["gpufeed_fetch_cache_bytes"] == len(small)  # and kept
        assert b.boto3_client().get_object(Bucket="big", Key="small")["Body"].read() == small
        assert b.boto3_client().get_object(Bucket="big", Key="weights")["Body"].read() == data
    finally:
        a.stop()
        b.stop()
