"""Listing keys one page at a time (S3 ListObjectsV2 / ListObjects semantics).

A page is read by seeking through the catalog's key order
(:meth:`gpufeed.engine.catalog.CatalogReader.scan_objects`): with a delimiter,
the first key under a common prefix rolls the prefix up and the scan seeks past
every key under it instead of reading them.

Source: "ListObjectsV2", Amazon S3 API Reference,
https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import closing
from typing import Protocol

from ._names import decode_token, encode_token, successor
from .types import ListResult, ObjectInfo

__all__ = ["start_position", "read_page", "KeyScan"]


class KeyScan(Protocol):
    """What a page is read through: a catalog reader, or a snapshot's entries
    seen the same way (:mod:`._snapshots`)."""

    def scan_objects(self, bucket: str, start: str, *, inclusive: bool, end: str | None,
                     limit: int) -> Generator[ObjectInfo, None, None]:
        """As :meth:`gpufeed.engine.catalog.CatalogReader.scan_objects`."""
        ...

#: Where a scan resumes: ``(key, inclusive)``; ``None`` means past the end.
Position = tuple[str, bool] | None


def start_position(prefix: str, delimiter: str, start_after: str, continuation_token: str | None) -> Position:
    """Where the page starts.

    ``continuation_token`` (a ``next_token`` of ours) takes precedence over
    ``start_after``; a ``start_after`` that is itself a common prefix under
    ``delimiter`` (a v1 ``NextMarker`` such as ``"b/"``) skips every key under it.

    Raises:
        InvalidArgument: a token we did not make.
    """
    pos: Position
    if continuation_token is not None:
        kind, value = decode_token(continuation_token)
        if kind == "k":
            pos = (value, False)
        else:
            s = successor(value)
            pos = None if s is None else (s, True)
    elif start_after:
        pos = (start_after, False)
        if delimiter and start_after.startswith(prefix):
            i = start_after.find(delimiter, len(prefix))
            if i >= 0 and i + len(delimiter) == len(start_after):
                s = successor(start_after)  # past every key that rolls up into it
                pos = None if s is None else (s, True)
    else:
        pos = (prefix, True)
    if pos is not None and pos[0] < prefix:
        pos = (prefix, True)
    return pos


def read_page(reader: KeyScan, bucket: str, pos: Position, *, prefix: str, delimiter: str,
              max_keys: int, hidden_before: float | None) -> ListResult:
    """One page of up to ``max_keys`` (>= 1) entries from ``pos``, read through ``reader``.

    Objects written at or before ``hidden_before`` (Unix s; expired in a kv
    bucket) are skipped. Each common prefix counts as one entry.
    """
    hi = successor(prefix) if prefix else None
    plen, dlen = len(prefix), len(delimiter)
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    last: tuple[str, str] | None = None
    truncated = False
    while pos is not None:
        need = max_keys - len(objects) - len(prefixes)
        if need <= 0:
            with closing(reader.scan_objects(bucket, pos[0], inclusive=pos[1], end=hi, limit=1)) as more:
                truncated = next(more, None) is not None
            break
        seen = 0
        with closing(reader.scan_objects(bucket, pos[0], inclusive=pos[1], end=hi, limit=need)) as rows:
            for info in rows:
                seen += 1
                key = info.key
                if hidden_before is not None and info.last_modified <= hidden_before:
                    last = ("k", key)  # expired: invisible (deleted at the next eviction pass)
                    continue
                if dlen:
                    i = key.find(delimiter, plen)
                    if i >= 0:
                        cp = key[: i + dlen]
                        prefixes.append(cp)
                        last = ("p", cp)
                        s = successor(cp)
                        pos = None if s is None else (s, True)
                        break
                objects.append(info)
                last = ("k", key)
            else:
                if seen < need:
                    pos = None  # exhausted
                else:
                    assert last is not None  # seen == need >= 1 rows, so one was read
                    pos = (last[1], False)
    next_token = next_marker = None
    if truncated and last is not None:
        next_token = encode_token(*last)
        next_marker = last[1]
    return ListResult(objects, prefixes, truncated, next_token, next_marker)
