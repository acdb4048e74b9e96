"""Train a tiny model with AdamW, checkpoint it into gpufeed, "crash", resume.

    python examples/train_checkpoint.py                       # starts a node in a temp dir
    python examples/train_checkpoint.py --url gpufeed+tcp://127.0.0.1:9400/ckpt/tiny

The resumed run prints the same losses as an uninterrupted one would: model,
optimizer state and the step counter all come back from the checkpoint.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import gpufeed.ai.checkpoint as ckpt


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)  # data depends only on the step
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).tanh()


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def train(url: str, total: int, every: int, stop_at: int | None) -> list[float]:
    torch.manual_seed(0)
    model, opt = make()
    start = 0
    if ckpt.checkpoints(url).latest() is not None:
        state = ckpt.load(url)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
        print(f"resumed from step {start}")
    losses, pending = [], None
    for step in range(start, total):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (step + 1) % every == 0:
            if pending is not None:
                pending.result()  # at most one save in flight
            # async: blocks only for the CPU copy; the upload overlaps training
            pending = ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(),
                                 "step": step + 1}, url, step=step + 1)
        if stop_at is not None and step + 1 == stop_at:
            break
    if pending is not None:
        res = pending.result()
        print(f"saved step {res.step}: wrote {res.bytes_written} of {res.bytes_total} bytes")
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", help="checkpoint URL (default: a temporary local node)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    args = ap.parse_args()
    node = tmp = None
    url = args.url
    if url is None:
        from gpufeed.testing.node import start_node

        tmp = tempfile.TemporaryDirectory()
        node = start_node(f"{tmp.name}/node")
        url = f"{node.tcp_url}/ckpt/tiny"
    try:
        first = train(url, args.steps, args.every, stop_at=args.steps // 2)  # "crash" half way
        rest = train(url, args.steps, args.every, stop_at=None)
        ckpt.checkpoints(url).keep_last(2)
        torch.manual_seed(0)
        ref_model, ref_opt = make()
        reference = []
        for step in range(args.steps):
            x, y = batch(step)
            loss = torch.nn.functional.mse_loss(ref_model(x), y)
            ref_opt.zero_grad()
            loss.backward()
            ref_opt.step()
            reference.append(loss.item())
        print(f"final loss {rest[-1]:.6f}; same curve as without the restart: {first + rest == reference}")
        print(f"steps kept: {ckpt.checkpoints(url).steps()}")
    finally:
        if node is not None:
            node.stop()
            tmp.cleanup()


if __name__ == "__main__":
    main()
