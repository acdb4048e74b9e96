"""Moving data off a nearly full node (``gpufeed serve --catalog
postgresql://... --cluster NAME`` subprocesses on one throwaway PostgreSQL,
replication factor 2): a node whose used bytes pass its high-water mark
publishes that it drains, moves copies of its data files to the members with
room (copy, record, then give its own up) until it is back under its
low-water mark, every file keeps two holders at every moment, and every object
reads back bit-identical through every node during and after the move."""

from __future__ import annotations

import os
import threading
import urllib.request

from gpufeed.engine._placement import rank
from gpufeed.engine._room import folder_bytes
from gpufeed.testing.node import NodeProcess, wait_for
from test_cluster_replicas import _copies, _has_file, _member, _node_id, _status

ENV = {"GPUFEED_CLUSTER_BYTES_INTERVAL_S": "0.3", "GPUFEED_CLUSTER_ORPHAN_GRACE_S": "2",
       "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.5"}
CAP = 4_000_000  # the small node's capacity: drains past 3.6 MB, down to 3.2 MB
OBJ = 100_000


class _Watch:
    """Checks, until stopped, that every data file has two holders in the catalog and
    that the objects read back whole through ``readers``; notes the draining rows seen."""

    def __init__(self, url: str, readers: tuple[NodeProcess, ...], want: dict[str, bytes], watcher: NodeProcess):
        self.url, self.want, self.watcher = url, want, watcher
        self.clients = [n.boto3_client() for n in readers]
        self.problems: list[str] = []
        self.draining_seen: list[dict] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        keys = sorted(self.want)
        while not self._stop.is_set():
            try:
                short = {f: h for f, h in _copies(self.url).items() if len(h) < 2}
                if short:
                    self.problems.append(f"files with fewer than two holders: {short}")
                self.draining_seen += [n for n in _status(self.watcher)["nodes"] if n["draining"]]
                key = keys[self.rounds % len(keys)]
                for s3 in self.clients:
                    if s3.get_object(Bucket="bkt", Key=key)["Body"].read() != self.want[key]:
                        self.problems.append(f"{key} read back different")
                self.rounds += 1
            except Exception as exc:  # reported by the test
                self.problems.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_a_node_past_its_high_water_mark_moves_files_off_until_under_its_low_water_mark(tmp_path, postgres_url):
    # the small node's passes are slower, so that its draining row is there to be seen before it moves
    a = _member(tmp_path / "a", postgres_url, GPUFEED_CAPACITY=str(CAP), GPUFEED_METRICS_PORT="0",
                **{**ENV, "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "2"})
    b, c = (_member(tmp_path / n, postgres_url, GPUFEED_CAPACITY="100000000", **ENV) for n in "bc")
    nodes = (a, b, c)
    ids = {_node_id(n): n for n in nodes}
    me = _node_id(a)
    watch = None
    try:
        s3 = b.boto3_client()
        s3.create_bucket(Bucket="bkt")
        want: dict[str, bytes] = {}
        while folder_bytes(a.data_dir) <= 0.9 * CAP:  # through b, until a is past its high-water mark
            assert len(want) < 80, folder_bytes(a.data_dir)
            key = f"k{len(want)}"
            want[key] = os.urandom(OBJ + len(want))
            s3.put_object(Bucket="bkt", Key=key, Body=want[key])
        held_before = {f for f, h in _copies(postgres_url).items() if me in h}
        watch = _Watch(postgres_url, (a, c), want, b)
        assert wait_for(lambda: bool(watch.draining_seen), 15), watch.problems
        row = watch.draining_seen[0]
        assert row["node_id"] == me and row["moving_bytes"] > 0 and row["bytes_stored"] > 0.8 * CAP

        def back_under() -> bool:
            rows = {n["node_id"]: n for n in _status(b)["nodes"]}
            return not rows[me]["draining"] and rows[me]["bytes_stored"] <= 0.8 * CAP
        assert wait_for(back_under, 30), _status(b)
        assert folder_bytes(a.data_dir) <= 0.8 * CAP
        rounds = watch.rounds
        assert wait_for(lambda: watch.rounds >= rounds + 2, 30)  # reads after the move, too
        watch.stop()
        assert not watch.problems, watch.problems[:5]
        assert watch.rounds >= 3

        copies = _copies(postgres_url)
        moved = {f for f in held_before if me not in copies[f]}
        assert moved
        for file, holders in copies.items():  # two holders each, every one with its whole file, no other copy
            assert len(holders) == 2, (file, holders)
            for n, node in ids.items():
                assert wait_for(lambda node=node, want=n in holders, f=file: _has_file(node, f) == want, 10), (file, n)
        for f in moved:  # the members with room hold what moved
            assert copies[f] == set(ids) - {me}
        assert a.metrics_url is not None
        text = urllib.request.urlopen(a.metrics_url, timeout=10).read().decode()
        metrics = {k: float(v) for k, v in (line.split(" ", 1) for line in text.splitlines()
                                            if line.startswith("gpufeed_node_"))}
        assert metrics["gpufeed_node_draining"] == 0 and metrics["gpufeed_node_moving_bytes"] == 0
        assert metrics["gpufeed_node_moved_files"] >= len(moved)
        assert metrics["gpufeed_node_moved_bytes"] >= len(moved) * OBJ

        for node in nodes:  # every object, bit-identical, through every node
            client = node.boto3_client()
            for key, data in want.items():
                assert client.get_object(Bucket="bkt", Key=key)["Body"].read() == data, (node.data_dir.name, key)
        # a write after the move is placed on two members as before
        before = set(_copies(postgres_url))
        s3.put_object(Bucket="bkt", Key="after", Body=os.urandom(OBJ))
        [(_, holders)] = [(f, h) for f, h in _copies(postgres_url).items() if f not in before]
        assert len(holders) == 2
    finally:
        if watch is not None:
            watch.stop()
        for n in nodes:
            n.stop()


def test_a_draining_node_killed_mid_move_loses_nothing(tmp_path, postgres_url):
    # 200 kB/s: groups of two files, each followed by a pause of about a second
    slow = {**ENV, "GPUFEED_CLUSTER_REREPLICATE_RATE": "200000"}
    a = _member(tmp_path / "a", postgres_url, GPUFEED_CAPACITY=str(CAP), **slow)
    b, c = (_member(tmp_path / n, postgres_url, GPUFEED_CAPACITY="100000000", **ENV) for n in "bc")
    me = _node_id(a)
    try:
        s3 = b.boto3_client()
        s3.create_bucket(Bucket="bkt")
        want: dict[str, bytes] = {}
        while folder_bytes(a.data_dir) <= 0.9 * CAP:
            assert len(want) < 80
            key = f"k{len(want)}"
            want[key] = os.urandom(OBJ + len(want))
            s3.put_object(Bucket="bkt", Key=key, Body=want[key])

        peak = folder_bytes(a.data_dir)
        assert wait_for(lambda: folder_bytes(a.data_dir) <= peak - OBJ, 20)  # its first group moved
        a.kill()
        assert folder_bytes(a.data_dir) > 0.8 * CAP  # mid-drain: more was still to move
        for node in (b, c):  # every object, whole, through the members left, at once
            client = node.boto3_client()
            for key, data in want.items():
                assert client.get_object(Bucket="bkt", Key=key)["Body"].read() == data, (node.data_dir.name, key)

        def restored() -> bool:  # two copies of each on the live members, each a whole file
            return all(len(h - {me}) >= 2 and all(_has_file(n, f) for n in (b, c) if _node_id(n) in h)
                       for f, h in _copies(postgres_url).items())
        assert wait_for(restored, 30), _copies(postgres_url)
        a = _member(tmp_path / "a", postgres_url, GPUFEED_CAPACITY=str(CAP), **slow)  # back: it reads all too
        client = a.boto3_client()
        for key, data in want.items():
            assert client.get_object(Bucket="bkt", Key=key)["Body"].read() == data, key
    finally:
        for n in (a, b, c):
            n.stop()


def test_a_draining_node_that_gets_a_member_back_gives_up_copies_only_down_to_its_low_water_mark(
        tmp_path, postgres_url):
    # a counts its folder once a minute, as by default: what it gives up must come off its used bytes at once
    slow_walks = {**ENV, "GPUFEED_CLUSTER_BYTES_INTERVAL_S": "60"}
    a = _member(tmp_path / "a", postgres_url, GPUFEED_CAPACITY=str(CAP), **slow_walks)
    b, c = (_member(tmp_path / n, postgres_url, GPUFEED_CAPACITY="100000000", **ENV) for n in "bc")
    me = _node_id(a)
    try:
        s3 = c.boto3_client()
        s3.create_bucket(Bucket="bkt")
        want: dict[str, bytes] = {}
        ib, ic = _node_id(b), _node_id(c)

        def after_b_goes() -> int:  # a's bytes once the files only b and c hold are copied onto it
            return folder_bytes(a.data_dir) + sum(OBJ + 80 for h in _copies(postgres_url).values() if h == {ib, ic})
        while after_b_goes() < 0.93 * CAP:  # under its high-water mark for now, past it then
            assert len(want) < 80
            key = f"k{len(want)}"
            want[key] = os.urandom(OBJ + len(want))
            s3.put_object(Bucket="bkt", Key=key, Body=want[key])
        assert after_b_goes() < 0.99 * CAP and folder_bytes(a.data_dir) < 0.9 * CAP
        b.kill()  # b's files are copied again: those it shared with c, onto a, past a's high-water mark

        def restored() -> bool:
            return all(len(h - {ib}) >= 2 for h in _copies(postgres_url).values())
        assert wait_for(restored, 30)
        assert wait_for(lambda: _status(c)["nodes"] and any(
            n["node_id"] == me and n["draining"] for n in _status(c)["nodes"]), 15), _status(c)
        # the bytes of a's files of which it will rank last of the three holders (rendezvous) once b is back
        last = sum(f.stat().st_size for f in (a.data_dir / "blobs").rglob("*")
                   if f.is_file() and rank(f.name.encode(), [me, ib, ic])[2] == me)
        b = _member(tmp_path / "b", postgres_url, GPUFEED_CAPACITY="100000000", **ENV)  # back: 3 holders each
        assert wait_for(lambda: all(len(h) == 2 for h in _copies(postgres_url).values()), 30)
        held = folder_bytes(a.data_dir)
        # a gives up copies while it drains, down to its low-water mark (one file under it at most), then only
        # those of files of which it ranks last, as every holder does: drained, not emptied
        assert 0.8 * CAP - 2 * OBJ - last <= held <= 0.8 * CAP, (held, last)
        for node in (a, b, c):
            client = node.boto3_client()
            for key, data in want.items():
                assert client.get_object(Bucket="bkt", Key=key)["Body"].read() == data, (node.data_dir.name, key)
    finally:
        for n in (a, b, c):
            n.stop()
