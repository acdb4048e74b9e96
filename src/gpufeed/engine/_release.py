"""The one test every path that frees object data passes: is a blob still named?

A blob (a version's data) may be named by several catalog rows at once: the
key's current object, noncurrent versions, and entries of any number of
snapshots (a restore makes a snapshot's version current again with the same
blob id, no data copied). So a path that drops a row (an overwrite, a delete, a
lifecycle expiry, a kv eviction, a snapshot deletion) may free its blob only
when no row names it any more. Every such path collects the blob ids of the
rows it dropped and passes them through :func:`releasable` inside its write
transaction, after its last row change; the engine removes what comes back
after the commit (``BlobFiles.remove_blobs``). Deciding inside the transaction
keeps it exact: no other writer can add or drop a reference meanwhile.
"""

from __future__ import annotations

from .catalog import CatalogWriter

__all__ = ["releasable"]


def releasable(w: CatalogWriter, blob_ids: list[str]) -> list[str]:
    """The blob ids among ``blob_ids`` that no row of the catalog names any more.

    Args:
        w: the open write transaction, after the caller's row changes.
        blob_ids: blobs of rows the caller dropped (duplicates and ``""`` allowed).

    Returns:
        The distinct ids whose data may be freed after the commit, in first-seen order.
    """
    ids = list(dict.fromkeys(b for b in blob_ids if b))
    if not ids:
        return []
    kept = w.referenced_blobs(ids)
    return [b for b in ids if b not in kept]
