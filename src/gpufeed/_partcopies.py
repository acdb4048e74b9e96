"""Part files of multipart uploads across the nodes of a cluster: this node's
side of the fast path's PART op (27), installed as the engine's
:class:`~gpufeed.engine._partcopies.PartPeers`.

**Copies** (:meth:`PartCopies.push`): the node that receives a part keeps its
file and sends it to ``factor - 1`` other live members before the part's
catalog row commits (so before UploadPart is answered); the receiver checks
the bytes against the part's MD5 (its ETag), fsyncs and only then replies.
Members are ranked by rendezvous hashing of the *upload id*
(:func:`gpufeed.engine._placement.rank`), so every part of an upload goes to
the same first-ranked members: with factor 2 the upload's first-ranked live
member holds every part that it did not receive itself, and a completion
through it copies nothing over the network. A member without room for the
file by the figures of its last heartbeat is passed over
(:func:`gpufeed.engine._room.node_fits`), and one that refuses it (its own
check, :mod:`gpufeed.engine._room`: ``StorageFull``) or fails otherwise is
replaced by the next-ranked one; when fewer members than needed take the
file, the part is refused, with ``StorageFull`` (507) when every member passed
over or failing lacked room, else ``ServiceUnavailable`` (503), and the copies
some took are deleted.

**Fetches** (:meth:`PartCopies.fetch_parts`): a completion on a node that
lacks part files fetches them, at most ``part_fetches`` at once
(``GPUFEED_CLUSTER_PART_FETCHES``), each from the live members in the
upload's rank order; the bytes are written in place into the object being
built and checked against the part's MD5 as they arrive. Bytes that fail are
overwritten by the next member's; a member that lacks the file says so at
once. The first part that no member sends stops the others (those not begun
are not begun, those under way end at their next 1 MiB piece) and is what
the completion answers.

**Copies made again** (:meth:`PartCopies.holders`, :meth:`PartCopies.copy_more`,
used by :mod:`gpufeed._partrepair` after a member is lost): which other live
members hold which part files of an upload (PART ``has``, all members at
once), and a copy to more members in the upload's rank order, checked and
fsynced like the first ones.

**Deletes** (:meth:`PartCopies.drop`): abort, completion, a replaced part and a
refused part ask every other live member, all at once, to delete the files
(waiting at most the fetch timeout for each); a member that
cannot be reached deletes them at its next start or by its orphan sweep.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from ._peers import PeerLink, recv_exact, recv_to_fd
from ._replicas import Replicas
from .engine._membership import NodeInfo
from .engine._placement import rank
from .engine._room import node_fits
from .errors import (
    GpufeedError,
    HolderUnavailable,
    NoSuchKey,
    NoSuchUpload,
    ProtocolError,
    ServiceUnavailable,
    StorageFull,
)
from .wire import protocol as p

__all__ = ["PartCopies"]

log = logging.getLogger("gpufeed.cluster")

_REPLY_META_MAX = 64 << 10  # 64 KiB
#: What a failure line of a member without room for a part file ends with.
_NO_ROOM = "StorageFull"


class PartCopies:
    """This node's side of part files on other nodes.

    Args:
        replicas: the node's copies of data files (live members, factor, node id, copy timeout).
        link: the node's peer link (node keys, handshake).
        fetch_timeout_s: the longest any one wait of a fetch or delete may take (> 0).
        part_fetches: most part files one completion fetches at once (>= 1).

    Raises:
        ValueError: ``part_fetches`` < 1.
    """

    def __init__(self, replicas: Replicas, link: PeerLink, fetch_timeout_s: float, part_fetches: int = 4) -> None:
        if part_fetches < 1:
            raise ValueError(f"a completion needs at least 1 part fetch at once, not {part_fetches}")
        self._r, self._link, self.fetch_timeout_s = replicas, link, fetch_timeout_s
        self.part_fetches = part_fetches

    def _peers(self) -> dict[str, NodeInfo]:
        return {n.node_id: n for n in self._r.live() if n.node_id != self._r.node_id and n.wire_port}

    def push(self, bucket: str, key: str, upload_id: str, file: str, path: str, md5: str) -> list[str]:
        """Copy part file ``file`` (at ``path``) to ``factor - 1`` other live members
        (capped to those live), in the upload's rank order.

        Returns:
            The node ids that took it.

        Raises:
            NoSuchUpload: a member found the upload ended meanwhile.
            ServiceUnavailable: fewer members than needed took it (naming each failure).
        """
        if self._r.factor <= 1:
            return []
        peers = self._peers()
        need = min(self._r.factor, len(peers) + 1) - 1
        req = p.PartFile("put", bucket, key, upload_id, [file], os.path.getsize(path), md5)
        got, errors = self._send_ranked(peers, req, path, need)
        if len(got) < need:
            self._drop_on([peers[n] for n in got], bucket, key, upload_id, [file])
            why = "; ".join(errors) or "no other live member to take it"
            text = (f"part file {file} of upload {upload_id} reached {len(got)} of the {need} other nodes that "
                    f"replication factor {self._r.factor} needs with {len(peers) + 1} live members ({why}); the "
                    "part was not stored (GPUFEED_CLUSTER_REPLICAS)")
            if errors and all(_NO_ROOM in e for e in errors):
                raise StorageFull(text)
            raise ServiceUnavailable(text)
        return got

    def _send_ranked(self, peers: dict[str, NodeInfo], req: p.PartFile, path: str,
                     need: int) -> tuple[list[str], list[str]]:
        """Send the part file at ``path`` (PART ``req``) to ``need`` of ``peers``, in
        the upload's rank order, the next-ranked one taking over from one that fails.

        Returns:
            ``(node ids that took it, one line per failure)``.

        Raises:
            NoSuchUpload: a member found the upload ended meanwhile (the copies
                made are deleted again).
        """
        got: list[str] = []
        errors: list[str] = []
        for node in rank(req.upload_id.encode(), peers):
            if len(got) >= need:
                break
            info = peers[node]
            if not node_fits(info, req.length):
                errors.append(f"node {node}: {info.free_bytes} bytes free by its last heartbeat ({_NO_ROOM})")
                continue
            try:
                self._ask(info, req, self._r.timeout_s, path=path)
                got.append(node)
            except NoSuchUpload:
                self._drop_on([peers[n] for n in got], req.bucket, req.key, req.upload_id, list(req.files))
                raise
            except StorageFull as exc:
                errors.append(f"{_why(info, exc, self._r.timeout_s, '')} ({_NO_ROOM})")
            except (OSError, ProtocolError, GpufeedError) as exc:
                errors.append(_why(info, exc, self._r.timeout_s, "GPUFEED_CLUSTER_COPY_TIMEOUT_S"))
        return got, errors

    def copy_more(self, bucket: str, key: str, upload_id: str, file: str, path: str, md5: str,
                  have: set[str], need: int) -> tuple[list[str], list[str]]:
        """Copy part file ``file`` (at ``path``, hex MD5 ``md5``) to ``need`` more live
        members that are not in ``have``, in the upload's rank order (the copies
        re-replication makes; each is checked and fsynced as :meth:`push`'s are).

        Returns:
            ``(node ids that took it, one line per failure)``.

        Raises:
            NoSuchUpload: a member found the upload ended meanwhile.
        """
        peers = {n: info for n, info in self._peers().items() if n not in have}
        req = p.PartFile("put", bucket, key, upload_id, [file], os.path.getsize(path), md5)
        return self._send_ranked(peers, req, path, need)

    def holders(self, bucket: str, key: str, upload_id: str, files: list[str]) -> dict[str, set[str]]:
        """Which other live members hold each of part files ``files``: all members
        are asked at once (PART ``has``, :data:`~gpufeed.wire.protocol.PART_HAS_MAX`
        names a request). A member that does not answer counts as holding none of
        them (logged at INFO).

        Returns:
            ``{file: node ids}``.
        """
        found: dict[str, set[str]] = {f: set() for f in files}
        peers = list(self._peers().values())

        def one(info: NodeInfo) -> tuple[str, list[str]]:
            held: list[str] = []
            try:
                for i in range(0, len(files), p.PART_HAS_MAX):
                    req = p.PartFile("has", bucket, key, upload_id, files[i:i + p.PART_HAS_MAX])
                    held += self._ask(info, req, self.fetch_timeout_s).files
            except (OSError, ProtocolError, GpufeedError) as exc:
                log.info("part files of upload %s: node %s did not say which it holds: %s", upload_id,
                         info.node_id, _why(info, exc, self.fetch_timeout_s, "GPUFEED_CLUSTER_FETCH_TIMEOUT_S"))
            return info.node_id, held

        if peers:
            with ThreadPoolExecutor(len(peers), thread_name_prefix="gpufeed-part-has") as pool:
                for node, held in pool.map(one, peers):
                    for f in held:
                        if f in found:
                            found[f].add(node)
        return found

    def fetch_parts(self, bucket: str, key: str, upload_id: str, wants: list[tuple[str, str, int, int]],
                    fd: int) -> None:
        """Write each part file of ``wants`` (``(file, hex MD5, size, offset)``) at
        its offset of ``fd``, as the first live member (in the upload's rank order)
        that has it sends it with that MD5; at most :attr:`part_fetches` at once.

        Raises:
            HolderUnavailable: no live member sent one of them (each one's reason
                named); the others were stopped, and what they wrote is left for
                the caller to discard.
        """
        if not wants:
            return
        peers, stop = self._peers(), threading.Event()
        with ThreadPoolExecutor(min(self.part_fetches, len(wants)), thread_name_prefix="gpufeed-part-fetch") as pool:
            futures = [pool.submit(self._fetch_one, peers, bucket, key, upload_id, *w, fd, stop) for w in wants]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            first = next((f.exception() for f in futures if f in done and f.exception() is not None), None)
            if first is not None:
                stop.set()  # the rest end at their next piece, or never begin
                for f in futures:
                    f.cancel()
        if first is not None:
            raise first

    def _fetch_one(self, peers: dict[str, NodeInfo], bucket: str, key: str, upload_id: str, file: str, md5: str,
                   size: int, offset: int, fd: int, stop: threading.Event) -> None:
        """One part file of :meth:`fetch_parts`, each of ``peers`` asked in the upload's rank order.

        Raises:
            HolderUnavailable: no member sent it, or ``stop`` was set meanwhile.
        """
        failures: list[str] = []
        for node in rank(upload_id.encode(), peers):
            if stop.is_set():
                raise HolderUnavailable(f"part file {file} of upload {upload_id}: stopped (another part failed)")
            info = peers[node]
            req = p.PartFile("get", bucket, key, upload_id, [file])
            try:
                self._ask(info, req, self.fetch_timeout_s, into=(fd, offset, size, md5), stop=stop)
                return
            except NoSuchKey:
                failures.append(f"node {node} has no copy")
            except (OSError, ProtocolError, GpufeedError) as exc:
                failures.append(_why(info, exc, self.fetch_timeout_s, "GPUFEED_CLUSTER_FETCH_TIMEOUT_S"))
        part = int(file.split(".")[0])
        raise HolderUnavailable(
            f"part {part} of upload {upload_id} ({bucket}/{key}) is in no live node's folder that answered: "
            f"{'; '.join(failures) or 'no other live member'}; the upload can be completed once a node that "
            "holds it is back")

    def drop(self, bucket: str, key: str, upload_id: str, files: list[str]) -> None:
        """Ask every other live member to delete part files ``files`` (the upload's
        folder when empty); failures are logged, never raised."""
        self._drop_on(list(self._peers().values()), bucket, key, upload_id, files)

    def _drop_on(self, nodes: list[NodeInfo], bucket: str, key: str, upload_id: str, files: list[str]) -> None:
        """Ask ``nodes``, all at once, to delete part files ``files`` (see :meth:`drop`)."""
        req = p.PartFile("drop", bucket, key, upload_id, list(files))

        def one(info: NodeInfo) -> None:
            try:
                self._ask(info, req, self.fetch_timeout_s)
            except (OSError, ProtocolError, GpufeedError) as exc:
                log.info("part files of upload %s left on node %s until its sweep: %s", upload_id, info.node_id,
                         _why(info, exc, self.fetch_timeout_s, "GPUFEED_CLUSTER_FETCH_TIMEOUT_S"))

        if nodes:
            with ThreadPoolExecutor(len(nodes), thread_name_prefix="gpufeed-part-drop") as pool:
                list(pool.map(one, nodes))

    def _ask(self, info: NodeInfo, req: p.PartFile, timeout_s: float, *, path: str | None = None,
             into: tuple[int, int, int, str] | None = None, stop: threading.Event | None = None) -> p.PartFileReply:
        """One PART request on a fresh authenticated connection to ``info``: the file
        at ``path`` as its payload (put), the reply's payload written and checked
        ``into`` ``(fd, offset, size, md5)`` (get; given up once ``stop`` is set).
        Returns the reply.

        Raises:
            GpufeedError: the node's error reply, as its own type.
            OSError, ProtocolError: the connection failed, or the bytes failed their check.
        """
        with socket.create_connection((info.host, info.wire_port), timeout=timeout_s) as sock:
            self._link.authenticate(sock)
            meta = p.encode(req)
            sock.sendall(p.pack_header(p.Op.PART, len(meta), 1, req.length) + meta)
            if path is not None:
                with open(path, "rb") as f:
                    if sock.sendfile(f, 0, req.length) != req.length:
                        raise ProtocolError(f"part file {req.files[0]} ended before {req.length} bytes")
            got, payload = _answer(sock)
            reply = p.decode(p.PartFileReply, got)
            if into is not None:
                _receive_checked(sock, payload, *into, stop=stop)
            elif payload:
                raise ProtocolError(f"a payload of {payload} bytes on a PART {req.action!r} reply")
            return reply


def _answer(sock: socket.socket) -> tuple[bytes, int]:
    """The reply to a PART request: its metadata and payload length.

    Raises:
        GpufeedError: an error reply, as its own type.
        ProtocolError: a reply to another op.
    """
    rop, meta_len, _, payload = p.unpack_header(recv_exact(sock, p.HEADER_SIZE), max_meta=_REPLY_META_MAX)
    got = recv_exact(sock, meta_len)
    if rop == p.ERROR_OP:
        raise p.error_from_reply(p.decode(p.ErrorReply, got))
    if rop != p.Op.PART | p.REPLY:
        raise ProtocolError(f"a reply of op {rop} to op {int(p.Op.PART)}")
    return got, payload


def _receive_checked(sock: socket.socket, payload: int, fd: int, offset: int, size: int, md5: str, *,
                     stop: threading.Event | None = None) -> None:
    """Write the ``payload`` bytes at ``offset`` of ``fd`` and check them: ``size``
    bytes with hex MD5 ``md5`` (given up at the next piece once ``stop`` is set).

    Raises:
        ProtocolError: another length, another MD5, the connection closed first, or stopped.
    """
    if payload != size:
        raise ProtocolError(f"the node sent {payload} bytes of a part of {size}")
    h = hashlib.md5()
    recv_to_fd(sock, fd, offset, size, h, stop=stop)
    if h.hexdigest() != md5:
        raise ProtocolError(f"the bytes sent have MD5 {h.hexdigest()}, not the part's {md5}")


def _why(info: NodeInfo, exc: BaseException, timeout_s: float, setting: str) -> str:
    """One line naming the node and what went wrong with it."""
    where = f"node {info.node_id} at {info.host}:{info.wire_port}"
    if isinstance(exc, TimeoutError):
        return f"{where} did not answer within {timeout_s:.1f} s ({setting})"
    return f"{where}: {exc.message if isinstance(exc, GpufeedError) else exc}"
