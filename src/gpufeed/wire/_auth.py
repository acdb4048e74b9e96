"""Who is on a fast-path connection: the AUTH handshake and the per-op key check
(spec: ``docs/wire-protocol.md``, "Authentication").

A connection proves once that it holds an access key's secret (a challenge and
response over the connection's fresh server nonce); from then on each op is
checked against the engine's access decision (:meth:`gpufeed.engine.Engine.authorize`)
as the key's tenant, and the key itself is looked up again on every op (a dict
lookup in the engine's key cache), so a revoked key stops working on open
connections at their next op.

Cluster peers: a node of a cluster authenticates to another with its node key
(access key id ``PEER_KEY_PREFIX + node id``, secret derived from the
cluster's key in the shared catalog, :mod:`gpufeed._peers`). Such a
connection acts as :data:`PEER_TENANT`, which owns no bucket: it may send
CHUNK, CHUNK_PUT and PART (whose bucket and key name only an upload whose part
files it stores, sends or deletes) and no op that reads or writes a bucket's
objects, and those three are refused to every other key. The S3 front never
accepts node keys.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from ..engine import KeyRing
from ..errors import InvalidAccessKeyId, InvalidArgument, SignatureDoesNotMatch
from . import protocol as p

__all__ = ["Principal", "Authenticator", "MIN_CLIENT_NONCE", "MAX_CLIENT_NONCE", "PEER_KEY_PREFIX", "PEER_TENANT"]

#: Bounds of an AUTH request's client nonce, bytes.
MIN_CLIENT_NONCE = 16
MAX_CLIENT_NONCE = 64
#: Access key ids of cluster nodes start with this (no S3 access key does: ids are letters and digits).
PEER_KEY_PREFIX = "gfnode:"
#: The tenant a cluster peer's connection acts as (not a valid tenant name, so no tenant can be it).
PEER_TENANT = "@cluster"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated connection's identity.

    Attributes:
        access_key: the key id it proved.
        tenant: the tenant that key acts for.
        revocable: the key may be revoked while the node runs (checked on each op).
    """

    access_key: str
    tenant: str
    revocable: bool


class Authenticator:
    """Checks AUTH requests and, on each op, that the key is still valid.

    Args:
        keys: the node's access keys.
        peers: ``peers(access_key) -> secret`` of a cluster peer's node key
            (``None``: unknown); ``None``: the node is in no cluster.
    """

    def __init__(self, keys: KeyRing, peers: Callable[[str], str | None] | None = None) -> None:
        self.keys = keys
        self.peers = peers

    def _lookup(self, access_key: str) -> tuple[str, str] | None:
        if access_key.startswith(PEER_KEY_PREFIX):
            secret = self.peers(access_key) if self.peers is not None else None
            return None if secret is None else (PEER_TENANT, secret)
        return self.keys.lookup(access_key)

    def authenticate(self, transport: str, server_nonce: bytes,
                     req: p.Auth) -> tuple[Principal, p.AuthReply]:
        """Check an AUTH request against the connection's nonce.

        Args:
            transport: ``"tcp"`` or ``"shm"``: the connection's transport.
            server_nonce: the nonce its HELLO replies carry.
            req: the request.

        Returns:
            ``(principal, reply)``: who the connection is, and the AUTH reply
            (with the server's proof).

        Raises:
            InvalidArgument: a client nonce outside 16 to 64 bytes.
            InvalidAccessKeyId: the key is unknown or revoked.
            SignatureDoesNotMatch: the proof is not the key's.
        """
        if not MIN_CLIENT_NONCE <= len(req.client_nonce) <= MAX_CLIENT_NONCE:
            raise InvalidArgument(f"an AUTH client nonce must be {MIN_CLIENT_NONCE} to "
                                  f"{MAX_CLIENT_NONCE} bytes, not {len(req.client_nonce)}")
        found = self._lookup(req.access_key)
        if found is None:
            raise InvalidAccessKeyId("The access key Id you provided does not exist in our records.")
        tenant, secret = found
        key = p.auth_key(secret)
        want = p.auth_proof(key, "client", transport, req.access_key, server_nonce, req.client_nonce)
        if not hmac.compare_digest(want, req.proof):
            raise SignatureDoesNotMatch("The AUTH proof does not match the one computed with the "
                                        "access key's secret. Check your secret key.")
        mine = p.auth_proof(key, "server", transport, req.access_key, server_nonce, req.client_nonce)
        revocable = tenant != PEER_TENANT and self.keys.revocable(req.access_key)
        principal = Principal(req.access_key, tenant, revocable)
        return principal, p.AuthReply(tenant, mine)

    def still_valid(self, principal: Principal) -> bool:
        """The connection's key still acts for its tenant (a revoked key, or one
        of a deleted tenant, does not)."""
        if not principal.revocable:
            return True
        found = self.keys.lookup(principal.access_key)
        return found is not None and found[0] == principal.tenant
