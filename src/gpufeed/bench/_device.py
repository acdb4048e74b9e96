"""What device a check runs on, and small helpers for timing and checking data there.

:func:`resolve_device` picks ``cuda:N`` or says why there is none (a CPU build of
torch, no driver, no GPU), so a check can exit cleanly on a machine without
CUDA; the rest work on any device: on CPU, syncing and pinning do nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["resolve_device", "cuda_missing", "device_info", "sync", "pinned", "bits_equal",
           "same_tensors"]

#: ``cudaHostRegisterPortable``: pinned for every CUDA context.
_REGISTER_PORTABLE = 1


def resolve_device(device: str | None, allow_cpu: bool = False) -> tuple[str | None, str]:
    """Pick the device to check, or say why there is none.

    Args:
        device: ``"cuda"``, ``"cuda:N"``, ``"cpu"`` or None (``cuda:0``).
        allow_cpu: without a usable CUDA device, fall back to ``"cpu"``.

    Returns:
        ``(device, why)``: ``device`` is None when a CUDA device was wanted and
        there is none (``why`` says why, e.g. a CPU build of torch); otherwise
        ``why`` is ``""`` or says that the CPU fallback was chosen.

    Raises:
        ValueError: ``device`` is neither ``cpu`` nor ``cuda[:N]``, or names a
            GPU this machine does not have.
    """
    wanted = device or "cuda:0"
    kind = wanted.split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], not {wanted!r}")
    if kind == "cpu":
        return "cpu", ""
    why = cuda_missing()
    if why:
        return ("cpu", f"no CUDA device: {why}; running the CPU fallback") if allow_cpu else (None, why)
    import torch

    index = int(wanted.split(":", 1)[1]) if ":" in wanted else 0
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"--device {wanted}: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s)")
    return f"cuda:{index}", ""


def cuda_missing() -> str:
    """Why CUDA cannot be used here ("" when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'gpufeed[ai]' with a CUDA build of torch)"
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU-only build (install a CUDA build of torch, "
                f"e.g. from https://download.pytorch.org/whl/)")
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU "
                f"(no device, no driver, or CUDA_VISIBLE_DEVICES hides them)")
    return ""


def device_info(dev) -> dict:
    """The device and the software driving it, for a report.

    Args:
        dev: a ``torch.device``.

    Returns:
        ``device``, ``name``, ``torch``, ``cuda`` (None for a CPU build); on
        CUDA also ``memory_gib``, ``capability``, ``cudnn``, ``driver``
        (from ``nvidia-smi``; None without it).
    """
    import torch

    info: dict[str, Any] = {"device": str(dev), "torch": torch.__version__, "cuda": torch.version.cuda}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(name=props.name, memory_gib=round(props.total_memory / (1 << 30), 1),
                    capability=f"{props.major}.{props.minor}",
                    cudnn=torch.backends.cudnn.version(),
                    driver=_driver_version())
    else:
        info["name"] = "CPU fallback: every row lands in host memory"
    return info


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def sync(dev) -> None:
    """Wait until the work queued on ``dev`` (a ``torch.device``) is done; nothing on CPU."""
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@contextlib.contextmanager
def pinned(t, dev):
    """Page-lock ``t``'s memory (``cudaHostRegister``) for the block on CUDA, so a
    ``non_blocking`` copy to the GPU is one DMA; yields whether it is pinned."""
    import torch

    ok = False
    if dev.type == "cuda" and t.numel():
        ok = int(torch.cuda.cudart().cudaHostRegister(
            t.data_ptr(), t.numel() * t.element_size(), _REGISTER_PORTABLE)) == 0
    try:
        yield ok
    finally:
        if ok:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def bits_equal(a, b) -> bool:
    """Same dtype, shape and bytes, compared where the tensors are, 8 bytes at a time
    where the size allows (``torch.equal`` on uint8 runs ~0.1 GB/s on a busy CPU)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.numel() == 0:
        return True
    a, b = a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    for wide in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=wide).element_size()
        if a.numel() % size == 0 and a.data_ptr() % size == 0 and b.data_ptr() % size == 0:
            return torch.equal(a.view(wide), b.view(wide))
    return torch.equal(a, b)


def same_tensors(reference: dict, got: dict) -> bool:
    """The same names, each tensor :func:`bits_equal` to the reference's."""
    return set(reference) == set(got) and all(bits_equal(reference[k], got[k]) for k in reference)
