"""One node session for the AI integrations: a client to one node that is
opened on first use, prepared once per connection (a bucket created), dropped
after a failure and opened again later.

Checkpoints, the KV cache store and the LMCache plugin all need the same small
state machine; this is it, so each of them only says what to prepare, how long
to wait before reconnecting and what to count when the node goes away.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from ..client import Client
from ..errors import GpufeedError, TransportError

__all__ = ["NodeSession"]


class NodeSession:
    """A client to one node, reconnected after failures.

    Args:
        url_or_client: a node URL (the session opens, owns, closes and replaces
            its client) or an open :class:`Client` (borrowed: never closed or
            replaced; a failure only makes the next use prepare it again).
        connect_kw: keyword arguments for ``Client(url, **connect_kw)``.
        prepare: run on each new connection before it is handed out (e.g. create
            the bucket); its errors count as a failure, except ``fatal`` ones,
            which propagate to the caller (a bad bucket name is the caller's
            mistake, not a node outage).
        fatal: exception types of ``prepare`` that propagate.
        retry_interval_s: after a failure, :meth:`client` returns ``None`` for this
            many seconds instead of reconnecting (0: reconnect on the next use).
        replace_lost: a client that has lost a connection (node restarted) is
            treated as a failure on the next use, so one outage does not fail
            every later call.
        on_down: called with the error each time a failure is recorded (count it,
            log it); not called for a failure of a client already dropped.
    """

    def __init__(self, url_or_client: str | Client, *, connect_kw: dict | None = None,
                 prepare: Callable[[Client], None] | None = None,
                 fatal: tuple[type[BaseException], ...] = (), retry_interval_s: float = 0.0,
                 replace_lost: bool = False,
                 on_down: Callable[[BaseException], None] | None = None) -> None:
        if isinstance(url_or_client, Client):
            self.url, self.owns_client = url_or_client.url, False
            self._client: Client | None = url_or_client
        else:
            self.url, self.owns_client = url_or_client, True
            self._client = None
        self._connect_kw = dict(connect_kw or {})
        self._prepare, self._fatal = prepare, fatal
        self.retry_interval_s = retry_interval_s
        self._replace_lost = replace_lost
        self._on_down = on_down
        self._prepared = False
        self._retry_at = 0.0
        self._closed = False
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    @property
    def current(self) -> Client | None:
        """The client handed out last, without connecting (``None`` while down)."""
        return self._client if self._prepared else None

    def client(self) -> Client | None:
        """The connected, prepared client, or ``None`` while the node is down (or
        the session is closed).

        Raises:
            the ``fatal`` errors of ``prepare``.
        """
        with self._lock:
            try:
                return self._connect_locked()
            except self._fatal:
                raise
            except (GpufeedError, OSError) as exc:
                self._down_locked(self._client, exc)
                return None

    def require(self) -> Client:
        """:meth:`client`, but a failure to connect or prepare raises (ignoring the
        retry interval).

        Raises:
            TransportError, OSError, GpufeedError: the node cannot be reached or prepared.
        """
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.url}: the session is closed")
            self._retry_at = 0.0
            try:
                client = self._connect_locked()
            except self._fatal:
                raise
            except (GpufeedError, OSError) as exc:
                self._down_locked(self._client, exc)
                raise
            assert client is not None
            return client

    async def aclient(self) -> Client | None:
        """:meth:`client` without blocking the event loop on a (re)connect."""
        client = self.current
        if client is not None or self._closed or time.monotonic() < self._retry_at:
            return client
        return await asyncio.to_thread(self.client)

    def failed(self, exc: BaseException, client: Client | None = None) -> None:
        """Record a failure of ``client`` (default: the current one): an owned client
        is closed and dropped, and reconnects wait ``retry_interval_s``. A failure
        of a client already dropped is ignored."""
        with self._lock:
            self._down_locked(client if client is not None else self._client, exc)

    def close(self) -> None:
        """Close an owned client; later :meth:`client` calls return ``None``."""
        with self._lock:
            self._closed = True
            if self.owns_client and self._client is not None:
                _close_quietly(self._client)
                self._client = None
            self._prepared = False

    # --- internals -------------------------------------------------------------------
    def _connect_locked(self) -> Client | None:
        if self._closed:
            return None
        client = self._client
        if client is not None and self.owns_client and (
                client.closed or (self._replace_lost and client.lost_connection)):
            self._down_locked(client, TransportError(f"{self.url}: connection lost"))
            client = None
        if client is None:
            if not self.owns_client or time.monotonic() < self._retry_at:
                return None
            client = self._client = Client(self.url, **self._connect_kw)
            self._prepared = False
        if not self._prepared:
            if self._prepare is not None:
                self._prepare(client)
            self._prepared = True
        return client

    def _down_locked(self, client: Client | None, exc: BaseException) -> None:
        if client is not None and client is not self._client:
            return  # already dropped (and counted)
        self._prepared = False
        if self._on_down is not None:
            self._on_down(exc)
        if self.owns_client:
            if self._client is not None:
                _close_quietly(self._client)
            self._client = None
            self._retry_at = time.monotonic() + self.retry_interval_s


def _close_quietly(client: Client) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - closing a broken client
        pass
