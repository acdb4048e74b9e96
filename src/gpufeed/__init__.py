"""gpufeed: storage that keeps GPUs fed.

An S3-compatible object store on local NVMe with a zero-copy fast data path
(``gpufeed+shm://`` same-host shared memory, ``gpufeed+tcp://``) and AI
integrations (``gpufeed.ai``).
"""

from __future__ import annotations

from ._version import __version__

__all__ = ["__version__", "Client", "AsyncClient"]


def __getattr__(name: str):
    # Lazy so that `import gpufeed` stays cheap and the engine never imports the client.
    if name in ("Client", "AsyncClient"):
        from .client import AsyncClient, Client

        return {"Client": Client, "AsyncClient": AsyncClient}[name]
    raise AttributeError(name)
