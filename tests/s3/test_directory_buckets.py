"""Directory buckets (S3 Express One Zone) on the S3 front, with stock boto3 and raw HTTP.

Sources: "Directory bucket naming rules", "How is S3 Express One Zone
different?", Amazon S3 User Guide; "CreateBucket", "CreateSession",
"ListObjectsV2", Amazon S3 API Reference.
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

ZONE = "use1-az4"


def _name() -> str:
    return f"d{uuid.uuid4().hex[:10]}--{ZONE}--x-s3"


def _config(zone: str = ZONE) -> dict:
    return {"Location": {"Type": "AvailabilityZone", "Name": zone},
            "Bucket": {"DataRedundancy": "SingleAvailabilityZone", "Type": "Directory"}}


def _code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.response["Error"]["Code"]


#: Client setting for calls botocore would otherwise sign with a session: CreateBucket
#: of a bucket that does not exist yet (botocore's CreateSession for it fails).
NO_SESSION = {"s3": {"disable_s3_express_session_auth": True}}


@pytest.fixture
def s3x(s3_node):
    """boto3 client that signs directory bucket calls with the long-term key (no CreateSession)."""
    client = s3_node.client(**NO_SESSION)
    yield client
    client.close()


@pytest.fixture(scope="module")
def dbucket(s3_node) -> str:
    """A directory bucket with a small tree, filled through stock boto3."""
    name = _name()
    c = s3_node.client(**NO_SESSION)
    c.create_bucket(Bucket=name, CreateBucketConfiguration=_config())
    c.close()
    c = s3_node.client()
    for key in ["top.txt", "a/1", "a/2", "a/b/3", "a/b/c/4", "z/5"]:
        c.put_object(Bucket=name, Key=key, Body=key.encode())
    c.close()
    return name


def test_stock_boto3_cannot_create_through_a_session(s3c):
    """With an endpoint_url botocore signs CreateBucket of an ``--x-s3`` name with
    a session too, and CreateSession of a bucket that does not exist is NoSuchBucket
    (as on S3); ``disable_s3_express_session_auth`` (:data:`NO_SESSION`) creates it."""
    with pytest.raises(ClientError) as exc:
        s3c.create_bucket(Bucket=_name(), CreateBucketConfiguration=_config())
    assert _code(exc) == "NoSuchBucket"


# -- creation and naming --------------------------------------------------------------------

def test_create_makes_a_directory_kind_bucket(s3_node, dbucket):
    assert s3_node.engine.head_bucket(dbucket).kind == "directory"


@pytest.mark.parametrize("name", [
    "ab--use1-az4--x-s3x", "Upper--use1-az4--x-s3", "-a--use1-az4--x-s3", "a_b--use1-az4--x-s3",
    "xn--a--use1-az4--x-s3", "noaz--x-s3", "a--useaz4--x-s3", "a" * 60 + "--use1-az4--x-s3",
])
def test_directory_naming_rules(s3x, name):
    with pytest.raises(ClientError) as exc:
        s3x.create_bucket(Bucket=name, CreateBucketConfiguration=_config())
    assert _code(exc) == "InvalidBucketName"


def test_x_s3_suffix_without_directory_configuration_is_refused(s3x):
    """A general purpose name may not end in ``--x-s3`` ("Bucket naming rules")."""
    with pytest.raises(ClientError) as exc:
        s3x.create_bucket(Bucket=_name())
    assert _code(exc) == "InvalidBucketName"


def test_directory_configuration_on_general_purpose_name_is_refused(s3c):
    with pytest.raises(ClientError) as exc:
        s3c.create_bucket(Bucket=f"g{uuid.uuid4().hex[:10]}", CreateBucketConfiguration=_config())
    assert _code(exc) == "InvalidBucketName"


@pytest.mark.parametrize("config", [
    {"Location": {"Type": "AvailabilityZone", "Name": "usw2-az1"},
     "Bucket": {"DataRedundancy": "SingleAvailabilityZone", "Type": "Directory"}},
    {"Location": {"Type": "AvailabilityZone", "Name": ZONE},
     "Bucket": {"DataRedundancy": "SingleLocalZone", "Type": "Directory"}},
])
def test_configuration_must_match_the_name(s3x, config):
    with pytest.raises(ClientError) as exc:
        s3x.create_bucket(Bucket=_name(), CreateBucketConfiguration=config)
    assert _code(exc) == "InvalidArgument"


def test_engine_rules(s3_node):
    from gpufeed.errors import InvalidArgument, InvalidBucketName
    with pytest.raises(InvalidBucketName):
        s3_node.engine.create_bucket(_name())  # kind standard
    with pytest.raises(InvalidBucketName):
        s3_node.engine.create_bucket("plain-name", kind="directory")
    with pytest.raises(InvalidArgument):
        s3_node.engine.create_bucket(_name(), kind="directory", capacity_bytes=10)
    with pytest.raises(InvalidArgument):
        s3_node.engine.create_bucket(_name(), kind="directory", object_lock=True)
    name = s3_node.engine.create_bucket(_name(), kind="directory").name
    with pytest.raises(InvalidArgument):
        s3_node.engine.put_bucket_versioning(name, "Enabled")
    s3_node.engine.delete_bucket(name)


# -- stock boto3: CreateSession and session-signed requests ------------------------------------

def test_stock_boto3_round_trip_uses_sessions(s3_node, dbucket):
    """boto3 resolves ``--x-s3`` buckets to the S3Express backend: with an IP
    endpoint_url it keeps path style, calls CreateSession once and signs every
    data call with the session (service ``s3express``, ``x-amz-s3session-token``)."""
    c = s3_node.client()
    seen: list[dict] = []
    c.meta.events.register("before-send.s3", lambda request, **kw: seen.append(dict(request.headers)))
    c.put_object(Bucket=dbucket, Key="new/obj", Body=b"hello")
    assert c.get_object(Bucket=dbucket, Key="new/obj")["Body"].read() == b"hello"
    c.head_object(Bucket=dbucket, Key="new/obj")
    c.delete_object(Bucket=dbucket, Key="new/obj")
    c.close()
    tokens = [h.get("x-amz-s3session-token") for h in seen]
    assert tokens[0] is None and b"/s3express/" in seen[0]["Authorization"]  # CreateSession
    assert all(t is not None for t in tokens[1:]) and len(set(tokens[1:])) == 1


def test_create_session_answer(s3c, dbucket):
    creds = s3c.create_session(Bucket=dbucket)["Credentials"]
    assert creds["AccessKeyId"].startswith("GFXS") and creds["SecretAccessKey"] and creds["SessionToken"]
    import datetime
    left = (creds["Expiration"] - datetime.datetime.now(datetime.UTC)).total_seconds()
    assert 280 < left <= 301


def test_create_session_on_general_purpose_bucket_is_refused(s3c, bkt):
    with pytest.raises(ClientError) as exc:
        s3c.create_session(Bucket=bkt)
    assert _code(exc) == "NotImplemented"


def test_create_session_of_missing_bucket(s3c):
    with pytest.raises(ClientError) as exc:
        s3c.create_session(Bucket=_name())
    assert _code(exc) == "NoSuchBucket"


def _session(s3_node, bucket, mode="ReadWrite"):
    c = s3_node.client()
    creds = c.create_session(Bucket=bucket, SessionMode=mode)["Credentials"]
    c.close()
    return creds


def _get_signed(raw, path, creds, token, *, extra=None):
    headers = {"x-amz-s3session-token": token} if token is not None else {}
    headers.update(extra or {})
    return raw.request("GET", path, headers=headers, access_key=creds["AccessKeyId"],
                       secret_key=creds["SecretAccessKey"])


def test_raw_session_requests(s3_node, raw, dbucket, bkt):
    creds = _session(s3_node, dbucket)
    ok = _get_signed(raw, f"/{dbucket}/top.txt", creds, creds["SessionToken"])
    assert ok.status == 200 and ok.body == b"top.txt"
    forged = _get_signed(raw, f"/{dbucket}/top.txt", creds, creds["SessionToken"][:-2] + "xx")
    assert forged.status == 400 and b"<Code>InvalidToken</Code>" in forged.body
    missing = _get_signed(raw, f"/{dbucket}/top.txt", creds, None)
    assert missing.status == 403
    other = _get_signed(raw, f"/{bkt}?list-type=2", creds, creds["SessionToken"])
    assert other.status == 403
    # a token on a request signed with long-term keys
    plain = raw.request("GET", f"/{dbucket}/top.txt", headers={"x-amz-s3session-token": creds["SessionToken"]})
    assert plain.status == 400 and b"InvalidToken" in plain.body
    # a session cannot make a session
    again = _get_signed(raw, f"/{dbucket}?session", creds, creds["SessionToken"])
    assert again.status == 403


def test_expired_session_is_refused(s3_node, raw, dbucket, monkeypatch):
    creds = _session(s3_node, dbucket)
    import gpufeed.s3._sessions as sessions
    real = sessions.SessionKeyRing.check

    def later(self, auth, token, endpoint):
        monkeypatch.setattr(self, "clock", lambda: sessions.time.time() + 301)
        return real(self, auth, token, endpoint)

    monkeypatch.setattr(sessions.SessionKeyRing, "check", later)
    r = _get_signed(raw, f"/{dbucket}/top.txt", creds, creds["SessionToken"])
    assert r.status == 400 and b"<Code>ExpiredToken</Code>" in r.body


def test_read_only_session(s3_node, raw, dbucket):
    creds = _session(s3_node, dbucket, "ReadOnly")
    assert _get_signed(raw, f"/{dbucket}/top.txt", creds, creds["SessionToken"]).status == 200
    put = raw.request("PUT", f"/{dbucket}/ro", body=b"x", headers={"x-amz-s3session-token": creds["SessionToken"]},
                      access_key=creds["AccessKeyId"], secret_key=creds["SecretAccessKey"])
    assert put.status == 403


def test_bad_session_mode(s3c, dbucket):
    with pytest.raises(ClientError) as exc:
        s3c.create_session(Bucket=dbucket, SessionMode="Admin")
    assert _code(exc) == "InvalidArgument"


def test_session_of_revoked_key_dies(s3_node, raw):
    """A session answers only while the key that made it is valid."""
    eng = s3_node.engine
    tenant = f"t{uuid.uuid4().hex[:8]}"
    eng.create_tenant(tenant)
    info, sk = eng.create_access_key(tenant)
    ak = info.access_key
    c = boto3.client("s3", endpoint_url=s3_node.s3_url, aws_access_key_id=ak, aws_secret_access_key=sk,
                     region_name="us-east-1", config=Config(**NO_SESSION))
    name = _name()
    c.create_bucket(Bucket=name, CreateBucketConfiguration=_config())
    c.put_object(Bucket=name, Key="k", Body=b"v")
    creds = c.create_session(Bucket=name)["Credentials"]
    assert _get_signed(raw, f"/{name}/k", creds, creds["SessionToken"]).status == 200
    eng.revoke_access_key(ak)
    assert _get_signed(raw, f"/{name}/k", creds, creds["SessionToken"]).status == 403
    c.close()


# -- listing ------------------------------------------------------------------------------------

def test_list_v2_directory(s3c, dbucket):
    r = s3c.list_objects_v2(Bucket=dbucket, Prefix="a/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a/1", "a/2"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/b/"]
    top = s3c.list_objects_v2(Bucket=dbucket, Delimiter="/")
    assert [o["Key"] for o in top["Contents"]] == ["top.txt"]
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["a/", "z/"]


def test_list_v2_pages_with_continuation_tokens(s3_node, s3c, s3x):
    name = _name()
    s3x.create_bucket(Bucket=name, CreateBucketConfiguration=_config())
    keys = sorted(f"dir/{i:03d}" for i in range(25)) + ["dir/sub/x"]
    for k in keys:
        s3_node.engine.put_object(name, k, b"")
    got, prefixes = [], []
    for page in s3c.get_paginator("list_objects_v2").paginate(Bucket=name, Prefix="dir/", Delimiter="/",
                                                                PaginationConfig={"PageSize": 7}):
        got += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    assert got == keys[:-1] and prefixes == ["dir/sub/"]


@pytest.mark.parametrize("prefix,delimiter", [("a", "/"), ("a/b", "/"), ("a/", "|"), ("", "-")])
def test_list_v2_refused_arguments(s3c, dbucket, prefix, delimiter):
    with pytest.raises(ClientError) as exc:
        s3c.list_objects_v2(Bucket=dbucket, Prefix=prefix, Delimiter=delimiter)
    assert _code(exc) == "InvalidArgument"


def test_list_v2_prefix_without_delimiter_is_allowed(s3c, dbucket):
    r = s3c.list_objects_v2(Bucket=dbucket, Prefix="a/b")
    assert [o["Key"] for o in r["Contents"]] == ["a/b/3", "a/b/c/4"]


def test_list_v1_is_refused(s3_node, raw, dbucket):
    r = _get_signed(raw, f"/{dbucket}?prefix=a/", {"AccessKeyId": s3_node.access_key,
                                                  "SecretAccessKey": s3_node.secret_key}, None)
    assert r.status == 501 and b"<Code>NotImplemented</Code>" in r.body


# -- refused features -------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda c, b: c.get_bucket_versioning(Bucket=b),
    lambda c, b: c.put_bucket_versioning(Bucket=b, VersioningConfiguration={"Status": "Enabled"}),
    lambda c, b: c.list_object_versions(Bucket=b),
    lambda c, b: c.get_object_lock_configuration(Bucket=b),
    lambda c, b: c.put_object_lock_configuration(Bucket=b, ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"}),
    lambda c, b: c.get_object_retention(Bucket=b, Key="top.txt"),
    lambda c, b: c.get_object_legal_hold(Bucket=b, Key="top.txt"),
    lambda c, b: c.get_object_tagging(Bucket=b, Key="top.txt"),
    lambda c, b: c.put_object_tagging(Bucket=b, Key="top.txt", Tagging={"TagSet": []}),
    lambda c, b: c.put_bucket_tagging(Bucket=b, Tagging={"TagSet": [{"Key": "k", "Value": "v"}]}),
    lambda c, b: c.get_bucket_tagging(Bucket=b),
    lambda c, b: c.get_bucket_acl(Bucket=b),
    lambda c, b: c.get_object_acl(Bucket=b, Key="top.txt"),
    lambda c, b: c.put_object(Bucket=b, Key="tagged", Body=b"x", Tagging="a=b"),
    lambda c, b: c.put_object(Bucket=b, Key="held", Body=b"x", ObjectLockLegalHoldStatus="ON"),
])
def test_unsupported_features_are_refused(s3c, dbucket, call):
    with pytest.raises(ClientError) as exc:
        call(s3c, dbucket)
    assert _code(exc) == "NotImplemented"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501


def test_general_purpose_bucket_unaffected(s3c, bkt):
    s3c.put_object(Bucket=bkt, Key="x/y", Body=b"1")
    assert s3c.list_objects_v2(Bucket=bkt, Prefix="x", Delimiter="y")["KeyCount"] >= 0
    s3c.get_bucket_versioning(Bucket=bkt)
    s3c.list_objects(Bucket=bkt)


def test_delete_bucket(s3c, s3x):
    name = _name()
    s3x.create_bucket(Bucket=name, CreateBucketConfiguration=_config())
    s3c.put_object(Bucket=name, Key="a/b", Body=b"")
    s3c.delete_object(Bucket=name, Key="a/b")
    s3c.delete_bucket(Bucket=name)


def test_virtual_host_style(s3_node, raw, dbucket):
    """``bucket.localhost`` Host headers (what botocore sends for an endpoint_url of
    ``http://localhost:PORT``) reach the directory bucket too."""
    host = f"{dbucket}.localhost:{raw.port}"
    r = raw.request("GET", "/?list-type=2&prefix=a/&delimiter=/", host=host)
    assert r.status == 200
    keys = [e.text for e in ET.fromstring(r.body).iter("{http://s3.amazonaws.com/doc/2006-03-01/}Key")]
    assert keys == ["a/1", "a/2"]


def test_boto3_addressing_style_config_is_accepted(s3_node, dbucket):
    c = s3_node.client(s3={"addressing_style": "path"})
    assert c.get_object(Bucket=dbucket, Key="z/5")["Body"].read() == b"z/5"
    c.close()


def test_stock_boto3_multipart_upload(s3_node, dbucket):
    import io

    from boto3.s3.transfer import TransferConfig
    c = s3_node.client()
    data = bytes(range(256)) * (24 * 1024)  # 6 MiB: two parts of 5 MiB and 1 MiB
    c.upload_fileobj(io.BytesIO(data), dbucket, "mp/big",
                     Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    assert c.get_object(Bucket=dbucket, Key="mp/big")["Body"].read() == data
    c.delete_object(Bucket=dbucket, Key="mp/big")
    c.close()


def test_stock_boto3_presigned_get(s3_node, dbucket):
    """botocore presigns a directory bucket GET with a session (``X-Amz-S3session-Token`` in the query)."""
    import urllib.request
    c = s3_node.client()
    url = c.generate_presigned_url("get_object", Params={"Bucket": dbucket, "Key": "top.txt"}, ExpiresIn=60)
    c.close()
    assert "X-Amz-S3session-Token=" in url
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == b"top.txt"


def test_cross_tenant_session_follows_the_bucket_policy_of_its_key(s3_node):
    """A session acts as the key that made it: a bucket policy naming that key (not
    the session's id) lets its session requests through, and only those actions."""
    import json
    eng = s3_node.engine
    keys = {}
    for who in ("owner", "guest"):
        tenant = f"{who}{uuid.uuid4().hex[:6]}"
        eng.create_tenant(tenant)
        info, secret = eng.create_access_key(tenant)
        keys[who] = (info.access_key, secret)

    def client(who, **cfg):
        ak, sk = keys[who]
        return boto3.client("s3", endpoint_url=s3_node.s3_url, aws_access_key_id=ak, aws_secret_access_key=sk,
                            region_name="us-east-1", config=Config(**cfg) if cfg else None)

    owner, guest = client("owner", **NO_SESSION), client("guest")
    name = _name()
    owner.create_bucket(Bucket=name, CreateBucketConfiguration=_config())
    owner.put_object(Bucket=name, Key="pub/a", Body=b"shared")
    with pytest.raises(ClientError) as exc:
        guest.get_object(Bucket=name, Key="pub/a")  # CreateSession itself is refused
    assert _code(exc) == "AccessDenied"
    arn = f"arn:aws:s3:::{name}"
    owner.put_bucket_policy(Bucket=name, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": keys["guest"][0]}, "Action": ["s3:ListBucket", "s3:GetObject"],
         "Resource": [arn, f"{arn}/*"]}]}))
    guest2 = client("guest")
    assert guest2.get_object(Bucket=name, Key="pub/a")["Body"].read() == b"shared"
    with pytest.raises(ClientError) as exc:
        guest2.put_object(Bucket=name, Key="pub/b", Body=b"x")
    assert _code(exc) == "AccessDenied"
    for c in (owner, guest, guest2):
        c.close()
