"""The checkpoint format: constants, errors, where a checkpoint lives, and the
msgpack manifest / commit structs (spec: ``docs/checkpoint-format.md``).

Errors (all :class:`~gpufeed.errors.GpufeedError`)::

    CheckpointError
    ├── CheckpointNotFound (NotFoundError)    no committed step / the step asked for
    └── CorruptCheckpoint                     bad manifest, hash or size mismatch
        └── MissingChunk (NotFoundError)      a manifest names a chunk that is gone
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

from ...errors import GpufeedError, InvalidArgument, NotFoundError

_blake3: Any
try:  # the content address; fail loudly, naming the extra, when it is missing
    import blake3 as _blake3
except ImportError:  # pragma: no cover - exercised only without the extra
    _blake3 = None

__all__ = [
    "FORMAT", "FORMAT_VERSION", "DEFAULT_CHUNK_BYTES", "DEFAULT_WORKERS", "MAX_STEP",
    "CheckpointError", "CheckpointNotFound", "CorruptCheckpoint", "MissingChunk",
    "Location", "parse_checkpoint_url", "Chunk", "Entry", "Manifest", "Commit",
    "chunk_hash", "tensor_bytes", "check_step", "dtype_name", "dtype_of", "decode",
]

FORMAT = "gpufeed-checkpoint"
FORMAT_VERSION = 1
#: Large tensors are cut into pieces of this size (the last one shorter).
DEFAULT_CHUNK_BYTES = 16 << 20  # 16 MiB
#: Parallel hash + put workers per save.
DEFAULT_WORKERS = 4


# --- errors ------------------------------------------------------------------------------
class CheckpointError(GpufeedError):
    """Base of checkpoint errors."""

    code, status = "CheckpointError", 500


class CheckpointNotFound(CheckpointError, NotFoundError):
    """No committed step under the prefix, or not the step asked for."""

    code, status = "NoSuchCheckpoint", 404


class CorruptCheckpoint(CheckpointError):
    """A manifest that does not decode, or chunk bytes whose size or hash differ
    from the manifest. The message names the object key and the tensor."""

    code, status = "CorruptCheckpoint", 500


class MissingChunk(CorruptCheckpoint, NotFoundError):
    """A committed manifest names a chunk object that does not exist."""

    code, status = "MissingChunk", 404


# --- where a checkpoint lives --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Location:
    """A checkpoint prefix: node URL, bucket and key prefix (no trailing ``/``)."""

    node_url: str
    bucket: str
    prefix: str = ""

    def key(self, rel: str) -> str:
        """``prefix/rel`` (just ``rel`` for an empty prefix)."""
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def chunk_key(self, digest: str) -> str:
        return self.key(f"chunks/{digest}")

    def step_key(self, step: int, name: str) -> str:
        return self.key(f"steps/{step:012d}/{name}")

    def __str__(self) -> str:
        return f"{self.node_url}/{self.bucket}/{self.prefix}".rstrip("/")


def parse_checkpoint_url(url: str, *, bucket: str | None = None,
                         prefix: str | None = None) -> Location:
    """Split a checkpoint URL into node URL, bucket and prefix.

    Forms:

    * ``gpufeed+tcp://HOST:PORT/BUCKET/PREFIX...`` (or ``gpufeed+cluster://``: reads
      routed to the cluster members that hold each object)
    * ``gpufeed+shm:///path/to/gpufeed.sock/BUCKET/PREFIX...``: the socket path
      ends at the first path element ending in ``.sock``.
    * a bare node URL (``gpufeed+tcp://HOST:PORT``, ``gpufeed+shm:///x/node.socket``)
      with ``bucket=`` (and optionally ``prefix=``) given as arguments.

    Args:
        url: as above.
        bucket: overrides the bucket in the URL.
        prefix: overrides the prefix in the URL.

    Returns:
        The :class:`Location`.

    Raises:
        InvalidArgument: another scheme, or no bucket anywhere.
    """
    parts = urlsplit(url)
    if parts.scheme in ("gpufeed+tcp", "gpufeed+cluster"):
        node = f"{parts.scheme}://{parts.netloc}"
        rest = parts.path
    elif parts.scheme == "gpufeed+shm":
        path = parts.netloc + parts.path if parts.netloc else parts.path
        elems = path.split("/")
        cut = next((i for i, e in enumerate(elems) if e.endswith(".sock")), None)
        if cut is None:
            node, rest = f"gpufeed+shm://{path}", ""
        else:
            node = "gpufeed+shm://" + "/".join(elems[: cut + 1])
            rest = "/".join(elems[cut + 1:])
    else:
        raise InvalidArgument(f"{url!r}: a gpufeed URL starts with gpufeed+tcp://, gpufeed+cluster:// or "
                              "gpufeed+shm://")
    rest = rest.strip("/")
    url_bucket, _, url_prefix = rest.partition("/")
    bucket = bucket if bucket is not None else url_bucket
    prefix = prefix if prefix is not None else url_prefix
    if not bucket:
        raise InvalidArgument(f"{url!r}: no bucket (gpufeed+tcp://HOST:PORT/BUCKET/PREFIX or bucket=...)")
    return Location(node, bucket, prefix.strip("/"))


#: Steps are stored as msgpack ints and in 20-digit keys: 0 <= step < 2**63.
MAX_STEP = (1 << 63) - 1


def check_step(step: object, *, none: bool = True) -> None:
    """``None`` (when allowed) or an int in ``[0, MAX_STEP]`` (not a bool), else
    ``InvalidArgument``."""
    if step is None and none:
        return
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise InvalidArgument(f"step must be an int in [0, 2**63)"
                              f"{' (or None for the next/latest)' if none else ''}, not {step!r}")


# --- format ------------------------------------------------------------------------------
class Chunk(msgspec.Struct, array_like=True, frozen=True):
    """One stored piece: ``blake3`` hex digest (64 chars) and its size in bytes."""

    hash: str
    size: int


class Entry(msgspec.Struct, frozen=True):
    """One stored item of a step.

    Attributes:
        fqn: the flat key (``"model.layers.0.weight"``).
        kind: ``"tensor"`` or ``"bytes"`` (a pickled Python object, ``torch.save`` format).
        dtype: torch dtype name without ``torch.`` (``"bfloat16"``); ``""`` for bytes.
        shape: the whole tensor's shape.
        offsets: where this piece starts in the whole tensor (all zeros unless sharded).
        lengths: this piece's shape; its bytes are C-contiguous.
        nbytes: bytes of this piece (the sum of its chunks' sizes).
        chunks: the piece's bytes in order.
    """

    fqn: str
    kind: str
    nbytes: int
    chunks: list[Chunk]
    dtype: str = ""
    shape: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []


class Manifest(msgspec.Struct):
    """``steps/<step>/manifest``: everything needed to read one step back."""

    format: str
    version: int
    step: int
    hash: str
    chunk_bytes: int
    created_unix_s: float
    world_size: int
    entries: list[Entry]
    bytes_total: int
    bytes_written: int
    nesting: dict[str, list[str | int]] = {}
    dcp_metadata: bytes = b""


class Commit(msgspec.Struct):
    """``steps/<step>/commit``: written last; names the manifest's size and hash."""

    format: str
    version: int
    step: int
    manifest_size: int
    manifest_hash: str
    committed_unix_s: float


def chunk_hash(buf) -> str:
    """BLAKE3 of ``buf`` as 64 hex characters (releases the GIL on large inputs).

    Raises:
        ImportError: the ``blake3`` package (extra ``gpufeed[ai]``) is not installed.
    """
    if _blake3 is None:  # pragma: no cover
        raise ImportError("gpufeed checkpoints need the 'blake3' package: pip install 'gpufeed[ai]'")
    return _blake3.blake3(buf).hexdigest()


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str, where: str):
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CorruptCheckpoint(f"{where}: dtype {name!r} is not a torch dtype of this build")
    return dt


def tensor_bytes(t) -> tuple[memoryview, object]:
    """A flat ``uint8`` view of a tensor's bytes (a copy only when the tensor is not
    a contiguous CPU tensor). Returns ``(view, owner)``; keep ``owner`` alive."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    if t.layout != torch.strided or t.is_quantized:
        raise CheckpointError(f"cannot store a tensor with layout {t.layout}")
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b""), t
    u8 = flat.view(torch.uint8)
    return memoryview(u8.numpy()), u8


def decode(kind: type, data, key: str):
    try:
        return msgspec.msgpack.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptCheckpoint(f"{key}: not a valid {kind.__name__}: {exc}", key=key) from exc
