"""Who is asking: access keys to secrets and tenants, and the rule that a
tenant reaches only its own buckets unless their policies say otherwise.

Keys are resolved by the engine's :class:`~gpufeed.engine.KeyRing` (the same
the fast path uses): the node's configured key acts for
:data:`~gpufeed.engine.types.DEFAULT_TENANT`; every other key is looked up in
the engine (answered from memory after the first use). A request on a bucket of another
tenant is refused with ``AccessDenied`` and a message that names nothing, as
S3 answers a bucket of another account, unless that bucket's policy grants it
(:mod:`._policy`); a bucket that does not exist stays ``NoSuchBucket``.

The tenant of the request being handled is in :data:`CURRENT_TENANT` and the
owner of the bucket it acts on in :data:`BUCKET_OWNER` (context variables set
per request), so answers that name an owner name the bucket's owner, or the
requester's tenant where no bucket is named (ListBuckets).

Source: "Bucket ownership" and "Access denied (403 Forbidden) errors",
Amazon S3 User Guide, https://docs.aws.amazon.com/AmazonS3/latest/userguide/
"""

from __future__ import annotations

import contextvars
import hashlib

from ..config import NodeConfig
from ..engine.types import DEFAULT_TENANT

__all__ = ["CURRENT_TENANT", "BUCKET_OWNER", "owner_identity", "answer_owner"]

#: The tenant of the request being handled (``None`` before authentication).
CURRENT_TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("gpufeed_tenant", default=None)
#: The tenant owning the bucket the request acts on (``None`` when it names no
#: bucket): the owner S3 answers name, also to a tenant a bucket policy lets in.
BUCKET_OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("gpufeed_bucket_owner", default=None)


def answer_owner() -> str | None:
    """The tenant an answer names as owner: the bucket's, else the requester's."""
    return BUCKET_OWNER.get() or CURRENT_TENANT.get()


def owner_identity(config: NodeConfig, tenant: str | None) -> tuple[str, str]:
    """``(ID, DisplayName)`` of a tenant as S3 answers an Owner: the default
    tenant shows the node's access key id, another tenant its name."""
    if tenant is None or tenant == DEFAULT_TENANT:
        return hashlib.sha256(config.access_key.encode()).hexdigest(), config.access_key
    return hashlib.sha256(f"tenant:{tenant}".encode()).hexdigest(), tenant
