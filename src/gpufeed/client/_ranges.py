"""Many ranges of one object in one request (GETR), as columns: the read of a
batch of samples packed in one shard, or of a page table's pages, without one
request struct per item on either side.

The offsets travel as one little-endian uint64 array and the lengths as one
uint32 array; the node opens and authorizes the object once and runs the
ranges in one loop (:meth:`gpufeed.engine.ObjectHandle.read_ranges`), each
checked against the stored block sums. Where the destination lies in
:meth:`~gpufeed.client.Client.alloc` memory of the shm transport, the node
``preadv``-s each range straight into it; elsewhere the bytes come as the
reply's payload, each range received into its place.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from ..errors import GpufeedError, InvalidArgument, ProtocolError, error_from_code
from ..wire import protocol as p
from ._types import check_object, then, writable_dest

if TYPE_CHECKING:
    from ._transports import Transport

__all__ = ["RangeReads"]


class RangeReads:
    """The ``get_ranges_into`` calls, mixed into :class:`~gpufeed.client.Client`."""

    _t: Transport

    if TYPE_CHECKING:
        def _check_version(self, version_id, bypass_governance: bool = False) -> None:
            """:meth:`~gpufeed.client.Client._check_version`."""

        def _check_snapshot(self, snapshot) -> None:
            """:meth:`~gpufeed.client.Client._check_snapshot`."""

    def submit_get_ranges_into(self, bucket: str, key: str, dest, offsets, lengths, *,
                               version_id: str | None = None, snapshot: str | None = None,
                               errors_out: list | None = None) -> Future:
        """Start :meth:`get_ranges_into`; the Future resolves to its array."""
        check_object(bucket, key)
        self._check_version(version_id)
        self._check_snapshot(snapshot)
        if errors_out is not None and not isinstance(errors_out, list):
            raise InvalidArgument("errors_out is a list (filled with one entry per range), "
                                  f"not {type(errors_out).__name__}")
        offs = _integers("offsets", offsets, 0, (1 << 64) - 1)
        count = len(offs)
        if count > p.MAX_RANGES:
            raise InvalidArgument(f"at most {p.MAX_RANGES} ranges per call, not {count}")
        if isinstance(lengths, (int, np.integer)) and not isinstance(lengths, (bool, np.bool_)):
            lens = _integers("lengths", [lengths], 0, p.MAX_RANGE_BYTES).tolist() * count
        else:
            lens = _integers("lengths", lengths, 0, p.MAX_RANGE_BYTES).tolist()
            if len(lens) != count:
                raise InvalidArgument(f"{count} offsets and {len(lens)} lengths: give one length per range "
                                      "(or one length for all)")
        view = writable_dest(dest, sum(lens))
        fut = self._t.submit_get_ranges_into(bucket, key, view, offs.astype("<u8", copy=False).tobytes(), lens,
                                             version_id, snapshot)
        return then(fut, lambda reply: _counts(reply, count, bucket, key, errors_out))

    def get_ranges_into(self, bucket: str, key: str, dest, offsets, lengths, *,
                        version_id: str | None = None, snapshot: str | None = None,
                        errors_out: list | None = None) -> np.ndarray:
        """Read many ranges of one object into one buffer, in one round trip:
        range ``i`` is ``lengths[i]`` bytes at object offset ``offsets[i]``,
        and lands at ``dest[lengths[0] + ... + lengths[i-1]:]`` (packed in
        order, each in a slot of its full length). Every range is checked
        against the stored block sums before it counts as read.

        Fastest with ``dest`` from :meth:`alloc` on ``gpufeed+shm://`` (the node
        reads straight into it); any writable buffer works.

        Args:
            dest: a writable contiguous buffer of at least ``sum(lengths)`` bytes.
            offsets: object offsets in bytes (a sequence or array of ints >= 0),
                at most :data:`~gpufeed.wire.protocol.MAX_RANGES`.
            lengths: bytes per range (0 to
                :data:`~gpufeed.wire.protocol.MAX_RANGE_BYTES`): one int for every
                range, or one per range.
            version_id, snapshot: read that version, or the one a bucket snapshot
                recorded (as for :meth:`get_into`).
            errors_out: with a list here, a range that fails does not fail the
                call: the list holds one entry per range, ``None`` or the typed
                error, and that range's count is -1.

        Returns:
            ``numpy.int64`` array, bytes delivered per range (fewer than asked only
            where the range runs past the object's end; -1 for a failed range
            with ``errors_out``).

        Raises:
            InvalidArgument: malformed offsets, lengths or destination (checked
                before anything is sent).
            NoSuchBucket, NoSuchKey, AccessDenied: for the object as a whole.
            InvalidRange, DamagedObject: the first failed range's error (its index
                in the message), unless ``errors_out`` is given.
            NotImplementedByGpufeed: a node without GETR.
        """
        return self.submit_get_ranges_into(bucket, key, dest, offsets, lengths, version_id=version_id,
                                           snapshot=snapshot, errors_out=errors_out).result()


def _integers(name: str, values, low: int, high: int) -> np.ndarray:
    """``values`` (a sequence or 1-D array of integers) as a ``uint64`` array.

    Raises:
        InvalidArgument: not integers (floats, bools, strings, ``None``), not
            one-dimensional, or a value outside ``[low, high]`` (the message
            names the first one and its index).
    """
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"{name} must be a sequence or array of integers") from None
    if arr.dtype.kind in "fO" and arr.ndim == 1 and arr.size and not isinstance(values, np.ndarray):
        arr = _python_ints(name, arr, values, low, high)
    if arr.ndim != 1 or not (arr.dtype.kind in "iu" or (arr.size == 0 and arr.dtype.kind == "f")):
        raise InvalidArgument(f"{name} must be a one-dimensional sequence or array of integers, "
                              f"not {arr.ndim}-D {arr.dtype}")
    if arr.size and (int(arr.min()) < low or int(arr.max()) > high):
        bad = int(np.flatnonzero((arr < low) | (arr > high))[0])
        raise InvalidArgument(f"{name}[{bad}] = {int(arr[bad])} is outside {low}-{high}")
    return arr.astype(np.uint64)


def _python_ints(name: str, arr: np.ndarray, values, low: int, high: int) -> np.ndarray:
    """A sequence of Python ints that NumPy made floats or objects (values past
    ``int64`` with others, or past ``uint64``) as a ``uint64`` array when all lie in
    ``[low, high]``; ``arr`` (NumPy's answer) when they are not all ints.

    Raises:
        InvalidArgument: an int outside ``[low, high]`` (named with its index).
    """
    items = list(values)
    if not all(type(v) is int for v in items):
        return arr
    bad = next((i for i, v in enumerate(items) if not low <= v <= high), None)
    if bad is not None:
        raise InvalidArgument(f"{name}[{bad}] = {items[bad]} is outside {low}-{high}")
    return np.array(items, dtype=np.uint64)


def _counts(reply: p.GetRangesReply, count: int, bucket: str, key: str,
            errors_out: list | None) -> np.ndarray:
    """Bytes per range from a GETR reply (see :meth:`RangeReads.get_ranges_into`).

    Raises:
        GpufeedError: the first failed range's typed error, unless ``errors_out``.
    """
    n = np.frombuffer(reply.n, dtype="<i8").astype(np.int64)
    if len(n) != count:
        raise ProtocolError(f"the node answered {len(n)} counts for {count} ranges")

    def err(i: int, code: str, msg: str) -> GpufeedError:
        if msg.startswith("as range "):  # the node sent this message once, with an earlier range
            same = reply.errors.get(int(msg[9:])) if msg[9:].isdigit() else None
            msg = same[1] if same is not None and same[0] == code else msg
        where = f"range {i}" if f"{bucket}/{key}" in msg else f"range {i} of {bucket}/{key}"
        return error_from_code(code, f"{where}: {msg}")

    if errors_out is not None:
        errors_out[:] = [None] * count
        for i, (code, msg) in reply.errors.items():
            errors_out[i] = err(i, code, msg)
    elif reply.errors:
        i, (code, msg) = min(reply.errors.items())
        raise err(i, code, msg)
    return n
