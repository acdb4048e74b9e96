"""One pooled :class:`~gpufeed.client.Client` per node URL and process, for
checkpoint saves and loads that were not handed a client."""

from __future__ import annotations

import os
import threading

from ...client import Client
from ._format import Location, parse_checkpoint_url

__all__ = ["client_for", "open_location"]

_clients: dict[tuple[int, str], Client] = {}
_clients_lock = threading.Lock()


def client_for(node_url: str) -> Client:
    """One pooled :class:`Client` per node URL and process (safe across fork).

    A pooled client that lost a connection (node restarted, a request timed out
    while the node was stopped) is closed and replaced, so one failure does not
    fail every later save and load of the process."""
    k = (os.getpid(), node_url)
    with _clients_lock:
        c = _clients.get(k)
        if c is not None and not c.closed and c.lost_connection:
            c.close()  # its buffers stay valid; its requests already failed
        if c is None or c.closed:
            c = _clients[k] = Client(node_url)
        return c


def open_location(url: str | Location, client: Client | None, bucket: str | None,
          prefix: str | None) -> tuple[Location, Client]:
    loc = url if isinstance(url, Location) else parse_checkpoint_url(url, bucket=bucket, prefix=prefix)
    return loc, client if client is not None else client_for(loc.node_url)
