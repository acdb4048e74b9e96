"""ObjectDataset(dtype=...) against a live node: batches read straight into
their tensor (shared memory in DataLoader workers), collated without a copy,
bit-identical to what was put; and the ordinary path it falls back to."""

from __future__ import annotations

import multiprocessing
import uuid

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gpufeed.ai.data import ObjectDataset, ResumableLoader, SampleChanged, SampleDecodeError, TensorBatch, collate
from gpufeed.ai.data._tensors import DIRECT_MIN_BYTES
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument

BUCKET = "data-tensor-tests"
N, BIG, SMALL = 12, 256 << 10, 4 << 10  # objects per prefix; bytes per big / small sample

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
              pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")]


def sample(i: int, nbytes: int) -> bytes:
    return np.random.default_rng(i).bytes(nbytes)


@pytest.fixture(scope="module")
def prefixes(node):
    """``{"big": prefix, "small": prefix, "mixed": prefix}`` of sample objects."""
    base = uuid.uuid4().hex[:8]
    with Client(node.tcp_url) as c:
        try:
            c.create_bucket(BUCKET)
        except Exception:  # noqa: BLE001 - made by an earlier test of the session
            pass
        for i in range(N):
            c.put(BUCKET, f"{base}/big/{i:04d}.bin", sample(i, BIG))
            c.put(BUCKET, f"{base}/small/{i:04d}.bin", sample(i, SMALL))
            c.put(BUCKET, f"{base}/mixed/{i:04d}.bin", sample(i, SMALL + 4 * (i % 3)))
    return {k: f"{base}/{k}/" for k in ("big", "small", "mixed")}


def url(node, transport: str) -> str:
    return f"{node.shm_url if transport == 'shm' else node.tcp_url}/{BUCKET}"


def _tagged(batch):
    """collate, and whether the dataset handed over one batch tensor."""
    return collate(batch), isinstance(batch, TensorBatch)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("kind", ["big", "small"])
def test_workers_deliver_batch_tensors_bit_identical(node, prefixes, transport, kind, monkeypatch):
    nbytes = BIG if kind == "big" else SMALL
    assert (4 * nbytes >= DIRECT_MIN_BYTES) == (kind == "big")  # both ways of a worker are covered
    shared = multiprocessing.get_context("fork").Value("i", 0)  # alloc_shared calls in the workers
    real = Client.alloc_shared

    def counted(self, nbytes):
        with shared.get_lock():
            shared.value += 1
        return real(self, nbytes)

    monkeypatch.setattr(Client, "alloc_shared", counted)
    ds = ObjectDataset(url(node, transport), prefixes[kind], dtype=torch.float32)
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_tagged, pin_memory=True)
    seen = []
    for _epoch in range(2):  # the second epoch reuses the workers' pooled memory
        for b, (batch, whole) in enumerate(loader):
            assert whole and batch.dtype == torch.float32 and batch.shape == (4, nbytes // 4)
            for r in range(4):
                assert batch[r].numpy().tobytes() == sample(4 * b + r, nbytes)
            seen.append(b)
    assert len(seen) == 2 * N // 4
    assert shared.value == (len(seen) if kind == "big" else 0)


def test_shape_and_the_main_process(node, prefixes):
    ds = ObjectDataset(url(node, "shm"), prefixes["big"], dtype=torch.int16, shape=(128, BIG // 256))
    batch = ds.__getitems__([3, 0, 11])
    assert isinstance(batch, TensorBatch) and batch.tensor.shape == (3, 128, BIG // 256)
    for row, i in zip(batch, (3, 0, 11)):
        assert row.numpy().tobytes() == sample(i, BIG)
    assert collate(batch) is batch.tensor
    one = ds[5]
    assert one.shape == (128, BIG // 256) and one.numpy().tobytes() == sample(5, BIG)
    loader = DataLoader(ds, batch_size=5, collate_fn=collate)  # num_workers=0: alloc() memory
    got = b"".join(t.numpy().tobytes() for t in loader)
    assert got == b"".join(sample(i, BIG) for i in range(N))


def test_objects_of_different_sizes_come_one_tensor_each(node, prefixes):
    ds = ObjectDataset(url(node, "shm"), prefixes["mixed"], dtype=torch.uint8)
    batch = ds.__getitems__([0, 1, 2])
    assert not isinstance(batch, TensorBatch)
    assert [t.numpy().tobytes() for t in batch] == [sample(i, SMALL + 4 * i) for i in range(3)]
    strict = ObjectDataset(url(node, "shm"), prefixes["mixed"], dtype=torch.float32, shape=(SMALL // 4,))
    with pytest.raises(SampleDecodeError, match="shape"):
        strict.__getitems__([0, 1])
    skipping = ObjectDataset(url(node, "shm"), prefixes["mixed"], dtype=torch.float32, shape=(SMALL // 4,),
                             on_error="skip")
    assert [t.numpy().tobytes() for t in skipping.__getitems__([0, 1, 3])] == [sample(0, SMALL), sample(3, SMALL)]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_object_that_grew_is_named_and_its_neighbours_stay_right(node, transport):
    prefix = uuid.uuid4().hex[:8] + "/"
    with Client(node.tcp_url) as c:
        for i in range(4):
            c.put(BUCKET, f"{prefix}{i}.bin", sample(i, BIG))
        ds = ObjectDataset(url(node, transport), prefix, dtype=torch.uint8)
        skipping = ObjectDataset(url(node, transport), prefix, dtype=torch.uint8, on_error="skip")
        c.put(BUCKET, f"{prefix}1.bin", sample(1, BIG) + b"more")
    with pytest.raises(SampleChanged, match="1.bin"):
        ds.__getitems__([0, 1, 2, 3])
    got = skipping.__getitems__([0, 1, 2, 3])
    assert [t.numpy().tobytes() for t in got] == [sample(i, BIG) for i in (0, 2, 3)]


def test_arguments_are_checked(node, prefixes):
    u = url(node, "shm")
    with pytest.raises(InvalidArgument, match="exclude"):
        ObjectDataset(u, prefixes["big"], dtype=torch.uint8, decode=bytes)
    with pytest.raises(InvalidArgument, match="needs dtype"):
        ObjectDataset(u, prefixes["big"], shape=(4,))
    with pytest.raises(InvalidArgument, match="dtype"):
        ObjectDataset(u, prefixes["big"], dtype="float32")
    with pytest.raises(InvalidArgument, match="shape"):
        ObjectDataset(u, prefixes["big"], dtype=torch.uint8, shape=(0, 4))


def test_resumable_loader_with_the_batch_collate(node, prefixes):
    ds = ObjectDataset(url(node, "shm"), prefixes["big"], dtype=torch.uint8)
    loader = ResumableLoader(ds, batch_size=3, num_workers=2, collate_fn=collate,
                             sampler=ds.sampler(shuffle=True, seed=7))
    it = iter(loader)
    first = next(it)
    state = loader.state_dict()
    rest = [b.clone() for b in it]
    again = ResumableLoader(ds, batch_size=3, num_workers=2,  # collate_fn defaults to collate
                            sampler=ds.sampler(shuffle=True, seed=7))
    again.load_state_dict(state)
    assert again.collate_fn.collate is collate
    assert first.shape == (3, BIG)
    assert all(torch.equal(a, b) for a, b in zip(rest, again, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_objects_of_different_sizes_without_shape_fail_collate_by_name(node, prefixes, workers):
    ds = ObjectDataset(url(node, "shm"), prefixes["mixed"], dtype=torch.uint8)
    loader = DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=collate)
    with pytest.raises(InvalidArgument, match=r"differ in size.*0000\.bin \(4096 bytes\).*0001\.bin "
                                              r"\(4100 bytes\).*pass shape=.*pads"):
        next(iter(loader))

    def pad(batch):  # what the message suggests instead: a collate that pads
        width = max(t.numel() for t in batch)
        return torch.stack([torch.nn.functional.pad(t, (0, width - t.numel())) for t in batch])

    padded = next(iter(DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=pad)))
    assert padded.shape == (3, SMALL + 8)
