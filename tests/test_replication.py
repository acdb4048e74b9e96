"""Replication to a second site between two real nodes (``gpufeed serve``
subprocesses on 127.0.0.1): boto3 writes to the source, rounds run through the
source's admin API, the target reads back bit-identical, deletes propagate, a
round with nothing new sends nothing, and a target bucket that is not empty
is refused with nothing lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from gpufeed._replica_client import ReplicaClient
from gpufeed.admin import RemoteAdmin
from gpufeed.engine._replica import STAGING_DIR
from gpufeed.errors import BucketNotEmpty, InvalidRequestError, NoSuchReplicationRule, ReplicationTargetUnavailable
from gpufeed.replication import CHUNK_BYTES
from gpufeed.testing.node import start_node

_MANUAL = {"GPUFEED_REPLICATION_INTERVAL_S": "0"}  # rounds run when the test asks


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """``(source, target)`` nodes whose rounds run only on request."""
    root = tmp_path_factory.mktemp("repl")
    source = start_node(root / "source", env=_MANUAL)
    target = start_node(root / "target", env=_MANUAL)
    yield source, target
    for n in (source, target):
        assert n.stop() == 0, n.log_path.read_text()


@pytest.fixture(scope="module")
def clients(pair):
    """boto3 clients of ``(source, target)``."""
    made = [n.boto3_client() for n in pair]
    yield made
    for c in made:
        c.close()


def _admin(node) -> RemoteAdmin:
    return RemoteAdmin(node.s3_url, node.access_key, node.secret_key, timeout_s=120)


def _contents(s3, bucket: str) -> dict[str, bytes]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def test_a_bucket_replicates_round_by_round(pair, clients):
    source, target = pair
    src, dst = clients
    bucket, tb = "r-" + uuid.uuid4().hex[:8], "copy-" + uuid.uuid4().hex[:8]
    src.create_bucket(Bucket=bucket)
    big = os.urandom(2 * CHUNK_BYTES + 12345)  # 3 chunks
    src.put_object(Bucket=bucket, Key="big", Body=big, ContentType="application/x-big", Metadata={"who": "me"})
    src.put_object(Bucket=bucket, Key="empty", Body=b"")
    src.put_object(Bucket=bucket, Key="dir/small", Body=b"small", Tagging="t=1")
    src.put_object(Bucket=bucket, Key="gone-later", Body=b"bye")
    a = _admin(source)
    rule = a.replication_add(bucket, target.s3_url, tb, target.access_key, target.secret_key)
    assert (rule["state"], rule["behind_objects"], rule["last_snapshot"]) == ("idle", 4, "")
    assert "secret_key" not in rule and "access_key" not in rule

    first = a.replication_sync(bucket)
    assert (first["objects_sent"], first["chunks_sent"], first["deleted"]) == (4, 5, 0)  # "empty" has none
    assert first["bytes_sent"] == len(big) + len(b"small") + len(b"bye")
    assert _contents(dst, tb) == _contents(src, bucket)
    got = dst.head_object(Bucket=tb, Key="big")
    assert (got["ContentType"], got["Metadata"]) == ("application/x-big", {"who": "me"})
    assert dst.get_object_tagging(Bucket=tb, Key="dir/small")["TagSet"] == [{"Key": "t", "Value": "1"}]
    status = a.replication_status(bucket)
    assert (status["state"], status["behind_objects"], status["lag_s"], status["rounds"]) == ("idle", 0, 0.0, 1)
    assert status["last_snapshot"] == first["snapshot"]

    again = a.replication_sync(bucket)  # nothing new: nothing sent
    assert (again["objects_sent"], again["chunks_sent"], again["bytes_sent"]) == (0, 0, 0)

    changed = bytearray(big)
    changed[-1] ^= 0xFF  # the last chunk only
    src.put_object(Bucket=bucket, Key="big", Body=bytes(changed))
    src.delete_object(Bucket=bucket, Key="gone-later")
    src.put_object(Bucket=bucket, Key="new", Body=b"new!")
    status = a.replication_status(bucket)
    assert (status["behind_objects"], status["behind_bytes"]) == (3, len(changed) + 4)
    assert status["lag_s"] > 0
    third = a.replication_sync(bucket)
    # of the changed object only its last chunk travels: the target copies the two others from its version
    assert (third["objects_sent"], third["chunks_sent"], third["deleted"]) == (2, 2, 1)
    assert _contents(dst, tb) == _contents(src, bucket)
    assert "gone-later" not in _contents(dst, tb)
    snaps = [s["name"] for s in a.snapshot_list(bucket)["snapshots"]]
    assert snaps == [third["snapshot"]]  # the previous base was pruned

    with pytest.raises(ClientError) as err:  # the target is read-only
        dst.put_object(Bucket=tb, Key="x", Body=b"x")
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    replica = _admin(target).replica_status(tb)
    assert (replica["snapshot"], replica["rounds"], replica["duplicate_chunks"]) == (third["snapshot"], 3, 0)

    a.replication_pause(bucket)
    assert a.replication_status(bucket)["state"] == "paused"
    with pytest.raises(InvalidRequestError, match="paused"):
        a.replication_sync(bucket)
    a.replication_pause(bucket, False)
    _admin(target).replica_failover(tb)
    dst.put_object(Bucket=tb, Key="x", Body=b"x")  # promoted: writable
    with pytest.raises(InvalidRequestError, match="not a replica"):  # the old rule cannot write there any more
        src.put_object(Bucket=bucket, Key="after", Body=b"1")
        a.replication_sync(bucket)
    assert a.replication_status(bucket)["state"] == "error"
    a.replication_remove(bucket)
    assert a.snapshot_list(bucket)["snapshots"] == []
    with pytest.raises(NoSuchReplicationRule):
        a.replication_status(bucket)


def _tags(s3, bucket: str, key: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


def test_a_tag_only_change_reaches_the_target_without_data(pair, clients):
    source, target = pair
    src, dst = clients
    bucket, tb = "t-" + uuid.uuid4().hex[:8], "tcopy-" + uuid.uuid4().hex[:8]
    src.create_bucket(Bucket=bucket)
    body = os.urandom(CHUNK_BYTES + 99)
    src.put_object(Bucket=bucket, Key="a", Body=body, Tagging="team=x")
    src.put_object(Bucket=bucket, Key="b", Body=b"bee", Tagging="keep=1")
    src.put_object(Bucket=bucket, Key="c", Body=b"sea")
    a = _admin(source)
    a.replication_add(bucket, target.s3_url, tb, target.access_key, target.secret_key)
    a.replication_sync(bucket)
    src.put_object_tagging(Bucket=bucket, Key="a", Tagging={"TagSet": [{"Key": "team", "Value": "y"},
                                                                         {"Key": "tier", "Value": "cold"}]})
    src.delete_object_tagging(Bucket=bucket, Key="b")
    src.put_object_tagging(Bucket=bucket, Key="c", Tagging={"TagSet": [{"Key": "new", "Value": "1"}]})
    assert a.replication_status(bucket)["behind_objects"] == 3
    etag_before = dst.head_object(Bucket=tb, Key="a")["ETag"]
    result = a.replication_sync(bucket)
    assert (result["retagged"], result["objects_sent"], result["chunks_sent"], result["bytes_sent"]) == (3, 0, 0, 0)
    assert _tags(dst, tb, "a") == {"team": "y", "tier": "cold"}
    assert _tags(dst, tb, "b") == {}
    assert _tags(dst, tb, "c") == {"new": "1"}
    assert dst.get_object(Bucket=tb, Key="a")["Body"].read() == body
    assert dst.head_object(Bucket=tb, Key="a")["ETag"] == etag_before
    status = a.replication_status(bucket)
    assert (status["behind_objects"], status["retagged"]) == (0, 3)
    # tags changed together with the data travel with the new version
    src.put_object(Bucket=bucket, Key="c", Body=b"sea2", Tagging="v=2")
    assert a.replication_sync(bucket)["objects_sent"] == 1
    assert (_tags(dst, tb, "c"), dst.get_object(Bucket=tb, Key="c")["Body"].read()) == ({"v": "2"}, b"sea2")
    # a retagged key the target lacks (deleted there by a replica call of the rule) is sent whole
    rc = ReplicaClient(target.s3_url, tb, status["id"], target.access_key, target.secret_key)
    rc.delete("b")
    rc.close()
    src.put_object_tagging(Bucket=bucket, Key="b", Tagging={"TagSet": [{"Key": "back", "Value": "1"}]})
    result = a.replication_sync(bucket)
    assert (result["retagged"], result["objects_sent"]) == (0, 1)
    assert (_tags(dst, tb, "b"), dst.get_object(Bucket=tb, Key="b")["Body"].read()) == ({"back": "1"}, b"bee")
    a.replication_remove(bucket)


def test_a_rule_whose_target_is_its_own_source_bucket_is_refused(pair, clients):
    source, _ = pair
    src, _ = clients
    a = _admin(source)
    for filled in (False, True):
        bucket = "self-" + uuid.uuid4().hex[:8]
        src.create_bucket(Bucket=bucket)
        if filled:
            src.put_object(Bucket=bucket, Key="k", Body=b"v")
        with pytest.raises(InvalidRequestError, match="own source bucket"):
            a.replication_add(bucket, source.s3_url, bucket, source.access_key, source.secret_key)
        src.put_object(Bucket=bucket, Key="after", Body=b"still writable")
        with pytest.raises(NoSuchReplicationRule):
            a.replication_status(bucket)
    other = "other-" + uuid.uuid4().hex[:8]  # another bucket of the same node is a fine target
    src.create_bucket(Bucket=other)
    a.replication_add(other, source.s3_url, other + "-copy", source.access_key, source.secret_key)
    a.replication_remove(other)


def test_a_target_bucket_that_is_not_empty_is_refused_and_kept(pair, clients):
    source, target = pair
    src, dst = clients
    bucket, tb = "r-" + uuid.uuid4().hex[:8], "full-" + uuid.uuid4().hex[:8]
    src.create_bucket(Bucket=bucket)
    src.put_object(Bucket=bucket, Key="a", Body=b"source data")
    dst.create_bucket(Bucket=tb)
    dst.put_object(Bucket=tb, Key="a", Body=b"target data")
    a = _admin(source)
    with pytest.raises(BucketNotEmpty, match="not empty"):
        a.replication_add(bucket, target.s3_url, tb, target.access_key, target.secret_key)
    with pytest.raises(NoSuchReplicationRule):
        a.replication_status(bucket)
    assert dst.get_object(Bucket=tb, Key="a")["Body"].read() == b"target data"
    dst.put_object(Bucket=tb, Key="b", Body=b"still writable")


def test_the_node_replicates_in_the_background(tmp_path):
    source = start_node(tmp_path / "source", env={"GPUFEED_REPLICATION_INTERVAL_S": "0.2"})
    target = start_node(tmp_path / "target", env=_MANUAL)
    try:
        src, dst = source.boto3_client(), target.boto3_client()
        src.create_bucket(Bucket="bgr")
        src.put_object(Bucket="bgr", Key="k", Body=b"in the background")
        _admin(source).replication_add("bgr", target.s3_url, "bgr", target.access_key, target.secret_key)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not dst.list_objects_v2(Bucket="bgr").get("KeyCount"):
            time.sleep(0.1)
        assert dst.get_object(Bucket="bgr", Key="k")["Body"].read() == b"in the background"
        src.close()
        dst.close()
    finally:
        for n in (source, target):
            assert n.stop() == 0, n.log_path.read_text()


def _gf(*args, check=True):
    out = subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_the_replicate_command(pair, clients):
    source, target = pair
    src, dst = clients
    bucket = "cli-" + uuid.uuid4().hex[:8]
    src.create_bucket(Bucket=bucket)
    src.put_object(Bucket=bucket, Key="a", Body=b"via the command line")
    on_src = ["replicate", "--endpoint", source.s3_url, "--access-key", source.access_key,
              "--secret-key", source.secret_key]
    on_dst = ["replicate", "--endpoint", target.s3_url, "--access-key", target.access_key,
              "--secret-key", target.secret_key]
    added = json.loads(_gf(*on_src, "add", bucket, "--target", target.s3_url, "--target-access-key",
                           target.access_key, "--target-secret-key", target.secret_key, "--json").stdout)
    assert (added["target_bucket"], added["behind_objects"]) == (bucket, 1)
    assert "1 objects, 1 chunks" in _gf(*on_src, "sync", bucket).stdout
    table = _gf(*on_src, "status").stdout
    assert bucket in table and "idle" in table
    status = json.loads(_gf(*on_src, "status", bucket, "--json").stdout)
    assert (status["state"], status["rounds"], status["behind_objects"]) == ("idle", 1, 0)
    assert "paused" in _gf(*on_src, "pause", bucket).stdout
    assert json.loads(_gf(*on_src, "status", bucket, "--json").stdout)["state"] == "paused"
    assert "resumed" in _gf(*on_src, "resume", bucket).stdout
    refused = _gf(*on_src, "add", bucket + "-x", "--target", target.s3_url, "--target-access-key", "k",
                  "--target-secret-key", "s", check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    replica = json.loads(_gf(*on_dst, "replica-status", bucket, "--json").stdout)
    assert (replica["rounds"], replica["chunks_received"], replica["staged_chunks"]) == (1, 1, 0)
    assert f"{bucket}: replica of {replica['source']}, last snapshot {replica['snapshot']}" in _gf(
        *on_dst, "replica-status", bucket).stdout
    assert "writable" in _gf(*on_dst, "failover", bucket).stdout
    promoted = json.loads(_gf(*on_dst, "replica-status", bucket, "--json").stdout)
    assert promoted["promoted"] is True and promoted["source"] == replica["source"]
    assert promoted["snapshot"] == replica["snapshot"] and promoted["promoted_at"] > 0
    assert f"{bucket}: promoted to a writable bucket" in _gf(*on_dst, "replica-status", bucket).stdout
    dst.put_object(Bucket=bucket, Key="b", Body=b"after failover")
    assert "removed" in _gf(*on_src, "remove", bucket).stdout


def _sync_in_thread(a: RemoteAdmin, bucket: str, failed: list) -> threading.Thread:
    """A round of ``bucket`` on a thread; what it raises goes to ``failed``."""
    def run() -> None:
        try:
            a.replication_sync(bucket)
        except Exception as exc:  # a node dies under it
            failed.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    return worker


def _wait_staged(target, worker: threading.Thread, count: int) -> None:
    """Wait until the target has staged ``count`` chunks of bucket ``cut`` (or the round ended)."""
    staging = target.data_dir / STAGING_DIR / "cut"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and worker.is_alive():
        if staging.is_dir() and sum(len(n) == 64 for n in os.listdir(staging)) >= count:
            return
        time.sleep(0.005)


def test_a_round_cut_by_a_killed_target_resumes_without_sending_a_chunk_twice(tmp_path):
    source = start_node(tmp_path / "source", env=_MANUAL)
    target = start_node(tmp_path / "target", env=_MANUAL)
    src = source.boto3_client()
    try:
        src.create_bucket(Bucket="cut")
        objects = {f"o{i}": os.urandom(3 * CHUNK_BYTES) for i in range(8)}  # 24 distinct chunks
        for key, data in objects.items():
            src.put_object(Bucket="cut", Key=key, Body=data)
        a = _admin(source)
        a.replication_add("cut", target.s3_url, "cut", target.access_key, target.secret_key)
        failed: list[Exception] = []
        worker = _sync_in_thread(a, "cut", failed)
        _wait_staged(target, worker, 5)
        target.proc.kill()  # kill -9 mid-transfer
        target.proc.wait()
        worker.join(120)
        assert failed and isinstance(failed[0], ReplicationTargetUnavailable), failed
        cut = a.replication_status("cut")
        assert cut["state"] == "error" and cut["round"] is not None
        assert 0 < cut["chunks_sent"] < 24

        port = target.s3_url.rsplit(":", 1)[1]  # the rule names the target's address: same port
        target.stop()
        target = start_node(target.data_dir, env=_MANUAL, extra_args=["--s3-port", port])
        resumed = a.replication_sync("cut")
        assert resumed["resumed"] and resumed["snapshot"] == cut["round"]["snapshot"]
        done = a.replication_status("cut")
        assert done["chunks_sent"] <= 24  # none twice (a chunk staged as the target died is not resent)
        replica = _admin(target).replica_status("cut")
        assert (replica["duplicate_chunks"], replica["rounds"]) == (0, 1)
        assert replica["chunks_received"] == 24  # every chunk arrived exactly once
        dst = target.boto3_client()
        assert _contents(dst, "cut") == objects
        dst.close()
    finally:
        src.close()
        for n in (source, target):
            n.stop()


def test_a_round_cut_by_a_killed_source_resumes_after_its_restart(tmp_path):
    source = start_node(tmp_path / "source", env=_MANUAL)
    target = start_node(tmp_path / "target", env=_MANUAL)
    try:
        src = source.boto3_client()
        src.create_bucket(Bucket="cut")
        objects = {f"o{i}": os.urandom(3 * CHUNK_BYTES) for i in range(8)}
        for key, data in objects.items():
            src.put_object(Bucket="cut", Key=key, Body=data)
        src.close()
        a = _admin(source)
        a.replication_add("cut", target.s3_url, "cut", target.access_key, target.secret_key)
        failed: list[Exception] = []
        worker = _sync_in_thread(a, "cut", failed)
        _wait_staged(target, worker, 5)
        source.proc.kill()  # kill -9 of the source mid-transfer
        source.proc.wait()
        worker.join(120)
        assert failed  # the round broke off
        source.stop()
        source = start_node(source.data_dir, env=_MANUAL)
        a = _admin(source)
        assert a.replication_status("cut")["round"] is not None  # left open
        resumed = a.replication_sync("cut")
        assert resumed["resumed"]
        replica = _admin(target).replica_status("cut")
        assert (replica["duplicate_chunks"], replica["chunks_received"], replica["rounds"]) == (0, 24, 1)
        dst = target.boto3_client()
        assert _contents(dst, "cut") == objects
        dst.close()
    finally:
        for n in (source, target):
            n.stop()


def test_adding_a_rule_for_a_target_that_is_down_or_refuses_the_key_is_a_clear_error(node, s3):
    """A target nobody listens on is 503 ReplicationTargetUnavailable, a wrong target
    key says it is the target's key; neither adds a rule (no traceback, no 500)."""
    import socket

    from gpufeed.errors import NoSuchReplicationRule, ReplicationTargetUnavailable, SignatureDoesNotMatch

    bucket = f"down-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # a port nothing listens on once this closes
    admin = _admin(node)
    try:
        with pytest.raises(ReplicationTargetUnavailable, match="cannot be reached"):
            admin.replication_add(bucket, f"http://127.0.0.1:{closed}", bucket, "AK", "secret-secret")
        with pytest.raises(SignatureDoesNotMatch, match="target key"):
            admin.replication_add(bucket, node.s3_url, bucket + "-r", node.access_key, "not-the-secret")
        with pytest.raises(NoSuchReplicationRule):
            admin.replication_status(bucket)
    finally:
        admin.close()
