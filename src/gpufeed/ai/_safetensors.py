"""The safetensors file format: parse and strictly validate a header.

Format (source: the safetensors README, "Format", and the reference Rust
implementation ``safetensors/src/tensor.rs`` of safetensors 0.8)::

    [ 8 bytes: N, u64 little-endian ]
    [ N bytes: UTF-8 JSON object, MAY be padded at the end with spaces (0x20) ]
    [ data section: the rest of the file ]

The JSON maps each tensor name to ``{"dtype": str, "shape": [int, ...],
"data_offsets": [begin, end]}``; the optional ``"__metadata__"`` maps str to
str. Offsets are ``[begin, end)`` relative to the start of the data section.
A valid file MUST satisfy, and :func:`parse_header` checks, that:

* ``N`` is at most 100,000,000 and ``8 + N`` is at most the file size;
* the header is UTF-8 JSON, an object, starting with ``{``, with no duplicate names;
* each dtype is known, each shape a list of non-negative integers, and
  ``end - begin`` equals the element count times the element size;
* sorted by offset, the tensors tile the data section exactly: the first
  begins at 0, each begins where the previous ended (no holes, no overlaps),
  and the last ends at the end of the file.

Nothing here reads bytes from storage; :mod:`gpufeed.ai._models` does the I/O.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..errors import InvalidRequestError

__all__ = [
    "SafetensorsError",
    "TensorInfo",
    "SafetensorsHeader",
    "parse_header",
    "header_length",
    "DTYPES",
    "HEADER_PREFIX_BYTES",
    "MAX_HEADER_BYTES",
]

#: Bytes of the length prefix.
HEADER_PREFIX_BYTES = 8
#: Largest header the reference implementation accepts (``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000  # 100 MB


def _torch_dtype(name: str) -> torch.dtype | None:
    return getattr(torch, name, None)


#: safetensors dtype name -> torch dtype, or None where this torch build lacks it
#: (F8 types on old builds). Sub-byte types (F4, F6_*) are not supported.
DTYPES: dict[str, torch.dtype | None] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": _torch_dtype("uint16"),
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": _torch_dtype("uint32"),
    "F32": torch.float32,
    "C64": torch.complex64,
    "F64": torch.float64,
    "I64": torch.int64,
    "U64": _torch_dtype("uint64"),
    "F8_E4M3": _torch_dtype("float8_e4m3fn"),
    "F8_E4M3FNUZ": _torch_dtype("float8_e4m3fnuz"),
    "F8_E5M2": _torch_dtype("float8_e5m2"),
    "F8_E5M2FNUZ": _torch_dtype("float8_e5m2fnuz"),
    "F8_E8M0": _torch_dtype("float8_e8m0fnu"),
}

#: Element sizes in bytes, known even where torch lacks the dtype.
_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4,
    "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8, "F8_E4M3": 1, "F8_E4M3FNUZ": 1,
    "F8_E5M2": 1, "F8_E5M2FNUZ": 1, "F8_E8M0": 1,
}


class SafetensorsError(InvalidRequestError):
    """A safetensors object is malformed, or uses a dtype this torch build lacks.

    The message names the object (``bucket/key``) and, where one is to blame,
    the tensor.

    Attributes:
        object_name: ``bucket/key`` of the object (or a file name).
        tensor: the tensor's name, or ``None`` for a header-level problem.
    """

    code, status = "InvalidSafetensors", 400

    def __init__(self, object_name: str, message: str, *, tensor: str | None = None) -> None:
        where = f"{object_name}: tensor {tensor!r}: " if tensor is not None else f"{object_name}: "
        super().__init__(where + message, object=object_name, tensor=tensor)
        self.object_name = object_name
        self.tensor = tensor


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's entry in a header.

    Attributes:
        name: the tensor's name.
        dtype: the safetensors dtype name (``"BF16"``).
        shape: sizes per dimension; ``()`` for a 0-d scalar.
        begin: first byte, relative to the data section.
        end: one past the last byte (``end - begin`` = numel x item size).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = DTYPES[self.dtype]
        assert dtype is not None, f"{self.dtype}: parse_header refuses dtypes this torch lacks"
        return dtype


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A parsed, validated header.

    Attributes:
        object_name: ``bucket/key`` it came from (used in error messages).
        header_bytes: ``N``, the JSON length (padding included).
        data_start: offset of the data section in the object (``8 + N``).
        data_bytes: length of the data section.
        tensors: entries sorted by ``begin`` (file order).
        metadata: the ``__metadata__`` map (empty if absent).
    """

    object_name: str
    header_bytes: int
    data_start: int
    data_bytes: int
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def object_size(self) -> int:
        return self.data_start + self.data_bytes


def header_length(object_name: str, prefix: bytes | memoryview, object_size: int) -> int:
    """Decode and check the 8-byte length prefix.

    Args:
        object_name: ``bucket/key`` for error messages.
        prefix: at least the first 8 bytes of the object.
        object_size: the object's size in bytes.

    Returns:
        ``N``, the JSON header length in bytes.

    Raises:
        SafetensorsError: the object is shorter than 8 bytes, ``N`` exceeds
            :data:`MAX_HEADER_BYTES`, or ``8 + N`` exceeds the object.
    """
    if object_size < HEADER_PREFIX_BYTES or len(prefix) < HEADER_PREFIX_BYTES:
        raise SafetensorsError(object_name, f"truncated: {object_size} bytes, shorter than the "
                                            f"{HEADER_PREFIX_BYTES}-byte header length")
    (n,) = struct.unpack_from("<Q", prefix, 0)
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(object_name, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if HEADER_PREFIX_BYTES + n > object_size:
        raise SafetensorsError(object_name, f"header length {n} runs past the end of the object "
                                            f"({object_size} bytes)")
    return n


def _no_duplicates(object_name: str):
    def hook(pairs: list[tuple[str, object]]) -> dict:
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise SafetensorsError(object_name, "duplicate name in the header", tensor=key)
            out[key] = value
        return out

    return hook


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_header(object_name: str, head: bytes | memoryview, object_size: int) -> SafetensorsHeader:
    """Parse and strictly validate a safetensors header.

    Args:
        object_name: ``bucket/key`` (or a path) for error messages.
        head: the object's first ``8 + N`` bytes or more.
        object_size: the object's size in bytes.

    Returns:
        The validated header; its tensors sorted by offset.

    Raises:
        SafetensorsError: any violation of the format (see the module
            docstring), an unknown dtype, or a dtype this torch build lacks;
            the message names the object and, if any, the tensor.
    """
    n = header_length(object_name, head, object_size)
    doc = _header_json(object_name, head, n)
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError(object_name, "__metadata__ must map strings to strings")

    data_start = HEADER_PREFIX_BYTES + n
    data_bytes = object_size - data_start
    tensors = [_tensor_info(object_name, name, entry, data_bytes) for name, entry in doc.items()]
    tensors.sort(key=lambda t: (t.begin, t.end))
    _check_coverage(object_name, tensors, data_bytes)
    return SafetensorsHeader(object_name, n, data_start, data_bytes, tuple(tensors), metadata)


def _header_json(object_name: str, head: bytes | memoryview, n: int) -> dict:
    """The ``n``-byte JSON header after the length prefix, as a dict (duplicate keys refused)."""
    if len(head) < HEADER_PREFIX_BYTES + n:
        raise SafetensorsError(object_name, f"got {len(head)} bytes, need the {8 + n}-byte header")
    raw = bytes(head[HEADER_PREFIX_BYTES:HEADER_PREFIX_BYTES + n])
    if not raw.startswith(b"{"):
        raise SafetensorsError(object_name, "the header does not start with '{'")
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates(object_name))
    except UnicodeDecodeError as exc:
        raise SafetensorsError(object_name, f"the header is not UTF-8: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise SafetensorsError(object_name, f"the header is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise SafetensorsError(object_name, "the header is not a JSON object")
    return doc


def _tensor_info(object_name: str, name: str, entry: object, data_bytes: int) -> TensorInfo:
    """One tensor's header entry, validated against a data section of ``data_bytes``."""
    if not isinstance(entry, dict):
        raise SafetensorsError(object_name, "entry is not an object", tensor=name)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _ITEMSIZE:
        raise SafetensorsError(object_name, f"unknown or unsupported dtype {dtype!r}", tensor=name)
    if DTYPES[dtype] is None:
        raise SafetensorsError(object_name, f"dtype {dtype} needs a newer torch than "
                                            f"{torch.__version__}", tensor=name)
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise SafetensorsError(object_name, f"shape {shape!r} is not a list of non-negative "
                                            f"integers", tensor=name)
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets)):
        raise SafetensorsError(object_name, f"data_offsets {offsets!r} is not [begin, end]",
                               tensor=name)
    begin, end = offsets
    if end < begin:
        raise SafetensorsError(object_name, f"data_offsets [{begin}, {end}) end before they "
                                            f"begin", tensor=name)
    if end > data_bytes:
        raise SafetensorsError(object_name, f"data_offsets [{begin}, {end}) run past the data "
                                            f"section ({data_bytes} bytes)", tensor=name)
    want = math.prod(shape) * _ITEMSIZE[dtype]
    if end - begin != want:
        raise SafetensorsError(object_name, f"data_offsets [{begin}, {end}) hold {end - begin} "
                                            f"bytes; {dtype} {shape} needs {want}", tensor=name)
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _check_coverage(object_name: str, tensors: Sequence[TensorInfo], data_bytes: int) -> None:
    """Refuse holes, overlaps and trailing bytes: ``tensors`` (sorted by offset) must
    cover the data section exactly."""
    pos = 0
    prev: TensorInfo | None = None
    for t in tensors:
        if t.begin > pos:
            raise SafetensorsError(object_name, f"hole: bytes [{pos}, {t.begin}) of the data "
                                                f"section belong to no tensor", tensor=t.name)
        if t.begin < pos:
            assert prev is not None  # t.begin >= 0: only a tensor before this one moves pos
            raise SafetensorsError(object_name, f"data_offsets [{t.begin}, {t.end}) overlap "
                                                f"tensor {prev.name!r} [{prev.begin}, {prev.end})",
                                   tensor=t.name)
        pos, prev = t.end, t
    if pos != data_bytes:
        raise SafetensorsError(object_name, f"the tensors cover {pos} bytes but the data section "
                                            f"has {data_bytes} (trailing bytes)")
