"""Counting fast-path requests where their replies leave.

Every request gets exactly one reply (an answer or an error frame), sent
through one of :class:`~._frames.FrameIO`'s reply methods; :class:`MeteredReplies`
wraps those methods, so each op is counted, timed and its bytes added in one
place whatever handler ran it. A request is timed from its dispatch
(:meth:`MeteredReplies.request_begun`) to its reply. Bytes are object data:
in from a PUT (the stored size), out from GET, GETV and GETR (the bytes delivered).
"""

from __future__ import annotations

import time

from .._metrics import NodeMetrics
from ..errors import GpufeedError
from . import protocol as p
from ._frames import FrameIO

__all__ = ["MeteredReplies"]

#: op number -> its lower-case name (``get``), as the ``op`` label.
_OP_NAMES = {int(op): op.name.lower() for op in p.Op}


class MeteredReplies(FrameIO):
    """:class:`FrameIO` whose replies are counted in ``self.metrics`` (when set)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: where the counts go; ``None`` counts nothing
        self.metrics: NodeMetrics | None = None
        self._begun: dict[int, tuple[int, float]] = {}  # request id -> (op, perf_counter at dispatch)

    def request_begun(self, op: int, rid: int) -> None:
        """Request ``rid`` of ``op`` was dispatched: its clock starts."""
        if self.metrics is not None:
            self._begun[rid] = (op, time.perf_counter())

    def _replied(self, rid: int, obj, exc: GpufeedError | None) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        begun = self._begun.pop(rid, None)
        op, t0 = begun if begun is not None else (0, time.perf_counter())
        received = sent = 0
        if exc is None:
            if isinstance(obj, p.GetReply):
                sent = obj.n
            elif isinstance(obj, p.GetVReply):
                sent = sum(n for n in obj.n if n > 0)
            elif isinstance(obj, p.GetRangesReply):
                sent = sum(n for n in memoryview(obj.n).cast("q") if n > 0)
            elif op == p.Op.PUT and isinstance(obj, p.ObjectMeta):
                received = obj.size
        metrics.observe(self.transport, _OP_NAMES.get(op, "-"), exc.status if exc else 200,
                        exc.code if exc else None, time.perf_counter() - t0, received, sent)

    def reply(self, op: int, rid: int, obj) -> None:
        super().reply(op, rid, obj)
        self._replied(rid, obj, None)

    def reply_error(self, rid: int, exc: GpufeedError) -> None:
        super().reply_error(rid, exc)
        self._replied(rid, None, exc)

    def reply_with_fd(self, op: int, rid: int, obj, fd: int) -> None:
        super().reply_with_fd(op, rid, obj, fd)
        self._replied(rid, obj, None)

    def reply_with_fds(self, op: int, rid: int, obj, fds) -> None:
        super().reply_with_fds(op, rid, obj, fds)
        self._replied(rid, obj, None)

    def reply_with_files(self, op: int, rid: int, obj, extents: list[tuple[int, int, int]]) -> None:
        super().reply_with_files(op, rid, obj, extents)
        self._replied(rid, obj, None)
