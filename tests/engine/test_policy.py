"""Bucket policies in the engine: the parser's refusals, the evaluator's
decisions (pure functions), and Engine.authorize with the per-bucket cache.

Sources: "Policy evaluation logic" and "IAM JSON policy elements reference",
IAM User Guide; "Bucket policy examples", Amazon S3 User Guide.
"""

from __future__ import annotations

import json

import pytest

from gpufeed.engine import Engine
from gpufeed.engine._policy import MAX_POLICY_BYTES, PolicyRequest, evaluate, parse_policy
from gpufeed.errors import AccessDenied, MalformedPolicy, NoSuchBucket


def _known(name: str) -> str | None:
    return {"alice": "tenant:alice", "bob": "tenant:bob", "default": "tenant:default",
            "GFBOBKEY": "key:GFBOBKEY"}.get(name)


def _doc(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def _st(**kw) -> dict:
    return {"Effect": "Allow", "Principal": {"AWS": "bob"}, "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::bkt/*"} | kw


def _parse(*statements: dict):
    return parse_policy(_doc(*statements), "bkt", _known)


def _req(action="s3:GetObject", key="k", tenant="bob", **kw) -> PolicyRequest:
    return PolicyRequest(tenant=tenant, access_key=kw.pop("access_key", None), action=action, bucket="bkt",
                         key=key, **kw)


# -- parsing -------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "reason"), [
    ("not json", "Policies must be valid JSON and the first byte must be '{'"),
    ("{not json", "This policy contains invalid Json"),
    ('{"Version": "2012-10-17"}', "Missing required field Statement"),
    (_doc(_st(Effect="Allw")), "Invalid effect: Allw"),
    (_doc({k: v for k, v in _st().items() if k != "Effect"}), "Missing required field Effect"),
    (_doc({k: v for k, v in _st().items() if k != "Principal"}), "Missing required field Principal"),
    (_doc(_st(Principal={"AWS": "mallory"})), "Invalid principal in policy"),
    (_doc(_st(Principal={"AWS": "arn:aws:iam::mallory:root"})), "Invalid principal in policy"),
    (_doc(_st(Principal={"AWS": "arn:aws:iam::GFBOBKEY:root"})), "Invalid principal in policy"),
    (_doc(_st(Principal={"Service": "s3.amazonaws.com"})), "Invalid principal in policy"),
    (_doc(_st(Resource="arn:aws:s3:::other/*")), "Policy has invalid resource"),
    (_doc(_st(Resource="b/*")), "Policy has invalid resource"),
    (_doc(_st(Action="s3:ListBucket")), "Action does not apply to any resource(s) in statement"),
    (_doc(_st(Action="s3:GetObject", Resource="arn:aws:s3:::bkt")),
     "Action does not apply to any resource(s) in statement"),
    (_doc(_st(Action="s3:NoSuchThing")), "Policy has invalid action"),
    (_doc(_st(Action="ec2:RunInstances")), "Policy has invalid action"),
    (_doc(_st(Condition={"StringEqualz": {"s3:prefix": "a"}})), "Invalid Condition type : StringEqualz"),
    (_doc(_st(Condition={"StringEquals": {"aws:CurrentTime": "x"}})), "Policy has an invalid condition key"),
    (_doc(_st(Condition={"IpAddress": {"s3:prefix": "10.0.0.0/8"}})), "Policy has an invalid condition key"),
    (_doc(_st(Condition={"IpAddress": {"aws:SourceIp": "not-an-ip"}})), "Invalid IP address"),
    (_doc(_st(Sid="x"), _st(Sid="x")), "Statement IDs (SID) in a single policy must be unique"),
    (json.dumps({"Version": "2099-01-01", "Statement": [_st()]}), "valid version string"),
])
def test_malformed_policies_are_refused_with_the_reason(text, reason):
    with pytest.raises(MalformedPolicy) as exc:
        parse_policy(text, "bkt", _known)
    assert reason in exc.value.message
    assert exc.value.code == "MalformedPolicy" and exc.value.status == 400


def test_size_limit_counts_the_compact_document():
    padding = " " * (MAX_POLICY_BYTES + 10)  # whitespace outside strings does not count
    parse_policy(_doc(_st()) + padding, "bkt", _known)
    big = _st(Resource=[f"arn:aws:s3:::bkt/{i:05d}/*" for i in range(1000)])
    with pytest.raises(MalformedPolicy, match="exceeds the maximum allowed document size"):
        parse_policy(_doc(big), "bkt", _known)


def test_one_statement_and_wildcards_parse():
    text = json.dumps({"Statement": {"Effect": "Deny", "Principal": "*", "Action": ["s3:Get*", "s3:*"],
                                     "Resource": ["arn:aws:s3:::bkt", "arn:aws:s3:::bkt/*"]}})
    policy = parse_policy(text, "bkt", _known)
    assert len(policy.statements) == 1 and policy.statements[0].deny


# -- evaluation ----------------------------------------------------------------------

def test_no_policy_means_owner_only():
    assert evaluate(None, _req(), is_owner=True)
    assert not evaluate(None, _req(), is_owner=False)


def test_allow_grants_the_named_tenant_only():
    policy = _parse(_st())
    assert evaluate(policy, _req(), is_owner=False)
    assert not evaluate(policy, _req(tenant="carol"), is_owner=False)
    assert not evaluate(policy, _req(tenant=None), is_owner=False)
    assert not evaluate(policy, _req(action="s3:PutObject"), is_owner=False)
    assert evaluate(policy, _req(action="s3:PutObject", tenant="alice"), is_owner=True)


def test_action_wildcards_and_case():
    policy = _parse(_st(Action="s3:get*"))
    assert evaluate(policy, _req(action="s3:GetObject"), is_owner=False)
    assert evaluate(policy, _req(action="s3:GetObjectTagging"), is_owner=False)
    assert not evaluate(policy, _req(action="s3:PutObject"), is_owner=False)


def test_resource_prefix_wildcard():
    policy = _parse(_st(Resource="arn:aws:s3:::bkt/public/*"))
    assert evaluate(policy, _req(key="public/a/b.txt"), is_owner=False)
    assert not evaluate(policy, _req(key="private/x"), is_owner=False)
    assert not evaluate(policy, _req(key="publicity"), is_owner=False)


def test_explicit_deny_wins_even_against_the_owner():
    policy = _parse(_st(Principal="*", Action="s3:*", Resource="arn:aws:s3:::bkt/*"),
                    _st(Effect="Deny", Principal="*", Action="s3:DeleteObject", Resource="arn:aws:s3:::bkt/keep/*"))
    assert not evaluate(policy, _req(action="s3:DeleteObject", key="keep/x", tenant="alice"), is_owner=True)
    assert evaluate(policy, _req(action="s3:DeleteObject", key="other", tenant="alice"), is_owner=True)
    assert not evaluate(policy, _req(action="s3:DeleteObject", key="keep/x"), is_owner=False)
    assert evaluate(policy, _req(action="s3:DeleteObject", key="other"), is_owner=False)


def test_principals_by_key_and_by_star():
    policy = _parse(_st(Principal={"AWS": ["GFBOBKEY"]}))
    assert evaluate(policy, _req(access_key="GFBOBKEY"), is_owner=False)
    assert not evaluate(policy, _req(access_key="GFOTHER"), is_owner=False)  # bob, but another key
    anyone = _parse(_st(Principal={"AWS": "*"}))
    assert evaluate(anyone, _req(tenant=None), is_owner=False)
    root = _parse(_st(Principal={"AWS": "arn:aws:iam::bob:root"}))
    assert evaluate(root, _req(), is_owner=False)


def test_not_principal_not_action_not_resource():
    policy = _parse({"Effect": "Deny", "NotPrincipal": {"AWS": "alice"}, "Action": "s3:*",
                     "Resource": "arn:aws:s3:::bkt/*"})
    assert evaluate(policy, _req(tenant="alice"), is_owner=True)
    assert not evaluate(policy, _req(tenant="bob"), is_owner=True)
    na = _parse({"Effect": "Allow", "Principal": "*", "NotAction": "s3:DeleteObject",
                 "Resource": "arn:aws:s3:::bkt/*"})
    assert evaluate(na, _req(), is_owner=False)
    assert not evaluate(na, _req(action="s3:DeleteObject"), is_owner=False)
    nr = _parse({"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "NotResource": "arn:aws:s3:::bkt/x/*"})
    assert evaluate(nr, _req(key="y"), is_owner=False)
    assert not evaluate(nr, _req(key="x/1"), is_owner=False)
    with pytest.raises(MalformedPolicy, match="both Principal and NotPrincipal"):
        _parse(_st(NotPrincipal="*"))


def test_ip_conditions():
    ok = _parse(_st(Condition={"IpAddress": {"aws:SourceIp": "127.0.0.1/32"}}))
    assert evaluate(ok, _req(source_ip="127.0.0.1"), is_owner=False)
    assert not evaluate(ok, _req(source_ip="127.0.0.2"), is_owner=False)
    assert not evaluate(ok, _req(source_ip=None), is_owner=False)  # missing key fails a positive operator
    far = _parse(_st(Condition={"IpAddress": {"aws:SourceIp": ["10.0.0.0/8", "::1/128"]}}))
    assert not evaluate(far, _req(source_ip="127.0.0.1"), is_owner=False)
    assert evaluate(far, _req(source_ip="10.9.8.7"), is_owner=False)
    assert evaluate(far, _req(source_ip="::1"), is_owner=False)
    deny = _parse(_st(Principal="*", Action="s3:*"),
                  _st(Effect="Deny", Principal="*", Action="s3:*",
                      Condition={"NotIpAddress": {"aws:SourceIp": "10.0.0.0/8"}}))
    assert not evaluate(deny, _req(source_ip="127.0.0.1"), is_owner=True)
    assert evaluate(deny, _req(source_ip="10.1.1.1"), is_owner=True)


def test_prefix_and_tenant_conditions():
    listing = {"Effect": "Allow", "Principal": {"AWS": "bob"}, "Action": "s3:ListBucket",
               "Resource": "arn:aws:s3:::bkt"}
    eq = _parse(listing | {"Condition": {"StringEquals": {"s3:prefix": ["", "home/"]}}})
    assert evaluate(eq, _req("s3:ListBucket", None, prefix=""), is_owner=False)
    assert evaluate(eq, _req("s3:ListBucket", None, prefix="home/"), is_owner=False)
    assert not evaluate(eq, _req("s3:ListBucket", None, prefix="home/x"), is_owner=False)
    like = _parse(listing | {"Condition": {"StringLike": {"s3:prefix": "shared/*"}}})
    assert evaluate(like, _req("s3:ListBucket", None, prefix="shared/2024/"), is_owner=False)
    assert not evaluate(like, _req("s3:ListBucket", None, prefix="private/"), is_owner=False)
    not_like = _parse(listing | {"Condition": {"StringNotLike": {"s3:prefix": "private/*"}}})
    assert evaluate(not_like, _req("s3:ListBucket", None, prefix="shared/"), is_owner=False)
    assert not evaluate(not_like, _req("s3:ListBucket", None, prefix="private/a"), is_owner=False)
    who = _parse(_st(Principal="*", Condition={"StringEquals": {"aws:PrincipalAccount": "bob"}}))
    assert evaluate(who, _req(), is_owner=False)
    assert not evaluate(who, _req(tenant="carol"), is_owner=False)
    assert not evaluate(who, _req(tenant=None), is_owner=False)


# -- Engine.authorize ----------------------------------------------------------------

@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "d", fsync=False)
    e.create_tenant("alice")
    e.create_tenant("bob")
    e.create_bucket("bkt", owner="alice")
    yield e
    e.close()


def test_engine_put_get_delete_and_cache(eng):
    eng.authorize("alice", "s3:GetObject", "bkt", "k")
    with pytest.raises(AccessDenied):
        eng.authorize("bob", "s3:GetObject", "bkt", "k")
    text = _doc(_st())
    eng.put_bucket_policy("bkt", text)
    assert eng.get_bucket_policy("bkt") == text
    eng.authorize("bob", "s3:GetObject", "bkt", "k")  # the cache saw the new policy
    with pytest.raises(AccessDenied):
        eng.authorize("bob", "s3:PutObject", "bkt", "k")
    assert eng.delete_bucket_policy("bkt") is True
    assert eng.delete_bucket_policy("bkt") is False
    with pytest.raises(AccessDenied):
        eng.authorize("bob", "s3:GetObject", "bkt", "k")


def test_engine_refuses_bad_policies_and_keeps_the_old_one(eng):
    text = _doc(_st())
    eng.put_bucket_policy("bkt", text)
    for bad in ("[]", _doc(_st(Principal={"AWS": "mallory"})), _doc(_st(Resource="arn:aws:s3:::c/*"))):
        with pytest.raises(MalformedPolicy):
            eng.put_bucket_policy("bkt", bad)
    assert eng.get_bucket_policy("bkt") == text
    with pytest.raises(NoSuchBucket):
        eng.put_bucket_policy("nope", text)


def test_engine_principal_by_key_and_revocation(eng):
    info, _ = eng.create_access_key("bob")
    eng.put_bucket_policy("bkt", _doc(_st(Principal={"AWS": info.access_key})))
    eng.authorize("bob", "s3:GetObject", "bkt", "k", access_key=info.access_key)
    with pytest.raises(AccessDenied):
        eng.authorize("bob", "s3:GetObject", "bkt", "k", access_key="GFSOMEOTHERKEY000000")
    eng.revoke_access_key(info.access_key)
    with pytest.raises(MalformedPolicy, match="Invalid principal"):
        eng.put_bucket_policy("bkt", _doc(_st(Principal={"AWS": info.access_key})))


def test_engine_policy_ops_are_the_owners_even_when_denied(eng):
    eng.put_bucket_policy("bkt", _doc(_st(Effect="Deny", Principal="*", Action="s3:*",
                                        Resource=["arn:aws:s3:::bkt", "arn:aws:s3:::bkt/*"])))
    with pytest.raises(AccessDenied):
        eng.authorize("alice", "s3:GetObject", "bkt", "k")
    for action in ("s3:GetBucketPolicy", "s3:PutBucketPolicy", "s3:DeleteBucketPolicy"):
        eng.authorize("alice", action, "bkt")
        with pytest.raises(AccessDenied):
            eng.authorize("bob", action, "bkt")


def test_engine_forgets_a_policy_with_its_bucket(eng):
    eng.put_bucket_policy("bkt", _doc(_st()))
    eng.authorize("bob", "s3:GetObject", "bkt", "k")
    eng.delete_bucket("bkt")
    eng.create_bucket("bkt", owner="alice")
    assert eng.get_bucket_policy("bkt") is None
    with pytest.raises(AccessDenied):
        eng.authorize("bob", "s3:GetObject", "bkt", "k")
