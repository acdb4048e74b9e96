"""Fixtures of the S3 front tests.

``s3_node``: the S3 app served in-process (a background thread with its own
event loop) on a free 127.0.0.1 port over a fresh :class:`Engine` in a temp
folder. Independent of ``gpufeed serve``; the boto3 / aws-cli tests use the
subprocess ``node`` fixture of ``tests/conftest.py`` where that matters.
``bkt``: a bucket of ``s3_node`` per test module; ``bucket``: a fresh bucket
of the session node per test. ``raw``: signed requests sent byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from gpufeed.config import NodeConfig
from gpufeed.engine import Engine
from gpufeed.s3 import start_s3


@dataclass
class InProcessS3:
    """An S3 endpoint served from a thread of the test process.

    Attributes:
        s3_url: ``http://127.0.0.1:PORT``.
        port: the bound TCP port.
        access_key, secret_key, region: credentials it accepts.
        data_dir: the engine's folder.
        engine: the engine behind it (tests may inspect it directly).
    """

    s3_url: str
    port: int
    access_key: str
    secret_key: str
    region: str
    data_dir: Path
    engine: Engine

    def client(self, **config):
        """A boto3 S3 client for this endpoint; close it after use."""
        return boto3.client(
            "s3", endpoint_url=self.s3_url, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=self.region,
            config=Config(**config) if config else None,
        )


@contextlib.contextmanager
def serve_in_thread(engine: Engine, cfg: NodeConfig):
    """Run :func:`start_s3` on an event loop in a background thread; yields the port."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    result: dict = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            result["runner"], result["port"] = loop.run_until_complete(start_s3(engine, cfg))
        except BaseException as exc:  # reported to the test thread below
            result["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="s3-front-test", daemon=True)
    thread.start()
    assert started.wait(30), "S3 front did not start"
    if "error" in result:
        raise result["error"]
    try:
        yield result["port"]
    finally:
        asyncio.run_coroutine_threadsafe(result["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def make_test_config(data_dir: Path) -> NodeConfig:
    """NodeConfig of an in-process test endpoint (port 0, no fsync)."""
    return NodeConfig(data_dir=data_dir, host="127.0.0.1", s3_port=0, io_threads=8, fsync=False,
                      access_key="test-access", secret_key="test-secret-key/+=", region="us-east-1")


@pytest.fixture(scope="session")
def s3_node(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("s3front") / "data"
    cfg = make_test_config(data_dir)
    engine = Engine(data_dir, fsync=False)
    with serve_in_thread(engine, cfg) as port:
        yield InProcessS3(
            s3_url=f"http://127.0.0.1:{port}", port=port, access_key=cfg.access_key,
            secret_key=cfg.secret_key, region=cfg.region, data_dir=data_dir, engine=engine,
        )
    engine.close()


@pytest.fixture(scope="module")
def bkt(s3_node) -> str:
    """A bucket of the in-process endpoint, one per test module."""
    name = f"m-{uuid.uuid4().hex[:12]}"
    s3_node.engine.create_bucket(name)
    return name


@pytest.fixture
def bucket(s3) -> str:
    """A fresh bucket of the session node (``gpufeed serve``), made through boto3."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3c(s3_node):
    """boto3 client of the in-process endpoint."""
    client = s3_node.client()
    yield client
    client.close()


# Raw signed requests ------------------------------------------------------------------
# For what boto3 cannot send (virtual hosts we cannot resolve, traversal paths,
# hostile bodies): botocore signs, http.client sends the path byte for byte.

import http.client  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

from botocore.auth import S3SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402


class _Signer(S3SigV4Auth):
    """S3SigV4Auth with an explicit payload hash (UNSIGNED-PAYLOAD, STREAMING-...)."""

    def __init__(self, credentials, region, payload_hash):
        super().__init__(credentials, "s3", region)
        self._payload_hash = payload_hash

    def payload(self, request):
        return self._payload_hash or super().payload(request)

    def _normalize_url_path(self, path):
        return path


@dataclass
class RawResponse:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


@dataclass
class RawClient:
    """Signs with botocore and sends with http.client to the endpoint's port."""

    endpoint: object  # anything with s3_url, access_key, secret_key

    @property
    def port(self) -> int:
        return urlsplit(self.endpoint.s3_url).port

    def sign(self, method: str, path: str, *, body: bytes = b"", headers: dict | None = None,
             host: str | None = None, payload_hash: str | None = None,
             secret_key: str | None = None, access_key: str | None = None,
             region: str = "us-east-1") -> dict:
        """Signed headers for ``method path`` (``path`` raw, may include ``?query``)."""
        host = host or f"127.0.0.1:{self.port}"
        req = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=dict(headers or {}))
        creds = Credentials(access_key or self.endpoint.access_key,
                            secret_key or self.endpoint.secret_key)
        _Signer(creds, region, payload_hash).add_auth(req)
        out = dict(req.headers.items())
        out["Host"] = host
        return out

    def request(self, method: str, path: str, *, body: bytes = b"", headers: dict | None = None,
                host: str | None = None, payload_hash: str | None = None, sign: bool = True,
                **sign_kw) -> RawResponse:
        """Send one request; ``sign=False`` sends ``headers`` as they are."""
        all_headers = (self.sign(method, path, body=body, headers=headers, host=host,
                                 payload_hash=payload_hash, **sign_kw)
                       if sign else dict(headers or {}))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in all_headers.items():
                conn.putheader(k, v)
            if "Content-Length" not in all_headers and (body or method in ("PUT", "POST")):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            return RawResponse(resp.status, resp.headers, resp.read())
        finally:
            conn.close()


@pytest.fixture(scope="session")
def raw(s3_node) -> RawClient:
    """Raw signed-request client of the in-process endpoint."""
    return RawClient(s3_node)


@pytest.fixture(scope="session")
def serve():
    """``serve(engine, cfg)``: context manager running an extra endpoint; yields its port."""
    return serve_in_thread


@pytest.fixture(scope="session")
def raw_for():
    """``raw_for(s3_url, access_key, secret_key)``: a RawClient of any endpoint."""

    def make(s3_url: str, access_key: str, secret_key: str) -> RawClient:
        return RawClient(InProcessS3(s3_url=s3_url, port=urlsplit(s3_url).port, access_key=access_key,
                                     secret_key=secret_key, region="us-east-1", data_dir=Path(),
                                     engine=None))

    return make


@pytest.fixture(scope="session")
def node_config():
    """``node_config(data_dir)``: the NodeConfig in-process endpoints use."""
    return make_test_config


def error_code(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document."""
    import xml.etree.ElementTree as ET

    return ET.fromstring(body).findtext("Code")


@pytest.fixture(scope="session")
def code_of():
    """Function: S3 error document bytes -> its ``<Code>``."""
    return error_code
