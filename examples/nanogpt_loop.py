"""Planted bottleneck in a nanoGPT-shaped loop: an evaluation every few iterations.

No DataLoader and no epochs: ``get_batch`` slices random blocks out of a ``np.memmap`` of tokens
(a small file this script writes to a temporary folder), a ``while True`` loop trains on them,
and every ``eval_interval`` iterations ``estimate_loss`` runs ``eval_iters`` batches of each
split. The loop marks each step with ``scope.batch(get_batch, "train")``. Expected top finding:
``validation.frequency``, in steps (``every_n_steps``, ``at_end``), never in epochs.

    python examples/nanogpt_loop.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import cli, emulate_accelerator  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "nanogpt_loop"
EXPECTED = "validation.frequency"
SMALL = {"max_iters": 150}

VOCAB = 65  # shakespeare_char's
BLOCK = 16
BATCH = 8


class TinyLM(nn.Module):
    """A character model small enough for a CPU: embeddings, one MLP block, a head."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(BLOCK, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx) + self.pos(torch.arange(idx.shape[1]))
        h = h + self.mlp(h)
        logits = self.head(h)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def write_tokens(folder: Path, tokens: int = 200_000) -> None:
    """``train.bin`` and ``val.bin`` as nanoGPT's prepare.py writes them (uint16 token ids)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", tokens), ("val", tokens // 10)):
        rng.integers(0, VOCAB, size=n, dtype=np.uint16).tofile(folder / f"{split}.bin")


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    max_iters: int = 600,
    eval_interval: int = 10,
    eval_iters: int = 10,
    every_n_steps: int | None = None,
    at_end: bool = False,
    val_fraction: float = 1.0,
) -> Report | None:
    """The suggestion's keys: ``every_n_steps`` replaces ``eval_interval``; ``at_end`` evaluates
    once more after the loop; ``val_fraction`` evaluates on that part of ``eval_iters``."""
    emulate_accelerator()
    eval_interval = every_n_steps or eval_interval
    eval_iters = max(1, int(eval_iters * val_fraction))
    torch.manual_seed(1337)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # AdamW would import torch._dynamo (seconds)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        write_tokens(data_dir)

        def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
            # nanoGPT's: a fresh memmap each call (it avoids a memory leak), random blocks of it
            data = np.memmap(data_dir / f"{split}.bin", dtype=np.uint16, mode="r")
            ix = torch.randint(len(data) - BLOCK, (BATCH,))
            x = torch.stack([torch.from_numpy(data[i : i + BLOCK].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + BLOCK].astype(np.int64)) for i in ix])
            return x, y

        @torch.no_grad()
        def estimate_loss() -> dict[str, float]:
            model.eval()
            out = {}
            for split in ("train", "val"):
                losses = torch.zeros(eval_iters)
                for k in range(eval_iters):
                    x, y = get_batch(split)
                    losses[k] = model(x, y).item()
                out[split] = losses.mean().item()
            model.train()
            return out

        with StallScope(report_dir, console=console) as scope:
            x, y = scope.batch(get_batch, "train")
            iter_num = 0
            while True:
                if iter_num % eval_interval == 0:
                    with scope.phase("validation"):
                        estimate_loss()
                with scope.phase("compute"):
                    loss = model(x, y)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                iter_num += 1
                if iter_num >= max_iters:
                    break
                x, y = scope.batch(get_batch, "train")
            if at_end:
                with scope.phase("validation"):
                    estimate_loss()
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
