"""``torch.distributed.checkpoint`` storage for gpufeed: :class:`Writer` and :class:`Reader`.

::

    import torch.distributed.checkpoint as dcp
    from gpufeed.ai.dcp import Reader, Writer

    url = "gpufeed+tcp://127.0.0.1:9400/ckpt/run1"
    dcp.save(state_dict, storage_writer=Writer(url, step=100))
    fut = dcp.async_save(state_dict, storage_writer=writer)   # reuse one Writer
    dcp.load(state_dict, storage_reader=Reader(url))           # latest step

Every rank hashes its tensors' bytes into content-addressed chunks and puts
only the chunks the node lacks, many requests in flight; the coordinator then
writes the step's manifest and, last, its commit marker, so a step is visible
only once every rank's chunks and the metadata are durable. Reads go straight
into the destination tensors' memory and every chunk's BLAKE3 is checked.
Format: ``docs/checkpoint-format.md``.

Source followed: ``torch/distributed/checkpoint/storage.py`` and
``filesystem.py`` (torch 2.13), the StorageWriter/StorageReader contract.
"""

from __future__ import annotations

from .checkpoint._dcp import Reader, Writer, WriteStats

__all__ = ["Writer", "Reader", "WriteStats"]
