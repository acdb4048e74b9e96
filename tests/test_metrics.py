"""Operating a node: Prometheus metrics on the metrics port, health answers, and
``gpufeed admin bucket stats``.

Nodes run in-process (``Node``), each with its metrics port on a free port, so
two of them in one process also show that their registries stay apart. The
scrape is parsed with ``prometheus_client.parser`` and compared before and
after known traffic.

Source: Prometheus text exposition format,
https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from gpufeed.admin import LocalAdmin, RemoteAdmin
from gpufeed.client import Client
from gpufeed.config import NodeConfig
from gpufeed.errors import NoSuchBucket
from gpufeed.node import Node

SIZE = 100_000  # bytes of each test object


def _scrape(url: str) -> dict[tuple, float]:
    """``{(sample name, (label, value), ...): value}`` of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def _settled(url: str, before: dict, name: str, want: float, timeout_s: float = 5.0, **labels) -> dict:
    """Scrape until ``name{labels}`` has grown by ``want`` since ``before`` (a fast-path
    request is counted just after its reply leaves, so a client can be quicker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = _scrape(url)
        if _delta(before, after, name, **labels) >= want or time.monotonic() > deadline:
            return after
        time.sleep(0.02)


def _get(m: dict, name: str, **labels) -> float:
    return m.get((name, *sorted(labels.items())), 0.0)


def _delta(before: dict, after: dict, name: str, **labels) -> float:
    return _get(after, name, **labels) - _get(before, name, **labels)


def _config(data, **kw) -> NodeConfig:
    kw.setdefault("lifecycle_interval_s", 0)
    return NodeConfig.from_env(data_dir=data, s3_port=0, port=0, metrics_port=0, fsync=False, **kw)


@pytest.fixture(scope="module")
def mnode(tmp_path_factory):
    node = Node(_config(tmp_path_factory.mktemp("metrics") / "data"))
    endpoints = node.start()
    yield node, endpoints
    node.stop()


@pytest.fixture(scope="module")
def s3(mnode):
    _, ep = mnode
    client = boto3.client("s3", endpoint_url=ep.s3, aws_access_key_id=ep.access_key,
                          aws_secret_access_key=ep.secret_key, region_name="us-east-1")
    client.create_bucket(Bucket="mbkt")
    yield client
    client.close()


def test_s3_requests_bytes_latency_and_errors_are_counted(mnode, s3):
    _, ep = mnode
    before = _scrape(ep.metrics)
    body = b"x" * SIZE
    for i in range(3):
        s3.put_object(Bucket="mbkt", Key=f"s3/{i}", Body=body)
    for i in range(2):
        assert s3.get_object(Bucket="mbkt", Key=f"s3/{i}")["Body"].read() == body
    for _ in range(4):
        with pytest.raises(ClientError):
            s3.get_object(Bucket="mbkt", Key="no/such/key")
    after = _scrape(ep.metrics)
    ok = {"front": "s3", "status": "200", "code": "OK"}
    assert _delta(before, after, "gpufeed_requests_total", op="PutObject", **ok) == 3
    assert _delta(before, after, "gpufeed_requests_total", op="GetObject", **ok) == 2
    assert _delta(before, after, "gpufeed_requests_total", front="s3", op="GetObject", status="404",
                  code="NoSuchKey") == 4
    assert _delta(before, after, "gpufeed_errors_total", front="s3", code="NoSuchKey") == 4
    assert _delta(before, after, "gpufeed_request_duration_seconds_count", front="s3", op="GetObject") == 6
    assert _delta(before, after, "gpufeed_request_duration_seconds_count", front="s3", op="PutObject") == 3
    assert _delta(before, after, "gpufeed_request_duration_seconds_sum", front="s3", op="PutObject") > 0
    assert _delta(before, after, "gpufeed_received_bytes_total", front="s3") >= 3 * SIZE
    sent = _delta(before, after, "gpufeed_sent_bytes_total", front="s3")
    assert 2 * SIZE <= sent < 2 * SIZE + 4 * 1000  # the four error documents are small


def test_unauthenticated_requests_are_counted_by_code(mnode, s3):
    _, ep = mnode
    s3.put_object(Bucket="mbkt", Key="s3/0", Body=b"x")  # there, so the refusal is about the signature
    before = _scrape(ep.metrics)
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"{ep.s3}/mbkt/s3/0", timeout=10)
    assert exc.value.code == 403
    exc.value.close()
    after = _scrape(ep.metrics)
    assert _delta(before, after, "gpufeed_errors_total", front="s3", code="AccessDenied") == 1


@pytest.mark.parametrize("scheme", ["tcp", "shm"])
def test_fast_path_ops_and_bytes_are_counted(mnode, s3, scheme):
    _, ep = mnode
    url = ep.tcp if scheme == "tcp" else ep.shm
    with Client(url) as c:
        before = _scrape(ep.metrics)
        assert _get(before, "gpufeed_connections_open", front=scheme) >= 1
        for i in range(2):
            c.put("mbkt", f"{scheme}/{i}", b"y" * SIZE)
        for i in range(3):
            assert bytes(c.get("mbkt", f"{scheme}/{i % 2}")) == b"y" * SIZE
        with pytest.raises(FileNotFoundError):
            c.get("mbkt", f"{scheme}/missing")
        after = _settled(ep.metrics, before, "gpufeed_request_duration_seconds_count", 6, front=scheme)
    ok = {"front": scheme, "status": "200", "code": "OK"}
    assert _delta(before, after, "gpufeed_requests_total", op="put", **ok) == 2
    gets = sum(_delta(before, after, "gpufeed_requests_total", op=op, **ok) for op in ("get", "getv"))
    assert gets == 3
    assert _delta(before, after, "gpufeed_errors_total", front=scheme, code="NoSuchKey") == 1
    assert _delta(before, after, "gpufeed_received_bytes_total", front=scheme) == 2 * SIZE
    assert _delta(before, after, "gpufeed_sent_bytes_total", front=scheme) == 3 * SIZE
    assert _delta(before, after, "gpufeed_request_duration_seconds_count", front=scheme, op="put") == 2


def test_shm_lending_gauges(mnode, s3):
    _, ep = mnode
    with Client(ep.shm) as c:
        view = c.alloc(1 << 20)  # 1 MiB lent by the node
        c.put("mbkt", "lent", b"z" * 1000)
        assert c.get_into("mbkt", "lent", view, length=1000) == 1000
        m = _scrape(ep.metrics)
        assert _get(m, "gpufeed_shm_regions_lent") >= 1
        assert _get(m, "gpufeed_shm_lent_bytes") >= 1 << 20
        assert _get(m, "gpufeed_shm_mapped_bytes") >= 1 << 20
        assert _get(m, "gpufeed_connections_open", front="shm") >= 1


def test_tenant_usage_gauges_and_their_cache(mnode, s3):
    node, ep = mnode
    admin = RemoteAdmin(ep.s3, ep.access_key, ep.secret_key)
    admin.tenant_create("gauged")
    key = admin.key_create("gauged")
    t = boto3.client("s3", endpoint_url=ep.s3, aws_access_key_id=key["access_key"],
                     aws_secret_access_key=key["secret_key"], region_name="us-east-1")
    t.create_bucket(Bucket="gauged-1")
    t.create_bucket(Bucket="gauged-2")
    for i in range(5):
        t.put_object(Bucket="gauged-2", Key=f"k{i}", Body=b"q" * 1000)
    node.metrics._sources[0]._at = -float("inf")  # drop the cached pass: fresh figures now
    m = _scrape(ep.metrics)
    assert _get(m, "gpufeed_tenant_buckets", tenant="gauged") == 2
    assert _get(m, "gpufeed_tenant_objects", tenant="gauged") == 5
    assert _get(m, "gpufeed_tenant_bytes", tenant="gauged") == 5000
    assert _get(m, "gpufeed_tenants") >= 2
    usage = node.metrics._sources[0]
    passes = usage.passes
    for _ in range(3):
        _scrape(ep.metrics)
    assert usage.passes == passes  # scrapes within the cache time share one pass


def test_health_endpoints(mnode, s3):
    _, ep = mnode
    health = ep.metrics.replace("/metrics", "/health")
    with urllib.request.urlopen(health, timeout=10) as resp:
        body = json.loads(resp.read())
    assert resp.status == 200
    assert body["status"] == "ok" and body["engine_open"] and body["catalog_readable"]
    assert body["uptime_s"] >= 0 and body["version"]
    with urllib.request.urlopen(f"{ep.s3}/_gpufeed/health", timeout=10) as resp:  # unsigned
        assert resp.status == 200
        assert json.loads(resp.read())["status"] == "ok"
    with pytest.raises(urllib.error.HTTPError) as exc:  # S3 data calls stay signed
        urllib.request.urlopen(f"{ep.s3}/mbkt", timeout=10)
    assert exc.value.code == 403
    exc.value.close()
    req = urllib.request.Request(f"{ep.s3}/_gpufeed/health", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 405
    exc.value.close()


def test_health_is_503_when_the_engine_is_closed(tmp_path):
    from gpufeed.engine import Engine
    from gpufeed.s3._health import health_report

    engine = Engine(tmp_path / "d", fsync=False)
    assert health_report(engine, 0.0)[0] == 200
    engine.close()
    status, body = health_report(engine, 0.0)
    assert status == 503 and body["status"] == "unhealthy" and not body["engine_open"]


def test_two_nodes_in_one_process_keep_their_own_counts(tmp_path, mnode, s3):
    _, ep = mnode
    other = Node(_config(tmp_path / "other", metrics_tenant_labels=False, lifecycle_interval_s=3600))
    oep = other.start()
    try:
        with urllib.request.urlopen(f"{oep.s3}/_gpufeed/health", timeout=10) as resp:
            resp.read()
        mine = _scrape(oep.metrics)
        assert _get(mine, "gpufeed_requests_total", front="s3", op="Health", status="200", code="OK") == 1
        assert _get(mine, "gpufeed_requests_total", front="s3", op="PutObject", status="200", code="OK") == 0
        assert not any(k[0].startswith("gpufeed_tenant_") for k in mine)  # tenant labels off
        assert _get(mine, "gpufeed_buckets") == 0
        passes = _settled(oep.metrics, {}, "gpufeed_lifecycle_passes_total", 1, result="ok")
        assert _get(passes, "gpufeed_lifecycle_passes_total", result="ok") == 1  # the pass at start
    finally:
        other.stop()


def test_metrics_port_is_off_by_default(tmp_path):
    node = Node(NodeConfig.from_env(data_dir=tmp_path / "d", s3_port=0, port=0, fsync=False,
                                    lifecycle_interval_s=0))
    try:
        assert node.start().metrics is None
    finally:
        node.stop()


def test_admin_bucket_stats(mnode, s3):
    _, ep = mnode
    s3.create_bucket(Bucket="statbkt", ObjectLockEnabledForBucket=True)
    s3.put_object(Bucket="statbkt", Key="a", Body=b"1234")
    base = [sys.executable, "-m", "gpufeed", "admin", "--url", ep.s3, "--access-key", ep.access_key,
            "--secret-key", ep.secret_key, "bucket", "stats"]
    out = subprocess.run([*base, "statbkt", "--json"], capture_output=True, text=True, timeout=60, check=True)
    r = json.loads(out.stdout)
    assert (r["name"], r["owner"], r["objects"], r["bytes"], r["versioning"]) == ("statbkt", "default", 1, 4,
                                                                                   "Enabled")
    assert r["object_lock"] == {"enabled": True, "mode": "", "days": 0, "years": 0}
    assert r["kind"] == "standard" and r["created"] > 0 and r["etag_policy"] == "md5"
    assert r["quota"] == {"bytes": 0, "objects": 0}
    text = subprocess.run([*base, "statbkt"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "owner       default" in text and "object lock enabled" in text
    missing = subprocess.run([*base, "nosuchbkt", "--json"], capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "NoSuchBucket" in missing.stderr + missing.stdout
    with pytest.raises(NoSuchBucket):
        RemoteAdmin(ep.s3, ep.access_key, ep.secret_key).bucket_stats("nosuchbkt")


def test_admin_bucket_stats_on_a_stopped_node(tmp_path):
    node = Node(_config(tmp_path / "d"))
    ep = node.start()
    c = boto3.client("s3", endpoint_url=ep.s3, aws_access_key_id=ep.access_key,
                     aws_secret_access_key=ep.secret_key, region_name="us-east-1")
    c.create_bucket(Bucket="offline")
    c.put_bucket_versioning(Bucket="offline", VersioningConfiguration={"Status": "Suspended"})
    node.stop()
    local = LocalAdmin(tmp_path / "d")
    try:
        r = local.bucket_stats("offline")
    finally:
        local.close()
    assert (r["owner"], r["objects"], r["versioning"], r["object_lock"]["enabled"]) == ("default", 0,
                                                                                         "Suspended", False)
