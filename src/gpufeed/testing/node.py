"""Start a real ``gpufeed serve`` subprocess for tests, benchmarks and the demo."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

__all__ = ["NodeProcess", "NodeCredentials", "start_node", "socket_path", "wait_for", "flip_bits"]


class NodeCredentials(TypedDict):
    """A node's own key, as ``Client(url, **creds)`` takes it."""

    access_key: str
    secret_key: str


@dataclass
class NodeProcess:
    """A running node subprocess and its endpoints.

    Attributes:
        s3_url: ``http://127.0.0.1:PORT``.
        tcp_url: ``gpufeed+tcp://127.0.0.1:PORT``.
        shm_url: ``gpufeed+shm:///path/to/gpufeed.sock``.
        access_key, secret_key: S3 credentials the node accepts.
        data_dir: the node's data folder.
        proc: the ``subprocess.Popen``.
        log_path: file receiving the node's stderr.
        warnings: the ``"warnings"`` of its start-up line.
        metrics_url: ``http://127.0.0.1:PORT`` of its metrics port, or ``None`` (none served).
    """

    s3_url: str
    tcp_url: str
    shm_url: str
    access_key: str
    secret_key: str
    data_dir: Path
    proc: subprocess.Popen
    log_path: Path
    warnings: tuple[str, ...] = ()
    metrics_url: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def credentials(self) -> NodeCredentials:
        """``{"access_key", "secret_key"}`` of the node's own key, for
        ``Client(url, **node.credentials)`` (so keys in the environment of the
        process that started the node do not reach its clients)."""
        return NodeCredentials(access_key=self.access_key, secret_key=self.secret_key)

    def boto3_client(self, **config):
        """A boto3 S3 client for this node (``config`` goes to botocore Config)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.s3_url, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name="us-east-1",
            config=Config(**config) if config else None,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        """Send ``sig`` and wait; returns the exit code (kills after ``timeout_s``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, like a crash."""
        self.stop(signal.SIGKILL)

    def pause(self, timeout_s: float = 10.0) -> None:
        """SIGSTOP, like a hung node; returns once the process is stopped (the signal
        lands asynchronously, so a request sent right after ``kill`` may still be served).

        Raises:
            TimeoutError: the process did not stop within ``timeout_s``.
        """
        self.proc.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self.pid}/stat")
        deadline = time.monotonic() + timeout_s
        while stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.pid} did not stop within {timeout_s} s")
            time.sleep(0.01)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self.proc.send_signal(signal.SIGCONT)


#: Longest Unix socket path the kernel takes (``sun_path`` is 108 bytes with its NUL).
_MAX_SOCKET_PATH = 107


def socket_path(data_dir: Path) -> Path:
    """Where a test node over ``data_dir`` listens: ``data_dir/gpufeed.sock``, or,
    when that is longer than a Unix socket path may be (deep pytest temp folders),
    a short folder under the system temp dir named by a hash of ``data_dir``, so a
    node restarted on the same data gets the same socket path."""
    path = data_dir / "gpufeed.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.blake2b(os.fsencode(data_dir.resolve()), digest_size=8).hexdigest()
    folder = Path(tempfile.gettempdir()) / f"gpufeed-sock-{digest}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / "gpufeed.sock"


def start_node(data_dir: str | Path, *, extra_args: list[str] | None = None,
               timeout_s: float = 30.0, env: dict | None = None) -> NodeProcess:
    """Start ``python -m gpufeed serve`` on free loopback ports over ``data_dir``.

    Raises:
        RuntimeError: the node exited or printed nothing within ``timeout_s`` (the
            message includes its stderr).
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}.node.log"
    args = [sys.executable, "-m", "gpufeed", "serve", "--data-dir", str(data_dir),
            "--s3-port", "0", "--port", "0", "--socket", str(socket_path(data_dir)),
            *(extra_args or [])]
    log = open(log_path, "ab")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    log.close()
    assert proc.stdout is not None  # stdout=PIPE
    deadline = time.monotonic() + timeout_s
    line = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 0.2)
        if r:
            line = proc.stdout.readline()
            break
        if proc.poll() is not None:
            break
    if not line:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise RuntimeError(f"gpufeed serve did not start:\n{log_path.read_text(errors='replace')}")
    info = json.loads(line)
    return NodeProcess(
        s3_url=info["s3"], tcp_url=info["tcp"], shm_url=info["shm"],
        access_key=info["access_key"],
        # null when the secret was given (not printed): then it is the one passed in
        secret_key=info["secret_key"] or _given_secret(extra_args or [], {**os.environ, **(env or {})}),
        data_dir=data_dir, proc=proc, log_path=log_path, warnings=tuple(info.get("warnings", ())),
        metrics_url=info.get("metrics"),
    )


def _given_secret(args: list[str], env: dict) -> str:
    """The secret key a node was started with: ``--secret-key`` or ``GPUFEED_SECRET_KEY``."""
    for i, arg in enumerate(args):
        if arg == "--secret-key" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--secret-key="):
            return arg.split("=", 1)[1]
    return env.get("GPUFEED_SECRET_KEY", "")


def wait_for(check, timeout_s: float = 10.0):
    """Call ``check()`` every 0.1 s until it returns something true, and return that.

    Raises:
        AssertionError: it did not within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got, f"the condition did not hold within {timeout_s} s"
            return got
        time.sleep(0.1)


def flip_bits(path, offset: int, mask: int) -> None:
    """Damage a stored file the way a bad sector would: XOR the byte at
    ``offset`` of ``path`` with ``mask`` (1-255), in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))
