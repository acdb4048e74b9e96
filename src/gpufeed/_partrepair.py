"""Restoring the copies of acknowledged part files after a member is lost.

An acknowledged part is on ``factor`` nodes (:mod:`gpufeed._partcopies`); the
catalog records which (``part_copies``, what ``under_replicated_parts`` of the
cluster status counts), but the restore goes by the members' folders, which
it asks. After a member stops being live, each live
member checks the part files of open uploads that it holds
(:meth:`PartRestorer.run_pass`, on the re-replication pass's schedule,
:class:`gpufeed._replicas.ReReplicator`):

1. it lists its own upload folders and, in the catalog, the open uploads
   among them and their parts whose files (those the part rows name) are here;
2. it asks every other live member, all at once, which of those files it
   holds (PART ``has``);
3. for each part with fewer live holders than the (capped) factor, the first
   of its live holders in the upload's rank order (every holder computes the
   same one) sends it to the next live members in that order that lack it
   (PART ``put``: MD5 against the part's ETag, fsync before the reply),
   paced at the re-replication rate, and records the holders it found and
   the new ones in the catalog.

So two holders that see the same members never both copy a part. Holders that
see different members (one not yet expired in one view) may both copy it: the
extra copy stays until the upload completes or is aborted, which deletes the
part files on every node. A part of an upload that ended meanwhile is not
copied (the receiver answers ``NoSuchUpload``, and the copies made are deleted
again); a copy that lands after the end's deletes is removed by the
receiver's orphan sweep (it keeps only the part files a part row names).

A check runs at the node's first pass, after any member it last checked with
is no longer live, after members join when its last check had fewer live
members than the factor, and at every pass while its last check left a part
short; otherwise a pass costs nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from ._partcopies import PartCopies
from ._replicas import Replicas
from .engine import Engine
from .engine._placement import rank
from .engine.catalog import PartRecord
from .engine.types import UploadInfo
from .errors import NoSuchUpload

__all__ = ["PartRestorer"]

log = logging.getLogger("gpufeed.cluster")


class PartRestorer:
    """Restores the copies of the part files this node holds (see the module's text).

    Args:
        engine: the node's engine (its upload folders, the catalog's upload and part rows).
        copies: the node's :class:`~gpufeed._partcopies.PartCopies`.
        replicas: the node's :class:`~gpufeed._replicas.Replicas` (live members, factor, node id).

    Attributes:
        copied_files, copied_bytes: copies made since start (one per node that took one).
        last_check: counts of the last check that ran (``parts`` looked at,
            ``copies`` made, ``bytes`` sent, ``left``: parts this node should copy
            and could not bring to the factor).
    """

    def __init__(self, engine: Engine, copies: PartCopies, replicas: Replicas) -> None:
        self._engine, self._copies, self._r = engine, copies, replicas
        self.copied_files = self.copied_bytes = 0
        self.last_check: dict[str, int] = {}
        self._checked_for: frozenset[str] | None = None  # live members at the last check
        self._capped = False  # the last check had fewer live members than the factor
        self._left = 0

    def _due(self, members: frozenset[str]) -> bool:
        if self._checked_for is None or self._left or self._checked_for - members:
            return True
        return self._capped and bool(members - self._checked_for)

    def run_pass(self, pace: Callable[[int], None], stop: threading.Event) -> dict[str, int]:
        """Check and restore this node's part files when due (see the module's text).

        Args:
            pace: called with the bytes sent after each part (it waits to keep the rate).
            stop: set when the node stops (the pass ends after the part in progress).

        Returns:
            The check's counts, or ``{}`` when none was due.
        """
        live = sorted(n.node_id for n in self._r.live())
        members = frozenset(live)
        me = self._r.node_id
        if not self._due(members):
            self._checked_for = members  # a member that joined is checked for once it leaves
            return {}
        factor = min(self._r.factor, len(live))
        counts = {"parts": 0, "copies": 0, "bytes": 0, "left": 0}
        if me in members and factor > 1:
            for upload, recs in self._engine.open_parts_here():
                if stop.is_set():
                    break
                for k, v in self._upload(upload, recs, factor, pace, stop).items():
                    counts[k] += v
        self._checked_for, self._left = members, counts["left"]
        self._capped = len(live) < self._r.factor
        self.last_check = counts
        return counts

    def _upload(self, upload: UploadInfo, recs: list[PartRecord], factor: int, pace: Callable[[int], None],
                stop: threading.Event) -> dict[str, int]:
        """Bring the parts ``recs`` of one upload (their files here) to ``factor`` live copies."""
        me, up = self._r.node_id, upload.upload_id
        counts = {"parts": len(recs), "copies": 0, "bytes": 0, "left": 0}
        others = self._copies.holders(upload.bucket, upload.key, up, [r.file for r in recs])
        restored = 0
        for rec in recs:
            have = others[rec.file] | {me}
            if len(have) >= factor or rank(up.encode(), have)[0] != me or stop.is_set():
                continue  # enough copies, or another holder is the one to copy it
            path = self._engine.part_file_path(up, rec.file)
            if not os.path.isfile(path):
                continue  # the upload ended, or the part was uploaded again, meanwhile
            try:
                got, errors = self._copies.copy_more(upload.bucket, upload.key, up, rec.file, path, rec.info.etag,
                                                     have, factor - len(have))
            except NoSuchUpload:
                log.info("upload %s (%s/%s) ended while its parts were copied again", up, upload.bucket, upload.key)
                break
            if got:  # with the holders it found, so a part whose copies went unrecorded is complete
                self._engine.record_part_copies(up, rec.file, sorted(have | set(got)))
            nbytes = rec.info.size * len(got)
            counts["copies"] += len(got)
            counts["bytes"] += nbytes
            self.copied_files += len(got)
            self.copied_bytes += nbytes
            restored += 1 if got else 0
            if len(have) + len(got) < factor:
                counts["left"] += 1
                log.warning("part %d of upload %s (%s/%s): %d of %d copies made (%s)", rec.info.part_number, up,
                            upload.bucket, upload.key, len(got), factor - len(have),
                            "; ".join(errors) or "no live member lacks it")
            pace(nbytes)
        if restored:
            log.info("upload %s (%s/%s): copied %d part files again (%d copies, %d bytes) to restore replication "
                     "factor %d", up, upload.bucket, upload.key, restored, counts["copies"], counts["bytes"], factor)
        return counts
