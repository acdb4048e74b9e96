"""Temporary credentials of CreateSession (S3 Express One Zone), kept in the node's memory.

:class:`SessionKeyRing` answers the SigV4 verifier's ``get(access_key)`` and
the front's ``tenant_of(access_key)`` for the node's keys and for live session
keys alike; :meth:`SessionKeyRing.check` then holds a request signed with a
session to its token, its expiry, its bucket and its mode. A restart ends
every session (clients make a new one, as they do on expiry); a session dies
with the key that made it, since its secret is answered only while that key
is valid.

Sources: "CreateSession", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_CreateSession.html;
"Authorizing Zonal endpoint API operations with CreateSession", Amazon S3 User
Guide, https://docs.aws.amazon.com/AmazonS3/latest/userguide/s3-express-create-session.html
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from ..engine import KeyRing
from ..errors import AccessDenied, ExpiredToken, InvalidToken, SlowDown
from ._auth import AuthResult
from ._router import (
    BucketEndpoint,
    CreateSession,
    Endpoint,
    GetObject,
    GetObjectAttributes,
    HeadBucket,
    HeadObject,
    ListMultipartUploads,
    ListObjects,
    ListParts,
)

__all__ = ["SESSION_TTL_S", "SESSION_TOKEN_HEADER", "MAX_SESSIONS", "Session", "SessionKeyRing"]

#: Lifetime of CreateSession credentials, seconds (S3: 5 minutes).
SESSION_TTL_S = 300.0
#: The header that carries a session token on a request signed with session credentials.
SESSION_TOKEN_HEADER = "x-amz-s3session-token"
#: Most live sessions the node keeps (a CreateSession past it is answered SlowDown).
MAX_SESSIONS = 100_000
#: How long an expired session is remembered (to answer ExpiredToken rather than an unknown key), seconds.
_EXPIRED_KEPT_S = 600.0
_KEY_PREFIX = "GFXS"  # every session access key starts so; a lookup of any other key skips the table
#: Operations a ReadOnly session may make ("CreateSession", SessionMode).
_READ_ONLY = (GetObject, HeadObject, ListObjects, GetObjectAttributes, ListParts, ListMultipartUploads, HeadBucket)


@dataclass(frozen=True, slots=True)
class Session:
    """Temporary credentials made by CreateSession.

    Attributes:
        access_key, secret_key, token: what the client signs with.
        parent_key: the access key that created it (its tenant is the session's).
        bucket: the one bucket it reaches.
        read_only: a ``ReadOnly`` session.
        expires_s: Unix time, seconds, after which it is refused (ExpiredToken).
    """

    access_key: str
    secret_key: str
    token: str
    parent_key: str
    bucket: str
    read_only: bool
    expires_s: float


class SessionKeyRing:
    """The front's keys plus live sessions: ``get(access_key) -> secret`` and
    ``tenant_of(access_key)``, as :class:`~gpufeed.engine.KeyRing` answers,
    for session keys too. Thread-safe.

    Args:
        keys: the node's keys.
        ttl_s: session lifetime, seconds.
        clock: the time in Unix seconds (tests pass their own).
    """

    def __init__(self, keys: KeyRing, *, ttl_s: float = SESSION_TTL_S, clock=time.time) -> None:
        self.keys = keys
        self.ttl_s = ttl_s
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def session(self, access_key: str) -> Session | None:
        """The session of a session access key (expired or not), else ``None``."""
        if not access_key.startswith(_KEY_PREFIX):
            return None
        with self._lock:
            return self._sessions.get(access_key)

    def get(self, access_key: str, default: str | None = None) -> str | None:
        """The secret of a valid key or of a session whose key is still valid, else ``default``."""
        found = self.session(access_key)
        if found is None:
            return self.keys.get(access_key, default)
        return found.secret_key if self.keys.get(found.parent_key) is not None else default

    def tenant_of(self, access_key: str) -> str | None:
        """The tenant a valid key (or session, through its parent key) acts for, else ``None``."""
        found = self.session(access_key)
        return self.keys.tenant_of(found.parent_key if found is not None else access_key)

    def principal_key(self, access_key: str) -> str:
        """The key a request acts as in bucket policies: a session's parent key, else ``access_key``."""
        found = self.session(access_key)
        return found.parent_key if found is not None else access_key

    def create(self, parent_key: str, bucket: str, *, read_only: bool = False) -> Session:
        """New credentials acting for ``parent_key`` on ``bucket``.

        Raises:
            AccessDenied: ``parent_key`` is itself a session key (S3: sessions
                are made with long-term credentials).
            SlowDown: :data:`MAX_SESSIONS` sessions are live.
        """
        if self.session(parent_key) is not None:
            raise AccessDenied("CreateSession must be signed with long-term credentials, not a session's")
        now = self.clock()
        new = Session(access_key=_KEY_PREFIX + secrets.token_hex(10).upper(),  # 24 chars: never a key id (20)
                      secret_key=secrets.token_urlsafe(30), token=secrets.token_urlsafe(48),
                      parent_key=parent_key, bucket=bucket, read_only=read_only, expires_s=now + self.ttl_s)
        with self._lock:
            for key in [k for k, s in self._sessions.items() if s.expires_s + _EXPIRED_KEPT_S < now]:
                del self._sessions[key]
            if len(self._sessions) >= MAX_SESSIONS:
                raise SlowDown("Too many sessions; retry later")
            self._sessions[new.access_key] = new
        return new

    def check(self, auth: AuthResult, token: str | None, endpoint: Endpoint) -> None:
        """Refuse a request whose session token does not hold.

        Raises:
            InvalidToken: a token on a request not signed with session
                credentials, or not the signing session's token.
            ExpiredToken: the session has expired.
            AccessDenied: session credentials without their token, on another
                bucket, making a session, or writing with a ReadOnly session.
        """
        found = self.session(auth.access_key) if auth.access_key else None
        if found is None:
            if token is not None:
                raise InvalidToken("The provided token is malformed or otherwise invalid.")
            return
        if token is None:
            raise AccessDenied(f"Requests signed with session credentials must carry {SESSION_TOKEN_HEADER}")
        if not hmac.compare_digest(token.encode(), found.token.encode()):
            raise InvalidToken("The provided token is malformed or otherwise invalid.")
        if self.clock() > found.expires_s:
            raise ExpiredToken("The provided token has expired.")
        if isinstance(endpoint, CreateSession) or not isinstance(endpoint, BucketEndpoint) \
                or endpoint.bucket != found.bucket or getattr(endpoint, "source_bucket", found.bucket) != found.bucket:
            raise AccessDenied("Access Denied")
        if found.read_only and not isinstance(endpoint, _READ_ONLY):
            raise AccessDenied("Access Denied")
