"""Device helpers for :func:`gpufeed.ai.load_safetensors`: checking the target
device, and copying host staging slots into device memory (pinned host memory
and asynchronous copies on CUDA, blocking ``Tensor.copy_`` elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InvalidArgument

__all__ = ["gds_status", "CUDA_HOST_REGISTER_PORTABLE"]

#: ``cudaHostRegisterPortable``: pinned for every CUDA context.
CUDA_HOST_REGISTER_PORTABLE = 1


def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgument(f"device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"device {device!r}: CUDA is not available in this torch build")
    if dev.type == "meta":
        raise InvalidArgument("device 'meta' holds no data: load to a real device")
    return dev


class _SyncCopier:
    """Copies staging slices into the destination with ``Tensor.copy_``, blocking.

    The fallback of :class:`_CudaCopier` (CPU, or any device without streams);
    the staged pipeline runs the same way with either, which is how the CUDA
    path's bookkeeping (packing, merging, slot reuse) is tested without a GPU.
    """

    def __init__(self, device: torch.device, slots: Sequence[torch.Tensor]) -> None:
        self.device = device

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        dst.copy_(src)

    def record(self, slot: int) -> None:
        pass

    def wait(self, slot: int) -> None:
        pass

    def close(self) -> None:
        pass


class _CudaCopier:
    """Asynchronous host -> GPU copies on a side stream, one event per staging slot.

    The slots (``Client.alloc`` memory, so on shm the server writes them
    directly) are page-locked with ``cudaHostRegister`` for the load, so
    ``copy_(non_blocking=True)`` is a real DMA that overlaps the next read.
    If registering fails, copies still work (the driver stages pageable
    memory itself), only without the overlap.
    """

    def __init__(self, device: torch.device, slots: Sequence[torch.Tensor]) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.stream.wait_stream(torch.cuda.current_stream(device))  # dest was allocated there
        self.events: list[torch.cuda.Event | None] = [None] * len(slots)
        self.pinned: list[int] = []
        cudart = torch.cuda.cudart()
        for s in slots:
            if int(cudart.cudaHostRegister(s.data_ptr(), s.numel(), CUDA_HOST_REGISTER_PORTABLE)) == 0:
                self.pinned.append(s.data_ptr())

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def record(self, slot: int) -> None:
        event = torch.cuda.Event()
        event.record(self.stream)
        self.events[slot] = event

    def wait(self, slot: int) -> None:
        event = self.events[slot]
        if event is not None:
            event.synchronize()

    def close(self) -> None:
        self.stream.synchronize()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        cudart = torch.cuda.cudart()
        for ptr in self.pinned:
            cudart.cudaHostUnregister(ptr)
        self.pinned.clear()


def _copier_for(device: torch.device, slots: Sequence[torch.Tensor]):
    if device.type == "cuda" and torch.cuda.is_available():
        return _CudaCopier(device, slots)
    return _SyncCopier(device, slots)


def gds_status() -> str:
    """Why GPUDirect Storage (kvikio) is or is not used for a load; for reports.

    Returns ``"unavailable: <reason>"``; GDS reads need the object's file on
    the node, which the fast-path protocol does not expose yet, so every CUDA
    load goes through pinned host staging (see :func:`load_safetensors`).
    """
    try:
        import kvikio  # noqa: F401
    except ImportError:
        return "unavailable: kvikio is not installed"
    if not torch.cuda.is_available():
        return "unavailable: no CUDA device"
    return "unavailable: the node does not expose object files to clients (fast path only)"
