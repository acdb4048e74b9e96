"""``Expect: 100-continue``: the signature is checked before the client is told to
send its body (raw sockets; http.client cannot wait for an interim response)."""

from __future__ import annotations

import socket

import pytest

BODY = b"b" * 4096


def _send_headers(raw, path: str, headers: dict) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", raw.port), timeout=10)
    lines = [f"PUT {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _read_head(sock: socket.socket) -> bytes:
    """Bytes up to the end of one response head (status line and headers)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def _signed(raw, path: str, **kw) -> dict:
    headers = raw.sign("PUT", path, body=BODY, headers={"Expect": "100-continue"}, **kw)
    headers["Content-Length"] = str(len(BODY))
    return headers


def test_bad_signature_refused_before_continue(raw, bkt, s3_node):
    path = f"/{bkt}/refused"
    sock = _send_headers(raw, path, _signed(raw, path, secret_key="wrong-secret"))
    try:
        head = _read_head(sock)  # no body sent: the answer must come anyway
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 403"), head
    assert b"100 Continue" not in head
    with pytest.raises(FileNotFoundError):
        s3_node.engine.head_object(bkt, "refused")


def test_good_signature_gets_continue_then_stores(raw, bkt, s3_node):
    path = f"/{bkt}/accepted"
    sock = _send_headers(raw, path, _signed(raw, path))
    try:
        interim = _read_head(sock)
        assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
        sock.sendall(BODY)
        final = _read_head(sock)
    finally:
        sock.close()
    assert final.startswith(b"HTTP/1.1 200"), final
    assert s3_node.engine.get_object(bkt, "accepted") == BODY


def test_boto3_large_put_still_works(s3_node, bkt):
    # botocore sends Expect: 100-continue on PutObject bodies over 1 MiB
    client = s3_node.client()
    try:
        data = b"x" * (2 << 20)
        client.put_object(Bucket=bkt, Key="big", Body=data)
        assert client.get_object(Bucket=bkt, Key="big")["Body"].read() == data
    finally:
        client.close()
