"""WebDataset-style tar shards: a strict reader over bytes in memory, and a writer.

The format is the ``webdataset`` package's: a POSIX tar archive (ustar, with
pax or GNU long names allowed) whose regular files are named
``<key>.<ext>``; consecutive files with the same key form one sample, a dict
``{"__key__": key, ext: bytes, ...}``. As ``webdataset.tariterators`` does,
the key is everything up to the first dot of the last path element
(``a/b/000001.seg.png`` -> key ``a/b/000001``, extension ``seg.png``),
extensions are lower-cased, files named ``__...__`` (or under a
``__...__/`` folder) and files without an extension are skipped, and two files of one sample with the same extension
are an error.

The reader is stricter than ``tarfile``: every header's checksum is checked,
a member that runs past the end of the object, a missing end marker (two
zero blocks, which every tar writer adds) or bytes after it make the whole
shard :class:`CorruptShard` (``tarfile`` stops quietly at a
bad header after the first member, which would drop samples without a word).
Tar itself has no checksum over file contents; damage there surfaces when
the sample fails to decode (or as ``DamagedObject`` when the node's own
checksums catch it).

Source: POSIX.1-2017 ``pax`` "ustar Interchange Format"; webdataset 1.0.2
``tariterators.base_plus_ext`` / ``group_by_keys`` and ``writer.TarWriter``.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterable, Iterator, Mapping

from ._errors import CorruptShard

__all__ = ["iter_members", "member_spans", "parse_shard", "split_name", "write_shard", "BLOCK"]

BLOCK = 512
_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_REGULAR = (b"0", b"\0", b"7")


def split_name(name: str) -> tuple[str, str] | None:
    """``"dir/000001.seg.png"`` -> ``("dir/000001", "seg.png")`` (extension lower-cased);
    ``None`` for a name without an extension or a ``__meta__`` name (skipped)."""
    if _META.match(name):
        return None
    m = _SPLIT.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2).lower()


def _octal(field: memoryview, what: str, where: str, off: int) -> int:
    raw = bytes(field)
    if raw and raw[0] & 0x80:  # GNU base-256 for sizes of 8 GiB and more
        return int.from_bytes(raw[1:], "big")
    text = raw.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise CorruptShard(f"{where}: the {what} field of the header at byte {off} is not a number") from None


def _cstr(field: memoryview) -> str:
    return bytes(field).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_path(data: memoryview, where: str, off: int) -> str | None:
    """The ``path`` record of a pax extended header (``"<len> path=<value>\\n"`` records)."""
    raw, pos, path = bytes(data), 0, None
    while pos < len(raw) and raw[pos:pos + 1] != b"\0":
        sp = raw.find(b" ", pos)
        try:
            length = int(raw[pos:sp])
        except ValueError:
            raise CorruptShard(f"{where}: a malformed pax record at byte {off}") from None
        record = raw[sp + 1:pos + length - 1]
        if length <= 0 or pos + length > len(raw):
            raise CorruptShard(f"{where}: a malformed pax record at byte {off}")
        k, _, v = record.partition(b"=")
        if k == b"path":
            path = v.decode("utf-8", "surrogateescape")
        pos += length
    return path


def iter_members(buf: memoryview, where: str = "shard") -> Iterator[tuple[str, memoryview]]:
    """Yield ``(name, data)`` of each regular file of a tar archive held in memory.

    Args:
        buf: the whole archive (any bytes-like object; ``data`` are views into it).
        where: names the shard in error messages (``"bucket/key"``).

    Yields:
        ``(name, data)`` in archive order; ``data`` is a ``memoryview`` of
        ``size`` bytes.

    Raises:
        CorruptShard: as :func:`member_spans`.
    """
    buf = memoryview(buf).cast("B")
    for name, start, size in member_spans(buf, where):
        yield name, buf[start:start + size]


def member_spans(buf, where: str = "shard") -> Iterator[tuple[str, int, int]]:
    """Yield ``(name, offset, size)`` of each regular file of a tar archive held
    in memory: its data is ``buf[offset:offset + size]``.

    Raises:
        CorruptShard: a header checksum mismatch, a member past the end of
            ``buf``, no end marker (the archive was cut short), or non-zero
            bytes after the end marker.
    """
    buf = memoryview(buf).cast("B")
    n, off = len(buf), 0
    long_name: str | None = None
    while True:
        if off + BLOCK > n:  # tar writers always end with zero blocks: without them it was cut short
            raise CorruptShard(f"{where}: truncated: no tar header or end marker at byte {off} of {n}")
        hdr = buf[off:off + BLOCK]
        if not any(bytes(hdr)):
            if bytes(buf[off:]).strip(b"\0"):
                raise CorruptShard(f"{where}: non-zero bytes after the tar end marker at byte {off}")
            return
        stored = _octal(hdr[148:156], "checksum", where, off)
        if sum(bytes(hdr)) - sum(bytes(hdr[148:156])) + 8 * 32 != stored:
            raise CorruptShard(f"{where}: tar header checksum mismatch at byte {off}")
        size = _octal(hdr[124:136], "size", where, off)
        kind = bytes(hdr[156:157])
        name = _cstr(hdr[0:100])
        if bytes(hdr[257:262]) == b"ustar" and hdr[345] != 0:
            name = _cstr(hdr[345:500]) + "/" + name
        start = off + BLOCK
        off = start + (size + BLOCK - 1) // BLOCK * BLOCK
        if off > n:
            raise CorruptShard(f"{where}: truncated: tar member {name!r} at byte {start - BLOCK} "
                               f"runs past the end ({off} > {n} bytes)")
        if kind == b"x":
            long_name = _pax_path(buf[start:start + size], where, start) or long_name
        elif kind == b"L":
            long_name = bytes(buf[start:start + size]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind in _REGULAR:
            yield (long_name or name), start, size
            long_name = None
        elif kind != b"g":
            long_name = None  # directories, links, devices: not sample files


def parse_shard(buf, where: str = "shard") -> list[dict]:
    """The samples of a WebDataset tar shard, in archive order.

    Args:
        buf: the whole shard's bytes.
        where: names the shard in error messages and in each sample's ``__url__``.

    Returns:
        One dict per sample: ``{"__key__": str, "__url__": where, ext: bytes, ...}``.

    Raises:
        CorruptShard: the archive does not parse (see :func:`iter_members`), or
            a sample has two files with the same extension.
    """
    samples: list[dict] = []
    cur: dict | None = None
    for name, data in iter_members(buf, where):
        parts = split_name(name)
        if parts is None:
            continue
        key, ext = parts
        if cur is None or cur["__key__"] != key:
            cur = {"__key__": key, "__url__": where}
            samples.append(cur)
        if ext in cur:
            raise CorruptShard(f"{where}: sample {key!r} has two files with extension {ext!r}")
        cur[ext] = bytes(data)
    return samples


def write_shard(samples: Iterable[Mapping[str, object]], *, mtime: float = 0.0) -> bytes:
    """A WebDataset tar shard of ``samples``, readable by ``webdataset`` and by :func:`parse_shard`.

    Each sample is ``{"__key__": str, ext: bytes | str, ...}``; its files are
    written as ``key.ext`` in sorted extension order (as ``webdataset.TarWriter``
    does), ``str`` values UTF-8 encoded; other ``__...__`` entries are not written.

    Args:
        samples: the samples, in shard order.
        mtime: the files' modification time (seconds since the epoch); fixed so
            the same samples give the same bytes.

    Returns:
        The tar archive's bytes.

    Raises:
        ValueError: a sample without ``__key__``, a key with a dot in its last
            path element, or a value that is neither bytes-like nor ``str``.
    """
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for sample in samples:
            key = sample.get("__key__")
            if not isinstance(key, str) or not key or "." in key.rpartition("/")[2]:
                raise ValueError(f"a sample needs a '__key__' without a dot in its name: {key!r}")
            for ext in sorted(k for k in sample if not k.startswith("__")):
                value = sample[ext]
                if isinstance(value, str):
                    value = value.encode("utf-8")
                if not isinstance(value, (bytes, bytearray, memoryview)):
                    raise ValueError(f"{key}.{ext}: expected bytes or str, not {type(value).__name__}")
                data = memoryview(value).cast("B")
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), int(mtime), 0o444
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
