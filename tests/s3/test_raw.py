"""Hostile and hand-made requests: virtual hosts, traversal, truncated bodies, bad XML, digests."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import time
import zlib
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from gpufeed.errors import InvalidRange
from gpufeed.s3 import bucket_from_host, parse_range
from gpufeed.s3._checksum import crc32c, crc64nvme


# pure functions --------------------------------------------------------------------------
def test_bucket_from_host():
    assert bucket_from_host("127.0.0.1:9000") is None
    assert bucket_from_host("localhost:9000") is None
    assert bucket_from_host("[::1]:9000") is None
    assert bucket_from_host("my-bucket.localhost:9000") == "my-bucket"
    assert bucket_from_host("my.dotted.bucket.localhost") == "my.dotted.bucket"
    assert bucket_from_host("data.s3.us-east-1.example.com") == "data"
    assert bucket_from_host("s3.example.com") is None
    assert bucket_from_host(None) is None


def test_parse_range():
    assert parse_range(None, 10) is None
    assert parse_range("bytes=2-4", 10) == (2, 3)
    assert parse_range("bytes=8-", 10) == (8, 2)
    assert parse_range("bytes=-3", 10) == (7, 3)
    assert parse_range("bytes=-30", 10) == (0, 10)
    assert parse_range("bytes=5-100", 10) == (5, 5)
    assert parse_range("bytes=4-2", 10) is None  # invalid syntax: ignored
    assert parse_range("bytes=a-b", 10) is None
    for bad in ("bytes=10-", "bytes=10-12", "bytes=-0"):
        with pytest.raises(InvalidRange):
            parse_range(bad, 10)
    with pytest.raises(InvalidRange):
        parse_range("bytes=0-", 0)


def test_crc_vectors():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283
    assert crc64nvme(b"123456789") == 0xAE8B14860A799888


# response basics ---------------------------------------------------------------------------
def test_error_document_and_request_id(raw, bkt, code_of):
    r = raw.request("GET", f"/{bkt}/missing/key")
    assert r.status == 404 and code_of(r.body) == "NoSuchKey"
    assert b"<Resource>/" in r.body and b"<RequestId>" in r.body
    assert r.headers["x-amz-request-id"]
    assert r.headers["Content-Type"] == "application/xml"
    h = raw.request("HEAD", f"/{bkt}/missing/key")
    assert h.status == 404 and h.body == b"" and h.headers["x-amz-request-id"]
    ok = raw.request("GET", "/")
    assert ok.status == 200 and ok.headers["x-amz-request-id"]
    assert b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"' in ok.body


def test_method_not_allowed_and_not_implemented(raw, bkt, code_of):
    r = raw.request("POST", "/")
    assert r.status == 405 and code_of(r.body) == "MethodNotAllowed"
    r = raw.request("GET", f"/{bkt}?logging")
    assert r.status == 501 and code_of(r.body) == "NotImplemented"
    r = raw.request("POST", f"/{bkt}/k?restore", body=b"<RestoreRequest/>")
    assert r.status == 501 and code_of(r.body) == "NotImplemented"


def test_invalid_range_416(raw, bkt, s3_node, code_of):
    s3_node.engine.put_object(bkt, "ten", b"0123456789")
    r = raw.request("GET", f"/{bkt}/ten", headers={"Range": "bytes=10-20"})
    assert r.status == 416 and code_of(r.body) == "InvalidRange"
    assert r.headers["Content-Range"] == "bytes */10"
    r = raw.request("GET", f"/{bkt}/ten", headers={"Range": "bytes=3-5"})
    assert (r.status, r.body, r.headers["Content-Range"]) == (206, b"345", "bytes 3-5/10")
    r = raw.request("HEAD", f"/{bkt}/ten", headers={"Range": "bytes=3-5"})
    assert r.status == 206 and r.headers["Content-Length"] == "3" and r.body == b""


def test_large_get_is_exact(raw, bkt, s3_node):
    data = os.urandom(20 << 20)  # 20 MiB through sendfile
    s3_node.engine.put_object(bkt, "large", data)
    r = raw.request("GET", f"/{bkt}/large")
    assert r.status == 200 and r.body == data
    assert r.headers["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert r.headers["Last-Modified"].endswith(" GMT")
    r = raw.request("GET", f"/{bkt}/large", headers={"Range": "bytes=1000000-1999999"})
    assert r.body == data[1_000_000:2_000_000]


# virtual-hosted style -------------------------------------------------------------------------
def test_virtual_host_raw(raw, bkt, s3_node):
    host = f"{bkt}.localhost:{raw.port}"
    r = raw.request("PUT", "/vh/obj", body=b"virtual", host=host)
    assert r.status == 200, r.body
    assert s3_node.engine.get_object(bkt, "vh/obj") == b"virtual"
    r = raw.request("GET", "/?list-type=2&prefix=vh/", host=host)
    assert r.status == 200 and b"<Key>vh/obj</Key>" in r.body
    r = raw.request("GET", "/vh/obj", host=f"{bkt}.s3.us-east-1.example.com")
    assert r.status == 200 and r.body == b"virtual"


def test_virtual_host_boto3(s3_node, bkt, monkeypatch):
    # bucket.localhost does not resolve here: resolve *.localhost to 127.0.0.1 in this process.
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    c = boto3.client("s3", endpoint_url=f"http://localhost:{s3_node.port}", region_name="us-east-1",
                     aws_access_key_id=s3_node.access_key, aws_secret_access_key=s3_node.secret_key,
                     config=Config(s3={"addressing_style": "virtual"}))
    seen = []
    c.meta.events.register("before-send.s3.*", lambda request, **kw: seen.append(request.url))
    c.put_object(Bucket=bkt, Key="vh2", Body=b"boto virtual")
    assert c.get_object(Bucket=bkt, Key="vh2")["Body"].read() == b"boto virtual"
    assert "vh2" in [o["Key"] for o in c.list_objects_v2(Bucket=bkt)["Contents"]]
    assert all(u.startswith(f"http://{bkt}.localhost:") for u in seen)
    c.close()


# traversal -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw_key", [
    "../../etc/passwd",
    "%2e%2e/%2e%2e/etc/passwd",
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "a/../../../../{outside}/pwned",
    "..%2f..%2f{outside}%2fpwned2",
])
def test_traversal_keys_stay_in_bucket(raw, bkt, s3_node, tmp_path, raw_key):
    outside = tmp_path / "outside"
    outside.mkdir()
    raw_key = raw_key.format(outside=str(outside).lstrip("/").replace("/", "%2F"))
    before = {p.name for p in outside.iterdir()}
    r = raw.request("GET", f"/{bkt}/{raw_key}")
    assert r.status == 404  # never /etc/passwd
    r = raw.request("PUT", f"/{bkt}/{raw_key}", body=b"trapped")
    assert r.status == 200, r.body
    from urllib.parse import unquote

    key = unquote(raw_key)
    assert s3_node.engine.get_object(bkt, key) == b"trapped"
    r = raw.request("GET", f"/{bkt}/{raw_key}")
    assert r.status == 200 and r.body == b"trapped"
    assert {p.name for p in outside.iterdir()} == before
    data_dir = Path(s3_node.data_dir).resolve()
    assert Path(s3_node.engine.head_object(bkt, key).path).resolve().is_relative_to(data_dir)
    assert not Path("/etc/passwd").read_bytes().startswith(b"trapped")
    r = raw.request("DELETE", f"/{bkt}/{raw_key}")
    assert r.status == 204
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, key)


def test_dotdot_bucket(raw, code_of):
    r = raw.request("GET", "/../etc/passwd")
    assert r.status in (400, 404)
    assert code_of(r.body) in ("InvalidBucketName", "NoSuchBucket")


# truncated / dropped uploads ---------------------------------------------------------------------
def _tmp_files(data_dir: Path) -> list[Path]:
    tmp = Path(data_dir) / "tmp"
    return [p for p in tmp.rglob("*") if p.is_file()] if tmp.exists() else []


def test_client_disconnects_mid_upload(raw, bkt, s3_node):
    path = f"/{bkt}/half"
    headers = raw.sign("PUT", path, headers={"Content-Length": "1000000"}, payload_hash="UNSIGNED-PAYLOAD")
    with socket.create_connection(("127.0.0.1", raw.port)) as sock:
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode() + b"x" * 400_000)
        time.sleep(0.2)
    deadline = time.time() + 10
    while _tmp_files(s3_node.data_dir) and time.time() < deadline:
        time.sleep(0.05)
    assert _tmp_files(s3_node.data_dir) == []
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, "half")
    r = raw.request("PUT", path, body=b"server still up")
    assert r.status == 200


def test_body_shorter_than_declared_over_keepalive(raw, bkt, s3_node):
    # A declared-but-never-sent body, then the client half-closes: nothing is stored.
    path = f"/{bkt}/never"
    headers = raw.sign("PUT", path, headers={"Content-Length": "10"}, payload_hash="UNSIGNED-PAYLOAD")
    with socket.create_connection(("127.0.0.1", raw.port)) as sock:
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode() + b"12345")
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        try:
            reply = sock.recv(65536)
        except OSError:
            reply = b""
    assert not reply.startswith(b"HTTP/1.1 200")
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, "never")


def test_transfer_encoding_chunked_put_over_keepalive(raw, bkt, s3_node):
    """An HTTP/1.1 ``Transfer-Encoding: chunked`` body (no Content-Length) is stored
    byte for byte, chunk boundaries anywhere, and the connection serves the next
    request (RFC 9112 section 7.1)."""
    path = f"/{bkt}/te-chunked"
    body = os.urandom((3 << 20) + 12345)
    headers = raw.sign("PUT", path, headers={"Transfer-Encoding": "chunked"}, payload_hash="UNSIGNED-PAYLOAD")
    sizes = [1, 70_000, 1 << 20, 5, 2 << 20]
    with socket.create_connection(("127.0.0.1", raw.port)) as sock:
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        pos = 0
        for n in sizes + [len(body)]:
            piece = body[pos:pos + n]
            pos += len(piece)
            if piece:
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        get = raw.sign("HEAD", path)
        sock.sendall((f"HEAD {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in get.items())
                      + "\r\n").encode())
        sock.settimeout(30)
        replies = b""
        while replies.count(b"HTTP/1.1 ") < 2 or not replies.endswith(b"\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            replies += chunk
    assert replies.startswith(b"HTTP/1.1 200"), replies[:300]
    assert replies.count(b"HTTP/1.1 200") == 2, replies[:600]
    assert f"Content-Length: {len(body)}".encode() in replies.split(b"HTTP/1.1 200")[2]
    assert hashlib.md5(body).hexdigest().encode() in replies
    assert raw.request("GET", path).body == body


# bad XML --------------------------------------------------------------------------------------------
def _md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


@pytest.mark.parametrize("body", [
    b"<Delete><Object><Key>a</Key></Object>",  # not well formed
    b"",
    b"<Delete></Delete>",  # no objects
    b"<?xml version='1.0'?><!DOCTYPE d [<!ENTITY x 'y'>]><Delete><Object><Key>&x;</Key></Object></Delete>",
    b"<NotDelete><Object><Key>a</Key></Object></NotDelete>",
])
def test_delete_objects_malformed(raw, bkt, code_of, body):
    r = raw.request("POST", f"/{bkt}?delete", body=body, headers={"Content-MD5": _md5(body)})
    assert r.status == 400 and code_of(r.body) == "MalformedXML"


def test_delete_objects_content_md5_mismatch(raw, bkt, code_of):
    body = b"<Delete><Object><Key>a</Key></Object></Delete>"
    r = raw.request("POST", f"/{bkt}?delete", body=body, headers={"Content-MD5": _md5(b"other")})
    assert r.status == 400 and code_of(r.body) == "BadDigest"


@pytest.mark.parametrize("body", [
    b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>",
    b"<CompleteMultipartUpload></CompleteMultipartUpload>",
    b"<CompleteMultipartUpload><Part><PartNumber>x</PartNumber><ETag>e</ETag></Part></CompleteMultipartUpload>",
    b"<!DOCTYPE lol [<!ENTITY a 'aaaa'>]><CompleteMultipartUpload/>",
])
def test_complete_multipart_malformed(raw, bkt, s3_node, code_of, body):
    up = s3_node.engine.create_multipart_upload(bkt, "mpx")
    r = raw.request("POST", f"/{bkt}/mpx?uploadId={up.upload_id}", body=body)
    assert r.status == 400 and code_of(r.body) == "MalformedXML"
    s3_node.engine.abort_multipart_upload(bkt, "mpx", up.upload_id)


# digests -----------------------------------------------------------------------------------------
def test_content_md5_and_checksum_headers(raw, bkt, s3_node, code_of):
    body = b"digest me" * 100
    r = raw.request("PUT", f"/{bkt}/dg", body=body, headers={"Content-MD5": _md5(b"nope")})
    assert r.status == 400 and code_of(r.body) == "BadDigest"
    r = raw.request("PUT", f"/{bkt}/dg", body=body, headers={"Content-MD5": "AAAA"})
    assert r.status == 400 and code_of(r.body) == "InvalidDigest"
    wrong = base64.b64encode((zlib.crc32(body) ^ 1).to_bytes(4, "big")).decode()
    r = raw.request("PUT", f"/{bkt}/dg", body=body, headers={"x-amz-checksum-crc32": wrong})
    assert r.status == 400 and code_of(r.body) == "BadDigest"
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, "dg")
    good = base64.b64encode(crc32c(body).to_bytes(4, "big")).decode()
    r = raw.request("PUT", f"/{bkt}/dg", body=body, headers={"x-amz-checksum-crc32c": good,
                                                             "Content-MD5": _md5(body)})
    assert r.status == 200 and r.headers["x-amz-checksum-crc32c"] == good
    r = raw.request("GET", f"/{bkt}/dg", headers={"x-amz-checksum-mode": "ENABLED"})
    assert r.body == body and r.headers["x-amz-checksum-crc32c"] == good
    r = raw.request("GET", f"/{bkt}/dg")
    assert "x-amz-checksum-crc32c" not in r.headers


def test_gzip_body_stored_as_sent(raw, bkt, s3_node):
    import gzip

    body = gzip.compress(b"compressed " * 100)
    r = raw.request("PUT", f"/{bkt}/gz", body=body, headers={"Content-Encoding": "gzip"})
    assert r.status == 200
    assert s3_node.engine.get_object(bkt, "gz") == body


# unexpected failures --------------------------------------------------------------------------------
def test_unexpected_exception_is_500_xml(serve, node_config, raw_for, tmp_path, code_of):
    """An engine that fails in a way nobody planned (closed under the server) yields
    500 InternalError XML, never a traceback, and the endpoint keeps answering."""
    from gpufeed.engine import Engine

    cfg = node_config(tmp_path / "data")
    engine = Engine(cfg.data_dir, fsync=False)
    with serve(engine, cfg) as port:
        client = raw_for(f"http://127.0.0.1:{port}", cfg.access_key, cfg.secret_key)
        assert client.request("PUT", "/closing").status == 200
        engine.close()
        for _ in range(2):
            r = client.request("GET", "/closing?list-type=2")
            assert r.status == 500 and code_of(r.body) == "InternalError"
            assert b"Traceback" not in r.body and r.headers["x-amz-request-id"]


def test_non_gpufeed_exception_is_500_xml(serve, node_config, raw_for, tmp_path, code_of, caplog):
    """The catch-all: a bare Python exception (here AttributeError from an object that is
    not an engine at all) becomes InternalError XML plus one logged traceback."""
    cfg = node_config(tmp_path / "data")
    with serve(object(), cfg) as port:
        client = raw_for(f"http://127.0.0.1:{port}", cfg.access_key, cfg.secret_key)
        r = client.request("GET", "/")
        assert r.status == 500 and code_of(r.body) == "InternalError"
        assert b"AttributeError" not in r.body
        h = client.request("HEAD", "/b-u-c/k")
        assert h.status == 500 and h.body == b""
    assert any("failed (request id" in rec.getMessage() for rec in caplog.records)
