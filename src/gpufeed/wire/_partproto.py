"""The PART op's messages (op 27 of ``docs/wire-protocol.md``): a cluster
peer's request about the part files of a multipart upload, re-exported by
:mod:`gpufeed.wire.protocol` with every other message."""

from __future__ import annotations

import msgspec

__all__ = ["PartFile", "PartFileReply", "PART_ACTIONS", "PART_HAS_MAX"]

#: What a PART request may ask: store a copy of a part file (its bytes are the
#: payload), send one back (the reply's payload), delete part files, or say
#: which of the part files named it holds.
PART_ACTIONS = ("put", "get", "drop", "has")
#: Most part files one ``has`` request names.
PART_HAS_MAX = 1000


class PartFile(msgspec.Struct, array_like=True, frozen=True):
    """PART: ``action`` (one of :data:`PART_ACTIONS`) on the part files
    ``files`` of upload ``upload_id`` of ``bucket/key``, asked by a cluster peer
    authenticated with its node key. ``put``: one file whose ``length`` bytes
    are the payload and whose hex MD5 must be ``md5`` (the part's ETag);
    ``get``: one file, sent back as the reply's payload; ``drop``: the files
    named, or the upload's whole folder when ``files`` is empty; ``has``: the
    files named (at most :data:`PART_HAS_MAX`)."""

    action: str
    bucket: str
    key: str
    upload_id: str
    files: list[str]
    length: int = 0
    md5: str = ""


class PartFileReply(msgspec.Struct, array_like=True, frozen=True):
    """``put``: bytes stored (0: the node had the file already); ``get``: the
    payload's length; ``drop``: files (or folders) removed; ``has``: how many of
    the files named the node holds, and ``files``, those files (empty, and left
    out of the frame, for the other actions)."""

    size: int
    files: tuple[str, ...] = ()
