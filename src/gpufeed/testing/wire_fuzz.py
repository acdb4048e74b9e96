"""A bounded fuzzer for the fast path: malformed frames against a running node.

It sends a few thousand hostile frames, each on a connection of its own, over
TCP or the Unix (shm) socket, and checks what the node must do with bad input
(``docs/wire-protocol.md``, "Errors"): every complete frame gets an answer (a
reply or an error frame, never a silent close), no answer is ``InternalError``
(a malformed frame is the client's error), nothing hangs and the node does not
die. Cases are drawn from a seeded ``random.Random``, so a failure replays:

* headers: bad magic or version, metadata over the limit, unknown ops (reply
  ops and ``0xFF`` included), a payload on ops that carry none;
* metadata: random bytes, random msgpack values, the right shape with one field
  hostile (huge or negative integers, NaN, NUL/CR/LF, wrong types; object
  version ids and the governance bypass included), and bit flips or cuts of
  valid requests;
* PUT payloads shorter or longer than the request says;
* shm only: REGISTER with an empty memfd, an unsealed one, one smaller than
  claimed, a pipe, two descriptors; ALLOC_REGION of absurd sizes; descriptors
  on frames that take none;
* truncated frames (the client then closes): the node just ends the connection;
* authentication: each case runs on a connection that has authenticated
  (HELLO, then AUTH with the key given), except a share that does not: hostile
  AUTH requests (wrong proofs, nonces of the wrong size, unknown or absurd key
  ids, a proof replayed from another connection) and ops sent before AUTH,
  which the node must refuse (``AccessDenied`` and the like), then close.

Why our own: the frames are our own protocol, and a fuzzer that ships with the
package can be run against any node (``run_fuzz(url, ...)``).
"""

from __future__ import annotations

import hmac
import os
import random
import secrets
import select
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..config import DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY
from ..wire import protocol as p

__all__ = ["FuzzCase", "FuzzReport", "make_cases", "run_fuzz", "node_resources", "raw_frame",
           "read_answer", "connect_raw", "make_memfd", "CASE_RID", "authenticate_raw", "auth_frame"]

#: Request id of every fuzz frame (0 is what the node uses for connection-level errors).
CASE_RID = 7
_HOSTILE_INTS = [0, -1, 1, -(2**63), 2**63 - 1, 2**64 - 1, 2**31, -(2**31), 1 << 40, 255]
_HOSTILE_STRS = ["", "\x00", "a\r\nb", "..", "/", "k" * 2000, "\ufffd\u202e", "b\x00ucket", "UPPER", "bucket"]


@dataclass
class FuzzCase:
    """One hostile input.

    Attributes:
        name: what the case is (for reports).
        data: the bytes sent.
        fds: makes the descriptors sent with the first bytes (shm; the runner
            closes them), or ``None``.
        complete: ``data`` is whole frames, so the node must answer (else the
            runner closes its side after sending and only a prompt close is due).
        authenticated: the runner authenticates the connection before sending
            ``data`` (else ``data`` goes on a fresh connection, HELLO first when
            ``hello``).
        hello: send HELLO first on an unauthenticated case (``data`` may hold
            ``{nonce}``-free AUTH frames built by ``make``).
        make: builds ``data`` from the connection's server nonce (AUTH cases).
    """

    name: str
    data: bytes
    fds: Callable[[], list[int]] | None = None
    complete: bool = True
    authenticated: bool = True
    hello: bool = False
    make: Callable[[bytes], bytes] | None = None


@dataclass
class FuzzReport:
    """What a fuzz run saw.

    Attributes:
        cases: cases sent.
        answered: complete cases that got a reply or an error frame.
        codes: error codes received (``"ok"`` for a successful reply).
        internal: cases answered ``InternalError`` (name: message).
        hangs: cases with neither an answer nor a close within the timeout.
        unanswered: complete cases whose connection closed without an answer.
        unrefused: cases sent before authenticating (or with a bad AUTH) that
            were served, or whose connection stayed open.
        crashed: the node died during the run.
        seconds: wall time of the run.
    """

    cases: int = 0
    answered: int = 0
    codes: Counter = field(default_factory=Counter)
    internal: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    unrefused: list[str] = field(default_factory=list)
    crashed: bool = False
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        """No crash, hang, ``InternalError``, complete frame left unanswered, or
        unauthenticated request served."""
        return not (self.crashed or self.internal or self.hangs or self.unanswered or self.unrefused)


def raw_frame(op: int, meta: bytes, payload: bytes = b"", *, rid: int = CASE_RID,
              payload_len: int | None = None) -> bytes:
    """A request frame: header, ``meta`` (encoded metadata), ``payload``;
    ``payload_len`` overrides the length the header announces."""
    plen = len(payload) if payload_len is None else payload_len
    return p.pack_header(op, len(meta), rid, plen) + meta + payload


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-encodable value, hostile where it can be."""
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return rng.choice(_HOSTILE_INTS)
    if kind == 1:
        return rng.choice([float("nan"), float("inf"), -0.0, 1e308, 0.5])
    if kind == 2:
        return rng.choice(_HOSTILE_STRS)
    if kind == 3:
        return rng.randbytes(rng.randrange(0, 32))
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5:
        return rng.randrange(-5, 1 << 20)
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 8))]
    if kind == 7:
        return {str(_value(rng, depth + 1))[:20]: _value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    return [[_value(rng, depth + 2) for _ in range(rng.randrange(0, 8))] for _ in range(rng.randrange(0, 4))]


def _valid(rng: random.Random, op: int) -> list[Any]:
    """A well-formed request array of ``op`` (fields as the spec orders them)."""
    b, k = rng.choice(["fuzz", "nobucket"]), rng.choice(["k", "missing", "a/b"])
    vid = rng.choice([None, "null", "0" * 32])  # an object version (the current one for None)
    get: list[Any] = [b, k, rng.randrange(0, 64), rng.choice([-1, 0, 8]), -1, 0, 0, vid]
    requests: dict[int, list[Any]] = {
        p.Op.HELLO: ["fuzz", 1], p.Op.REGISTER: [1, 4096], p.Op.UNREGISTER: [1, False],
        p.Op.ALLOC_REGION: [1, 4096], p.Op.FORKED: [], p.Op.HEAD: [b, k, vid], p.Op.GET: get,
        p.Op.GETV: [[get, get]], p.Op.PUT: [b, k, 4, -1, 0, None, {}],
        p.Op.DELETE: [b, k, vid, rng.choice([False, True])],
        p.Op.LIST: [b, "", "", None, 10, ""], p.Op.CREATE_BUCKET: [b], p.Op.LIST_BUCKETS: [],
        p.Op.DELETE_BUCKET: ["nobucket"], p.Op.BUCKET_STATS: [b], p.Op.MAP: [b, k, vid],
        p.Op.MAP_EXTENTS: [b, k, vid], p.Op.CHUNK: [rng.choice(["0" * 32, "", "k" * 300])],
        p.Op.CHUNK_PUT: [rng.choice(["0" * 32, "", "../x"]), 0, []],
        p.Op.AUTH: [DEFAULT_ACCESS_KEY, rng.randbytes(32), rng.randbytes(32)],
        p.Op.GETR: [b, k, rng.randbytes(8 * rng.randrange(0, 4)), rng.randbytes(4 * rng.randrange(0, 4)),
                    -1, 0, vid],
        p.Op.LOCATE: [b, k, vid],
        p.Op.LEASE: [b, k, vid],
        p.Op.PART: [rng.choice(["put", "get", "drop", "has", "x"]), b, k, rng.choice(["0" * 32, "../x"]),
                    [rng.choice(["00001." + "0" * 32, "../x"])], 0, ""],
    }
    return requests[op]


def _meta_case(rng: random.Random, ops: list[int]) -> FuzzCase:
    """A complete frame of a known op whose metadata is hostile."""
    op = rng.choice(ops)
    style = rng.randrange(5)
    if style == 0:
        meta, name = rng.randbytes(rng.randrange(0, 48)), "random bytes"
    elif style == 1:
        meta, name = msgspec.msgpack.encode(_value(rng)), "random value"
    elif style == 2:
        fields = _valid(rng, op)
        if fields:
            fields[rng.randrange(len(fields))] = _value(rng)
        meta, name = msgspec.msgpack.encode(fields), "one field hostile"
    elif style == 3:
        flipped = bytearray(msgspec.msgpack.encode(_valid(rng, op)))
        for _ in range(rng.randrange(1, 4)):
            if flipped:
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        meta, name = bytes(flipped), "bit flips"
    else:
        whole = msgspec.msgpack.encode(_valid(rng, op))
        meta, name = whole[: rng.randrange(0, max(1, len(whole)))], "cut metadata"
    payload = b""
    if op == p.Op.PUT:
        try:
            req = p.decode(p.Put, meta)
            if req.region == -1 and 0 <= req.length <= 64:
                payload = b"x" * req.length  # a streamed PUT: its bytes follow
        except Exception:  # noqa: BLE001 - malformed on purpose; the node answers it
            pass
    return FuzzCase(f"{p.Op(op).name}: {name}", raw_frame(op, meta, payload))


def _header_case(rng: random.Random, max_meta: int) -> FuzzCase:
    """A frame whose header is hostile."""
    style = rng.randrange(5)
    meta = msgspec.msgpack.encode(["fuzz", 1])
    if style == 0:
        return FuzzCase("bad magic", rng.choice([b"XX", b"gf", b"\0\0"]) + bytes(22))
    if style == 1:
        return FuzzCase("bad version", p.MAGIC + bytes([rng.choice([0, 2, 255])]) + bytes(21))
    if style == 2:
        claim = rng.choice([max_meta + 1, p.MAX_META + 1, 2**32 - 1])
        return FuzzCase("metadata over the limit", p.HEADER.pack(p.MAGIC, p.VERSION, 1, claim, 1, 0))
    if style == 3:
        op = rng.choice([0, 7, 9, 21, 127, 0x81, 0x8B, 0xFE, p.ERROR_OP])
        return FuzzCase(f"unknown op {op}", raw_frame(op, meta))
    op = rng.choice([p.Op.HELLO, p.Op.HEAD, p.Op.GET, p.Op.LIST_BUCKETS])
    fields = _valid(rng, op)
    return FuzzCase("payload on an op without one",
                    raw_frame(op, msgspec.msgpack.encode(fields), b"zz"))


def _put_case(rng: random.Random) -> FuzzCase:
    """A streamed PUT whose payload disagrees with its length."""
    length = rng.randrange(0, 16)
    sent = length + rng.choice([-1, 1, 5]) if length else 3
    meta = msgspec.msgpack.encode(["fuzz", "k", length])
    return FuzzCase("PUT payload length mismatch", raw_frame(p.Op.PUT, meta, b"y" * max(0, sent)))


def _truncated_case(rng: random.Random) -> FuzzCase:
    """Part of a frame, then the client closes."""
    whole = raw_frame(p.Op.HEAD, msgspec.msgpack.encode(["fuzz", "k"]))
    cut = rng.randrange(1, len(whole))
    return FuzzCase(f"truncated at {cut} of {len(whole)}", whole[:cut], complete=False)


def auth_frame(server_nonce: bytes, transport: str, access_key: str = DEFAULT_ACCESS_KEY,
               secret_key: str = DEFAULT_SECRET_KEY, *, client_nonce: bytes | None = None,
               rid: int = CASE_RID) -> bytes:
    """A valid AUTH frame for a connection whose HELLO reply carried ``server_nonce``."""
    nonce = secrets.token_bytes(32) if client_nonce is None else client_nonce
    proof = p.auth_proof(p.auth_key(secret_key), "client", transport, access_key, server_nonce, nonce)
    return raw_frame(p.Op.AUTH, p.encode(p.Auth(access_key, nonce, proof)), rid=rid)


def _hello(sock: socket.socket, deadline: float) -> bytes:
    """Send HELLO; the server nonce of its reply.

    Raises:
        ConnectionError: the node answered with an error or closed.
        TimeoutError: no answer by ``deadline``.
    """
    sock.sendall(raw_frame(p.Op.HELLO, p.encode(p.Hello("fuzz")), rid=1))
    hdr = _recv_exact(sock, p.HEADER_SIZE, deadline)
    if hdr is None:
        raise ConnectionError("the node closed the connection after HELLO")
    op, meta_len, _rid, _plen = p.unpack_header(hdr)
    meta = _recv_exact(sock, meta_len, deadline) if meta_len else b""
    if meta is None or op != p.Op.HELLO | p.REPLY:
        raise ConnectionError("HELLO was not answered")
    return p.decode(p.HelloReply, meta).nonce


def authenticate_raw(sock: socket.socket, transport: str, access_key: str = DEFAULT_ACCESS_KEY,
                     secret_key: str = DEFAULT_SECRET_KEY, timeout_s: float = 10.0) -> str:
    """HELLO and AUTH on a raw socket (as the SDK does); the tenant of the key.

    Args:
        sock: a fresh connection to the node.
        transport: ``"tcp"`` or ``"shm"``.
        access_key, secret_key: the key (default: the node's built-in one).
        timeout_s: seconds for both answers.

    Raises:
        ConnectionError: the node refused (the message has its error code).
        TimeoutError: no answer in time.
    """
    deadline = time.monotonic() + timeout_s
    nonce = _hello(sock, deadline)
    client_nonce = secrets.token_bytes(32)
    sock.sendall(auth_frame(nonce, transport, access_key, secret_key, client_nonce=client_nonce, rid=2))
    hdr = _recv_exact(sock, p.HEADER_SIZE, deadline)
    if hdr is None:
        raise ConnectionError("the node closed the connection after AUTH")
    op, meta_len, _rid, _plen = p.unpack_header(hdr)
    meta = _recv_exact(sock, meta_len, deadline) or b""
    if op == p.ERROR_OP:
        err = p.decode(p.ErrorReply, meta)
        raise ConnectionError(f"{err.code}: {err.message}")
    reply = p.decode(p.AuthReply, meta)
    want = p.auth_proof(p.auth_key(secret_key), "server", transport, access_key, nonce, client_nonce)
    if not hmac.compare_digest(want, reply.proof):
        raise ConnectionError("the node's AUTH proof is wrong")
    return reply.tenant


def _auth_case(rng: random.Random, transport: str) -> FuzzCase:
    """A case on a connection that has not authenticated: a hostile AUTH, or an
    op before AUTH; the node must refuse it and close."""
    style = rng.randrange(6)
    nonce, mine = rng.randbytes(32), rng.randbytes(32)
    if style == 0:
        op = rng.choice([o for o in sorted(p.REQUEST_TYPES) if o not in (p.Op.HELLO, p.Op.AUTH)])
        meta = msgspec.msgpack.encode(_valid(rng, op))
        payload = b"x" * 4 if op == p.Op.PUT else b""
        return FuzzCase(f"{p.Op(op).name} before AUTH", raw_frame(op, meta, payload),
                        authenticated=False, hello=rng.random() < 0.5)
    if style == 1:
        return FuzzCase("AUTH with a wrong secret", b"", authenticated=False, hello=True,
                        make=lambda sn: auth_frame(sn, transport, secret_key="not-the-secret", client_nonce=mine))
    if style == 2:
        key = rng.choice(["", "GFNOSUCHKEY", "k" * 5000, "\x00", DEFAULT_ACCESS_KEY + "x"])
        return FuzzCase("AUTH with an unknown key", b"", authenticated=False, hello=True,
                        make=lambda sn: auth_frame(sn, transport, access_key=key, client_nonce=mine))
    if style == 3:
        size = rng.choice([0, 1, 15, 65, 4096])
        return FuzzCase(f"AUTH with a {size}-byte client nonce", b"", authenticated=False, hello=True,
                        make=lambda sn: auth_frame(sn, transport, client_nonce=bytes(size)))
    if style == 4:  # a proof made for another connection's nonce
        return FuzzCase("AUTH replayed from another connection",
                        auth_frame(nonce, transport, client_nonce=mine), authenticated=False, hello=True)
    fields = [rng.choice([DEFAULT_ACCESS_KEY, _value(rng)]), _value(rng), _value(rng)]
    return FuzzCase("AUTH: hostile fields", raw_frame(p.Op.AUTH, msgspec.msgpack.encode(fields)),
                    authenticated=False, hello=rng.random() < 0.5)


def make_memfd(size: int, seal: bool = True) -> int:
    """A memfd of ``size`` bytes, sealed against shrinking unless ``seal`` is False
    (the caller closes it)."""
    fd = os.memfd_create("gpufeed-fuzz", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def _pipe() -> list[int]:
    r, w = os.pipe()
    os.close(w)
    return [r]


def _shm_case(rng: random.Random) -> FuzzCase:
    """A region request with hostile descriptors or sizes (shm only)."""
    style = rng.randrange(7)
    size = rng.choice([0, 1, 4096, -1, 2**62, 2**63 - 1])
    reg = msgspec.msgpack.encode([1, size if style != 0 else 0])
    if style == 0:
        return FuzzCase("REGISTER an empty memfd", raw_frame(p.Op.REGISTER, reg), lambda: [make_memfd(0)])
    if style == 1:
        return FuzzCase("REGISTER an unsealed memfd",
                        raw_frame(p.Op.REGISTER, msgspec.msgpack.encode([1, 4096])),
                        lambda: [make_memfd(4096, False)])
    if style == 2:
        return FuzzCase(f"REGISTER size {size} of a 4 KiB memfd", raw_frame(p.Op.REGISTER, reg),
                        lambda: [make_memfd(4096)])
    if style == 3:
        return FuzzCase("REGISTER a pipe", raw_frame(p.Op.REGISTER, msgspec.msgpack.encode([1, 4096])), _pipe)
    if style == 4:
        return FuzzCase("REGISTER with two memfds", raw_frame(p.Op.REGISTER, msgspec.msgpack.encode([1, 4096])),
                        lambda: [make_memfd(4096), make_memfd(4096)])
    if style == 5:
        return FuzzCase(f"ALLOC_REGION size {size}", raw_frame(p.Op.ALLOC_REGION, msgspec.msgpack.encode([1, size])))
    return FuzzCase("descriptor with HEAD", raw_frame(p.Op.HEAD, msgspec.msgpack.encode(["fuzz", "k"])),
                    lambda: [make_memfd(16)])


def make_cases(n: int, *, shm: bool, seed: int = 0, max_meta: int = p.MAX_META) -> list[FuzzCase]:
    """``n`` hostile cases (the same ones for the same arguments).

    Args:
        n: cases.
        shm: include descriptor-passing cases (the Unix socket only).
        seed: seed of the generator.
        max_meta: the node's metadata limit, bytes (to claim just past it).
    """
    rng = random.Random(seed)
    ops = sorted(p.REQUEST_TYPES)
    out: list[FuzzCase] = []
    for _ in range(n):
        roll = rng.random()
        if rng.random() < 0.1:
            out.append(_auth_case(rng, "shm" if shm else "tcp"))
        elif shm and roll < 0.12:
            out.append(_shm_case(rng))
        elif roll < 0.25:
            out.append(_header_case(rng, max_meta))
        elif roll < 0.30:
            out.append(_put_case(rng))
        elif roll < 0.35:
            out.append(_truncated_case(rng))
        else:
            out.append(_meta_case(rng, ops))
    return out


def connect_raw(url: str, timeout_s: float) -> socket.socket:
    """A plain socket to a ``gpufeed+tcp://`` or ``gpufeed+shm://`` URL.

    Raises:
        OSError: the connection failed.
    """
    if url.startswith("gpufeed+tcp://"):
        host, port = url[len("gpufeed+tcp://"):].rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=timeout_s)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(url[len("gpufeed+shm://"):])
    except OSError:
        sock.close()
        raise
    return sock


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    """``n`` bytes, or ``None`` on EOF; descriptors that come along are closed.

    Raises:
        TimeoutError: ``deadline`` passed.
    """
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise TimeoutError
        try:
            data, anc, _flags, _addr = sock.recvmsg(n - len(buf), socket.CMSG_SPACE(16 * 4))
        except (ConnectionResetError, BrokenPipeError):
            return None
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                for i in range(0, len(cdata) - len(cdata) % 4, 4):
                    os.close(int.from_bytes(cdata[i:i + 4], "little"))
        if not data:
            return None
        buf += data
    return bytes(buf)


def read_answer(sock: socket.socket, deadline: float) -> tuple[str, str] | None:
    """The next reply frame: ``(code or "ok", message)`` (a payload is left
    unread); ``None`` when the node closed the connection first.

    Raises:
        TimeoutError: no answer and no close by ``deadline``.
    """
    hdr = _recv_exact(sock, p.HEADER_SIZE, deadline)
    if hdr is None:
        return None
    op, meta_len, _rid, _plen = p.unpack_header(hdr)
    meta = _recv_exact(sock, meta_len, deadline) if meta_len else b""
    if meta is None:
        return None
    if op == p.ERROR_OP:
        err = p.decode(p.ErrorReply, meta)
        return err.code, err.message
    return "ok", ""


def _run_case(url: str, case: FuzzCase, timeout_s: float, report: FuzzReport,
              creds: tuple[str, str]) -> None:
    try:
        sock = connect_raw(url, timeout_s)
    except OSError as exc:
        report.hangs.append(f"{case.name}: cannot connect ({exc})")
        return
    fds: list[int] = []
    transport = "tcp" if url.startswith("gpufeed+tcp://") else "shm"
    try:
        deadline = time.monotonic() + timeout_s
        try:
            if case.authenticated:
                authenticate_raw(sock, transport, *creds, timeout_s=timeout_s)
            elif case.hello or case.make:
                nonce = _hello(sock, deadline)
                if case.make:
                    case = FuzzCase(case.name, case.make(nonce), authenticated=False)
        except (OSError, TimeoutError) as exc:
            report.hangs.append(f"{case.name}: the handshake failed ({exc})")
            return
        fds = case.fds() if case.fds else []
        try:
            if fds:
                socket.send_fds(sock, [case.data], fds)
            else:
                sock.sendall(case.data)
            if not case.complete:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the node may close early (e.g. after a bad header); its answer is still read
        try:
            got = read_answer(sock, deadline)
        except TimeoutError:
            report.hangs.append(case.name)
            return
        except Exception as exc:  # noqa: BLE001 - a reply the protocol cannot parse
            report.internal.append(f"{case.name}: unparseable reply ({exc})")
            return
        if got is None:
            if case.complete:
                report.unanswered.append(case.name)
            return
        code, message = got
        report.codes[code] += 1
        report.answered += case.complete
        if code == "InternalError":
            report.internal.append(f"{case.name}: {message}")
        if not case.authenticated:
            _check_refused(sock, case, code, deadline, report)
    finally:
        for fd in fds:
            os.close(fd)
        sock.close()


def _check_refused(sock: socket.socket, case: FuzzCase, code: str, deadline: float,
                   report: FuzzReport) -> None:
    """An unauthenticated case must be refused and its connection closed."""
    if code == "ok":
        report.unrefused.append(case.name)
        return
    try:
        while read_answer(sock, deadline) is not None:
            pass
    except TimeoutError:
        report.unrefused.append(f"{case.name}: the connection stayed open")
    except Exception:  # noqa: BLE001 - a reset is a close too
        pass


def _setup(url: str, timeout_s: float, creds: tuple[str, str]) -> None:
    """Bucket ``fuzz`` with object ``k`` (64 bytes), so cases reach past lookups."""
    frames = [raw_frame(p.Op.CREATE_BUCKET, msgspec.msgpack.encode(["fuzz"]), rid=1),
              raw_frame(p.Op.PUT, msgspec.msgpack.encode(["fuzz", "k", 64]), b"v" * 64, rid=2)]
    with connect_raw(url, timeout_s) as sock:
        authenticate_raw(sock, "tcp" if url.startswith("gpufeed+tcp://") else "shm", *creds,
                         timeout_s=timeout_s)
        for frame in frames:
            sock.sendall(frame)
            read_answer(sock, time.monotonic() + timeout_s)  # BucketAlreadyOwnedByYou is fine


def run_fuzz(url: str, n: int = 2000, *, seed: int = 0, timeout_s: float = 10.0,
             node_pid: int | None = None, max_meta: int = p.MAX_META,
             access_key: str = DEFAULT_ACCESS_KEY, secret_key: str = DEFAULT_SECRET_KEY) -> FuzzReport:
    """Send ``n`` hostile cases to the node at ``url``, one connection each.

    Args:
        url: ``gpufeed+tcp://HOST:PORT`` or ``gpufeed+shm:///path/gpufeed.sock``.
        n: cases.
        seed: seed of the cases (:func:`make_cases`).
        timeout_s: seconds a case may wait for its answer (or the close).
        node_pid: the node's pid, to notice a crash (stops the run).
        max_meta: the node's metadata limit, bytes.
        access_key, secret_key: the key authenticated cases use (default: the
            node's built-in one).

    Returns:
        The report; :attr:`FuzzReport.clean` is what a healthy node gives.
    """
    started = time.monotonic()
    creds = (access_key, secret_key)
    _setup(url, timeout_s, creds)
    cases = make_cases(n, shm=url.startswith("gpufeed+shm://"), seed=seed, max_meta=max_meta)
    report = FuzzReport()
    for i, case in enumerate(cases):
        _run_case(url, case, timeout_s, report, creds)
        report.cases += 1
        if node_pid is not None and i % 50 == 0 and not _alive(node_pid):
            report.crashed = True
            break
    if node_pid is not None and not _alive(node_pid):
        report.crashed = True
    report.seconds = time.monotonic() - started
    return report


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def node_resources(pid: int) -> dict[str, int]:
    """A process's resident memory (``rss_bytes``), ``threads`` and open ``fds``
    (from ``/proc``; Linux)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    values = dict(line.split(":", 1) for line in status if ":" in line)
    return {
        "rss_bytes": int(values["VmRSS"].split()[0]) * 1024,
        "threads": int(values["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }
