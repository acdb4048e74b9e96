"""The steps under one checkpoint prefix: list, read manifests, commit, delete,
garbage-collect and scrub."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgspec

from ...client import Client
from ...errors import InvalidArgument, NoSuchBucket, NoSuchKey
from ._format import (
    DEFAULT_WORKERS,
    FORMAT,
    FORMAT_VERSION,
    CheckpointError,
    CheckpointNotFound,
    Commit,
    CorruptCheckpoint,
    Location,
    Manifest,
    check_step,
    chunk_hash,
    decode,
)
from ._inflight import wait_for_saves
from ._session import open_location

__all__ = ["ScrubReport", "Checkpoints", "checkpoints"]


@dataclass(frozen=True)
class ScrubReport:
    """What :meth:`Checkpoints.scrub` found.

    Attributes:
        chunks_checked: chunk objects read and hashed.
        bytes_checked: their bytes.
        corrupt: keys of chunks whose bytes do not hash (BLAKE3) to their name.
        missing: keys of chunks a committed step names that do not exist.
        damaged_steps: committed steps naming a corrupt or missing chunk, or whose
            manifest does not match its commit.
        removed: corrupt chunk keys deleted (``repair=True``).
    """

    chunks_checked: int
    bytes_checked: int
    corrupt: list[str]
    missing: list[str]
    damaged_steps: list[int]
    removed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No corrupt or missing chunk and no damaged step."""
        return not (self.corrupt or self.missing or self.damaged_steps)


# --- steps ---------------------------------------------------------------------------------
class Checkpoints:
    """The steps under one checkpoint prefix, and their garbage collection.

    Deleting MUST NOT run concurrently with a save to the same prefix: a save
    that found a chunk present skips writing it, and a concurrent delete could
    remove it before the save commits.

    Args:
        url: checkpoint URL (see :func:`parse_checkpoint_url`).
        client: an open :class:`Client` to use instead of a pooled one.
        bucket, prefix: override the URL's.
    """

    def __init__(self, url: str | Location, *, client: Client | None = None,
                 bucket: str | None = None, prefix: str | None = None) -> None:
        self.loc, self.client = open_location(url, client, bucket, prefix)

    def steps(self) -> list[int]:
        """Committed steps, ascending. A prefix (or bucket) that does not exist has none."""
        out = []
        base = self.loc.key("steps/")
        try:
            for e in self.client.list(self.loc.bucket, prefix=base):
                rel = e.key[len(base):]
                num, _, name = rel.partition("/")
                if name == "commit" and num.isdigit():
                    out.append(int(num))
        except NoSuchBucket:
            return []
        return sorted(out)

    def __iter__(self) -> Iterator[int]:
        return iter(self.steps())

    def __len__(self) -> int:
        return len(self.steps())

    def latest(self) -> int | None:
        """The highest committed step, or ``None``."""
        steps = self.steps()
        return steps[-1] if steps else None

    def manifest(self, step: int | None = None) -> Manifest:
        """The manifest of ``step`` (default: the latest), checked against its commit.

        Raises:
            CheckpointNotFound: no such committed step.
            CorruptCheckpoint: the manifest's size or hash differs from the commit.
            InvalidArgument: ``step`` is not an int >= 0.
        """
        check_step(step)
        if step is None:
            step = self.latest()
            if step is None:
                raise CheckpointNotFound(f"{self.loc}: no committed checkpoint")
        ckey = self.loc.step_key(step, "commit")
        mkey = self.loc.step_key(step, "manifest")
        try:
            commit = decode(Commit, self.client.get(self.loc.bucket, ckey), ckey)
        except (NoSuchKey, NoSuchBucket) as exc:
            raise CheckpointNotFound(f"{self.loc}: step {step} is not committed", step=step) from exc
        try:
            raw = self.client.get(self.loc.bucket, mkey)
        except NoSuchKey as exc:
            raise CorruptCheckpoint(f"{self.loc.bucket}/{mkey}: committed but missing", key=mkey) from exc
        if len(raw) != commit.manifest_size or chunk_hash(raw) != commit.manifest_hash:
            raise CorruptCheckpoint(f"{self.loc.bucket}/{mkey}: size or BLAKE3 differs from its commit",
                                    key=mkey)
        man = decode(Manifest, raw, mkey)
        if man.format != FORMAT or man.version > FORMAT_VERSION:
            raise CorruptCheckpoint(f"{self.loc.bucket}/{mkey}: format {man.format!r} v{man.version} "
                                    f"is not {FORMAT!r} <= v{FORMAT_VERSION}", key=mkey)
        return man

    def commit(self, manifest: Manifest, *, overwrite: bool = True) -> None:
        """Store ``manifest`` and then its commit marker (the step becomes visible).

        Every chunk the manifest names MUST already be durable.

        Raises:
            CheckpointError: the step exists and ``overwrite`` is False.
        """
        step = manifest.step
        ckey = self.loc.step_key(step, "commit")
        existing = step in self.steps()
        if existing:
            if not overwrite:
                raise CheckpointError(f"{self.loc}: step {step} already exists", step=step)
            self.client.delete(self.loc.bucket, ckey)  # invisible while rewritten
        raw = msgspec.msgpack.encode(manifest)
        self.client.put(self.loc.bucket, self.loc.step_key(step, "manifest"), raw)
        commit = Commit(FORMAT, FORMAT_VERSION, step, len(raw), chunk_hash(raw), time.time())
        self.client.put(self.loc.bucket, ckey, msgspec.msgpack.encode(commit))

    def delete(self, step: int) -> int:
        """Delete a step, then the chunks that no remaining step references.

        The commit marker goes first, so a crash part-way leaves the step invisible.

        Returns:
            Bytes of chunks removed.

        Raises:
            CheckpointNotFound: no such committed step.
            InvalidArgument: ``step`` is not an int in ``[0, 2**63)``.
        """
        check_step(step, none=False)
        wait_for_saves(self.loc)
        man = self.manifest(step)
        keep = self._referenced(exclude=step)
        self.client.delete(self.loc.bucket, self.loc.step_key(step, "commit"))
        self.client.delete(self.loc.bucket, self.loc.step_key(step, "manifest"))
        freed = 0
        for c in {c for e in man.entries for c in e.chunks}:
            if c.hash not in keep:
                self.client.delete(self.loc.bucket, self.loc.chunk_key(c.hash))
                freed += c.size
        return freed

    def keep_last(self, n: int) -> list[int]:
        """Delete all but the newest ``n`` steps; returns the steps deleted.

        Raises:
            InvalidArgument: ``n < 1`` (keeping nothing is almost always a bug;
                delete steps one by one with :meth:`delete` to empty a prefix).
        """
        if type(n) is not int or n < 1:
            raise InvalidArgument(f"keep_last needs n >= 1, got {n!r}")
        wait_for_saves(self.loc)
        steps = self.steps()
        gone = steps[: max(0, len(steps) - n)]
        for s in gone:
            self.delete(s)
        return gone

    def gc(self) -> int:
        """Remove chunks no committed step references and objects of uncommitted
        steps (left by crashed saves). Returns bytes freed.

        Waits for this process's async saves to the same location first; saves
        from other processes MUST NOT run meanwhile (their chunks are not yet
        referenced by any committed step)."""
        wait_for_saves(self.loc)
        keep = self._referenced()
        committed = set(self.steps())
        freed = 0
        base = self.loc.key("chunks/")
        for e in list(self.client.list(self.loc.bucket, prefix=base)):
            if e.key[len(base):] not in keep:
                self.client.delete(self.loc.bucket, e.key)
                freed += e.size
        sbase = self.loc.key("steps/")
        for e in list(self.client.list(self.loc.bucket, prefix=sbase)):
            num = e.key[len(sbase):].partition("/")[0]
            if not num.isdigit() or int(num) not in committed:
                self.client.delete(self.loc.bucket, e.key)
                freed += e.size
        return freed

    def scrub(self, *, repair: bool = False, workers: int = DEFAULT_WORKERS) -> ScrubReport:
        """Read every chunk under the prefix and check that its bytes hash to its name;
        check that every chunk a committed step names exists.

        Waits for this process's async saves to the location first. Each worker
        holds one chunk in memory at a time (``workers`` x chunk size bytes).

        Args:
            repair: delete the chunks whose bytes do not match their name, so the
                next save that holds those bytes writes them again (the steps that
                name them stay damaged: restore or delete them).
            workers: chunks read and hashed at once.

        Returns:
            A :class:`ScrubReport`.
        """
        wait_for_saves(self.loc)
        base = self.loc.key("chunks/")
        try:
            listed = [e for e in self.client.list(self.loc.bucket, prefix=base) if not e.is_prefix]
        except NoSuchBucket:
            listed = []

        def check(key: str, size: int) -> tuple[int, bool] | None:
            buf = bytearray(size)
            try:
                n = self.client.get_into(self.loc.bucket, key, buf)
            except NoSuchKey:
                return None  # deleted meanwhile
            name = key[len(base):]
            return n, n == size and chunk_hash(memoryview(buf)[:n]) == name

        corrupt: list[str] = []
        checked = nbytes = 0
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="gpufeed-scrub") as pool:
            for e, fut in [(e, pool.submit(check, e.key, e.size)) for e in listed]:
                got = fut.result()
                if got is None:
                    continue
                checked += 1
                nbytes += got[0]
                if not got[1]:
                    corrupt.append(e.key)
        present = {e.key[len(base):] for e in listed}
        bad_names = {k[len(base):] for k in corrupt}
        missing: set[str] = set()
        damaged: list[int] = []
        for s in self.steps():
            try:
                names = {c.hash for en in self.manifest(s).entries for c in en.chunks}
            except CheckpointNotFound:
                continue  # deleted meanwhile
            except CorruptCheckpoint:
                damaged.append(s)
                continue
            gone = names - present
            missing |= gone
            if gone or names & bad_names:
                damaged.append(s)
        removed: list[str] = []
        if repair:
            for key in corrupt:
                self.client.delete(self.loc.bucket, key)
                removed.append(key)
        return ScrubReport(checked, nbytes, corrupt, sorted(self.loc.chunk_key(h) for h in missing),
                           damaged, removed)

    def physical_bytes(self) -> int:
        """Bytes of every chunk plus every manifest and commit under the prefix."""
        try:
            return sum(e.size for e in self.client.list(self.loc.bucket, prefix=self.loc.key("")))
        except NoSuchBucket:
            return 0

    def _referenced(self, exclude: int | None = None) -> set[str]:
        out: set[str] = set()
        for s in self.steps():
            if s != exclude:
                out.update(c.hash for e in self.manifest(s).entries for c in e.chunks)
        return out


def checkpoints(url: str | Location, *, client: Client | None = None, bucket: str | None = None,
                prefix: str | None = None) -> Checkpoints:
    """The steps stored under ``url`` (``gpufeed+tcp://HOST:PORT/BUCKET/PREFIX``)."""
    return Checkpoints(url, client=client, bucket=bucket, prefix=prefix)
