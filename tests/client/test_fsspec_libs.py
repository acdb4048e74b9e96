"""Data libraries read and write a real node by ``gpufeed://`` URL through the
fsspec filesystem: pandas (parquet, CSV), pyarrow (parquet, datasets), zarr v3,
Hugging Face ``datasets`` (downloaded and streaming), webdataset shards, and a
torch DataLoader whose forked workers read through it."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import gpufeed.client.fs  # noqa: F401 - registers gpufeed:// where the package metadata predates the entry point
from gpufeed.client.fs import GpufeedFileSystem, gopen


@pytest.fixture(scope="module", params=["tcp", "shm"])
def options(request, node) -> dict:
    """storage_options naming the session node."""
    return {"endpoint": node.tcp_url if request.param == "tcp" else node.shm_url, **node.credentials}


@pytest.fixture
def bucket(options) -> str:
    fs = GpufeedFileSystem(**options)
    name = "lib-" + uuid.uuid4().hex[:12]
    fs.mkdir(name)
    yield name
    fs.rm(name, recursive=True)


@pytest.fixture
def fs(options) -> GpufeedFileSystem:
    return GpufeedFileSystem(**options)


def test_pandas_parquet_and_csv(options, bucket):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": np.arange(5000), "b": np.linspace(0, 1, 5000), "c": [f"s{i}" for i in range(5000)]})
    df.to_parquet(f"gpufeed://{bucket}/t.parquet", storage_options=options)
    pd.testing.assert_frame_equal(pd.read_parquet(f"gpufeed://{bucket}/t.parquet", storage_options=options), df)
    cols = pd.read_parquet(f"gpufeed://{bucket}/t.parquet", columns=["b"], storage_options=options)
    pd.testing.assert_frame_equal(cols, df[["b"]])
    df.to_csv(f"gpufeed://{bucket}/t.csv", index=False, storage_options=options)
    pd.testing.assert_frame_equal(pd.read_csv(f"gpufeed://{bucket}/t.csv", storage_options=options), df)
    with pytest.raises(FileNotFoundError):
        pd.read_parquet(f"gpufeed://{bucket}/missing.parquet", storage_options=options)


def test_pyarrow_parquet_and_dataset(fs, bucket):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ds = pytest.importorskip("pyarrow.dataset")
    table = pa.table({"x": list(range(3000)), "part": [i % 3 for i in range(3000)]})
    pq.write_to_dataset(table, f"{bucket}/ds", filesystem=fs, partition_cols=["part"])
    assert sorted(p.rsplit("/", 2)[1] for p in fs.find(f"{bucket}/ds")) == ["part=0", "part=1", "part=2"]
    dataset = ds.dataset(f"{bucket}/ds", filesystem=fs, format="parquet", partitioning="hive")
    one = dataset.to_table(filter=ds.field("part") == 1)
    assert one.num_rows == 1000 and sorted(one["x"].to_pylist()) == list(range(1, 3000, 3))
    pq.write_table(table, f"{bucket}/t.parquet", filesystem=fs, row_group_size=500)
    assert pq.read_table(f"{bucket}/t.parquet", filesystem=fs).equals(table)
    with fs.open(f"{bucket}/t.parquet") as f:
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_row_groups == 6
        assert pf.read_row_group(3)["x"].to_pylist() == list(range(1500, 2000))


def test_zarr_v3_through_fsspec_store(options, fs, bucket):
    zarr = pytest.importorskip("zarr")
    data = np.arange(200 * 200, dtype="f4").reshape(200, 200)
    url = f"gpufeed://{bucket}/z.zarr"
    z = zarr.create_array(store=url, storage_options=options, shape=data.shape, chunks=(20, 20),
                          shards=(100, 100), dtype="f4")  # chunks inside shards: ranged reads
    z[:] = data
    assert fs.exists(f"{bucket}/z.zarr/zarr.json")
    back = zarr.open_array(url, storage_options=options, mode="r")
    np.testing.assert_array_equal(back[:], data)
    np.testing.assert_array_equal(back[45:55, 120:130], data[45:55, 120:130])
    group = zarr.open_group(f"gpufeed://{bucket}/g.zarr", storage_options=options, mode="w")
    group.create_array("m", shape=(10,), dtype="i8")[:] = np.arange(10)
    reopened = zarr.open_group(f"gpufeed://{bucket}/g.zarr", storage_options=options, mode="r")
    np.testing.assert_array_equal(reopened["m"][:], np.arange(10))


def test_hugging_face_datasets_parquet(options, fs, bucket, tmp_path):
    datasets = pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["a", "b", "c"], "label": [0, 1, 0]}), f"{bucket}/hf/train-0.parquet",
                   filesystem=fs)
    pq.write_table(pa.table({"text": ["d"], "label": [1]}), f"{bucket}/hf/train-1.parquet", filesystem=fs)
    files = f"gpufeed://{bucket}/hf/*.parquet"
    loaded = datasets.load_dataset("parquet", data_files=files, storage_options=options,
                                   cache_dir=str(tmp_path / "hf"), split="train")
    assert sorted(loaded["text"]) == ["a", "b", "c", "d"] and loaded.num_rows == 4
    streamed = datasets.load_dataset("parquet", data_files={"train": files}, storage_options=options,
                                     split="train", streaming=True)
    assert sorted((r["text"], r["label"]) for r in streamed) == [("a", 0), ("b", 1), ("c", 0), ("d", 1)]


def test_webdataset_reads_tar_shards_by_url(options, fs, bucket, monkeypatch):
    wds = pytest.importorskip("webdataset")
    from webdataset.gopen import gopen_schemes

    monkeypatch.setitem(gopen_schemes, "gpufeed", gopen)  # 1.0.2's gopen has no fsspec fallback
    monkeypatch.setenv("GPUFEED_URL", options["endpoint"])
    monkeypatch.setenv("GPUFEED_ACCESS_KEY", options["access_key"])
    monkeypatch.setenv("GPUFEED_SECRET_KEY", options["secret_key"])
    for shard in range(2):
        with fs.open(f"{bucket}/shards/shard-{shard:06d}.tar", "wb") as f:
            with wds.TarWriter(f) as w:
                for i in range(4):
                    w.write({"__key__": f"s{shard}-{i}", "txt": f"sample {shard}-{i}", "cls": str(i)})
    urls = f"gpufeed://{bucket}/shards/shard-{{000000..000001}}.tar"
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert [s["__key__"] for s in samples] == [f"s{a}-{i}" for a in range(2) for i in range(4)]
    assert samples[5]["txt"] == "sample 1-1" and samples[5]["cls"] == 1


class _Objects:
    """A map-style dataset of whole objects, read through the filesystem it holds."""

    def __init__(self, fs: GpufeedFileSystem, paths: list[str]) -> None:
        self.fs, self.paths = fs, paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        return self.fs.cat_file(self.paths[i])


def test_torch_dataloader_workers_read_through_the_filesystem(fs, bucket):
    torch_data = pytest.importorskip("torch.utils.data")
    blobs = {f"{bucket}/samples/{i:03d}": bytes([i]) * (100 + i) for i in range(24)}
    fs.pipe(blobs)
    fs.cat_file(next(iter(blobs)))  # the parent's connection is open before the workers fork
    loader = torch_data.DataLoader(_Objects(fs, sorted(blobs)), batch_size=4, num_workers=2,
                                   collate_fn=list, persistent_workers=False)
    assert [b for batch in loader for b in batch] == [blobs[p] for p in sorted(blobs)]
