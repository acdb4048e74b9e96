"""The fast path's op handlers: each gets a decoded request, asks the engine (or
the region lending) and sends one reply; none keeps state of its own (spec:
``docs/wire-protocol.md``).

* TCP replies send object bytes with ``os.sendfile`` straight from the page
  cache: no user-space copy, no ``bytes`` objects;
* on the shm transport the server ``os.preadv``-s object bytes straight into the
  client's mapped region, so data crosses from the file to the application's
  memory in one copy and no socket carries it (fresh memory, such as a batch
  tensor, is written by ``pwrite`` from a checked piece instead: ``_staged``);
  writes go the other way from the mapped region. Large reads are split across threads.

Every op on a bucket or object first asks :meth:`Engine.authorize` as the
connection's tenant, with S3's action names (:data:`READ`, ...), before the
engine is asked anything else, so a refusal reveals nothing of what the bucket
holds; LIST_BUCKETS lists the tenant's own buckets and CREATE_BUCKET makes the
bucket the tenant's.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Iterator
from typing import Protocol

from ..engine import ChunkRecord, Engine, ObjectHandle, ObjectInfo
from ..errors import (
    AccessDenied,
    DamagedObject,
    GpufeedError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRange,
    NotImplementedByGpufeed,
    ProtocolError,
)
from ..store import OffsetByteRequest, RangeByteRequest, resolve_range
from . import protocol as p
from ._auth import PEER_TENANT
from ._conn import Connection, Handler
from ._leases import LeaseBoard, serve_lease
from ._lending import Lending
from ._mapping import send_map
from ._parts import serve_part
from ._reads import SPLIT_BYTES, SplitReader, piece_digests
from ._staged import range_extents, read_ranges_to_fd, read_to_fd, run_reads, split_read

__all__ = ["Ops", "ClusterView"]


class ClusterView(Protocol):
    """What LOCATE needs of the node's cluster membership."""

    node_id: str

    def members(self) -> list[p.Member]:
        """The cluster's members, each with its fast-path address and liveness."""

#: A GETV batch of at least this many bytes is served by the split pool in parallel.
GETV_PARALLEL_BYTES = 4 << 20  # 4 MiB
#: A TCP read of at most this many whole blocks is read into memory and sent with
#: its reply's header in one ``sendmsg`` (larger ones go by ``sendfile``).
SMALL_PAYLOAD_BYTES = 64 << 10  # 64 KiB
#: A TCP GETR of at most this many bytes in all is read (and checked) into memory
#: and sent in one ``sendmsg``; a larger one sends checked file extents.
GETR_BUFFER_BYTES = 4 << 20  # 4 MiB
#: Bytes of whole error messages a GETR reply carries before it cuts them (:func:`range_errors`).
ERROR_MESSAGE_BYTES = 1 << 20
#: Whether this machine's integers are little-endian, the wire's order.
_LITTLE = sys.byteorder == "little"
#: Bytes a region PUT hands the engine per write.
PUT_STEP_BYTES = 64 << 20  # 64 MiB

#: S3 action names each op is authorized as (a version named: the ``Version`` form,
#: as S3 asks for ``GetObjectVersion`` / ``DeleteObjectVersion``). BUCKET_STATS
#: reveals what a listing reveals (object count and bytes): ``s3:ListBucket``.
READ, READ_VERSION = "s3:GetObject", "s3:GetObjectVersion"
WRITE = "s3:PutObject"
DELETE, DELETE_VERSION = "s3:DeleteObject", "s3:DeleteObjectVersion"
BYPASS_GOVERNANCE = "s3:BypassGovernanceRetention"
LIST = "s3:ListBucket"
DELETE_BUCKET = "s3:DeleteBucket"


class Ops:
    """Every op of the wire protocol, as handlers over one engine.

    Args:
        engine: the node's engine (its public API only; it caches the open data
            files of object versions, shared with the S3 front).
        reader: the pool for large reads.
        lending: the shm transport's region lending.
        server_name: what HELLO answers as the server (``"gpufeed/<version>"``).
    """

    def __init__(self, engine: Engine, reader: SplitReader, lending: Lending, server_name: str) -> None:
        self.engine = engine
        self.reader = reader
        self.lending = lending
        self.server_name = server_name
        self.leases: LeaseBoard | None = None  # set by the server when it offers leases
        #: op -> handler, for every op but a PUT whose payload follows on the socket
        self.handlers: dict[int, Handler] = {
            p.Op.HELLO: self.hello,
            p.Op.REGISTER: self.register,
            p.Op.UNREGISTER: self.unregister,
            p.Op.ALLOC_REGION: self.alloc_region,
            p.Op.FORKED: self.forked,
            p.Op.HEAD: self.head,
            p.Op.GET: self.get,
            p.Op.GETV: self.getv,
            p.Op.PUT: self.put_region,
            p.Op.DELETE: self.delete,
            p.Op.LIST: self.list_objects,
            p.Op.CREATE_BUCKET: self.create_bucket,
            p.Op.LIST_BUCKETS: self.list_buckets,
            p.Op.DELETE_BUCKET: self.delete_bucket,
            p.Op.BUCKET_STATS: self.bucket_stats,
            p.Op.MAP: self.map,
            p.Op.MAP_EXTENTS: self.map_extents,
            p.Op.CHUNK: self.chunk,
            p.Op.GETR: self.getr,
            p.Op.LOCATE: self.locate,
            p.Op.LEASE: self.lease,
        }
        #: the node's cluster (its id and ``members()``, :class:`gpufeed._peers.PeerLink`);
        #: ``None``: LOCATE answers as a node outside a cluster
        self.cluster: ClusterView | None = None

    # --- session and memory --------------------------------------------------------
    def hello(self, conn: Connection, rid: int, req: p.Hello) -> None:
        """Name the server, its protocol version, transport and optional features."""
        features = (["alloc_region", "auth", "map", "map_extents", "versions", "snapshots", "ranges", "locate"]
                    if conn.transport == "shm" else ["auth", "versions", "snapshots", "ranges", "locate"])
        if conn.transport == "shm" and self.leases is not None:
            features.append("lease")
        conn.reply(p.Op.HELLO, rid, p.HelloReply(self.server_name, p.VERSION, conn.transport,
                                                 features, conn.server_nonce))

    def allow(self, conn: Connection, action: str, bucket: str, key: str | None = None, *,
              prefix: str | None = None) -> None:
        """Ask the engine whether the connection's tenant may do ``action``.

        Raises:
            NoSuchBucket: the bucket does not exist.
            AccessDenied: it may not (the message names nothing).
        """
        who = conn.principal
        if who is None or who.tenant == PEER_TENANT:  # dispatch serves no such op before AUTH
            raise AccessDenied("Access Denied")
        self.engine.authorize(who.tenant, action, bucket, key, access_key=who.access_key,
                              source_ip=conn.source_ip, prefix=prefix)

    def register(self, conn: Connection, rid: int, req: p.Register) -> None:
        """Map the memfd that came with the frame as a region (shm only)."""
        if conn.transport != "shm":
            raise InvalidArgument("memory regions can only be registered over the shm transport")
        if not conn.fds_in:
            raise ProtocolError("REGISTER arrived without a file descriptor")
        fd = conn.fds_in.pop(0)
        conn.close_fds_in()  # one descriptor per REGISTER
        try:
            self.lending.register(conn.memory, req.region_id, req.size, fd, fresh=req.fresh)
        finally:
            os.close(fd)
        conn.reply(p.Op.REGISTER, rid, p.Empty())

    def unregister(self, conn: Connection, rid: int, req: p.Unregister) -> None:
        """Drop a region; a lent one may go back to the pool (see :class:`Lending`)."""
        self.lending.unregister(conn.memory, req.region_id, req.unmapped)
        conn.reply(p.Op.UNREGISTER, rid, p.Empty())

    def alloc_region(self, conn: Connection, rid: int, req: p.AllocRegion) -> None:
        """Lend a region (pooled if one fits, else fresh) and send its memfd."""
        if conn.transport != "shm":
            raise InvalidArgument("memory regions can only be allocated over the shm transport")
        owned, reused = self.lending.lend(conn.memory, req.region_id, req.size)
        conn.reply_with_fd(p.Op.ALLOC_REGION, rid, p.AllocRegionReply(owned.size, reused), owned.fd)

    def forked(self, conn: Connection, rid: int, req: p.Empty) -> None:
        """The client forked: what it was lent so far is never lent again."""
        self.lending.forked(conn.memory)
        conn.reply(p.Op.FORKED, rid, p.Empty())

    # --- objects -------------------------------------------------------------------
    def head(self, conn: Connection, rid: int, req: p.Head) -> None:
        """An object version's metadata (the current one unless the request names
        a version or a snapshot)."""
        self.allow(conn, READ if req.version_id is None else READ_VERSION, req.bucket, req.key)
        conn.reply(p.Op.HEAD, rid, _meta(self.engine.head_object(req.bucket, req.key, req.version_id,
                                                                 snapshot=req.snapshot)))

    def map(self, conn: Connection, rid: int, req: p.Head) -> None:
        """MAP: check the version's data (each chunk on its first map; the current one unless the
        request names one), then send its data file, read-only, for the client
        to map (zero-copy: its pages are the page cache's). Data files are
        immutable and never truncated (a new version is a new file), so a
        mapping of one stays valid and unchanged, after overwrites and deletes too."""
        self._map(conn, rid, req, p.Op.MAP)

    def map_extents(self, conn: Connection, rid: int, req: p.Head) -> None:
        """MAP_EXTENTS: as :meth:`map`, the object's data files and the extents
        of them that hold its bytes, in order (the client maps them side by side)."""
        self._map(conn, rid, req, p.Op.MAP_EXTENTS)

    def _map(self, conn: Connection, rid: int, req: p.Head, op: int) -> None:
        if conn.transport != "shm":
            raise InvalidArgument("MAP needs the shm transport (a descriptor cannot cross TCP)")
        self.allow(conn, READ if req.version_id is None else READ_VERSION, req.bucket, req.key)
        h = self.engine.open_mappable(req.bucket, req.key, req.version_id, snapshot=req.snapshot)
        try:
            send_map(conn, op, rid, h.info.size, h.info.etag, h.file_extents())
        finally:
            h.close()

    def locate(self, conn: Connection, rid: int, req: p.Head) -> None:
        """LOCATE: which live members hold all of a version's data, and the
        cluster's members (authorized as a read of the version)."""
        self.allow(conn, READ if req.version_id is None else READ_VERSION, req.bucket, req.key)
        info, holders = self.engine.object_holders(req.bucket, req.key, req.version_id, snapshot=req.snapshot)
        cluster = self.cluster
        if cluster is None:
            conn.reply(p.Op.LOCATE, rid, p.LocateReply("", info.size, info.etag, [], []))
            return
        members = cluster.members()
        live = {m.node_id for m in members if m.live}
        conn.reply(p.Op.LOCATE, rid, p.LocateReply(cluster.node_id, info.size, info.etag,
                                                   [n for n in holders if n in live], members))

    def lease(self, conn: Connection, rid: int, req: p.Head) -> None:
        """LEASE: the current version's data file, its block sums and the node's
        commit counter, for reads in the client's own process (:mod:`._leases`)."""
        if self.leases is None:
            raise NotImplementedByGpufeed("this node offers no read leases (GPUFEED_WIRE_LEASE_S=0, or "
                                          "its catalog is shared with other nodes)")
        generation = self.leases.generation  # first: a change the checks below miss voids the lease
        if not conn.key_still_valid():
            raise InvalidAccessKeyId("The access key Id of this connection is no longer valid (revoked).")
        self.allow(conn, READ, req.bucket, req.key)
        serve_lease(self.engine, self.leases, conn, rid, req, generation)

    def chunk(self, conn: Connection, rid: int, req: p.ChunkReq) -> None:
        """A chunk's stored bytes (all, or the range asked for), by ``sendfile``,
        to a cluster peer (only a connection authenticated with a node key may
        ask; the asker checks them).

        Raises:
            AccessDenied: not a node key. InvalidArgument: a range outside the chunk.
        """
        who = conn.principal
        if who is None or who.tenant != PEER_TENANT:
            raise AccessDenied("CHUNK is served to the nodes of this node's cluster only")
        with self.engine.held_chunk(req.chunk_id) as (fd, offset, stored):
            length = stored - req.offset if req.length == -1 else req.length
            if req.offset < 0 or length < 0 or req.offset + length > stored:
                raise InvalidArgument(f"bytes {req.offset}+{req.length} are not within chunk {req.chunk_id}'s "
                                      f"{stored} stored bytes")
            conn.reply_with_files(p.Op.CHUNK, rid, p.ChunkReply(length),
                                  [(fd, offset + req.offset, length)] if length else [])

    def chunk_put(self, conn: Connection, rid: int, req: p.ChunkPut, payload_len: int) -> None:
        """CHUNK_PUT: store a copy of a cluster peer's data file (only a connection
        authenticated with a node key may send it); the reply says the copy is
        checked and durable.

        Raises:
            ProtocolError: the payload length disagrees with the request, or the
                connection closed mid-payload (the connection is then closed).
        """
        sums_len = sum(ch.sums_len for ch in req.chunks)
        if payload_len != sums_len + req.length or sums_len < 0 or req.length < 0:
            raise ProtocolError(f"CHUNK_PUT of {req.length} bytes and {sums_len} bytes of sums != payload "
                                f"{payload_len}")
        who = conn.principal
        refusal: GpufeedError | None = None
        if who is None or who.tenant != PEER_TENANT:
            refusal = AccessDenied("CHUNK_PUT is accepted from the nodes of this node's cluster only")
        elif any(min(ch.sums_len, ch.file_offset, ch.stored, ch.size) < 0 for ch in req.chunks):
            refusal = InvalidArgument("a CHUNK_PUT chunk with a negative offset or length")
        elif sums_len > req.length // 512 + 64 * len(req.chunks) + 64:
            refusal = InvalidArgument(f"{sums_len} bytes of block sums for {req.length} bytes of data")
        if refusal is not None:
            conn.drain(payload_len)
            conn.reply_error(rid, refusal)
            return
        pieces = conn.recv_payload(payload_len)
        sums, left = _take(pieces, sums_len)
        records, pos = [], 0
        for ch in req.chunks:
            records.append(ChunkRecord(ch.chunk_id, req.file, ch.file_offset, ch.stored, ch.size, ch.codec,
                                       ch.digest, bytes(sums[pos:pos + ch.sums_len]), ch.domain, ch.sum_kind))
            pos += ch.sums_len
        try:
            stored = self.engine.receive_copy(req.file, records, req.length, _rest(left, pieces))
        except GpufeedError as exc:
            conn.reply_error(rid, exc)
            return
        conn.reply(p.Op.CHUNK_PUT, rid, p.ChunkPutReply(stored))

    def allow_read(self, conn: Connection, req: p.Get) -> None:
        """:meth:`allow` a read of what ``req`` names (a version named: ``s3:GetObjectVersion``).

        Raises:
            NoSuchBucket, AccessDenied: as :meth:`allow`.
        """
        self.allow(conn, READ if req.version_id is None else READ_VERSION, req.bucket, req.key)

    def get(self, conn: Connection, rid: int, req: p.Get) -> None:
        """One range of an object version, checked against its block sums before
        the reply says it is good: sent by ``sendfile`` (TCP) or read into a
        region (shm). Damage is an error reply; the connection stays usable."""
        self.allow_read(conn, req)
        h = self.engine.open_version(req.bucket, req.key, req.version_id, snapshot=req.snapshot)
        try:
            self.serve_get(conn, rid, req, h)
        finally:
            h.close()

    def serve_get(self, conn: Connection, rid: int, req: p.Get, h: ObjectHandle) -> None:
        """Read and send GET ``rid``'s range of the version ``h`` (authorized and
        opened by the caller, who closes it)."""
        info = h.info
        start, n = _extent(req, info.size)
        if req.region == -1:
            conn.reply_with_files(p.Op.GET, rid, p.GetReply(info.size, n, info.etag), _payload(h, start, n))
            return
        region = conn.memory.region(req.region)
        if (fd := region.staged_fd(req.region_offset, n)) is not None:  # fresh memory: by pwrite
            got = (split_read(h, start, n, fd.fd, req.region_offset, self.reader.run_calls) if n >= SPLIT_BYTES
                   else read_to_fd(h, start, n, fd.fd, req.region_offset))
            conn.reply(p.Op.GET, rid, p.GetReply(info.size, got, info.etag))
            return
        dest = region.view(req.region_offset, n)
        try:
            small = h.read_small_or_fall_back(start, dest)
            got = n if small else h.run(h.steps(dest, start), self.reader.run_steps)
        finally:
            dest.release()
        conn.reply(p.Op.GET, rid, p.GetReply(info.size, got, info.etag))

    def getv(self, conn: Connection, rid: int, req: p.GetV) -> None:
        """A batch of ranges; each item fails alone (its error is in the reply)."""
        batch = _Batch(len(req.items))
        # a batch that will not be read on several threads reads its small items
        # as it plans them
        batch.serial = all(it.length >= 0 for it in req.items) and \
            sum(it.length for it in req.items) < GETV_PARALLEL_BYTES
        try:
            for i, item in enumerate(req.items):
                try:
                    self._plan_item(conn, batch, i, item)
                except GpufeedError as exc:
                    batch.results[i] = -1
                    batch.errors[i] = (exc.code, exc.message)
            self._read_batch(batch)
            batch.release_views()
            conn.reply_with_files(p.Op.GETV, rid,
                                  p.GetVReply(batch.results, batch.errors, batch.digests),
                                  batch.extents)
        finally:
            batch.release_views()
            for h in batch.opened.values():
                h.close()

    def getr(self, conn: Connection, rid: int, req: p.GetRanges) -> None:
        """Many ranges of one object version (one authorization, one open):
        into a region, packed in order (shm), or as one payload (TCP, read into
        memory up to :data:`GETR_BUFFER_BYTES` in all, else checked extents
        sent by ``sendfile``). Each range fails alone."""
        offsets, lengths = ranges_of(req)
        self.allow(conn, READ if req.version_id is None else READ_VERSION, req.bucket, req.key)
        h = self.engine.open_version(req.bucket, req.key, req.version_id, snapshot=req.snapshot)
        try:
            total = sum(lengths)
            errors: dict[int, GpufeedError]
            region = conn.memory.region(req.region) if req.region != -1 else None
            if region is not None and (fd := region.staged_fd(req.region_offset, total)) is not None:
                n, errors = read_ranges_to_fd(h, offsets, lengths, fd.fd, req.region_offset)
                pieces: list = []
            elif region is not None:
                dest = region.view(req.region_offset, total)
                try:
                    n, errors = h.read_ranges(offsets, lengths, dest, self.reader.run_steps)
                finally:
                    dest.release()
                pieces = []
            elif total <= GETR_BUFFER_BYTES:
                buf = memoryview(bytearray(total))
                n, errors = h.read_ranges(offsets, lengths, buf, self.reader.run_steps)
                pieces, pos = [], 0
                for k, want in zip(n, lengths):
                    if k > 0:
                        pieces.append(buf[pos:pos + k])
                    pos += want
            else:
                n, errors, pieces = range_extents(h, offsets, lengths)
            conn.reply_with_files(p.Op.GETR, rid, p.GetRangesReply(
                h.info.size, h.info.etag, array("q", n).tobytes() if _LITTLE else _swapped("q", n),
                range_errors(errors)), pieces)
        finally:
            h.close()

    def _plan_item(self, conn: Connection, batch: "_Batch", i: int, item: p.Get) -> None:
        """Open item ``i`` of a GETV (once per object version in the batch) and plan
        its read: checked TCP pieces, or region read steps (an item that asks for
        digests gets them over what landed)."""
        name = (item.bucket, item.key, item.version_id, item.snapshot)
        h = batch.opened.get(name)
        if h is None:  # authorized and acquired once for the whole batch
            self.allow(conn, READ if item.version_id is None else READ_VERSION, item.bucket, item.key)
            h = batch.opened[name] = self.engine.open_version(*name[:3], snapshot=item.snapshot)
        start, n = _extent(item, h.info.size)
        if item.region == -1:  # buffered only in a batch under 4 MiB: its memory stays bounded
            batch.extents += _payload(h, start, n) if batch.serial else h.extents(start, n)
        else:
            region = batch.regions.get(item.region)
            if region is None:
                region = batch.regions[item.region] = conn.memory.region(item.region)
            if not item.digest and (fd := region.staged_fd(item.region_offset, n)) is not None:
                batch.staged.append((i, (h, start, n, fd.fd, item.region_offset), fd))
                batch.results[i] = n
                return
            dest = region.view(item.region_offset, n)
            batch.views.append(dest)
            if batch.serial and not item.digest:  # read now, in order: the small-read path
                try:
                    if h.read_small_or_fall_back(start, dest):
                        batch.results[i] = n
                        return
                except DamagedObject as err:
                    batch.results[i] = -1
                    batch.errors[i] = (err.code, err.message)
                    return
            batch.items.append((i, h, h.steps(dest, start), item.digest, dest))
        batch.results[i] = n

    def _read_batch(self, batch: "_Batch") -> None:
        """Run a GETV's region reads (in parallel when large); an item whose data
        fails its check fails alone."""
        if batch.staged:  # fresh memory: each item read and written in by pwrite (_staged.py)
            total = sum(batch.results[i] for i, _r, _fd in batch.staged)
            done = run_reads([r for _i, r, _fd in batch.staged], self.reader.run_calls,
                             parallel=total >= GETV_PARALLEL_BYTES)
            for (i, _r, _fd), got in zip(batch.staged, done):
                if isinstance(got, GpufeedError):
                    batch.results[i], batch.errors[i] = -1, (got.code, got.message)
        items = batch.items
        if not items:
            return
        tasks = [(k, st) for k, it in enumerate(items) for st in it[2]]
        total = sum(len(st.dest) for _, st in tasks)
        failed = self.reader.run_checked(tasks, parallel=total >= GETV_PARALLEL_BYTES and len(tasks) > 1)
        for k, (i, h, steps, digest, dest) in enumerate(items):
            err = h.run_again(failed[k], steps) if k in failed else None  # from another node, or why not
            if err is not None:
                batch.results[i] = -1
                batch.errors[i] = (err.code, err.message)
            elif digest > 0:
                batch.digests[i] = piece_digests(dest, digest)

    def put_region(self, conn: Connection, rid: int, req: p.Put) -> None:
        """Store an object from bytes in a registered region (shm)."""
        self.allow(conn, WRITE, req.bucket, req.key)
        src = conn.memory.region(req.region).view(req.region_offset, req.length)
        try:
            with self.engine.begin_put(req.bucket, req.key, etag="xxh3") as pending:
                for o in range(0, len(src), PUT_STEP_BYTES):
                    pending.write(src[o:o + PUT_STEP_BYTES])
                info = pending.commit(content_type=req.content_type, metadata=req.metadata,
                                      expected_size=req.length)
        finally:
            src.release()
        conn.reply(p.Op.PUT, rid, _meta(info))

    def put_stream(self, conn: Connection, rid: int, req: p.Put | p.ChunkPut | p.PartFile, payload_len: int) -> None:
        """A PUT (or CHUNK_PUT, or PART) whose bytes follow on the socket (TCP); runs on the reader thread.

        Raises:
            ProtocolError: the payload length disagrees with the request, or the
                connection closed mid-payload (the connection is then closed).
        """
        if isinstance(req, p.ChunkPut):
            self.chunk_put(conn, rid, req, payload_len)
            return
        if isinstance(req, p.PartFile):
            serve_part(self.engine, conn, rid, req, payload_len)
            return
        if req.region != -1 or payload_len != req.length:
            raise ProtocolError(f"PUT length {req.length} != payload {payload_len}")
        try:
            self.allow(conn, WRITE, req.bucket, req.key)
            pending = self.engine.begin_put(req.bucket, req.key, etag="xxh3")
        except GpufeedError as exc:
            # Drain the payload the client is sending anyway, so the stream stays
            # framed and the client gets the real error rather than a reset.
            conn.drain(payload_len)
            conn.reply_error(rid, exc)
            return
        try:
            for chunk in conn.recv_payload(payload_len):
                pending.write(chunk)
        except BaseException:
            pending.abort()
            raise
        try:
            info = pending.commit(content_type=req.content_type, metadata=req.metadata,
                                  expected_size=req.length)
        except GpufeedError as exc:
            conn.reply_error(rid, exc)
            return
        conn.reply(p.Op.PUT, rid, _meta(info))

    def delete(self, conn: Connection, rid: int, req: p.Delete) -> None:
        """Delete an object, or one version of it (S3 DeleteObject); object lock
        refuses a protected version (``AccessDenied``)."""
        self.allow(conn, DELETE if req.version_id is None else DELETE_VERSION, req.bucket, req.key)
        if req.bypass_governance:
            self.allow(conn, BYPASS_GOVERNANCE, req.bucket, req.key)
        res = self.engine.delete_object(req.bucket, req.key, req.version_id,
                                        bypass_governance=req.bypass_governance)
        conn.reply(p.Op.DELETE, rid, p.DeleteResult(res.version_id, res.delete_marker))

    def list_objects(self, conn: Connection, rid: int, req: p.List) -> None:
        """One page of a bucket's keys (S3 ListObjectsV2 semantics)."""
        self.allow(conn, LIST, req.bucket, prefix=req.prefix)
        res = self.engine.list_objects(
            req.bucket, prefix=req.prefix, delimiter=req.delimiter, start_after=req.start_after,
            continuation_token=req.token, max_keys=req.max_keys, snapshot=req.snapshot)
        entries = [p.ListEntry(o.key, o.size, o.etag, o.last_modified) for o in res.objects]
        conn.reply(p.Op.LIST, rid, p.ListReply(entries, list(res.common_prefixes),
                                                res.is_truncated, res.next_token))

    # --- buckets -------------------------------------------------------------------
    def create_bucket(self, conn: Connection, rid: int, req: p.BucketReq) -> None:
        """Create a bucket (a KV bucket with capacity and TTL, or a plain one), owned
        by the connection's tenant (another tenant's name: ``BucketAlreadyExists``)."""
        who = conn.principal
        if who is None:
            raise AccessDenied("Access Denied")
        self.engine.create_bucket(req.bucket, kind=req.kind, capacity_bytes=req.capacity_bytes,
                                  ttl_s=req.ttl_s, owner=who.tenant)
        conn.reply(p.Op.CREATE_BUCKET, rid, p.Empty())

    def bucket_stats(self, conn: Connection, rid: int, req: p.BucketReq) -> None:
        """A bucket's counters."""
        self.allow(conn, LIST, req.bucket)
        conn.reply(p.Op.BUCKET_STATS, rid, p.BucketStats(**self.engine.bucket_stats(req.bucket)))

    def list_buckets(self, conn: Connection, rid: int, req: p.Empty) -> None:
        """The names of the connection's tenant's buckets."""
        who = conn.principal
        if who is None:
            raise AccessDenied("Access Denied")
        conn.reply(p.Op.LIST_BUCKETS, rid,
                   p.BucketsReply([b.name for b in self.engine.list_buckets(owner=who.tenant)]))

    def delete_bucket(self, conn: Connection, rid: int, req: p.BucketReq) -> None:
        """Delete an empty bucket."""
        self.allow(conn, DELETE_BUCKET, req.bucket)
        self.engine.delete_bucket(req.bucket)
        conn.reply(p.Op.DELETE_BUCKET, rid, p.Empty())


class _Batch:
    """The plan and the results of one GETV.

    Args:
        n: items in the batch.
    """

    __slots__ = ("results", "errors", "digests", "extents", "items", "views", "opened", "serial", "regions",
                 "staged")

    def __init__(self, n: int) -> None:
        #: bytes of each item (-1 on error), then bytes that landed
        self.results: list[int] = [0] * n
        self.errors: dict[int, tuple[str, str]] = {}
        self.digests: dict[int, list[int]] = {}
        #: checked pieces of each TCP item, sent in order after the reply
        self.extents: list = []
        #: region items: (index, handle, read steps, digest piece bytes, destination)
        self.items: list[tuple[int, ObjectHandle, list, int, memoryview]] = []
        self.views: list[memoryview] = []
        #: (bucket, key, version_id, snapshot) -> what the batch opened (each released once at the end)
        self.opened: dict[tuple[str, str, str | None, str | None], ObjectHandle] = {}
        #: the batch is read on this thread only (small items are read as planned)
        self.serial = False
        #: region id -> the region, looked up once per batch
        self.regions: dict = {}
        #: items read into fresh memory: (index, the StagedRead, the descriptor it writes to)
        self.staged: list = []

    def release_views(self) -> None:
        """Release every region view (a released region must not stay exported)."""
        for it in self.items:
            for st in it[2]:
                st.dest.release()
        for v in self.views:
            v.release()
        self.items.clear()
        self.views.clear()


def _meta(info: ObjectInfo) -> p.ObjectMeta:
    return p.ObjectMeta(info.bucket, info.key, info.size, info.etag, info.last_modified,
                        info.content_type, dict(info.metadata), info.version_id, info.lock_mode,
                        info.lock_until, info.legal_hold)


def _payload(h: ObjectHandle, start: int, n: int) -> list:
    """The checked pieces of a TCP read of ``n`` bytes at ``start``: a small
    whole-block read is read (and checked) into a buffer of its own, sent with
    the reply's header in one ``sendmsg``; anything else is checked file
    extents for ``sendfile`` (:meth:`ObjectHandle.extents`).

    Raises:
        DamagedObject: the bytes failed their check.
    """
    if 0 < n <= SMALL_PAYLOAD_BYTES:
        buf = memoryview(bytearray(n))
        if h.read_small_or_fall_back(start, buf):
            return [buf]
    return h.extents(start, n)


def ranges_of(req: p.GetRanges) -> tuple[array, array]:
    """The offsets and lengths of a GETR as ``array('Q')`` and ``array('I')``.

    Raises:
        InvalidArgument: the columns are not whole uint64 / uint32 items of one
            count, more than :data:`~gpufeed.wire.protocol.MAX_RANGES` items, or
            a length over :data:`~gpufeed.wire.protocol.MAX_RANGE_BYTES`.
    """
    count = len(req.offsets) // 8
    if len(req.offsets) % 8 or len(req.lengths) != 4 * count or count > p.MAX_RANGES:
        raise InvalidArgument(f"GETR takes offsets (uint64) and lengths (uint32) of one count, at most "
                              f"{p.MAX_RANGES} items; got {len(req.offsets)} and {len(req.lengths)} bytes")
    offsets, lengths = array("Q", req.offsets), array("I", req.lengths)
    if not _LITTLE:
        offsets.byteswap()
        lengths.byteswap()
    if count and max(lengths) > p.MAX_RANGE_BYTES:
        raise InvalidArgument(f"a GETR range is at most {p.MAX_RANGE_BYTES} bytes")
    return offsets, lengths


def _swapped(code: str, values: list[int]) -> bytes:
    a = array(code, values)
    a.byteswap()
    return a.tobytes()


def range_errors(errors: dict[int, GpufeedError]) -> dict[int, tuple[str, str]]:
    """A GETR reply's ``errors``: ``{range: (code, message)}``, each message that
    an earlier range has already sent as ``"as range K"``, and past
    :data:`ERROR_MESSAGE_BYTES` of messages each cut to 100 characters, so that
    65,536 failed ranges stay far under the frame's 16 MiB metadata limit."""
    out: dict[int, tuple[str, str]] = {}
    first: dict[tuple[str, str], int] = {}
    total = 0
    for i in sorted(errors):
        code, msg = errors[i].code, errors[i].message
        k = first.setdefault((code, msg), i)
        if k != i:
            msg = f"as range {k}"
        elif total > ERROR_MESSAGE_BYTES:
            msg = msg[:100]
        total += len(msg)
        out[i] = (code, msg)
    return out


def _extent(item: p.Get, size: int) -> tuple[int, int]:
    """``(start, n)`` of a read request against an object of ``size`` bytes."""
    if 0 <= item.offset and 0 < item.length and item.offset + item.length <= size:
        return item.offset, item.length  # the common case, inside the object
    if item.length == 0:
        if item.offset < 0 or item.offset > size:
            raise InvalidRange(f"offset {item.offset} is outside the object ({size} bytes)")
        return item.offset, 0
    if item.length < 0:
        return resolve_range(OffsetByteRequest(item.offset), size)
    return resolve_range(RangeByteRequest(item.offset, item.offset + item.length), size)


def _take(pieces: Iterator[memoryview], n: int) -> tuple[bytes, bytes]:
    """The first ``n`` bytes of ``pieces``, and what is left of the piece they end in."""
    head = bytearray()
    while len(head) < n:
        head += next(pieces)
    return bytes(head[:n]), bytes(head[n:])


def _rest(left: bytes, pieces: Iterator[memoryview]) -> Iterator[memoryview]:
    """The bytes after :func:`_take`'s: ``left``, then the rest of ``pieces``."""
    if left:
        yield memoryview(left)
    yield from pieces
