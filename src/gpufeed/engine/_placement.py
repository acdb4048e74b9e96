"""Rendezvous (highest-random-weight) placement: which nodes hold a chunk.

Every node of a cluster, given the same chunk digest and the same set of
live nodes, computes the same ordered list of nodes, with no table to keep
in step: each node gets a score ``hash(node id, digest)`` and the nodes are
ranked by score, highest first; the first ``replicas`` are the chunk's
places. This module provides that ranking (:func:`place`,
:func:`rank`) and nothing else: it reads no catalog and opens no
connection.

Properties (tests/engine/test_placement.py measures them):

- Minimal movement: when a node joins, a chunk's places change only where
  the new node ranks within the first ``replicas`` (about ``replicas / n``
  of the chunks, each losing one place to the newcomer); when a node leaves,
  only chunks it held change, each gaining the next-ranked node.
- Even spread: scores are uniform, so each of ``n`` nodes is first for
  about ``1 / n`` of the chunks.

The score is BLAKE2b with an 8-byte output over the node id (its length
first) and the chunk's digest, read as a big-endian integer: the same in
every process, Python version and machine (Python's ``hash`` is salted per
process, so it is never used).

Source: D. Thaler and C. Ravishankar, "Using name-based mappings to increase
hit rates", IEEE/ACM Transactions on Networking 6(1), 1998.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["score", "rank", "place"]


def score(node_id: str, digest: bytes) -> int:
    """The weight of ``node_id`` for the chunk ``digest``: an integer in ``[0, 2**64)``."""
    name = node_id.encode()
    h = hashlib.blake2b(len(name).to_bytes(4, "big") + name + digest, digest_size=8)
    return int.from_bytes(h.digest(), "big")


def rank(digest: bytes, nodes: Iterable[str]) -> list[str]:
    """Every node of ``nodes`` (ids, duplicates ignored), highest score for ``digest`` first
    (ties, vanishingly rare, broken by node id)."""
    return sorted(set(nodes), key=lambda n: (score(n, digest), n), reverse=True)


def place(digest: bytes, nodes: Iterable[str], replicas: int) -> list[str]:
    """The nodes that hold the chunk ``digest``, in order of preference.

    Args:
        digest: the chunk's content digest (any length).
        nodes: ids of the live nodes.
        replicas: how many copies the chunk should have (>= 1).

    Returns:
        The first ``min(replicas, len(set(nodes)))`` nodes of :func:`rank`;
        fewer than ``replicas`` when the cluster has fewer live nodes.

    Raises:
        ValueError: ``replicas`` < 1.
    """
    if replicas < 1:
        raise ValueError(f"a chunk needs at least 1 replica, not {replicas}")
    return rank(digest, nodes)[:replicas]
