"""The one table of tensor dtype codes used by gpufeed's binary formats: the KV
chunk header (``docs/kvcache-format.md``) and the LMCache plugin object header
(``docs/kvcache-lmcache.md``). A code never changes meaning; a format lists
which of them it accepts."""

from __future__ import annotations

__all__ = ["DTYPES", "code_of", "name_of"]

#: dtype name (``torch.<name>``) -> (code in a header, bytes per element).
DTYPES: dict[str, tuple[int, int]] = {
    "float32": (1, 4),
    "float16": (2, 2),
    "bfloat16": (3, 2),
    "float8_e4m3fn": (4, 1),
    "float8_e5m2": (5, 1),
    "uint8": (6, 1),
    "int8": (7, 1),
}

_NAMES = {code: name for name, (code, _) in DTYPES.items()}


def code_of(name: str) -> int:
    """The header code of dtype ``name``.

    Raises:
        KeyError: a dtype no gpufeed format stores.
    """
    return DTYPES[name][0]


def name_of(code: int) -> str | None:
    """The dtype name of header code ``code``, or ``None`` for an unknown code."""
    return _NAMES.get(code)
