"""``gpufeed bench io``'s floors: measured in the run, and the shm/tcp rows stated against them."""

from __future__ import annotations

import pytest

from gpufeed.bench._io_floors import echo_floor, preadv_floor
from gpufeed.bench.io import run_io_bench


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_echo_floor_times_real_round_trips(tcp):
    p50, p99 = echo_floor(samples=300, tcp=tcp)
    assert 0 < p50 <= p99


def test_preadv_floor_reads_the_file(tmp_path):
    f = tmp_path / "data.bin"
    f.write_bytes(b"\1" * (1 << 20))
    assert preadv_floor(str(f), 1 << 20, seconds=0.05) > 0


@pytest.mark.slow
def test_io_bench_states_small_reads_against_the_floors():
    out = run_io_bench(size=8 << 20, paths=["shm", "tcp"], repeat=1, lat_samples=50, iops_seconds=0.1,
                       quiet=True, writes=False)
    floors = out["floors"]
    assert floors["unix_round_trip_p50_us"] > 0 and floors["preadv_4k_iops"] > 0
    assert floors["tcp_round_trip_p50_us"] > 0
    trip = {"shm": floors["unix_round_trip_p50_us"], "tcp": floors["tcp_round_trip_p50_us"]}
    for r in out["results"]:
        if r["path"] in ("shm", "tcp"):
            assert r["p50_vs_floor"] == round(r["p50_us"] / trip[r["path"]], 2)
            assert r["iops_vs_floor"] == round(r["iops_4k"] / floors["preadv_4k_iops"], 3)
