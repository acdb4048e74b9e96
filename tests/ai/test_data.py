"""gpufeed.ai.data against a live node: ObjectDataset and ShardDataset through
real DataLoaders with workers, distributed sampling, batched reads, bounded
read-ahead and mid-epoch resume through the checkpoint API (docs/training-data.md)."""

from __future__ import annotations

import collections
import pickle
import uuid

import pytest
import torch
from torch.utils.data import DataLoader

from gpufeed.ai import checkpoint as ck
from gpufeed.ai.data import ObjectDataset, ReadLimits, ResumableLoader, ShardDataset, write_shard
from gpufeed.ai.data._fetch import Reader
from gpufeed.client import Client
from gpufeed.errors import InvalidArgument

BUCKET = "data-tests"
N_OBJECTS = 48
N_SHARDS, PER_SHARD = 9, 7

# a DataLoader with pin_memory=True on a machine without an accelerator warns and skips pinning
no_accel_warning = pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
# more workers than this 2-core machine's CPUs is what these tests mean to check
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def payload(i: int, size: int = 200) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


@pytest.fixture(scope="module")
def data(node):
    """One prefix of sample objects and one of tar shards: ``(objects_url, shards_url, raw_url)``."""
    prefix = uuid.uuid4().hex[:8]
    with Client(node.tcp_url) as c:
        try:
            c.create_bucket(BUCKET)
        except Exception:  # noqa: BLE001 - made by an earlier module of the session
            pass
        for i in range(N_OBJECTS):
            c.put(BUCKET, f"{prefix}/objs/{i:05d}.bin", payload(i, 100 + 4 * i))
        for s in range(N_SHARDS):
            samples = [{"__key__": f"s{s:02d}/{j:03d}", "cls": str(s * PER_SHARD + j),
                        "bin": payload(s * PER_SHARD + j, 1000)} for j in range(PER_SHARD)]
            c.put(BUCKET, f"{prefix}/shards/{s:05d}.tar", write_shard(samples))
        for i in range(20):  # raw sample objects: two files per sample
            c.put(BUCKET, f"{prefix}/raw/{i:04d}.cls", str(i).encode())
            c.put(BUCKET, f"{prefix}/raw/{i:04d}.bin", payload(i, 64))
    base = f"{node.tcp_url}/{BUCKET}/{prefix}"
    return f"{base}/objs/", f"{base}/shards/", f"{base}/raw/"


def cls_of(sample: dict) -> int:
    return int(sample["cls"])


def all_cls() -> list[int]:
    return list(range(N_SHARDS * PER_SHARD))


# --- ObjectDataset -----------------------------------------------------------------------
def test_object_dataset_lists_once_in_key_order_and_reads(data, node):
    ds = ObjectDataset(data[0], decode=lambda mv: int.from_bytes(mv[:4], "little"))
    assert len(ds) == N_OBJECTS
    assert ds.keys == sorted(ds.keys) and ds.keys[0].endswith("objs/00000.bin")
    assert [ds[i] for i in (0, 5, -1)] == [0, 5, N_OBJECTS - 1]
    with pytest.raises(IndexError):
        ds[N_OBJECTS]
    raw = ObjectDataset(f"{node.shm_url}/{BUCKET}", data[0].split(f"/{BUCKET}/", 1)[1])
    assert raw[7] == payload(7, 128) and len(raw) == N_OBJECTS


def test_object_dataset_batches_small_reads_into_get_many_into(data):
    ds = ObjectDataset(data[0], limits=ReadLimits(batch_bytes=2048, batch_items=8))
    client = ds.source.client()
    calls = collections.Counter()
    for name in ("submit_get_many_into", "submit_get_into"):
        real = getattr(client, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)
        setattr(client, name, spy)
    got = ds.__getitems__(list(range(16)))
    assert got == [payload(i, 100 + 4 * i) for i in range(16)]
    # 16 objects of 100-160 bytes, at most 8 per group: two round trips, no single reads
    assert calls == {"submit_get_many_into": 2}


@no_accel_warning
def test_object_dataset_through_dataloader_workers_epochs(data):
    ds = ObjectDataset(data[0], decode=lambda mv: int.from_bytes(mv[:4], "little"))
    sampler = ds.sampler(shuffle=True, seed=7)
    dl = DataLoader(ds, batch_size=5, sampler=sampler, num_workers=2, persistent_workers=True,
                    pin_memory=True)
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        got = [int(x) for b in dl for x in b]
        assert sorted(got) == list(range(N_OBJECTS))
        orders.append(got)
    assert orders[0] != orders[1]
    again = ds.sampler(shuffle=True, seed=7)
    assert [int(x) for b in DataLoader(ds, batch_size=5, sampler=again) for x in b] == orders[0]


def test_resumable_sampler_splits_ranks_disjointly_with_one_permutation(data):
    ds = ObjectDataset(data[0])
    for world in (1, 3, 5):
        parts = [ds.sampler(seed=3, rank=r, world_size=world) for r in range(world)]
        for p in parts:
            p.set_epoch(2)
        idx = [list(p) for p in parts]
        flat = [i for part in idx for i in part]
        assert sorted(flat) == list(range(N_OBJECTS))  # no gaps, no duplicates
        whole = ds.sampler(seed=3, rank=0, world_size=1)
        whole.set_epoch(2)
        assert [idx[k % world][k // world] for k in range(N_OBJECTS)] == list(whole)
        assert [len(p) for p in parts] == [len(i) for i in idx]
    even = [list(ds.sampler(rank=r, world_size=5, drop_last=True)) for r in range(5)]
    assert {len(e) for e in even} == {N_OBJECTS // 5}


# --- ShardDataset --------------------------------------------------------------------------
def test_shard_dataset_reads_every_sample_once(data):
    ds = ShardDataset(data[1], shuffle_buffer=10)
    assert ds.format == "tar" and len(ds.units) == N_SHARDS
    got = [cls_of(s) for s in ds]
    assert sorted(got) == all_cls() and got != all_cls()
    s = next(iter(ShardDataset(data[1], shuffle=False)))
    assert s["__key__"] == "s00/000" and s["bin"] == payload(0, 1000) and s["__url__"].endswith("00000.tar")


def test_shard_dataset_over_raw_sample_objects(data):
    ds = ShardDataset(data[2], decode=lambda s: (int(s["cls"]), s["bin"]))
    assert ds.format == "objects" and len(ds.units) == 20
    got = sorted(ds)
    assert got == [(i, payload(i, 64)) for i in range(20)]


def test_a_folder_with_a_dot_between_a_samples_objects_does_not_split_it(node):
    prefix = f"{uuid.uuid4().hex[:8]}/dotted/"
    with Client(node.tcp_url) as c:
        try:
            c.create_bucket(BUCKET)
        except Exception:  # noqa: BLE001 - made by an earlier test of the session
            pass
        for name in ["x/1.jpg", "x/1.k/z.png", "x/1.txt", "x/2.jpg", "x/2.txt"]:  # x/1.k/ sorts inside x/1
            c.put(BUCKET, prefix + name, name.encode())
    ds = ShardDataset(f"{node.tcp_url}/{BUCKET}/{prefix}", shuffle=False, format="objects")
    got = {s["__key__"][len(prefix):]: {k: v for k, v in s.items() if not k.startswith("__")} for s in ds}
    assert got == {"x/1": {"jpg": b"x/1.jpg", "txt": b"x/1.txt"}, "x/1.k/z": {"png": b"x/1.k/z.png"},
                   "x/2": {"jpg": b"x/2.jpg", "txt": b"x/2.txt"}}


@no_accel_warning
@pytest.mark.parametrize("kind", [1, 2])
def test_shard_dataset_dataloader_persistent_workers_see_set_epoch(data, kind):
    url = data[kind]
    ds = ShardDataset(url, decode=cls_of, shuffle_buffer=5, seed=11)
    dl = DataLoader(ds, batch_size=4, num_workers=3, persistent_workers=True, pin_memory=True)
    total = N_SHARDS * PER_SHARD if kind == 1 else 20
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        got = [int(x) for b in dl for x in b]
        assert sorted(got) == list(range(total))
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3  # each epoch its own order: the workers saw set_epoch
    ds.set_epoch(1)
    assert [int(x) for b in dl for x in b] == orders[1]  # and the order is a function of the epoch


@pytest.mark.parametrize("kind", [1, 2])
@pytest.mark.parametrize("world,workers", [(1, 4), (2, 3), (4, 2), (3, 5)])
def test_ranks_and_workers_split_without_duplicates_or_gaps(data, kind, world, workers):
    url = data[kind]
    seen: list[str] = []
    for rank in range(world):
        ds = ShardDataset(url, rank=rank, world_size=world, seed=5, shuffle_buffer=4)
        ds.set_epoch(3)
        for w in range(workers):
            for i in ds.my_units(3, w, workers):
                seen += [it.key for it in ds.units[i]]
    keys = [it.key for u in ShardDataset(url).units for it in u]
    assert sorted(seen) == sorted(keys)


def test_every_rank_computes_the_same_shard_permutation(data, monkeypatch):
    world = 3
    parts = [ShardDataset(data[1], rank=r, world_size=world, seed=9).my_units(4) for r in range(world)]
    order = [parts[k % world][k // world] for k in range(N_SHARDS)]
    assert sorted(order) == list(range(N_SHARDS)) and order != list(range(N_SHARDS))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    from_env = ShardDataset(data[1], seed=9)
    assert (from_env.rank, from_env.world_size) == (2, 3) and from_env.my_units(4) == parts[2]
    with pytest.raises(InvalidArgument):
        ShardDataset(data[1], rank=3, world_size=3)


def test_rank_comes_from_an_initialised_process_group_before_the_environment(data, monkeypatch):
    import socket

    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        ds = ShardDataset(data[1])
        assert (ds.rank, ds.world_size) == (0, 1)
        assert ObjectDataset(data[0]).sampler().rank == 0
    finally:
        dist.destroy_process_group()
    assert ShardDataset(data[1]).rank == 1  # no process group: the environment


def test_a_real_dataloader_over_ranks_reads_each_sample_once(data):
    got = []
    for rank in range(2):
        ds = ShardDataset(data[1], decode=cls_of, rank=rank, world_size=2)
        got += [int(x) for b in DataLoader(ds, batch_size=3, num_workers=2) for x in b]
    assert sorted(got) == all_cls()


def test_more_workers_than_shards(data):
    ds = ShardDataset(data[1], decode=cls_of, rank=1, world_size=4)
    got = [int(x) for b in DataLoader(ds, batch_size=2, num_workers=4) for x in b]
    expect = sorted(cls_of(s) for s in ShardDataset(data[1], rank=1, world_size=4))
    assert sorted(got) == expect and len(expect) in (2 * PER_SHARD, 3 * PER_SHARD)


def test_pickling_carries_no_connection(data):
    ds = ShardDataset(data[1])
    next(iter(ds))  # this process now holds a client
    assert ds.source._session is not None
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.source._session is None and copy._reader is None
    assert sorted(cls_of(s) for s in copy) == all_cls()
    obj = ObjectDataset(data[0])
    obj[0]
    assert pickle.loads(pickle.dumps(obj)).source._session is None


def test_spawned_workers_open_their_own_clients(data):
    ds = ShardDataset(data[2], decode=cls_of)  # spawn pickles the dataset: a module-level decode
    dl = DataLoader(ds, batch_size=5, num_workers=1, multiprocessing_context="spawn")
    assert sorted(int(x) for b in dl for x in b) == list(range(20))


def test_read_ahead_stays_within_its_bounds(data):
    ds = ShardDataset(data[1], shuffle=False)
    reader = Reader(ds.source, ds.policy, ReadLimits(max_inflight=3, batch_bytes=1024))
    client = ds.source.client()
    submitted = []
    real = client.submit_get_into

    def spy(*a, **kw):
        submitted.append(a[1])
        return real(*a, **kw)
    client.submit_get_into = spy
    shards = [u[0] for u in ds.units]
    for n, (item, data_) in enumerate(reader.read(shards), start=1):
        assert data_ is not None and len(data_) == item.size
        assert len(submitted) - n <= 2  # at most 3 in flight: this one and two more
    assert submitted == [s.key for s in shards]


# --- resume ---------------------------------------------------------------------------------
def _keys_collate(samples):
    return [s["__key__"] if isinstance(s, dict) else s for s in samples]


@pytest.mark.parametrize("kind,workers,stop", [(1, 2, 5), (1, 3, 1), (1, 0, 7), (2, 2, 3), (1, 3, 17), (1, 2, 22)])
def test_shard_loader_resumes_mid_epoch_where_it_stopped(data, node, kind, workers, stop):
    def make():
        ds = ShardDataset(data[kind], seed=4, shuffle_buffer=6)
        return ResumableLoader(ds, batch_size=3, num_workers=workers, collate_fn=_keys_collate)

    full_loader = make()
    full_loader.set_epoch(1)
    full = [k for b in full_loader for k in b]
    first = make()
    first.set_epoch(1)
    got = []
    for i, b in enumerate(first):
        got += b
        if i + 1 == stop:
            break
    url = f"{node.tcp_url}/{BUCKET}/ckpt-{uuid.uuid4().hex[:8]}"
    ck.save({"model": {"w": torch.ones(3)}, "data": first.state_dict(), "step": stop}, url, async_=False)
    state = ck.load(url)
    second = make()
    second.load_state_dict(state["data"])
    assert second.epoch == 1
    second.set_epoch(1)  # a training loop's set_epoch at the top of the resumed epoch keeps the position
    rest = [k for b in second for k in b]
    assert got + rest == full  # exactly the remaining samples, in the same order
    assert sorted(full) == sorted(set(full))
    second.set_epoch(2)  # the next epoch starts from its beginning
    assert len([k for b in second for k in b]) == len(full)


def test_object_loader_resumes_mid_epoch(data, node):
    def make():
        ds = ObjectDataset(data[0], decode=lambda mv: int.from_bytes(mv[:4], "little"))
        return ResumableLoader(ds, batch_size=4, num_workers=2, sampler=ds.sampler(seed=1))

    full_loader = make()
    full_loader.set_epoch(3)
    full = [int(x) for b in full_loader for x in b]
    first = make()
    first.set_epoch(3)
    it = iter(first)
    got = [int(x) for _ in range(5) for x in next(it)]
    url = f"{node.tcp_url}/{BUCKET}/ckpt-{uuid.uuid4().hex[:8]}"
    ck.save({"data": first.state_dict()}, url, async_=False)
    second = make()
    second.load_state_dict(ck.load(url)["data"])
    assert got + [int(x) for b in second for x in b] == full


def test_resume_refuses_another_listing_or_worker_count(data):
    loader = ResumableLoader(ShardDataset(data[1]), batch_size=2, num_workers=2)
    state = loader.state_dict()
    with pytest.raises(InvalidArgument, match="num_workers"):
        ResumableLoader(ShardDataset(data[1]), batch_size=2, num_workers=3).load_state_dict(state)
    with pytest.raises(InvalidArgument, match="does not match"):
        ResumableLoader(ShardDataset(data[2]), batch_size=2, num_workers=2).load_state_dict(state)
    with pytest.raises(InvalidArgument, match="does not match"):
        ResumableLoader(ShardDataset(data[1], seed=1), batch_size=2, num_workers=2).load_state_dict(state)
    for bad in (None, {}, {"epoch": 0, "num_workers": 2}, [state]):
        with pytest.raises(InvalidArgument, match="state_dict"):
            ResumableLoader(ShardDataset(data[1]), batch_size=2, num_workers=2).load_state_dict(bad)
    with pytest.raises(InvalidArgument):
        ResumableLoader(torch.utils.data.TensorDataset(torch.zeros(3)))
    with pytest.raises(InvalidArgument, match="ResumableSampler"):
        ResumableLoader(ObjectDataset(data[0]), sampler=range(3))


def test_object_loader_shuffle_argument_makes_its_sampler(data):
    ds = ObjectDataset(data[0], decode=lambda mv: int.from_bytes(mv[:4], "little"))
    plain = [int(x) for b in ResumableLoader(ds, batch_size=8) for x in b]
    shuffled = ResumableLoader(ds, batch_size=8, shuffle=True)
    got = [int(x) for b in shuffled for x in b]
    assert plain == list(range(N_OBJECTS)) and sorted(got) == plain and got != plain
    assert shuffled.sampler.shuffle and shuffled.state_dict()["sampler"]["shuffle"]


def _spy_reads(client) -> list[str]:
    """Keys the client is asked to read from now on (a wrapper: the reads still happen)."""
    keys: list[str] = []
    real_many, real_one = client.submit_get_many_into, client.submit_get_into

    def many(reqs, **kw):
        keys.extend(r.key for r in reqs)
        return real_many(reqs, **kw)

    def one(bucket, key, *a, **kw):
        keys.append(key)
        return real_one(bucket, key, *a, **kw)
    client.submit_get_many_into, client.submit_get_into = many, one
    return keys


def test_tar_resume_at_every_batch_and_reads_only_the_shards_it_needs(data):
    def make():
        ds = ShardDataset(data[1], seed=8, shuffle_buffer=5)
        loader = ResumableLoader(ds, batch_size=3, collate_fn=_keys_collate)
        loader.set_epoch(2)
        return loader

    full = [k for b in make() for k in b]
    for stop in range(1, len(full) // 3 + 1):
        first = make()
        it = iter(first)
        got = [k for _ in range(stop) for k in next(it)]
        state = first.state_dict()
        second = make()
        second.load_state_dict(state)
        reads = _spy_reads(second.dataset.source.client())
        rest = [k for b in second for k in b]
        assert got + rest == full, stop
        shards_left = {k.split("/")[0] for k in rest}
        # the shards holding what is left, and no other (the buffer spans at most two of 7 samples)
        assert len(reads) == len(set(reads)) == len(shards_left), (stop, reads, shards_left)


def test_tar_resume_without_sample_counts_replays(data):
    def make():
        return ResumableLoader(ShardDataset(data[1], seed=2, shuffle_buffer=4), batch_size=4, num_workers=2,
                               collate_fn=_keys_collate)

    full = [k for b in make() for k in b]
    first = make()
    it = iter(first)
    got = [k for _ in range(6) for k in next(it)]
    state = first.state_dict()
    assert len(state["shard_samples"]) >= 2
    del state["shard_samples"]  # a state written by hand, say: the workers replay their streams
    second = make()
    second.load_state_dict(state)
    assert got + [k for b in second for k in b] == full


def test_tar_resume_refuses_a_shard_whose_sample_count_changed(data):
    from gpufeed.ai.data import SampleChanged

    loader = ResumableLoader(ShardDataset(data[1], seed=2), batch_size=4, collate_fn=_keys_collate)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    state["shard_samples"] = [[u, n + 1] for u, n in state["shard_samples"]]
    again = ResumableLoader(ShardDataset(data[1], seed=2), batch_size=4, collate_fn=_keys_collate)
    again.load_state_dict(state)
    with pytest.raises(SampleChanged, match="samples"):
        list(again)


def test_shards_from_webdataset_shardwriter_through_the_node(data, node, tmp_path):
    import webdataset as wds

    pattern = str(tmp_path / "train-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=5, verbose=0) as sink:
        for i in range(23):
            sink.write({"__key__": f"sample{i:05d}", "txt": f"caption {i}", "cls": i, "npy.bin": bytes([i]) * i})
    prefix = f"wds-{uuid.uuid4().hex[:8]}/"
    files = sorted(tmp_path.glob("train-*.tar"))
    with Client(node.tcp_url) as c:
        for f in files:
            c.put(BUCKET, prefix + f.name, f.read_bytes())
    ours = {s["__key__"]: s for s in ShardDataset(f"{node.tcp_url}/{BUCKET}/{prefix}")}
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    theirs = {}
    for f in files:  # webdataset's own reader (wds.WebDataset leaves its files open for the GC)
        with open(f, "rb") as fh:
            theirs.update((s["__key__"], s) for s in group_by_keys({**m, "__url__": str(f)}
                                                                     for m in tar_file_iterator(fh)))
    assert len(ours) == len(theirs) == 23
    for key, s in theirs.items():
        assert {k: v for k, v in ours[key].items() if not k.startswith("__")} == \
            {k: v for k, v in s.items() if not k.startswith("__")}


def test_empty_objects_are_samples_too(data, node):
    prefix = f"empty-{uuid.uuid4().hex[:8]}/"
    with Client(node.tcp_url) as c:
        for i in range(3):
            c.put(BUCKET, f"{prefix}{i}.bin", b"" if i != 1 else b"x")
        c.put(BUCKET, f"{prefix}sub/", b"")  # a folder marker is not a sample
    ds = ObjectDataset(f"{node.tcp_url}/{BUCKET}/{prefix}")
    assert len(ds) == 3 and ds.__getitems__([0, 1, 2]) == [b"", b"x", b""]


def test_zero_copy_decoded_samples_stay_valid_while_held(data, node):
    # torch.frombuffer keeps the read pool's memory: it must not be lent to a later read meanwhile
    ds = ObjectDataset(f"{node.shm_url}/{BUCKET}/" + data[0].split(f"/{BUCKET}/", 1)[1],
                       decode=lambda mv: torch.frombuffer(mv, dtype=torch.uint8),
                       limits=ReadLimits(batch_bytes=1024, batch_items=4))
    held = [t for start in range(0, N_OBJECTS, 8) for t in ds.__getitems__(range(start, start + 8))]
    for _ in range(3):
        ds.__getitems__(range(N_OBJECTS))  # churn the pool
    assert [bytes(t.numpy()) for t in held] == [payload(i, 100 + 4 * i) for i in range(N_OBJECTS)]


def test_a_dropped_dataset_lets_its_client_go(data):
    import weakref

    for kind in (0, 1, 2):
        ds = (ObjectDataset if kind == 0 else ShardDataset)(data[kind])
        loader = ResumableLoader(ds, batch_size=4)
        assert sum(len(b) for b in loader) > 0
        client = weakref.ref(ds.source.client())
        del ds, loader
        assert client() is None  # no table or cycle keeps it (and its connections) open


def test_an_empty_listing_or_a_rank_without_shards_is_logged(data, caplog):
    caplog.set_level("WARNING", logger="gpufeed.ai.data")
    typo = data[1].replace("/shards/", "/shrads/")
    assert len(ObjectDataset(typo)) == 0 and list(ShardDataset(typo)) == []
    assert "no objects under" in caplog.text and "shrads/" in caplog.text
    caplog.clear()
    ShardDataset(data[1], rank=N_SHARDS, world_size=N_SHARDS + 1)
    assert f"rank {N_SHARDS} gets none" in caplog.text
    caplog.clear()
    ShardDataset(data[1], rank=0, world_size=N_SHARDS)
    assert "gets none" not in caplog.text
