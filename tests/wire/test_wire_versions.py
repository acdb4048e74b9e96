"""Object versions and object lock over the fast path, against a live node.

The buckets' versioning and object lock are set with the engine on the node's
data folder before the node starts (the fast path has no bucket-configuration
ops); objects are then written, read, and deleted through the SDK over TCP and
shm. Semantics follow S3 (the engine's rules): "Retrieving object versions",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/RetrievingObjectVersions.html;
"DeleteObject", https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteObject.html;
"Object Lock", https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock.html.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
import uuid

import msgspec
import pytest

from gpufeed.client import AsyncClient, Client, DeleteResult, ReadRequest, parse_url
from gpufeed.engine import Engine
from gpufeed.errors import (
    AccessDenied,
    InvalidArgument,
    MethodNotAllowed,
    NoSuchKey,
    NoSuchVersion,
    NotImplementedByGpufeed,
)
from gpufeed.testing.node import start_node
from gpufeed.testing.wire_fuzz import authenticate_raw
from gpufeed.wire import protocol as p

VERSIONED, PLAIN, GOVERNANCE, COMPLIANCE = "vers-on", "vers-plain", "vers-gov", "vers-comp"
VERSION_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def vnode(tmp_path_factory):
    """A node whose data folder holds a versioned bucket, a plain one, and two
    object-lock buckets with a one-day default retention (GOVERNANCE, COMPLIANCE)."""
    data = tmp_path_factory.mktemp("versions") / "data"
    with Engine(data, fsync=False) as e:
        e.create_bucket(VERSIONED)
        e.put_bucket_versioning(VERSIONED, "Enabled")
        e.create_bucket(PLAIN)
        for name, mode in ((GOVERNANCE, "GOVERNANCE"), (COMPLIANCE, "COMPLIANCE")):
            e.create_bucket(name, object_lock=True)
            e.put_object_lock_configuration(name, mode, days=1)
    node = start_node(data)
    yield node
    code = node.stop()
    assert code == 0, f"node exited with {code}:\n{node.log_path.read_text()}"


@pytest.fixture(params=["tcp", "shm"])
def client(request, vnode):
    with Client(vnode.tcp_url if request.param == "tcp" else vnode.shm_url) as c:
        yield c


def _key() -> str:
    return "k-" + uuid.uuid4().hex[:12]


def _two_versions(c: Client, key: str) -> tuple[p.ObjectMeta, p.ObjectMeta]:
    return c.put(VERSIONED, key, b"first version"), c.put(VERSIONED, key, b"second, longer version")


def test_put_returns_version_ids_and_each_version_reads_back(client):
    key = _key()
    assert client.supports_versions
    m1, m2 = _two_versions(client, key)
    assert VERSION_ID.fullmatch(m1.version_id) and VERSION_ID.fullmatch(m2.version_id)
    assert m1.version_id != m2.version_id
    assert bytes(client.get(VERSIONED, key, version_id=m1.version_id)) == b"first version"
    assert bytes(client.get(VERSIONED, key, version_id=m2.version_id)) == b"second, longer version"
    assert bytes(client.get(VERSIONED, key)) == b"second, longer version"
    assert bytes(client.get(VERSIONED, key, offset=6, length=3, version_id=m1.version_id)) == b"ver"
    head = client.head(VERSIONED, key, version_id=m1.version_id)
    assert (head.version_id, head.size, head.etag) == (m1.version_id, 13, m1.etag)
    assert client.head(VERSIONED, key).version_id == m2.version_id


def test_get_into_and_batches_name_versions(client):
    key = _key()
    m1, m2 = _two_versions(client, key)
    buf = bytearray(64)
    assert client.get_into(VERSIONED, key, buf, version_id=m1.version_id) == 13
    assert bytes(buf[:13]) == b"first version"
    region = client.alloc(64)  # shm: the node writes into it directly
    assert client.get_into(VERSIONED, key, region, version_id=m1.version_id) == 13
    assert bytes(region[:13]) == b"first version"
    a, b, cur = bytearray(13), client.alloc(22), bytearray(22)
    got = client.get_many_into([ReadRequest(VERSIONED, key, a, version_id=m1.version_id),
                                (VERSIONED, key, b, 0, None, 0, m2.version_id),
                                ReadRequest(VERSIONED, key, cur)])
    assert got == [13, 22, 22]
    assert (bytes(a), bytes(b), bytes(cur)) == (b"first version", b"second, longer version",
                                                b"second, longer version")
    errors: list = []
    got = client.get_many_into([ReadRequest(VERSIONED, key, bytearray(8), version_id="0" * 32),
                                ReadRequest(VERSIONED, key, bytearray(5), version_id=m1.version_id)],
                               errors_out=errors)
    assert got == [-1, 5] and isinstance(errors[0], NoSuchVersion) and errors[1] is None


def test_delete_makes_a_marker_and_versions_stay(client):
    key = _key()
    m1, m2 = _two_versions(client, key)
    res = client.delete(VERSIONED, key)
    assert isinstance(res, DeleteResult) and res.delete_marker
    assert VERSION_ID.fullmatch(res.version_id) and res.version_id not in (m1.version_id, m2.version_id)
    with pytest.raises(NoSuchKey) as exc:
        client.get(VERSIONED, key)
    assert exc.value.details == {"delete_marker": True, "version_id": res.version_id}
    with pytest.raises(NoSuchKey):
        client.head(VERSIONED, key)
    with pytest.raises(MethodNotAllowed) as exc2:
        client.head(VERSIONED, key, version_id=res.version_id)
    assert exc2.value.details["delete_marker"] is True
    assert bytes(client.get(VERSIONED, key, version_id=m1.version_id)) == b"first version"
    # removing the marker by id brings the newest version back
    assert client.delete(VERSIONED, key, version_id=res.version_id) == DeleteResult(res.version_id, True)
    assert bytes(client.get(VERSIONED, key)) == b"second, longer version"
    # removing a version by id is for good
    assert client.delete(VERSIONED, key, version_id=m2.version_id) == DeleteResult(m2.version_id, False)
    with pytest.raises(NoSuchVersion):
        client.get(VERSIONED, key, version_id=m2.version_id)
    assert bytes(client.get(VERSIONED, key)) == b"first version"
    # a version that is gone already is not an error (S3 answers 204)
    client.delete(VERSIONED, key, version_id=m2.version_id)


def test_bad_version_ids(client):
    key = _key()
    client.put(VERSIONED, key, b"x")
    with pytest.raises(NoSuchVersion):
        client.get(VERSIONED, key, version_id="f" * 32)
    with pytest.raises(NoSuchVersion):
        client.head(VERSIONED, key, version_id="f" * 32)
    for bad in ("nope", "F" * 32, ""):
        with pytest.raises(InvalidArgument):
            client.get(VERSIONED, key, version_id=bad)
        with pytest.raises(InvalidArgument):
            client.delete(VERSIONED, key, version_id=bad)
    with pytest.raises(InvalidArgument):  # refused before anything is sent
        client.get(VERSIONED, key, version_id=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        client.delete(VERSIONED, key, bypass_governance="yes")  # type: ignore[arg-type]
    assert bytes(client.get(VERSIONED, key)) == b"x"  # the connection is still good


def test_unversioned_bucket_has_the_null_version(client):
    key = _key()
    meta = client.put(PLAIN, key, b"only")
    assert meta.version_id == "null" and (meta.lock_mode, meta.lock_until, meta.legal_hold) == ("", 0.0, False)
    assert bytes(client.get(PLAIN, key, version_id="null")) == b"only"
    assert client.delete(PLAIN, key) == DeleteResult(None, False)
    with pytest.raises(NoSuchKey) as exc:
        client.get(PLAIN, key)
    assert "delete_marker" not in exc.value.details


def test_governance_retention_refuses_deletes_unless_bypassed(client):
    key = _key()
    before = time.time()
    meta = client.put(GOVERNANCE, key, b"kept")
    assert meta.lock_mode == "GOVERNANCE" and meta.lock_until >= before + 86400 - 5
    head = client.head(GOVERNANCE, key, version_id=meta.version_id)
    assert (head.lock_mode, head.lock_until) == (meta.lock_mode, meta.lock_until)
    with pytest.raises(AccessDenied):
        client.delete(GOVERNANCE, key, version_id=meta.version_id)
    assert bytes(client.get(GOVERNANCE, key, version_id=meta.version_id)) == b"kept"
    # a plain delete only hides it behind a marker (the version stays protected)
    marker = client.delete(GOVERNANCE, key)
    assert marker.delete_marker
    with pytest.raises(AccessDenied):
        client.delete(GOVERNANCE, key, version_id=meta.version_id)
    assert bytes(client.get(GOVERNANCE, key, version_id=meta.version_id)) == b"kept"
    res = client.delete(GOVERNANCE, key, version_id=meta.version_id, bypass_governance=True)
    assert res == DeleteResult(meta.version_id, False)
    with pytest.raises(NoSuchVersion):
        client.head(GOVERNANCE, key, version_id=meta.version_id)


def test_compliance_retention_cannot_be_bypassed(client):
    key = _key()
    meta = client.put(COMPLIANCE, key, b"worm")
    assert meta.lock_mode == "COMPLIANCE"
    for bypass in (False, True):
        with pytest.raises(AccessDenied):
            client.delete(COMPLIANCE, key, version_id=meta.version_id, bypass_governance=bypass)
    assert bytes(client.get(COMPLIANCE, key, version_id=meta.version_id)) == b"worm"
    # a put makes a new version: the locked one is never overwritten
    newer = client.put(COMPLIANCE, key, b"newer")
    assert newer.version_id != meta.version_id
    assert bytes(client.get(COMPLIANCE, key)) == b"newer"
    assert bytes(client.get(COMPLIANCE, key, version_id=meta.version_id)) == b"worm"


def test_map_object_of_a_version(vnode):
    with Client(vnode.shm_url) as c:
        key = _key()
        m1, _m2 = _two_versions(c, key)
        assert bytes(c.map_object(VERSIONED, key, version_id=m1.version_id)) == b"first version"
        with pytest.raises(NoSuchVersion):
            c.map_object(VERSIONED, key, version_id="0" * 32)


def test_async_client_names_versions(vnode):
    key = _key()

    async def main() -> tuple:
        async with AsyncClient(vnode.tcp_url) as ac:
            m1 = await ac.put(VERSIONED, key, b"a1")
            await ac.put(VERSIONED, key, b"a2")
            old = bytes(await ac.get(VERSIONED, key, version_id=m1.version_id))
            head = await ac.head(VERSIONED, key, version_id=m1.version_id)
            gone = await ac.delete(VERSIONED, key, version_id=m1.version_id)
            return m1, old, head, gone

    m1, old, head, gone = asyncio.run(main())
    assert old == b"a1" and head.version_id == m1.version_id
    assert gone == DeleteResult(m1.version_id, False)


def test_first_form_frames_still_work(vnode):
    """A client that knows no versions sends HEAD and DELETE as ``[bucket, key]``
    and reads replies with the first forms of their structs."""
    with Client(vnode.tcp_url) as c:
        key = _key()
        c.put(VERSIONED, key, b"v")
    host, port = parse_url(vnode.tcp_url)[1]
    with socket.create_connection((host, port), timeout=10) as s:
        authenticate_raw(s, "tcp")  # nodes authenticate every client now
        op, meta = call(s, p.Op.HEAD, [VERSIONED, key])
        assert op == p.Op.HEAD | p.REPLY
        assert msgspec.msgpack.decode(meta)[:3] == [VERSIONED, key, 1]
        op, meta = call(s, p.Op.DELETE, [VERSIONED, key])
        assert op == p.Op.DELETE | p.REPLY
        assert msgspec.msgpack.Decoder(p.Empty).decode(meta) == p.Empty()  # what it expects
        op, meta = call(s, p.Op.HEAD, [VERSIONED, key])
        assert op == p.ERROR_OP
        assert msgspec.msgpack.Decoder(_FirstFormError).decode(meta).code == "NoSuchKey"


class _FirstFormError(msgspec.Struct, array_like=True):
    """The error reply as a client that knows no versions reads it."""

    code: str
    message: str


def call(s: socket.socket, op: int, meta_obj) -> tuple[int, bytes]:
    """One request on a raw socket: ``(reply op, reply metadata)``."""
    meta = msgspec.msgpack.encode(meta_obj)
    s.sendall(p.pack_header(op, len(meta), 7) + meta)
    hdr = _recv(s, p.HEADER_SIZE)
    rop, mlen, rid, plen = p.unpack_header(hdr)
    assert rid == 7 and plen == 0
    return rop, _recv(s, mlen)


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = s.recv(n - len(out))
        assert got, "the node closed the connection"
        out += got
    return out


def test_versions_are_refused_towards_a_node_without_them():
    """A node whose HELLO lists no ``"versions"`` would ignore a version id and
    serve the current version: the client refuses to send one."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def old_node() -> None:
        conn, _ = srv.accept()
        with conn:
            hdr = _recv(conn, p.HEADER_SIZE)
            _op, mlen, rid, _plen = p.unpack_header(hdr)
            _recv(conn, mlen)
            meta = msgspec.msgpack.encode(["old-node", 1, "tcp", []])
            conn.sendall(p.pack_header(p.Op.HELLO | p.REPLY, len(meta), rid) + meta)
            conn.recv(1)  # until the client closes

    t = threading.Thread(target=old_node, daemon=True)
    t.start()
    try:
        with Client(f"gpufeed+tcp://127.0.0.1:{port}", connections=1,
                    allow_unauthenticated=True) as c:
            assert not c.supports_versions
            for call_ in (lambda: c.get("bkt", "k", version_id="null"),
                          lambda: c.head("bkt", "k", version_id="null"),
                          lambda: c.get_into("bkt", "k", bytearray(1), version_id="null"),
                          lambda: c.get_many_into([ReadRequest("bkt", "k", bytearray(1), version_id="null")]),
                          lambda: c.delete("bkt", "k", version_id="null"),
                          lambda: c.delete("bkt", "k", bypass_governance=True)):
                with pytest.raises(NotImplementedByGpufeed):
                    call_()
    finally:
        t.join(10)
        srv.close()
