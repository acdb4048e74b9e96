"""What a node does for its data folder beyond serving: keeping it private
(warnings at start) and the lifecycle worker (rules and idle uploads)."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from gpufeed.config import NodeConfig
from gpufeed.node import Node
from gpufeed.testing.node import start_node


def _config(data_dir, **kw) -> NodeConfig:
    return NodeConfig(data_dir=data_dir, s3_port=0, port=0, fsync=False, **kw)


def _wait_for(cond, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_new_node_folder_and_socket_folder_are_private(tmp_path, umask_022):
    data = tmp_path / "data"
    node = Node(_config(data, socket_path=str(data / "run" / "s.sock"), lifecycle_interval_s=0))
    try:
        ep = node.start()
        assert ep.warnings == () and ep.as_dict()["warnings"] == []
        assert stat.S_IMODE(os.lstat(data).st_mode) == 0o700
        assert stat.S_IMODE(os.lstat(data / "run").st_mode) == 0o700
        assert node._lifecycle is None  # interval 0: no worker
    finally:
        node.stop()


def test_pre_existing_0755_folder_warns_in_startup_line(tmp_path, umask_022):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    node = Node(_config(data, lifecycle_interval_s=0))
    try:
        ep = node.start()
        (warning,) = ep.warnings
        assert "(0755)" in warning and "chmod -R go-rwx" in warning
        assert json.loads(json.dumps(ep.as_dict()))["warnings"] == [warning]
    finally:
        node.stop()


def test_worker_aborts_idle_uploads_and_stops(tmp_path):
    node = Node(_config(tmp_path / "data", lifecycle_interval_s=0.1, abort_idle_uploads_s=0.5))
    try:
        node.start()
        eng = node.engine
        eng.create_bucket("bkt")
        eng.create_multipart_upload("bkt", "left-behind")
        assert _wait_for(lambda: eng.list_multipart_uploads("bkt") == [])
        worker = node._lifecycle
    finally:
        node.stop()
    assert not worker._thread.is_alive()


def test_serve_warns_and_runs_lifecycle_from_env(tmp_path):
    """``gpufeed serve`` as a user runs it: settings from the environment, the warning in its log."""
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    proc = start_node(data, env={"GPUFEED_LIFECYCLE_INTERVAL_S": "0.2", "GPUFEED_ABORT_IDLE_UPLOADS_S": "1"})
    try:
        s3 = proc.boto3_client()
        s3.create_bucket(Bucket="bkt")
        s3.create_multipart_upload(Bucket="bkt", Key="crashed")
        assert _wait_for(lambda: "Uploads" not in s3.list_multipart_uploads(Bucket="bkt"))
        s3.close()
    finally:
        assert proc.stop() == 0
    assert "open to other local users" in proc.log_path.read_text()


def test_lifecycle_settings_defaults_and_env(monkeypatch):
    monkeypatch.delenv("GPUFEED_LIFECYCLE_INTERVAL_S", raising=False)
    monkeypatch.delenv("GPUFEED_ABORT_IDLE_UPLOADS_S", raising=False)
    cfg = NodeConfig.from_env()
    assert (cfg.lifecycle_interval_s, cfg.abort_idle_uploads_s) == (3600.0, 7 * 86400.0)
    monkeypatch.setenv("GPUFEED_LIFECYCLE_INTERVAL_S", "60")
    monkeypatch.setenv("GPUFEED_ABORT_IDLE_UPLOADS_S", "0")
    cfg = NodeConfig.from_env()
    assert (cfg.lifecycle_interval_s, cfg.abort_idle_uploads_s) == (60.0, 0.0)
    monkeypatch.setenv("GPUFEED_ABORT_IDLE_UPLOADS_S", "-1")
    with pytest.raises(ValueError, match="GPUFEED_ABORT_IDLE_UPLOADS_S"):
        NodeConfig.from_env()


def test_snapshot_worker_runs_bucket_schedules(tmp_path):
    node = Node(_config(tmp_path / "data", lifecycle_interval_s=0, snapshot_interval_s=0.2))
    try:
        node.start()
        engine = node.engine
        assert engine is not None and node._snapshots is not None
        engine.create_bucket("scheduled")
        engine.put_object("scheduled", "k", b"v")
        engine.set_snapshot_schedule("scheduled", hourly=2, daily=1)
        assert _wait_for(lambda: {s.kind for s in engine.list_snapshots("scheduled")} == {"hourly", "daily"})
        names = sorted(s.name for s in engine.list_snapshots("scheduled"))
        assert names[0].startswith("auto-daily-") and names[1].startswith("auto-hourly-")
        assert engine.get_object("scheduled", "k", snapshot=names[1]) == b"v"
    finally:
        node.stop()
    off = Node(_config(tmp_path / "data2", lifecycle_interval_s=0, snapshot_interval_s=0))
    try:
        off.start()
        assert off._snapshots is None  # interval 0: no worker
    finally:
        off.stop()
