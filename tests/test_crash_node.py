"""kill -9 a live node during concurrent uploads (S3 and fast path); after a
restart every acknowledged object reads back intact and nothing partial is listed."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
from boto3.s3.transfer import TransferConfig

from gpufeed.client import Client
from gpufeed.testing.node import start_node

BUCKET = "crash"


def _content(key: str) -> bytes:
    size = int(key.rsplit("-", 1)[1])
    block = hashlib.sha256(key.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def _sizes(i: int) -> int:
    return [0, 1, 4096, 300_000, 2 << 20, 9 << 20][i % 6] + i


@pytest.mark.slow
def test_kill_during_concurrent_uploads(tmp_path):
    data_dir = tmp_path / "data"
    node = start_node(data_dir)
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    try:
        s3 = node.boto3_client()
        s3.create_bucket(Bucket=BUCKET)

        def s3_writer(t: int) -> None:
            client = node.boto3_client(retries={"max_attempts": 1})
            i = 0
            try:
                while not stop.is_set():
                    key = f"s3-{t}-{i}-{_sizes(i)}"
                    if i % 5 == 4:  # multipart through s3transfer
                        import io

                        client.upload_fileobj(io.BytesIO(_content(key)), BUCKET, key, Config=TransferConfig(
                            multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
                    else:
                        client.put_object(Bucket=BUCKET, Key=key, Body=_content(key))
                    with lock:
                        acked.append(key)
                    i += 1
            except Exception:
                pass  # the node died under us
            finally:
                client.close()

        def fast_writer(t: int, url: str) -> None:
            i = 0
            try:
                with Client(url) as c:
                    while not stop.is_set():
                        key = f"fp-{t}-{i}-{_sizes(i)}"
                        c.put(BUCKET, key, _content(key))
                        with lock:
                            acked.append(key)
                        i += 1
            except Exception:
                pass

        threads = [threading.Thread(target=s3_writer, args=(t,)) for t in range(3)]
        threads += [threading.Thread(target=fast_writer, args=(t, url))
                    for t, url in enumerate([node.tcp_url, node.shm_url])]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while len(acked) < 25 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        node.kill()
        stop.set()
        for th in threads:
            th.join(30)
        s3.close()
        assert len(acked) >= 25, "writers made too little progress before the crash"
    finally:
        node.stop()

    node = start_node(data_dir)
    try:
        with Client(node.tcp_url) as c:
            listed = {e.key: e.size for e in c.list(BUCKET)}
            for key in acked:
                assert key in listed, f"acknowledged {key} lost"
                assert bytes(c.get(BUCKET, key)) == _content(key), f"{key} corrupt"
            for key, size in listed.items():  # nothing partial is visible
                assert size == len(_content(key)), f"partial {key} visible"
                assert bytes(c.get(BUCKET, key)) == _content(key)
        s3 = node.boto3_client()
        assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) is not None
        s3.close()
        assert not any((data_dir / "tmp").iterdir()), "temp files leaked"
    finally:
        assert node.stop() == 0
