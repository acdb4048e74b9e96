"""Copies of data files across the nodes of a cluster: the push that a write
waits for, and the background job that restores the replication factor.

**Placement.** The nodes that should hold data file ``f`` are ranked by
rendezvous hashing of ``f``'s id over the live members
(:func:`gpufeed.engine._placement.rank`); every node computes the same order.
A node that has no room for the file (:mod:`gpufeed.engine._room`: it would
pass its capacity or its disk's reserve, by the figures of its last
heartbeat; :meth:`Replicas.fits`) is skipped unless it holds the file
already, and a member that drains (:mod:`gpufeed._drain`: its used bytes
passed its high-water mark) is ranked after every member that does not, so
``f``'s **targets** are the first ``factor`` live members in that order that
hold it or have room for it.

**Writes** (:meth:`Replicas.push`, installed as the engine's push function,
:mod:`gpufeed.engine._replicas`): each new data file goes to its targets.
When the writing node is one of them it keeps its own copy and sends the
file to the others; when it is not, it sends the file to all ``factor`` of
them (the first to take it becomes its chunks' holder) and deletes its own
after the write commits. So a write lands on its targets and nothing is
moved afterwards. A file is sent over the fast path's TCP transport (op
CHUNK_PUT, authenticated with node keys like CHUNK, :mod:`gpufeed._peers`):
the receiver checks that it fits, checks every chunk against its block sums,
fsyncs, and only then replies. A node that fails (refuses the connection,
times out, answers an error, has no room after all) is replaced by the
next-ranked one with room. The factor is capped to the live members: with
fewer live members than ``factor`` a write is stored on all of them (and
counted under replicated until more are live). When fewer live members than
that have room for a file, the write is refused with ``StorageFull`` (507)
before anything is sent; when fewer nodes than that take it, with
``ServiceUnavailable`` (503) naming each node's failure (``StorageFull`` when
every failure was a node without room); nothing of it becomes visible.

**Re-replication** (:class:`ReReplicator`, one daemon thread per node;
it also deletes, once they are ``orphan_grace_s`` old, the data files in the
node's folder that no chunk names: copies of deleted data, copies a refused
write left behind):
every ``interval_s`` it asks the catalog for data files with a chunk that has
fewer copies on live members than the (capped) factor; for each, the first
live node holding it in rank order is the one that copies it (so two nodes
never both copy it), sending it to the next-ranked live nodes with room that
lack it and recording the new copies; at most ``rate_bytes_s`` bytes per second are
sent (files go 64 at a time, over one connection per target node, with a
pause after each group).

After each pass the re-replicator also restores the copies of the part
files of open uploads that the node holds, when a member it last checked
with is gone (:mod:`gpufeed._partrepair`).

**Rebalancing** (:meth:`ReReplicator.rebalance_pass`, after each pass while
the set of live members differs from the one it last balanced for: a node
joined, came back, or left): each node walks the data files it holds (as
holder or copy). A file's **targets** are the first ``factor`` live members
by rank. When a member that is new to this node's view is a target of a file
and lacks it, the file's first live holder by rank sends it there (paced like
re-replication) and records the copy. When a file has more live holders than
the factor, the holders ranked below the first ``factor`` of them give their
copies up, each its own, in a catalog transaction that checks that ``factor``
other live nodes still hold it (:meth:`gpufeed.engine.Engine.give_up_file`),
and delete their files. So a joining node takes about ``factor / n`` of the
files, and the extra copies left by a node that returned after its files were
copied again elsewhere are trimmed (every pass also looks up, in one catalog
query, the files it holds that have more live holders than the factor, and
trims them the same way: :meth:`ReReplicator.trim_pass`; a member that
drains is ranked after the others there too, so its copy is the one given
up). Rebalancing moves files only toward new members: a file stays where
its write put it (its targets then) until a change of members makes a new
member one of its targets; a node that fills up keeps the files it holds
(holding a file counts as room for it) until it passes its high-water mark
and drains (:mod:`gpufeed._drain`), so nothing moves back and forth as
nodes fill and empty.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ._peers import PeerLink, read_reply
from .engine import Engine
from .engine._membership import Membership, NodeInfo
from .engine._placement import rank
from .engine._replicas import copy_length
from .engine._room import NodeRoom, node_draining, node_fits
from .engine.types import ChunkRecord
from .errors import GpufeedError, NoSuchKey, ProtocolError, ServiceUnavailable, StorageFull
from .wire import protocol as p

if TYPE_CHECKING:
    from ._drain import Drainer
    from ._partrepair import PartRestorer

__all__ = ["Replicas", "ReReplicator", "short_error"]

log = logging.getLogger("gpufeed.cluster")

Files = list[tuple[str, list[ChunkRecord]]]
#: Seconds before the same warning about one data file is logged again.
_RETELL_S = 600.0
#: Data files re-replication pushes at a time (over one connection per target node).
_GROUP = 64


def short_error(text: str, errors: list[str]) -> GpufeedError:
    """``StorageFull`` (507) with ``text`` when every failure in ``errors`` (one line per
    node, as :meth:`Replicas.place` gives them) was a node without room, by its last
    heartbeat or by its own answer; else ``ServiceUnavailable`` (503)."""
    if errors and all("(StorageFull" in e for e in errors):
        return StorageFull(text)
    return ServiceUnavailable(text)


class Replicas:
    """This node's side of copies of data files.

    Args:
        engine: the node's engine (it reads its own data files through it).
        link: the node's peer link (node keys, handshake).
        membership: the catalog's membership.
        cluster: the cluster's name.
        node_id: this node's id.
        factor: copies each data file should have (>= 1), this node's included.
        expiry_s: seconds after its last heartbeat at which a member is not live.
        timeout_s: the longest any one wait of a push may take (connecting, each send, the reply).
        room: this node's figures (:mod:`gpufeed.engine._room`); ``None``: it is taken to have room.

    Raises:
        ValueError: ``factor`` < 1 or ``timeout_s`` <= 0.
    """

    def __init__(self, engine: Engine, link: PeerLink, membership: Membership, *, cluster: str, node_id: str,
                 factor: int, expiry_s: float, timeout_s: float, room: NodeRoom | None = None) -> None:
        if factor < 1:
            raise ValueError(f"the replication factor must be >= 1, not {factor}")
        if not timeout_s > 0:
            raise ValueError(f"the cluster copy timeout must be > 0 s, not {timeout_s}")
        self._engine, self._link, self._m = engine, link, membership
        self.cluster, self.node_id = cluster, node_id
        self.factor, self.expiry_s, self.timeout_s = factor, expiry_s, timeout_s
        self.room = room

    def live(self) -> list[NodeInfo]:
        """The live members (this node among them while its heartbeats arrive)."""
        return [n for n in self._m.nodes(self.cluster) if n.live(self.expiry_s)]

    def fits(self, node: str, info: NodeInfo | None, nbytes: int) -> bool:
        """Whether ``node`` has room for a data file of ``nbytes`` bytes: this node by
        its own figures now, another by those of its last heartbeat (``info``)."""
        if node == self.node_id:
            return self.room is None or self.room.fits(nbytes)
        return info is None or node_fits(info, nbytes)

    def draining(self, node: str, info: NodeInfo | None) -> bool:
        """Whether ``node`` drains (:mod:`gpufeed._drain`): this node by its own figures
        now, another by those of its last heartbeat (``info``)."""
        if node == self.node_id:
            return self.room is not None and self.room.usage().draining
        return info is not None and node_draining(info)

    def room_first(self, nodes: list[str], infos: dict[str, NodeInfo]) -> list[str]:
        """``nodes`` (in rank order) with those that drain moved after the others,
        each group keeping its order (``infos``: the members' last heartbeats)."""
        slow = {n for n in nodes if self.draining(n, infos.get(n))}
        return [n for n in nodes if n not in slow] + [n for n in nodes if n in slow]

    def push(self, files: Files) -> dict[str, list[str]]:
        """Place each local data file of ``files`` on its targets (see the module's
        text), the next-ranked node with room taking over from one that fails.

        Returns:
            ``{file id: node ids that hold it}``, this node's first when it keeps
            the file (empty lists when the factor is 1).

        Raises:
            StorageFull: fewer live members than the (capped) factor have room for
                a file, or every node that failed had no room (nothing was kept).
            ServiceUnavailable: a file reached fewer nodes than needed (naming each failure).
        """
        if self.factor <= 1:
            return {f: [] for f, _ in files}
        reserved: dict[str, int] = {}  # bytes this node's room counts for its staged files until placed
        try:
            return self._push(files, reserved)
        finally:
            if self.room is not None:
                for n in reserved.values():
                    self.room.release(n)

    def _push(self, files: Files, reserved: dict[str, int]) -> dict[str, list[str]]:
        """:meth:`push`; this node's room reserves the bytes of each staged file it
        has room for in ``reserved`` (the caller releases them)."""
        me = self.node_id
        peers = {n.node_id: n for n in self.live() if n.node_id != me and n.wire_port}
        factor = min(self.factor, len(peers) + 1)
        keep: Files = []
        move: Files = []
        room_here: set[str] = set()  # files this node has room for, ranked past the targets or not
        for f, recs in files:
            size = copy_length(recs)
            fits = self.room_first([n for n in rank(f.encode(), [me, *peers])
                                    if self._room_for_staged(n, peers, f, size, reserved)], peers)
            if len(fits) < factor:
                raise StorageFull(self._no_room(f, size, factor, peers, fits))
            (keep if me in fits[:factor] else move).append((f, recs))
            room_here.update([f] if me in fits else [])
        got: dict[str, list[str]] = {}
        for group, need in ((keep, factor - 1), (move, factor)):
            if not group:
                continue
            placed, errors = self.place(group, peers, need, {})
            for f, _ in group:
                # a file some of whose targets refused stays here too when this node is next with room
                mine = group is keep or (len(placed[f]) == need - 1 and f in room_here)
                if len(placed[f]) + (mine and group is move) < need:
                    raise self._short(f, len(placed[f]), need, errors[f], len(peers) + 1, group is keep)
                got[f] = ([me] if mine else []) + placed[f]
        for f, recs in files:
            if self.room is not None and got[f][:1] == [me]:
                self.room.add_file(self._engine.data_file_path(f), copy_length(recs))
        return got

    def _room_for_staged(self, node: str, peers: dict[str, NodeInfo], file: str, size: int,
                         reserved: dict[str, int]) -> bool:
        """Whether ``node`` has room for a write's data file ``file`` (in this node's
        folder already); this node's room reserves the bytes (into ``reserved``)."""
        if node == self.node_id and self.room is not None:
            got = self.room.claim_staged(self._engine.data_file_path(file), size)
            if got > 0:
                reserved[file] = got
            return got >= 0
        return self.fits(node, peers.get(node), size)

    def _no_room(self, file: str, size: int, factor: int, peers: dict[str, NodeInfo], fits: list[str]) -> str:
        """Why data file ``file`` of ``size`` bytes cannot be placed (too few nodes with room)."""
        full = []
        for n in sorted({self.node_id, *peers} - set(fits)):
            free = self.room.usage().free_bytes if n == self.node_id and self.room is not None \
                else peers[n].free_bytes if n in peers else -1
            full.append(f"node {n}: {free} bytes free")
        return (f"data file {file} ({size} bytes) fits on {len(fits)} of the {factor} nodes that replication "
                f"factor {self.factor} needs with {len(peers) + 1} live members ({'; '.join(full)}); the write "
                "was not stored (GPUFEED_CAPACITY, GPUFEED_CLUSTER_RESERVE)")

    def _short(self, file: str, got: int, need: int, errors: list[str], members: int, kept: bool) -> GpufeedError:
        """The error of a write whose file ``file`` reached ``got`` of the ``need`` nodes it
        needs (besides this one when it ``kept`` the file)."""
        why = "; ".join(errors) or "no other live member with room to take it"
        text = (f"data file {file} reached {got} of the {need} {'other ' if kept else ''}nodes that replication "
                f"factor {self.factor} "
                f"needs with {members} live members ({why}); the write was not stored (GPUFEED_CLUSTER_REPLICAS)")
        return short_error(text, errors)

    def place(self, files: Files, peers: dict[str, NodeInfo], need: int,
              have: dict[str, set[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Send each file to ``need`` nodes of ``peers`` it is not on (``have``) that have
        room for it (:meth:`fits`), in rank order, trying the next-ranked such node for
        each failure; one connection per node.

        Returns:
            ``({file: nodes that took it}, {file: failures, one line per node: those
            without room by their last heartbeat, then those that refused})``.
        """
        recs = dict(files)
        got: dict[str, list[str]] = {f: [] for f in recs}
        errors: dict[str, list[str]] = {f: [] for f in recs}
        order: dict[str, list[str]] = {}
        for f in recs:
            size, lacking = copy_length(recs[f]), [n for n in rank(f.encode(), peers) if n not in have.get(f, ())]
            order[f] = self.room_first([n for n in lacking if self.fits(n, peers[n], size)], peers)
            errors[f] += [f"node {n}: {peers[n].free_bytes} bytes free by its last heartbeat, the file has {size} "
                          "(StorageFull)" for n in lacking if n not in order[f]]
        while True:
            plan: dict[str, list[str]] = {}
            for f in recs:
                asked = 0
                while len(got[f]) + asked < need and order[f]:
                    plan.setdefault(order[f].pop(0), []).append(f)
                    asked += 1
            if not plan:
                return got, errors
            with ThreadPoolExecutor(len(plan), thread_name_prefix="gpufeed-push") as pool:
                done = list(pool.map(lambda item: (item[0], self._push_to(peers[item[0]], item[1], recs)),
                                     plan.items()))
            for node, (ok, failed) in done:
                for f in ok:
                    got[f].append(node)
                for f, why in failed.items():
                    errors[f].append(why)

    def _push_to(self, info: NodeInfo, files: list[str],
                 recs: dict[str, list[ChunkRecord]]) -> tuple[list[str], dict[str, str]]:
        """Push ``files`` to one node over one connection: ``(taken, {file: why not})``."""
        where = f"node {info.node_id} at {info.host}:{info.wire_port}"
        ok: list[str] = []
        failed: dict[str, str] = {}
        try:
            with socket.create_connection((info.host, info.wire_port), timeout=self.timeout_s) as sock:
                self._link.authenticate(sock)
                for f in files:
                    try:
                        self._send_file(sock, f, recs[f])
                        ok.append(f)
                    except GpufeedError as exc:  # an error reply: the connection stays framed
                        failed[f] = f"{where}: {exc.message}"
        except TimeoutError:
            why = f"{where} did not answer within {self.timeout_s:.1f} s (GPUFEED_CLUSTER_COPY_TIMEOUT_S)"
            failed.update({f: why for f in files if f not in ok and f not in failed})
        except (OSError, ProtocolError, GpufeedError) as exc:
            why = f"{where}: {exc.message if isinstance(exc, GpufeedError) else exc}"
            failed.update({f: why for f in files if f not in ok and f not in failed})
        return ok, failed

    def _send_file(self, sock: socket.socket, file: str, recs: list[ChunkRecord]) -> None:
        """One CHUNK_PUT: the chunks' sums, then the file's bytes by ``sendfile``; waits for the reply.

        Raises:
            GpufeedError: the node answered with an error, or ``NoSuchKey`` (before
                anything was sent) when the file was deleted meanwhile.
            OSError, ProtocolError: the connection failed (it is then unusable).
        """
        length = copy_length(recs)
        meta = p.encode(p.ChunkPut(file, length, [
            p.CopyChunk(r.chunk_id, r.file_offset, r.stored, r.size, r.codec, r.digest, r.domain, r.sum_kind,
                        len(r.sums)) for r in recs]))
        sums = b"".join(r.sums for r in recs)
        try:
            src = open(self._engine.data_file_path(file), "rb")
        except FileNotFoundError:  # deleted meanwhile (its data freed): nothing sent, the connection stays framed
            raise NoSuchKey(f"data file {file} is no longer in this node's folder (deleted meanwhile)") from None
        with src as f:
            started = time.monotonic()
            sock.sendall(p.pack_header(p.Op.CHUNK_PUT, len(meta), 1, len(sums) + length) + meta + sums)
            sent = sock.sendfile(f, 0, length)  # os.sendfile, waiting up to the socket's timeout per send
            if sent != length:
                raise ProtocolError(f"data file {file} ended after {sent} of {length} bytes")
        got, payload = read_reply(sock, p.Op.CHUNK_PUT, started)
        if payload:
            raise ProtocolError(f"a payload of {payload} bytes on a CHUNK_PUT reply")
        p.decode(p.ChunkPutReply, got)


class ReReplicator:
    """Restores the replication factor in the background (see the module's text).

    Args:
        engine: the node's engine.
        replicas: the node's :class:`Replicas`.
        interval_s: seconds between passes (> 0).
        rate_bytes_s: most bytes sent per second, over a pass (> 0).
        batch: data files asked of the catalog at a time.
        orphan_grace_s: data files in the folder that no chunk names are deleted
            once this many seconds old (checked about every quarter of it, at
            most once a pass; 0: never).
        parts: restores the copies of this node's part files of open uploads
            after each pass, paced with the data files (``None``: it does not).
        drain: moves data files off this node while it drains, after each pass,
            paced with the copies (:mod:`gpufeed._drain`; ``None``: it does not).

    Attributes:
        copied_files, copied_bytes: what it copied since start.
        last_pass: counts of the last pass (``files``, ``bytes``, ``left``: files
            still under-replicated that this node could not copy or was not the one to).
    """

    def __init__(self, engine: Engine, replicas: Replicas, *, interval_s: float, rate_bytes_s: float,
                 batch: int = 500, orphan_grace_s: float = 0.0, rebalance: bool = True,
                 parts: PartRestorer | None = None, drain: Drainer | None = None) -> None:
        if not interval_s > 0 or not rate_bytes_s > 0:
            raise ValueError("the re-replication interval and rate must be > 0")
        self._engine, self._r = engine, replicas
        self.interval_s, self.rate_bytes_s, self._batch = interval_s, rate_bytes_s, batch
        self.copied_files = self.copied_bytes = 0
        self.last_pass: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufeed-rereplicate", daemon=True)
        self._next_send = 0.0
        self.orphan_grace_s = orphan_grace_s
        self._swept_at = time.monotonic()
        #: data files no chunk names that the sweeps deleted since start
        self.freed_files = 0
        self.rebalance = rebalance
        self.last_rebalance: dict[str, int] = {}
        self._balanced_for: frozenset[str] | None = None  # live members of the last complete rebalance
        self._rebalance_tries = 0
        self._seen_members: frozenset[str] | None = None  # live members at the last pass (logged when they change)
        self.parts = parts
        self.drain = drain
        self._told_damaged: set[str] = set()  # damaged files not copied, logged once each
        self._told: dict[str, tuple[str, float]] = {}  # file -> (warning, monotonic s) last logged for it

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the file in progress."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._note_members()
                self.run_pass()
                if self.rebalance:
                    self.rebalance_pass()
                    self.trim_pass()
                if self.orphan_grace_s > 0 and time.monotonic() - self._swept_at >= self.orphan_grace_s / 4:
                    self._swept_at = time.monotonic()
                    self.freed_files += self._engine.free_unnamed_files(self.orphan_grace_s)
                    self.freed_files += self._engine.free_unnamed_parts(self.orphan_grace_s)
                if self.parts is not None:
                    self.parts.run_pass(self._pace, self._stop)
                if self.drain is not None:
                    self.drain.run_pass(self._pace, self._stop, max(1, int(self.rate_bytes_s)))
            except GpufeedError as exc:
                log.warning("re-replication pass stopped: %s", exc.message)
            except Exception:
                log.exception("re-replication pass failed")

    def _note_members(self) -> None:
        """Log each change of the live members this node sees: a member that expired
        (its copies get made again elsewhere) as a warning, one that joined as info."""
        members = frozenset(n.node_id for n in self._r.live())
        seen, self._seen_members = self._seen_members, members
        if seen is None or members == seen:
            return
        gone, joined = sorted(seen - members), sorted(members - seen)
        what = ([f"gone (left or expired): {', '.join(gone)}"] * bool(gone)
                + [f"joined: {', '.join(joined)}"] * bool(joined))
        (log.warning if gone else log.info)("live members: %d (%s)", len(members), "; ".join(what))

    def run_pass(self) -> dict[str, int]:
        """One pass over the under-replicated data files. Returns its counts."""
        live = {n.node_id: n for n in self._r.live()}
        me = self._r.node_id
        factor = min(self._r.factor, len(live))
        counts = {"files": 0, "bytes": 0, "left": 0}
        after = ""
        damaged = self._engine.damaged_chunk_ids() if factor > 1 and me in live else set()
        while factor > 1 and me in live and not self._stop.is_set():
            files = self._engine.under_replicated_files(sorted(live), factor, after, self._batch)
            if not files:
                break
            after = files[-1]
            for i in range(0, len(files), _GROUP):
                if self._stop.is_set():
                    break
                done, sent, left = self._restore(files[i:i + _GROUP], live, factor, damaged)
                counts["files"] += done
                counts["bytes"] += sent
                counts["left"] += left
        self.last_pass = counts
        if counts["files"]:
            log.info("re-replication: %d data files copied again (%d bytes) to restore %d copies each; %d left",
                     counts["files"], counts["bytes"], factor, counts["left"])
        return counts

    def _restore(self, files: list[str], live: dict[str, NodeInfo], factor: int,
                 damaged: set[str]) -> tuple[int, int, int]:
        """Copy the data files of ``files`` that this node is the one to copy (the
        first live holder by rank) to the live nodes they lack, one connection per
        node; a file with a chunk marked damaged (ids in ``damaged``) is left
        until a repair clears the mark (its receivers would refuse it). Returns
        ``(files restored, bytes sent, files left)``."""
        me = self._r.node_id
        by_need: dict[int, list[tuple[str, list[ChunkRecord]]]] = {}
        have: dict[str, set[str]] = {}
        left = 0
        for f in files:
            recs, holders = self._engine.file_holders(f)
            live_holders = [n for n in holders if n in live]
            if not recs or not live_holders or rank(f.encode(), live_holders)[0] != me \
                    or not os.path.exists(self._engine.data_file_path(f)):
                left += 1
                continue
            bad = [r.chunk_id for r in recs if r.chunk_id in damaged]
            if bad:
                left += 1
                if f not in self._told_damaged:
                    if len(self._told_damaged) > 10_000:
                        self._told_damaged.clear()
                    self._told_damaged.add(f)
                    log.warning("re-replication of data file %s waits: chunk %s is marked damaged (a copy of it "
                                "would be refused); scrub repairs it from a good copy, or see 'gpufeed scrub'",
                                f, bad[0])
                continue
            have[f] = set(holders)
            by_need.setdefault(factor - len(live_holders), []).append((f, recs))
        peers = {n: info for n, info in live.items() if n != me and info.wire_port}
        done = sent = 0
        for need, group in by_need.items():
            got, errors = self._r.place(group, peers, need, have)
            made = {f: nodes for f, nodes in got.items() if nodes}
            if made:
                self._engine.record_file_copies(made)
            lengths = {f: copy_length(recs) for f, recs in group}
            nbytes = sum(lengths[f] * len(nodes) for f, nodes in made.items())
            for f, _ in group:
                if len(got[f]) < need:
                    left += 1
                    self._warn_once(f, f"re-replication of data file {f}: {len(got[f])} of {need} copies made "
                                       f"({'; '.join(errors[f]) or 'no live member lacks it'})")
                else:
                    done += 1
            self.copied_files += len(made)
            self.copied_bytes += nbytes
            sent += nbytes
            self._pace(nbytes)
        return done, sent, left

    def _warn_once(self, file: str, message: str) -> None:
        """Log ``message`` about ``file`` as a warning, unless the same one was logged
        for it in the last :data:`_RETELL_S` seconds (a file that cannot be copied
        is tried again at every pass)."""
        now = time.monotonic()
        told = self._told.get(file)
        if told is not None and told[0] == message and now - told[1] < _RETELL_S:
            return
        if len(self._told) > 10_000:
            self._told.clear()
        self._told[file] = (message, now)
        log.warning("%s", message)

    def rebalance_pass(self) -> dict[str, int]:
        """Move this node's data files toward their targets once the live members
        changed (see the module's text). Returns its counts: ``copied`` (copies
        made), ``bytes`` (sent), ``given_up`` (this node's copies deleted),
        ``left`` (files waiting for another node or a failed step)."""
        live = {n.node_id: n for n in self._r.live()}
        members = frozenset(live)
        counts = {"copied": 0, "bytes": 0, "given_up": 0, "left": 0}
        factor = min(self._r.factor, len(live))
        if members == self._balanced_for or self._r.node_id not in live or factor < 1:
            return counts
        # members new to this node's view; at its start, itself (the others see it join)
        new = members - self._balanced_for if self._balanced_for is not None else {self._r.node_id}
        after = ""
        while not self._stop.is_set():
            files = self._engine.files_held(after, self._batch)
            if not files:
                break
            after = files[-1]
            for i in range(0, len(files), _GROUP):
                for k, v in self._rebalance(files[i:i + _GROUP], live, factor, new).items():
                    counts[k] += v
        self._rebalance_tries += 1
        if not self._stop.is_set() and (counts["left"] == 0 or self._rebalance_tries >= 5):
            if counts["left"]:
                log.warning("rebalancing for %d live members: %d data files still off their targets after %d "
                            "passes; the next change of members tries again", len(live), counts["left"],
                            self._rebalance_tries)
            self._balanced_for, self._rebalance_tries = members, 0
        self.last_rebalance = counts
        if counts["copied"] or counts["given_up"]:
            log.info("rebalancing for %d live members: %d copies made (%d bytes), %d copies given up, %d files left",
                     len(live), counts["copied"], counts["bytes"], counts["given_up"], counts["left"])
        return counts

    def trim_pass(self) -> int:
        """Give up this node's copies of files with more live holders than the
        factor where it ranks past the first ``factor`` of them (copies made while
        a returning node's files were still being copied again elsewhere). One
        catalog query per pass when there are none. Returns the copies given up."""
        infos = {n.node_id: n for n in self._r.live()}
        live = sorted(infos)
        me = self._r.node_id
        factor = min(self._r.factor, len(live))
        given = 0
        after = ""
        while factor >= 1 and me in live and not self._stop.is_set():
            files = self._engine.over_replicated_files(live, factor, after, self._batch)
            if not files:
                break
            after = files[-1]
            for f in files:
                _recs, holders = self._engine.file_holders(f)
                ranked = self._r.room_first(rank(f.encode(), [n for n in holders if n in infos]), infos)
                if me in ranked[factor:] and self._engine.give_up_file(f, live, factor, ranked[:factor]):
                    given += 1
        if given:
            log.info("gave up this node's copies of %d data files held by more than %d live members", given, factor)
        return given

    def _rebalance(self, files: list[str], live: dict[str, NodeInfo], factor: int,
                   new: set[str] | frozenset[str]) -> dict[str, int]:
        me = self._r.node_id
        counts = {"copied": 0, "bytes": 0, "given_up": 0, "left": 0}
        sends: dict[tuple[str, ...], Files] = {}  # missing targets -> files this node sends them
        have: dict[str, set[str]] = {}
        for f in files:
            recs, holders = self._engine.file_holders(f)
            live_holders = rank(f.encode(), [n for n in holders if n in live])
            if not recs or not live_holders:
                continue
            size = copy_length(recs)
            targets = self._r.room_first([n for n in rank(f.encode(), list(live))
                                          if n in holders or self._r.fits(n, live[n], size)], live)[:factor]
            missing = tuple(n for n in targets if n in new and n not in holders)
            if missing:
                if live_holders[0] != me or not os.path.exists(self._engine.data_file_path(f)):
                    counts["left"] += 1  # its first live holder sends it
                    continue
                have[f] = set(holders)
                sends.setdefault(missing, []).append((f, recs))
            elif len(live_holders) > factor and me in (kept := self._r.room_first(live_holders, live))[factor:]:
                gave = self._engine.give_up_file(f, sorted(live), factor, kept[:factor])
                counts["given_up" if gave else "left"] += 1
        for missing, group in sends.items():
            peers = {n: live[n] for n in missing if live[n].wire_port}
            got, errors = self._r.place(group, peers, len(missing), have)
            made = {f: nodes for f, nodes in got.items() if nodes}
            if made:
                self._engine.record_file_copies(made)
            nbytes = sum(copy_length(recs) * len(got[f]) for f, recs in group)
            for f, _ in group:
                if len(got[f]) < len(missing):
                    counts["left"] += 1
                    log.warning("rebalancing data file %s: %d of %d copies made (%s)", f, len(got[f]),
                                len(missing), "; ".join(errors[f]) or "no target took it")
            counts["copied"] += sum(len(n) for n in made.values())
            counts["bytes"] += nbytes
            self.copied_bytes += nbytes
            self._pace(nbytes)
        return counts

    def _pace(self, sent: int) -> None:
        """Wait so that the bytes sent stay under ``rate_bytes_s`` on average."""
        now = time.monotonic()
        self._next_send = max(self._next_send, now) + sent / self.rate_bytes_s
        self._stop.wait(max(0.0, self._next_send - now))
