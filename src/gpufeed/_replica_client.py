"""The replication source's calls to the target node: its admin API's replica
calls (:mod:`gpufeed.s3._admin_replication`), signed with SigV4 (botocore)
and the target key the rule holds, one keep-alive HTTP connection per client.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse

from .admin import _answer_error
from .errors import GpufeedError, InvalidArgument

__all__ = ["ReplicaClient", "ADMIN_PATH"]

#: Where the target's admin API answers.
ADMIN_PATH = "/_gpufeed/admin/"


class ReplicaClient:
    """Calls on one replica bucket of a target node.

    Args:
        url: the target node's S3 endpoint, ``http://host:port``.
        bucket: the target bucket.
        source: the replication rule's id (the target checks it on every call).
        access_key, secret_key: a key of the target: its admin key, or a key of
            the tenant that owns (or is to own) the target bucket.
        timeout_s: per request, seconds.
        region: signing region.

    Every call raises:
        GpufeedError: the target refused (its typed error, rebuilt from its code).
        OSError: the target cannot be reached or the connection broke.
    """

    def __init__(self, url: str, bucket: str, source: str, access_key: str, secret_key: str, *,
                 timeout_s: float = 60.0, region: str = "us-east-1") -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
            raise InvalidArgument(f"{url!r} is not a node's S3 endpoint: give http://HOST:PORT")
        self.url = url.rstrip("/")
        self._parts = parts
        self._bucket, self._source = bucket, source
        self._creds = (access_key, secret_key)
        self._timeout_s, self._region = timeout_s, region
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self._parts.hostname or "", self._parts.port, timeout=self._timeout_s)
        return self._conn

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _call(self, method: str, path: str, body: bytes | dict | None = None,
              query: dict | None = None) -> dict:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        target = ADMIN_PATH + "replica/" + urllib.parse.quote(self._bucket, safe="") + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
        kind = "application/octet-stream" if isinstance(body, bytes) else "application/json"
        req = AWSRequest(method=method, url=self.url + target, data=data, headers={"Content-Type": kind})
        S3SigV4Auth(Credentials(*self._creds), "s3", self._region).add_auth(req)
        conn = self._connection()
        try:
            conn.request(method, target, body=data, headers=dict(req.headers.items()))
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise OSError(f"replication target {self.url} broke off: {exc}") from exc
        if resp.status >= 300:
            raise _answer_error(resp.status, raw, self.url)
        try:
            return json.loads(raw or b"{}")
        except ValueError as exc:
            raise GpufeedError(f"{self.url} answered a replica call with something that is not JSON") from exc

    def claim(self) -> dict:
        """Make the target bucket this source's replica (see
        :meth:`~gpufeed.engine._replica.ReplicaTarget.claim_replica`)."""
        return self._call("PUT", "", {"source": self._source})

    def status(self) -> dict:
        """The target bucket's replica status."""
        return self._call("GET", "")

    def lacking(self, digests: list[str]) -> list[str]:
        """Which of ``digests`` (hex BLAKE3-256) the target has not staged."""
        return self._call("POST", "/lack", {"source": self._source, "digests": digests})["lack"]

    def put_chunk(self, digest: str, data: bytes | bytearray | memoryview) -> None:
        """Send one chunk."""
        self._call("PUT", f"/chunks/{digest}", bytes(data), {"source": self._source})

    def commit(self, doc: dict) -> dict:
        """Commit a version from staged chunks (``doc``: key, chunks, size and metadata)."""
        return self._call("POST", "/objects", {"source": self._source, **doc})

    def delete(self, key: str) -> None:
        """Delete ``key`` on the target."""
        self._call("POST", "/delete", {"source": self._source, "key": key})

    def retag(self, key: str, tags: dict[str, str]) -> None:
        """Replace the tag set of ``key``'s current version on the target
        (raises NoSuchKey when the target has no current version of it)."""
        self._call("POST", "/tags", {"source": self._source, "key": key, "tags": tags})

    def end_round(self, snapshot: str, created: float) -> dict:
        """Tell the target snapshot ``snapshot`` is applied whole."""
        return self._call("POST", "/round", {"source": self._source, "snapshot": snapshot, "created": created})
