"""The ``asyncio`` form of the SDK: :class:`AsyncClient`, built on the
``submit_*`` forms of :class:`~gpufeed.client._client.Client` only, so it
refuses exactly the arguments ``Client`` refuses."""

from __future__ import annotations

import asyncio
import builtins

from ._client import Client
from ._types import DeleteResult, ListEntry, ObjectMeta

__all__ = ["AsyncClient"]


class AsyncClient:
    """``asyncio`` form of :class:`Client`, with ``await``-able methods.

    Create it with ``await AsyncClient.connect(url, **kw)`` (connects in a thread),
    or ``AsyncClient(url_or_client, **kw)`` (connects right away, blocking).
    Every method awaits the matching ``Client.submit_*`` Future, so arguments are
    checked by :class:`Client` and refused with the same typed errors; requests
    are pipelined on the underlying connections.

    Attributes:
        sync: the :class:`Client` underneath.
    """

    def __init__(self, client: "Client | str", **kw) -> None:
        self.sync = Client(client, **kw) if isinstance(client, str) else client

    @classmethod
    async def connect(cls, url: str, **kw) -> "AsyncClient":
        return cls(await asyncio.to_thread(Client, url, **kw))

    async def map_object(self, bucket: str, key: str, **kw) -> memoryview:
        return await asyncio.wrap_future(self.sync.submit_map_object(bucket, key, **kw))

    async def head(self, bucket: str, key: str, **kw) -> ObjectMeta:
        return await asyncio.wrap_future(self.sync.submit_head(bucket, key, **kw))

    async def put(self, bucket: str, key: str, data, **kw) -> ObjectMeta:
        return await asyncio.wrap_future(self.sync.submit_put(bucket, key, data, **kw))

    async def get(self, bucket: str, key: str, **kw) -> memoryview:
        return await asyncio.wrap_future(self.sync.submit_get(bucket, key, **kw))

    async def get_into(self, bucket: str, key: str, buffer, **kw) -> int:
        return await asyncio.wrap_future(self.sync.submit_get_into(bucket, key, buffer, **kw))

    async def get_many_into(self, requests, **kw) -> list[int]:
        return await asyncio.wrap_future(self.sync.submit_get_many_into(requests, **kw))

    async def get_ranges_into(self, bucket: str, key: str, dest, offsets, lengths, **kw):
        """:meth:`Client.get_ranges_into`: a ``numpy.int64`` array of bytes per range."""
        return await asyncio.wrap_future(self.sync.submit_get_ranges_into(bucket, key, dest, offsets, lengths, **kw))

    async def delete(self, bucket: str, key: str, **kw) -> DeleteResult:
        return await asyncio.wrap_future(self.sync.submit_delete(bucket, key, **kw))

    async def list(self, bucket: str, prefix: str = "", delimiter: str = "",
                   **kw) -> builtins.list[ListEntry]:
        return await asyncio.wrap_future(self.sync.submit_list(bucket, prefix, delimiter, **kw))

    async def create_bucket(self, bucket: str, **kw) -> None:
        await asyncio.wrap_future(self.sync.submit_create_bucket(bucket, **kw))

    async def bucket_stats(self, bucket: str) -> dict:
        return await asyncio.wrap_future(self.sync.submit_bucket_stats(bucket))

    async def delete_bucket(self, bucket: str) -> None:
        await asyncio.wrap_future(self.sync.submit_delete_bucket(bucket))

    async def list_buckets(self) -> builtins.list[str]:
        return await asyncio.wrap_future(self.sync.submit_list_buckets())

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
