"""Settings of the LMCache plugin (:mod:`gpufeed.ai.kvcache.lmcache`): one
:class:`PluginSettings` per plugin instance, parsed from LMCache's
``extra_config``. Needs no LMCache install."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

__all__ = ["PluginSettings"]


@dataclass(frozen=True)
class PluginSettings:
    """Settings of one plugin instance, read from LMCache's ``extra_config`` keys
    ``remote_storage_plugin.<name>.<field>`` (strings from env/JSON are converted).

    Attributes:
        url: the node: ``gpufeed+shm:///path/gpufeed.sock`` (same host) or
            ``gpufeed+tcp://HOST:PORT``. Required.
        bucket: the kv bucket holding the chunks; created if missing.
        key_prefix: prepended to every object key (to share a bucket).
        capacity_bytes: the bucket's LRU capacity when this plugin creates it
            (bytes; default 64 GiB; set it to what the node's disk can hold).
        ttl_s: hide objects this many seconds after their last write (0: never).
        connections: pooled fast-path connections (0: the client's default).
        connect_timeout_s: seconds to wait for a connection.
        request_timeout_s: a request that makes no progress for this long fails
            (seconds); the node is then treated as down.
        retry_interval_s: seconds between reconnect attempts to a node that is down.
        staging_bytes: shm staging region (bytes; 0: 8 chunk-sized slots, at least
            64 MiB); a batch read stages half of it, so 4 chunks per GETV by default.
    """

    url: str
    bucket: str = "lmcache"
    key_prefix: str = ""
    capacity_bytes: int = 64 << 30  # 64 GiB
    ttl_s: float = 0.0
    connections: int = 0
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 5.0
    retry_interval_s: float = 10.0
    staging_bytes: int = 0

    @classmethod
    def from_extra_config(cls, extra: Mapping | None, plugin_name: str) -> "PluginSettings":
        """Raises ValueError: no ``url``, or a value that does not convert."""
        extra = extra or {}
        prefix = f"remote_storage_plugin.{plugin_name}."
        kinds = get_type_hints(cls)  # field name -> str, int or float
        kw: dict[str, Any] = {}
        for f in fields(cls):
            raw = extra.get(prefix + f.name)
            if raw is None:
                continue
            kind = kinds[f.name]
            try:
                kw[f.name] = kind(raw)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{prefix}{f.name}={raw!r}: expected {kind.__name__}") from exc
        if not kw.get("url"):
            raise ValueError(f"the gpufeed plugin needs extra_config {prefix}url "
                             "(gpufeed+shm:///path/gpufeed.sock or gpufeed+tcp://HOST:PORT)")
        return cls(**kw)
