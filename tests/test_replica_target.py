"""The receiving side of replication on a real node (``gpufeed serve``): a
replica bucket is claimed, learns objects chunk by chunk through the admin
API (:class:`gpufeed._replica_client.ReplicaClient`), refuses S3 and
fast-path writes until failover, and a non-empty bucket is never claimed."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import blake3
import pytest
from botocore.exceptions import ClientError

from gpufeed._replica_client import ReplicaClient
from gpufeed.client import Client
from gpufeed.errors import AccessDenied, BadDigest, BucketNotEmpty, InvalidRequestError


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _replica(node, bucket: str, source: str = "src-1") -> ReplicaClient:
    return ReplicaClient(node.s3_url, bucket, source, node.access_key, node.secret_key)


def _chunks(data: bytes, size: int) -> list[tuple[str, bytes]]:
    out = []
    for off in range(0, len(data), size):
        piece = data[off:off + size]
        out.append((blake3.blake3(piece).hexdigest(), piece))
    return out


def _code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def test_objects_arrive_chunk_by_chunk_and_appear_whole(node, s3):
    bucket = _name("rt")
    r = _replica(node, bucket)
    status = r.claim()
    assert (status["source"], status["snapshot"], status["staged_chunks"]) == ("src-1", "", 0)
    data = os.urandom(300_000)
    pieces = _chunks(data, 128 << 10)
    digests = [d for d, _ in pieces]
    assert r.lacking(digests) == digests
    for d, piece in pieces[:2]:
        r.put_chunk(d, piece)
    assert r.lacking(digests) == digests[2:]
    with pytest.raises(InvalidRequestError, match="not staged"):  # a version needs all its chunks
        r.commit({"key": "k", "chunks": digests, "size": len(data)})
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="k")
    assert err.value.response["Error"]["Code"] == "404"
    r.put_chunk(*pieces[2])
    done = r.commit({"key": "k", "chunks": digests, "size": len(data), "content_type": "text/x-test",
                     "metadata": {"m": "v"}})
    assert done["size"] == len(data)
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == data
    assert (got["ContentType"], got["Metadata"]) == ("text/x-test", {"m": "v"})
    # sent again although staged: kept, counted as a duplicate
    r.put_chunk(*pieces[0])
    status = r.status()
    assert (status["round_chunks_received"], status["round_duplicate_chunks"], status["staged_chunks"]) == (4, 1, 3)
    ended = r.end_round("auto-repl-1", 1234.5)
    assert (ended["snapshot"], ended["snapshot_created"], ended["rounds"]) == ("auto-repl-1", 1234.5, 1)
    assert (ended["staged_chunks"], ended["chunks_received"], ended["duplicate_chunks"]) == (0, 4, 1)
    r.delete("k")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    r.close()


def test_a_chunk_that_is_not_its_digest_is_refused(node):
    r = _replica(node, _name("rt"))
    r.claim()
    with pytest.raises(BadDigest):
        r.put_chunk(blake3.blake3(b"one").hexdigest(), b"two")
    assert r.status()["staged_chunks"] == 0
    r.close()


def test_a_replica_refuses_s3_and_fast_path_writes_until_failover(node, s3):
    bucket = _name("rt")
    r = _replica(node, bucket)
    r.claim()
    piece = b"replicated"
    r.put_chunk(blake3.blake3(piece).hexdigest(), piece)
    r.commit({"key": "k", "chunks": [blake3.blake3(piece).hexdigest()], "size": len(piece)})
    for call in (lambda: s3.put_object(Bucket=bucket, Key="new", Body=b"x"),
                 lambda: s3.delete_object(Bucket=bucket, Key="k"),
                 lambda: s3.put_object_tagging(Bucket=bucket, Key="k", Tagging={"TagSet": []}),
                 lambda: s3.copy_object(Bucket=bucket, Key="c", CopySource={"Bucket": bucket, "Key": "k"}),
                 lambda: s3.create_multipart_upload(Bucket=bucket, Key="m"),
                 lambda: s3.delete_bucket(Bucket=bucket)):
        with pytest.raises(ClientError) as err:
            call()
        assert _code(err.value) == "AccessDenied"
        assert "read-only replica" in err.value.response["Error"]["Message"]
    gone = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k"}]})
    assert [e["Code"] for e in gone.get("Errors", [])] == ["AccessDenied"]
    with Client(node.tcp_url, **node.credentials) as fast:
        with pytest.raises(AccessDenied, match="read-only replica"):
            fast.put(bucket, "fast", b"x")
        assert fast.get(bucket, "k") == piece  # reads work
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == piece
    from gpufeed.admin import RemoteAdmin

    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    promoted = admin.replica_failover(bucket)
    assert promoted["source"] == "src-1"
    s3.put_object(Bucket=bucket, Key="new", Body=b"x")  # writable now
    s3.delete_object(Bucket=bucket, Key="k")
    with pytest.raises(InvalidRequestError, match="not a replica"):
        r.lacking([])
    r.close()


def test_a_bucket_that_is_not_empty_is_never_claimed(node, s3):
    bucket = _name("rt")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="mine", Body=b"keep me")
    r = _replica(node, bucket)
    with pytest.raises(BucketNotEmpty, match="not empty"):
        r.claim()
    s3.put_object(Bucket=bucket, Key="mine2", Body=b"still writable")  # nothing changed
    assert s3.get_object(Bucket=bucket, Key="mine")["Body"].read() == b"keep me"
    r.close()


def test_a_replica_answers_its_own_source_only(node):
    bucket = _name("rt")
    mine, other = _replica(node, bucket, "src-a"), _replica(node, bucket, "src-b")
    mine.claim()
    assert mine.claim()["source"] == "src-a"  # claiming again is fine
    with pytest.raises(InvalidRequestError, match="another source"):
        other.claim()
    with pytest.raises(InvalidRequestError, match="another source"):
        other.lacking([])
    mine.close()
    other.close()


def test_replica_calls_need_the_owner_or_the_admin_key(node, s3):
    from gpufeed.admin import RemoteAdmin

    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    tenant = _name("ten")
    admin.tenant_create(tenant)
    key = admin.key_create(tenant)
    theirs = ReplicaClient(node.s3_url, _name("rt"), "s", key["access_key"], key["secret_key"])
    theirs.claim()  # a missing bucket becomes the tenant's
    bucket = _name("rt")
    s3.create_bucket(Bucket=bucket)  # the default tenant's
    intruder = ReplicaClient(node.s3_url, bucket, "s", key["access_key"], key["secret_key"])
    with pytest.raises(AccessDenied):
        intruder.claim()
    theirs.close()
    intruder.close()


def test_a_new_version_reuses_the_unchanged_chunks_of_the_current_one(node, s3):
    bucket = _name("rt")
    r = _replica(node, bucket)
    r.claim()
    old = os.urandom(3 * (64 << 10))
    pieces = _chunks(old, 64 << 10)
    for d, piece in pieces:
        r.put_chunk(d, piece)
    r.commit({"key": "k", "chunks": [d for d, _ in pieces], "size": len(old)})
    r.end_round("s1", 1.0)  # the staged chunks are gone; the version holds them
    tail = os.urandom(1000)
    r.put_chunk(blake3.blake3(tail).hexdigest(), tail)
    spans = [{"digest": d, "offset": i * (64 << 10), "length": 64 << 10} for i, (d, _) in enumerate(pieces[:2])]
    r.commit({"key": "k", "chunks": [*spans, blake3.blake3(tail).hexdigest()], "size": 2 * (64 << 10) + 1000})
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == old[:2 * (64 << 10)] + tail
    wrong = [{"digest": pieces[2][0], "offset": 0, "length": 64 << 10}]  # not what the current version holds there
    with pytest.raises(InvalidRequestError, match="no longer in the target's current version"):
        r.commit({"key": "k", "chunks": wrong, "size": 64 << 10})
    assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == 2 * (64 << 10) + 1000  # unchanged
    r.close()


def test_a_staged_chunk_that_rotted_is_refused_at_commit_and_asked_for_again(node, s3):
    """A staged chunk damaged on disk before its commit (the target was down
    between the two, say) never reaches the replica: the commit is refused
    naming the chunk, the chunk is dropped, lacking asks for it again, and the
    version commits bit-identical once it is re-sent."""
    bucket = _name("rot")
    r = _replica(node, bucket)
    r.claim()
    data = os.urandom(200_000)
    pieces = _chunks(data, 64 << 10)
    digests = [d for d, _ in pieces]
    for d, piece in pieces:
        r.put_chunk(d, piece)
    staged = Path(node.data_dir) / "replica-staging" / bucket / digests[1]
    with open(staged, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(InvalidRequestError, match=f"{digests[1]}.*damaged"):
        r.commit({"key": "k", "chunks": digests, "size": len(data)})
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="k")
    assert r.lacking(digests) == [digests[1]]
    r.put_chunk(*pieces[1])
    r.commit({"key": "k", "chunks": digests, "size": len(data)})
    r.close()
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == data
