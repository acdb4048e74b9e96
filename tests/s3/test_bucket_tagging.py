"""Bucket tagging: Put/Get/DeleteBucketTagging through boto3, S3's limits and
error answers, and nothing changed by a refused request. Each test names the AWS
page it follows."""

from __future__ import annotations

import base64
import hashlib
import uuid
import zlib

import pytest
from botocore.exceptions import ClientError

TAGS = [{"Key": "team", "Value": "inference"}, {"Key": "cost-centre/gpu", "Value": ""},
        {"Key": "Größe", "Value": "8 GiB = 8192 MiB @ 1.5 + x:y_z"}]


def _err(exc: ClientError) -> tuple[int, str, str]:
    e = exc.response["Error"]
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], e["Code"], e["Message"]


@pytest.fixture
def tbkt(s3c):
    """A fresh bucket of the in-process endpoint tagged with :data:`TAGS`."""
    name = f"g-{uuid.uuid4().hex[:12]}"
    s3c.create_bucket(Bucket=name)
    s3c.put_bucket_tagging(Bucket=name, Tagging={"TagSet": TAGS})
    return name


def test_put_get_delete_round_trip(s3c, bkt):
    """Source: "PutBucketTagging" (204; replaces the tag set), "GetBucketTagging"
    (404 NoSuchTagSet when none is set) and "DeleteBucketTagging" (204), Amazon S3
    API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketTagging.html"""
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_tagging(Bucket=bkt)
    assert _err(ei.value) == (404, "NoSuchTagSet", "The TagSet does not exist")
    r = s3c.put_bucket_tagging(Bucket=bkt, Tagging={"TagSet": TAGS})
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert s3c.get_bucket_tagging(Bucket=bkt)["TagSet"] == TAGS
    s3c.put_bucket_tagging(Bucket=bkt, Tagging={"TagSet": [{"Key": "only", "Value": "one"}]})
    assert s3c.get_bucket_tagging(Bucket=bkt)["TagSet"] == [{"Key": "only", "Value": "one"}]
    assert s3c.delete_bucket_tagging(Bucket=bkt)["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_tagging(Bucket=bkt)
    assert _err(ei.value)[:2] == (404, "NoSuchTagSet")
    assert s3c.delete_bucket_tagging(Bucket=bkt)["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_limits_are_inclusive(s3c, bkt):
    """Source: "Using cost allocation S3 bucket tags" (up to 50 tags; keys up to 128
    Unicode characters, values up to 256), Amazon S3 User Guide,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/CostAllocTagging.html"""
    tags = [{"Key": f"k{i:02d}" + "é" * 125, "Value": "v" * 256} for i in range(50)]
    s3c.put_bucket_tagging(Bucket=bkt, Tagging={"TagSet": tags})
    assert s3c.get_bucket_tagging(Bucket=bkt)["TagSet"] == tags


def test_an_empty_tag_set_removes_the_tags(s3c, tbkt):
    """Source: "PutBucketTagging" (the request replaces the bucket's tag set) and
    "GetBucketTagging" (NoSuchTagSet: "There is no tag set associated with the bucket"),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketTagging.html"""
    s3c.put_bucket_tagging(Bucket=tbkt, Tagging={"TagSet": []})
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_tagging(Bucket=tbkt)
    assert _err(ei.value)[:2] == (404, "NoSuchTagSet")


_CASES = [
    ([{"Key": f"k{i}", "Value": "v"} for i in range(51)], "BadRequest",
     "Bucket tag count cannot be greater than 50"),
    ([{"Key": "k" * 129, "Value": "v"}], "InvalidTag", "The TagKey you have provided is too long, max 128"),
    ([{"Key": "k", "Value": "v" * 257}], "InvalidTag", "The TagValue you have provided is too long, max 256"),
    ([{"Key": "k", "Value": "1"}, {"Key": "k", "Value": "2"}], "InvalidTag",
     "Cannot provide multiple Tags with the same key"),
    ([{"Key": "aws:createdBy", "Value": "me"}], "InvalidTag", "System tags cannot be added/updated by requester"),
    ([{"Key": "AWS:x", "Value": "me"}], "InvalidTag", "System tags cannot be added/updated by requester"),
    ([{"Key": "a*b", "Value": "v"}], "InvalidTag", "The TagKey you have provided is invalid"),
    ([{"Key": "k", "Value": "semi;colon"}], "InvalidTag", "The TagValue you have provided is invalid"),
    ([{"Key": "k", "Value": "tab\there"}], "InvalidTag", "The TagValue you have provided is invalid"),
]


@pytest.mark.parametrize(("tags", "code", "message"), _CASES)
def test_bad_tag_sets_are_refused_and_change_nothing(s3c, tbkt, tags, code, message):
    """Source: "PutBucketTagging" (InvalidTag) and "Using cost allocation S3 bucket
    tags" (50 tags; key 1-128 and value 0-256 characters of letters, numbers, spaces
    and + - = . _ : / @; the aws: prefix is reserved), Amazon S3 API Reference and
    User Guide, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketTagging.html"""
    with pytest.raises(ClientError) as ei:
        s3c.put_bucket_tagging(Bucket=tbkt, Tagging={"TagSet": tags})
    assert _err(ei.value) == (400, code, message)
    assert s3c.get_bucket_tagging(Bucket=tbkt)["TagSet"] == TAGS


@pytest.mark.parametrize("body", [
    b"<Tagging><TagSet><Tag><Key>k</Key></Tag></TagSet></Tagging>",
    b"<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value><Value>w</Value></Tag></TagSet></Tagging>",
    b"<Tagging><TagSet><Item><Key>k</Key><Value>v</Value></Item></TagSet></Tagging>",
    b"<Tagging/>",
    b"<Tagging><TagSet/><TagSet/></Tagging>",
    b"<TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet>",
    b"<Tagging><TagSet><Tag>",
])
def test_malformed_documents(s3c, raw, tbkt, code_of, body):
    """Source: "PutBucketTagging" (Request Syntax: Tagging, TagSet, Tag with Key and
    Value) and "Error responses" (MalformedXML), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketTagging.html"""
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    r = raw.request("PUT", f"/{tbkt}?tagging", body=body, headers={"Content-MD5": md5})
    assert (r.status, code_of(r.body)) == (400, "MalformedXML")
    assert s3c.get_bucket_tagging(Bucket=tbkt)["TagSet"] == TAGS


def test_an_empty_key_is_invalid(s3c, raw, tbkt, code_of):
    """Source: "Tag" (Key: "Name of the object key", length 1 to 128), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_Tag.html (boto3
    checks the length itself, so the request is sent raw)."""
    body = b"<Tagging><TagSet><Tag><Key></Key><Value>v</Value></Tag></TagSet></Tagging>"
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    r = raw.request("PUT", f"/{tbkt}?tagging", body=body, headers={"Content-MD5": md5})
    assert (r.status, code_of(r.body)) == (400, "InvalidTag")
    assert b"The TagKey you have provided is invalid" in r.body
    assert s3c.get_bucket_tagging(Bucket=tbkt)["TagSet"] == TAGS


def test_put_needs_content_md5_or_a_checksum(s3c, raw, tbkt, code_of):
    """Source: "PutBucketTagging" (Content-MD5 is required; SDKs may send an
    x-amz-checksum-* header instead), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketTagging.html"""
    body = b"<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>"
    r = raw.request("PUT", f"/{tbkt}?tagging", body=body)
    assert (r.status, code_of(r.body)) == (400, "InvalidRequest")
    assert s3c.get_bucket_tagging(Bucket=tbkt)["TagSet"] == TAGS
    crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    r = raw.request("PUT", f"/{tbkt}?tagging", body=body, headers={"x-amz-checksum-crc32": crc})
    assert r.status == 204
    assert s3c.get_bucket_tagging(Bucket=tbkt)["TagSet"] == [{"Key": "k", "Value": "v"}]


def test_tagging_of_a_missing_bucket_and_bucket_deletion(s3c):
    """Source: "PutBucketTagging" / "GetBucketTagging" (NoSuchBucket) and "DeleteBucket"
    (a bucket's tags go with it), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteBucket.html"""
    name = f"g-{uuid.uuid4().hex[:12]}"
    for call, kw in (("put_bucket_tagging", {"Tagging": {"TagSet": TAGS}}),
                     ("get_bucket_tagging", {}), ("delete_bucket_tagging", {})):
        with pytest.raises(ClientError) as ei:
            getattr(s3c, call)(Bucket=name, **kw)
        assert _err(ei.value)[:2] == (404, "NoSuchBucket")
    s3c.create_bucket(Bucket=name)
    s3c.put_bucket_tagging(Bucket=name, Tagging={"TagSet": TAGS})
    s3c.delete_bucket(Bucket=name)
    s3c.create_bucket(Bucket=name)
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_tagging(Bucket=name)
    assert _err(ei.value)[:2] == (404, "NoSuchTagSet")
