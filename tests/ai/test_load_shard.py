"""load_safetensors: keys=, tensor-parallel shard= (bit-identical to slicing the
full tensor, and only the slice's bytes requested), the staged path that CUDA
loads use (run here with its CPU fallback), progress."""

from __future__ import annotations

import uuid

import pytest
import torch
from safetensors.torch import save_file

from gpufeed.ai import _device, _readplan, _reads, load_safetensors
from gpufeed.client import Client, ReadRequest
from gpufeed.errors import InvalidArgument


class CountingClient(Client):
    """Our real client, recording every read it is asked for: ``(key, offset, length)``."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: list[tuple[str, int, int]] = []

    def submit_get_many_into(self, requests, **kw):
        for r in requests:
            r = r if isinstance(r, ReadRequest) else ReadRequest(*r)
            self.reads.append((r.key, r.offset, r.length if r.length is not None
                               else len(memoryview(r.dest).cast("B"))))
        return super().submit_get_many_into(requests, **kw)

    def submit_get_into(self, bucket, key, buffer, *, offset=0, length=None):
        n = length if length is not None else len(memoryview(buffer).cast("B"))
        self.reads.append((key, offset, n))
        return super().submit_get_into(bucket, key, buffer, offset=offset, length=length)

    def data_bytes(self) -> int:
        """Bytes requested past offset 0 (header probes read from offset 0)."""
        return sum(n for _k, off, n in self.reads if off > 0)


@pytest.fixture(scope="module", params=["shm", "tcp"])
def client(request, node):
    with CountingClient(node.shm_url if request.param == "shm" else node.tcp_url) as c:
        yield c


@pytest.fixture(scope="module")
def bucket(node):
    name = "shard-" + uuid.uuid4().hex[:12]
    with Client(node.tcp_url) as c:
        c.create_bucket(name)
    return name


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "w3": torch.randn(8, 6, 4, generator=g),  # every dim divides by 2
        "col": torch.randn(16, 12, generator=g).to(torch.bfloat16),
        "row": torch.randn(4, 40, generator=g).to(torch.float16),
        "i64": torch.arange(24).reshape(6, 4),
        "norm": torch.randn(10, generator=g),
        "odd": torch.randn(5, 3, generator=g),  # divides by nothing useful
        "tiny": torch.randint(0, 255, (2, 2), generator=g, dtype=torch.uint8),
    }


@pytest.fixture(scope="module")
def stored(bucket, node, tmp_path_factory) -> dict[str, torch.Tensor]:
    sd = tensors()
    path = tmp_path_factory.mktemp("shard") / "m.safetensors"
    save_file(sd, path)
    with Client(node.tcp_url) as c:
        c.put(bucket, "m.safetensors", path.read_bytes())
    return sd


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and (
        a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8),
                                      b.contiguous().reshape(-1).view(torch.uint8)))


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_keys_is_tensors(client, bucket, stored):
    a = load_safetensors(client, bucket, "m.safetensors", keys=["col", "norm"])
    b = load_safetensors(client, bucket, "m.safetensors", tensors=["col", "norm"])
    assert list(a) == list(b) and set(a) == {"col", "norm"}  # file order
    assert all(bits_equal(a[k], stored[k]) and bits_equal(b[k], stored[k]) for k in a)
    with pytest.raises(InvalidArgument, match="not both"):
        load_safetensors(client, bucket, "m.safetensors", keys=["col"], tensors=["col"])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("strided", ["ranges", "auto"])
def test_shard_is_the_slice_and_reads_only_it(client, bucket, stored, world, dim, strided):
    names = [k for k, v in stored.items() if v.ndim >= 2 and v.shape[dim] % world == 0]
    assert "col" in names and len(names) >= 2
    for rank in range(world):
        client.reads.clear()
        got = load_safetensors(client, bucket, "m.safetensors", keys=names,
                               shard=(rank, world, dim), strided=strided)
        want = {k: stored[k].chunk(world, dim)[rank] for k in names}
        for k in names:
            assert bits_equal(got[k], want[k]), (k, rank)
            assert got[k].is_contiguous()
        if strided == "ranges":  # small tensors: "auto" reads whole rows here
            assert client.data_bytes() == sum(nbytes(v) for v in want.values())


def test_rows_mode_reads_whole_rows_of_strided_slices_only(client, bucket, stored):
    client.reads.clear()
    got = load_safetensors(client, bucket, "m.safetensors", keys=["w3", "col"],
                           shard=(1, 2, 1), strided="rows")
    assert bits_equal(got["w3"], stored["w3"].chunk(2, 1)[1])
    assert bits_equal(got["col"], stored["col"].chunk(2, 1)[1])
    assert client.data_bytes() == nbytes(stored["w3"]) + nbytes(stored["col"])
    client.reads.clear()  # dim 0 is contiguous: never whole rows
    load_safetensors(client, bucket, "m.safetensors", keys=["w3"], shard=(1, 2, 0), strided="rows")
    assert client.data_bytes() == nbytes(stored["w3"]) // 2


def test_rows_mode_in_small_blocks(client, bucket, stored, monkeypatch):
    monkeypatch.setattr(_reads, "GATHER_SCRATCH_BYTES", 40)  # one or two rows per block
    monkeypatch.setattr(_reads, "GATHER_SLOTS", 2)
    got = load_safetensors(client, bucket, "m.safetensors", keys=["w3", "row"],
                           shard=(0, 2, -1), strided="rows")
    assert bits_equal(got["w3"], stored["w3"].chunk(2, -1)[0])
    assert bits_equal(got["row"], stored["row"].chunk(2, -1)[0])


def test_shard_dim_per_tensor(client, bucket, stored):
    def dim(name: str) -> int | None:  # column-parallel "col", row-parallel "row", rest whole
        return {"col": 0, "row": 1}.get(name)

    got = load_safetensors(client, bucket, "m.safetensors", shard=(1, 2, dim))
    assert bits_equal(got["col"], stored["col"][8:])
    assert bits_equal(got["row"], stored["row"][:, 20:])
    for k in ("odd", "norm", "w3", "i64", "tiny"):
        assert bits_equal(got[k], stored[k])


def test_uneven_split_is_an_error_naming_the_tensor(client, bucket, stored):
    with pytest.raises(InvalidArgument, match=r"'odd'.*dim 0 \(5\) does not divide into 2"):
        load_safetensors(client, bucket, "m.safetensors", keys=["odd"], shard=(0, 2, 0))
    with pytest.raises(InvalidArgument, match="'norm'.*no dim 1"):
        load_safetensors(client, bucket, "m.safetensors", keys=["norm"], shard=(0, 2, 1))
    for bad in [(2, 2, 0), (0, 0, 0), (0, 2), ("0", 2, 0), (0, 2, "x")]:
        with pytest.raises(InvalidArgument):
            load_safetensors(client, bucket, "m.safetensors", keys=["w3"], shard=bad)
    with pytest.raises(InvalidArgument, match="strided"):
        load_safetensors(client, bucket, "m.safetensors", strided="columns")


def test_world_size_one_is_everything(client, bucket, stored):
    got = load_safetensors(client, bucket, "m.safetensors", shard=(0, 1, 0))
    assert all(bits_equal(got[k], stored[k]) for k in stored)


# --- the staged path (CUDA's pipeline, with the blocking CPU copier) -------------------

@pytest.mark.parametrize("slot", [64, 256, 1 << 20])
def test_staged_path_cpu_fallback(client, bucket, stored, slot):
    got = load_safetensors(client, bucket, "m.safetensors", staging_bytes=slot, chunk_bytes=48)
    assert set(got) == set(stored)
    assert all(bits_equal(got[k], stored[k]) for k in stored)
    # ordinary torch memory, not views of client memory
    assert isinstance(got["w3"].untyped_storage(), torch.UntypedStorage)
    sharded = load_safetensors(client, bucket, "m.safetensors", keys=["w3", "col"],
                               shard=(1, 2, 1), staging_bytes=slot)
    assert bits_equal(sharded["w3"], stored["w3"].chunk(2, 1)[1])
    assert bits_equal(sharded["col"], stored["col"].chunk(2, 1)[1])


def test_staged_path_casts(client, bucket, stored):
    got = load_safetensors(client, bucket, "m.safetensors", staging_bytes=128,
                           dtype=torch.float32)
    assert got["col"].dtype == torch.float32 and got["i64"].dtype == torch.int64
    assert torch.equal(got["col"], stored["col"].float())


def test_copier_fallback_without_cuda():
    slots = [torch.zeros(8, dtype=torch.uint8)]
    copier = _device._copier_for(torch.device("cpu"), slots)
    assert isinstance(copier, _device._SyncCopier)
    dst = torch.empty(8, dtype=torch.uint8)
    copier.copy(torch.arange(8, dtype=torch.uint8), dst)
    copier.record(0)
    copier.wait(0)
    copier.close()
    assert dst.tolist() == list(range(8))
    if not torch.cuda.is_available():
        assert _device.gds_status().startswith("unavailable")


def test_copy_runs_merge_neighbours():
    r = _readplan._Range
    batch = [(r("k", 0, 100, 10), 0), (r("k", 50, 110, 5), 10), (r("k", 0, 200, 4), 15)]
    assert _reads._copy_runs(batch) == [(0, 100, 15), (15, 200, 4)]


def test_device_errors(client, bucket, stored):
    with pytest.raises(InvalidArgument, match="meta"):
        load_safetensors(client, bucket, "m.safetensors", device="meta")
    with pytest.raises(InvalidArgument):
        load_safetensors(client, bucket, "m.safetensors", device="nonsense")
    with pytest.raises(InvalidArgument, match="staging_bytes"):
        load_safetensors(client, bucket, "m.safetensors", staging_bytes=0)


@pytest.mark.gpu
def test_cuda_staged_shard(client, bucket, stored):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    got = load_safetensors(client, bucket, "m.safetensors", device="cuda:0", staging_bytes=256,
                           chunk_bytes=48)
    for k in stored:
        assert got[k].device.type == "cuda" and bits_equal(got[k].cpu(), stored[k])
    got = load_safetensors(client, bucket, "m.safetensors", keys=["w3"], device="cuda:0",
                           shard=(1, 2, 1))
    assert bits_equal(got["w3"].cpu(), stored["w3"].chunk(2, 1)[1])


# --- progress ---------------------------------------------------------------------------

def test_progress_bar(client, bucket, stored, monkeypatch):
    assert not _reads._want_progress(False, 10**12)
    assert _reads._want_progress(True, 1)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert not _reads._want_progress(None, 10**12)
    got = load_safetensors(client, bucket, "m.safetensors", progress=True)
    assert all(bits_equal(got[k], stored[k]) for k in stored)
