"""The loaders ``gpufeed bench train`` compares: one factory per data path.

Every path reads the same samples (written once per run by :func:`write_dataset`)
through a ``torch.utils.data.DataLoader`` with the same ``num_workers``,
``prefetch_factor`` and batch size, and delivers the same batch (one ``[batch,
sample_bytes]`` uint8 tensor, in shared memory when made in a worker): paths
that hand over samples one by one share one collate (:func:`collate_samples`,
which copies them into the batch as ``default_collate`` does), and gpufeed's
raw-tensor dataset reads the batch tensor itself. What differs is how bytes
reach the batch:

* ``local``: plain files on this machine's disk (``open().read()``), the
  physical limit;
* ``s3_boto3``: ``get_object`` from the node's S3 endpoint, one client per worker;
* ``s3fs``: ``S3FileSystem.cat_file`` / ``open`` against the same endpoint;
* ``s3torchconnector``: Amazon's ``S3MapDataset`` (one reader per object)
  against the same endpoint;
* ``gpufeed``: :class:`gpufeed.ai.data.ObjectDataset` (``dtype=torch.uint8``)
  / ``ShardDataset`` over the node's fast path (shared memory); see
  :func:`gpufeed_loader`;
* ``gpufeed_decode`` (only when asked for): ``ObjectDataset`` with ``decode=``,
  through :func:`collate_samples`.

Workloads with one sample per file are read map-style (a cyclic sampler per
emulated accelerator, starting at its own place in the data set); workloads
with samples packed into tar shards (WebDataset layout: members
``<key>.bin``) are read as streams, each worker of each accelerator starting
at its own shard, and the samples come out of a minimal ustar reader that every
path shares.

A factory is ``factory(source, rank, world) -> iterable of batches``, where a
batch has ``len()`` (samples) and ``nbytes``; ``iter()`` of it is called in the
benchmark's main thread (DataLoader workers fork there).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

__all__ = ["Source", "LOADERS", "PATHS", "write_dataset", "tar_samples", "collate_samples", "LoaderFactory",
           "s3_environment", "unavailable", "data_loader", "reader_loader", "gpufeed_loader", "SampleDataset",
           "ShardStream", "CyclicSampler"]

#: The paths every run measures, in this order.
PATHS = ("gpufeed", "local", "s3_boto3", "s3fs", "s3torchconnector")


@dataclass(frozen=True)
class Source:
    """Where one workload's samples are, and how each loader reads them.

    Attributes:
        bucket: the node's bucket holding the objects.
        keys: object keys (and file paths under ``local_dir``), one per file.
        local_dir: folder of the same files on local disk.
        sample_bytes: bytes per sample.
        samples_per_file: 1 (one object per sample) or more (tar shards).
        batch: samples per batch.
        s3_url, fast_url: the node's S3 endpoint and fast-path URL.
        access_key, secret_key: the node's key.
        workers: DataLoader workers per emulated accelerator (0: load in the
            accelerator's own thread).
        prefetch: batches prefetched per worker.
    """

    bucket: str
    keys: tuple[str, ...]
    local_dir: str
    sample_bytes: int
    samples_per_file: int
    batch: int
    s3_url: str = ""
    fast_url: str = ""
    access_key: str = ""
    secret_key: str = ""
    workers: int = 1
    prefetch: int = 2
    extra: dict = field(default_factory=dict)

    @property
    def file_bytes(self) -> int:
        """Largest file: a sample, or a shard (a 512-byte header and padding to
        512 per member, then the end blocks padded to tar's 10,240-byte record)."""
        if self.samples_per_file == 1:
            return self.sample_bytes
        member = 512 + -(-self.sample_bytes // 512) * 512
        return -(-(self.samples_per_file * member + 1024) // 10240) * 10240

    @property
    def samples(self) -> int:
        """Samples in the data set."""
        return len(self.keys) * self.samples_per_file


LoaderFactory = Callable[[Source, int, int], Iterable]


# --- the data set ---------------------------------------------------------------------------

def _file_bytes(rng: np.random.Generator, sample_bytes: int, samples_per_file: int, first: int) -> bytes:
    """One file: a raw sample, or a tar shard of ``samples_per_file`` members."""
    if samples_per_file == 1:
        return rng.bytes(sample_bytes)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(first, first + samples_per_file):
            info = tarfile.TarInfo(f"{i:09d}.bin")
            info.size = sample_bytes
            tar.addfile(info, io.BytesIO(rng.bytes(sample_bytes)))
    return out.getvalue()


def write_dataset(client, bucket: str, prefix: str, local_dir: Path, *, files: int, sample_bytes: int,
                  samples_per_file: int, seed: int = 0, progress: Callable[[int], None] | None = None) -> list[str]:
    """Generate ``files`` files of random samples; write each to ``local_dir`` and
    put it into ``bucket`` through ``client`` (a :class:`gpufeed.client.Client`).

    Args:
        client: fast-path client of the node.
        bucket: existing bucket.
        prefix: key prefix (``"unet3d/"``).
        local_dir: folder for the local copies (created).
        files: number of files.
        sample_bytes: bytes per sample.
        samples_per_file: 1 for raw ``.bin`` samples, more for ``.tar`` shards.
        seed: random seed.
        progress: called with the bytes of each file written.

    Returns:
        The keys, in order (``prefix + "sample-000000.bin"`` or ``"shard-000000.tar"``).
    """
    rng = np.random.default_rng(seed)
    local_dir.mkdir(parents=True, exist_ok=True)
    keys = []
    for f in range(files):
        name = f"sample-{f:06d}.bin" if samples_per_file == 1 else f"shard-{f:06d}.tar"
        data = _file_bytes(rng, sample_bytes, samples_per_file, f * samples_per_file)
        (local_dir / name).write_bytes(data)
        client.put(bucket, prefix + name, data)
        keys.append(prefix + name)
        if progress is not None:
            progress(len(data))
    return keys


def tar_samples(stream) -> Iterator[bytes]:
    """The regular members' bytes of a tar stream, in order (a minimal ustar reader).

    Args:
        stream: anything with ``read(n)`` (a file, a boto3 ``StreamingBody``, an
            ``S3Reader``).

    Raises:
        ValueError: a header whose size field is not octal, or a stream cut short.
    """
    while True:
        header = _read_exact(stream, 512)
        if len(header) < 512 or not any(header):
            return
        field_ = header[124:136].split(b"\0", 1)[0].strip()
        try:
            size = int(field_ or b"0", 8)
        except ValueError as exc:
            raise ValueError(f"corrupt tar header (size field {field_!r})") from exc
        data = _read_exact(stream, size)
        if len(data) < size:
            raise ValueError(f"tar stream ends inside a member ({len(data)} of {size} bytes)")
        pad = -size % 512
        if pad:
            _read_exact(stream, pad)
        if header[156:157] in (b"0", b"\0"):
            yield data


def _read_exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = stream.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def collate_samples(batch: list) -> torch.Tensor:
    """``[len(batch), sample_bytes]`` uint8 tensor of equal-sized samples; in a
    DataLoader worker its storage is allocated in shared memory (as
    ``default_collate`` does), so the batch crosses to the main process without
    another copy.

    Raises:
        ValueError: samples of different sizes.
    """
    size = len(batch[0])
    if any(len(b) != size for b in batch):
        raise ValueError("samples of a batch differ in size")
    if tud.get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(len(batch) * size)
        out = torch.empty(0, dtype=torch.uint8).set_(storage).view(len(batch), size)
    else:
        out = torch.empty((len(batch), size), dtype=torch.uint8)
    arr = out.numpy()
    for i, b in enumerate(batch):
        arr[i] = np.frombuffer(b, np.uint8)
    return out


@contextlib.contextmanager
def s3_environment(src: Source):
    """``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and
    ``AWS_REGION`` of the node for the duration (restored after): how
    s3torchconnector finds an S3-compatible endpoint."""
    want = {"AWS_ENDPOINT_URL": src.s3_url, "AWS_ACCESS_KEY_ID": src.access_key,
            "AWS_SECRET_ACCESS_KEY": src.secret_key, "AWS_REGION": "us-east-1"}
    before = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: Path -> the module it needs, and the extra that installs it.
REQUIRES = {"s3_boto3": "boto3", "s3fs": "s3fs", "s3torchconnector": "s3torchconnector"}


def unavailable(path: str) -> str | None:
    """Why ``path`` cannot run here (its package is missing), or ``None``."""
    mod = REQUIRES.get(path)
    if mod is None:
        return None
    try:
        __import__(mod)
    except ImportError as exc:
        return f"{mod} cannot be imported ({exc}); pip install 'gpufeed[bench]'"
    return None


# --- one reader per path, made in the worker that uses it -----------------------------------

class _LocalReader:
    def __init__(self, src: Source) -> None:
        self.root = Path(src.local_dir)

    def read(self, key: str) -> bytes:
        with open(self.root / key, "rb") as f:
            return f.read()

    def open(self, key: str):
        return open(self.root / key, "rb", buffering=1 << 20)


class _Boto3Reader:
    def __init__(self, src: Source) -> None:
        import boto3

        self.bucket = src.bucket
        self.s3 = boto3.session.Session().client(
            "s3", endpoint_url=src.s3_url, aws_access_key_id=src.access_key,
            aws_secret_access_key=src.secret_key, region_name="us-east-1")

    def read(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def open(self, key: str):
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]


class _S3fsReader:
    def __init__(self, src: Source) -> None:
        import s3fs

        self.bucket = src.bucket
        self.fs = s3fs.S3FileSystem(key=src.access_key, secret=src.secret_key, endpoint_url=src.s3_url,
                                    skip_instance_cache=True)

    def read(self, key: str) -> bytes:
        return self.fs.cat_file(f"{self.bucket}/{key}")

    def open(self, key: str):
        return self.fs.open(f"{self.bucket}/{key}", "rb")


class _S3TorchReader:
    """Amazon's ``S3MapDataset`` over the objects; item ``i`` is a streaming
    ``S3Reader``. Its native client takes the key from ``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY`` (see :func:`s3_environment`)."""

    def __init__(self, src: Source) -> None:
        from s3torchconnector import S3ClientConfig, S3MapDataset

        self.index = {k: i for i, k in enumerate(src.keys)}
        self.ds = S3MapDataset.from_objects([f"s3://{src.bucket}/{k}" for k in src.keys], region="us-east-1",
                                            endpoint=src.s3_url,
                                            s3client_config=S3ClientConfig(force_path_style=True))

    def read(self, key: str) -> bytes:
        return self.ds[self.index[key]].read()

    def open(self, key: str):
        return self.ds[self.index[key]]


class _MemoryReader:
    """Samples (or one shard) made in memory: the DataLoader's own ceiling, no storage."""

    def __init__(self, src: Source) -> None:
        rng = np.random.default_rng(1)
        self.sample = rng.bytes(src.sample_bytes) if src.samples_per_file == 1 else b""
        self.shard = b"" if src.samples_per_file == 1 else _file_bytes(rng, src.sample_bytes,
                                                                       src.samples_per_file, 0)

    def read(self, key: str) -> bytes:
        return self.sample

    def open(self, key: str):
        return io.BytesIO(self.shard)


_READERS: dict[str, type] = {"local": _LocalReader, "s3_boto3": _Boto3Reader, "s3fs": _S3fsReader,
                             "s3torchconnector": _S3TorchReader, "memory": _MemoryReader}


# --- datasets and samplers ------------------------------------------------------------------

class _Lazy:
    """Makes its path's reader on first use in each process (after the fork)."""

    def __init__(self, kind: str, src: Source) -> None:
        self.kind, self.src = kind, src
        self._pid = -1
        self._reader = None

    def reader(self):
        if self._pid != os.getpid():
            self._reader, self._pid = _READERS[self.kind](self.src), os.getpid()
        return self._reader


class SampleDataset(tud.Dataset):
    """Map-style: item ``i`` is the bytes of object ``keys[i]``, read by the
    path's reader (``kind``: a key of ``_READERS``)."""

    def __init__(self, kind: str, src: Source) -> None:
        self.src, self.lazy = src, _Lazy(kind, src)

    def __len__(self) -> int:
        return len(self.src.keys)

    def __getitem__(self, i: int) -> bytes:
        return self.lazy.reader().read(self.src.keys[i])


class ShardStream(tud.IterableDataset):
    """Iterable: the samples of the tar shards, from this accelerator's worker's
    own first shard on (``rank`` of ``world`` accelerators), cyclically, without end."""

    def __init__(self, kind: str, src: Source, rank: int, world: int) -> None:
        self.src, self.rank, self.world, self.lazy = src, rank, world, _Lazy(kind, src)

    def __iter__(self):
        keys = self.src.keys
        info = tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        i = (self.rank * nw + wid) * len(keys) // (self.world * nw)
        reader = self.lazy.reader()
        while True:
            stream = reader.open(keys[i % len(keys)])
            try:
                yield from tar_samples(stream)
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            i += 1


class CyclicSampler(tud.Sampler):
    """Indices ``start, start + 1, ...`` modulo ``n``, without end."""

    def __init__(self, n: int, start: int) -> None:
        super().__init__()
        self.n, self.start = n, start

    def __iter__(self):
        i = self.start
        while True:
            yield i % self.n
            i += 1


def data_loader(dataset, src: Source, *, sampler=None, collate_fn=collate_samples) -> tud.DataLoader:
    """The DataLoader every path uses (same workers, prefetch, batch, collate)."""
    return tud.DataLoader(dataset, batch_size=src.batch, sampler=sampler, num_workers=src.workers,
                          collate_fn=collate_fn, prefetch_factor=src.prefetch if src.workers else None,
                          multiprocessing_context="fork" if src.workers else None)


def reader_loader(kind: str) -> LoaderFactory:
    """A factory over one of the plain readers (map-style or shard stream)."""

    def make(src: Source, rank: int, world: int):
        if src.samples_per_file == 1:
            return data_loader(SampleDataset(kind, src), src,
                               sampler=CyclicSampler(src.samples, rank * src.samples // world))
        return data_loader(ShardStream(kind, src, rank, world), src)

    make.__name__ = f"{kind}_loader"
    return make


def _view(data: memoryview) -> memoryview:
    """The object's bytes as read (the collate copies them into the batch; a
    dataset's views are not reused, so keeping one unchanged is allowed)."""
    return data


def _bin(sample: dict) -> bytes:
    """A WebDataset sample's ``.bin`` member."""
    return sample["bin"]


class _Endless(tud.IterableDataset):
    """Epoch after epoch of an iterable dataset (a run stops when it has measured enough)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        while True:
            n = 0
            for n, sample in enumerate(self.dataset, 1):  # noqa: B007 (n counts the samples)
                yield sample
            if n == 0:
                raise RuntimeError("the dataset yields no samples for this worker")


def gpufeed_loader(src: Source, rank: int, world: int, *, raw_tensors: bool = True) -> tud.DataLoader:
    """The gpufeed path: :class:`gpufeed.ai.data.ObjectDataset` (one object per
    sample) or :class:`gpufeed.ai.data.ShardDataset` (tar shards read whole),
    over the node's fast path (``src.fast_url``), in the same DataLoader as the
    other paths.

    One object per sample: with ``raw_tensors`` (the ``gpufeed`` path) the
    dataset is made with ``dtype=torch.uint8``, so each batch is read with
    batched ``get_many_into`` straight into its ``[batch, sample_bytes]``
    tensor (in the worker, memory shared with the main process) and
    :func:`gpufeed.ai.data.collate` hands that tensor on: the same tensor
    :func:`collate_samples` makes, without its copy. Without (the
    ``gpufeed_decode`` path) the samples are handed to :func:`collate_samples`
    as the views read (``decode=``), which copies them into the batch.

    Tar shards: with ``raw_tensors`` the dataset is made with
    ``dtype=torch.uint8, shape=(sample_bytes,), batch_size=batch`` and yields
    whole batch tensors (the DataLoader's ``batch_size=None``): each batch's
    samples are read by their place in the shard (``get_ranges_into``)
    straight into the batch tensor. Without (``gpufeed_decode``) the shards
    are read whole, parsed, and the samples' ``.bin`` bytes go through
    :func:`collate_samples`. Every accelerator's shard stream reads all shards
    (``rank`` 0 of 1, as the baselines' streams do), in an order of its own
    (shard order shuffled with seed ``rank``, no sample buffer)."""
    from ..ai.data import ObjectDataset, ShardDataset, collate

    url = f"{src.fast_url}/{src.bucket}"
    prefix = src.keys[0].rpartition("/")[0] + "/"
    if src.samples_per_file == 1:
        sampler = CyclicSampler(len(src.keys), rank * len(src.keys) // world)
        if raw_tensors:
            ds = ObjectDataset(url, prefix, dtype=torch.uint8, access_key=src.access_key,
                               secret_key=src.secret_key)
            return data_loader(ds, src, sampler=sampler, collate_fn=collate)
        ds = ObjectDataset(url, prefix, decode=_view, access_key=src.access_key, secret_key=src.secret_key)
        return data_loader(ds, src, sampler=sampler)
    common: dict[str, Any] = {"format": "tar", "shuffle": True, "shuffle_buffer": 0, "seed": rank, "rank": 0,
                              "world_size": 1, "access_key": src.access_key, "secret_key": src.secret_key}
    if raw_tensors:
        shards = ShardDataset(url, prefix, dtype=torch.uint8, shape=(src.sample_bytes,), batch_size=src.batch,
                              **common)
        return tud.DataLoader(_Endless(shards), batch_size=None, num_workers=src.workers,
                              prefetch_factor=src.prefetch if src.workers else None,
                              multiprocessing_context="fork" if src.workers else None)
    shards = ShardDataset(url, prefix, decode=_bin, **common)
    return data_loader(_Endless(shards), src)


#: Path name -> loader factory.
LOADERS: dict[str, LoaderFactory] = {
    "local": reader_loader("local"),
    "s3_boto3": reader_loader("s3_boto3"),
    "s3fs": reader_loader("s3fs"),
    "s3torchconnector": reader_loader("s3torchconnector"),
    "gpufeed": gpufeed_loader,
    # ObjectDataset with decode=, its samples copied into the batch by collate_samples
    # (not in PATHS; ask for it by name to compare)
    "gpufeed_decode": functools.partial(gpufeed_loader, raw_tensors=False),
    "memory": reader_loader("memory"),  # the harness's ceiling (not a storage path)
}
