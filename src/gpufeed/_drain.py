"""Moving data off a cluster node that is nearly full.

A member **drains** while its used bytes are past its high-water mark
(``GPUFEED_CLUSTER_DRAIN_HIGH`` of its capacity, 0.9) until they are back at
or under its low-water mark (``GPUFEED_CLUSTER_DRAIN_LOW``, 0.8; the figures
and the marks are :mod:`gpufeed.engine._room`'s). Its heartbeat publishes the
bytes it still has to move (``nodes.moving_bytes``), and placement
(:mod:`gpufeed._replicas`) ranks a draining member after every member with
room that does not drain: new writes, re-replication and rebalancing put
files elsewhere while enough others have room.

Each re-replication pass of a draining node (once its heartbeat has
published that it drains, so every member ranks it last) walks the data
files it holds, as holder or copy, in id order. For each, the file's **new
targets** are the first ``factor`` live members by rendezvous rank, other
than this node and the members that drain, that hold it or have room for
it: the targets placement gives it now. When there are ``factor`` of them
(else the file stays), the file is **moved**:

1. it is pushed (op CHUNK_PUT) to the new targets that lack it; each
   receiver checks every chunk against its block sums, fsyncs and renames
   the file into its folder before it replies;
2. the new copies are recorded in the catalog (``file_copies``);
3. this node gives its copy up in one catalog transaction that checks that
   ``factor`` other live members hold the file (as the chunks' holder, the
   best-ranked new target becomes the holder;
   :meth:`gpufeed.engine.Engine.give_up_file`);
4. only then is its file deleted.

So a file has at least ``factor`` live holders at every moment, and a
process killed at any step loses nothing: a copy made but not recorded, or a
file given up but not yet deleted, is named by no row and the orphan sweep
deletes it. Files go in groups (64 files at most, and about one second of
sending at the rate) over one connection per target node, with a pause
after each group that keeps to ``GPUFEED_CLUSTER_REREPLICATE_RATE`` bytes
per second on average (shared with re-replication), until the files moved
in the pass add up to the moving bytes the pass began with. A file with a chunk marked damaged
waits for its repair (its receivers would refuse it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from ._replicas import Files, Replicas
from .engine import Engine
from .engine._membership import NodeInfo
from .engine._placement import rank
from .engine._replicas import copy_length

__all__ = ["Drainer"]

log = logging.getLogger("gpufeed.cluster")

#: Data files moved at a time (over one connection per target node).
_GROUP = 64


class Drainer:
    """Moves copies of data files off this node while it drains (see the module's text).

    Args:
        engine: the node's engine.
        replicas: the node's :class:`~gpufeed._replicas.Replicas` (its ``room`` says whether it drains).
        batch: data files asked of the catalog at a time.

    Attributes:
        last_pass: counts of the last pass that ran (``moved``: files given up
            here after their copies were made; ``bytes``: their bytes;
            ``sent``: bytes pushed to other nodes; ``left``: files looked at
            that could not move: too few members with room, a failed push).
    """

    def __init__(self, engine: Engine, replicas: Replicas, *, batch: int = 500) -> None:
        self._engine, self._r, self._batch = engine, replicas, batch
        self.last_pass: dict[str, int] = {}

    def run_pass(self, pace: Callable[[int], None], stop: threading.Event,
                 group_bytes: int = 100 << 20) -> dict[str, int]:
        """Move files while this node drains, until those moved add up to its moving bytes.

        Args:
            pace: called with the bytes sent after each group (waits to keep the rate).
            stop: set when the node stops (the pass ends after the group under way).
            group_bytes: a group ends once its files add up to this many bytes (or
                64 files); the re-replicator gives its rate, about a second of sending.

        Returns:
            The pass's counts (all 0 when the node does not drain).
        """
        counts = {"moved": 0, "bytes": 0, "sent": 0, "left": 0}
        room, me = self._r.room, self._r.node_id
        live = {n.node_id: n for n in self._r.live()}
        if room is None or me not in live or live[me].moving_bytes <= 0:
            return counts
        to_move = room.usage().moving_bytes
        factor = min(self._r.factor, len(live))
        if to_move <= 0 or len(live) - 1 < factor:
            return counts
        damaged = self._engine.damaged_chunk_ids()
        after = ""
        while counts["bytes"] < to_move and not stop.is_set():
            files = self._engine.files_held(after, self._batch)
            if not files:
                break
            after = files[-1]
            i = 0
            while i < len(files) and not stop.is_set() and counts["bytes"] < to_move:
                budget = min(to_move - counts["bytes"], group_bytes)
                i += self._move(files[i:i + _GROUP], live, factor, damaged, budget, counts, pace)
        if counts["moved"] or counts["left"]:
            log.info("draining: moved %d data files (%d bytes) to other members, %d could not move; %d bytes "
                     "were to move", counts["moved"], counts["bytes"], counts["left"], to_move)
        self.last_pass = counts
        return counts

    def _targets(self, file: str, holders: list[str], size: int, live: dict[str, NodeInfo],
                 factor: int) -> list[str]:
        """The first ``factor`` live members by rank, but this node and those that drain,
        that hold ``file`` or have room for its ``size`` bytes (fewer: not enough)."""
        me = self._r.node_id
        return [n for n in rank(file.encode(), live)
                if n != me and live[n].wire_port and not self._r.draining(n, live[n])
                and (n in holders or self._r.fits(n, live[n], size))][:factor]

    def _move(self, files: list[str], live: dict[str, NodeInfo], factor: int, damaged: set[str],
              budget: int, counts: dict[str, int], pace: Callable[[int], None]) -> int:
        """Move the first files of ``files`` that can move, until they add up to ``budget``
        bytes (see the module's text). Returns how many of ``files`` it looked at (>= 1)."""
        me = self._r.node_id
        plans: dict[tuple[str, ...], Files] = {}  # new targets that lack them -> files
        have: dict[str, set[str]] = {}
        targets: dict[str, list[str]] = {}
        looked = 0
        for f in files:
            if budget <= 0:
                break
            looked += 1
            recs, holders = self._engine.file_holders(f)
            if not recs or me not in holders or any(r.chunk_id in damaged for r in recs) \
                    or not os.path.exists(self._engine.data_file_path(f)):
                continue
            size = copy_length(recs)
            new = self._targets(f, holders, size, live, factor)
            if len(new) < factor:
                counts["left"] += 1
                continue
            have[f], targets[f] = set(holders), new
            plans.setdefault(tuple(n for n in new if n not in holders), []).append((f, recs))
            budget -= size
        for missing, group in plans.items():
            got: dict[str, list[str]] = {f: [] for f, _ in group}
            errors: dict[str, list[str]] = {f: [] for f, _ in group}
            if missing:
                got, errors = self._r.place(group, {n: live[n] for n in missing}, len(missing), have)
                made = {f: nodes for f, nodes in got.items() if nodes}
                if made:
                    self._engine.record_file_copies(made)
            sent = sum(copy_length(recs) * len(got[f]) for f, recs in group)
            counts["sent"] += sent
            for f, recs in group:
                if len(got[f]) < len(missing):
                    counts["left"] += 1
                    log.warning("draining: data file %s reached %d of the %d members it moves to (%s); it stays "
                                "here", f, len(got[f]), len(missing), "; ".join(errors[f]) or "none took it")
                elif self._give_up(f, sorted(live), factor, targets[f], copy_length(recs)):
                    counts["moved"] += 1
                    counts["bytes"] += copy_length(recs)
                else:
                    counts["left"] += 1
            pace(sent)
        return max(1, looked)

    def _give_up(self, file: str, live: list[str], factor: int, targets: list[str], size: int) -> bool:
        """Give up this node's copy of ``file`` (``size`` bytes) to ``targets`` and delete it
        (:meth:`~.engine.Engine.give_up_file`), counted in :meth:`~.engine._room.NodeRoom.moved_off`."""
        gave = self._engine.give_up_file(file, live, factor, targets)
        if gave and self._r.room is not None:
            self._r.room.moved_off(size)
        return gave
