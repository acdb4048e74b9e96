"""Samples that are raw tensors of one dtype: a batch read straight into its
final tensor, and the collate that hands that tensor on without a copy.

With ``ObjectDataset(..., dtype=...)`` a sample is the object's bytes viewed
as a tensor of that dtype (native byte order; ``shape`` gives each sample's
shape, default 1-D). When every object of a batch has the same size, the
batch is one ``[batch, *shape]`` tensor and every object is read into its row
with one batched ``get_many_into``:

* in a DataLoader worker, a batch of at least :data:`DIRECT_MIN_BYTES` lives
  in :meth:`~gpufeed.client.Client.alloc_shared` memory, wrapped as a torch
  storage by its memfd: on shm the node writes each sample into its row
  (no copy in this process), and the DataLoader passes the storage's
  descriptor to the main process (no copy there either). A smaller batch is
  read into pooled :meth:`~gpufeed.client.Client.alloc` memory and copied once
  into torch shared memory (registering fresh memory with the node costs more
  than copying a small batch);
* in the main process (``num_workers=0``), the batch tensor is a view of
  pooled ``alloc()`` memory (no copy).

Each object is read with one byte more than its listed size (a read that
fills that byte means the object grew since it was listed). The rows lie back
to back, so that byte lands on the next row's first byte: it is written only
for an object that grew, and then the whole batch is read again the ordinary
way (one object per buffer), where the error policy applies per sample. So
does any batch with a failed read, and a batch whose objects differ in size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np
import torch
import torch.utils.data

from ...client import ReadRequest
from ...errors import GpufeedError, InvalidArgument
from ._fetch import Reader
from ._source import Listed

__all__ = ["TensorBatch", "SampleList", "BatchMemory", "collate", "read_tensor_batch", "as_sample", "DIRECT_MIN_BYTES",
           "check_dtype", "sample_shape"]

#: A batch read in a DataLoader worker of at least this many bytes goes straight
#: into memory shared with the main process; a smaller one is copied once.
DIRECT_MIN_BYTES = 1 << 20  # 1 MiB


class TensorBatch(list):
    """The samples of one batch (row tensors), with the ``[batch, *shape]``
    tensor they are rows of as :attr:`tensor`; :func:`collate` returns that
    tensor as is.

    Attributes:
        tensor: the batch tensor (the rows are views of it).
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__(tensor.unbind(0))
        self.tensor = tensor


class SampleList(list):
    """The samples of one batch read one object each, with the objects they
    came from (named in :func:`collate`'s error when their shapes differ).

    Attributes:
        names: ``"bucket/key"`` of each sample, in order.
    """

    def __init__(self, samples: list, names: list[str]) -> None:
        super().__init__(samples)
        self.names = names


#: Samples named in a ragged batch's error, at most.
_NAMED = 8


def collate(batch):
    """DataLoader ``collate_fn`` for datasets made with ``dtype=``: the batch
    tensor of a :class:`TensorBatch` as is (no copy), anything else through
    ``torch.utils.data.default_collate`` (which stacks, copying).

    Args:
        batch: what the dataset's ``__getitems__`` returned (or a list of samples).

    Returns:
        A ``[batch, *shape]`` tensor (or ``default_collate``'s result).

    Raises:
        InvalidArgument: the batch's sample tensors differ in shape (objects of
            different sizes read without ``shape=``); the message names the
            objects and their sizes.
    """
    if isinstance(batch, TensorBatch) and len(batch) == batch.tensor.shape[0]:
        return batch.tensor
    if isinstance(batch, list) and len(batch) > 1 and all(isinstance(t, torch.Tensor) for t in batch):
        if any(t.shape != batch[0].shape for t in batch):
            raise InvalidArgument(_ragged(batch))
    return torch.utils.data.default_collate(batch)


def _ragged(batch: list) -> str:
    names = getattr(batch, "names", None) or [f"sample {i}" for i in range(len(batch))]
    sizes = [f"{name} ({t.nbytes} bytes)" for name, t in zip(names, batch)]
    more = f" and {len(sizes) - _NAMED} more" if len(sizes) > _NAMED else ""
    return (f"the samples of a batch differ in size, so they make no batch tensor: {', '.join(sizes[:_NAMED])}"
            f"{more}; pass shape= to the dataset (a sample that does not fit it fails to decode) "
            f"or give the DataLoader a collate_fn that pads")


def check_dtype(dtype, shape) -> tuple[int, ...] | None:
    """Validate the dataset's ``dtype`` / ``shape`` arguments; returns ``shape`` as a tuple.

    Raises:
        InvalidArgument: not a ``torch.dtype``, or a shape with a size < 1.
    """
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgument(f"dtype must be a torch.dtype: {dtype!r}")
    if shape is None:
        return None
    shape = tuple(shape)
    if not shape or any(type(d) is not int or d < 1 for d in shape):
        raise InvalidArgument(f"shape must be a non-empty sequence of ints >= 1: {shape!r}")
    return shape


def sample_shape(nbytes: int, dtype: torch.dtype, shape: tuple[int, ...] | None) -> tuple[int, ...]:
    """The shape of one ``nbytes`` sample. Raises ValueError when it does not fit."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if nbytes % itemsize:
        raise ValueError(f"{nbytes} bytes is not a whole number of {dtype} elements")
    if shape is not None and math.prod(shape) * itemsize != nbytes:
        raise ValueError(f"{nbytes} bytes do not make a {dtype} tensor of shape {list(shape)}")
    return shape if shape is not None else (nbytes // itemsize,)


def as_sample(data: memoryview, dtype: torch.dtype, shape: tuple[int, ...] | None) -> torch.Tensor:
    """One object's bytes as a tensor (a view of ``data``, no copy).

    Raises:
        ValueError: the size is not a whole number of elements, or does not fit ``shape``.
    """
    dims = sample_shape(len(data), dtype, shape)
    if not len(data):
        return torch.empty(dims, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).view(dims)


def read_tensor_batch(reader: Reader, items: Sequence[Listed], dtype: torch.dtype,
                      shape: tuple[int, ...] | None) -> TensorBatch | None:
    """Read ``items`` into one batch tensor (see the module docstring).

    Returns:
        The batch, or ``None`` when it must be read the ordinary way: objects of
        different sizes (or sizes that are not samples of ``dtype``/``shape``),
        or any read that failed or found an object changed.
    """
    size = items[0].size if items else 0
    if not size or any(it.size != size for it in items):
        return None
    try:
        dims = sample_shape(size, dtype, shape)
    except ValueError:
        return None
    n, total = len(items), len(items) * size
    try:
        client = reader.source.client()
        mem = BatchMemory(client, total)
        ok = _read_rows(client, reader, items, mem.view, size)
    except (GpufeedError, OSError):
        return None  # the ordinary read meets the same trouble and applies the policy
    if not ok:
        mem.close()
        return None
    return TensorBatch(mem.tensor().view(dtype).view(n, *dims))


class BatchMemory:
    """Memory for one batch tensor of ``total`` bytes, plus one spare byte
    (where a read that finds its object grown puts its extra byte): in a
    DataLoader worker, :meth:`~gpufeed.client.Client.alloc_shared` memory from
    :data:`DIRECT_MIN_BYTES` (see the module docstring), else pooled
    :meth:`~gpufeed.client.Client.alloc` memory.

    Args:
        client: this process's client.
        total: the batch tensor's bytes.

    Attributes:
        view: the writable memory to read into (``total + 1`` bytes).

    Raises:
        InvalidArgument, TransportError: as ``alloc`` / ``alloc_shared``.
    """

    def __init__(self, client, total: int) -> None:
        self.total = total
        self.in_worker = torch.utils.data.get_worker_info() is not None
        direct = self.in_worker and total >= DIRECT_MIN_BYTES and hasattr(torch.UntypedStorage, "_new_shared_fd_cpu")
        self.shared = client.alloc_shared(total + 1) if direct else None
        self.view: memoryview = self.shared.view if self.shared is not None else client.alloc(total + 1)

    def tensor(self) -> torch.Tensor:
        """The ``total`` bytes as a flat ``uint8`` tensor (call once every read into
        :attr:`view` is done; no view of it may be kept): shared with the main
        process in a worker."""
        mem, self.view = self.view, memoryview(b"")
        if self.shared is not None:
            del mem
            # torch's own constructor of a storage over a shared memory descriptor (what a
            # DataLoader's main process uses to map a worker's batch); it dups the memfd
            storage = torch.UntypedStorage._new_shared_fd_cpu(self.shared.fd, self.total + 1)  # type: ignore[attr-defined]
            self.shared.close()
            return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (self.total,), (1,))
        if self.in_worker:
            flat = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(self.total), 0,
                                                           (self.total,), (1,))
            flat.numpy()[:] = np.frombuffer(mem, np.uint8, count=self.total)
            return flat
        return torch.frombuffer(mem, dtype=torch.uint8, count=self.total)

    def close(self) -> None:
        """Give the memory up without making a tensor (after a failed read)."""
        self.view = memoryview(b"")
        if self.shared is not None:
            self.shared.close()


def _read_rows(client, reader: Reader, items: Sequence[Listed], mem: memoryview, size: int) -> bool:
    """Read item ``i`` into ``mem[i * size:]`` (``size + 1`` bytes asked), in
    groups of ``batch_items``, all in flight together. True when every item
    delivered exactly ``size`` bytes.

    Raises:
        GpufeedError, OSError: a group could not be sent or failed as a whole
            (raised only once every group sent has finished).
    """
    step = reader.limits.batch_items
    bucket = reader.source.bucket
    parts: list[tuple[Future, list]] = []
    failure: BaseException | None = None
    try:
        for first in range(0, len(items), step):
            errors: list = []
            reqs = [ReadRequest(bucket, it.key, mem[i * size:(i + 1) * size + 1])
                    for i, it in enumerate(items[first:first + step], first)]
            parts.append((client.submit_get_many_into(reqs, errors_out=errors), errors))
    except (GpufeedError, OSError) as exc:
        failure = exc
    ok = True
    for fut, errors in parts:  # every part is waited for: none may still write when this returns
        try:
            got = fut.result()
        except (GpufeedError, OSError) as exc:
            failure = failure or exc
            continue
        ok = ok and all(e is None for e in errors) and all(c == size for c in got)
    if failure is not None:
        raise failure
    return ok
