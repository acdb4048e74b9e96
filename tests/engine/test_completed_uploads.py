"""Completed multipart uploads: a repeated completion answers again, and a
multipart version keeps its part layout (S3 GetObject ``partNumber``)."""

from __future__ import annotations

import sqlite3

import pytest

from gpufeed.engine import MIN_PART_BYTES, Engine
from gpufeed.errors import NoSuchUpload

B = "bkt"


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path / "data", fsync=False)
    e.create_bucket(B)
    yield e
    e.close()


def _two_part_object(engine: Engine, key: str):
    up = engine.create_multipart_upload(B, key)
    p1 = engine.upload_part(B, key, up.upload_id, 1, b"a" * MIN_PART_BYTES, checksums={"crc32": "AAAAAA=="})
    p3 = engine.upload_part(B, key, up.upload_id, 3, b"tail", checksums={"crc32": "AAAAAA=="})
    parts = [(1, p1.etag), (3, f'"{p3.etag}"')]
    return up.upload_id, parts, engine.complete_multipart_upload(B, key, up.upload_id, parts)


def test_repeated_completion_returns_the_same_version(engine):
    """Source: "CompleteMultipartUpload", Amazon S3 API Reference (a retried
    completion that already succeeded answers 200 with the same ETag),
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    uid, parts, info = _two_part_object(engine, "mp")
    assert engine.complete_multipart_upload(B, "mp", uid, parts) == info
    with pytest.raises(NoSuchUpload):  # other parts
        engine.complete_multipart_upload(B, "mp", uid, parts[:1])
    with pytest.raises(NoSuchUpload):  # other key
        engine.complete_multipart_upload(B, "other", uid, parts)
    with pytest.raises(NoSuchUpload):  # an upload stays gone for everything else
        engine.list_parts(B, "mp", uid)
    engine.put_object(B, "mp", b"overwritten")
    again = engine.complete_multipart_upload(B, "mp", uid, parts)
    assert (again.etag, again.size, again.checksums) == (info.etag, info.size, info.checksums)
    assert engine.get_object(B, "mp") == b"overwritten"  # the repeat changed nothing


def test_completions_at_the_same_time_all_answer_the_version_one_of_them_made(engine):
    import threading

    for round_ in range(3):
        key = f"race{round_}"
        up = engine.create_multipart_upload(B, key)
        p1 = engine.upload_part(B, key, up.upload_id, 1, b"a" * MIN_PART_BYTES)
        p2 = engine.upload_part(B, key, up.upload_id, 2, b"tail")
        parts = [(1, p1.etag), (2, p2.etag)]
        start = threading.Barrier(4)
        answers: list[object] = []

        def complete(key: str = key, upload_id: str = up.upload_id, parts: list = parts,
                     start: threading.Barrier = start, answers: list = answers) -> None:
            start.wait()
            try:
                answers.append(engine.complete_multipart_upload(B, key, upload_id, parts).etag)
            except Exception as exc:  # noqa: BLE001 - asserted below
                answers.append(exc)

        threads = [threading.Thread(target=complete) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(answers) == 4 and len(set(answers)) == 1 and isinstance(answers[0], str), answers
        assert engine.get_object(B, key) == b"a" * MIN_PART_BYTES + b"tail"


def test_object_parts_of_multipart_and_plain_versions(engine):
    _, _, info = _two_part_object(engine, "mp")
    parts = engine.object_parts(engine.head_object(B, "mp"))
    assert [(p.part_number, p.size) for p in parts] == [(1, MIN_PART_BYTES), (3, 4)]
    assert parts[0].checksums == {"crc32": "AAAAAA=="}
    engine.put_object(B, "plain", b"x")
    assert engine.object_parts(engine.head_object(B, "plain")) == []
    engine.copy_object(B, "mp", B, "copy")
    assert engine.object_parts(engine.head_object(B, "copy")) == []


def test_completion_records_survive_reopen_and_a_version_2_catalog_is_migrated(tmp_path):
    e = Engine(tmp_path / "d", fsync=False)
    e.create_bucket(B)
    uid, parts, info = _two_part_object(e, "mp")
    e.close()
    e = Engine(tmp_path / "d", fsync=False)
    try:
        assert e.complete_multipart_upload(B, "mp", uid, parts).etag == info.etag
    finally:
        e.close()
    db = sqlite3.connect(tmp_path / "d" / "catalog.sqlite3")  # a version 2 catalog (before the table)
    db.execute("DROP TABLE completed_uploads")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    e = Engine(tmp_path / "d", fsync=False)
    try:
        assert e.object_parts(e.head_object(B, "mp")) == []
        with pytest.raises(NoSuchUpload):
            e.complete_multipart_upload(B, "mp", uid, parts)
    finally:
        e.close()


def test_repeated_completion_in_a_versioned_bucket_names_the_same_version(engine):
    """A repeat answers the version the completion made, also once a later put
    made it noncurrent. Source: "CompleteMultipartUpload", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html"""
    engine.put_bucket_versioning(B, "Enabled")
    uid, parts, info = _two_part_object(engine, "vmp")
    assert len(info.version_id) == 32
    assert engine.complete_multipart_upload(B, "vmp", uid, parts) == info
    engine.put_object(B, "vmp", b"newer")
    again = engine.complete_multipart_upload(B, "vmp", uid, parts)
    assert (again.version_id, again.etag, again.size) == (info.version_id, info.etag, info.size)
    assert not again.is_latest
    assert engine.get_object(B, "vmp") == b"newer"  # the repeat changed nothing
