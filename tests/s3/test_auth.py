"""SigV4: header auth, presigned URLs, payload hashes and aws-chunked bodies."""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import re
import time
import urllib.error
import urllib.request
import zlib

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from gpufeed.s3._checksum import crc32c

EMPTY = hashlib.sha256(b"").hexdigest()


def _client(node, **kw):
    return boto3.client("s3", endpoint_url=node.s3_url, region_name="us-east-1",
                        aws_access_key_id=kw.pop("access_key", node.access_key),
                        aws_secret_access_key=kw.pop("secret_key", node.secret_key),
                        config=Config(signature_version="s3v4", **kw))


def _urlopen(url: str, *, method: str = "GET", data: bytes | None = None):
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_wrong_secret_and_unknown_key(s3_node, bkt):
    c = _client(s3_node, secret_key="wrong-secret")
    with pytest.raises(ClientError) as ei:
        c.list_objects_v2(Bucket=bkt)
    assert ei.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    c.close()
    c = _client(s3_node, access_key="NOSUCHKEY")
    with pytest.raises(ClientError) as ei:
        c.put_object(Bucket=bkt, Key="x", Body=b"1")
    assert ei.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    c.close()


def test_region_from_scope_is_accepted(s3_node, bkt):
    c = boto3.client("s3", endpoint_url=s3_node.s3_url, region_name="eu-central-1",
                     aws_access_key_id=s3_node.access_key, aws_secret_access_key=s3_node.secret_key)
    c.put_object(Bucket=bkt, Key="region", Body=b"ok")
    assert c.get_object(Bucket=bkt, Key="region")["Body"].read() == b"ok"
    c.close()


def test_anonymous_is_denied(s3_node, bkt, code_of):
    status, body = _urlopen(f"{s3_node.s3_url}/{bkt}")
    assert status == 403 and code_of(body) == "AccessDenied"


def test_presigned_get_and_put(s3_node, bkt):
    c = _client(s3_node)
    put_url = c.generate_presigned_url("put_object", Params={"Bucket": bkt, "Key": "pre/sign d+"},
                                       ExpiresIn=300)
    status, _ = _urlopen(put_url, method="PUT", data=b"presigned body")
    assert status == 200
    get_url = c.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": "pre/sign d+"})
    assert _urlopen(get_url) == (200, b"presigned body")
    c.close()


def test_presigned_tampered_and_expired(s3_node, bkt, code_of):
    c = _client(s3_node)
    c.put_object(Bucket=bkt, Key="p", Body=b"x")
    url = c.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": "p"}, ExpiresIn=1)
    status, body = _urlopen(url.replace("/p?", "/q?"))
    assert status == 403 and code_of(body) == "SignatureDoesNotMatch"
    time.sleep(2.1)
    status, body = _urlopen(url)
    assert status == 403 and code_of(body) == "AccessDenied"
    assert b"Request has expired" in body
    c.close()


def test_clock_skew(raw, bkt, code_of):
    # botocore's add_auth always stamps "now": sign by hand with a date an hour old.
    old = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 3600))
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest("GET", f"http://127.0.0.1:{raw.port}/{bkt}", headers={})
    signer = S3SigV4Auth(Credentials(raw.endpoint.access_key, raw.endpoint.secret_key), "s3", "us-east-1")
    req.context["timestamp"] = old
    req.headers["X-Amz-Date"] = old
    req.headers["X-Amz-Content-SHA256"] = EMPTY
    req.headers["Host"] = f"127.0.0.1:{raw.port}"
    canonical = signer.canonical_request(req)
    sig = signer.signature(signer.string_to_sign(req, canonical), req)
    headers = {k: v for k, v in req.headers.items()}
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={raw.endpoint.access_key}/{old[:8]}/us-east-1/s3/aws4_request, "
        f"SignedHeaders={signer.signed_headers(signer.headers_to_sign(req))}, Signature={sig}")
    r = raw.request("GET", f"/{bkt}", headers=headers, sign=False)
    assert r.status == 403 and code_of(r.body) == "RequestTimeTooSkewed"


def test_malformed_authorization(raw, bkt, code_of):
    r = raw.request("GET", f"/{bkt}", sign=False, headers={
        "Host": f"127.0.0.1:{raw.port}", "Authorization": "AWS4-HMAC-SHA256 garbage",
        "X-Amz-Date": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), "X-Amz-Content-SHA256": EMPTY})
    assert r.status == 400 and code_of(r.body) == "AuthorizationHeaderMalformed"
    r = raw.request("GET", f"/{bkt}", sign=False, headers={
        "Host": f"127.0.0.1:{raw.port}", "Authorization": f"AWS {raw.endpoint.access_key}:c2lnbmF0dXJl"})
    assert r.status == 403 and code_of(r.body) == "AccessDenied"  # signature v2 without a Date
    r = raw.request("GET", f"/{bkt}", sign=False, headers={
        "Host": f"127.0.0.1:{raw.port}", "Date": email.utils.formatdate(usegmt=True),
        "Authorization": f"AWS {raw.endpoint.access_key}:c2lnbmF0dXJl"})
    assert r.status == 403 and code_of(r.body) == "SignatureDoesNotMatch"


def test_signature_v2_presigned_and_header(s3_node, bkt, code_of):
    # boto3's generate_presigned_url still defaults to signature version 2 for S3.
    c = boto3.client("s3", endpoint_url=s3_node.s3_url, region_name="us-east-1",
                     aws_access_key_id=s3_node.access_key, aws_secret_access_key=s3_node.secret_key)
    c.put_object(Bucket=bkt, Key="v2 key+", Body=b"v2 body")
    url = c.generate_presigned_url("get_object", Params={"Bucket": bkt, "Key": "v2 key+"}, ExpiresIn=60)
    assert "AWSAccessKeyId=" in url
    assert _urlopen(url) == (200, b"v2 body")
    status, body = _urlopen(url.replace("Expires=", "Expires=1"))
    assert status == 403 and code_of(body) == "SignatureDoesNotMatch"
    c.close()
    c = _client(s3_node)
    c.close()
    v2 = boto3.client("s3", endpoint_url=s3_node.s3_url, region_name="us-east-1",
                      aws_access_key_id=s3_node.access_key, aws_secret_access_key=s3_node.secret_key,
                      config=Config(signature_version="s3"))
    v2.put_object(Bucket=bkt, Key="v2 header", Body=b"signed with v2", Metadata={"a": "b"})
    assert v2.get_object(Bucket=bkt, Key="v2 header")["Body"].read() == b"signed with v2"
    assert [o["Key"] for o in v2.list_objects_v2(Bucket=bkt, Prefix="v2 ")["Contents"]] == ["v2 header", "v2 key+"]
    v2.close()


def test_payload_sha256_mismatch(raw, bkt, code_of, s3_node):
    headers = raw.sign("PUT", f"/{bkt}/sha", body=b"original")
    conn_body = b"tampered"  # same length, different bytes
    r = raw.request("PUT", f"/{bkt}/sha", body=conn_body, headers=headers, sign=False)
    assert r.status == 400 and code_of(r.body) == "XAmzContentSHA256Mismatch"
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, "sha")


def test_unsigned_payload(raw, bkt, s3_node):
    r = raw.request("PUT", f"/{bkt}/unsigned", body=b"free", payload_hash="UNSIGNED-PAYLOAD")
    assert r.status == 200
    assert s3_node.engine.get_object(bkt, "unsigned") == b"free"


# aws-chunked -------------------------------------------------------------------------------------
def _signed_chunks(raw, path: str, data: bytes, chunk: int, *, corrupt: bool = False,
                   trailer: tuple[str, str] | None = None):
    """Build headers + body of a STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER] upload by the spec."""
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" + ("-TRAILER" if trailer else "")
    extra = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data))}
    if trailer:
        extra["x-amz-trailer"] = trailer[0]
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
    # Content-Length must be known before signing: compute the framed size first.
    framed = 0
    for p in pieces:
        framed += len(f"{len(p):x};chunk-signature=".encode()) + 64 + 2 + len(p) + (2 if p else 0)
    if trailer:
        framed += len(f"{trailer[0]}:{trailer[1]}\r\n".encode()) + len("x-amz-trailer-signature:") + 64 + 2
    framed += 2
    extra["Content-Length"] = str(framed)
    headers = raw.sign("PUT", path, headers=extra, payload_hash=mode)
    seed = re.search(r"Signature=([0-9a-f]+)", headers["Authorization"]).group(1)
    ts = headers["X-Amz-Date"]
    scope = f"{ts[:8]}/us-east-1/s3/aws4_request"
    secret = raw.endpoint.secret_key

    def h(key, msg):
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    key = h(h(h(h(f"AWS4{secret}".encode(), ts[:8]), "us-east-1"), "s3"), "aws4_request")
    prev, body = seed, bytearray()
    for p in pieces:
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", ts, scope, prev, EMPTY, hashlib.sha256(p).hexdigest()])
        sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        if corrupt and p is pieces[1]:
            sig = "0" * 64
        body += f"{len(p):x};chunk-signature={sig}\r\n".encode() + p + (b"\r\n" if p else b"")
        prev = sig
    if trailer:
        line = f"{trailer[0]}:{trailer[1]}\n"
        sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", ts, scope, prev, hashlib.sha256(line.encode()).hexdigest()])
        tsig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        body += f"{trailer[0]}:{trailer[1]}\r\nx-amz-trailer-signature:{tsig}\r\n".encode()
    body += b"\r\n"
    assert len(body) == framed
    return headers, bytes(body)


def test_signed_streaming_upload(raw, bkt, s3_node):
    data = bytes(range(256)) * 700  # 179,200 bytes
    headers, body = _signed_chunks(raw, f"/{bkt}/chunked", data, 65536)
    r = raw.request("PUT", f"/{bkt}/chunked", body=body, headers=headers, sign=False)
    assert r.status == 200, r.body
    assert s3_node.engine.get_object(bkt, "chunked") == data
    assert r.headers["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'


def test_signed_streaming_with_trailer(raw, bkt, s3_node):
    data = b"trailing checksum " * 1000
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    headers, body = _signed_chunks(raw, f"/{bkt}/chunked-t", data, 4096,
                                   trailer=("x-amz-checksum-crc32", crc))
    r = raw.request("PUT", f"/{bkt}/chunked-t", body=body, headers=headers, sign=False)
    assert r.status == 200, r.body
    assert s3_node.engine.head_object(bkt, "chunked-t").checksums == {"crc32": crc}


def test_signed_streaming_bad_chunk_signature(raw, bkt, s3_node, code_of):
    data = b"z" * 100_000
    headers, body = _signed_chunks(raw, f"/{bkt}/chunked-bad", data, 30000, corrupt=True)
    r = raw.request("PUT", f"/{bkt}/chunked-bad", body=body, headers=headers, sign=False)
    assert r.status == 403 and code_of(r.body) == "SignatureDoesNotMatch"
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, "chunked-bad")


def _unsigned_trailer_body(data: bytes, name: str, value: str, chunk: int = 8192) -> bytes:
    out = bytearray()
    for i in range(0, len(data), chunk):
        p = data[i:i + chunk]
        out += f"{len(p):x}\r\n".encode() + p + b"\r\n"
    out += f"0\r\n{name}:{value}\r\n\r\n".encode()
    return bytes(out)


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "sha256"])
def test_unsigned_trailer_checksums(raw, bkt, s3_node, algorithm, code_of):
    data = b"unsigned payload with trailer " * 500
    digest = {"crc32": lambda d: zlib.crc32(d).to_bytes(4, "big"),
              "crc32c": lambda d: crc32c(d).to_bytes(4, "big"),
              "sha256": lambda d: hashlib.sha256(d).digest()}[algorithm](data)
    good = base64.b64encode(digest).decode()
    name = f"x-amz-checksum-{algorithm}"
    extra = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)),
             "x-amz-trailer": name, "x-amz-sdk-checksum-algorithm": algorithm.upper()}
    key = f"trailer-{algorithm}"
    body = _unsigned_trailer_body(data, name, good)
    r = raw.request("PUT", f"/{bkt}/{key}", body=body, headers=extra,
                    payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert r.status == 200, r.body
    assert r.headers[name] == good
    assert s3_node.engine.get_object(bkt, key) == data
    bad = base64.b64encode(bytes(len(digest))).decode()
    body = _unsigned_trailer_body(data, name, bad)
    r = raw.request("PUT", f"/{bkt}/{key}-bad", body=body, headers=extra,
                    payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert r.status == 400 and code_of(r.body) == "BadDigest"
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, f"{key}-bad")


def test_chunked_decoded_length_mismatch(raw, bkt, code_of):
    data = b"abc" * 100
    body = _unsigned_trailer_body(data, "x-amz-checksum-crc32",
                                  base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode())
    extra = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data) + 5),
             "x-amz-trailer": "x-amz-checksum-crc32"}
    r = raw.request("PUT", f"/{bkt}/short", body=body, headers=extra,
                    payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert r.status == 400 and code_of(r.body) == "IncompleteBody"
