"""Bucket policies through a running node: Put/Get/DeleteBucketPolicy, sharing
between tenants, Deny over the owner, conditions on the source address and the
listing prefix, anonymous (unsigned) reads, and AWS's MalformedPolicy refusals.

Sources: "PutBucketPolicy", "GetBucketPolicy", "DeleteBucketPolicy", Amazon S3
API Reference; "Bucket policy examples" and "Policies and permissions in
Amazon S3", Amazon S3 User Guide; "Policy evaluation logic", IAM User Guide.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError

from gpufeed.admin import RemoteAdmin
from gpufeed.testing.node import start_node

ARN = "arn:aws:s3:::"


@pytest.fixture(scope="module")
def pnode(tmp_path_factory):
    node = start_node(tmp_path_factory.mktemp("policies") / "data")
    yield node
    node.stop()


def _client(node, key: dict):
    return boto3.client("s3", endpoint_url=node.s3_url, aws_access_key_id=key["access_key"],
                        aws_secret_access_key=key["secret_key"], region_name="us-east-1")


@pytest.fixture(scope="module")
def tenants(pnode):
    admin = RemoteAdmin(pnode.s3_url, pnode.access_key, pnode.secret_key)
    admin.tenant_create("owner")
    admin.tenant_create("reader")
    o, r = admin.key_create("owner"), admin.key_create("reader")
    return _client(pnode, o), _client(pnode, r), o, r


_counter = iter(range(1000))


@pytest.fixture
def share(tenants):
    """A fresh bucket of ``owner`` holding a few objects."""
    owner, reader, _, _ = tenants
    name = f"shared-{next(_counter)}"
    owner.create_bucket(Bucket=name)
    for key in ("pub/a.txt", "pub/b.txt", "priv/secret.txt"):
        owner.put_object(Bucket=name, Key=key, Body=f"body of {key}".encode())
    return name


def _code(exc: pytest.ExceptionInfo) -> tuple[int, str]:
    r = exc.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


def _policy(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def _urlopen(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_owner_round_trip(tenants, share):
    owner, reader, _, _ = tenants
    with pytest.raises(ClientError) as exc:
        owner.get_bucket_policy(Bucket=share)
    assert _code(exc) == (404, "NoSuchBucketPolicy")
    text = _policy({"Sid": "read", "Effect": "Allow", "Principal": {"AWS": "reader"},
                    "Action": "s3:GetObject", "Resource": f"{ARN}{share}/pub/*"})
    owner.put_bucket_policy(Bucket=share, Policy=text)
    assert owner.get_bucket_policy(Bucket=share)["Policy"] == text  # as stored
    # only the owner manages the policy, even when the policy shares the bucket
    for call in (lambda: reader.get_bucket_policy(Bucket=share),
                 lambda: reader.put_bucket_policy(Bucket=share, Policy=text),
                 lambda: reader.delete_bucket_policy(Bucket=share)):
        with pytest.raises(ClientError) as exc:
            call()
        assert _code(exc) == (403, "AccessDenied")
    owner.delete_bucket_policy(Bucket=share)
    owner.delete_bucket_policy(Bucket=share)  # none set: still 204
    with pytest.raises(ClientError) as exc:
        owner.get_bucket_policy(Bucket=share)
    assert _code(exc) == (404, "NoSuchBucketPolicy")


def test_cross_tenant_read_only_share(tenants, share):
    owner, reader, _, _ = tenants
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::reader:root"},
         "Action": ["s3:GetObject"], "Resource": f"{ARN}{share}/pub/*"},
        {"Effect": "Allow", "Principal": {"AWS": ["reader"]}, "Action": "s3:ListBucket",
         "Resource": f"{ARN}{share}", "Condition": {"StringLike": {"s3:prefix": "pub/*"}}}))
    assert reader.get_object(Bucket=share, Key="pub/a.txt")["Body"].read() == b"body of pub/a.txt"
    assert reader.head_object(Bucket=share, Key="pub/b.txt")["ContentLength"] == len(b"body of pub/b.txt")
    listed = reader.list_objects_v2(Bucket=share, Prefix="pub/", FetchOwner=True)
    assert [o["Key"] for o in listed["Contents"]] == ["pub/a.txt", "pub/b.txt"]
    assert {o["Owner"]["DisplayName"] for o in listed["Contents"]} == {"owner"}  # the bucket's, not the reader
    refused = [
        lambda: reader.get_object(Bucket=share, Key="priv/secret.txt"),
        lambda: reader.list_objects_v2(Bucket=share),
        lambda: reader.list_objects_v2(Bucket=share, Prefix="priv/"),
        lambda: reader.put_object(Bucket=share, Key="pub/new.txt", Body=b"x"),
        lambda: reader.delete_object(Bucket=share, Key="pub/a.txt"),
        lambda: reader.copy_object(Bucket=share, Key="pub/c.txt", CopySource={"Bucket": share, "Key": "pub/a.txt"}),
        lambda: reader.delete_bucket(Bucket=share),
        lambda: reader.get_bucket_acl(Bucket=share),
    ]
    for call in refused:
        with pytest.raises(ClientError) as exc:
            call()
        assert _code(exc) == (403, "AccessDenied")
        assert "body of" not in json.dumps(exc.value.response.get("Error", {}))  # no data
    res = reader.delete_objects(Bucket=share, Delete={"Objects": [{"Key": "pub/a.txt"}]})
    assert [e["Code"] for e in res["Errors"]] == ["AccessDenied"]
    assert sorted(o["Key"] for o in owner.list_objects_v2(Bucket=share)["Contents"]) == [
        "priv/secret.txt", "pub/a.txt", "pub/b.txt"]


def test_shared_writer_writes_into_the_owners_bucket(tenants, share):
    owner, reader, _, _ = tenants
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Effect": "Allow", "Principal": {"AWS": "reader"}, "Action": ["s3:PutObject", "s3:GetObject"],
         "Resource": f"{ARN}{share}/drop/*"}))
    reader.put_object(Bucket=share, Key="drop/r.txt", Body=b"from reader")
    assert owner.get_object(Bucket=share, Key="drop/r.txt")["Body"].read() == b"from reader"
    # a copy needs s3:GetObject on its source as well
    reader.copy_object(Bucket=share, Key="drop/copy.txt", CopySource={"Bucket": share, "Key": "drop/r.txt"})
    with pytest.raises(ClientError) as exc:
        reader.copy_object(Bucket=share, Key="drop/stolen.txt",
                           CopySource={"Bucket": share, "Key": "priv/secret.txt"})
    assert _code(exc) == (403, "AccessDenied")
    assert [b["Name"] for b in reader.list_buckets().get("Buckets", [])] == []  # still the owner's bucket


def test_deny_wins_over_the_owner(tenants, share):
    owner, _, _, _ = tenants
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Effect": "Deny", "Principal": "*", "Action": ["s3:DeleteObject", "s3:PutObject"],
         "Resource": f"{ARN}{share}/priv/*"}))
    for call in (lambda: owner.delete_object(Bucket=share, Key="priv/secret.txt"),
                 lambda: owner.put_object(Bucket=share, Key="priv/other.txt", Body=b"x")):
        with pytest.raises(ClientError) as exc:
            call()
        assert _code(exc) == (403, "AccessDenied")
    res = owner.delete_objects(Bucket=share, Delete={"Objects": [{"Key": "priv/secret.txt"}, {"Key": "pub/a.txt"}]})
    assert [e["Key"] for e in res["Errors"]] == ["priv/secret.txt"]
    assert [d["Key"] for d in res["Deleted"]] == ["pub/a.txt"]
    assert owner.get_object(Bucket=share, Key="priv/secret.txt")["Body"].read() == b"body of priv/secret.txt"
    owner.put_object(Bucket=share, Key="pub/ok.txt", Body=b"ok")  # elsewhere the owner acts as before
    owner.delete_bucket_policy(Bucket=share)  # and it can always take the policy back


def test_deny_of_everything_does_not_lock_the_owner_out_of_the_policy(tenants, share):
    owner, _, _, _ = tenants
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": [f"{ARN}{share}", f"{ARN}{share}/*"]}))
    with pytest.raises(ClientError) as exc:
        owner.list_objects_v2(Bucket=share)
    assert _code(exc) == (403, "AccessDenied")
    assert "Deny" in owner.get_bucket_policy(Bucket=share)["Policy"]
    owner.delete_bucket_policy(Bucket=share)
    assert len(owner.list_objects_v2(Bucket=share)["Contents"]) == 3


@pytest.mark.parametrize(("cidr", "allowed"), [("127.0.0.1/32", True), ("10.0.0.0/8", False)])
def test_source_ip_condition(tenants, share, cidr, allowed):
    owner, reader, _, _ = tenants
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Effect": "Allow", "Principal": {"AWS": "reader"}, "Action": "s3:GetObject",
         "Resource": f"{ARN}{share}/*", "Condition": {"IpAddress": {"aws:SourceIp": cidr}}}))
    if allowed:
        assert reader.get_object(Bucket=share, Key="priv/secret.txt")["Body"].read()
    else:
        with pytest.raises(ClientError) as exc:
            reader.get_object(Bucket=share, Key="priv/secret.txt")
        assert _code(exc) == (403, "AccessDenied")


def test_prefix_condition_on_list_bucket(tenants, share):
    owner, reader, _, _ = tenants
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Effect": "Allow", "Principal": {"AWS": "reader"}, "Action": "s3:ListBucket", "Resource": f"{ARN}{share}",
         "Condition": {"StringEquals": {"s3:prefix": ["", "pub/"]}}}))
    assert [o["Key"] for o in reader.list_objects_v2(Bucket=share, Prefix="pub/")["Contents"]] == [
        "pub/a.txt", "pub/b.txt"]
    assert len(reader.list_objects(Bucket=share)["Contents"]) == 3  # no prefix: s3:prefix is ""
    with pytest.raises(ClientError) as exc:
        reader.list_objects_v2(Bucket=share, Prefix="priv/")
    assert _code(exc) == (403, "AccessDenied")
    with pytest.raises(ClientError) as exc:
        reader.list_object_versions(Bucket=share, Prefix="pub/")  # s3:ListBucketVersions is not granted
    assert _code(exc) == (403, "AccessDenied")


def test_anonymous_public_read_of_a_prefix(pnode, tenants, share):
    owner, _, _, _ = tenants
    base = f"{pnode.s3_url}/{share}"
    status, body = _urlopen(f"{base}/pub/a.txt")
    assert status == 403 and b"AccessDenied" in body and b"body of" not in body
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Sid": "PublicRead", "Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject"],
         "Resource": [f"{ARN}{share}/pub/*"]}))
    assert _urlopen(f"{base}/pub/a.txt") == (200, b"body of pub/a.txt")
    for url, method, data in ((f"{base}/priv/secret.txt", "GET", None), (f"{base}", "GET", None),
                              (f"{base}/pub/new.txt", "PUT", b"x"), (f"{base}/pub/a.txt", "DELETE", None),
                              (f"{base}?policy", "GET", None), (pnode.s3_url + "/", "GET", None),
                              (f"{pnode.s3_url}/anon-made-bucket", "PUT", None)):
        status, body = _urlopen(url, method, data)
        assert status == 403 and b"AccessDenied" in body, (url, method, status, body)
        assert b"body of" not in body and share.encode() not in body.split(b"<Resource>")[0]
    assert owner.get_object(Bucket=share, Key="pub/a.txt")["Body"].read() == b"body of pub/a.txt"
    # a bucket that does not exist is NoSuchBucket, as S3 answers anonymous callers
    status, body = _urlopen(f"{pnode.s3_url}/no-such-bucket-here/k")
    assert status == 404 and b"NoSuchBucket" in body


BAD = [
    ("not json", "Policies must be valid JSON and the first byte must be '{'"),
    ('{"Statement": [', "This policy contains invalid Json"),
    ('{"Version": "2012-10-17"}', "Missing required field Statement"),
    (None, "Invalid effect: Permit"),
    (None, "Invalid principal in policy"),
    (None, "Policy has invalid resource"),
    (None, "Action does not apply to any resource(s) in statement"),
    (None, "Invalid Condition type : IpAddressish"),
    (None, "Policy has an invalid condition key"),
    (None, "Policy exceeds the maximum allowed document size."),
]


def _bad_document(bucket: str, reason: str) -> str:
    st = {"Effect": "Allow", "Principal": {"AWS": "reader"}, "Action": "s3:GetObject",
          "Resource": f"{ARN}{bucket}/*"}
    variants = {
        "Invalid effect: Permit": st | {"Effect": "Permit"},
        "Invalid principal in policy": st | {"Principal": {"AWS": "nobody-such"}},
        "Policy has invalid resource": st | {"Resource": f"{ARN}some-other-bucket/*"},
        "Action does not apply to any resource(s) in statement": st | {"Action": "s3:ListBucket"},
        "Invalid Condition type : IpAddressish": st | {"Condition": {"IpAddressish": {"aws:SourceIp": "1.2.3.4"}}},
        "Policy has an invalid condition key": st | {"Condition": {"StringEquals": {"aws:Referer": "x"}}},
        "Policy exceeds the maximum allowed document size.": st | {
            "Resource": [f"{ARN}{bucket}/{i:06d}/*" for i in range(900)]},
    }
    return _policy(variants[reason])


@pytest.mark.parametrize(("text", "reason"), BAD, ids=[r for _, r in BAD])
def test_malformed_policies(tenants, share, text, reason):
    owner, _, _, _ = tenants
    good = _policy({"Effect": "Allow", "Principal": {"AWS": "reader"}, "Action": "s3:GetObject",
                    "Resource": f"{ARN}{share}/pub/*"})
    owner.put_bucket_policy(Bucket=share, Policy=good)
    with pytest.raises(ClientError) as exc:
        owner.put_bucket_policy(Bucket=share, Policy=text if text is not None else _bad_document(share, reason))
    assert _code(exc) == (400, "MalformedPolicy")
    assert exc.value.response["Error"]["Message"] == reason
    assert owner.get_bucket_policy(Bucket=share)["Policy"] == good  # nothing changed


def test_malformed_policy_on_a_bucket_without_one_stores_nothing(tenants, share):
    owner, _, _, _ = tenants
    with pytest.raises(ClientError) as exc:
        owner.put_bucket_policy(Bucket=share, Policy=_bad_document(share, "Invalid principal in policy"))
    assert _code(exc) == (400, "MalformedPolicy")
    with pytest.raises(ClientError) as exc:
        owner.get_bucket_policy(Bucket=share)
    assert _code(exc) == (404, "NoSuchBucketPolicy")


def test_policy_on_a_missing_bucket(tenants):
    owner, _, _, _ = tenants
    with pytest.raises(ClientError) as exc:
        owner.put_bucket_policy(Bucket="no-such-bucket-x", Policy=_policy())
    assert _code(exc) == (404, "NoSuchBucket")


def test_every_bucket_endpoint_names_its_action():
    """Each routed call on a bucket or object asks authorize for an S3 action of
    its own (never the catch-all); those handled apart are listed here."""
    from gpufeed.engine._policy import ACTIONS as KNOWN
    from gpufeed.s3 import _policy, _router

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    live = {c for c in walk(_router.BucketEndpoint) if getattr(_router, c.__name__, None) is c}
    apart = {_router.CreateBucket, _router.ObjectEndpoint, _router.GetBucketConfiguration,
             _router.DeleteBucketConfiguration}
    assert live - set(_policy.ACTIONS) == apart
    assert set(_policy.ACTIONS.values()) <= set(KNOWN)
    for config in _router.BUCKET_CONFIGURATIONS:
        for ep in (_router.GetBucketConfiguration("b", config), _router.DeleteBucketConfiguration("b", config)):
            assert _policy.request_action(ep, {}) in KNOWN
    assert _policy.request_action(_router.GetObject("b", "k"), {"versionId": "v"}) == "s3:GetObjectVersion"


def test_deny_of_get_object_covers_get_object_attributes(tenants, share):
    """GetObjectAttributes also asks s3:GetObject, so a Deny of reads hides sizes and ETags too.
    Source: "GetObjectAttributes" (permissions), Amazon S3 API Reference."""
    owner, _, _, _ = tenants
    owner.put_bucket_policy(Bucket=share, Policy=_policy(
        {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject", "Resource": f"{ARN}{share}/priv/*"}))
    try:
        with pytest.raises(ClientError) as exc:
            owner.get_object_attributes(Bucket=share, Key="priv/secret.txt", ObjectAttributes=["ETag", "ObjectSize"])
        assert _code(exc) == (403, "AccessDenied")
    finally:
        owner.delete_bucket_policy(Bucket=share)


def test_deeply_nested_policy_is_malformed_not_a_500(tenants, share):
    owner, _, _, _ = tenants
    with pytest.raises(ClientError) as exc:
        owner.put_bucket_policy(Bucket=share, Policy='{"Statement":' + "[" * 5000 + "]" * 5000 + "}")
    assert _code(exc) == (400, "MalformedPolicy")
