"""Replication to a second site: asynchronous, snapshot-based copies of a bucket
to a bucket of another gpufeed node.

The source node keeps one rule per source bucket (:class:`Replicator`); each
rule is a JSON file ``replication/<bucket>.json`` in the data folder (mode
``0600``, like every secret there: it holds the target key), with its
counters and the state of the round in progress. A round
(:meth:`Replicator.sync`; the node's :class:`ReplicationWorker` runs one per
rule every ``replication_interval_s``):

1. takes a snapshot of the bucket (kind ``replication``, named
   ``auto-repl-<ms>``), unless a round is already open (a round resumes
   where it stopped);
2. diffs it with the last snapshot fully replicated (none: every key);
3. for each added or changed key, cuts the version the snapshot holds into
   chunks of :data:`CHUNK_BYTES`, digests them (BLAKE3-256), asks the target
   which it lacks, sends only those (of a changed key, chunks the version of
   the previous snapshot holds are not sent: the target copies them from its
   current version), then asks the target to commit the version from its
   chunks (atomic there); sends the tag set of each key whose tags alone
   changed (the target replaces them in place); deletes removed keys; each key
   done is appended to ``replication/<bucket>.done`` (fsynced), so a resumed
   round skips it;
4. tells the target the round is complete, deletes the previous snapshot and
   keeps this one as the base of the next diff.

A broken connection or a restart of either side leaves the round open; the
next round resumes it: keys done are skipped, and the target keeps every
chunk it received in the round until the round ends, so no chunk is sent
twice. The target (:mod:`gpufeed.engine._replica`) refuses S3 and fast-path
writes to its bucket until ``failover`` promotes it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path

import blake3

from ._replica_client import ReplicaClient
from .engine import Engine
from .engine._blobs import fsync_dir
from .engine._private import FILE_MODE, make_private_dirs
from .engine._replica import ADDING_CONFIG
from .errors import (
    GpufeedError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequestError,
    NoSuchBucket,
    NoSuchKey,
    NoSuchReplicationRule,
    NoSuchSnapshot,
    ReplicationTargetUnavailable,
    SignatureDoesNotMatch,
)

__all__ = ["Replicator", "ReplicationWorker", "ReplicationRule", "RoundResult", "CHUNK_BYTES", "RULES_DIR",
           "SNAPSHOT_PREFIX"]

log = logging.getLogger("gpufeed.replication")

#: Bytes of one replicated chunk (the last chunk of a version may be shorter).
CHUNK_BYTES = 4 << 20  # 4 MiB
#: Folder of the data folder holding the rules.
RULES_DIR = "replication"
#: Name prefix of the snapshots replication takes.
SNAPSHOT_PREFIX = "auto-repl-"
_LACK_BATCH = 1000  # digests asked about per call
_LAG_HEADS = 10_000  # most changed keys whose sizes status looks up


@dataclasses.dataclass
class ReplicationRule:
    """One rule and its state, as stored in ``replication/<bucket>.json``.

    Attributes:
        bucket: the source bucket.
        target: the target node's S3 endpoint.
        target_bucket: the bucket there.
        access_key, secret_key: the key used on the target (never shown).
        id: the rule's id (the target's replica answers this source only).
        created: Unix s.
        paused: no round runs while set.
        last_snapshot: the last snapshot applied whole on the target ("" none).
        last_snapshot_created: its time, Unix s.
        round: the open round (``{"snapshot", "created", "base"}``) or ``None``.
        counters: ``rounds``, ``chunks_sent``, ``bytes_sent``, ``objects_sent``,
            ``deleted``, ``retagged`` (tag sets updated in place),
            ``chunks_skipped`` (the target had them), ``errors``.
        last_error: the last failed round's message ("" none).
        last_error_at, last_round_at: Unix s (0: never).
    """

    bucket: str
    target: str
    target_bucket: str
    access_key: str
    secret_key: str
    id: str = ""
    created: float = 0.0
    paused: bool = False
    last_snapshot: str = ""
    last_snapshot_created: float = 0.0
    round: dict | None = None
    counters: dict = dataclasses.field(default_factory=dict)
    last_error: str = ""
    last_error_at: float = 0.0
    last_round_at: float = 0.0


@dataclasses.dataclass
class RoundResult:
    """What one :meth:`Replicator.sync` did.

    Attributes:
        snapshot: the snapshot the round replicated.
        objects_sent: versions committed on the target.
        chunks_sent, bytes_sent: chunks (and their bytes) sent.
        chunks_skipped: chunks the target had already.
        deleted: keys deleted on the target.
        retagged: keys whose tag set alone changed, updated on the target in
            place (no data sent).
        resumed: the round continued one left open.
    """

    snapshot: str
    objects_sent: int = 0
    chunks_sent: int = 0
    bytes_sent: int = 0
    chunks_skipped: int = 0
    deleted: int = 0
    retagged: int = 0
    resumed: bool = False


_COUNTERS = ("rounds", "chunks_sent", "bytes_sent", "objects_sent", "deleted", "retagged", "chunks_skipped",
             "errors")


class Replicator:
    """The replication rules of one node and the rounds that carry them out.

    Args:
        engine: the node's engine.
        timeout_s: per request to a target, seconds.
    """

    def __init__(self, engine: Engine, *, timeout_s: float = 60.0) -> None:
        self._engine = engine
        self._dir = Path(engine.data_dir) / RULES_DIR
        self._timeout_s = timeout_s
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._closing = threading.Event()
        if self._dir.is_dir():  # rule files a killed node was replacing
            for stale in self._dir.glob("*.tmp-*"):
                stale.unlink(missing_ok=True)

    def close(self) -> None:
        """Make rounds in progress stop at their next chunk (their round stays open)."""
        self._closing.set()

    def _check_open(self) -> None:
        if self._closing.is_set():
            raise OSError("the node is stopping; the round resumes at the next start")

    # rules ----------------------------------------------------------------------------
    def _path(self, bucket: str, ext: str = "json") -> Path:
        if not bucket or "/" in bucket or bucket.startswith("."):
            raise InvalidArgument(f"invalid bucket name {bucket!r}")
        return self._dir / f"{bucket}.{ext}"

    def _lock(self, bucket: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(bucket, threading.Lock())

    def _load(self, bucket: str) -> ReplicationRule:
        try:
            doc = json.loads(self._path(bucket).read_text())
        except FileNotFoundError:
            raise NoSuchReplicationRule(f"bucket {bucket!r} has no replication rule on this node",
                                        bucket=bucket) from None
        return ReplicationRule(**doc)

    def _save(self, rule: ReplicationRule) -> None:
        make_private_dirs(self._dir)
        path = self._path(rule.bucket)
        tmp = path.with_suffix(f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        with os.fdopen(fd, "w") as f:
            json.dump(dataclasses.asdict(rule), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(str(self._dir))

    def buckets(self) -> list[str]:
        """The buckets that have a rule, sorted."""
        if not self._dir.is_dir():
            return []
        return sorted(p.name[:-5] for p in self._dir.glob("*.json"))

    def _client(self, rule: ReplicationRule) -> ReplicaClient:
        return ReplicaClient(rule.target, rule.target_bucket, rule.id, rule.access_key, rule.secret_key,
                             timeout_s=self._timeout_s)

    def add(self, bucket: str, target: str, target_bucket: str, access_key: str, secret_key: str) -> dict:
        """Add a rule replicating ``bucket`` to ``target_bucket`` of the node at
        ``target``; the target bucket is claimed as a replica first (made if missing).

        Returns:
            :meth:`status` of the new rule (its first round runs with the next pass).

        Raises:
            NoSuchBucket: no such source bucket.
            InvalidArgument: a kv bucket, bad arguments, or a rule exists for the bucket.
            BucketNotEmpty: the target bucket is not empty (and not already this
                bucket's replica); nothing changed on either side.
            InvalidRequestError: the target bucket is this bucket itself (the
                target is this node, or a node sharing its catalog).
            ReplicationTargetUnavailable: the target cannot be reached (503).
            SignatureDoesNotMatch, InvalidAccessKeyId: the target refused the target key.
            GpufeedError: the target refused otherwise.
        """
        for name, value in (("target", target), ("target_bucket", target_bucket), ("access_key", access_key),
                            ("secret_key", secret_key)):
            if not isinstance(value, str) or not value:
                raise InvalidArgument(f"{name} must be a non-empty string")
        info = self._engine.head_bucket(bucket)
        if info.kind == "kv":
            raise InvalidArgument(f"bucket {bucket!r} is a kv (cache) bucket; it cannot be replicated")
        with self._lock(bucket):
            if self._path(bucket).exists():
                raise InvalidArgument(f"bucket {bucket!r} has a replication rule already "
                                      f"(to {self._load(bucket).target}); remove it first")
            rule = ReplicationRule(bucket, target.rstrip("/"), target_bucket, access_key, secret_key,
                                   id=f"{bucket}-{uuid.uuid4().hex[:16]}", created=time.time(),
                                   counters=dict.fromkeys(_COUNTERS, 0))
            client = self._client(rule)
            self._engine.put_bucket_config(bucket, ADDING_CONFIG, json.dumps({"source": rule.id}))
            try:
                client.claim()
            except (SignatureDoesNotMatch, InvalidAccessKeyId) as exc:
                raise type(exc)(f"the replication target {rule.target} refused the target key "
                                f"({exc.code}): check --target-access-key/--target-secret-key") from exc
            except GpufeedError:
                raise  # the target's own answer (some are OSError subclasses too)
            except OSError as exc:  # nothing listens there, or the connection broke
                raise ReplicationTargetUnavailable(f"replication target {rule.target} cannot be reached: {exc}; "
                                                   "no rule was added") from exc
            finally:
                client.close()
                self._engine.delete_bucket_config(bucket, ADDING_CONFIG)
            self._save(rule)
        return self.status(bucket)

    def remove(self, bucket: str) -> dict:
        """Remove a rule and its snapshots (the target bucket stays a replica until promoted).

        Returns:
            ``{"bucket", "removed": True}``.

        Raises:
            NoSuchReplicationRule: no rule for the bucket.
        """
        with self._lock(bucket):
            rule = self._load(bucket)
            for name in {rule.last_snapshot, (rule.round or {}).get("snapshot", "")} - {""}:
                self._delete_snapshot(bucket, name)
            self._path(bucket).unlink()
            self._path(bucket, "done").unlink(missing_ok=True)
        return {"bucket": bucket, "removed": True}

    def set_paused(self, bucket: str, paused: bool) -> dict:
        """Pause (no round runs) or resume a rule.

        Returns:
            :meth:`status` after the change.

        Raises:
            NoSuchReplicationRule: no rule for the bucket.
        """
        with self._lock(bucket):
            rule = self._load(bucket)
            rule.paused = paused
            self._save(rule)
        return self.status(bucket)

    # status -----------------------------------------------------------------------------
    def status(self, bucket: str) -> dict:
        """One rule's state: ``bucket``, ``target``, ``target_bucket``, ``id``,
        ``state`` (``paused``, ``syncing`` (a round runs now), ``error`` (the
        last round failed; the next pass resumes it) or ``idle``), ``round``
        (the open round, ``None`` when none), ``last_snapshot``,
        ``last_snapshot_created``, ``lag_s`` (seconds since the last snapshot
        applied whole, 0 when the bucket has not changed since),
        ``behind_objects`` and ``behind_bytes`` (keys added, changed, removed
        or retagged since, and the bytes of the added and changed ones), the counters,
        ``last_error``, ``last_error_at``, ``last_round_at``. Never the key.

        Raises:
            NoSuchReplicationRule: no rule for the bucket.
        """
        rule = self._load(bucket)
        behind_objects, behind_bytes = self._behind(rule)
        state = ("paused" if rule.paused else "syncing" if self._lock(bucket).locked() else
                 "error" if rule.last_error and rule.last_error_at > rule.last_round_at else "idle")
        lag_s = 0.0
        if behind_objects:
            lag_s = max(0.0, time.time() - (rule.last_snapshot_created or rule.created))
        return {"bucket": rule.bucket, "target": rule.target, "target_bucket": rule.target_bucket, "id": rule.id,
                "state": state, "last_snapshot": rule.last_snapshot,
                "last_snapshot_created": rule.last_snapshot_created, "lag_s": lag_s,
                "behind_objects": behind_objects, "behind_bytes": behind_bytes,
                "round": rule.round, **{k: int(rule.counters.get(k, 0)) for k in _COUNTERS},
                "last_error": rule.last_error, "last_error_at": rule.last_error_at,
                "last_round_at": rule.last_round_at}

    def _behind(self, rule: ReplicationRule) -> tuple[int, int]:
        """Keys (and bytes) the target lacks against the live bucket."""
        e = self._engine
        try:
            if not rule.last_snapshot:
                stats = e.bucket_stats(rule.bucket)
                return int(stats["objects"]), int(stats["bytes"])
            diff = e.diff_snapshots(rule.bucket, rule.last_snapshot)
        except (NoSuchBucket, NoSuchSnapshot):
            return 0, 0
        sent = diff.added + diff.changed
        size = 0
        for key in sent[:_LAG_HEADS]:
            try:
                size += e.head_object(rule.bucket, key).size
            except NoSuchKey:
                pass
        return len(sent) + len(diff.removed) + len(diff.retagged), size

    def status_all(self) -> list[dict]:
        """:meth:`status` of every rule."""
        out = []
        for bucket in self.buckets():
            try:
                out.append(self.status(bucket))
            except NoSuchReplicationRule:
                pass  # removed meanwhile
        return out

    # rounds -----------------------------------------------------------------------------
    def run_pass(self) -> list[str]:
        """One round of every rule that is not paused; a failure is recorded on its
        rule and logged, and the next rule runs.

        Returns:
            The buckets whose round completed.
        """
        done = []
        for bucket in self.buckets():
            try:
                if self._load(bucket).paused:
                    continue
                self.sync(bucket)
                done.append(bucket)
            except (GpufeedError, OSError) as exc:
                log.warning("replication of bucket %s: %s", bucket, exc)
        return done

    def sync(self, bucket: str) -> RoundResult:
        """Run one round now (see the module docstring), or resume the open one.
        Rounds of one rule never overlap (a second caller waits).

        Returns:
            What the round did.

        Raises:
            NoSuchReplicationRule: no rule for the bucket.
            InvalidRequestError: the rule is paused.
            ReplicationTargetUnavailable: the target could not be reached or the
                connection broke (recorded on the rule; the round stays open
                and the next one resumes it).
            GpufeedError: the target refused (recorded the same way).
        """
        with self._lock(bucket):
            rule = self._load(bucket)
            if rule.paused:
                raise InvalidRequestError(f"replication of bucket {bucket!r} is paused; resume it first")
            client = self._client(rule)
            try:
                return self._round(rule, client)
            except (GpufeedError, OSError) as exc:
                rule.counters["errors"] = int(rule.counters.get("errors", 0)) + 1
                rule.last_error, rule.last_error_at = str(exc), time.time()
                self._save(rule)
                if isinstance(exc, OSError):
                    raise ReplicationTargetUnavailable(f"replication of bucket {bucket!r} broke off: {exc}; "
                                                       "the next round resumes it") from exc
                raise
            finally:
                client.close()

    def _open_round(self, rule: ReplicationRule) -> bool:
        """Open a round unless one is open; returns whether one was open."""
        if rule.round is not None:
            try:
                self._engine.head_snapshot(rule.bucket, rule.round["snapshot"])
                return True
            except NoSuchSnapshot:  # deleted by hand: start the round again
                self._path(rule.bucket, "done").unlink(missing_ok=True)
        snap = self._engine.create_snapshot(rule.bucket, f"{SNAPSHOT_PREFIX}{int(time.time() * 1000)}",
                                            kind="replication")
        base = rule.last_snapshot
        if base:
            try:
                self._engine.head_snapshot(rule.bucket, base)
            except NoSuchSnapshot:
                base = ""  # deleted by hand: send every key again (the target skips nothing it lacks)
        rule.round = {"snapshot": snap.name, "created": snap.created, "base": base}
        self._save(rule)
        return False

    def _round(self, rule: ReplicationRule, client: ReplicaClient) -> RoundResult:
        resumed = self._open_round(rule)
        assert rule.round is not None
        snap, base = rule.round["snapshot"], rule.round["base"]
        result = RoundResult(snap, resumed=resumed)
        changed: set[str] = set()
        retagged: list[str] = []
        if base:
            diff = self._engine.diff_snapshots(rule.bucket, base, snap)
            send, removed, changed = diff.added + diff.changed, diff.removed, set(diff.changed)
            retagged = diff.retagged
        else:
            send, removed = self._keys(rule.bucket, snap), []
        done_path = self._path(rule.bucket, "done")
        # one line per finished key: "key" sent, ["-", key] deleted, ["t", key] retagged
        done = set(done_path.read_text().splitlines()) if done_path.exists() else set()
        fd = os.open(done_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        with open(fd, "a") as done_log:
            for key in send:
                self._check_open()
                if json.dumps(key) not in done:
                    self._send_key(rule, client, snap, key, result, base if key in changed else "")
                    self._mark_done(done_log, json.dumps(key))
            for key in retagged:
                self._check_open()
                if json.dumps(["t", key]) not in done:
                    self._retag(rule, client, snap, key, result)
                    self._mark_done(done_log, json.dumps(["t", key]))
            for key in removed:
                if json.dumps(["-", key]) not in done:
                    client.delete(key)
                    result.deleted += 1
                    rule.counters["deleted"] = int(rule.counters.get("deleted", 0)) + 1
                    self._mark_done(done_log, json.dumps(["-", key]))
        client.end_round(snap, rule.round["created"])
        if rule.last_snapshot and rule.last_snapshot != snap:
            self._delete_snapshot(rule.bucket, rule.last_snapshot)
        rule.last_snapshot, rule.last_snapshot_created = snap, rule.round["created"]
        rule.round = None
        rule.counters["rounds"] = int(rule.counters.get("rounds", 0)) + 1
        rule.last_round_at = time.time()
        self._save(rule)
        done_path.unlink(missing_ok=True)
        return result

    @staticmethod
    def _mark_done(log_file, line: str) -> None:
        log_file.write(line + "\n")
        log_file.flush()
        os.fsync(log_file.fileno())

    def _keys(self, bucket: str, snapshot: str) -> list[str]:
        keys: list[str] = []
        token = None
        while True:
            page = self._engine.list_objects(bucket, continuation_token=token, max_keys=1000, snapshot=snapshot)
            keys += [o.key for o in page.objects]
            if not page.is_truncated:
                return keys
            token = page.next_token

    def _delete_snapshot(self, bucket: str, name: str) -> None:
        try:
            self._engine.delete_snapshot(bucket, name, replication=True)
        except (NoSuchSnapshot, NoSuchBucket):
            pass
        except GpufeedError as exc:  # object lock keeps it: pruned by hand later
            log.info("replication snapshot %s/%s kept: %s", bucket, name, exc)

    def _retag(self, rule: ReplicationRule, client: ReplicaClient, snap: str, key: str,
               result: RoundResult) -> None:
        """Send the tag set the snapshot records for ``key``, whose data the
        target already has; a target that lacks the key gets the whole version."""
        tags = self._engine.head_object(rule.bucket, key, snapshot=snap).tags
        try:
            client.retag(key, dict(tags))
        except NoSuchKey:
            self._send_key(rule, client, snap, key, result)
            return
        result.retagged += 1
        rule.counters["retagged"] = int(rule.counters.get("retagged", 0)) + 1
        self._save(rule)

    def _digests(self, bucket: str, key: str, snapshot: str) -> list[str]:
        """The chunk digests of the version ``snapshot`` holds of ``key``."""
        with self._engine.open_version(bucket, key, snapshot=snapshot) as h:
            size = h.info.size
            buf = bytearray(min(CHUNK_BYTES, size))
            out = []
            for off in range(0, size, CHUNK_BYTES):
                n = h.read_into(memoryview(buf)[:min(CHUNK_BYTES, size - off)], off)
                out.append(blake3.blake3(memoryview(buf)[:n]).hexdigest())
            return out

    def _send_key(self, rule: ReplicationRule, client: ReplicaClient, snap: str, key: str,
                  result: RoundResult, base: str = "") -> None:
        """Send one version: digests, the chunks the target lacks, the commit.

        With ``base`` (the snapshot the target's current version of ``key``
        came from), chunks that version holds are not sent: the commit names
        their place in it, and the target copies them (checked against their
        digest). If the target's version is not that one any more, the key is
        sent again without them."""
        digests = self._digests(rule.bucket, key, snap)
        reuse: dict[str, int] = {}
        if base:
            for i, d in enumerate(self._digests(rule.bucket, key, base)):
                reuse.setdefault(d, i * CHUNK_BYTES)
        info = self._engine.head_object(rule.bucket, key, snapshot=snap)
        doc = {"key": key, "size": info.size, "content_type": info.content_type, "metadata": info.metadata,
               "checksums": info.checksums, "headers": info.headers, "tags": info.tags}
        spans = [{"digest": d, "offset": reuse[d], "length": min(CHUNK_BYTES, info.size - i * CHUNK_BYTES)}
                 if d in reuse else d for i, d in enumerate(digests)]
        self._send_chunks(rule, client, snap, key, [d for d in digests if d not in reuse], result)
        try:
            client.commit({**doc, "chunks": spans})
        except (InvalidRequestError, NoSuchKey):
            if not reuse:
                raise
            self._send_chunks(rule, client, snap, key, [d for d in digests if d in reuse], result)
            client.commit({**doc, "chunks": digests})
        result.objects_sent += 1
        rule.counters["objects_sent"] = int(rule.counters.get("objects_sent", 0)) + 1
        self._save(rule)

    def _send_chunks(self, rule: ReplicationRule, client: ReplicaClient, snap: str, key: str,
                     wanted: list[str], result: RoundResult) -> None:
        """Send the chunks of ``wanted`` (digests of the version ``snap`` holds) the target lacks."""
        lack: set[str] = set()
        for i in range(0, len(wanted), _LACK_BATCH):
            lack.update(client.lacking(wanted[i:i + _LACK_BATCH]))
        c = rule.counters
        skipped = len(set(wanted) - lack)
        result.chunks_skipped += skipped
        c["chunks_skipped"] = int(c.get("chunks_skipped", 0)) + skipped
        if not lack:
            return
        with self._engine.open_version(rule.bucket, key, snapshot=snap) as h:
            size = h.info.size
            buf = bytearray(min(CHUNK_BYTES, size))
            for off in range(0, size, CHUNK_BYTES):
                self._check_open()
                n = h.read_into(memoryview(buf)[:min(CHUNK_BYTES, size - off)], off)
                d = blake3.blake3(memoryview(buf)[:n]).hexdigest()
                if d not in lack:
                    continue
                client.put_chunk(d, memoryview(buf)[:n])
                lack.discard(d)
                result.chunks_sent += 1
                result.bytes_sent += n
                c["chunks_sent"] = int(c.get("chunks_sent", 0)) + 1
                c["bytes_sent"] = int(c.get("bytes_sent", 0)) + n
                self._save(rule)


class ReplicationWorker:
    """A daemon thread that runs :meth:`Replicator.run_pass` every ``interval_s``
    seconds (first at start) until :meth:`stop`; a failed pass is logged and the
    next one runs on time.

    Args:
        replicator: the node's rules.
        interval_s: seconds between passes (> 0).
    """

    def __init__(self, replicator: Replicator, interval_s: float) -> None:
        self._replicator = replicator
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufeed-replication", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self._replicator.run_pass()
                if done:
                    log.info("replicated: %s", " ".join(done))
            except Exception:
                if self._stop.is_set():
                    return  # the engine closed under a pass that was ending anyway
                log.exception("replication pass failed")
            self._stop.wait(self._interval_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to end and wait up to ``timeout_s`` for a pass in progress."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
