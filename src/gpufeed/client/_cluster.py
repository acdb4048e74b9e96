"""A :class:`~gpufeed.client.Client` that reads each object from a cluster
member that holds it: :class:`ClusterClient`, the cluster-routing transport
(:mod:`._transports._cluster`) with its limits as arguments and its counters
as :meth:`ClusterClient.routing_stats`.

``Client("gpufeed+cluster://HOST:PORT")`` routes the same way with the
default limits, so code that takes a URL (``gpufeed.ai``) routes without a
change.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ._auth import resolve_credentials
from ._client import Client
from ._transports import ClusterTransport, RoutingOptions, TransportOptions
from ._types import parse_url

__all__ = ["ClusterClient", "RoutingOptions"]


class ClusterClient(Client):
    """Fast-path client of a cluster: reads go to a member that holds the
    object's data (found with the LOCATE op, cached), everything else to the
    node of ``url``, which also serves a read again when the member it went to
    fails. Against a node outside a cluster it is a plain TCP client.
    Thread-safe.

    Args:
        url: ``gpufeed+tcp://HOST:PORT`` or ``gpufeed+cluster://HOST:PORT`` of
            any member (the given node).
        access_key, secret_key: as for :class:`~gpufeed.client.Client`.
        connections: pooled connections to each node (default 4).
        timeout_s: connect timeout, seconds.
        request_timeout_s: as for :class:`~gpufeed.client.Client`.
        max_nodes: most other members it keeps connections to (>= 0).
        locations: most object versions whose holders it caches (>= 1).
        location_ttl_s: seconds a cached location is used before it is asked again (> 0).
        retry_after_s: seconds a member whose connection failed is not read from (>= 0).
        allow_unauthenticated: as for :class:`~gpufeed.client.Client`.

    Raises:
        InvalidArgument: a URL of another scheme, or a limit out of range.
        TransportError, InvalidAccessKeyId, SignatureDoesNotMatch: as for
            :class:`~gpufeed.client.Client` (the given node).
    """

    def __init__(self, url: str, access_key: str | None = None, secret_key: str | None = None, *,
                 connections: int | None = None, timeout_s: float = 30.0,
                 request_timeout_s: float | None = 60.0, max_nodes: int = 64, locations: int = 65536,
                 location_ttl_s: float = 30.0, retry_after_s: float = 5.0,
                 allow_unauthenticated: bool = False) -> None:
        self.url = url
        name, address = parse_url(url)
        if name not in ("tcp", "cluster"):
            raise InvalidArgument(f"{url!r}: a cluster client needs gpufeed+tcp://HOST:PORT or "
                                  "gpufeed+cluster://HOST:PORT (it reads from other members over TCP)")
        routing = RoutingOptions(max_nodes, locations, location_ttl_s, retry_after_s)
        routing.check()
        options = TransportOptions(connections, timeout_s, request_timeout_s,
                                   credentials=resolve_credentials(access_key, secret_key),
                                   allow_unauthenticated=bool(allow_unauthenticated))
        self._router = ClusterTransport(address, options, routing)
        self._t = self._router

    @property
    def routes(self) -> bool:
        """Reads are routed: the given node is a cluster member that locates objects
        (``False`` until a read finds out otherwise, or for a node outside a cluster)."""
        return self._router.routes

    @property
    def given_node(self) -> str:
        """The given node's id (``""`` until a LOCATE answer names it, or outside a cluster)."""
        return self._router.given_node

    def routing_stats(self) -> dict:
        """What routing did so far: ``reads`` (node id -> reads sent to it, a batch
        counting each item; ``""`` is the given node before its id was known),
        ``locates`` (LOCATE requests sent), ``fallbacks`` (reads sent again to
        the given node after the member they went to failed)."""
        r = self._router
        return {"reads": dict(r.reads), "locates": r.locates, "fallbacks": r.fallbacks}
