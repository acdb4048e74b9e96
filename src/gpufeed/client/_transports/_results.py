"""Turning a batch-read reply into per-item results (shared by the transports)."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import GpufeedError, error_from_code
from ...wire import protocol as p
from .._types import ReadRequest

__all__ = ["batch_result"]


def batch_result(reqs: Sequence[ReadRequest], reply: p.GetVReply,
                 errors_out: list | None = None) -> list[int]:
    """Bytes per item (-1 for a failed one).

    Raises:
        GpufeedError: the typed error of the first failed item, unless
            ``errors_out`` is given (then filled, one entry per item).
    """
    def err(i: int, code: str, msg: str) -> GpufeedError:
        return error_from_code(code, f"request {i} ({reqs[i].bucket}/{reqs[i].key}): {msg}")

    if errors_out is not None:
        errors_out[:] = [None] * len(reqs)
        for i, (code, msg) in reply.errors.items():
            errors_out[i] = err(i, code, msg)
    elif reply.errors:
        i, (code, msg) = min(reply.errors.items())
        raise err(i, code, msg)
    return list(reply.n)
