"""The data services of :class:`~gpufeed.engine.Engine`: each bucket's data
policy (compression, dedup, chunking, verification), stored-vs-logical usage,
the node's capacity, and scrub. A mixin, like :mod:`._versioning`.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable

from ._chunks import CDC_DEFAULT_BYTES, POLICY_CONFIG, ChunkStore, parse_policy, policy_json
from ._repair import repair
from ._scrub import ScrubReport, ScrubRunner, scrub
from .catalog import Catalog, require_bucket
from .types import DataPolicy

__all__ = ["DataServices"]


class DataServices:
    """Bucket data policies, data usage and scrub, mixed into the Engine."""

    _cat: Catalog
    _chunks: ChunkStore
    #: Background scrubs (on demand, or on a schedule the node sets): see
    #: :class:`~gpufeed.engine._scrub.ScrubRunner`.
    scrubber: ScrubRunner

    def set_bucket_data(self, bucket: str, policy: DataPolicy | None = None, **changes) -> DataPolicy:
        """Set how a bucket stores the data of versions written from now on.

        Args:
            bucket: bucket name.
            policy: the whole policy; or ``None`` to change fields of the current one.
            **changes: fields of :class:`DataPolicy` to change (``compression="zstd"``, ...).

        Returns:
            The bucket's policy now.

        Raises:
            NoSuchBucket: it does not exist.
            InvalidArgument: a field is unknown or out of range (see :class:`DataPolicy`).
        """
        base = policy if policy is not None else self.bucket_data(bucket)
        doc = dataclasses.asdict(base)
        doc.update(changes)
        if doc.get("chunking") == "cdc" and "chunk_bytes" not in changes and doc["chunk_bytes"] > CDC_DEFAULT_BYTES:
            doc["chunk_bytes"] = CDC_DEFAULT_BYTES  # the fixed default is too large an average for cdc
        new = parse_policy(doc)
        with self._cat.write() as w:
            require_bucket(w, bucket)
            w.set_bucket_config(bucket, POLICY_CONFIG, policy_json(new))
            w.on_commit(lambda: self._chunks.forget_policy(bucket))
        return new

    def bucket_data(self, bucket: str) -> DataPolicy:
        """The data policy of ``bucket``.

        Raises:
            NoSuchBucket: it does not exist.
        """
        require_bucket(self._cat, bucket)
        return self._chunks.policy(bucket)

    def data_stats(self, bucket: str) -> dict:
        """How a bucket's data is stored.

        Returns:
            ``{"logical_bytes", "stored_bytes", "chunks", "ratio", "compression",
            "dedup", "chunking", "chunk_bytes", "verify"}``: ``logical_bytes`` sums
            every version with data; ``stored_bytes`` sums the chunks this
            bucket stored, each once (a chunk dedup shares with another bucket
            of the tenant counts in the one that stored it first); ``ratio`` is
            logical / stored (1.0 when empty);
            ``verify`` False means reads of this bucket are not checked.

        Raises:
            NoSuchBucket: it does not exist.
        """
        p = self.bucket_data(bucket)
        logical, stored, n = self._cat.bucket_data_usage(bucket)
        return {"logical_bytes": logical, "stored_bytes": stored, "chunks": n,
                "ratio": round(logical / stored, 3) if stored else 1.0,
                "compression": p.compression if p.compression != "zstd" else f"zstd:{p.level}",
                "dedup": p.dedup, "chunking": p.chunking, "chunk_bytes": p.chunk_bytes, "verify": p.verify}

    def node_data_stats(self) -> dict:
        """The node's data folder.

        Returns:
            ``{"chunks", "stored_bytes", "data_bytes", "capacity_bytes",
            "damaged_chunks", "damaged_reads"}``: ``data_bytes`` is what the
            chunks hold before compression; ``capacity_bytes`` 0 means no limit.
        """
        n, stored, size = self._cat.chunk_totals()
        return {"chunks": n, "stored_bytes": stored, "data_bytes": size,
                "capacity_bytes": self._chunks.capacity_bytes, "damaged_chunks": len(self._cat.damaged_chunks()),
                "damaged_reads": self._chunks.damaged_reads}

    def damaged_chunks(self) -> list[dict]:
        """Chunks marked damaged: ``{"chunk", "reason", "found", "objects"}`` each,
        ``objects`` up to ten ``[bucket, key, version_id]`` that use it."""
        return [{"chunk": cid, "reason": reason, "found": found,
                 "objects": [list(u) for u in self._cat.chunk_users(cid)]}
                for cid, (reason, found) in sorted(self._cat.damaged_chunks().items())]

    def scrub(self, *, rate_bytes_s: float = 0, stop: threading.Event | None = None,
              progress: Callable[[int, int], None] | None = None) -> ScrubReport:
        """Read and check every chunk (see :mod:`._scrub`); safe while the node
        serves requests. A node that fetches from other nodes of its cluster
        (:meth:`use_peers`) repairs each damaged data file from another node's
        good copy (:mod:`._repair`).

        Args:
            rate_bytes_s: most bytes read per second (0: no limit).
            stop: an event that ends the walk early.
            progress: called with ``(chunks, bytes)`` done after each chunk.

        Returns:
            A :class:`~gpufeed.engine._scrub.ScrubReport`.
        """
        fix = functools.partial(repair, self._chunks, self._cat) if self._chunks.remote is not None else None
        return scrub(self._chunks, self._cat, rate_bytes_s=rate_bytes_s, stop=stop, progress=progress, repair=fix)
