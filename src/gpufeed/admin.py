"""Administering tenants, access keys, buckets, bucket snapshots and replication, on a running node or
a stopped one (replication: a running node only).

:class:`RemoteAdmin` calls a running node's admin API over its S3 port
(:mod:`gpufeed.s3._admin`), signing each request with SigV4 (botocore) and
the node's admin key; :class:`LocalAdmin` opens a stopped node's data folder
directly. Both answer the same JSON-ready dicts, so ``gpufeed admin`` prints
the same either way.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import GpufeedError, InvalidArgument, InvalidRequestError, error_from_code

if TYPE_CHECKING:
    from .engine import CatalogSettings

__all__ = ["Admin", "RemoteAdmin", "LocalAdmin", "catalog_cluster_status"]


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _answer_error(status: int, raw: bytes, url: str) -> GpufeedError:
    """The typed error of a refused admin call: the admin API's JSON, an S3
    error document (the signature was refused before the admin API), or else
    what answered (not a gpufeed node)."""
    try:
        doc = json.loads(raw)
        return error_from_code(doc.get("error", ""), doc.get("message", ""))
    except (ValueError, AttributeError):
        pass
    try:
        root = ET.fromstring(raw)
        code, message = root.findtext("Code"), root.findtext("Message")
        if code:
            return error_from_code(code, message or code)
    except ET.ParseError:
        pass
    return GpufeedError(f"{url} answered HTTP {status} without a gpufeed error: is it a gpufeed node's S3 endpoint?")


class Admin:
    """The admin calls; each returns a JSON-ready dict.

    Raises (every call):
        GpufeedError: the node refused (NoSuchTenant, TenantAlreadyExists,
            TenantNotEmpty, InvalidTenantName, NoSuchAccessKey, AccessDenied).
        OSError: the node cannot be reached.
    """

    def tenant_create(self, name: str) -> dict:
        """Make a tenant: ``{"name", "created"}``."""
        raise NotImplementedError

    def tenant_list(self) -> dict:
        """``{"tenants": [{"name", "created"}, ...]}``."""
        raise NotImplementedError

    def tenant_delete(self, name: str) -> dict:
        """Remove a tenant that owns no bucket (its keys stop working): ``{}``."""
        raise NotImplementedError

    def tenant_stats(self, name: str) -> dict:
        """:meth:`gpufeed.engine.Engine.tenant_stats`: buckets, current objects and
        their bytes, every stored version's bytes, and the quota."""
        raise NotImplementedError

    def key_create(self, tenant: str) -> dict:
        """A new key: ``{"access_key", "secret_key", "tenant"}`` (the secret is shown once)."""
        raise NotImplementedError

    def key_list(self, tenant: str | None = None) -> dict:
        """``{"keys": [{"access_key", "tenant", "created", "revoked"}, ...]}``."""
        raise NotImplementedError

    def key_revoke(self, access_key: str) -> dict:
        """Revoke a key: ``{}``."""
        raise NotImplementedError

    def quota_set(self, scope: str, name: str, max_bytes: int | None = None, max_objects: int | None = None) -> dict:
        """Set a ``"tenant"`` or ``"bucket"`` quota (0 = no limit, ``None`` keeps
        that limit); answers as :meth:`quota_get`."""
        raise NotImplementedError

    def quota_get(self, scope: str, name: str) -> dict:
        """``{"scope", "name", "quota_bytes", "quota_objects", "stored_bytes", "stored_versions"}``."""
        raise NotImplementedError

    def bucket_stats(self, bucket: str) -> dict:
        """A bucket's counters, owner, versioning and object lock
        (:func:`gpufeed.s3._admin.bucket_report`); NoSuchBucket when absent."""
        raise NotImplementedError

    def bucket_data(self, bucket: str, **changes) -> dict:
        """A bucket's data policy (:class:`~gpufeed.engine.DataPolicy` fields),
        after applying ``changes`` (field values) when given; NoSuchBucket when
        absent, InvalidArgument for a bad field."""
        raise NotImplementedError

    def node_data(self) -> dict:
        """:meth:`gpufeed.engine.Engine.node_data_stats`: chunks, stored and data
        bytes, capacity, damaged chunks and failed reads."""
        raise NotImplementedError

    def damaged(self) -> dict:
        """``{"chunks": [{"chunk", "reason", "found", "objects"}, ...]}``: chunks marked damaged."""
        raise NotImplementedError

    def scrub(self, rate_bytes_s: float = 0, *, wait: bool = True, poll_s: float = 0.5,
              progress: Callable[[dict], None] | None = None) -> dict:
        """Check every stored chunk (see :mod:`gpufeed.engine._scrub`); with
        ``wait``, until it ends (``progress(status)`` after each poll). A scrub
        already running is waited for, not started again (``"started"``: False).
        Returns the scrub status ``{"started", "running", "chunks", "bytes",
        "started_at", "last"}`` (``last``: the last complete report:
        ``damaged``, ``cleared``, ``repaired``, ``dropped_copies``, ``orphan_files``, ...); a stopped node's adds
        ``"recovered"``, what opening its folder cleaned up first
        (:attr:`gpufeed.engine.Engine.recovered`)."""
        raise NotImplementedError

    def scrub_stop(self) -> dict:
        """End the scrub in progress: ``{"stopped", ...status}``."""
        raise NotImplementedError

    def cluster_status(self, expiry_s: float = 10.0, replicas: int = 2) -> dict:
        """The members of the node's cluster, their health and the chunks and open
        uploads' parts with fewer live copies than ``replicas``
        (:func:`gpufeed.engine._membership.cluster_report`). A running node
        answers by its own expiry setting; a stopped node's folder by
        ``expiry_s``. InvalidArgument when the node has no cluster name."""
        raise NotImplementedError

    # snapshots (gpufeed.s3._admin_snapshots; the engine's snapshot calls) ------------
    def snapshot_create(self, bucket: str, name: str) -> dict:
        """Snapshot a bucket: ``{"bucket", "name", "created", "kind", "objects", "bytes"}``."""
        raise NotImplementedError

    def snapshot_list(self, bucket: str) -> dict:
        """``{"snapshots": [snapshot, ...]}``, oldest first."""
        raise NotImplementedError

    def snapshot_delete(self, bucket: str, name: str, *, bypass_governance: bool = False) -> dict:
        """Delete a snapshot (its data only it held is freed): ``{}``."""
        raise NotImplementedError

    def snapshot_restore(self, bucket: str, name: str, *, prefix: str = "") -> dict:
        """Roll the bucket (or ``prefix``) back: ``{"restored", "deleted", "unchanged"}``."""
        raise NotImplementedError

    def snapshot_diff(self, bucket: str, name: str, target: str | None = None, *, prefix: str = "") -> dict:
        """``{"added", "changed", "removed", "retagged"}`` keys from snapshot
        ``name`` to ``target`` (``None``: live)."""
        raise NotImplementedError

    def snapshot_schedule(self, bucket: str, *, hourly: int | None = None, daily: int | None = None) -> dict:
        """The bucket's schedule ``{"hourly", "daily"}`` (keep counts), changed
        first when either is given (one left out is kept)."""
        raise NotImplementedError

    # replication: a running node only (its rounds run there) ------------------------------
    def _remote_only(self) -> dict:
        raise InvalidRequestError("replication is managed on a running node: give --endpoint, not --data-dir")

    def replication_add(self, bucket: str, target: str, target_bucket: str, access_key: str,
                        secret_key: str) -> dict:
        """Replicate ``bucket`` to ``target_bucket`` of the node at ``target``
        (:meth:`gpufeed.replication.Replicator.add`): the new rule's status."""
        return self._remote_only()

    def replication_status(self, bucket: str | None = None) -> dict:
        """One rule's status, or ``{"rules": [...]}`` of all (bucket ``None``)."""
        return self._remote_only()

    def replication_pause(self, bucket: str, paused: bool = True) -> dict:
        """Pause (``paused``) or resume a rule: its status after the change."""
        return self._remote_only()

    def replication_sync(self, bucket: str) -> dict:
        """Run (or resume) one round now and wait for it: what it did."""
        return self._remote_only()

    def replication_remove(self, bucket: str) -> dict:
        """Remove a rule (the target bucket stays a replica until failover)."""
        return self._remote_only()

    def replica_status(self, bucket: str) -> dict:
        """On a target node: the replica bucket's status."""
        return self._remote_only()

    def replica_failover(self, bucket: str) -> dict:
        """On a target node: promote the replica to an ordinary, writable bucket."""
        return self._remote_only()

    def close(self) -> None:
        """Release what the admin holds."""


class RemoteAdmin(Admin):
    """The admin API of a running node.

    Args:
        url: the node's S3 endpoint (``http://host:port``).
        access_key, secret_key: the node's admin key.
        region: signing region.
        timeout_s: per request, seconds.
    """

    def __init__(self, url: str, access_key: str, secret_key: str, *, region: str = "us-east-1",
                 timeout_s: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
            raise InvalidArgument(f"{url!r} is not a node's S3 endpoint: give http://HOST:PORT")
        self._url = url.rstrip("/")
        self._creds = (access_key, secret_key)
        self._region = region
        self._timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict | None = None, query: dict | None = None, *,
              timeout_s: float | None = None) -> dict:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        url = f"{self._url}/_gpufeed/admin/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else b""
        req = AWSRequest(method=method, url=url, data=data, headers={"Content-Type": "application/json"})
        S3SigV4Auth(Credentials(*self._creds), "s3", self._region).add_auth(req)
        prepared = urllib.request.Request(url, data=data or None, method=method, headers=dict(req.headers.items()))
        try:
            with urllib.request.urlopen(prepared, timeout=timeout_s or self._timeout_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                raw = exc.read()
            finally:
                exc.close()  # the refused answer's connection, which the error would keep open
            raise _answer_error(exc.code, raw, self._url) from exc
        except urllib.error.URLError as exc:
            raise OSError(f"cannot reach the node's admin API at {self._url}: {exc.reason} (give the node's S3 "
                          "URL with --url or GPUFEED_S3_URL, or a stopped node's --data-dir, or, for cluster "
                          "status, --catalog URL)") from exc
        except TimeoutError as exc:
            raise OSError(f"the node's admin API at {self._url} did not answer in "
                          f"{timeout_s or self._timeout_s:g} s") from exc

    def tenant_create(self, name: str) -> dict:
        return self._call("POST", "tenants", {"name": name})

    def tenant_list(self) -> dict:
        return self._call("GET", "tenants")

    def tenant_delete(self, name: str) -> dict:
        return self._call("DELETE", f"tenants/{urllib.parse.quote(name, safe='')}")

    def tenant_stats(self, name: str) -> dict:
        return self._call("GET", f"tenants/{urllib.parse.quote(name, safe='')}/stats")

    def key_create(self, tenant: str) -> dict:
        return self._call("POST", f"tenants/{urllib.parse.quote(tenant, safe='')}/keys")

    def key_list(self, tenant: str | None = None) -> dict:
        return self._call("GET", "keys", query={"tenant": tenant} if tenant else None)

    def key_revoke(self, access_key: str) -> dict:
        return self._call("DELETE", f"keys/{urllib.parse.quote(access_key, safe='')}")

    def quota_set(self, scope: str, name: str, max_bytes: int | None = None, max_objects: int | None = None) -> dict:
        body = {k: v for k, v in (("bytes", max_bytes), ("objects", max_objects)) if v is not None}
        return self._call("PUT", f"quotas/{urllib.parse.quote(scope, safe='')}/{urllib.parse.quote(name, safe='')}",
                          body)

    def quota_get(self, scope: str, name: str) -> dict:
        return self._call("GET", f"quotas/{urllib.parse.quote(scope, safe='')}/{urllib.parse.quote(name, safe='')}")

    def bucket_stats(self, bucket: str) -> dict:
        return self._call("GET", f"buckets/{urllib.parse.quote(bucket, safe='')}/stats")

    def bucket_data(self, bucket: str, **changes) -> dict:
        path = f"buckets/{urllib.parse.quote(bucket, safe='')}/data"
        return self._call("PUT", path, changes) if changes else self._call("GET", path)

    def node_data(self) -> dict:
        return self._call("GET", "data")

    def damaged(self) -> dict:
        return self._call("GET", "damaged")

    def scrub(self, rate_bytes_s: float = 0, *, wait: bool = True, poll_s: float = 0.5,
              progress: Callable[[dict], None] | None = None) -> dict:
        status = self._call("POST", "scrub", {"rate": rate_bytes_s})
        started = status["started"]
        while wait and status["running"]:
            if progress is not None:
                progress({**status, "started": started})
            time.sleep(poll_s)
            status = self._call("GET", "scrub")
        return {**status, "started": started}

    def scrub_stop(self) -> dict:
        return self._call("DELETE", "scrub")

    def cluster_status(self, expiry_s: float = 10.0, replicas: int = 2) -> dict:
        return self._call("GET", "cluster")

    def replication_add(self, bucket: str, target: str, target_bucket: str, access_key: str,
                        secret_key: str) -> dict:
        return self._call("POST", "replication", {"bucket": bucket, "target": target, "target_bucket": target_bucket,
                                                  "access_key": access_key, "secret_key": secret_key})

    def replication_status(self, bucket: str | None = None) -> dict:
        if bucket is None:
            return self._call("GET", "replication")
        return self._call("GET", f"replication/{_quote(bucket)}")

    def replication_pause(self, bucket: str, paused: bool = True) -> dict:
        return self._call("POST", f"replication/{_quote(bucket)}/{'pause' if paused else 'resume'}")

    def replication_sync(self, bucket: str) -> dict:
        # a round sends what the bucket changed: as long as that takes
        return self._call("POST", f"replication/{_quote(bucket)}/sync", timeout_s=max(self._timeout_s, 86400.0))

    def replication_remove(self, bucket: str) -> dict:
        return self._call("DELETE", f"replication/{_quote(bucket)}")

    def replica_status(self, bucket: str) -> dict:
        return self._call("GET", f"replica/{_quote(bucket)}")

    def replica_failover(self, bucket: str) -> dict:
        return self._call("POST", f"replica/{_quote(bucket)}/failover")

    def _snap(self, bucket: str, name: str | None = None) -> str:
        path = f"buckets/{urllib.parse.quote(bucket, safe='')}/snapshots"
        return path if name is None else f"{path}/{urllib.parse.quote(name, safe='')}"

    def snapshot_create(self, bucket: str, name: str) -> dict:
        return self._call("POST", self._snap(bucket), {"name": name})

    def snapshot_list(self, bucket: str) -> dict:
        return self._call("GET", self._snap(bucket))

    def snapshot_delete(self, bucket: str, name: str, *, bypass_governance: bool = False) -> dict:
        return self._call("DELETE", self._snap(bucket, name), {"bypass_governance": bypass_governance})

    def snapshot_restore(self, bucket: str, name: str, *, prefix: str = "") -> dict:
        return self._call("POST", self._snap(bucket, name) + "/restore", {"prefix": prefix})

    def snapshot_diff(self, bucket: str, name: str, target: str | None = None, *, prefix: str = "") -> dict:
        query = {k: v for k, v in (("target", target), ("prefix", prefix)) if v}
        return self._call("GET", self._snap(bucket, name) + "/diff", query=query or None)

    def snapshot_schedule(self, bucket: str, *, hourly: int | None = None, daily: int | None = None) -> dict:
        path = f"buckets/{urllib.parse.quote(bucket, safe='')}/snapshot-schedule"
        if hourly is None and daily is None:
            return self._call("GET", path)
        now = self._call("GET", path)
        return self._call("PUT", path, {"hourly": now["hourly"] if hourly is None else hourly,
                                        "daily": now["daily"] if daily is None else daily})


class LocalAdmin(Admin):
    """The data folder of a stopped node, opened directly.

    Args:
        data_dir: the node's data folder.
        master_key: as the node was given (``GPUFEED_MASTER_KEY``), or ``None``
            for ``data_dir/master.key``.
        catalog: where the node's catalog lives, as the node was given it
            (``None``: SQLite in the data folder).

    Raises:
        DataFolderInUse: a node is running on it (use :class:`RemoteAdmin`).
        FileNotFoundError: ``data_dir`` is not a node's data folder (a typo
            never makes a new, empty one).
    """

    def __init__(self, data_dir: str | Path, master_key: bytes | None = None,
                 catalog: CatalogSettings | None = None) -> None:
        from .engine import Engine
        from .engine._catalogs import POSTGRES_MARKER

        if not any((Path(data_dir) / name).is_file() for name in ("catalog.sqlite3", POSTGRES_MARKER)):
            raise FileNotFoundError(f"no gpufeed data folder at {data_dir} (it has no catalog.sqlite3)")
        self._engine = Engine(data_dir, master_key=master_key, catalog=catalog)
        self._cluster = catalog.cluster if catalog is not None else ""

    def tenant_create(self, name: str) -> dict:
        return dataclasses.asdict(self._engine.create_tenant(name))

    def tenant_list(self) -> dict:
        return {"tenants": [dataclasses.asdict(t) for t in self._engine.list_tenants()]}

    def tenant_delete(self, name: str) -> dict:
        self._engine.delete_tenant(name)
        return {}

    def tenant_stats(self, name: str) -> dict:
        return self._engine.tenant_stats(name)

    def key_create(self, tenant: str) -> dict:
        info, secret = self._engine.create_access_key(tenant)
        return {"access_key": info.access_key, "secret_key": secret, "tenant": info.tenant}

    def key_list(self, tenant: str | None = None) -> dict:
        return {"keys": [dataclasses.asdict(k) for k in self._engine.list_access_keys(tenant)]}

    def key_revoke(self, access_key: str) -> dict:
        self._engine.revoke_access_key(access_key)
        return {}

    def quota_set(self, scope: str, name: str, max_bytes: int | None = None, max_objects: int | None = None) -> dict:
        self._engine.set_quota(scope, name, max_bytes, max_objects)
        return self._engine.quota(scope, name)

    def quota_get(self, scope: str, name: str) -> dict:
        return self._engine.quota(scope, name)

    def bucket_stats(self, bucket: str) -> dict:
        from .s3._admin import bucket_report

        return bucket_report(self._engine, bucket)

    def bucket_data(self, bucket: str, **changes) -> dict:
        if changes:
            return dataclasses.asdict(self._engine.set_bucket_data(bucket, **changes))
        return dataclasses.asdict(self._engine.bucket_data(bucket))

    def node_data(self) -> dict:
        return self._engine.node_data_stats()

    def damaged(self) -> dict:
        return {"chunks": self._engine.damaged_chunks()}

    def scrub(self, rate_bytes_s: float = 0, *, wait: bool = True, poll_s: float = 0.5,
              progress: Callable[[dict], None] | None = None) -> dict:
        runner = self._engine.scrubber
        started = runner.start(rate_bytes_s)
        while not runner.wait(poll_s):
            if progress is not None:
                progress({**runner.status(), "started": started})
        return {**runner.status(), "started": started, "recovered": self._engine.recovered}

    def scrub_stop(self) -> dict:
        return {"stopped": self._engine.scrubber.cancel(), **self._engine.scrubber.status()}

    def snapshot_create(self, bucket: str, name: str) -> dict:
        return dataclasses.asdict(self._engine.create_snapshot(bucket, name))

    def snapshot_list(self, bucket: str) -> dict:
        return {"snapshots": [dataclasses.asdict(s) for s in self._engine.list_snapshots(bucket)]}

    def snapshot_delete(self, bucket: str, name: str, *, bypass_governance: bool = False) -> dict:
        self._engine.delete_snapshot(bucket, name, bypass_governance=bypass_governance)
        return {}

    def snapshot_restore(self, bucket: str, name: str, *, prefix: str = "") -> dict:
        return dataclasses.asdict(self._engine.restore_snapshot(bucket, name, prefix=prefix))

    def snapshot_diff(self, bucket: str, name: str, target: str | None = None, *, prefix: str = "") -> dict:
        return dataclasses.asdict(self._engine.diff_snapshots(bucket, name, target, prefix=prefix))

    def snapshot_schedule(self, bucket: str, *, hourly: int | None = None, daily: int | None = None) -> dict:
        now = self._engine.snapshot_schedule(bucket)
        if hourly is None and daily is None:
            return now
        return self._engine.set_snapshot_schedule(bucket, hourly=now["hourly"] if hourly is None else hourly,
                                                  daily=now["daily"] if daily is None else daily)

    def cluster_status(self, expiry_s: float = 10.0, replicas: int = 2) -> dict:
        from .engine._membership import cluster_report

        if not self._cluster:
            raise InvalidArgument("name the node's cluster (--cluster NAME or GPUFEED_CLUSTER)")
        return cluster_report(self._engine.membership, self._cluster, expiry_s,
                              count_under=self._engine.under_replicated, replicas=replicas,
                              count_under_parts=self._engine.under_replicated_parts)

    def close(self) -> None:
        self._engine.close()


def catalog_cluster_status(url: str, cluster: str = "", *, expiry_s: float = 10.0, timeout_s: float = 5.0,
                           replicas: int = 2) -> dict:
    """The cluster report read straight from a PostgreSQL catalog, with no node
    or data folder (:func:`gpufeed.engine._membership.cluster_report`).

    Args:
        url: the catalog's ``postgresql://`` URL.
        cluster: the cluster's name; ``""``: the cluster that owns the catalog.
        expiry_s: seconds without a heartbeat after which a member is expired.
        timeout_s: seconds to wait for the database.
        replicas: the replication factor under-replicated chunks and parts are counted against.

    Raises:
        InvalidArgument: ``url`` is not a PostgreSQL URL, or no cluster owns the catalog.
        CatalogUnavailable: the database cannot be reached.
    """
    from .engine._catalogs import is_postgres

    if not is_postgres(url):
        raise InvalidArgument("the cluster status needs the cluster's PostgreSQL catalog (--catalog postgresql://...)")
    from .engine._membership import cluster_report
    from .engine._postgres import PostgresCatalog

    catalog = PostgresCatalog(url, pool_size=2, pool_timeout_s=timeout_s)
    try:
        if not cluster:
            owner = catalog.owner()
            if not owner.startswith("cluster:"):
                raise InvalidArgument(f"the catalog at {catalog.where} belongs to no cluster "
                                      f"({'owner ' + repr(owner) if owner else 'no owner yet'})")
            cluster = owner.removeprefix("cluster:")
        return cluster_report(catalog.membership, cluster, expiry_s, count_under=catalog.under_replicated,
                              replicas=replicas, count_under_parts=catalog.under_replicated_parts)
    finally:
        catalog.close()
