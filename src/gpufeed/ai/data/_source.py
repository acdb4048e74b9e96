"""Where a dataset's objects live, and this process's client to that node.

A :class:`Source` pickles to its URL, bucket, prefix and client settings
only: each process that uses it (every DataLoader worker, after a fork or a
spawn) opens its own :class:`~gpufeed.client.Client` on first use, and a
client that lost its connection (the node restarted) is replaced.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from ...client import Client
from ...errors import InvalidArgument
from .._session import NodeSession
from ..checkpoint import parse_checkpoint_url

__all__ = ["Source", "Listed", "ErrorPolicy", "ON_ERROR"]

log = logging.getLogger("gpufeed.ai.data")

ON_ERROR = ("raise", "skip", "retry")


@dataclass(frozen=True, slots=True)
class Listed:
    """One object as listed: its key and size in bytes."""

    key: str
    size: int


@dataclass(frozen=True)
class ErrorPolicy:
    """What a dataset does with a sample it cannot read or decode.

    Attributes:
        on_error: ``"raise"`` (fail the step with a :class:`DataError` naming
            the object), ``"skip"`` (leave the sample or shard out, count it in
            ``skipped`` and log a warning) or ``"retry"`` (read it again,
            reconnecting when the connection was lost, up to ``max_retries``
            times, then raise).
        max_retries: reads after the first, for ``"retry"``.
        retry_backoff_s: seconds before the first retry; doubled for each next one.
    """

    on_error: str = "raise"
    max_retries: int = 3
    retry_backoff_s: float = 0.5

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise InvalidArgument(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")
        if type(self.max_retries) is not int or self.max_retries < 0:
            raise InvalidArgument(f"max_retries must be an int >= 0: {self.max_retries!r}")
        if not 0 <= self.retry_backoff_s < float("inf"):
            raise InvalidArgument(f"retry_backoff_s must be >= 0: {self.retry_backoff_s!r}")


@dataclass
class Source:
    """A node, a bucket and a key prefix, with one lazily opened client per process.

    Args:
        node_url: ``gpufeed+tcp://HOST:PORT`` or ``gpufeed+shm:///path/gpufeed.sock``.
        bucket: the bucket.
        prefix: the key prefix, used as is (``"train/"`` does not match ``"train2/x"``).
        client_kw: keyword arguments for ``Client(node_url, **client_kw)``.
    """

    node_url: str
    bucket: str
    prefix: str = ""
    client_kw: dict = field(default_factory=dict)
    _session: NodeSession | None = field(default=None, repr=False, compare=False)
    _pid: int = field(default=0, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def parse(cls, url: str, prefix: str, client_kw: dict) -> Source:
        """``url`` is ``NODE/BUCKET[/KEY-PREFIX]`` (as checkpoint URLs are); ``prefix``
        is appended to the key prefix.

        Raises:
            InvalidArgument: another scheme, or no bucket.
        """
        loc = parse_checkpoint_url(url)
        rest = url[len(loc.node_url):] if url.startswith(loc.node_url) else ""
        url_prefix = rest.lstrip("/").partition("/")[2]  # verbatim: a trailing "/" matters
        return cls(loc.node_url, loc.bucket, url_prefix + prefix, dict(client_kw))

    def __getstate__(self) -> dict:
        return {"node_url": self.node_url, "bucket": self.bucket, "prefix": self.prefix,
                "client_kw": self.client_kw}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def where(self, key: str) -> str:
        """``bucket/key``, for messages."""
        return f"{self.bucket}/{key}"

    def client(self) -> Client:
        """This process's client (opened on first use, replaced after a lost connection).

        Raises:
            TransportError, OSError: the node cannot be reached.
        """
        if self._pid != os.getpid():
            self._lock = threading.Lock()  # a forked child: the parent's lock may have been held
        with self._lock:
            if self._session is None or self._pid != os.getpid():
                self._session = NodeSession(self.node_url, connect_kw=self.client_kw, replace_lost=True)
                self._pid = os.getpid()
            session = self._session
        return session.require()

    def failed(self, exc: BaseException) -> None:
        """The current client failed: drop it so the next use reconnects."""
        session = self._session
        if session is not None and self._pid == os.getpid():
            session.failed(exc)

    def list(self) -> list[Listed]:
        """Every object under the prefix, in key order (UTF-8 bytes); keys
        ending in ``/`` (folder markers some tools write) are left out.

        Raises:
            NoSuchBucket: no such bucket.
            TransportError: the node cannot be reached.
        """
        entries = self.client().list(self.bucket, self.prefix)
        out = [Listed(e.key, e.size) for e in entries if not e.is_prefix and not e.key.endswith("/")]
        if not out:  # a typo'd prefix would otherwise be an epoch that ends at once
            log.warning("no objects under %s: the dataset is empty", self.where(self.prefix))
        return out

    def close(self) -> None:
        """Close this process's client (a later use opens a new one)."""
        with self._lock:
            if self._session is not None and self._pid == os.getpid():
                self._session.close()
            self._session = None
