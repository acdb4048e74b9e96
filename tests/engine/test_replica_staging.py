"""The replica side of second-site replication, on an engine: what a node
killed between staging a chunk and logging its arrival leaves behind is still
counted as received once (not lost, not a duplicate), and a real resend is a
duplicate."""

from __future__ import annotations

import os

import blake3

from gpufeed.engine import Engine
from gpufeed.engine._replica import STAGING_DIR

SOURCE = "http://127.0.0.1:1/src"


def _chunk(n: int) -> tuple[str, bytes]:
    data = os.urandom(1000 + n)
    return blake3.blake3(data).hexdigest(), data


def test_a_chunk_staged_but_not_logged_counts_once(tmp_path):
    with Engine(tmp_path / "d", fsync=False) as e:
        e.claim_replica("rep", SOURCE)
        (d1, c1), (d2, c2) = _chunk(1), _chunk(2)
        assert e.replica_put_chunk("rep", SOURCE, d1, c1) is True
        # the state of a kill -9 after the staged file's rename, before its log line
        (tmp_path / "d" / STAGING_DIR / "rep" / d2).write_bytes(c2)
        st = e.replica_status("rep")
        assert (st["staged_chunks"], st["round_chunks_received"], st["round_duplicate_chunks"]) == (2, 2, 0)
        assert e.replica_lacking("rep", SOURCE, [d1, d2]) == []  # neither is asked for again
        e.replica_commit("rep", SOURCE, "k", [d1, d2], size=len(c1) + len(c2))
        done = e.replica_end_round("rep", SOURCE, "snap-1", 1.0)
        assert (done["chunks_received"], done["duplicate_chunks"], done["rounds"]) == (2, 0, 1)
        with e.open_version("rep", "k") as h:
            buf = bytearray(h.info.size)
            assert h.read_into(buf, 0) == len(buf) and bytes(buf) == c1 + c2


def test_a_chunk_sent_again_is_a_duplicate(tmp_path):
    with Engine(tmp_path / "d", fsync=False) as e:
        e.claim_replica("rep", SOURCE)
        d1, c1 = _chunk(1)
        assert e.replica_put_chunk("rep", SOURCE, d1, c1) is True
        assert e.replica_put_chunk("rep", SOURCE, d1, c1) is False
        st = e.replica_status("rep")
        assert (st["round_chunks_received"], st["round_duplicate_chunks"]) == (2, 1)


def test_start_removes_staging_of_a_promoted_bucket_and_cut_off_temp_files(tmp_path):
    d = tmp_path / "d"
    with Engine(d, fsync=False) as e:
        for b in ("gone", "live"):
            e.claim_replica(b, SOURCE)
            d1, c1 = _chunk(1)
            e.replica_put_chunk(b, SOURCE, d1, c1)
        e.promote_replica("gone")
        # a chunk that was being staged as "gone" was promoted lands after the promotion
        late, data = _chunk(3)
        (d / STAGING_DIR / "gone").mkdir(exist_ok=True)
        (d / STAGING_DIR / "gone" / late).write_bytes(data)
        (d / STAGING_DIR / "live" / ".tmp-cut").write_bytes(b"half a chunk")  # a kill mid-write
    with Engine(d, fsync=False) as e:
        assert e.recovered["replica_staging"] == 2
        assert not (d / STAGING_DIR / "gone").exists()
        assert sorted(os.listdir(d / STAGING_DIR / "live")) == sorted([".received", d1])
        assert e.replica_status("live")["staged_chunks"] == 1
