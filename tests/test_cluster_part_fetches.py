"""A multipart completion through a cluster member that holds none of the
upload's part files (``gpufeed serve --catalog postgresql://... --cluster NAME``
subprocesses, replication factor 2): it fetches the parts from the others a
bounded number at once, each checked against its MD5; a part that no member
sends intact fails the completion with ``ServiceUnavailable`` naming it, leaves
nothing behind and the upload open; once the part is uploaded again the
completion through the same member reads back bit-identical.

Source: docs/cluster.md, "Multipart uploads across nodes".
"""

from __future__ import annotations

import hashlib
import os

import pytest
from botocore.exceptions import ClientError

from gpufeed._partcopies import PartCopies
from gpufeed.testing.node import NodeProcess, flip_bits, start_node
from test_cluster_multipart import FAST, MIB, _multipart_etag, _part_files


def _tmp_files(node: NodeProcess) -> list[str]:
    return sorted(os.listdir(node.data_dir / "tmp"))


def test_a_member_without_parts_fetches_them_all_checked(tmp_path, postgres_url):
    env = {**FAST, "GPUFEED_CLUSTER_PART_FETCHES": "3"}
    nodes: list[NodeProcess] = []
    try:
        for name in "abc":
            nodes.append(start_node(tmp_path / name, extra_args=["--catalog", postgres_url, "--cluster", "c1"],
                                    env=env))
        s3 = [n.boto3_client(retries={"max_attempts": 1, "mode": "standard"}) for n in nodes]
        s3[0].create_bucket(Bucket="mpu")
        up = s3[0].create_multipart_upload(Bucket="mpu", Key="k")["UploadId"]
        parts = [os.urandom(5 * MIB) for _ in range(9)] + [os.urandom(4321)]
        etags = [s3[0].upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=i + 1, Body=d)["ETag"]
                 for i, d in enumerate(parts)]
        # a keeps every part and the upload's first-ranked other member a copy: the third holds none
        assert len(_part_files(nodes[0], up)) == 10
        [holder] = [i for i in (1, 2) if _part_files(nodes[i], up)]
        empty = 3 - holder
        assert _part_files(nodes[empty], up) == [] and len(_part_files(nodes[holder], up)) == 10
        tmp_before = _tmp_files(nodes[empty])
        done = {"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]}
        # part 6: gone from a, damaged on the other: no member sends it intact
        sixth = _part_files(nodes[0], up)[5]
        os.unlink(nodes[0].data_dir / "uploads" / up / sixth)
        flip_bits(nodes[holder].data_dir / "uploads" / up / sixth, 1000, 0x10)
        try:
            s3[empty].complete_multipart_upload(Bucket="mpu", Key="k", UploadId=up, MultipartUpload=done)
            raise AssertionError("the completion passed without part 6")
        except ClientError as exc:
            err = exc.response["Error"]
            assert err["Code"] == "ServiceUnavailable", err
            assert "part 6 of upload" in err["Message"] and "MD5" in err["Message"], err["Message"]
        assert _tmp_files(nodes[empty]) == tmp_before  # the object's temp file went
        assert [u["UploadId"] for u in s3[empty].list_multipart_uploads(Bucket="mpu")["Uploads"]] == [up]
        # part 6 again: the completion through the same member now fetches all ten
        etags[5] = s3[0].upload_part(Bucket="mpu", Key="k", UploadId=up, PartNumber=6, Body=parts[5])["ETag"]
        done["Parts"][5]["ETag"] = etags[5]
        r = s3[empty].complete_multipart_upload(Bucket="mpu", Key="k", UploadId=up, MultipartUpload=done)
        assert r["ETag"] == _multipart_etag(parts)
        want = hashlib.sha256(b"".join(parts)).digest()
        for c in s3:
            assert hashlib.sha256(c.get_object(Bucket="mpu", Key="k")["Body"].read()).digest() == want
        assert all(_part_files(n, up) == [] for n in nodes)
    finally:
        for n in nodes:
            n.stop()


def test_a_completion_needs_at_least_one_part_fetch_at_once():
    with pytest.raises(ValueError, match="at least 1 part fetch at once, not 0"):
        PartCopies(None, None, 3.0, 0)  # type: ignore[arg-type]  # refused before either is used
