"""The SDK users import: fast-path client (``gpufeed+tcp://``, ``gpufeed+shm://``)."""

from ._async import AsyncClient
from ._client import Client, DeleteResult, ListEntry, ObjectMeta, ReadRequest, parse_url

__all__ = ["Client", "AsyncClient", "ReadRequest", "ListEntry", "ObjectMeta", "DeleteResult", "parse_url"]
