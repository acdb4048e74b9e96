"""The SDK users import: fast-path client (``gpufeed+tcp://``, ``gpufeed+shm://``, ``gpufeed+cluster://``)."""

from ._async import AsyncClient
from ._client import Client, DeleteResult, ListEntry, ObjectMeta, ReadRequest, parse_url
from ._cluster import ClusterClient, RoutingOptions

__all__ = ["Client", "AsyncClient", "ClusterClient", "RoutingOptions", "ReadRequest", "ListEntry", "ObjectMeta",
           "DeleteResult", "parse_url"]
