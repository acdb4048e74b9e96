"""Where each sample's bytes lie in a tar shard: the index that raw-tensor
batches are read by (``ShardDataset(..., dtype=...)``).

A shard's index is found with small range reads when its layout is the
regular one (every sample one file of one size, plain ustar headers: what
``webdataset.TarWriter`` and :func:`~gpufeed.ai.data.write_shard` write for
such samples): the first header gives the member size, so every header's
place is known, and one batched range read (``get_ranges_into``) fetches them
all, with the bytes after the last member. Every header is then checked as
the full parser checks it (checksum, regular file, the same size, a name
``<key>.<ext>`` with a new key each) and the bytes after the end marker must
be zero. Any other layout (several files per sample, pax or long-name
headers, samples of different sizes), and any header that does not check, is
indexed by reading the shard whole and parsing it with
:func:`~gpufeed.ai.data._tar.member_spans`, which names what is wrong
(:class:`~gpufeed.ai.data.CorruptShard`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...wire.protocol import MAX_RANGES
from ._errors import CorruptShard, SampleDecodeError
from ._source import Listed
from ._tar import BLOCK, member_spans, split_name

__all__ = ["TarIndex", "predicted_index", "parsed_index", "MAX_TAIL_BYTES"]

#: The bytes after the last member that the predicted index reads and checks, at
#: most (tar writers pad to a 10,240-byte record); a longer tail is parsed instead.
MAX_TAIL_BYTES = 64 << 10  # 64 KiB


@dataclass(frozen=True)
class TarIndex:
    """The tensor file of each sample of one shard, in shard order.

    Attributes:
        keys: each sample's key.
        offsets: ``int64`` byte offset of each sample's file data in the shard.
        sizes: ``int64`` bytes of each sample's file.
    """

    keys: list[str]
    offsets: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)


def _name(hdr: np.ndarray) -> str:
    raw = hdr.tobytes()
    name = raw[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    if raw[257:262] == b"ustar" and raw[345]:
        name = raw[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
    return name


def _octal(field: bytes) -> int | None:
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        return None


def _headers_check(rows: np.ndarray, ext: str | None) -> list[str] | None:
    """The keys of ``rows`` (one ustar header each), or ``None`` when any is not
    a regular file of the first one's size named ``<new key>.<ext>``, or its
    checksum is wrong."""
    if not (rows[:, 124:136] == rows[0, 124:136]).all() or not np.isin(rows[:, 156], (48, 0)).all():
        return None
    sums = rows.sum(1, dtype=np.int64) - rows[:, 148:156].sum(1, dtype=np.int64) + 8 * 32
    keys: list[str] = []
    for r, row in enumerate(rows):
        if _octal(row[148:156].tobytes()) != sums[r]:
            return None
        parts = split_name(_name(row))
        if parts is None or (ext is not None and parts[1] != ext) or (keys and keys[-1] == parts[0]):
            return None
        keys.append(parts[0])
    return keys


def predicted_index(read_ranges: Callable[[np.ndarray, list[int], int], np.ndarray], shard: Listed,
                    ext: str | None) -> TarIndex | None:
    """The index of a shard of the regular layout, from its headers alone.

    Args:
        read_ranges: ``read_ranges(dest, offsets, length)``: ``get_ranges_into``
            of the shard (one length for every range), returning the counts.
        shard: the shard as listed (its size bounds the layout).
        ext: the samples' file extension (``None``: any, one file per sample).

    Returns:
        The index, or ``None`` when the shard is not of that layout (parse it).
    """
    if shard.size < 3 * BLOCK:
        return None
    head = np.zeros((1, BLOCK), np.uint8)
    if read_ranges(head, [0], BLOCK)[0] != BLOCK or _headers_check(head, ext) is None:
        return None
    size = _octal(head[0, 124:136].tobytes())
    if size is None or head[0, 124] & 0x80:
        return None
    stride = BLOCK + -(-size // BLOCK) * BLOCK
    count = (shard.size - 2 * BLOCK) // stride + 1  # every place a header or the end marker can be
    if count > MAX_RANGES:
        return None
    blocks = np.empty((count, BLOCK), np.uint8)
    if (read_ranges(blocks, [k * stride for k in range(count)], BLOCK) != BLOCK).any():
        return None
    zero = np.logical_not(blocks.any(axis=1, keepdims=False)).reshape(-1)
    n = int(zero.argmax())
    tail_len = shard.size - n * stride
    if not zero[n] or n == 0 or tail_len > MAX_TAIL_BYTES:
        return None
    keys = _headers_check(blocks[:n], ext)
    tail = np.empty((1, tail_len), np.uint8)
    if keys is None or read_ranges(tail, [n * stride], tail_len)[0] != tail_len or tail.any():
        return None
    offsets = np.arange(n, dtype=np.int64) * stride + BLOCK
    return TarIndex(keys, offsets, np.full(n, size, np.int64))


def parsed_index(data: memoryview, where: str, ext: str | None) -> TarIndex:
    """The index of a shard held whole in memory, by the strict parser.

    Args:
        data: the shard's bytes.
        where: ``"bucket/key"`` of the shard (named in errors).
        ext: the extension of each sample's tensor file; ``None``: each sample
            must have exactly one file.

    Raises:
        CorruptShard: the shard does not parse, or a sample has two files of one extension.
        SampleDecodeError: a sample without an ``ext`` file, or (``ext=None``)
            with more than one file.
    """
    samples: list[tuple[str, dict[str, tuple[int, int]]]] = []
    for name, start, size in member_spans(data, where):
        parts = split_name(name)
        if parts is None:
            continue
        key, e = parts
        if not samples or samples[-1][0] != key:
            samples.append((key, {}))
        files = samples[-1][1]
        if e in files:
            raise CorruptShard(f"{where}: sample {key!r} has two files with extension {e!r}")
        files[e] = (start, size)
    spans = []
    for key, files in samples:
        if ext is None and len(files) != 1:
            raise SampleDecodeError(f"{where}: sample {key!r} has files {sorted(files)}: pass ext= to choose "
                                    "the one that holds the tensor")
        if ext is not None and ext not in files:
            raise SampleDecodeError(f"{where}: sample {key!r} has no {ext!r} file (it has {sorted(files)})")
        spans.append(files[ext] if ext is not None else next(iter(files.values())))
    arr = np.array(spans, np.int64).reshape(-1, 2)
    return TarIndex([k for k, _ in samples], arr[:, 0].copy(), arr[:, 1].copy())
