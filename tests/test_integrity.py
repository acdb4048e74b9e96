"""Integrity on every read, end to end: stored data is damaged under a running
node (bit flips, truncated and deleted data files) and every object is read back
through S3 (boto3), the fast path over TCP and shm, and the zero-copy map; then
scrub runs. Nothing damaged may be served as good data, nothing good may fail,
and a fast-path connection must stay usable after a failed read."""

from __future__ import annotations

import pytest
from rich.console import Console

from gpufeed.bench.integrity import run_integrity


@pytest.mark.parametrize("seed", [1, 2])
def test_damage_is_always_detected_on_every_path(tmp_path, seed):
    out = run_integrity(objects=90, seed=seed, data_dir=str(tmp_path), console=Console(quiet=True))
    rows = {r["path"]: r for r in out["results"]}
    assert set(rows) == {"s3", "tcp", "shm", "shm_get_into", "zero_copy_map"}
    for r in rows.values():
        assert r["damaged"] > 20 and r["reads"] - r["damaged"] > 5, r  # both kinds were read
    failed = [t for t in out["targets"] if not t["met"]]
    assert failed == [], failed
    assert out["scrub"]["found"] == out["scrub"]["damaged_chunks"] > 0
