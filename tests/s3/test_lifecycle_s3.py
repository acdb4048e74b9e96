"""Bucket lifecycle over S3 with boto3: Put/Get/DeleteBucketLifecycleConfiguration,
AWS's error codes, and the rules' effect (the engine's pass run at a chosen ``now``)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from botocore.exceptions import ClientError

from gpufeed.engine._lifecycle import due_time
from gpufeed.errors import MethodNotAllowed, NotImplementedByGpufeed
from gpufeed.s3._router import (
    DeleteBucketLifecycle,
    GetBucketLifecycleConfiguration,
    HeadBucket,
    PutBucketLifecycleConfiguration,
    parse_target,
    route,
)

MIDNIGHT_2030 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


@pytest.fixture
def lb(s3c) -> str:
    """A fresh bucket of the in-process endpoint."""
    name = f"lc-{uuid.uuid4().hex[:12]}"
    s3c.create_bucket(Bucket=name)
    return name


def _put(s3c, bucket, *rules):
    return s3c.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": list(rules)})


def test_routes():
    """``?lifecycle`` with GET/PUT/DELETE is the lifecycle configuration of the bucket;
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketLifecycleConfiguration.html"""
    def ep(method, target):
        return route(parse_target(method, target, {"Host": "127.0.0.1"}))

    assert ep("GET", "/b?lifecycle") == GetBucketLifecycleConfiguration("b")
    assert ep("GET", "/b?lifecycle=") == GetBucketLifecycleConfiguration("b")
    assert ep("PUT", "/b?lifecycle") == PutBucketLifecycleConfiguration("b")
    assert ep("DELETE", "/b?lifecycle") == DeleteBucketLifecycle("b")
    assert ep("HEAD", "/b?lifecycle") == HeadBucket("b")
    with pytest.raises(MethodNotAllowed):
        ep("POST", "/b?lifecycle")
    with pytest.raises(NotImplementedByGpufeed):
        ep("GET", "/b?lifecycle&policy")


def test_get_without_configuration_is_404(s3c, lb):
    """GetBucketLifecycleConfiguration on a bucket with none answers 404
    NoSuchLifecycleConfiguration; DeleteBucketLifecycle then still answers 204.
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketLifecycleConfiguration.html
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteBucketLifecycle.html"""
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_lifecycle_configuration(Bucket=lb)
    assert _err(ei.value) == (404, "NoSuchLifecycleConfiguration")
    r = s3c.delete_bucket_lifecycle(Bucket=lb)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_lifecycle_configuration(Bucket="no-such-bucket-lc")
    assert _err(ei.value) == (404, "NoSuchBucket")


def test_put_get_delete_round_trip(s3c, lb):
    """PutBucketLifecycleConfiguration stores the rules as given; Get answers them; Delete removes them.
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketLifecycleConfiguration.html
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleRule.html"""
    r = _put(s3c, lb,
             {"ID": "logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 30}},
             {"ID": "date", "Filter": {}, "Status": "Disabled", "Expiration": {"Date": MIDNIGHT_2030}},
             {"ID": "mpu", "Filter": {"Prefix": ""}, "Status": "Enabled",
              "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7}},
             {"ID": "old-style", "Prefix": "tmp/", "Status": "Enabled", "Expiration": {"Days": 1},
              "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2}})
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    rules = s3c.get_bucket_lifecycle_configuration(Bucket=lb)["Rules"]
    assert rules == [
        {"ID": "logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 30}},
        {"ID": "date", "Filter": {}, "Status": "Disabled", "Expiration": {"Date": MIDNIGHT_2030}},
        {"ID": "mpu", "Filter": {}, "Status": "Enabled",
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7}},
        {"ID": "old-style", "Prefix": "tmp/", "Status": "Enabled", "Expiration": {"Days": 1},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2}},
    ]
    _put(s3c, lb, {"Filter": {"Prefix": "x"}, "Status": "Enabled", "Expiration": {"Days": 5}})
    (only,) = s3c.get_bucket_lifecycle_configuration(Bucket=lb)["Rules"]
    assert only["ID"] and only["Expiration"] == {"Days": 5}  # the whole configuration is replaced; ID made up
    s3c.delete_bucket_lifecycle(Bucket=lb)
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_lifecycle_configuration(Bucket=lb)
    assert _err(ei.value) == (404, "NoSuchLifecycleConfiguration")


@pytest.mark.parametrize("rule, feature", [
    ({"NoncurrentVersionTransitions": [{"NoncurrentDays": 3, "StorageClass": "GLACIER"}]},
     "NoncurrentVersionTransition"),
    ({"Transitions": [{"Days": 3, "StorageClass": "GLACIER"}]}, "Transition"),
    ({"Filter": {"Tag": {"Key": "k", "Value": "v"}}, "Expiration": {"Days": 1}}, "Tag"),
    ({"Filter": {"ObjectSizeGreaterThan": 10}, "Expiration": {"Days": 1}}, "ObjectSizeGreaterThan"),
    ({"Filter": {"And": {"Prefix": "a", "Tags": [{"Key": "k", "Value": "v"}]}}, "Expiration": {"Days": 1}},
     "And"),
])
def test_rule_kinds_not_built_are_501_naming_them(s3c, lb, rule, feature):
    """Rule parts gpufeed does not build (storage classes, tags, sizes) are refused,
    never stored and ignored; https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleRule.html"""
    _put(s3c, lb, {"ID": "keep", "Filter": {}, "Status": "Enabled", "Expiration": {"Days": 9}})
    rule = {"ID": "r", "Status": "Enabled", **rule}
    rule.setdefault("Filter", {})
    with pytest.raises(ClientError) as ei:
        _put(s3c, lb, rule)
    assert _err(ei.value) == (501, "NotImplemented")
    assert feature in ei.value.response["Error"]["Message"]
    assert [r["ID"] for r in s3c.get_bucket_lifecycle_configuration(Bucket=lb)["Rules"]] == ["keep"]


@pytest.mark.parametrize("rule, code", [
    ({"Expiration": {"Days": 0}}, "InvalidArgument"),
    ({"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 0}}, "InvalidArgument"),
    ({"Expiration": {"Date": dt.datetime(2030, 1, 1, 12, tzinfo=dt.UTC)}}, "InvalidArgument"),
    ({"ID": "x" * 256, "Expiration": {"Days": 1}}, "InvalidArgument"),
    ({}, "InvalidRequest"),  # no action
    ({"Expiration": {"Days": 1, "ExpiredObjectDeleteMarker": True}}, "MalformedXML"),
    ({"Expiration": {"Date": MIDNIGHT_2030, "ExpiredObjectDeleteMarker": False}}, "MalformedXML"),
    ({"NoncurrentVersionExpiration": {"NoncurrentDays": 0}}, "InvalidArgument"),
    ({"NoncurrentVersionExpiration": {"NewerNoncurrentVersions": 3}}, "InvalidArgument"),
    ({"NoncurrentVersionExpiration": {"NoncurrentDays": 1, "NewerNoncurrentVersions": 0}}, "InvalidArgument"),
    ({"NoncurrentVersionExpiration": {"NoncurrentDays": 1, "NewerNoncurrentVersions": 101}}, "InvalidArgument"),
])
def test_bad_values_answer_aws_codes(s3c, lb, rule, code):
    """Days must be positive, a Date at midnight GMT, an ID at most 255 characters, a rule needs
    an action; ExpiredObjectDeleteMarker "cannot be specified with Days or Date" (S3 answers
    MalformedXML); NoncurrentDays is required and positive, NewerNoncurrentVersions 1 to 100.
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleExpiration.html
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_NoncurrentVersionExpiration.html"""
    with pytest.raises(ClientError) as ei:
        _put(s3c, lb, {"ID": "r", "Filter": {}, "Status": "Enabled", **rule})
    assert _err(ei.value) == (400, code)


def test_duplicate_ids_are_invalid_argument(s3c, lb):
    """Rule IDs are unique in a configuration;
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleRule.html"""
    rule = {"ID": "same", "Filter": {}, "Status": "Enabled", "Expiration": {"Days": 1}}
    with pytest.raises(ClientError) as ei:
        _put(s3c, lb, rule, rule)
    assert _err(ei.value) == (400, "InvalidArgument")


_NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
_OK_RULE = "<ID>r</ID><Filter></Filter><Status>Enabled</Status><Expiration><Days>1</Days></Expiration>"


@pytest.mark.parametrize("body", [
    b"<LifecycleConfiguration",  # not well-formed
    b"",
    f"<LifecycleConfiguration {_NS}></LifecycleConfiguration>".encode(),  # no rules
    f"<Lifecycle {_NS}><Rule>{_OK_RULE}</Rule></Lifecycle>".encode(),  # wrong root
    f"<LifecycleConfiguration><Rule>{_OK_RULE}<Bogus/></Rule></LifecycleConfiguration>".encode(),
    b"<LifecycleConfiguration><Rule><ID>r</ID><Status>Enabled</Status>"
    b"<Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>",  # neither Filter nor Prefix
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Prefix>a</Prefix><Status>Enabled</Status>"
    b"<Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>",  # both
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>On</Status>"
    b"<Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<Expiration><Days>one</Days></Expiration></Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<Expiration><Days>1</Days><Date>2030-01-01T00:00:00Z</Date></Expiration></Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<Expiration><Date>soon</Date></Expiration></Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<AbortIncompleteMultipartUpload/></Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<Expiration/></Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<Expiration><ExpiredObjectDeleteMarker>yes</ExpiredObjectDeleteMarker></Expiration>"
    b"</Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays><Days>1</Days>"
    b"</NoncurrentVersionExpiration></Rule></LifecycleConfiguration>",
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter/><Status>Enabled</Status>"
    b"<ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Rule></LifecycleConfiguration>",
])
def test_malformed_documents_are_malformed_xml(raw, bkt, code_of, body):
    """https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html (MalformedXML)"""
    r = raw.request("PUT", f"/{bkt}?lifecycle", body=body)
    assert (r.status, code_of(r.body)) == (400, "MalformedXML")
    assert raw.request("GET", f"/{bkt}?lifecycle").status == 404


def test_expiration_rule_deletes_objects_when_due(s3c, lb, s3_node):
    """Expiration Days deletes current objects under the prefix once due (creation + Days, rounded up
    to midnight UTC); https://docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-expire-general-considerations.html"""
    for k in ("logs/a", "logs/b", "data/c"):
        s3c.put_object(Bucket=lb, Key=k, Body=b"x")
    _put(s3c, lb, {"ID": "r", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 2}})
    made = s3_node.engine.head_object(lb, "logs/b").last_modified
    s3_node.engine.apply_lifecycle(now=due_time(made, 2) - 60)
    assert len(s3c.list_objects_v2(Bucket=lb)["Contents"]) == 3
    s3_node.engine.apply_lifecycle(now=due_time(made, 2) + 60)
    assert [o["Key"] for o in s3c.list_objects_v2(Bucket=lb)["Contents"]] == ["data/c"]
    with pytest.raises(ClientError) as ei:
        s3c.head_object(Bucket=lb, Key="logs/a")
    assert _err(ei.value)[0] == 404


def test_abort_rule_aborts_uploads_when_due(s3c, lb, s3_node):
    """AbortIncompleteMultipartUpload; the parts' space is freed.
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpu-abort-incomplete-mpu-lifecycle-config.html"""
    up = s3c.create_multipart_upload(Bucket=lb, Key="big")["UploadId"]
    s3c.upload_part(Bucket=lb, Key="big", UploadId=up, PartNumber=1, Body=b"p" * 100)
    _put(s3c, lb, {"ID": "r", "Filter": {}, "Status": "Enabled",
                   "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}})
    started = s3_node.engine.list_multipart_uploads(lb)[0].initiated
    s3_node.engine.apply_lifecycle(now=due_time(started, 1))
    assert "Uploads" not in s3c.list_multipart_uploads(Bucket=lb)
    with pytest.raises(ClientError) as ei:
        s3c.list_parts(Bucket=lb, Key="big", UploadId=up)
    assert _err(ei.value) == (404, "NoSuchUpload")
    assert not (s3_node.data_dir / "uploads" / up).exists()



def test_version_rules_round_trip(s3c, lb):
    """NoncurrentVersionExpiration (NoncurrentDays, NewerNoncurrentVersions) and Expiration
    ExpiredObjectDeleteMarker are stored and answered back as given.
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_NoncurrentVersionExpiration.html
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleExpiration.html"""
    rules = [
        {"ID": "nc", "Filter": {"Prefix": "logs/"}, "Status": "Enabled",
         "NoncurrentVersionExpiration": {"NoncurrentDays": 30, "NewerNoncurrentVersions": 3}},
        {"ID": "nc-only-days", "Filter": {}, "Status": "Enabled",
         "NoncurrentVersionExpiration": {"NoncurrentDays": 7}},
        {"ID": "markers", "Filter": {}, "Status": "Enabled", "Expiration": {"ExpiredObjectDeleteMarker": True}},
        {"ID": "markers-off", "Filter": {}, "Status": "Disabled",
         "Expiration": {"ExpiredObjectDeleteMarker": False}},
        {"ID": "all", "Prefix": "tmp/", "Status": "Enabled", "Expiration": {"Days": 2},
         "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}},
    ]
    _put(s3c, lb, *rules)
    assert s3c.get_bucket_lifecycle_configuration(Bucket=lb)["Rules"] == rules


def test_version_rules_over_s3(s3c, lb, s3_node):
    """In a versioned bucket Expiration adds a delete marker (HEAD is then 404), the
    expired version stays readable by id; NoncurrentVersionExpiration then removes it for good, and
    ExpiredObjectDeleteMarker the lone delete marker.
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html#intro-lifecycle-rules-actions"""
    eng = s3_node.engine
    eng.put_bucket_versioning(lb, "Enabled")
    vid = s3c.put_object(Bucket=lb, Key="k", Body=b"data").get("VersionId") or eng.head_object(lb, "k").version_id
    _put(s3c, lb,
         {"ID": "cur", "Filter": {}, "Status": "Enabled", "Expiration": {"Days": 1}},
         {"ID": "nc", "Filter": {}, "Status": "Enabled", "NoncurrentVersionExpiration": {"NoncurrentDays": 1}},
         {"ID": "dm", "Filter": {}, "Status": "Enabled", "Expiration": {"ExpiredObjectDeleteMarker": True}})
    made = eng.head_object(lb, "k").last_modified
    first = eng.apply_lifecycle(now=due_time(made, 1))
    assert (first.expired_objects, first.noncurrent_expired) == (1, 0)
    with pytest.raises(ClientError) as ei:
        s3c.head_object(Bucket=lb, Key="k")
    assert _err(ei.value)[0] == 404
    assert eng.get_object(lb, "k", version_id=vid) == b"data"
    second = eng.apply_lifecycle(now=due_time(made, 1) + 2 * 86400)
    assert (second.noncurrent_expired, second.delete_markers_removed) == (1, 1)
    assert eng.list_object_versions(lb).versions == []
