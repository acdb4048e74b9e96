"""torch.distributed.checkpoint through gpufeed.ai.dcp.Writer/Reader: one process
(no_dist) and a gloo group of two ranks spawned on this machine, against a live node."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from gpufeed.ai import checkpoint as ck
from gpufeed.ai.checkpoint import MissingChunk, parse_checkpoint_url
from gpufeed.ai.dcp import Reader, Writer
from gpufeed.client import Client

BUCKET = "ckpt-dcp-tests"

# dcp.save/load with no_dist=True always say they assume a single process
pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning")


@pytest.fixture
def url(node) -> str:
    return f"{node.tcp_url}/{BUCKET}/{uuid.uuid4().hex[:12]}"


def state(seed: int, dtype=torch.float32) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 32, generator=g).to(dtype), "b": torch.randn(32, generator=g).to(dtype),
                  "big": torch.randn(3 << 20, generator=g).to(dtype)},
        "step": seed, "name": f"run-{seed}",
    }


def zeros_like(sd: dict) -> dict:
    return {k: zeros_like(v) if isinstance(v, dict) else
            (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None) for k, v in sd.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_same(a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
        else:
            assert a[k] == b[k], k


# --- one process ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip(url, dtype):
    sd = state(1, dtype)
    w = Writer(url, step=10, chunk_bytes=4 << 20)
    dcp.save(sd, storage_writer=w, no_dist=True)
    assert w.result.step == 10 and w.result.bytes_written == w.result.bytes_total
    out = zeros_like(sd)
    dcp.load(out, storage_reader=Reader(url), no_dist=True)
    assert_same(out, sd)
    # the plain loader reads DCP checkpoints too (nesting from the DCP planner)
    assert_same(ck.load(url), sd)


def test_checkpoint_id_names_the_step(url):
    w = Writer(url)
    for step in (3, 4):
        dcp.save(state(step), storage_writer=w, checkpoint_id=step, no_dist=True)
    assert ck.checkpoints(url).steps() == [3, 4]
    out = zeros_like(state(0))
    dcp.load(out, storage_reader=Reader(url), checkpoint_id=3, no_dist=True)
    assert_same(out, state(3))


def test_async_save_background_staging_then_optimizer_step(url):
    """Background staging: async_save returns before the copy is done; once the
    staging completion resolves, optimizer.step() may mutate the parameters and
    optimizer state in place and the checkpoint still holds the pre-step values."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(4, 512)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    w = Writer(url, chunk_bytes=1 << 18, background_staging=True)
    try:
        for step in range(2):  # the second save reuses the staging buffers
            sd = {"model": model.state_dict(), "optim": opt.state_dict()}
            before = {"model": {k: v.clone() for k, v in sd["model"].items()},
                      "optim": {i: {k: v.clone() for k, v in s.items()}
                                for i, s in opt.state_dict()["state"].items()}}
            resp = dcp.async_save(sd, storage_writer=w, checkpoint_id=step, no_dist=True)
            assert isinstance(resp, AsyncSaveResponse)
            model(torch.randn(4, 512)).square().mean().backward()  # overlaps the staging copy
            resp.staging_completion.result()
            opt.step()  # mutates parameters and moments in place
            opt.zero_grad()
            assert not torch.equal(model[0].weight, before["model"]["0.weight"])
            resp.upload_completion.result()
            assert w.result.step == step
            out = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()},
                   "optim": opt.state_dict()}
            out["optim"]["state"] = {i: {k: torch.zeros_like(v) for k, v in s.items()}
                                     for i, s in out["optim"]["state"].items()}
            dcp.load(out, storage_reader=Reader(url, step=step), no_dist=True)
            for k, v in before["model"].items():
                assert torch.equal(out["model"][k], v), k
            for i, s in before["optim"].items():
                for k, v in s.items():
                    assert torch.equal(out["optim"]["state"][i][k], v), (i, k)
    finally:
        w.close()


def test_background_staging_error_reaches_the_caller(url):
    w = Writer(url, background_staging=True)
    w._stage = lambda sd: (_ for _ in ()).throw(RuntimeError("stage failed"))
    resp = dcp.async_save({"x": torch.ones(4)}, storage_writer=w, no_dist=True)
    # (torch 2.13's staging_completion reports success when the stage future had
    # already failed by the time async_save looked: the upload and the Writer say it)
    with pytest.raises(RuntimeError, match="stage failed"):
        w.synchronize_staging()
    with pytest.raises(Exception, match="stage failed"):
        resp.upload_completion.result()
    w.close()


def test_async_save_and_dedup(url):
    sd = state(2)
    w = Writer(url, chunk_bytes=4 << 20)
    old_w = sd["model"]["w"].clone()
    fut = dcp.async_save(sd, storage_writer=w, no_dist=True)
    sd["model"]["w"].add_(1.0)  # staged already: the checkpoint keeps the old values
    fut.result()
    first = w.result
    assert first.step == 0 and first.bytes_written > 12 << 20
    dcp.async_save(sd, storage_writer=w, no_dist=True).result()
    second = w.result
    # only "w" (8 KiB) and the small pickled values changed
    assert second.step == 1 and second.bytes_written < 64 << 10
    out = zeros_like(sd)
    dcp.load(out, storage_reader=Reader(url, step=0), no_dist=True)
    assert torch.equal(out["model"]["w"], old_w)
    dcp.load(out, storage_reader=Reader(url), no_dist=True)
    assert_same(out, sd)


def test_load_of_a_missing_chunk_names_it(url, node):
    sd = state(3)
    dcp.save(sd, storage_writer=Writer(url), no_dist=True)
    man = ck.checkpoints(url).manifest()
    e = next(e for e in man.entries if e.fqn == "model.b")
    key = parse_checkpoint_url(url).chunk_key(e.chunks[0].hash)
    with Client(node.tcp_url) as c:
        c.delete(BUCKET, key)
    with pytest.raises(BaseException) as exc:  # DCP wraps rank errors in CheckpointException
        dcp.load(zeros_like(sd), storage_reader=Reader(url), no_dist=True)
    assert key in str(exc.value) and "model.b" in str(exc.value)
    rank_error = next(iter(exc.value.failures.values()))[0]
    assert isinstance(rank_error, MissingChunk)


# --- a gloo group of two ranks ----------------------------------------------------------
def _rank_state(rank: int) -> dict:
    g = torch.Generator().manual_seed(100 + rank)
    return {"shared": torch.arange(4096, dtype=torch.float32),  # replicated: stored once
            f"own{rank}": torch.randn(1 << 18, generator=g), "meta": {"world": 2}}


class _DyingWriter(Writer):
    """Rank 1 writes a chunk and then dies before anything is committed."""

    def write_data(self, plan, planner):
        if self.rank == 1:
            self.client.put(self.loc.bucket, self.loc.chunk_key("0d" * 32), b"partial data")
            os._exit(7)
        return super().write_data(plan, planner)


def _worker(rank: int, world: int, init_file: str, url: str, mode: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        sd = _rank_state(rank)
        if mode == "die":
            dcp.save(sd, storage_writer=_DyingWriter(url, step=2))
            return
        dcp.save(sd, storage_writer=Writer(url, step=1))
        out = {"shared": torch.zeros(4096), f"own{rank}": torch.zeros(1 << 18), "meta": {"world": 0}}
        dcp.load(out, storage_reader=Reader(url))
        assert torch.equal(out["shared"], sd["shared"]) and torch.equal(out[f"own{rank}"], sd[f"own{rank}"])
        assert out["meta"] == {"world": 2}
        sd[f"own{rank}"].mul_(2)
        w = Writer(url, step=2)
        dcp.async_save(sd, storage_writer=w).result()
        dcp.load(out, storage_reader=Reader(url))
        assert torch.equal(out[f"own{rank}"], sd[f"own{rank}"])
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ranks_gloo_round_trip_and_async(url, tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "pg"), url, "ok"), nprocs=2, join=True)
    cps = ck.checkpoints(url)
    assert cps.steps() == [1, 2]
    man = cps.manifest(1)
    assert man.world_size == 2 and {e.fqn for e in man.entries if e.kind == "tensor"} == {"shared", "own0", "own1"}
    back = ck.load(url, step=1)
    assert torch.equal(back["own1"], _rank_state(1)["own1"])
    # step 2 re-wrote only the doubled tensors; "shared" was not written again
    assert cps.manifest(2).bytes_written <= 2 * (1 << 18) * 4 + (64 << 10)


def test_a_rank_dying_mid_save_leaves_the_previous_step_latest(url, tmp_path):
    ck.save({"shared": torch.ones(4)}, url, step=1, async_=False).result()
    with pytest.raises(mp.ProcessExitedException):
        mp.spawn(_worker, args=(2, str(tmp_path / "pg"), url, "die"), nprocs=2, join=True)
    cps = ck.checkpoints(url)
    assert cps.steps() == [1] and cps.latest() == 1
    assert torch.equal(ck.load(url)["shared"], torch.ones(4))
    with pytest.raises(ck.CheckpointNotFound):
        ck.load(url, step=2)
    # the chunks both ranks wrote before the crash are orphans: gc removes them
    assert cps.gc() >= len(b"partial data")
    loc = parse_checkpoint_url(url)
    with Client(parse_checkpoint_url(url).node_url) as c:
        left = {e.key.rsplit("/", 1)[-1] for e in c.list(loc.bucket, prefix=loc.key("chunks/"))}
    assert left == {ch.hash for e in cps.manifest(1).entries for ch in e.chunks}


def test_ranks_that_resolved_different_latest_steps_are_refused(url):
    """Each rank finds "latest" on its own; the coordinator refuses a load whose
    ranks saw different steps (a save committed between their reads)."""
    from torch.distributed.checkpoint.planner import LoadPlan

    from gpufeed.ai.checkpoint import CheckpointError

    for step in (0, 1):
        dcp.save({"x": torch.full((4,), float(step))}, storage_writer=Writer(url), no_dist=True)
    early, late = Reader(url, step=0), Reader(url)
    early.read_metadata()
    late.read_metadata()
    plans = [early.prepare_local_plan(LoadPlan([])), late.prepare_local_plan(LoadPlan([]))]
    assert [p.storage_data for p in plans] == [0, 1]
    with pytest.raises(CheckpointError, match="different steps"):
        late.prepare_global_plan(plans)
    same = [late.prepare_local_plan(LoadPlan([]))] * 2
    assert late.prepare_global_plan(same) == same


# --- overlapping saves through one Writer ---------------------------------------------------
def _overlapping_pairs(url: str, w: Writer, pairs: int, *, ids: bool) -> list[float]:
    """``pairs`` times: fill one 16 MiB tensor, async_save, refill, async_save again
    before the first finishes; returns the values saved, in order."""
    t = torch.empty(4 << 20)
    values = []
    for i in range(pairs):
        futs = []
        for j in (0, 1):
            v = float(2 * i + j + 1)
            t.fill_(v)
            values.append(v)
            kw = {"checkpoint_id": 2 * i + j} if ids else {}
            resp = dcp.async_save({"t": t}, storage_writer=w, no_dist=True, **kw)
            if w.background_staging:
                resp.staging_completion.result()  # the caller's contract before mutating t
                resp = resp.upload_completion
            futs.append(resp)
        for f in futs:
            f.result()
    return values


def _assert_steps_hold(url: str, expected: dict[int, float]) -> None:
    assert ck.checkpoints(url).steps() == sorted(expected)
    for step, v in expected.items():
        out = {"t": torch.zeros(4 << 20)}
        dcp.load(out, storage_reader=Reader(url, step=step), no_dist=True)
        assert torch.equal(out["t"], torch.full((4 << 20,), v)), (step, out["t"][:4])
    report = ck.checkpoints(url).scrub()
    assert report.ok, report


@pytest.mark.parametrize("background", [False, True])
def test_overlapping_async_saves_commit_each_step_with_its_own_values(url, background):
    w = Writer(url, chunk_bytes=1 << 20, background_staging=background)
    values = _overlapping_pairs(url, w, 3, ids=True)
    _assert_steps_hold(url, dict(enumerate(values)))
    w.close()


def test_overlapping_async_saves_without_ids_get_distinct_steps(url):
    w = Writer(url, chunk_bytes=1 << 20)
    values = _overlapping_pairs(url, w, 2, ids=False)
    steps = ck.checkpoints(url).steps()
    assert steps == [0, 1, 2, 3]
    # each save committed its own bytes; which of a pair took the lower step is a race
    got = set()
    for s in steps:
        out = {"t": torch.zeros(4 << 20)}
        dcp.load(out, storage_reader=Reader(url, step=s), no_dist=True)
        assert torch.equal(out["t"], torch.full_like(out["t"], out["t"][0].item()))
        got.add(out["t"][0].item())
    assert got == set(values)


def test_staging_buffers_are_lent_to_one_save_at_a_time(url):
    """A stage while the kept buffers are lent copies into other memory; buffers come
    back when the save that holds them has written (or its staged copy is garbage)."""
    import gc

    def ptr(staged):
        return staged["x"].untyped_storage().data_ptr()

    w = Writer(url)
    sd = {"x": torch.ones(1 << 16)}
    a = w.stage(sd)
    b = w.stage(sd)
    assert ptr(a) != ptr(b)
    c = w.stage(sd)  # both kept sets lent: new memory, not kept
    assert ptr(c) not in (ptr(a), ptr(b))
    pa = ptr(a)
    del a, c
    gc.collect()
    assert ptr(w.stage(sd)) == pa  # a's set came back when its copy died
    # a save gives its set back once written, while the caller still holds the copy
    sd["x"].fill_(3.0)
    staged = w.stage(sd)
    dcp.save(staged, storage_writer=w, checkpoint_id=7, no_dist=True)
    assert ptr(w.stage(sd)) == ptr(staged)


def test_scrub_reports_and_repairs_chunks_that_do_not_match_their_name(url, node):
    w = Writer(url, chunk_bytes=1 << 20)
    dcp.save({"t": torch.arange(1 << 20, dtype=torch.float32)}, storage_writer=w, checkpoint_id=0,
             no_dist=True)
    dcp.save({"u": torch.ones(1 << 18)}, storage_writer=w, checkpoint_id=1, no_dist=True)
    c = ck.checkpoints(url)
    clean = c.scrub()
    assert clean.ok and clean.chunks_checked == 5 and clean.bytes_checked >= (5 << 20)
    loc = parse_checkpoint_url(url)
    with Client(node.tcp_url) as cl:
        man = c.manifest(0)
        victim = loc.chunk_key(next(e for e in man.entries if e.fqn == "t").chunks[1].hash)
        size = cl.head(loc.bucket, victim).size
        cl.put(loc.bucket, victim, b"\0" * size)  # same size, wrong bytes
        report = c.scrub()
        assert not report.ok
        assert report.corrupt == [victim] and report.damaged_steps == [0] and report.missing == []
        assert c.scrub(repair=True).removed == [victim]
        after = c.scrub()
        assert after.corrupt == [] and after.missing == [victim] and after.damaged_steps == [0]
        # step 1 is intact and still loads
        out = {"u": torch.zeros(1 << 18)}
        dcp.load(out, storage_reader=Reader(url, step=1), no_dist=True)
        assert torch.equal(out["u"], torch.ones(1 << 18))
