"""One pooled :class:`~gpufeed.client.Client` per node URL and process, for
checkpoint saves and loads that were not handed a client."""

from __future__ import annotations

import os
import threading

from ...client import Client
from .._session import NodeSession
from ._format import Location, parse_checkpoint_url

__all__ = ["client_for", "open_location"]

_sessions: dict[tuple[int, str], NodeSession] = {}
_sessions_lock = threading.Lock()


def client_for(node_url: str) -> Client:
    """One pooled :class:`Client` per node URL and process (safe across fork).

    A pooled client that lost a connection (node restarted, a request timed out
    while the node was stopped) is closed and replaced, so one failure does not
    fail every later save and load of the process.

    Raises:
        TransportError, OSError: the node cannot be reached.
    """
    k = (os.getpid(), node_url)
    with _sessions_lock:
        session = _sessions.get(k)
        if session is None:
            session = _sessions[k] = NodeSession(node_url, replace_lost=True)
    return session.require()


def open_location(url: str | Location, client: Client | None, bucket: str | None,
          prefix: str | None) -> tuple[Location, Client]:
    loc = url if isinstance(url, Location) else parse_checkpoint_url(url, bucket=bucket, prefix=prefix)
    return loc, client if client is not None else client_for(loc.node_url)
