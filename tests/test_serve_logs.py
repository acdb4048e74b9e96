"""``gpufeed serve``: the start-up line, ``--access-log``, ``--log-level``, and a
second node on a data folder already in use."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import boto3
import pytest

from gpufeed.testing.node import start_node


def _serve(data_dir, *args, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpufeed", "serve", "--data-dir", str(data_dir), "--s3-port", "0", "--port", "0",
         "--socket", "", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})})


def _line(stream, timeout_s: float = 30.0) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    assert ready, "no line in time"
    return stream.readline()


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err.decode(errors="replace")


@pytest.mark.parametrize("how", ["default", "flag", "env"])
def test_startup_line_prints_secret_only_when_default(tmp_path, how):
    args, env = [], {}
    if how == "flag":
        args = ["--secret-key", "my-own-secret-1"]
    elif how == "env":
        env = {"GPUFEED_SECRET_KEY": "my-own-secret-2"}
    proc = _serve(tmp_path / "d", *args, env=env)
    try:
        line = _line(proc.stdout)
        info = json.loads(line)
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    if how == "default":
        assert info["secret_key"] == "gpufeed-secret-key"
    else:
        assert info["secret_key"] is None
        assert b"my-own-secret" not in line and "my-own-secret" not in err


def test_given_secret_still_usable_by_test_harness(tmp_path):
    node = start_node(tmp_path / "d", extra_args=["--secret-key", "harness-secret"])
    try:
        assert node.secret_key == "harness-secret"
        s3 = node.boto3_client()
        s3.create_bucket(Bucket="given")
        s3.close()
    finally:
        assert node.stop() == 0


def test_second_node_on_same_folder_names_the_holder(tmp_path):
    first = start_node(tmp_path / "d")
    try:
        second = _serve(tmp_path / "d")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert "DataFolderInUse: data folder" in err.decode() and "in use by another gpufeed node" in err.decode()
        assert f"process {first.pid}" in err.decode(), err
    finally:
        assert first.stop() == 0
    # the holder's pid does not outlive it: a later node starts cleanly
    again = start_node(tmp_path / "d")
    assert again.stop() == 0


def test_taken_port_is_named_and_leaves_no_data_folder(tmp_path):
    """A node whose S3 port is taken says which port, exits 1 and removes the folder it made."""
    first = start_node(tmp_path / "d")
    try:
        port = first.s3_url.rsplit(":", 1)[1]
        second = _serve(tmp_path / "new", "--s3-port", port)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert f"cannot listen for S3 on 127.0.0.1:{port}" in err.decode(), err
        assert "Traceback" not in err.decode()
        assert not (tmp_path / "new").exists()
    finally:
        assert first.stop() == 0


def test_access_log_on_stdout_and_error_log_with_request_ids(tmp_path):
    proc = _serve(tmp_path / "d", "--access-log", "-", "--log-level", "debug")
    try:
        info = json.loads(_line(proc.stdout))
        s3 = boto3.client("s3", endpoint_url=info["s3"], aws_access_key_id=info["access_key"],
                          aws_secret_access_key=info["secret_key"], region_name="us-east-1")
        rid = s3.create_bucket(Bucket="logged")["ResponseMetadata"]["RequestId"]
        access = json.loads(_line(proc.stdout))
        assert access["request_id"] == rid
        assert access["method"] == "PUT" and access["bucket"] == "logged" and access["status"] == 200
        with pytest.raises(s3.exceptions.NoSuchKey) as exc_info:
            s3.get_object(Bucket="logged", Key="nope")
        missing_id = exc_info.value.response["ResponseMetadata"]["RequestId"]
        access = json.loads(_line(proc.stdout))
        assert access["request_id"] == missing_id and access["error"] == "NoSuchKey"
        s3.close()
        time.sleep(0.2)
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    assert missing_id in err and "NoSuchKey" in err  # the DEBUG error line names the request id
