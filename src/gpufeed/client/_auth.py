"""The client's credentials and its side of the AUTH handshake (spec:
``docs/wire-protocol.md``, "Authentication").

Keys come from the arguments, else ``GPUFEED_ACCESS_KEY`` / ``GPUFEED_SECRET_KEY``
(the variables ``gpufeed serve`` reads for its own key, each falling back to
the built-in default as the node's does), else ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (both), else the built-in default key, so a node
started with ``gpufeed serve`` and no settings answers ``Client(url)`` as is.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config import DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY
from ..errors import InvalidArgument, TransportError
from ..wire import protocol as p

__all__ = ["Credentials", "resolve_credentials", "authenticate"]

#: Bytes of the nonce the client adds to each AUTH.
CLIENT_NONCE_BYTES = 32


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key and its secret (the secret is left out of ``repr``).

    Attributes:
        access_key: the access key id.
        secret_key: the secret access key.
        source: where they came from (``"arguments"``, ``"GPUFEED_*"``,
            ``"AWS_*"``, ``"default"``), for error messages.
    """

    access_key: str
    secret_key: str = field(repr=False)
    source: str = "arguments"


def resolve_credentials(access_key: str | None = None, secret_key: str | None = None,
                        environ: Mapping[str, str] | None = None) -> Credentials:
    """The credentials a client uses (see the module docstring for the order).

    Args:
        access_key, secret_key: given by the caller (both or neither).
        environ: the environment (default ``os.environ``).

    Raises:
        InvalidArgument: only one of ``access_key`` / ``secret_key`` given, or
            one that is not a non-empty ``str``.
    """
    if access_key is not None or secret_key is not None:
        if not (isinstance(access_key, str) and access_key and isinstance(secret_key, str) and secret_key):
            raise InvalidArgument("give both access_key and secret_key (non-empty strings), or neither")
        return Credentials(access_key, secret_key, "arguments")
    env = os.environ if environ is None else environ
    ak, sk = env.get("GPUFEED_ACCESS_KEY"), env.get("GPUFEED_SECRET_KEY")
    if ak or sk:
        return Credentials(ak or DEFAULT_ACCESS_KEY, sk or DEFAULT_SECRET_KEY, "GPUFEED_*")
    ak, sk = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if ak and sk:
        return Credentials(ak, sk, "AWS_*")
    return Credentials(DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY, "default")


def authenticate(conn, hello: p.HelloReply, creds: Credentials, transport: str, *,
                 allow_unauthenticated: bool = False) -> str | None:
    """Run AUTH on a connection that has just had its HELLO answered.

    Args:
        conn: the connection (``client._conn.Connection``).
        hello: its HELLO reply.
        creds: what to prove.
        transport: the client transport's name (``"tcp"``, ``"shm"``), bound into
            the proof.
        allow_unauthenticated: talk to a node that does not authenticate
            (its HELLO lists no ``"auth"``) instead of refusing it.

    Returns:
        The tenant the key acts for; ``None`` for a node that does not authenticate.

    Raises:
        TransportError: the node does not authenticate clients (and that was not
            allowed), or its own proof is wrong (it does not hold the secret).
        InvalidAccessKeyId, SignatureDoesNotMatch: the node refused the key.
    """
    if "auth" not in hello.features:
        if allow_unauthenticated:
            return None
        raise TransportError(
            f"the node ({hello.server}) does not authenticate fast-path clients (its HELLO lists no "
            f"'auth' feature): anyone who reaches it reads and writes every bucket. Pass "
            f"allow_unauthenticated=True to use it anyway")
    nonce = secrets.token_bytes(CLIENT_NONCE_BYTES)
    key = p.auth_key(creds.secret_key)
    proof = p.auth_proof(key, "client", transport, creds.access_key, hello.nonce, nonce)
    reply = conn.call(p.Op.AUTH, p.Auth(creds.access_key, nonce, proof))
    want = p.auth_proof(key, "server", transport, creds.access_key, hello.nonce, nonce)
    if not hmac.compare_digest(want, reply.proof):
        raise TransportError("the node's AUTH proof is wrong: it does not hold the secret of "
                             f"{creds.access_key} (is it the node you meant?)")
    return reply.tenant
