"""Parts of multipart uploads against each cluster node's capacity (``gpufeed
serve --catalog postgresql://... --cluster NAME`` subprocesses, replication
factor 2, ``GPUFEED_CAPACITY`` per node): a node without room for a part
refuses it with 507 ``StorageFull``; a member without room is passed over for
a part's copy and the next-ranked one takes it; when no member has room the
part is refused with 507 and nothing of it is kept; an aborted upload's parts
stop counting, so the room is there again.

Source: docs/cluster.md, "Capacity per node" and "Multipart uploads across nodes".
"""

from __future__ import annotations

import os

import pytest
from botocore.exceptions import ClientError

from gpufeed.engine._placement import rank
from gpufeed.testing.node import NodeProcess, wait_for
from test_cluster_multipart import _part_files
from test_cluster_replicas import _member, _node_id, _status

ENV = {"GPUFEED_CLUSTER_BYTES_INTERVAL_S": "0.3", "GPUFEED_CLUSTER_REREPLICATE_INTERVAL_S": "0.5"}
MIB = 1 << 20


def _refused(call) -> dict:
    with pytest.raises(ClientError) as got:
        call()
    return got.value.response


def _free(via: NodeProcess, node: NodeProcess) -> int:
    return next(n["free_bytes"] for n in _status(via)["nodes"] if n["node_id"] == _node_id(node))


def test_parts_are_refused_where_there_is_no_room_and_copied_where_there_is(tmp_path, postgres_url):
    a = _member(tmp_path / "a", postgres_url, GPUFEED_CAPACITY=str(1_500_000), **ENV)
    b = _member(tmp_path / "b", postgres_url, GPUFEED_CAPACITY=str(60 * MIB), **ENV)
    c = _member(tmp_path / "c", postgres_url, GPUFEED_CAPACITY=str(12 * MIB), **ENV)
    nodes = (a, b, c)
    try:
        s3a, s3b = (n.boto3_client(retries={"max_attempts": 1, "mode": "standard"}) for n in (a, b))
        s3b.create_bucket(Bucket="mpu")
        data = os.urandom(5 * MIB)
        # an upload whose first-ranked member (after b) is a, which has no room for 5 MiB
        ups = [s3b.create_multipart_upload(Bucket="mpu", Key="k")["UploadId"] for _ in range(16)]
        up = next(u for u in ups if rank(u.encode(), [_node_id(a), _node_id(c)])[0] == _node_id(a))
        err = _refused(lambda: s3a.upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=1, Body=data))
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 507 and err["Error"]["Code"] == "StorageFull"
        assert "this node is full" in err["Error"]["Message"]
        assert _part_files(a, up) == [] and not list((a.data_dir / "tmp").iterdir())
        # through b: a is passed over, c takes the copies, until c is full too
        s3b.upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=1, Body=data)
        s3b.upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=2, Body=data)
        assert len(_part_files(b, up)) == 2 and len(_part_files(c, up)) == 2 and _part_files(a, up) == []
        assert wait_for(lambda: _free(b, c) < 5 * MIB, 10)
        err = _refused(lambda: s3b.upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=3, Body=data))
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 507 and err["Error"]["Code"] == "StorageFull"
        assert "the part was not stored" in err["Error"]["Message"]
        assert [p["PartNumber"] for p in s3b.list_parts(Bucket="mpu", Key="k", UploadId=up)["Parts"]] == [1, 2]
        assert len(_part_files(b, up)) == 2 and len(_part_files(c, up)) == 2 and _part_files(a, up) == []
        # the aborted upload's parts stop counting on c: a new upload's part fits there again
        for u in ups:
            s3b.abort_multipart_upload(Bucket="mpu", Key="k", UploadId=u)
        assert wait_for(lambda: _free(b, c) >= 5 * MIB, 10)
        again = s3b.create_multipart_upload(Bucket="mpu", Key="k")["UploadId"]
        s3b.upload_part(Bucket="mpu", Key="k", UploadId=again, PartNumber=1, Body=data)
        assert len(_part_files(c, again)) == 1 and _part_files(a, again) == []
    finally:
        for n in nodes:
            n.stop()
