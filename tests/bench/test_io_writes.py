"""``gpufeed bench io``'s write rows and GET pair: present, positive, and their ratios computed."""

from __future__ import annotations

import json

import pytest

from gpufeed.bench.io import run_io_bench


@pytest.mark.slow
def test_io_bench_write_rows(tmp_path):
    path = tmp_path / "io.json"
    out = run_io_bench(size=16 << 20, paths=["local", "shm", "s3"], repeat=2, lat_samples=20,
                       iops_seconds=0.1, quiet=True, json_path=str(path))
    assert json.loads(path.read_text())["ratios"] == out["ratios"]
    rows = {r["path"]: r for r in out["writes"]}
    want = {"local_write_fsync", "shm_put", "s3_put", "s3_put_multipart", "boto3_put_40m_nochecksum",
            "http_fileresponse_get", "s3_get"}
    assert want <= set(rows)
    for r in rows.values():
        assert r["gbps"] > 0 and r["client_cpu_s_per_gb"] >= 0 and r["server_cpu_s_per_gb"] >= 0
    assert rows["local_write_fsync"]["server_cpu_s_per_gb"] == 0  # no server in the limit
    ratios = out["ratios"]
    assert ratios["s3_put_vs_local_write_fsync"] == rows["s3_put"]["gbps"] / rows["local_write_fsync"]["gbps"]
    assert ratios["s3_get_vs_http_fileresponse"] > 0
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        assert "pyarrow_put_40m" not in rows and out["notes"]
    else:
        assert "pyarrow_put_40m_vs_boto3_nochecksum" in ratios
