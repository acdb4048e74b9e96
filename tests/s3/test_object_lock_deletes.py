"""Object lock through deletes that name a version: DeleteObject and DeleteObjects
with ``versionId`` and ``x-amz-bypass-governance-retention``. The object lock front
passes the bypass to the engine; the ``versionId`` of deletes is the S3 versioning
front's, so these tests pass once both are in. Each test names the AWS page it follows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def _fails(call, status: int, code: str, **kwargs) -> None:
    with pytest.raises(ClientError) as ei:
        call(**kwargs)
    assert _err(ei.value) == (status, code), ei.value.response


def _later(days: float = 1.0) -> datetime:
    return (datetime.now(UTC) + timedelta(days=days)).replace(microsecond=0)


@pytest.fixture
def locked(s3c) -> str:
    """A fresh bucket created with object lock."""
    name = f"lock-{uuid.uuid4().hex[:10]}"
    s3c.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    return name


def _version(s3_node, bucket: str, key: str) -> str:
    """The key's current version id, as the engine holds it."""
    return s3_node.engine.head_object(bucket, key).version_id


def test_delete_version_under_governance_needs_bypass(s3c, s3_node, locked):
    """Source: "DeleteObject" (x-amz-bypass-governance-retention; a version under retention
    is AccessDenied), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteObject.html"""
    s3c.put_object(Bucket=locked, Key="g", Body=b"g", ObjectLockMode="GOVERNANCE",
                   ObjectLockRetainUntilDate=_later())
    vid = _version(s3_node, locked, "g")
    _fails(s3c.delete_object, 403, "AccessDenied", Bucket=locked, Key="g", VersionId=vid)
    assert s3c.get_object(Bucket=locked, Key="g")["Body"].read() == b"g"
    s3c.delete_object(Bucket=locked, Key="g", VersionId=vid, BypassGovernanceRetention=True)
    _fails(s3c.head_object, 404, "404", Bucket=locked, Key="g")


def test_delete_version_under_compliance_or_legal_hold_is_refused(s3c, s3_node, locked):
    """Source: "DeleteObject" and "Locking objects with Object Lock" (COMPLIANCE retention
    and legal holds yield to no bypass), https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock.html"""
    s3c.put_object(Bucket=locked, Key="c", Body=b"c", ObjectLockMode="COMPLIANCE",
                   ObjectLockRetainUntilDate=_later())
    s3c.put_object(Bucket=locked, Key="h", Body=b"h", ObjectLockLegalHoldStatus="ON")
    for key in ("c", "h"):
        vid = _version(s3_node, locked, key)
        _fails(s3c.delete_object, 403, "AccessDenied", Bucket=locked, Key=key, VersionId=vid,
               BypassGovernanceRetention=True)
        assert _version(s3_node, locked, key) == vid
    s3c.put_object_legal_hold(Bucket=locked, Key="h", LegalHold={"Status": "OFF"})
    s3c.delete_object(Bucket=locked, Key="h", VersionId=_version(s3_node, locked, "h"))
    _fails(s3c.head_object, 404, "404", Bucket=locked, Key="h")


def test_delete_objects_with_bypass(s3c, s3_node, locked):
    """Source: "DeleteObjects" (x-amz-bypass-governance-retention; a locked version is an
    AccessDenied Error in the result), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteObjects.html"""
    objects = []
    for i in range(3):
        s3c.put_object(Bucket=locked, Key=f"d{i}", Body=b"d", ObjectLockMode="GOVERNANCE",
                       ObjectLockRetainUntilDate=_later())
        objects.append({"Key": f"d{i}", "VersionId": _version(s3_node, locked, f"d{i}")})
    result = s3c.delete_objects(Bucket=locked, Delete={"Objects": objects})
    assert [e["Code"] for e in result["Errors"]] == ["AccessDenied"] * 3 and not result.get("Deleted")
    result = s3c.delete_objects(Bucket=locked, Delete={"Objects": objects}, BypassGovernanceRetention=True)
    assert len(result["Deleted"]) == 3 and not result.get("Errors")
