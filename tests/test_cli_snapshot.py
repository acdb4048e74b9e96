"""``gpufeed snapshot`` as a user runs it (a subprocess): against a running
node (``--endpoint``) and a stopped node's data folder (``--data-dir``),
with its refusals (path characters, a missing snapshot, a locked restore)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

from gpufeed.engine import Engine
from gpufeed.engine.types import Retention


def _gf(*args, check=True, env=None):
    out = subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=60)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_snapshot_commands_on_a_running_node(node, s3):
    bucket = "clisnap-" + uuid.uuid4().hex[:8]
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="a", Body=b"1")
    s3.put_object(Bucket=bucket, Key="b", Body=b"22")
    base = ["snapshot", "--endpoint", node.s3_url, "--access-key", node.access_key, "--secret-key", node.secret_key]
    made = json.loads(_gf(*base, "create", bucket, "s1", "--json").stdout)
    assert (made["name"], made["objects"], made["bytes"]) == ("s1", 2, 3)
    s3.put_object(Bucket=bucket, Key="a", Body=b"changed")
    s3.delete_object(Bucket=bucket, Key="b")
    s3.put_object(Bucket=bucket, Key="c", Body=b"3")
    assert "s1\t" in _gf(*base, "list", bucket).stdout
    assert _gf(*base, "diff", bucket, "s1").stdout.split("\n")[:3] == ["+ c", "~ a", "- b"]
    out = _gf(*base, "restore", bucket, "s1").stdout
    assert out.strip() == "restored 2, deleted 1, unchanged 0"
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"1"
    assert "(no differences)" in _gf(*base, "diff", bucket, "s1").stdout
    assert _gf(*base, "schedule", bucket, "--daily", "7").stdout.strip() == "hourly: keep 0, daily: keep 7"
    _gf(*base, "schedule", bucket, "--daily", "0")
    bad = _gf(*base, "create", bucket, "../../etc", check=False)
    assert bad.returncode == 1 and "InvalidArgument" in bad.stderr and "path characters" in bad.stderr
    missing = _gf(*base, "delete", bucket, "nope", check=False)
    assert missing.returncode == 1 and "NoSuchSnapshot" in missing.stderr
    _gf(*base, "delete", bucket, "s1")
    assert "(no snapshots)" in _gf(*base, "list", bucket).stdout


def test_snapshot_commands_on_a_stopped_node(tmp_path):
    data = tmp_path / "data"
    with Engine(data, fsync=False) as e:
        e.create_bucket("locked", object_lock=True)
        e.put_object("locked", "k", b"v1")
    base = ["snapshot", "--data-dir", str(data)]
    _gf(*base, "create", "locked", "before")
    with Engine(data, fsync=False) as e:
        e.put_object("locked", "k", b"v2", retention=Retention("COMPLIANCE", time.time() + 3600))
    refused = _gf(*base, "restore", "locked", "before", check=False)
    assert refused.returncode == 1 and "AccessDenied" in refused.stderr and "'k'" in refused.stderr
    listed = json.loads(_gf(*base, "list", "locked", "--json").stdout)["snapshots"]
    assert [(s["name"], s["objects"]) for s in listed] == [("before", 1)]
    assert json.loads(_gf(*base, "diff", "locked", "before", "--json").stdout)["changed"] == ["k"]
    with Engine(data, fsync=False) as e:
        assert e.get_object("locked", "k") == b"v2"
        assert e.get_object("locked", "k", snapshot="before") == b"v1"
