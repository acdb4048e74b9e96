"""The authenticated fast path (docs/wire-protocol.md, "Authentication"): the
AUTH handshake, and tenant isolation over every fast-path op, over TCP and shm.

The matrix: every op on tenant A's bucket and object, sent by tenant B's key
(refused, the connection stays), by a client with a wrong secret, by a client
that skips AUTH, by a replayed proof, and by a key revoked while its
connection is open (refused and closed). No reply may carry A's key names or
data. S3's answers are the model: AccessDenied for another tenant's bucket,
BucketAlreadyExists for its name, InvalidAccessKeyId for a revoked key,
SignatureDoesNotMatch for a wrong secret ("Error responses",
https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html).
"""

from __future__ import annotations

import re
import socket
import threading
import time

import msgspec
import pytest

from gpufeed.admin import RemoteAdmin
from gpufeed.client import Client, ReadRequest
from gpufeed.client._auth import resolve_credentials
from gpufeed.config import DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY
from gpufeed.errors import (
    AccessError,
    BucketAlreadyExists,
    InvalidAccessKeyId,
    InvalidArgument,
    SignatureDoesNotMatch,
    TransportError,
)
from gpufeed.testing.node import start_node
from gpufeed.testing.wire_fuzz import auth_frame, authenticate_raw, connect_raw, raw_frame, read_answer
from gpufeed.wire import protocol as p

BUCKET, KEY, DATA = "alice-wire", "secret/plan.txt", b"alice's plan: 42 " * 64
#: What no reply to anyone but A may contain.
SECRETS = ("secret/plan", "plan.txt", "alice's plan")
TRANSPORTS = ["tcp", "shm"]


@pytest.fixture(scope="module")
def anode(tmp_path_factory):
    node = start_node(tmp_path_factory.mktemp("wireauth") / "data")
    yield node
    assert node.stop() == 0, node.log_path.read_text()


@pytest.fixture(scope="module")
def admin(anode):
    return RemoteAdmin(anode.s3_url, anode.access_key, anode.secret_key)


@pytest.fixture(scope="module")
def keys(anode, admin):
    admin.tenant_create("alice")
    admin.tenant_create("bob")
    a, b = admin.key_create("alice"), admin.key_create("bob")
    with Client(anode.tcp_url, a["access_key"], a["secret_key"]) as alice:
        assert alice.tenant == "alice"
        alice.create_bucket(BUCKET)
        alice.put(BUCKET, KEY, DATA)
    with Client(anode.tcp_url, b["access_key"], b["secret_key"]) as bob:
        bob.create_bucket("bob-wire")
    return a, b


def _url(node, transport: str) -> str:
    return node.tcp_url if transport == "tcp" else node.shm_url


def _ops(c: Client) -> dict:
    """Every fast-path op on A's bucket or object, as the SDK sends it."""
    ops = {
        "HEAD": lambda: c.head(BUCKET, KEY),
        "HEAD version": lambda: c.head(BUCKET, KEY, version_id="null"),
        "GET": lambda: c.get(BUCKET, KEY),
        "GET range": lambda: c.get(BUCKET, KEY, offset=3, length=5),
        "GET into": lambda: c.get_into(BUCKET, KEY, bytearray(64)),
        "GET into alloc": lambda: c.get_into(BUCKET, KEY, c.alloc(64)),
        "GETV": lambda: c.get_many_into([ReadRequest(BUCKET, KEY, bytearray(8))]),
        "GETV version": lambda: c.get_many_into([ReadRequest(BUCKET, KEY, bytearray(8), version_id="null")]),
        "PUT": lambda: c.put(BUCKET, "intruder", b"x" * 100),
        "PUT over": lambda: c.put(BUCKET, KEY, b"overwritten"),
        "PUT large": lambda: c.put(BUCKET, "big", bytes(1 << 20)),
        "DELETE": lambda: c.delete(BUCKET, KEY),
        "DELETE version": lambda: c.delete(BUCKET, KEY, version_id="null"),
        "DELETE bypass": lambda: c.delete(BUCKET, KEY, version_id="null", bypass_governance=True),
        "LIST": lambda: list(c.list(BUCKET)),
        "LIST prefix": lambda: list(c.list(BUCKET, "secret/", "/")),
        "CREATE_BUCKET": lambda: c.create_bucket(BUCKET),
        "DELETE_BUCKET": lambda: c.delete_bucket(BUCKET),
        "BUCKET_STATS": lambda: c.bucket_stats(BUCKET),
        "LOCATE": lambda: c._t.request(p.Op.LOCATE, p.Head(BUCKET, KEY)).result(),
    }
    if c.supports_map:
        ops["MAP"] = lambda: c.map_object(BUCKET, KEY)
    return ops


def _untouched(node, a: dict) -> None:
    with Client(node.tcp_url, a["access_key"], a["secret_key"]) as alice:
        assert bytes(alice.get(BUCKET, KEY)) == DATA
        assert [e.key for e in alice.list(BUCKET)] == [KEY]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tenant_b_is_refused_every_op_on_a_bucket_and_learns_nothing(anode, keys, transport):
    a, b = keys
    with Client(_url(anode, transport), b["access_key"], b["secret_key"]) as bob:
        assert bob.tenant == "bob"
        refused = {}
        for name, op in _ops(bob).items():
            with pytest.raises((AccessError, BucketAlreadyExists)) as exc:
                op()
            refused[name] = exc.value
            # the SDK quotes a batch item's own request ("request 0 (bucket/key): ");
            # what the node sent follows
            text = re.sub(r"request \d+ \([^)]*\): ", "", f"{exc.value.message} {exc.value.details}")
            assert not any(s in text for s in SECRETS), (name, text)
        # AWS's answers: AccessDenied, and BucketAlreadyExists for the name itself
        assert {type(e).__name__ for n, e in refused.items() if n != "CREATE_BUCKET"} == {"AccessDenied"}
        assert isinstance(refused["CREATE_BUCKET"], BucketAlreadyExists)
        errors: list = []
        assert bob.get_many_into([ReadRequest(BUCKET, KEY, bytearray(8)),
                                  ReadRequest("bob-wire", "nothing", bytearray(8))], errors_out=errors) == [-1, -1]
        assert errors[0].code == "AccessDenied" and errors[1].code == "NoSuchKey"
        assert bob.list_buckets() == ["bob-wire"]  # only its own
        assert not bob.lost_connection  # refusals of authorization keep the connection
    _untouched(anode, a)


def test_default_tenant_sees_only_its_own_buckets(anode, keys):
    with Client(anode.tcp_url) as c:  # the node's built-in key: the default tenant
        assert c.tenant == "default"
        assert BUCKET not in c.list_buckets() and "bob-wire" not in c.list_buckets()
        with pytest.raises(AccessError):
            c.get(BUCKET, KEY)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_wrong_secret_or_unknown_key_is_refused_at_connect(anode, keys, transport):
    a, _b = keys
    with pytest.raises(SignatureDoesNotMatch):
        Client(_url(anode, transport), a["access_key"], "not-the-secret")
    with pytest.raises(InvalidAccessKeyId):
        Client(_url(anode, transport), "GFNOSUCHKEY0000000000", "whatever")
    with pytest.raises(SignatureDoesNotMatch):  # the built-in key id with another secret
        Client(_url(anode, transport), DEFAULT_ACCESS_KEY, "nope")


def _frames_of_every_op() -> dict[str, bytes]:
    """A well-formed frame of every op but HELLO and AUTH, on A's bucket."""
    get = [BUCKET, KEY, 0, 8, -1, 0, 0, None]
    metas = {
        p.Op.REGISTER: [1, 4096], p.Op.UNREGISTER: [1, False], p.Op.ALLOC_REGION: [1, 4096],
        p.Op.FORKED: [], p.Op.HEAD: [BUCKET, KEY], p.Op.GET: get, p.Op.GETV: [[get]],
        p.Op.PUT: [BUCKET, "intruder", 4], p.Op.DELETE: [BUCKET, KEY], p.Op.LIST: [BUCKET],
        p.Op.CREATE_BUCKET: ["evil"], p.Op.LIST_BUCKETS: [], p.Op.DELETE_BUCKET: [BUCKET],
        p.Op.BUCKET_STATS: [BUCKET], p.Op.MAP: [BUCKET, KEY], p.Op.MAP_EXTENTS: [BUCKET, KEY],
        p.Op.CHUNK: ["0" * 32], p.Op.CHUNK_PUT: ["ab" * 16, 4, [["ab" * 16, 0, 4, 4, "", b"d" * 16, None, 1, 0]]],
        p.Op.GETR: [BUCKET, KEY, bytes(8), b"\x08\x00\x00\x00"], p.Op.LOCATE: [BUCKET, KEY],
        p.Op.LEASE: [BUCKET, KEY], p.Op.PART: ["get", BUCKET, KEY, "ab" * 16, ["00001." + "ab" * 16]],
    }
    assert set(metas) | {p.Op.HELLO, p.Op.AUTH} == set(p.REQUEST_TYPES)  # every op
    paid = (p.Op.PUT, p.Op.CHUNK_PUT)  # ops whose payload follows the frame
    return {p.Op(op).name: raw_frame(op, msgspec.msgpack.encode(m), b"xxxx" if op in paid else b"")
            for op, m in metas.items()}


def _hello(sock) -> bytes:
    sock.sendall(raw_frame(p.Op.HELLO, p.encode(p.Hello("test")), rid=1))
    hdr = _recv(sock, p.HEADER_SIZE)
    _op, mlen, _rid, _plen = p.unpack_header(hdr)
    return p.decode(p.HelloReply, _recv(sock, mlen)).nonce


def _recv(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        assert got, "closed"
        out += got
    return out


def _refused_and_closed(sock, code: str) -> None:
    """The next answer is the error ``code`` (naming nothing of A's), then the close."""
    answer = read_answer(sock, time.monotonic() + 10)
    assert answer is not None and answer[0] == code, answer
    assert not any(s in answer[1] for s in SECRETS)
    assert read_answer(sock, time.monotonic() + 10) is None


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("hello", [True, False])
def test_every_op_before_auth_is_access_denied_and_closes(anode, keys, transport, hello):
    a, _b = keys
    for name, frame in _frames_of_every_op().items():
        with connect_raw(_url(anode, transport), 10) as s:
            if hello:
                _hello(s)
            s.sendall(frame + raw_frame(p.Op.LIST_BUCKETS, b"\x90", rid=8))  # and one more after it
            try:
                _refused_and_closed(s, "AccessDenied")
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from exc
    _untouched(anode, a)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_bad_proof_is_refused_and_closes(anode, keys, transport):
    a, _b = keys
    cases = {
        "wrong secret": ("SignatureDoesNotMatch", lambda n: auth_frame(n, transport, a["access_key"], "nope")),
        "unknown key": ("InvalidAccessKeyId", lambda n: auth_frame(n, transport, "GFNOSUCH", "x")),
        "absurd key id": ("InvalidAccessKeyId", lambda n: auth_frame(n, transport, "k" * 10_000, "x")),
        "other transport": ("SignatureDoesNotMatch",
                            lambda n: auth_frame(n, "shm" if transport == "tcp" else "tcp", a["access_key"],
                                                 a["secret_key"])),
        "short nonce": ("InvalidArgument",
                        lambda n: auth_frame(n, transport, a["access_key"], a["secret_key"], client_nonce=b"1")),
    }
    for name, (code, make) in cases.items():
        with connect_raw(_url(anode, transport), 10) as s:
            nonce = _hello(s)
            get = raw_frame(p.Op.GET, p.encode(p.Get(BUCKET, KEY)), rid=9)
            s.sendall(make(nonce) + get)  # a GET pipelined behind the AUTH is never served
            try:
                _refused_and_closed(s, code)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_captured_auth_frame_does_not_work_on_another_connection(anode, keys, transport):
    a, _b = keys
    url = _url(anode, transport)
    with connect_raw(url, 10) as first:
        nonce = _hello(first)
        captured = auth_frame(nonce, transport, a["access_key"], a["secret_key"])
        first.sendall(captured)
        assert read_answer(first, time.monotonic() + 10) == ("ok", "")
        first.sendall(captured)  # again on the same connection: refused, closed
        _refused_and_closed(first, "ProtocolError")
    with connect_raw(url, 10) as second:
        _hello(second)
        second.sendall(captured + raw_frame(p.Op.HEAD, p.encode(p.Head(BUCKET, KEY)), rid=9))
        _refused_and_closed(second, "SignatureDoesNotMatch")
    with connect_raw(url, 10) as third:  # even without asking for its own nonce
        third.sendall(captured)
        _refused_and_closed(third, "SignatureDoesNotMatch")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_revoking_a_key_closes_its_open_connections_at_their_next_op(anode, admin, keys, transport):
    key = admin.key_create("alice")
    url = _url(anode, transport)
    c = Client(url, key["access_key"], key["secret_key"], connections=1)
    raw = connect_raw(url, 10)
    try:
        assert bytes(c.get(BUCKET, KEY)) == DATA
        authenticate_raw(raw, transport, key["access_key"], key["secret_key"])
        admin.key_revoke(key["access_key"])
        with pytest.raises(InvalidAccessKeyId):
            c.get(BUCKET, KEY)
        with pytest.raises(TransportError):  # the node closed the connection
            c.head(BUCKET, KEY)
        assert c.lost_connection
        raw.sendall(raw_frame(p.Op.LIST_BUCKETS, b"\x90"))
        _refused_and_closed(raw, "InvalidAccessKeyId")
        with pytest.raises(InvalidAccessKeyId):  # and no new connection
            Client(url, key["access_key"], key["secret_key"])
    finally:
        raw.close()
        c.close()


def test_credentials_come_from_arguments_then_environment_then_default():
    env = {"GPUFEED_ACCESS_KEY": "gk", "GPUFEED_SECRET_KEY": "gs",
           "AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "as"}
    c = resolve_credentials("x", "sekrit", env)
    assert (c.access_key, c.secret_key) == ("x", "sekrit") and "sekrit" not in repr(c)
    assert (resolve_credentials(environ=env).access_key, resolve_credentials(environ=env).secret_key) == ("gk", "gs")
    only_secret = resolve_credentials(environ={"GPUFEED_SECRET_KEY": "gs", **{k: v for k, v in env.items()
                                                                               if k.startswith("AWS")}})
    assert (only_secret.access_key, only_secret.secret_key) == (DEFAULT_ACCESS_KEY, "gs")  # as the node reads it
    aws = resolve_credentials(environ={k: v for k, v in env.items() if k.startswith("AWS")})
    assert (aws.access_key, aws.secret_key) == ("ak", "as")
    assert resolve_credentials(environ={"AWS_ACCESS_KEY_ID": "ak"}).access_key == DEFAULT_ACCESS_KEY
    d = resolve_credentials(environ={})
    assert (d.access_key, d.secret_key, d.source) == (DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY, "default")
    for bad in (("x", None), (None, "y"), ("", "y"), ("x", 3)):
        with pytest.raises(InvalidArgument):
            resolve_credentials(*bad, environ={})


def test_client_takes_keys_from_the_environment(anode, keys, monkeypatch):
    _a, b = keys
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", b["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", b["secret_key"])
    with Client(anode.tcp_url) as c:
        assert c.tenant == "bob"
    monkeypatch.setenv("GPUFEED_ACCESS_KEY", DEFAULT_ACCESS_KEY)  # GPUFEED_* wins over AWS_*
    with Client(anode.tcp_url) as c:
        assert c.tenant == "default"


def _fake_node(features: list[str], answer_auth: bool) -> tuple[socket.socket, threading.Thread]:
    """A node that answers HELLO with ``features`` and AUTH with a wrong proof."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while True:
                try:
                    hdr = _recv(conn, p.HEADER_SIZE)
                except (AssertionError, OSError):
                    return
                op, mlen, rid, _plen = p.unpack_header(hdr)
                _recv(conn, mlen)
                if op == p.Op.HELLO:
                    reply = p.encode(p.HelloReply("fake", 1, "tcp", features, b"n" * 32))
                elif op == p.Op.AUTH and answer_auth:
                    reply = p.encode(p.AuthReply("default", b"\0" * 32))
                else:
                    reply = p.encode(p.ListReply([], [], False))
                conn.sendall(p.pack_header(op | p.REPLY, len(reply), rid) + reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


def test_a_node_without_auth_is_refused_unless_allowed():
    srv, t = _fake_node(["versions"], answer_auth=False)
    port = srv.getsockname()[1]
    with pytest.raises(TransportError, match="allow_unauthenticated"):
        Client(f"gpufeed+tcp://127.0.0.1:{port}", connections=1)
    t.join(5)
    srv.close()
    srv, t = _fake_node(["versions"], answer_auth=False)
    port = srv.getsockname()[1]
    with Client(f"gpufeed+tcp://127.0.0.1:{port}", connections=1, allow_unauthenticated=True) as c:
        assert c.tenant is None and list(c.list("b")) == []
    t.join(5)
    srv.close()


def test_a_node_that_cannot_prove_the_secret_is_refused():
    srv, t = _fake_node(["auth", "versions"], answer_auth=True)
    port = srv.getsockname()[1]
    with pytest.raises(TransportError, match="proof"):
        Client(f"gpufeed+tcp://127.0.0.1:{port}", connections=1)
    t.join(5)
    srv.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_node_session_reconnects_with_the_same_key(anode, keys, transport):
    """``NodeSession`` (checkpoints, the KV tier, LMCache) replaces a client that
    lost its connection; the new one authenticates again with the keys given."""
    from gpufeed.ai._session import NodeSession

    a, _b = keys
    session = NodeSession(_url(anode, transport), replace_lost=True,
                          connect_kw={"access_key": a["access_key"], "secret_key": a["secret_key"]})
    try:
        first = session.require()
        assert first.tenant == "alice" and bytes(first.get(BUCKET, KEY)) == DATA
        for conn in first._conns:  # the connection dies (as when the node restarts)
            conn.sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 10
        while not first.lost_connection and time.monotonic() < deadline:
            time.sleep(0.01)
        second = session.require()
        assert second is not first and second.tenant == "alice"
        assert bytes(second.get(BUCKET, KEY)) == DATA
    finally:
        session.close()


def test_async_client_takes_keys(anode, keys):
    import asyncio

    from gpufeed.client import AsyncClient

    _a, b = keys

    async def main() -> tuple[str | None, list[str]]:
        async with await AsyncClient.connect(anode.shm_url, access_key=b["access_key"],
                                             secret_key=b["secret_key"]) as c:
            return c.sync.tenant, await c.list_buckets()

    assert asyncio.run(main()) == ("bob", ["bob-wire"])
