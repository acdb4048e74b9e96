"""Bucket CORS: Put/Get/DeleteBucketCors through boto3, preflight ``OPTIONS``
requests sent raw and unsigned as a browser sends them, and the CORS headers of
actual (signed) requests. Each test names the AWS page it follows."""

from __future__ import annotations

import base64
import hashlib
import uuid
import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError

NOT_ALLOWED = ("CORSResponse: This CORS request is not allowed. This is usually because the evalution of "
               "Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers "
               "are not whitelisted by the resource's CORS spec.")
VARY = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"
SITE = "https://app.example.com"
RULES = [
    {"ID": "site", "AllowedOrigins": [SITE, "http://*.example.org"], "AllowedMethods": ["GET", "PUT"],
     "AllowedHeaders": ["Content-Type", "x-amz-*"], "ExposeHeaders": ["ETag", "x-amz-version-id"],
     "MaxAgeSeconds": 600},
    {"AllowedOrigins": ["*"], "AllowedMethods": ["HEAD"]},
]


def _err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


@pytest.fixture
def cbkt(s3c):
    """A fresh bucket of the in-process endpoint with :data:`RULES` set."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    s3c.create_bucket(Bucket=name)
    s3c.put_bucket_cors(Bucket=name, CORSConfiguration={"CORSRules": RULES})
    s3c.put_object(Bucket=name, Key="k", Body=b"hello")
    return name


def preflight(raw, path: str, origin: str | None = SITE, method: str | None = "GET",
              request_headers: str | None = None, **extra: str):
    """An unsigned OPTIONS request, as a browser sends it."""
    headers = {"Host": f"127.0.0.1:{raw.port}", **extra}
    if origin is not None:
        headers["Origin"] = origin
    if method is not None:
        headers["Access-Control-Request-Method"] = method
    if request_headers is not None:
        headers["Access-Control-Request-Headers"] = request_headers
    return raw.request("OPTIONS", path, headers=headers, sign=False)


def cors_headers(resp) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower().startswith("access-control-") or k == "Vary"}


# Put / Get / Delete -------------------------------------------------------------------
def test_put_get_delete_round_trip(s3c, bkt):
    """Source: "PutBucketCors", "GetBucketCors" (only the members set come back,
    in the order sent) and "DeleteBucketCors" (204), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketCors.html"""
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_cors(Bucket=bkt)
    assert _err(ei.value) == (404, "NoSuchCORSConfiguration")
    r = s3c.put_bucket_cors(Bucket=bkt, CORSConfiguration={"CORSRules": RULES})
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3c.get_bucket_cors(Bucket=bkt)["CORSRules"] == RULES
    replaced = [{"AllowedOrigins": [""], "AllowedMethods": ["DELETE", "POST"]}]
    s3c.put_bucket_cors(Bucket=bkt, CORSConfiguration={"CORSRules": replaced})
    assert s3c.get_bucket_cors(Bucket=bkt)["CORSRules"] == replaced
    assert s3c.delete_bucket_cors(Bucket=bkt)["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_cors(Bucket=bkt)
    assert _err(ei.value) == (404, "NoSuchCORSConfiguration")
    assert s3c.delete_bucket_cors(Bucket=bkt)["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_get_cors_answers_s3s_document(raw, cbkt):
    """Source: "GetBucketCors" (Response Syntax: CORSConfiguration of CORSRule),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketCors.html"""
    r = raw.request("GET", f"/{cbkt}?cors")
    assert r.status == 200 and r.headers["Content-Type"].startswith("application/xml")
    root = ET.fromstring(r.body)
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    assert root.tag == f"{ns}CORSConfiguration"
    first = root.find(f"{ns}CORSRule")
    assert [e.text for e in first.findall(f"{ns}AllowedOrigin")] == [SITE, "http://*.example.org"]
    assert first.findtext(f"{ns}MaxAgeSeconds") == "600"


def test_cors_of_a_missing_bucket(s3c):
    """Source: "PutBucketCors" / "GetBucketCors" and "Error responses" (NoSuchBucket),
    Amazon S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html"""
    name = f"none-{uuid.uuid4().hex[:8]}"
    for call, kw in (("put_bucket_cors", {"CORSConfiguration": {"CORSRules": RULES}}),
                     ("get_bucket_cors", {}), ("delete_bucket_cors", {})):
        with pytest.raises(ClientError) as ei:
            getattr(s3c, call)(Bucket=name, **kw)
        assert _err(ei.value) == (404, "NoSuchBucket")


_CASES = [
    ([{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}], "InvalidRequest",
     "Found unsupported HTTP method in CORS config. Unsupported method is PATCH"),
    ([{"AllowedOrigins": ["*"], "AllowedMethods": ["get"]}], "InvalidRequest",
     "Found unsupported HTTP method in CORS config. Unsupported method is get"),
    ([{"AllowedOrigins": ["*"], "AllowedMethods": ["OPTIONS"]}], "InvalidRequest",
     "Found unsupported HTTP method in CORS config. Unsupported method is OPTIONS"),
    ([{"AllowedOrigins": ["http://*.*.example.com"], "AllowedMethods": ["GET"]}], "InvalidRequest",
     'AllowedOrigin "http://*.*.example.com" can not have more than one wildcard.'),
    ([{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"], "AllowedHeaders": ["x-*-*"]}], "InvalidRequest",
     'AllowedHeader "x-*-*" can not have more than one wildcard.'),
    ([{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"], "ExposeHeaders": ["*"]}], "InvalidRequest",
     'ExposeHeader "*" contains wildcard.'),
    ([], "MalformedXML", "not well-formed"),
    ([{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}] * 101, "MalformedXML", "1 to 100"),
    ([{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"], "MaxAgeSeconds": -1}], "MalformedXML", "negative"),
    ([{"ID": "x" * 256, "AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}], "InvalidArgument", "255"),
]


@pytest.mark.parametrize(("rules", "code", "message"), _CASES)
def test_bad_configurations_are_refused_and_change_nothing(s3c, cbkt, rules, code, message):
    """Source: "PutBucketCors" and "CORSRule" (methods GET, PUT, HEAD, POST, DELETE;
    up to 100 rules; at most one ``*`` in an AllowedOrigin or AllowedHeader; ID at
    most 255 characters), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_CORSRule.html"""
    with pytest.raises(ClientError) as ei:
        s3c.put_bucket_cors(Bucket=cbkt, CORSConfiguration={"CORSRules": rules})
    assert _err(ei.value) == (400, code)
    assert message in ei.value.response["Error"]["Message"]
    assert s3c.get_bucket_cors(Bucket=cbkt)["CORSRules"] == RULES


@pytest.mark.parametrize("body", [
    b"<CORSConfiguration><CORSRule><AllowedMethod>GET</AllowedMethod></CORSRule></CORSConfiguration>",
    b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin></CORSRule></CORSConfiguration>",
    b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
    b"<MaxAgeSeconds>1</MaxAgeSeconds><MaxAgeSeconds>2</MaxAgeSeconds></CORSRule></CORSConfiguration>",
    b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
    b"<MaxAgeSeconds>soon</MaxAgeSeconds></CORSRule></CORSConfiguration>",
    b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
    b"<Colour>red</Colour></CORSRule></CORSConfiguration>",
    b"<CORSConfiguration><Rule/></CORSConfiguration>",
    b"<Tagging/>",
    b"<CORSConfiguration><CORSRule>",
])
def test_malformed_documents(s3c, raw, cbkt, code_of, body):
    """Source: "PutBucketCors" (each CORSRule identifies at least one origin and one
    method; at most one MaxAgeSeconds) and "Error responses" (MalformedXML), Amazon
    S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketCors.html"""
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    r = raw.request("PUT", f"/{cbkt}?cors", body=body, headers={"Content-MD5": md5})
    assert (r.status, code_of(r.body)) == (400, "MalformedXML")
    assert s3c.get_bucket_cors(Bucket=cbkt)["CORSRules"] == RULES


def test_a_document_over_64_kib_is_refused(s3c, raw, cbkt, code_of):
    """Source: "PutBucketCors" ("The document is limited to 64 KB in size"), Amazon
    S3 API Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketCors.html"""
    rule = (b"<CORSRule><AllowedOrigin>https://" + b"a" * 700 + b".example</AllowedOrigin>"
            b"<AllowedMethod>GET</AllowedMethod></CORSRule>")
    body = b"<CORSConfiguration>" + rule * 95 + b"</CORSConfiguration>"
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    r = raw.request("PUT", f"/{cbkt}?cors", body=body, headers={"Content-MD5": md5})
    assert (r.status, code_of(r.body)) == (400, "MaxMessageLengthExceeded")
    assert s3c.get_bucket_cors(Bucket=cbkt)["CORSRules"] == RULES


def test_put_needs_content_md5_or_a_checksum(s3c, raw, cbkt, code_of):
    """Source: "PutBucketCors" (Content-MD5 "must be used as a message integrity
    check"; SDKs may send an x-amz-checksum-* header instead), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketCors.html"""
    body = (b'<CORSConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><CORSRule>'
            b"<AllowedOrigin>https://x.test</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
            b"</CORSRule></CORSConfiguration>")
    r = raw.request("PUT", f"/{cbkt}?cors", body=body)
    assert (r.status, code_of(r.body)) == (400, "InvalidRequest")
    assert b"Missing required header for this request: Content-MD5" in r.body
    r = raw.request("PUT", f"/{cbkt}?cors", body=body, headers={"Content-MD5": "1B2M2Y8AsgTpgAmY7PhCfg=="})
    assert (r.status, code_of(r.body)) == (400, "BadDigest")
    assert s3c.get_bucket_cors(Bucket=cbkt)["CORSRules"] == RULES
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    assert raw.request("PUT", f"/{cbkt}?cors", body=body, headers={"Content-MD5": md5}).status == 200
    assert s3c.get_bucket_cors(Bucket=cbkt)["CORSRules"] == [
        {"AllowedOrigins": ["https://x.test"], "AllowedMethods": ["GET"]}]


def test_cors_goes_with_its_bucket(s3c):
    """Source: "DeleteBucket" (a bucket's subresources go with it), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteBucket.html"""
    name = f"c-{uuid.uuid4().hex[:12]}"
    s3c.create_bucket(Bucket=name)
    s3c.put_bucket_cors(Bucket=name, CORSConfiguration={"CORSRules": RULES})
    s3c.delete_bucket(Bucket=name)
    s3c.create_bucket(Bucket=name)
    with pytest.raises(ClientError) as ei:
        s3c.get_bucket_cors(Bucket=name)
    assert _err(ei.value) == (404, "NoSuchCORSConfiguration")


def _error(body: bytes) -> dict[str, str | None]:
    root = ET.fromstring(body)
    return {name: root.findtext(name) for name in ("Code", "Message", "Method", "ResourceType")}


SITE_ANSWER = {
    "Access-Control-Allow-Origin": SITE,
    "Access-Control-Allow-Methods": "GET, PUT",
    "Access-Control-Expose-Headers": "ETag, x-amz-version-id",
    "Access-Control-Max-Age": "600",
    "Access-Control-Allow-Credentials": "true",
    "Vary": VARY,
}


# preflight ---------------------------------------------------------------------------
def test_preflight_answered_by_the_first_matching_rule(raw, cbkt):
    """Source: "Appendix: OPTIONS object" (the Access-Control-* response headers) and
    "PutBucketCors" (the first CORSRule that matches is used), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/RESTOPTIONSobject.html; the
    preflight sample of "Testing CORS", Amazon S3 User Guide."""
    r = preflight(raw, f"/{cbkt}/k")
    assert r.status == 200 and r.body == b""
    assert cors_headers(r) == SITE_ANSWER
    # requested headers come back lowercase, in the order asked, when every one is allowed
    r = preflight(raw, f"/{cbkt}/k", method="PUT", request_headers="Content-Type,X-Amz-Meta-Colour")
    assert r.status == 200
    assert r.headers["Access-Control-Allow-Headers"] == "content-type, x-amz-meta-colour"
    # one wildcard in an origin pattern matches any run of characters; scheme and port count
    r = preflight(raw, f"/{cbkt}", origin="http://shop.eu.example.org")
    assert r.headers["Access-Control-Allow-Origin"] == "http://shop.eu.example.org"
    # the second rule: any origin, HEAD only, answered with "*" and no credentials
    r = preflight(raw, f"/{cbkt}/k", origin="https://elsewhere.test", method="HEAD")
    assert r.status == 200
    assert cors_headers(r) == {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "HEAD",
                               "Vary": VARY}


@pytest.mark.parametrize(("origin", "method", "request_headers", "resource_type"), [
    ("https://elsewhere.test", "GET", None, "OBJECT"),      # origin matches no GET rule
    ("https://app.example.com:443", "GET", None, "OBJECT"),  # the port is part of the origin
    ("https://shop.example.org", "GET", None, "OBJECT"),     # scheme differs from the pattern
    (SITE + "/", "GET", None, "OBJECT"),                     # a trailing slash is another origin
    (SITE, "DELETE", None, "OBJECT"),                        # method not allowed
    (SITE, "GET", "content-type, authorization", "OBJECT"),  # one requested header not allowed
    (SITE, None, None, "OBJECT"),                            # no Access-Control-Request-Method
    ("https://elsewhere.test", "GET", None, "BUCKET"),
])
def test_preflight_no_rule_matches_is_403(raw, cbkt, origin, method, request_headers, resource_type):
    """Source: "Troubleshooting CORS" (403 "This CORS request is not allowed"),
    Amazon S3 User Guide, https://docs.aws.amazon.com/AmazonS3/latest/userguide/cors-troubleshooting.html;
    the error document as S3 sends it (code AccessForbidden, Method, ResourceType)."""
    path = f"/{cbkt}/k" if resource_type == "OBJECT" else f"/{cbkt}"
    r = preflight(raw, path, origin=origin, method=method, request_headers=request_headers)
    assert r.status == 403
    assert _error(r.body) == {"Code": "AccessForbidden", "Message": NOT_ALLOWED,
                              "Method": method or "OPTIONS", "ResourceType": resource_type}
    assert cors_headers(r) == {}


def test_preflight_without_configuration_origin_or_bucket(s3c, raw, bkt):
    """Source: "Appendix: OPTIONS object" ("If cors is not enabled on the bucket, then
    Amazon S3 returns a 403 Forbidden response"; Origin is required), Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/RESTOPTIONSobject.html"""
    r = preflight(raw, f"/{bkt}/k", method="PUT")
    assert r.status == 403
    assert _error(r.body) == {"Code": "AccessForbidden",
                              "Message": "CORSResponse: CORS is not enabled for this bucket.",
                              "Method": "PUT", "ResourceType": "BUCKET"}
    r = preflight(raw, f"/{bkt}/k", origin=None, method=None)
    assert (r.status, _error(r.body)["Code"]) == (400, "BadRequest")
    assert _error(r.body)["Message"] == "Insufficient information. Origin request header needed."
    for path in (f"/none-{uuid.uuid4().hex[:8]}/k", "/"):
        r = preflight(raw, path)
        assert r.status == 403
        assert _error(r.body)["Message"] == "CORSResponse: Bucket not found"


def test_preflight_needs_no_signature_and_touches_no_data(s3c, raw, cbkt):
    """Source: "Appendix: OPTIONS object" (a browser sends the preflight; it carries
    no credentials), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/RESTOPTIONSobject.html; WHATWG
    Fetch, "CORS-preflight request" (credentials mode "same-origin")."""
    # a garbage Authorization header and query are ignored, not checked
    r = preflight(raw, f"/{cbkt}/k?uploads&X-Amz-Signature=bad", Authorization="AWS4-HMAC-SHA256 nonsense")
    assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == SITE
    # what would delete, create or write does nothing as OPTIONS
    for path in (f"/{cbkt}/k", f"/{cbkt}/new?uploads", f"/{cbkt}?delete", f"/{cbkt}?cors", f"/{cbkt}/new"):
        preflight(raw, path, method="PUT")
        preflight(raw, path, method="DELETE")
    assert [o["Key"] for o in s3c.list_objects_v2(Bucket=cbkt)["Contents"]] == ["k"]
    assert s3c.get_object(Bucket=cbkt, Key="k")["Body"].read() == b"hello"
    assert s3c.list_multipart_uploads(Bucket=cbkt).get("Uploads", []) == []
    assert s3c.get_bucket_cors(Bucket=cbkt)["CORSRules"] == RULES
    # the same request signed and with another method still needs its signature
    r = raw.request("DELETE", f"/{cbkt}/k", headers={"Host": f"127.0.0.1:{raw.port}", "Origin": SITE},
                    sign=False)
    assert r.status == 403
    assert s3c.head_object(Bucket=cbkt, Key="k")["ContentLength"] == 5


# actual requests ---------------------------------------------------------------------
def test_actual_requests_from_an_allowed_origin_get_the_headers(raw, cbkt):
    """Source: "PutBucketCors" (the rules are evaluated for a cross-origin request,
    not only for a preflight), Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketCors.html"""
    r = raw.request("GET", f"/{cbkt}/k", headers={"Origin": SITE})
    assert (r.status, r.body) == (200, b"hello")
    assert cors_headers(r) == SITE_ANSWER
    # errors too: a missing key, and a request refused before any handler ran
    r = raw.request("GET", f"/{cbkt}/missing", headers={"Origin": SITE})
    assert r.status == 404 and cors_headers(r) == SITE_ANSWER
    r = raw.request("GET", f"/{cbkt}/k", headers={"Origin": SITE, "Host": f"127.0.0.1:{raw.port}"}, sign=False)
    assert r.status == 403 and cors_headers(r) == SITE_ANSWER
    # HEAD matches the second rule ("*")
    r = raw.request("HEAD", f"/{cbkt}/k", headers={"Origin": "https://elsewhere.test"})
    assert r.status == 200
    assert cors_headers(r) == {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "HEAD",
                               "Vary": VARY}


def test_actual_requests_no_rule_allows_are_served_without_headers(raw, cbkt, bkt):
    """Source: "Using cross-origin resource sharing (CORS)" (S3 answers CORS headers
    only for an allowed origin and method; the browser enforces them), Amazon S3 User
    Guide, https://docs.aws.amazon.com/AmazonS3/latest/userguide/cors.html"""
    for origin, method, path in (("https://elsewhere.test", "GET", f"/{cbkt}/k"),
                                 (SITE, "DELETE", f"/{cbkt}/gone"),
                                 (SITE, "GET", f"/{bkt}/nothing"),      # no configuration
                                 (SITE, "GET", f"/none-{uuid.uuid4().hex[:8]}/k")):
        r = raw.request(method, path, headers={"Origin": origin})
        assert r.status in (200, 204, 404)
        assert cors_headers(r) == {}
    # the method named by Access-Control-Request-Method decides on an actual request too
    r = raw.request("GET", f"/{cbkt}/k", headers={"Origin": SITE, "Access-Control-Request-Method": "DELETE"})
    assert r.status == 200 and cors_headers(r) == {}
    # without Origin, never any CORS header
    r = raw.request("GET", f"/{cbkt}/k")
    assert r.status == 200 and cors_headers(r) == {}


# the served node and the signature check -----------------------------------------------
def test_cors_on_a_served_node(node, s3, bucket):
    """Source: "PutBucketCors" and "Appendix: OPTIONS object", Amazon S3 API Reference,
    https://docs.aws.amazon.com/AmazonS3/latest/API/RESTOPTIONSobject.html: a browser's
    preflight and a cross-origin read against ``gpufeed serve``, with urllib."""
    import urllib.error
    import urllib.request

    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": RULES})
    s3.put_object(Bucket=bucket, Key="k", Body=b"hello")
    req = urllib.request.Request(f"{node.s3_url}/{bucket}/k", method="OPTIONS", headers={
        "Origin": SITE, "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "content-type"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == SITE
        assert resp.headers["Access-Control-Allow-Headers"] == "content-type"
    req = urllib.request.Request(f"{node.s3_url}/{bucket}/k", method="OPTIONS", headers={
        "Origin": "https://elsewhere.test", "Access-Control-Request-Method": "PUT"})
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=30)
    assert ei.value.code == 403 and b"<Code>AccessForbidden</Code>" in ei.value.read()
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Origin": SITE}), timeout=30) as resp:
        assert resp.read() == b"hello"
        assert resp.headers["Access-Control-Allow-Origin"] == SITE
        assert resp.headers["Access-Control-Expose-Headers"] == "ETag, x-amz-version-id"


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH"])
def test_only_options_passes_unsigned(method):
    """Source: "Authenticating Requests (AWS Signature Version 4)", Amazon S3 API
    Reference, https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-authenticating-requests.html:
    every request but a CORS preflight is signed."""
    from multidict import CIMultiDict

    from gpufeed.errors import AccessDenied
    from gpufeed.s3._auth import verify_request

    headers = CIMultiDict({"Host": "127.0.0.1:1", "Origin": SITE, "Access-Control-Request-Method": "GET"})
    args = {"raw_path": "/b/k", "raw_query": "", "headers": headers, "credentials": {"a": "s"}}
    assert verify_request(method="OPTIONS", **args).deferred
    with pytest.raises(AccessDenied):
        verify_request(method=method, **args)
