"""The aws CLI (v1, ``.venv/bin/aws``) against a real ``gpufeed serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

AWS = Path(sys.executable).with_name("aws")
pytestmark = pytest.mark.skipif(not AWS.exists(), reason="aws CLI not installed in the venv")


@pytest.fixture(scope="module")
def aws(node, tmp_path_factory):
    """Run ``aws --endpoint-url <node> ARGS...``; returns stdout (raises on failure)."""
    home = tmp_path_factory.mktemp("awshome")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "AWS_ACCESS_KEY_ID": node.access_key,
        "AWS_SECRET_ACCESS_KEY": node.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_PAGER": "",
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(AWS), "--endpoint-url", node.s3_url, *args], env=env,
                              capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"aws {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    return run


@pytest.fixture
def cli_bucket(aws) -> str:
    name = f"cli-{uuid.uuid4().hex[:10]}"
    aws("s3", "mb", f"s3://{name}")
    return name


def test_cp_ls_rm(aws, cli_bucket, tmp_path):
    src = tmp_path / "file one.bin"
    data = os.urandom(300_000)
    src.write_bytes(data)
    aws("s3", "cp", str(src), f"s3://{cli_bucket}/dir/file one.bin")
    out = aws("s3", "ls", f"s3://{cli_bucket}/dir/").stdout
    assert "file one.bin" in out and "300000" in out
    assert "PRE dir/" in aws("s3", "ls", f"s3://{cli_bucket}").stdout
    assert cli_bucket in aws("s3", "ls").stdout
    dst = tmp_path / "back.bin"
    aws("s3", "cp", f"s3://{cli_bucket}/dir/file one.bin", str(dst))
    assert dst.read_bytes() == data
    aws("s3", "rm", f"s3://{cli_bucket}/dir/file one.bin")
    assert aws("s3", "ls", f"s3://{cli_bucket}/dir/", check=False).stdout == ""


def test_cp_multipart(aws, cli_bucket, tmp_path):
    src = tmp_path / "big.bin"
    data = os.urandom(20 << 20)  # above the CLI's 8 MiB multipart threshold
    src.write_bytes(data)
    aws("s3", "cp", str(src), f"s3://{cli_bucket}/big.bin")
    head = json.loads(aws("s3api", "head-object", "--bucket", cli_bucket, "--key", "big.bin").stdout)
    assert head["ContentLength"] == len(data) and head["ETag"].endswith('-3"')
    dst = tmp_path / "big.back"
    aws("s3", "cp", f"s3://{cli_bucket}/big.bin", str(dst))
    assert dst.read_bytes() == data


def test_sync_both_ways(aws, cli_bucket, tmp_path):
    src = tmp_path / "tree"
    files = {"a.txt": b"a", "sub/b.txt": b"bb", "sub/deeper/c.bin": os.urandom(5000), "space name.txt": b"s"}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    aws("s3", "sync", str(src), f"s3://{cli_bucket}/tree")
    listed = json.loads(aws("s3api", "list-objects-v2", "--bucket", cli_bucket, "--prefix", "tree/").stdout)
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(f"tree/{k}" for k in files)
    second = aws("s3", "sync", str(src), f"s3://{cli_bucket}/tree").stdout
    assert second.strip() == ""  # nothing changed: nothing uploaded
    dst = tmp_path / "back"
    aws("s3", "sync", f"s3://{cli_bucket}/tree", str(dst))
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data


def test_s3api_calls(aws, cli_bucket, tmp_path):
    body = tmp_path / "body"
    body.write_bytes(b"s3api body")
    aws("s3api", "put-object", "--bucket", cli_bucket, "--key", "api/k", "--body", str(body),
        "--content-type", "text/plain", "--metadata", "color=blue")
    head = json.loads(aws("s3api", "head-object", "--bucket", cli_bucket, "--key", "api/k").stdout)
    assert head["ContentType"] == "text/plain" and head["Metadata"] == {"color": "blue"}
    out = tmp_path / "out"
    aws("s3api", "get-object", "--bucket", cli_bucket, "--key", "api/k", "--range", "bytes=0-4", str(out))
    assert out.read_bytes() == b"s3api"
    missing = aws("s3api", "get-object", "--bucket", cli_bucket, "--key", "nope", str(out), check=False)
    assert missing.returncode != 0 and "NoSuchKey" in missing.stderr
    loc = json.loads(aws("s3api", "get-bucket-location", "--bucket", cli_bucket).stdout)
    assert loc["LocationConstraint"] is None
    aws("s3", "rb", f"s3://{cli_bucket}", "--force")
    gone = aws("s3api", "head-bucket", "--bucket", cli_bucket, check=False)
    assert gone.returncode != 0


def test_s3api_versioning_and_list_object_versions(aws, cli_bucket, tmp_path):
    """``aws s3api put-bucket-versioning`` / ``list-object-versions`` (the CLI
    paginates with NextKeyMarker / NextVersionIdMarker). Source: "ListObjectVersions",
    Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectVersions.html"""
    body = tmp_path / "body"
    body.write_bytes(b"v")
    aws("s3api", "put-object", "--bucket", cli_bucket, "--key", "pre", "--body", str(body))
    out = json.loads(aws("s3api", "list-object-versions", "--bucket", cli_bucket).stdout)
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in out["Versions"]] == [("pre", "null", True)]
    aws("s3api", "put-bucket-versioning", "--bucket", cli_bucket,
        "--versioning-configuration", "Status=Enabled")
    status = json.loads(aws("s3api", "get-bucket-versioning", "--bucket", cli_bucket).stdout)
    assert status["Status"] == "Enabled"
    ids = [json.loads(aws("s3api", "put-object", "--bucket", cli_bucket, "--key", f"k{i % 3}",
                          "--body", str(body)).stdout)["VersionId"] for i in range(7)]
    aws("s3api", "delete-object", "--bucket", cli_bucket, "--key", "k0")
    out = json.loads(aws("s3api", "list-object-versions", "--bucket", cli_bucket, "--page-size", "2").stdout)
    assert sorted(v["VersionId"] for v in out["Versions"]) == sorted(ids + ["null"])
    assert [(m["Key"], m["IsLatest"]) for m in out["DeleteMarkers"]] == [("k0", True)]
    newest_k1 = json.loads(aws("s3api", "head-object", "--bucket", cli_bucket, "--key", "k1").stdout)
    assert newest_k1["VersionId"] == ids[4]
