"""Tenants and their access keys: who owns which bucket, and which secret
signs for whom.

Each bucket belongs to one tenant; :data:`~gpufeed.engine.types.DEFAULT_TENANT`
always exists (it owns the buckets made without a tenant, and the node's
configured key acts for it), the others are made and removed here. A tenant
holds any number of access keys.

Secrets at rest: SigV4 (and the fast path's HMAC proof) make the server
compute an HMAC with the secret itself, so a one-way hash of it cannot serve;
each secret is sealed with AES-256-GCM (``cryptography``) under the node's
master key, with its access key id as associated data, and only the sealed
form reaches the catalog. The master key is 32 bytes from the node's
settings (``GPUFEED_MASTER_KEY``) or, by default, the file
``<data_dir>/master.key`` (``0600``, made on first use): a copy of the
catalog alone (a backup, a replica) then reveals no secret; keeping the
master key outside the data folder protects against a copy of the folder too.

Source: "Signature Version 4 signing process", AWS General Reference (why the
server needs the secret); NIST SP 800-38D (GCM).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from cryptography.exceptions import InvalidTag as _BadSeal
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import (
    AccessDenied,
    InternalError,
    InvalidArgument,
    InvalidTenantName,
    MalformedPolicy,
    NoSuchAccessKey,
    NoSuchTenant,
    QuotaExceeded,
    TenantAlreadyExists,
    TenantNotEmpty,
)
from ._policy import OWNER_ONLY_ACTIONS, Policy, PolicyRequest, evaluate, parse_policy
from ._private import FILE_MODE
from .catalog import Catalog, CatalogReader, require_bucket
from .types import DEFAULT_TENANT, AccessKeyInfo, BucketInfo, TenantInfo

__all__ = ["TenantAdmin", "MasterKey", "check_tenant_name", "owner_of", "check_quota", "QUOTA_SCOPES",
           "POLICY_CONFIG", "BucketMemo"]

T = TypeVar("T")

#: What a quota can bound: a tenant (all its buckets together) or one bucket.
QUOTA_SCOPES = ("tenant", "bucket")

log = logging.getLogger(__name__)

_TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_MASTER_BYTES = 32
#: The bucket configuration document that holds a bucket's policy.
POLICY_CONFIG = "policy"


def check_tenant_name(name: str) -> None:
    """Refuse a tenant name that is not 1-63 of ``[a-z0-9_-]`` starting with a letter or digit.

    Raises:
        InvalidTenantName: it is not (no path characters, no upper case).
    """
    if not isinstance(name, str) or not _TENANT_NAME.fullmatch(name):
        raise InvalidTenantName(f"invalid tenant name {name!r}: 1-63 of [a-z0-9_-], starting with a letter "
                                "or digit")


def owner_of(owner: str) -> str:
    """A bucket's stored owner as a tenant name (``""`` is the default tenant)."""
    return owner or DEFAULT_TENANT


def check_quota(r: CatalogReader, b: BucketInfo) -> None:
    """Refuse the write just made in bucket ``b`` (inside its transaction, so
    raising rolls it back) when it took the bucket or its owner past a quota.
    The parts of multipart uploads in progress count as held bytes, so parts
    never completed cannot pass a quota either.

    Raises:
        QuotaExceeded: a quota's bytes or object versions are exceeded.
    """
    for scope, name, used, pending in (("bucket", b.name, r.usage, r.parts_usage),
                                       ("tenant", owner_of(b.owner), r.tenant_usage, r.tenant_parts_usage)):
        max_bytes, max_objects = r.quota(scope, name)
        if not (max_bytes or max_objects):
            continue
        held_bytes, held_objects = used(name)
        held_bytes += pending(name)
        if (max_bytes and held_bytes > max_bytes) or (max_objects and held_objects > max_objects):
            raise QuotaExceeded(f"the {scope}'s quota ({max_bytes or 'any'} bytes, {max_objects or 'any'} "
                                "object versions) would be exceeded")


class MasterKey:
    """The node's master key, which seals access key secrets (AES-256-GCM).

    Args:
        data_dir: the data folder; ``master.key`` there is read, or made
            (``0600``, 32 random bytes) when ``key`` is ``None`` and it is missing.
        key: 32 bytes given by the node's settings, used instead of the file.
        has_sealed: whether secrets are stored already; then a missing file is
            an error, never replaced by a new key that could not open them.

    Raises:
        InternalError: ``key`` is not 32 bytes, or the file is not; the file is
            missing while secrets are stored (at first use).
    """

    def __init__(self, data_dir: Path, key: bytes | None = None,
                 has_sealed: Callable[[], bool] = lambda: False) -> None:
        self._path = data_dir / "master.key"
        self._given = key
        self._has_sealed = has_sealed
        if key is not None and len(key) != _MASTER_BYTES:
            raise InternalError(f"the master key must be {_MASTER_BYTES} bytes, not {len(key)}")
        self._aead: AESGCM | None = AESGCM(key) if key is not None else None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Read (or make) the key now rather than at first use.

        Raises:
            InternalError: as the class does.
        """
        self._cipher()

    def _cipher(self) -> AESGCM:
        if self._aead is not None:
            return self._aead
        with self._lock:
            if self._aead is None:
                self._aead = AESGCM(self._load_or_make())
            return self._aead

    def _load_or_make(self) -> bytes:
        try:
            key = self._path.read_bytes()
        except FileNotFoundError:
            if self._has_sealed():
                raise InternalError(f"{self._path} is missing but access keys are stored: give the master key "
                                    "they were sealed with (GPUFEED_MASTER_KEY)") from None
            key = secrets.token_bytes(_MASTER_BYTES)
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
            try:
                os.write(fd, key)
                os.fsync(fd)
            finally:
                os.close(fd)
        if len(key) != _MASTER_BYTES:
            raise InternalError(f"{self._path} is not a {_MASTER_BYTES}-byte master key")
        return key

    def seal(self, access_key: str, secret: str) -> str:
        """``secret`` encrypted and authenticated, bound to ``access_key`` (base64 of nonce + ciphertext)."""
        nonce = secrets.token_bytes(12)
        return base64.b64encode(nonce + self._cipher().encrypt(nonce, secret.encode(), access_key.encode())).decode()

    def open(self, access_key: str, sealed: str) -> str:
        """The secret :meth:`seal` sealed.

        Raises:
            InternalError: it was sealed under another master key, or altered.
        """
        raw = base64.b64decode(sealed)
        try:
            return self._cipher().decrypt(raw[:12], raw[12:], access_key.encode()).decode()
        except _BadSeal as exc:
            raise InternalError(f"the secret of {access_key} does not open with this node's master key") from exc


class TenantAdmin:
    """Tenant and key calls, mixed into :class:`~gpufeed.engine.Engine`."""

    _cat: Catalog
    _master: MasterKey
    _key_cache: dict[str, tuple[str, str] | None]
    _key_cache_lock: threading.Lock
    _key_gen: int  # bumped whenever keys change, so a lookup racing a change never caches the old answer
    _owners: dict[str, str]  # bucket -> tenant, see bucket_owner
    _owner_gen: int  # bumped when a bucket is made or deleted, as _key_gen for keys
    get_bucket_config: Callable[[str, str], str | None]  # from VersionedObjects
    check_writable: Callable[[str, str], None]  # from ReplicaTarget

    def create_tenant(self, name: str) -> TenantInfo:
        """Make a tenant (it owns nothing and has no key yet).

        Raises:
            InvalidTenantName: see :func:`check_tenant_name`.
            TenantAlreadyExists: the name is taken (``default`` always is).
        """
        check_tenant_name(name)
        info = TenantInfo(name, time.time())
        with self._cat.write() as w:
            if name == DEFAULT_TENANT or w.tenant(name) is not None:
                raise TenantAlreadyExists(f"tenant {name!r} exists")
            w.insert_tenant(info)
        return info

    def list_tenants(self) -> list[TenantInfo]:
        """Every tenant by name, :data:`DEFAULT_TENANT` (created 0) included."""
        return sorted([TenantInfo(DEFAULT_TENANT, 0.0), *self._cat.tenants()], key=lambda t: t.name)

    def require_tenant(self, name: str) -> None:
        """Raises NoSuchTenant when ``name`` is not a tenant."""
        if name != DEFAULT_TENANT and self._cat.tenant(name) is None:
            raise NoSuchTenant(f"tenant {name!r} does not exist")

    def tenant_stats(self, name: str) -> dict:
        """What a tenant holds now.

        Returns:
            ``{"name", "buckets", "bytes", "objects"}``: its bucket count and the
            bytes and count of the current objects in them.

        Raises:
            NoSuchTenant: no such tenant.
        """
        self.require_tenant(name)
        with self._cat.snapshot() as c:
            owned = [b.name for b in c.buckets() if owner_of(b.owner) == name]
            usage = [c.bucket_usage(b) for b in owned]
            stored_bytes, stored_versions = c.tenant_usage(name)
            quota_bytes, quota_objects = c.quota("tenant", name)
        return {"name": name, "buckets": len(owned), "bytes": sum(u[0] for u in usage),
                "objects": sum(u[1] for u in usage), "stored_bytes": stored_bytes,
                "stored_versions": stored_versions, "quota_bytes": quota_bytes, "quota_objects": quota_objects}

    def set_quota(self, scope: str, name: str, max_bytes: int | None = None, max_objects: int | None = None) -> None:
        """Bound what a tenant (all its buckets) or one bucket holds: bytes and
        object versions, current or not (delete markers not counted), and the
        parts of uploads in progress (bytes); 0 = no limit, ``None`` keeps the
        current limit. Enforced on every write that adds a version (put, copy,
        multipart completion, fast-path put), which is refused whole with
        ``QuotaExceeded``; deletes are always allowed.

        Raises:
            InvalidArgument: an unknown scope, a negative limit, or a limit below
                what is held now (lower usage first).
            NoSuchTenant, NoSuchBucket: no such tenant or bucket.
        """
        if scope not in QUOTA_SCOPES:
            raise InvalidArgument(f"quota scope must be one of {QUOTA_SCOPES}, not {scope!r}")
        for n in (max_bytes, max_objects):
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
                raise InvalidArgument(f"a quota is an integer >= 0, not {n!r}")
        with self._cat.write() as w:
            old_bytes, old_objects = w.quota(scope, name)
            max_bytes = old_bytes if max_bytes is None else max_bytes
            max_objects = old_objects if max_objects is None else max_objects
            if scope == "tenant":
                if name != DEFAULT_TENANT and w.tenant(name) is None:
                    raise NoSuchTenant(f"tenant {name!r} does not exist")
                held_bytes, held_objects = w.tenant_usage(name)
            else:
                require_bucket(w, name)
                held_bytes, held_objects = w.usage(name)
            if (max_bytes and max_bytes < held_bytes) or (max_objects and max_objects < held_objects):
                raise InvalidArgument(f"the {scope} {name!r} already holds {held_bytes} bytes in {held_objects} "
                                      "object versions, more than the quota asked; delete first")
            w.set_quota(scope, name, max_bytes, max_objects)

    def quota(self, scope: str, name: str) -> dict:
        """A quota and what it bounds now.

        Returns:
            ``{"scope", "name", "quota_bytes", "quota_objects", "stored_bytes",
            "stored_versions"}`` (quotas 0 = no limit).

        Raises:
            InvalidArgument: an unknown scope.
            NoSuchTenant, NoSuchBucket: no such tenant or bucket.
        """
        if scope not in QUOTA_SCOPES:
            raise InvalidArgument(f"quota scope must be one of {QUOTA_SCOPES}, not {scope!r}")
        with self._cat.snapshot() as c:
            if scope == "tenant":
                if name != DEFAULT_TENANT and c.tenant(name) is None:
                    raise NoSuchTenant(f"tenant {name!r} does not exist")
                held = c.tenant_usage(name)
            else:
                require_bucket(c, name)
                held = c.usage(name)
            q = c.quota(scope, name)
        return {"scope": scope, "name": name, "quota_bytes": q[0], "quota_objects": q[1],
                "stored_bytes": held[0], "stored_versions": held[1]}

    def delete_tenant(self, name: str) -> None:
        """Remove a tenant that owns no bucket, with all its keys (they stop working at once).

        Raises:
            NoSuchTenant: no such tenant.
            InvalidTenantName: the default tenant, which cannot be removed.
            TenantNotEmpty: it owns buckets, or a bucket policy names it.
        """
        if name == DEFAULT_TENANT:
            raise InvalidTenantName("the default tenant cannot be deleted")
        with self._cat.write() as w:
            if w.tenant(name) is None:
                raise NoSuchTenant(f"tenant {name!r} does not exist")
            owned = [b.name for b in w.buckets() if b.owner == name]
            if owned:
                raise TenantNotEmpty(f"tenant {name!r} owns {len(owned)} bucket(s)")
            named_in = self._policies_naming(w, f"tenant:{name}")
            if named_in:
                raise TenantNotEmpty(f"tenant {name!r} is named in the bucket policy of {named_in[0]!r}"
                                     f"{' and others' if len(named_in) > 1 else ''}: remove it there first (a "
                                     "new tenant of the same name would inherit the grant)")
            w.delete_tenant(name)
            w.on_commit(self._forget_keys)

    def create_access_key(self, tenant: str) -> tuple[AccessKeyInfo, str]:
        """A new key for ``tenant``.

        Returns:
            ``(info, secret)``: the secret is shown this once; only its sealed
            form is kept (see the module docstring).

        Raises:
            NoSuchTenant: no such tenant.
        """
        self._check_master_key()
        access_key = "GF" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(18))
        secret = secrets.token_urlsafe(30)
        info = AccessKeyInfo(access_key, tenant, time.time())
        sealed = self._master.seal(access_key, secret)
        with self._cat.write() as w:
            if tenant != DEFAULT_TENANT and w.tenant(tenant) is None:
                raise NoSuchTenant(f"tenant {tenant!r} does not exist")
            w.insert_access_key(info, sealed)
            w.on_commit(self._forget_keys)
        return info, secret

    def key_warnings(self, *, default_admin_secret: bool) -> list[str]:
        """What an operator should hear at start: stored key secrets that do not
        open with the master key in use, and tenants on a node whose admin key
        still has the built-in, public secret."""
        out = []
        try:
            self._check_master_key()
        except InternalError as exc:
            out.append(f"{exc.message}: every tenant key will be refused")
        if default_admin_secret and self._cat.tenants():
            out.append("tenants exist but the admin key has the built-in secret: anyone who can reach the S3 port "
                       "can administer them; set GPUFEED_SECRET_KEY (or --secret-key)")
        return out

    def _check_master_key(self) -> None:
        """Refuse to seal a new secret under a master key that does not open the stored ones.

        Raises:
            InternalError: it does not (the node was given another master key).
        """
        self._master.load()  # a missing master.key says so itself
        for info in self._cat.access_keys():
            row = self._cat.access_key(info.access_key)
            if row is not None:
                try:
                    self._master.open(info.access_key, row[1])
                except InternalError as exc:
                    raise InternalError("this master key does not open the access keys already stored; use the "
                                        "node's (GPUFEED_MASTER_KEY, or its data folder's master.key)") from exc
            return

    def list_access_keys(self, tenant: str | None = None) -> list[AccessKeyInfo]:
        """The keys of ``tenant`` (every tenant's when ``None``), revoked ones included.

        Raises:
            NoSuchTenant: no such tenant.
        """
        if tenant is not None:
            self.require_tenant(tenant)
        return self._cat.access_keys(tenant)

    def revoke_access_key(self, access_key: str) -> None:
        """Revoke a key: requests signed with it are refused from now on.

        Raises:
            NoSuchAccessKey: no valid key of that id.
        """
        with self._cat.write() as w:
            if not w.revoke_access_key(access_key, time.time()):
                raise NoSuchAccessKey(f"no valid access key {access_key!r}")
            w.on_commit(self._forget_keys)

    def lookup_access_key(self, access_key: str) -> tuple[str, str] | None:
        """``(tenant, secret)`` of a valid key, or ``None`` (unknown or revoked).

        Answers from memory after the first lookup of a key; creating or
        revoking a key, or deleting a tenant, empties that memory.

        A key whose stored secret does not open with the node's master key (the
        node was started with another one) is treated as unknown, and logged.
        """
        cache = self._key_cache
        if access_key in cache:
            return cache[access_key]
        gen = self._key_gen
        row = self._cat.access_key(access_key)
        found = None
        if row is not None and not row[0].revoked:
            try:
                found = (row[0].tenant, self._master.open(access_key, row[1]))
            except InternalError as exc:
                log.warning("access key %s refused: %s", access_key, exc.message)
        with self._key_cache_lock:
            if gen == self._key_gen:
                if len(cache) > 10_000:
                    cache.clear()
                cache[access_key] = found
        return found

    def _forget_keys(self) -> None:
        with self._key_cache_lock:
            self._key_gen += 1
            self._key_cache.clear()

    def bucket_owner(self, name: str) -> str:
        """The tenant owning bucket ``name`` (answered from memory after the
        first lookup; a deleted bucket is forgotten at its commit).

        Raises:
            NoSuchBucket: it does not exist.
        """
        owner = self._owners.get(name)
        if owner is None:
            gen = self._owner_gen
            owner = owner_of(require_bucket(self._cat, name).owner)
            with self._key_cache_lock:
                if gen == self._owner_gen:  # no bucket was made or deleted meanwhile
                    if len(self._owners) > 100_000:
                        self._owners.clear()
                    self._owners[name] = owner
        return owner

    def _forget_owner(self, name: str) -> None:
        """Drop a bucket's remembered owner and policy (run at the commit that makes or deletes it)."""
        with self._key_cache_lock:
            self._owner_gen += 1
            self._owners.pop(name, None)
        self._forget_policy(name)

    # bucket policies ----------------------------------------------------------------
    def _policy_memo(self) -> BucketMemo[Policy]:
        # made on first use, so the engine's constructor needs no line for it
        memo = self.__dict__.get("_policy_memo_")
        if memo is None:
            memo = self.__dict__.setdefault("_policy_memo_", BucketMemo[Policy]())
        return memo

    def _forget_policy(self, bucket: str) -> None:
        self._policy_memo().forget(bucket)

    def _principal(self, name: str) -> str | None:
        """A policy's AWS principal -> ``tenant:<name>`` / ``key:<id>``, or ``None``
        when no such tenant or valid catalog key exists (the node's configured
        key is named through its tenant, ``default``)."""
        if name == DEFAULT_TENANT or (_TENANT_NAME.fullmatch(name) and self._cat.tenant(name) is not None):
            return f"tenant:{name}"
        row = self._cat.access_key(name)
        return f"key:{name}" if row is not None and not row[0].revoked else None

    def _policies_naming(self, r: CatalogReader, principal: str) -> list[str]:
        """The buckets whose policy names ``principal`` (``tenant:<name>``)."""
        out = []
        for b in r.buckets():
            text = r.bucket_config(b.name, POLICY_CONFIG)
            if text is None:
                continue
            try:
                policy = parse_policy(text, b.name, self._stored_principal)
            except MalformedPolicy:
                continue
            if any(principal in st.principals for st in policy.statements):
                out.append(b.name)
        return out

    def _stored_principal(self, name: str) -> str:
        """A principal of a stored policy: it was checked when set and may have
        gone since (it then matches nobody), so it is never refused here."""
        found = self._principal(name)
        if found is None:
            found = f"tenant:{name}" if _TENANT_NAME.fullmatch(name) else f"key:{name}"
        return found

    def bucket_policy(self, bucket: str) -> Policy | None:
        """The bucket's parsed policy, or ``None`` (answered from memory after
        the first lookup; setting or deleting the policy, or the bucket, forgets it).

        Raises:
            NoSuchBucket: it does not exist.
        """
        memo = self._policy_memo()
        found, policy = memo.get(bucket)
        if found:
            return policy
        gen = memo.gen
        text = self.get_bucket_policy(bucket)
        policy = None
        if text is not None:
            try:
                policy = parse_policy(text, bucket, self._stored_principal)
            except MalformedPolicy:  # not set through put_bucket_policy: it grants nothing
                policy = None
        memo.put(bucket, policy, gen)
        return policy

    def put_bucket_policy(self, bucket: str, text: str) -> None:
        """Check a policy document and store it as the bucket's policy, whole.

        Args:
            bucket: the bucket.
            text: the JSON document (see :mod:`gpufeed.engine._policy` for the language kept).

        Raises:
            NoSuchBucket: it does not exist.
            MalformedPolicy: the document is refused, with AWS's reason; nothing changes.
        """
        require_bucket(self._cat, bucket)
        parse_policy(text, bucket, self._principal)
        with self._cat.write() as w:
            require_bucket(w, bucket)
            w.set_bucket_config(bucket, POLICY_CONFIG, text)
            w.on_commit(lambda: self._forget_policy(bucket))

    def get_bucket_policy(self, bucket: str) -> str | None:
        """The bucket's policy document as stored, or ``None``.

        Raises:
            NoSuchBucket: it does not exist.
        """
        return self.get_bucket_config(bucket, POLICY_CONFIG)

    def delete_bucket_policy(self, bucket: str) -> bool:
        """Remove the bucket's policy.

        Returns:
            Whether it had one.

        Raises:
            NoSuchBucket: it does not exist.
        """
        with self._cat.write() as w:
            require_bucket(w, bucket)
            w.on_commit(lambda: self._forget_policy(bucket))
            return w.delete_bucket_config(bucket, POLICY_CONFIG)

    def authorize(self, tenant: str | None, action: str, bucket: str, key: str | None = None, *,
                  access_key: str | None = None, source_ip: str | None = None,
                  prefix: str | None = None) -> None:
        """Decide whether a request may act on a bucket; both fronts ask this.

        An explicit ``Deny`` of the bucket's policy wins, even against the
        owner; otherwise the owner may do anything to its bucket, and anyone
        else (another tenant, an anonymous caller) what an ``Allow`` statement
        grants (:func:`gpufeed.engine._policy.evaluate`). Getting, setting and
        deleting the policy itself are the owner's alone, and no policy takes
        them from the owner (as S3 keeps them for the account's root user).

        Args:
            tenant: the requester's tenant, ``None`` when anonymous.
            action: the S3 action name (``"s3:GetObject"``, ``"s3:PutObject"``,
                ``"s3:ListBucket"``, ...).
            bucket, key: the resource (``key`` ``None`` for the bucket itself).
            access_key: the key the request was signed with.
            source_ip: the client's address (``aws:SourceIp``).
            prefix: the ``prefix`` of a listing, ``""`` when it has none
                (``s3:prefix``); ``None`` for other actions.

        A write to a replica bucket is refused whoever asks
        (:meth:`~gpufeed.engine._replica.ReplicaTarget.check_writable`).

        Raises:
            NoSuchBucket: the bucket does not exist.
            AccessDenied: the request is not allowed (the message names nothing,
                but for a write to a replica bucket).

        Source: "Policy evaluation logic", IAM User Guide; "Bucket policy
        examples", Amazon S3 User Guide.
        """
        is_owner = self.bucket_owner(bucket) == tenant
        self.check_writable(bucket, action)
        if action in OWNER_ONLY_ACTIONS:
            if not is_owner:
                raise AccessDenied("Access Denied")
            return
        policy = self.bucket_policy(bucket)
        request = PolicyRequest(tenant, access_key, action, bucket, key, source_ip, prefix)
        if not evaluate(policy, request, is_owner=is_owner):
            raise AccessDenied("Access Denied")


class BucketMemo(Generic[T]):
    """Answers by bucket name (a parsed policy, a replica mark; ``None`` is an
    answer too), with a generation so a lookup racing a change never keeps the
    old answer: read ``gen``, look up, then :meth:`put` with that ``gen``."""

    def __init__(self) -> None:
        self._answers: dict[str, T | None] = {}
        self._lock = threading.Lock()
        self.gen = 0

    def get(self, bucket: str) -> tuple[bool, T | None]:
        """``(True, answer)`` when remembered, else ``(False, None)``."""
        try:
            return True, self._answers[bucket]
        except KeyError:
            return False, None

    def put(self, bucket: str, answer: T | None, gen: int) -> None:
        """Remember ``answer`` unless the bucket's answer changed since ``gen`` was read."""
        with self._lock:
            if gen == self.gen:
                if len(self._answers) > 100_000:
                    self._answers.clear()
                self._answers[bucket] = answer

    def forget(self, bucket: str) -> None:
        """The bucket's answer changed: drop it, and any lookup in flight."""
        with self._lock:
            self.gen += 1
            self._answers.pop(bucket, None)
