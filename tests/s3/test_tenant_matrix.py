"""Tenant isolation, generated: every S3 operation the front routes, sent against
tenant A's bucket and objects by tenant B, by an anonymous caller, by a revoked
key and by a wrong secret. Every case must be refused (403, or 409
BucketAlreadyExists for CreateBucket), with none of A's other names, its
tenant name or its data anywhere in the answer, and A's state unchanged.

The table below names one request per endpoint class; a test fails when the
router gains an endpoint the table lacks, so new calls join the matrix.

S3 answers followed: "Error responses" (AccessDenied, InvalidAccessKeyId,
SignatureDoesNotMatch) and "CreateBucket" (BucketAlreadyExists),
https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html
"""

from __future__ import annotations

import http.client
import urllib.parse

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gpufeed.admin import RemoteAdmin
from gpufeed.s3._app import HANDLERS
from gpufeed.testing.node import start_node

BUCKET = "matrix-target"
KEY = "plan.txt"
HIDDEN = "hidden/never-named-by-b.bin"
DATA = b"ALICE-DATA-0123456789"
_LC = (b'<LifecycleConfiguration><Rule><ID>r</ID><Filter><Prefix></Prefix></Filter><Status>Enabled</Status>'
       b'<Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>')
_TAGS = b"<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>"
_CORS = (b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
         b"</CORSRule></CORSConfiguration>")
_POLICY = (b'{"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:*", '
           b'"Resource": ["arn:aws:s3:::matrix-target", "arn:aws:s3:::matrix-target/*"]}]}')
_ACL = {"x-amz-acl": "private"}
_MD5 = {"Content-MD5": "1B2M2Y8AsgTpgAmY7PhCfg=="}  # of an empty body; a wrong one is refused later anyway

#: endpoint class name -> (method, key or None, query, headers, body). ``{upload}`` is A's open upload.
REQUESTS: dict[str, tuple[str, str | None, str, dict, bytes]] = {
    "ListBuckets": ("GET", None, "", {}, b""),
    "HeadBucket": ("HEAD", None, "", {}, b""),
    "CreateBucket": ("PUT", None, "", {}, b""),
    "DeleteBucket": ("DELETE", None, "", {}, b""),
    "GetBucketLocation": ("GET", None, "location", {}, b""),
    "GetBucketAcl": ("GET", None, "acl", {}, b""),
    "PutBucketAcl": ("PUT", None, "acl", _ACL, b""),
    "ListObjects": ("GET", None, "list-type=2", {}, b""),
    "ListObjectVersions": ("GET", None, "versions", {}, b""),
    "CreateSession": ("GET", None, "session", {}, b""),
    "ListMultipartUploads": ("GET", None, "uploads", {}, b""),
    "DeleteObjects": ("POST", None, "delete", _MD5, b"<Delete><Object><Key>plan.txt</Key></Object></Delete>"),
    "PostObject": ("POST", None, "", {"Content-Type": "multipart/form-data; boundary=x"},
                   b'--x\r\nContent-Disposition: form-data; name="key"\r\n\r\nposted\r\n'
                   b'--x\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\nbody\r\n--x--\r\n'),
    "GetBucketLifecycleConfiguration": ("GET", None, "lifecycle", {}, b""),
    "PutBucketLifecycleConfiguration": ("PUT", None, "lifecycle", {}, _LC),
    "DeleteBucketLifecycle": ("DELETE", None, "lifecycle", {}, b""),
    "GetBucketConfiguration": ("GET", None, "tagging", {}, b""),
    "DeleteBucketConfiguration": ("DELETE", None, "cors", {}, b""),
    "PutBucketTagging": ("PUT", None, "tagging", {}, _TAGS),
    "PutBucketCors": ("PUT", None, "cors", {}, _CORS),
    "PutBucketPolicy": ("PUT", None, "policy", {}, _POLICY),
    "PutBucketVersioning": ("PUT", None, "versioning", {},
                            b"<VersioningConfiguration><Status>Suspended</Status></VersioningConfiguration>"),
    "GetBucketVersioning": ("GET", None, "versioning", {}, b""),
    "PutObjectLockConfiguration": ("PUT", None, "object-lock", {}, b"<ObjectLockConfiguration/>"),
    "GetObjectLockConfiguration": ("GET", None, "object-lock", {}, b""),
    "GetObject": ("GET", KEY, "", {}, b""),
    "HeadObject": ("HEAD", KEY, "", {}, b""),
    "GetObjectAcl": ("GET", KEY, "acl", {}, b""),
    "PutObjectAcl": ("PUT", KEY, "acl", _ACL, b""),
    "GetObjectAttributes": ("GET", KEY, "attributes", {"x-amz-object-attributes": "ETag"}, b""),
    "PutObject": ("PUT", KEY, "", {}, b"overwritten by someone else"),
    "CopyObject": ("PUT", "copied", "", {"x-amz-copy-source": f"/{BUCKET}/{KEY}"}, b""),
    "DeleteObject": ("DELETE", KEY, "", {}, b""),
    "CreateMultipartUpload": ("POST", KEY, "uploads", {}, b""),
    "UploadPart": ("PUT", KEY, "partNumber=1&uploadId={upload}", {}, b"part"),
    "UploadPartCopy": ("PUT", KEY, "partNumber=1&uploadId={upload}", {"x-amz-copy-source": f"/{BUCKET}/{KEY}"},
                       b""),
    "CompleteMultipartUpload": ("POST", KEY, "uploadId={upload}", {},
                                b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>x</ETag></Part>"
                                b"</CompleteMultipartUpload>"),
    "AbortMultipartUpload": ("DELETE", KEY, "uploadId={upload}", {}, b""),
    "ListParts": ("GET", KEY, "uploadId={upload}", {}, b""),
    "PutObjectRetention": ("PUT", KEY, "retention", {}, b"<Retention/>"),
    "GetObjectRetention": ("GET", KEY, "retention", {}, b""),
    "PutObjectLegalHold": ("PUT", KEY, "legal-hold", {}, b"<LegalHold><Status>ON</Status></LegalHold>"),
    "GetObjectLegalHold": ("GET", KEY, "legal-hold", {}, b""),
    "PutObjectTagging": ("PUT", KEY, "tagging", {}, _TAGS),
    "GetObjectTagging": ("GET", KEY, "tagging", {}, b""),
    "DeleteObjectTagging": ("DELETE", KEY, "tagging", {}, b""),
}
#: Endpoints outside the matrix, and why.
NOT_IN_MATRIX = {
    "CorsPreflight": "unauthenticated by design (S3 answers OPTIONS from the CORS rules alone); reads no data",
}
CALLERS = ("tenant-b", "anonymous", "revoked-key", "wrong-secret")


def test_the_matrix_covers_every_endpoint():
    routed = {cls.__name__ for cls in HANDLERS}
    assert routed - NOT_IN_MATRIX.keys() == REQUESTS.keys()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    node = start_node(tmp_path_factory.mktemp("matrix") / "data")
    admin = RemoteAdmin(node.s3_url, node.access_key, node.secret_key)
    admin.tenant_create("alice")
    admin.tenant_create("bobby")
    a, b, revoked = admin.key_create("alice"), admin.key_create("bobby"), admin.key_create("bobby")
    admin.key_revoke(revoked["access_key"])
    alice = boto3.client("s3", endpoint_url=node.s3_url, aws_access_key_id=a["access_key"],
                         aws_secret_access_key=a["secret_key"], region_name="us-east-1")
    alice.create_bucket(Bucket=BUCKET)
    alice.put_object(Bucket=BUCKET, Key=KEY, Body=DATA)
    alice.put_object(Bucket=BUCKET, Key=HIDDEN, Body=DATA)
    upload = alice.create_multipart_upload(Bucket=BUCKET, Key=KEY)["UploadId"]
    creds = {"tenant-b": b, "revoked-key": revoked, "anonymous": None,
             "wrong-secret": {"access_key": b["access_key"], "secret_key": "not-the-secret"}}
    yield node, alice, upload, creds
    node.stop()


def _send(node, creds, method: str, key: str | None, query: str, headers: dict, body: bytes):
    host = urllib.parse.urlparse(node.s3_url).netloc
    path = f"/{BUCKET}" + (f"/{urllib.parse.quote(key)}" if key else "")
    url = f"{node.s3_url}{path}" + (f"?{query}" if query else "")
    hdrs = dict(headers)
    if creds is not None:
        req = AWSRequest(method=method, url=url, data=body, headers=hdrs)
        S3SigV4Auth(Credentials(creds["access_key"], creds["secret_key"]), "s3", "us-east-1").add_auth(req)
        hdrs = dict(req.headers.items())
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        conn.request(method, path + (f"?{query}" if query else ""), body=body or None, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _refusal(node, creds, upload: str, endpoint: str, caller: str) -> str | None:
    """Send one case; ``None`` when it was refused cleanly, else what went wrong."""
    method, key, query, headers, body = REQUESTS[endpoint]
    if endpoint == "ListBuckets":
        status, hdrs, answer = _send_service(node, creds)
        allowed = {200} if caller == "tenant-b" else {403}  # B lists its own buckets (none)
    else:
        status, hdrs, answer = _send(node, creds, method, key, query.replace("{upload}", upload), headers, body)
        allowed = {409} if (endpoint, caller) == ("CreateBucket", "tenant-b") else {403}
    if status not in allowed:
        return f"{endpoint} by {caller}: {status} {answer[:200]!r}"
    everything = answer + repr(hdrs).encode()
    leaked = [s for s in (HIDDEN.encode(), DATA, b"alice") if s in everything]
    return f"{endpoint} by {caller}: leaked {leaked}" if leaked else None


def test_every_call_by_every_outsider_is_refused_and_changes_nothing(world):
    """One case per endpoint and caller (the count is in the assertion message); then A's state is checked."""
    node, alice, upload, creds = world
    cases = [(e, c) for e in sorted(REQUESTS) for c in CALLERS]
    failures = [f for e, c in cases if (f := _refusal(node, creds[c], upload, e, c)) is not None]
    assert failures == [], f"{len(failures)} of {len(cases)} cases not refused cleanly"
    assert len(cases) == len(REQUESTS) * len(CALLERS) >= 180
    _check_untouched(alice, upload)


def _send_service(node, creds):
    host = urllib.parse.urlparse(node.s3_url).netloc
    hdrs: dict = {}
    if creds is not None:
        req = AWSRequest(method="GET", url=f"{node.s3_url}/", data=b"", headers={})
        S3SigV4Auth(Credentials(creds["access_key"], creds["secret_key"]), "s3", "us-east-1").add_auth(req)
        hdrs = dict(req.headers.items())
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        conn.request("GET", "/", headers=hdrs)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _check_untouched(alice, upload: str) -> None:
    """Nothing B or the others sent changed A's state."""
    assert sorted(o["Key"] for o in alice.list_objects_v2(Bucket=BUCKET)["Contents"]) == sorted([KEY, HIDDEN])
    assert alice.get_object(Bucket=BUCKET, Key=KEY)["Body"].read() == DATA
    assert alice.get_bucket_versioning(Bucket=BUCKET).get("Status") is None
    assert alice.get_object_tagging(Bucket=BUCKET, Key=KEY)["TagSet"] == []
    assert [u["UploadId"] for u in alice.list_multipart_uploads(Bucket=BUCKET)["Uploads"]] == [upload]
    assert alice.list_parts(Bucket=BUCKET, Key=KEY, UploadId=upload).get("Parts", []) == []
    for call in (alice.get_bucket_lifecycle_configuration, alice.get_bucket_cors, alice.get_bucket_tagging,
                 alice.get_bucket_policy):
        with pytest.raises(alice.exceptions.ClientError):
            call(Bucket=BUCKET)
