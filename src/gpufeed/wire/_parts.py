"""The PART op (27): a cluster peer stores, fetches, deletes or looks for the part files
of a multipart upload on this node (``docs/cluster.md``, "Multipart uploads
across nodes"). Only a connection authenticated with a node key of a member
may send it; the engine does the work (:mod:`gpufeed.engine._partcopies`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AccessDenied, GpufeedError, InvalidArgument, ProtocolError
from . import protocol as p
from ._auth import PEER_TENANT

if TYPE_CHECKING:
    from ..engine import Engine
    from ._conn import Connection

__all__ = ["serve_part"]


def _refusal(conn: "Connection", req: p.PartFile, payload_len: int) -> GpufeedError | None:
    """Why the request is refused before its payload is read (``None``: it is not).

    Raises:
        ProtocolError: the payload length disagrees with the request (the connection is then closed).
    """
    expected = req.length if req.action == "put" else 0
    if payload_len != expected or req.length < 0:
        raise ProtocolError(f"PART {req.action!r} of {req.length} bytes != payload {payload_len}")
    who = conn.principal
    if who is None or who.tenant != PEER_TENANT:
        return AccessDenied("PART is accepted from the nodes of this node's cluster only")
    if req.action not in p.PART_ACTIONS:
        return InvalidArgument(f"PART action must be one of {', '.join(p.PART_ACTIONS)}, not {req.action!r}")
    if req.action in ("put", "get") and len(req.files) != 1:
        return InvalidArgument(f"PART {req.action!r} names one part file, not {len(req.files)}")
    if req.action == "has" and len(req.files) > p.PART_HAS_MAX:
        return InvalidArgument(f"PART 'has' names at most {p.PART_HAS_MAX} part files, not {len(req.files)}")
    return None


def serve_part(engine: "Engine", conn: "Connection", rid: int, req: p.PartFile, payload_len: int) -> None:
    """Answer one PART request (on the connection's reader thread): ``put``
    replies once the copy is checked and durable, ``get`` sends the part file by
    ``sendfile``, ``drop`` replies with the count removed, ``has`` with the
    files named that this node holds.

    Raises:
        ProtocolError: the payload length disagrees with the request, or the
            connection closed mid-payload (the connection is then closed).
    """
    refusal = _refusal(conn, req, payload_len)
    if refusal is not None:
        conn.drain(payload_len)
        conn.reply_error(rid, refusal)
        return
    try:
        if req.action == "put":
            stored = engine.receive_part(req.bucket, req.key, req.upload_id, req.files[0], req.md5,
                                         req.length, conn.recv_payload(payload_len))
            conn.reply(p.Op.PART, rid, p.PartFileReply(req.length if stored else 0))
        elif req.action == "get":
            with engine.held_part(req.bucket, req.key, req.upload_id, req.files[0]) as (fd, size):
                conn.reply_with_files(p.Op.PART, rid, p.PartFileReply(size), [(fd, 0, size)] if size else [])
        elif req.action == "has":
            held = engine.held_part_files(req.upload_id, list(req.files))
            conn.reply(p.Op.PART, rid, p.PartFileReply(len(held), tuple(held)))
        else:
            removed = engine.drop_part_files(req.bucket, req.key, req.upload_id, list(req.files))
            conn.reply(p.Op.PART, rid, p.PartFileReply(removed))
    except GpufeedError as exc:
        conn.reply_error(rid, exc)
