"""The safetensors header parser on its own: golden files from safetensors
itself, then a folder's worth of hostile headers (no node needed)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save

import gpufeed.ai
from gpufeed.ai import SafetensorsError, parse_header
from gpufeed.errors import InvalidRequestError


def raw(header: dict | bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file from a header (dict or raw JSON bytes) and data."""
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(js) if length is None else length) + js + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_public_names_are_complete():
    for name in gpufeed.ai.__all__:
        assert getattr(gpufeed.ai, name) is not None
    assert {"load_safetensors", "load_safetensors_url", "SafetensorsError"} <= set(gpufeed.ai.__all__)


def test_error_is_a_typed_invalid_request():
    assert issubclass(SafetensorsError, InvalidRequestError)
    assert issubclass(SafetensorsError, ValueError)


def test_golden_file_from_safetensors():
    blob = save({"w": torch.zeros(2, 3), "b": torch.ones(3, dtype=torch.bfloat16),
                 "s": torch.tensor(7), "e": torch.empty(0, 4)}, metadata={"format": "pt"})
    h = parse_header("b/k", blob, len(blob))
    assert {t.name for t in h.tensors} == {"w", "b", "s", "e"}
    assert h.metadata == {"format": "pt"}
    assert h.data_start == 8 + struct.unpack_from("<Q", blob)[0]
    assert h.data_bytes == len(blob) - h.data_start == 24 + 6 + 8
    by = {t.name: t for t in h.tensors}
    assert by["s"].shape == () and by["s"].torch_dtype == torch.int64
    assert by["e"].nbytes == 0
    assert [t.begin for t in h.tensors] == sorted(t.begin for t in h.tensors)


def test_header_padded_with_spaces_is_valid():
    js = json.dumps({"a": entry("U8", [2], 0, 2)}).encode() + b"   "
    blob = raw(js, b"xy")
    assert parse_header("b/k", blob, len(blob)).tensors[0].name == "a"


def test_fp8_dtype_maps_when_torch_has_it():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    blob = raw({"f": entry("F8_E4M3", [4], 0, 4)}, b"\0" * 4)
    assert parse_header("b/k", blob, len(blob)).tensors[0].torch_dtype == torch.float8_e4m3fn


HOSTILE = {
    # name: (file bytes, text the error must contain, tensor the error must name)
    "shorter than the length prefix": (b"\x05\0\0", "truncated", None),
    "length past the end": (struct.pack("<Q", 1000) + b"{}", "runs past the end", None),
    "length over the limit": (struct.pack("<Q", 100_000_001) + b"{}", "limit", None),
    "not json": (raw(b"{nope"), "not valid JSON", None),
    "not an object": (raw(b"[1, 2]"), "does not start with", None),
    "not utf-8": (raw(b'{"\xff": 1}'), "not UTF-8", None),
    "metadata not str->str": (raw({"__metadata__": {"a": 1}}), "__metadata__", None),
    "unknown dtype": (raw({"w": entry("F7", [1], 0, 1)}, b"\0"), "unknown", "w"),
    "sub-byte dtype": (raw({"w": entry("F4", [2], 0, 1)}, b"\0"), "unsupported", "w"),
    "negative dim": (raw({"w": entry("U8", [-1], 0, 0)}), "shape", "w"),
    "bool dim": (raw({"w": entry("U8", [True], 0, 1)}, b"\0"), "shape", "w"),
    "offsets not a pair": (raw({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, b"\0"),
                           "data_offsets", "w"),
    "end before begin": (raw({"w": entry("U8", [0], 4, 2)}, b"\0" * 4), "end before", "w"),
    "offsets beyond the object": (raw({"w": entry("F32", [4], 0, 16)}, b"\0" * 8),
                                  "past the data section", "w"),
    "size disagrees with shape": (raw({"w": entry("F32", [3], 0, 8)}, b"\0" * 8), "needs 12", "w"),
    "overlap": (raw({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, b"\0" * 12),
                "overlap", "b"),
    "hole": (raw({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, b"\0" * 12),
             "hole", "b"),
    "hole at the start": (raw({"a": entry("F32", [1], 4, 8)}, b"\0" * 8), "hole", "a"),
    "trailing bytes": (raw({"a": entry("F32", [1], 0, 4)}, b"\0" * 6), "trailing", None),
    "duplicate name": (raw(b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                           b'"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"\0"),
                       "duplicate", "a"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_raise_typed_errors(case):
    blob, text, tensor = HOSTILE[case]
    with pytest.raises(SafetensorsError) as info:
        parse_header("bkt/evil.safetensors", blob, len(blob))
    err = info.value
    assert "bkt/evil.safetensors" in str(err)
    assert text in str(err)
    assert err.object_name == "bkt/evil.safetensors"
    assert err.tensor == tensor
    if tensor is not None:
        assert repr(tensor) in str(err)
