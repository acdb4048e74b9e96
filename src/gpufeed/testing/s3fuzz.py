"""A bounded fuzz of a node's S3 port with malformed and hostile HTTP requests.

:func:`fuzz_cases` makes a deterministic list of cases from a seed: broken
request lines and header blocks, binary garbage, requests cut short, signed
requests carrying hostile values (control characters in ``response-*``
overrides, broken percent-encoding, bad XML, bad digests, bad ranges), and
random byte mutations of valid signed requests. :func:`run_fuzz` sends each
case on its own connection and reads one response, and
:class:`FuzzReport` says what came back: every complete request must be
answered, never with 500 ``InternalError``, nothing may hang,
and a request cut short may only be closed or refused.

Usage (also ``python -m gpufeed.testing.s3fuzz URL ACCESS_KEY SECRET_KEY``)::

    report = run_fuzz("http://127.0.0.1:9000", "gpufeed", "gpufeed-secret-key", cases=3000)
    assert report.ok, report.summary()

Source: RFC 9112 (HTTP/1.1 message syntax) for what must be answered.
"""

from __future__ import annotations

import random
import re
import socket
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

__all__ = ["FuzzCase", "FuzzResult", "FuzzReport", "fuzz_cases", "run_fuzz"]


@dataclass(frozen=True)
class FuzzCase:
    """One request as bytes on the wire.

    Attributes:
        kind: the generator that made it (for the report).
        data: the bytes sent.
        complete: the bytes hold a complete request (head and announced
            body), so an answer is owed. An incomplete one may be answered
            (400 RequestTimeout once the node's header or body timeout passes)
            or closed, but not left hanging.
        half_close: the client shuts its sending side after the bytes (then the
            node may close at once without answering).
    """

    kind: str
    data: bytes
    complete: bool = True
    half_close: bool = False


@dataclass
class FuzzResult:
    """What one case got back.

    Attributes:
        case: the case.
        status: the HTTP status of the first final response, or None.
        internal: the response was a 500 or named ``InternalError`` (501
            NotImplemented and 503 SlowDown are answers, not failures).
        hung: no response and no close within the timeout.
        seconds: time from connect to answer or close.
        request_id: the response carried ``x-amz-request-id`` (False without a response).
        send_s: time from connect to the last byte handed to the kernel,
            seconds (a client thread starved of CPU can take longer than the
            node's header timeout, and the node then rightly closes a
            connection that sent nothing).
    """

    case: FuzzCase
    status: int | None
    internal: bool
    hung: bool
    seconds: float
    request_id: bool = False
    send_s: float = 0.0


@dataclass
class FuzzReport:
    """All results of one run.

    Attributes:
        results: one per case.
        seconds: wall time of the run.
        idle_close_s: the node's S3 header timeout, seconds, when known: a
            case whose bytes left the client only after it (:attr:`late`) may
            be closed unanswered, as any connection idle that long is.
    """

    results: list[FuzzResult] = field(default_factory=list)
    seconds: float = 0.0
    idle_close_s: float | None = None

    def _late(self, r: FuzzResult) -> bool:
        # the node's timer starts after the client's connect returned, so bytes sent
        # before the timeout (less a margin for the loop's timer granularity) were
        # in its socket when it fired, and are read before the timer runs
        return self.idle_close_s is not None and r.send_s >= 0.95 * self.idle_close_s

    @property
    def hangs(self) -> list[FuzzResult]:
        """Cases that neither got an answer nor saw the connection close in time."""
        return [r for r in self.results if r.hung]

    @property
    def internal_errors(self) -> list[FuzzResult]:
        """Cases answered 500 / InternalError."""
        return [r for r in self.results if r.internal]

    @property
    def unanswered(self) -> list[FuzzResult]:
        """Complete requests, sent within the node's header timeout, whose
        connection closed without any response."""
        return [r for r in self.results
                if r.case.complete and r.status is None and not r.hung and not self._late(r)]

    @property
    def late(self) -> list[FuzzResult]:
        """Cases closed unanswered whose bytes left the client only after the
        node's header timeout (the client was starved, not the node wrong)."""
        return [r for r in self.results if r.status is None and not r.hung and self._late(r)]

    @property
    def without_request_id(self) -> list[FuzzResult]:
        """Responses that carried no ``x-amz-request-id``."""
        return [r for r in self.results if r.status is not None and not r.request_id]

    @property
    def ok(self) -> bool:
        """No hang, no internal error, every complete request answered, every answer with a request id."""
        return not (self.hangs or self.internal_errors or self.unanswered or self.without_request_id)

    def summary(self) -> str:
        """One paragraph: counts by status and by failure, with a few examples."""
        statuses = Counter(r.status for r in self.results)
        lines = [f"{len(self.results)} cases in {self.seconds:.1f} s; statuses "
                 f"{dict(sorted(statuses.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))}",
                 f"hangs {len(self.hangs)}, internal errors {len(self.internal_errors)}, "
                 f"unanswered {len(self.unanswered)}, without request id {len(self.without_request_id)}, "
                 f"sent after the header timeout (closed unanswered) {len(self.late)}"]
        for name in ("hangs", "internal_errors", "unanswered", "without_request_id", "late"):
            for r in getattr(self, name)[:3]:
                lines.append(f"  {name}: {r.case.kind} (sent in {r.send_s:.3f} s, closed after "
                             f"{r.seconds:.3f} s): {r.case.data[:160]!r}")
        return "\n".join(lines)


# -- generating cases ---------------------------------------------------------------------
class _Signer(S3SigV4Auth):
    """SigV4 over the path exactly as given, with an unsigned payload."""

    def payload(self, request):
        return "UNSIGNED-PAYLOAD"

    def _normalize_url_path(self, path):
        return path


def _signed(host: str, creds: Credentials, method: str, target: str, body: bytes = b"",
            headers: dict[str, str] | None = None) -> bytes:
    """A complete signed request (``Connection: close``) as bytes."""
    req = AWSRequest(method=method, url=f"http://{host}{target}", data=body, headers=dict(headers or {}))
    req.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    _Signer(creds, "s3", "us-east-1").add_auth(req)
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in req.headers.items() if k.lower() != "host"]
    if body or method in ("PUT", "POST"):
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body


_BAD_VALUES = ["a%0D%0Ab", "%00", "%0A", "%01%02", "%7F", "%", "%zz", "%C3%28", "a" * 3000, "-1",
               "99999999999999999999", "%E2%80%A8", "..%2F..%2Fetc"]
_QUERIES = ["response-content-type", "response-content-disposition", "response-expires", "max-keys",
            "prefix", "delimiter", "marker", "continuation-token", "start-after", "partNumber", "uploadId",
            "max-parts", "part-number-marker", "encoding-type", "list-type", "versionId", "X-Amz-Expires"]


def _hostile_signed(rnd: random.Random, host: str, creds: Credentials, bucket: str) -> FuzzCase:
    method = rnd.choice(["GET", "HEAD", "PUT", "POST", "DELETE"])
    key = rnd.choice(["k", "a/b", "%00", "%0D%0A", "..%2F..", "x" * 1100, "%FF%FE", "sp%20ace", ""])
    params = [f"{rnd.choice(_QUERIES)}={rnd.choice(_BAD_VALUES)}" for _ in range(rnd.randint(0, 3))]
    params += rnd.sample(["uploads", "delete", "acl", "tagging", "versions", "location", "cors"], rnd.randint(0, 1))
    target = f"/{bucket}/{key}" + (("?" + "&".join(params)) if params else "")
    headers: dict[str, str] = {}
    for name, values in (("Range", ["bytes=5-1", "bytes=-0", "bytes=a-b", "bytes=99999999999-", "items=0-1"]),
                         ("Content-MD5", ["zz", "AAAA", "1B2M2Y8AsgTpgAmY7PhCfg=="]),
                         ("x-amz-meta-m", ["v" * 3000, "\t", "\u00e9"]),
                         ("If-Match", ['"x"', "*", ""]),
                         ("x-amz-copy-source", ["/nobucket/k", "%00", "/" + bucket]),
                         ("x-amz-checksum-crc32", ["AAAAAA==", "notb64"]),
                         ("Content-Encoding", ["aws-chunked", "gzip"])):
        if rnd.random() < 0.15:
            headers[name] = rnd.choice(values)
    body = b""
    if method in ("PUT", "POST"):
        body = rnd.choice([b"", b"<Delete><Object></Object></Delete>", b"<not xml", b"x" * 100,
                           b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part>"
                           b"</CompleteMultipartUpload>", b"5\r\nhello\r\n0\r\n\r\n"])
    data = _signed(host, creds, method, target, body, headers)
    return FuzzCase("hostile-signed", data)


def _mutated(rnd: random.Random, data: bytes) -> FuzzCase:
    buf = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        pos = rnd.randrange(len(buf))
        op = rnd.random()
        if op < 0.4:
            buf[pos] = rnd.randrange(256)
        elif op < 0.7:
            buf[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        else:
            del buf[pos:pos + rnd.randint(1, 8)]
    out = bytes(buf)
    return FuzzCase("mutated", out, complete=_complete(out))


def _complete(data: bytes) -> bool:
    """Whether ``data`` holds a whole request: a head and the body it announces."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    head, body = data[:end].lower(), data[end + 4:]
    if b"transfer-encoding" in head:
        return body.endswith(b"0\r\n\r\n")
    match = re.search(rb"\ncontent-length:[ \t]*([0-9]+)[ \t]*(?:\r|$)", head)
    return match is None or len(body) >= int(match.group(1))


_LINES = [b"GET / HTTP/9.9", b"GET / HTTP/1", b"GET / HTTP/1.1x", b"GET /", b"GET", b" / HTTP/1.1",
          b"G\x00T / HTTP/1.1", b"GET /\x01 HTTP/1.1", b"GET / \x00HTTP/1.1", b"\xff\xfe / HTTP/1.1",
          b"GET http://[::1 HTTP/1.1", b"CONNECT x:1 HTTP/1.1", b"PRI * HTTP/2.0", b"GET * HTTP/1.1",
          b"GET /" + b"a" * (70 << 10) + b" HTTP/1.1", b"GET /%ZZ HTTP/1.1", b"OPTIONS * HTTP/1.1",
          b"TRACE / HTTP/1.1", b"BREW / HTTP/1.1", b"GET /?" + b"&" * 5000 + b" HTTP/1.1"]
_HEADERS = [b"Host: x", b"Bad Header", b"X: a\x00b", b"X: a\x01b", b"X:" + b"y" * (70 << 10), b" folded: x",
            b"Content-Length: -1", b"Content-Length: abc", b"Content-Length: 1\r\nContent-Length: 2",
            b"Transfer-Encoding: chunked\r\nContent-Length: 3", b"Transfer-Encoding: gzip, chunked",
            b"Transfer-Encoding: identity", b"Expect: 100-continue", b"Expect: nonsense", b": novalue",
            b"Authorization: AWS4-HMAC-SHA256 Credential=/", b"Authorization: garbage",
            b"x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD", b"Host: a\r\nHost: b",
            b"Upgrade: websocket\r\nConnection: Upgrade", b"Content-Encoding: aws-chunked"]


def _malformed(rnd: random.Random) -> FuzzCase:
    line = rnd.choice(_LINES) if rnd.random() < 0.6 else b"GET /b/k HTTP/1.1"
    heads = rnd.sample(_HEADERS, rnd.randint(0, 3))
    if rnd.random() < 0.1:
        heads += [b"X-%d: v" % i for i in range(200)]
    body = rnd.choice([b"", b"zz\r\n", b"5\r\nhello\r\n0\r\n\r\n", b"abc"])
    data = line + b"\r\n" + b"".join(h + b"\r\n" for h in heads) + b"\r\n" + body
    return FuzzCase("malformed", data, complete=_complete(data))


def fuzz_cases(host: str, access_key: str, secret_key: str, *, cases: int = 3000, seed: int = 0,
               bucket: str = "fuzz") -> list[FuzzCase]:
    """A deterministic list of ``cases`` hostile requests for the node at ``host``.

    Args:
        host: ``HOST:PORT`` of the S3 port (the signed ``Host`` header).
        access_key, secret_key: credentials the node accepts (signed cases
            must get past authentication to reach the handlers).
        cases: how many.
        seed: the random seed.
        bucket: the bucket signed cases address (create it first).
    """
    rnd = random.Random(seed)
    creds = Credentials(access_key, secret_key)
    out: list[FuzzCase] = []
    while len(out) < cases:
        pick = rnd.random()
        if pick < 0.3:
            out.append(_malformed(rnd))
        elif pick < 0.55:
            out.append(_hostile_signed(rnd, host, creds, bucket))
        elif pick < 0.8:
            out.append(_mutated(rnd, _hostile_signed(rnd, host, creds, bucket).data))
        elif pick < 0.9:
            n = rnd.randint(1, 512)
            out.append(FuzzCase("garbage", bytes(rnd.randrange(256) for _ in range(n)) + b"\r\n\r\n"))
        else:
            full = _hostile_signed(rnd, host, creds, bucket).data
            head_end = full.index(b"\r\n\r\n")
            cut = rnd.randrange(1, head_end + 3)
            out.append(FuzzCase("truncated", full[:cut], complete=False, half_close=rnd.random() < 0.5))
    return out


# -- running them --------------------------------------------------------------------------
def _read_response(sock: socket.socket, head_only: bool) -> tuple[int | None, bytes]:
    """The status and bytes of the first final response (None: closed before one came)."""
    buf = b""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            status_line = buf.split(b"\r\n", 1)[0].split(b" ")
            status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
            if 100 <= status < 200:  # interim (100 Continue): the final one follows
                buf = buf[end + 4:]
                continue
            head = buf[:end].lower()
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if head_only or status in (204, 304) or len(buf) >= end + 4 + length:
                return status, buf
        chunk = sock.recv(65536)
        if not chunk:
            return None, buf
        buf += chunk


def _run_one(case: FuzzCase, addr: tuple[str, int], timeout_s: float) -> FuzzResult:
    t0 = time.monotonic()
    sock = socket.create_connection(addr, timeout=timeout_s)
    connected = time.monotonic()
    send_s = 0.0
    status: int | None = None
    body = b""
    hung = False
    try:
        try:
            sock.sendall(case.data)
            if case.half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the node answered and closed early (e.g. a line over the limit): read the answer
        send_s = time.monotonic() - connected
        try:
            status, body = _read_response(sock, head_only=case.data.startswith(b"HEAD "))
        except (ConnectionResetError, BrokenPipeError):
            status = None
        except TimeoutError:
            hung = True
    finally:
        sock.close()
    internal = status == 500 or b"<Code>InternalError" in body
    head = body.split(b"\r\n\r\n", 1)[0].lower()
    return FuzzResult(case, status, internal, hung, time.monotonic() - t0,
                      request_id=b"\r\nx-amz-request-id:" in head, send_s=send_s)


def run_fuzz(s3_url: str, access_key: str, secret_key: str, *, cases: int = 3000, seed: int = 0,
             concurrency: int = 8, timeout_s: float = 10.0, bucket: str = "fuzz",
             idle_close_s: float | None = None) -> FuzzReport:
    """Send :func:`fuzz_cases` to ``s3_url``, ``concurrency`` at a time, one connection each.

    Args:
        s3_url: ``http://HOST:PORT`` of the node.
        access_key, secret_key: its credentials.
        cases, seed, bucket: as for :func:`fuzz_cases`.
        concurrency: connections in flight.
        timeout_s: seconds a case may go without an answer or a close before it
            counts as a hang: keep it above the node's S3 header and body
            timeouts (start the node with short ones for a quick run).
        idle_close_s: the node's S3 header timeout, seconds: a case the client
            could send only after it (a starved client thread) is reported as
            :attr:`FuzzReport.late`, not unanswered. None: every complete
            request must be answered.

    Returns:
        The report (check :attr:`FuzzReport.ok`).
    """
    parts = urlsplit(s3_url)
    host = f"{parts.hostname}:{parts.port}"
    todo = fuzz_cases(host, access_key, secret_key, cases=cases, seed=seed, bucket=bucket)
    addr = (parts.hostname or "127.0.0.1", parts.port or 80)
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda c: _run_one(c, addr, timeout_s), todo))
    return FuzzReport(results, time.monotonic() - t0, idle_close_s)


if __name__ == "__main__":  # pragma: no cover - manual use
    report = run_fuzz(sys.argv[1], sys.argv[2], sys.argv[3],
                      cases=int(sys.argv[4]) if len(sys.argv) > 4 else 3000)
    print(report.summary())
    sys.exit(0 if report.ok else 1)
