"""Kill -9 a process in the middle of many concurrent writes; nothing partial survives.

A child process runs writer threads (puts of random sizes, overwrites of one
shared key, put-then-delete, multipart uploads) and prints each key after its
write returned (flushed). The parent SIGKILLs it at an arbitrary moment,
reopens the engine and checks: every acknowledged write reads back intact;
every visible object is intact (no torn data, data and metadata agree);
``tmp/`` is empty and no blob or part file is unreferenced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gpufeed.engine import Engine

CHILD = textwrap.dedent(
    """
    import random, sys, threading
    from gpufeed.engine import Engine, MIN_PART_BYTES
    from gpufeed.errors import BucketAlreadyOwnedByYou

    data_dir, round_ = sys.argv[1], int(sys.argv[2])
    e = Engine(data_dir, fsync=True)
    try:
        e.create_bucket("crash")
    except BucketAlreadyOwnedByYou:
        pass
    out_lock = threading.Lock()

    def body(name, cap=1 << 20):
        rnd = random.Random(name)
        return rnd.randbytes(rnd.randrange(0, cap))

    def ack(line):
        with out_lock:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()

    def puts(t):
        i = 0
        while True:
            key = f"r{round_}/t{t}/{i:06d}"
            if i % 3 == 0:
                with e.begin_put("crash", key) as pw:
                    data = body(key)
                    for off in range(0, len(data), 65536):
                        pw.write(data[off:off + 65536])
                    pw.commit(metadata={"v": key})
            else:
                e.put_object("crash", key, body(key), metadata={"v": key}, etag="xxh3" if i % 2 else "md5")
            ack("put " + key)
            i += 1

    def overwrite():
        i = 0
        while True:
            name = f"shared#{round_}.{i}"
            e.put_object("crash", "shared", body(name), metadata={"v": name})
            ack("shared " + name)
            i += 1

    def put_delete():
        i = 0
        while True:
            key = f"r{round_}/gone/{i}"
            e.put_object("crash", key, body(key), metadata={"v": key})
            e.delete_object("crash", key)
            ack("deleted " + key)
            i += 1

    def multipart():
        i = 0
        while True:
            key = f"r{round_}/mp/{i}"
            up = e.create_multipart_upload("crash", key, metadata={"v": key})
            first = random.Random(key).randbytes(MIN_PART_BYTES)
            p1 = e.upload_part("crash", key, up.upload_id, 1, first)
            p2 = e.upload_part("crash", key, up.upload_id, 2, body(key + "#2", 1 << 16))
            e.complete_multipart_upload("crash", key, up.upload_id, [(1, p1.etag), (2, p2.etag)])
            ack("mp " + key)
            i += 1

    targets = [(puts, (t,)) for t in range(4)] + [(overwrite, ()), (put_delete, ()), (multipart, ())]
    ack("ready")
    for f, a in targets:
        threading.Thread(target=f, args=a, daemon=True).start()
    threading.Event().wait()
    """
)


def _body(name: str, cap: int = 1 << 20) -> bytes:
    import random

    rnd = random.Random(name)
    return rnd.randbytes(rnd.randrange(0, cap))


def _mp_body(key: str) -> bytes:
    import random

    from gpufeed.engine import MIN_PART_BYTES

    return random.Random(key).randbytes(MIN_PART_BYTES) + _body(key + "#2", 1 << 16)


def _run_and_kill(script, data_dir, round_: int, min_acks: int, max_s: float) -> list[str]:
    proc = subprocess.Popen(
        [sys.executable, str(script), str(data_dir), str(round_)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    # Watchdog: whatever happens, the child dies after max_s and every read below ends.
    watchdog = threading.Timer(max_s, proc.kill)
    watchdog.start()
    try:
        first = proc.stdout.readline().strip()
        assert first == "ready", first
        deadline = time.monotonic() + max_s / 2  # leave the watchdog a margin
        while len(lines) < min_acks and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        lines += [x.strip() for x in proc.stdout.read().splitlines() if x.strip()]  # acked before the kill
        err = proc.stderr.read()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, err
    assert "Traceback" not in err, err
    return lines


def _check(data_dir, acked: list[str]) -> dict[str, int]:
    """Reopen, verify, and return what the start-up sweep removed."""
    with Engine(data_dir, fsync=True) as e:
        # Every acknowledged write is there, intact.
        for line in acked:
            kind, name = line.split(" ", 1)
            if kind == "put":
                assert e.get_object("crash", name) == _body(name), name
            elif kind == "mp":
                assert e.get_object("crash", name) == _mp_body(name), name
        # Every visible object is whole and its metadata names its content.
        blob_ids = set()
        token = None
        while True:
            page = e.list_objects("crash", continuation_token=token)
            for info in page.objects:
                blob_ids.add(info.blob_id)
                name = info.metadata["v"]
                data = e.get_object("crash", info.key)
                want = _mp_body(name) if "/mp/" in info.key else _body(name)
                assert data == want, info.key
                assert info.size == len(data)
            if not page.is_truncated:
                break
            token = page.next_token
        # Nothing leaked on disk.
        assert os.listdir(e.data_dir / "tmp") == []
        on_disk = {f for _, _, files in os.walk(e.data_dir / "blobs") for f in files}
        assert on_disk == blob_ids
        uploads = {u.upload_id: u for u in e.list_multipart_uploads("crash")}
        assert set(os.listdir(e.data_dir / "uploads")) == set(uploads)
        for uid, u in uploads.items():
            assert len(os.listdir(e.data_dir / "uploads" / uid)) == len(e.list_parts("crash", u.key, uid))
        return e.recovered


@pytest.mark.slow
def test_sigkill_during_concurrent_writes(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    data_dir = tmp_path / "data"
    acked: list[str] = []
    swept = 0
    for round_ in range(3):
        lines = _run_and_kill(script, data_dir, round_, min_acks=60 + 40 * round_, max_s=60.0)
        assert len(lines) >= 10, lines
        acked += lines
        swept += sum(_check(data_dir, acked).values())
    assert any(x.startswith("mp ") for x in acked)
    # Seven writer threads were busy at each kill: some temp files were left to sweep.
    assert swept > 0
