"""Transports of the SDK, one module each, behind :class:`~.base.Transport`.

:data:`TRANSPORTS` maps the name :func:`~gpufeed.client.parse_url` gives a URL
to the class that serves it. A new transport implements
:class:`~.base.Transport` in a module of its own and adds its name here (and
its URL scheme to ``parse_url``); nothing above the SDK changes.
"""

from __future__ import annotations

from ._cluster import ClusterTransport, RoutingOptions
from ._pooled import MAX_ALLOC_BYTES
from ._shm import ShmTransport
from ._tcp import SPLIT_BYTES, TcpTransport
from .base import Transport, TransportOptions

__all__ = ["Transport", "TransportOptions", "TcpTransport", "ShmTransport", "ClusterTransport", "RoutingOptions",
           "TRANSPORTS", "MAX_ALLOC_BYTES", "SPLIT_BYTES"]

#: Transport name -> class.
TRANSPORTS: dict[str, type[Transport]] = {"tcp": TcpTransport, "shm": ShmTransport, "cluster": ClusterTransport}
