"""POST Object: browser form uploads under a signed policy document.

Source: "Authenticating Requests in Browser-Based Uploads Using POST (AWS
Signature Version 4)" and "Creating a POST Policy", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-HTTPPOSTConstructPolicy.html
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
import uuid
import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@pytest.fixture(scope="module")
def v4(s3_node):
    c = s3_node.client(signature_version="s3v4")
    yield c
    c.close()


def _post(url: str, fields: dict, file: bytes, filename: str = "hello.txt") -> tuple[int, dict, bytes]:
    boundary = uuid.uuid4().hex
    body = b""
    for name, value in fields.items():
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").encode()
    body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
             "Content-Type: application/octet-stream\r\n\r\n").encode() + file + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


def _signed(s3_node, policy: dict | str) -> dict:
    """Form fields of ``policy`` signed with the node's credentials (as a browser app would)."""
    date = time.strftime("%Y%m%d", time.gmtime())
    cred = f"{s3_node.access_key}/{date}/us-east-1/s3/aws4_request"
    raw = policy if isinstance(policy, str) else json.dumps(policy)
    policy_b64 = base64.b64encode(raw.encode()).decode()

    def h(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    key = h(h(h(h(f"AWS4{s3_node.secret_key}".encode(), date), "us-east-1"), "s3"), "aws4_request")
    return {"x-amz-algorithm": "AWS4-HMAC-SHA256", "x-amz-credential": cred,
            "x-amz-date": f"{date}T000000Z", "policy": policy_b64,
            "x-amz-signature": hmac.new(key, policy_b64.encode(), hashlib.sha256).hexdigest()}


def test_post_with_filename_and_201(s3_node, v4, bkt, code_of):
    post = v4.generate_presigned_post(
        bkt, "uploads/${filename}",
        Fields={"success_action_status": "201", "Content-Type": "text/plain", "x-amz-meta-who": "form"},
        Conditions=[["starts-with", "$key", "uploads/"], {"success_action_status": "201"},
                    ["starts-with", "$Content-Type", "text/"], {"x-amz-meta-who": "form"},
                    ["content-length-range", 1, 100]],
        ExpiresIn=300)
    status, headers, body = _post(post["url"], post["fields"], b"hello form")
    assert status == 201, body
    doc = ET.fromstring(body)
    assert doc.findtext(f"{NS}Key") == "uploads/hello.txt" and doc.findtext(f"{NS}Bucket") == bkt
    got = v4.get_object(Bucket=bkt, Key="uploads/hello.txt")
    assert got["Body"].read() == b"hello form"
    assert got["ContentType"] == "text/plain" and got["Metadata"] == {"who": "form"}
    assert headers["ETag"] == got["ETag"]


def test_post_default_status_is_204(v4, bkt):
    post = v4.generate_presigned_post(bkt, "plain-post", ExpiresIn=60)
    status, _, _ = _post(post["url"], post["fields"], b"x")
    assert status == 204
    assert v4.get_object(Bucket=bkt, Key="plain-post")["Body"].read() == b"x"


@pytest.mark.parametrize(("change", "status", "code"), [
    ({"key": "elsewhere/k"}, 403, "AccessDenied"),                 # starts-with $key fails
    ({"x-amz-signature": "0" * 64}, 403, "SignatureDoesNotMatch"),
    ({"extra-field": "1"}, 403, "AccessDenied"),                   # a field no condition names
    ({"x-amz-credential": "nobody/20200101/us-east-1/s3/aws4_request"}, 403, "InvalidAccessKeyId"),
])
def test_post_refusals(v4, bkt, code_of, change, status, code):
    post = v4.generate_presigned_post(bkt, "ok/${filename}", Conditions=[["starts-with", "$key", "ok/"]],
                                      ExpiresIn=60)
    key = f"refused-{uuid.uuid4().hex[:6]}"
    got_status, _, body = _post(post["url"], post["fields"] | change, b"data", filename=key)
    assert (got_status, code_of(body)) == (status, code)
    with pytest.raises(ClientError):
        v4.head_object(Bucket=bkt, Key=f"ok/{key}")  # nothing was stored


def test_post_size_range_and_expiry(s3_node, v4, bkt, code_of):
    post = v4.generate_presigned_post(bkt, "sized", Conditions=[["content-length-range", 5, 10]], ExpiresIn=60)
    for data, code in ((b"1234", "EntityTooSmall"), (b"12345678901", "EntityTooLarge")):
        status, _, body = _post(post["url"], post["fields"], data)
        assert (status, code_of(body)) == (400, code)
    with pytest.raises(ClientError):
        v4.head_object(Bucket=bkt, Key="sized")
    expired = {"expiration": "2020-01-01T00:00:00Z", "conditions": [{"bucket": bkt}, {"key": "old"},
               {"x-amz-algorithm": "AWS4-HMAC-SHA256"}, ["starts-with", "$x-amz-credential", ""],
               ["starts-with", "$x-amz-date", ""]]}
    status, _, body = _post(post["url"], {"key": "old"} | _signed(s3_node, expired), b"x")
    assert (status, code_of(body)) == (403, "AccessDenied") and b"expired" in body


@pytest.mark.parametrize("policy", ["not json", json.dumps({"conditions": []}),
                                    json.dumps({"expiration": "2099-01-01T00:00:00Z", "conditions": [["nope"]]})])
def test_post_malformed_policy_is_invalid_policy_document(s3_node, bkt, code_of, policy):
    url = f"{s3_node.s3_url}/{bkt}"
    status, _, body = _post(url, {"key": "bad-policy"} | _signed(s3_node, policy), b"x")
    assert (status, code_of(body)) == (400, "InvalidPolicyDocument")


def test_post_without_a_file_or_signature(s3_node, bkt, code_of):
    url = f"{s3_node.s3_url}/{bkt}"
    status, _, body = _post(url, {"key": "anon"}, b"x")
    assert (status, code_of(body)) == (403, "AccessDenied")
    req = urllib.request.Request(url, data=b"key=v", method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=30)
    assert ei.value.code == 403  # not a form POST: the ordinary signature rules apply
    ei.value.close()


def test_post_into_versioned_bucket_names_the_version(s3_node, v4):
    """Source: "POST Object" (x-amz-version-id in versioned buckets), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/RESTObjectPOST.html"""
    name = f"pv-{uuid.uuid4().hex[:8]}"
    s3_node.engine.create_bucket(name)
    s3_node.engine.put_bucket_versioning(name, "Enabled")
    post = v4.generate_presigned_post(name, "versioned", ExpiresIn=60)
    status, headers, _ = _post(post["url"], post["fields"], b"x")
    assert status == 204
    assert v4.head_object(Bucket=name, Key="versioned")["VersionId"] == headers["x-amz-version-id"]
