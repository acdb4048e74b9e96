"""Which secret signs for which tenant: the node's configured key plus the
tenants' keys, as every front that checks a signature needs it.

The node's configured key (``NodeConfig.access_key`` / ``secret_key``) acts for
:data:`~gpufeed.engine.types.DEFAULT_TENANT` and cannot be revoked; every other
key is looked up in the engine (:meth:`~gpufeed.engine.Engine.lookup_access_key`,
answered from memory after its first use, forgotten at once when a key is
revoked or a tenant deleted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .types import DEFAULT_TENANT

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["KeyRing", "MAX_ACCESS_KEY_CHARS"]

#: Longest access key id looked up (AWS: 16 to 128 characters); longer ones are
#: unknown without a lookup, so junk ids cannot fill the engine's key cache.
MAX_ACCESS_KEY_CHARS = 128


class KeyRing:
    """The access keys a front accepts.

    Args:
        node_access_key: the node's configured key id (acts for the default tenant).
        node_secret_key: its secret.
        engine: looks up every other key.
    """

    def __init__(self, node_access_key: str, node_secret_key: str, engine: "Engine") -> None:
        self._key, self._secret = node_access_key, node_secret_key
        self._engine = engine

    def lookup(self, access_key: str) -> tuple[str, str] | None:
        """``(tenant, secret)`` of a valid key, else ``None`` (unknown, revoked,
        empty or longer than :data:`MAX_ACCESS_KEY_CHARS`, or sealed under another
        master key: see :meth:`gpufeed.engine.Engine.lookup_access_key`).
        """
        if access_key == self._key:
            return DEFAULT_TENANT, self._secret
        if not access_key or len(access_key) > MAX_ACCESS_KEY_CHARS:
            return None
        return self._engine.lookup_access_key(access_key)

    def revocable(self, access_key: str) -> bool:
        """The key can stop being valid while the node runs (every key but the
        node's configured one)."""
        return access_key != self._key

    def get(self, access_key: str, default: str | None = None) -> str | None:
        """The secret of a valid key, else ``default`` (the SigV4 verifier's question)."""
        found = self.lookup(access_key)
        return found[1] if found is not None else default

    def tenant_of(self, access_key: str) -> str | None:
        """The tenant a valid key acts for, else ``None``."""
        found = self.lookup(access_key)
        return found[0] if found is not None else None
