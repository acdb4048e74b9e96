"""Checkpoints through the plain API against a live node: round trips, training
resume, dedup, garbage collection and damaged checkpoints (docs/checkpoint-format.md)."""

from __future__ import annotations

import uuid

import msgspec
import pytest
import torch

from gpufeed.ai import checkpoint as ck
from gpufeed.ai.checkpoint import (
    CheckpointNotFound,
    CorruptCheckpoint,
    Location,
    MissingChunk,
    parse_checkpoint_url,
)
from gpufeed.client import Client
from gpufeed.errors import GpufeedError, InvalidArgument

BUCKET = "ckpt-tests"


@pytest.fixture(scope="module")
def client(node):
    with Client(node.tcp_url) as c:
        yield c


@pytest.fixture
def url(node) -> str:
    return f"{node.tcp_url}/{BUCKET}/{uuid.uuid4().hex[:12]}"


def tiny(seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)


def train(model, opt, steps: range, losses: list[float]) -> None:
    for s in steps:
        g = torch.Generator().manual_seed(1000 + s)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())


def chunk_entries(client, url) -> dict[str, int]:
    loc = parse_checkpoint_url(url)
    return {e.key: e.size for e in client.list(loc.bucket, prefix=loc.key("chunks/"))}


# --- URLs ----------------------------------------------------------------------------------
def test_parse_checkpoint_url():
    assert parse_checkpoint_url("gpufeed+tcp://127.0.0.1:9400/b1/runs/a") == \
        Location("gpufeed+tcp://127.0.0.1:9400", "b1", "runs/a")
    assert parse_checkpoint_url("gpufeed+shm:///tmp/x/gpufeed.sock/b1/p/") == \
        Location("gpufeed+shm:///tmp/x/gpufeed.sock", "b1", "p")
    assert parse_checkpoint_url("gpufeed+shm:///tmp/x/node.socket", bucket="b2") == \
        Location("gpufeed+shm:///tmp/x/node.socket", "b2", "")
    assert parse_checkpoint_url("gpufeed+tcp://h:1/b").key("chunks/x") == "chunks/x"
    with pytest.raises(InvalidArgument):
        parse_checkpoint_url("gpufeed+tcp://127.0.0.1:9400")
    with pytest.raises(InvalidArgument):
        parse_checkpoint_url("s3://b/p")


# --- round trips ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_plain_round_trip_is_bit_identical(url, dtype):
    model = tiny(dtype=dtype)
    opt = torch.optim.AdamW(model.parameters())
    train(model.float(), opt, range(2), [])
    model.to(dtype)
    sd = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 7,
          "extra": [torch.arange(5), ("name", 1.5)], "empty": torch.empty(0, 3),
          "scalar": torch.tensor(3.25, dtype=torch.float64)}
    res = ck.save(sd, url, step=5, async_=False).result()
    assert res.step == 5 and res.bytes_written > 0
    back = ck.load(url)
    for k, v in sd["model"].items():
        assert back["model"][k].dtype == v.dtype
        assert torch.equal(back["model"][k].view(torch.uint8), v.view(torch.uint8)), k
    assert back["epoch"] == 7
    assert back["optim"]["param_groups"] == sd["optim"]["param_groups"]
    assert set(back["optim"]["state"]) == set(sd["optim"]["state"])  # int keys survive
    for i, st in sd["optim"]["state"].items():
        for name, t in st.items():
            assert torch.equal(back["optim"]["state"][i][name], t)
    assert torch.equal(back["extra"][0], torch.arange(5)) and back["extra"][1] == ("name", 1.5)
    assert back["empty"].shape == (0, 3) and back["scalar"].item() == 3.25


def test_shared_tensors_are_stored_once_and_restored_shared(url):
    w = torch.randn(64, 64)
    res = ck.save({"a": w, "b": w}, url, async_=False).result()
    assert res.bytes_total < 2 * w.numel() * 4
    back = ck.load(url)
    assert back["a"] is back["b"] and torch.equal(back["a"], w)


def test_async_save_snapshots_tensors(url):
    t = torch.ones(1000)
    fut = ck.save({"t": t}, url, step=1)  # async_ is the default
    t.add_(1)  # training continues while the upload runs
    assert fut.result().step == 1
    assert torch.equal(ck.load(url)["t"], torch.ones(1000))


def test_async_saves_reuse_staging_only_when_safe(url):
    """Back-to-back async saves: each step holds the values at its call, whether
    its copy went into the previous save's buffers (done) or fresh ones (still
    uploading); a changed shape or a non-contiguous tensor stages correctly."""
    from gpufeed.ai.checkpoint import _staging as staging

    loc = ck.parse_checkpoint_url(url)
    key = (loc.node_url, loc.bucket, loc.prefix)
    w = torch.arange(200_000, dtype=torch.float32).reshape(400, 500)
    futs, want, buffers = [], {}, []
    for step in range(4):
        sd = {"w": w, "wt": w.t(), "n": step}
        futs.append(ck.save(sd, url, step=10 + step))
        buffers.append(staging._staging[key][0]["w"])
        want[10 + step] = (w.clone(), w.t().clone())
        w.add_(1)  # the optimizer step right after the call
        if step == 1:
            futs[-1].result()  # the next save then reuses these buffers
    assert buffers[2] is buffers[1]  # reused: that save was done
    for f in futs:
        f.result()
    for step, (w0, wt0) in want.items():
        back = ck.load(url, step=step)
        assert torch.equal(back["w"], w0) and torch.equal(back["wt"], wt0) and back["n"] == step - 10
    staged = staging._staging[key][0]
    ck.save({"w": torch.ones(3, 3), "wt": w.t(), "n": 0}, url, step=20).result()  # new shape
    assert staging._staging[key][0] is not staged
    assert torch.equal(ck.load(url, step=20)["w"], torch.ones(3, 3))
    ck.save({"w": torch.zeros(2)}, url, step=21, reuse_staging=False).result()
    assert key not in staging._staging


def test_steps_latest_and_named_step(url):
    assert ck.checkpoints(url).latest() is None
    with pytest.raises(CheckpointNotFound):
        ck.load(url)
    for v in range(3):
        ck.save({"v": torch.tensor(v)}, url, async_=False)  # steps 0, 1, 2 by default
    cps = ck.checkpoints(url)
    assert cps.steps() == [0, 1, 2] and cps.latest() == 2 and len(cps) == 3
    assert ck.load(url)["v"].item() == 2 and ck.load(url, step=0)["v"].item() == 0
    with pytest.raises(CheckpointNotFound) as exc:
        ck.load(url, step=9)
    assert isinstance(exc.value, FileNotFoundError)


def test_resume_continues_the_same_loss_curve(url):
    reference: list[float] = []
    model = tiny(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, range(12), reference)

    first: list[float] = []
    model = tiny(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, range(6), first)
    ck.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 6}, url).result()
    del model, opt

    model = tiny(seed=99)  # different weights: everything must come from the checkpoint
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = ck.load(url)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    rest: list[float] = []
    train(model, opt, range(state["step"], 12), rest)
    assert first + rest == reference


# --- dedup and GC --------------------------------------------------------------------------
def test_second_save_of_unchanged_model_writes_no_chunks(url, client):
    model = tiny()
    sd = {"model": model.state_dict(), "big": torch.randn(3 << 20)}  # 12 MiB: several chunks
    ck.save(sd, url, async_=False, chunk_bytes=4 << 20).result()
    before = chunk_entries(client, url)
    res = ck.save(sd, url, async_=False, chunk_bytes=4 << 20).result()
    after = chunk_entries(client, url)
    tensor_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values()) + (12 << 20)
    # only the small pickled skeleton (structure + plain values) may differ
    assert res.bytes_written < 4096 and res.bytes_total > tensor_bytes
    assert sum(after.values()) - sum(before.values()) < 4096


def test_changed_tensor_writes_only_its_chunks(url):
    base = torch.randn(4 << 20)  # 16 MiB frozen
    adapter = torch.zeros(1024)
    ck.save({"base": base, "adapter": adapter}, url, async_=False).result()
    adapter += 1
    res = ck.save({"base": base, "adapter": adapter}, url, async_=False).result()
    assert res.bytes_written < 4096 + 4 * 1024
    assert torch.equal(ck.load(url)["adapter"], adapter)


def test_delete_keeps_chunks_other_steps_use(url, client):
    frozen = torch.randn(1 << 20)
    for v in range(3):
        ck.save({"frozen": frozen, "v": torch.full((1000,), float(v))}, url, async_=False).result()
    cps = ck.checkpoints(url)
    freed = cps.delete(0)
    assert freed > 0 and cps.steps() == [1, 2]
    assert torch.equal(ck.load(url, step=1)["frozen"], frozen)
    with pytest.raises(InvalidArgument):
        cps.keep_last(0)  # would silently delete every step
    assert cps.keep_last(1) == [1] and cps.steps() == [2]
    back = ck.load(url)
    assert torch.equal(back["frozen"], frozen) and back["v"][0].item() == 2.0
    # what is left is exactly what step 2 references
    refs = {c.hash for e in cps.manifest(2).entries for c in e.chunks}
    assert {k.rsplit("/", 1)[-1] for k in chunk_entries(client, url)} == refs
    cps.delete(2)
    assert chunk_entries(client, url) == {} and cps.latest() is None


def test_gc_removes_orphans_of_a_crashed_save(url, client):
    ck.save({"t": torch.ones(10)}, url, async_=False).result()
    loc = parse_checkpoint_url(url)
    client.put(loc.bucket, loc.chunk_key("ab" * 32), b"orphan chunk")
    client.put(loc.bucket, loc.step_key(7, "manifest"), b"uncommitted")
    cps = ck.checkpoints(url)
    assert cps.steps() == [0]
    assert cps.gc() == len(b"orphan chunk") + len(b"uncommitted")
    assert torch.equal(ck.load(url)["t"], torch.ones(10))


# --- damaged checkpoints -------------------------------------------------------------------
def _first_chunk(url, fqn_part: str):
    man = ck.checkpoints(url).manifest()
    e = next(e for e in man.entries if fqn_part in e.fqn and e.kind == "tensor")
    return e, parse_checkpoint_url(url).chunk_key(e.chunks[0].hash)


def test_missing_chunk_is_a_typed_error_naming_key_and_tensor(url, client):
    ck.save({"model": tiny().state_dict()}, url, async_=False).result()
    e, key = _first_chunk(url, "0.weight")
    client.delete(BUCKET, key)
    with pytest.raises(MissingChunk) as exc:
        ck.load(url)
    assert key in str(exc.value) and e.fqn in str(exc.value)
    assert isinstance(exc.value, FileNotFoundError) and isinstance(exc.value, GpufeedError)


def test_corrupt_chunk_is_detected(url, client):
    ck.save({"model": tiny().state_dict()}, url, async_=False).result()
    e, key = _first_chunk(url, "0.weight")
    data = bytearray(client.get(BUCKET, key))
    data[17] ^= 0xFF  # same size, one byte flipped
    client.put(BUCKET, key, data)
    with pytest.raises(CorruptCheckpoint) as exc:
        ck.load(url)
    assert key in str(exc.value) and e.fqn in str(exc.value)
    client.put(BUCKET, key, data[:-4])  # truncated: caught even without hashing
    with pytest.raises(CorruptCheckpoint, match="bytes"):
        ck.load(url, verify=False)


def test_damaged_manifest_is_detected(url, client):
    ck.save({"t": torch.ones(3)}, url, async_=False).result()
    loc = parse_checkpoint_url(url)
    mkey = loc.step_key(0, "manifest")
    client.put(BUCKET, mkey, b"\x93garbage")
    with pytest.raises(CorruptCheckpoint, match="BLAKE3"):
        ck.load(url)
    # a manifest that matches its commit but is not a Manifest
    raw = msgspec.msgpack.encode({"format": "x"})
    client.put(BUCKET, mkey, raw)
    commit = ck.Commit(ck.FORMAT, ck.FORMAT_VERSION, 0, len(raw), ck.chunk_hash(raw), 0.0)
    client.put(BUCKET, loc.step_key(0, "commit"), msgspec.msgpack.encode(commit))
    with pytest.raises(CorruptCheckpoint, match="Manifest"):
        ck.load(url)


def test_uncommitted_step_is_invisible(url, client):
    ck.save({"t": torch.ones(3)}, url, async_=False).result()
    loc = parse_checkpoint_url(url)
    client.put(BUCKET, loc.step_key(1, "manifest"), client.get(BUCKET, loc.step_key(0, "manifest")))
    assert ck.checkpoints(url).steps() == [0]
    with pytest.raises(CheckpointNotFound):
        ck.load(url, step=1)


def test_overwrite_false_refuses_an_existing_step(url):
    ck.save({"t": torch.ones(3)}, url, step=4, async_=False).result()
    with pytest.raises(ck.CheckpointError, match="already exists"):
        ck.save({"t": torch.zeros(3)}, url, step=4, async_=False, overwrite=False).result()
    assert torch.equal(ck.load(url)["t"], torch.ones(3))
    ck.save({"t": torch.zeros(3)}, url, step=4, async_=False).result()
    assert torch.equal(ck.load(url)["t"], torch.zeros(3))


def test_shm_transport_round_trip(node):
    url = f"{node.shm_url}/{BUCKET}/{uuid.uuid4().hex[:12]}"
    sd = {"w": torch.randn(3 << 20), "b": torch.randn(7)}  # one chunk larger than a staging slot
    ck.save(sd, url, async_=False).result()
    back = ck.load(url)
    assert all(torch.equal(back[k], v) for k, v in sd.items())


# --- fixes from a fresh-user trial ----------------------------------------------------------
def test_pooled_client_survives_a_node_restart(tmp_path):
    """URL-based calls share one pooled client per node: a lost connection must not
    fail every later call of the process."""
    from gpufeed.testing.node import start_node

    node = start_node(tmp_path / "data")
    url = f"{node.shm_url}/{BUCKET}/restart"
    try:
        with Client(node.shm_url) as c:
            c.create_bucket(BUCKET)
        ck.save({"w": torch.arange(4.0)}, url, async_=False)
        node.stop()
        node = start_node(tmp_path / "data")  # same socket path: the same URL
        assert node.shm_url in url
        ck.save({"w": torch.arange(5.0)}, url, async_=False)
        assert torch.equal(ck.load(url)["w"], torch.arange(5.0))
        assert ck.checkpoints(url).steps() == [0, 1]
    finally:
        node.stop()


def test_keep_last_right_after_an_async_save_keeps_the_new_step_whole(url):
    a, b = torch.full((1000,), 1.0), torch.full((1000,), 2.0)
    ck.save({"flag": a}, url, async_=False)  # step 0 holds A's chunk
    ck.save({"flag": b}, url, async_=False)  # step 1
    for _ in range(3):
        fut = ck.save({"flag": a}, url)  # skips A's chunk: step 0 has it
        ck.checkpoints(url).keep_last(1)  # waits for the save, then deletes older steps
        step = fut.result().step
        assert torch.equal(ck.load(url, step=step)["flag"], a)
        ck.save({"flag": b}, url, async_=False)
        ck.save({"flag": a}, url, async_=False)


def test_async_save_in_a_forked_child(url):
    import multiprocessing

    ck.save({"w": torch.ones(3)}, url).result()  # the parent's save thread exists now
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child() -> None:
        try:
            q.put(ck.save({"w": torch.zeros(3)}, url).result(timeout=30).step)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            q.put(repr(exc))

    p = ctx.Process(target=child)
    p.start()
    try:
        got = q.get(timeout=60)
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
    assert got == 1, got
    assert torch.equal(ck.load(url)["w"], torch.zeros(3))


@pytest.mark.parametrize("step", [-5, True, 1.5, "3", 2**70])
def test_bad_steps_are_refused(url, step):
    from gpufeed.ai import dcp

    with pytest.raises(InvalidArgument, match="step"):
        ck.save({"w": torch.ones(1)}, url, step=step, async_=False)
    with pytest.raises(InvalidArgument, match="step"):
        dcp.Writer(url, step=step)
    with pytest.raises(InvalidArgument, match="step"):
        dcp.Reader(url, step=step)
    with pytest.raises(InvalidArgument, match="step"):
        ck.load(url, step=step)


def test_load_reads_this_process_async_saves_and_delete_needs_a_step(url):
    fut = ck.save({"w": torch.arange(3.0)}, url, step=100)  # the README's example
    assert torch.equal(ck.load(url)["w"], torch.arange(3.0))  # waits for the save
    assert fut.done() and fut.result().step == 100
    with pytest.raises(InvalidArgument, match="step"):
        ck.checkpoints(url).delete(None)
