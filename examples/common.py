"""Shared pieces of the example scenarios: a tiny model, a synthetic dataset with planted costs.

Each scenario script defines ``run(**settings) -> Report`` with keyword arguments for the knobs a
StallScope suggestion names (``num_workers``, ``every_n_steps``, ...), so ``benchmarks/whatif.py``
can apply a suggestion and run it again, and a ``main()`` that runs it at demo size.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

FEATURES = 64
CLASSES = 10


class SyntheticDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples whose ``__getitem__`` burns CPU (``cpu_ms``) and/or waits (``latency_ms``)."""

    def __init__(self, size: int, *, cpu_ms: float = 0.0, latency_ms: float = 0.0, seed: int = 0) -> None:
        self.size = size
        self.cpu_ms = cpu_ms
        self.latency_ms = latency_ms
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, FEATURES, generator=gen)
        self.y = torch.randint(0, CLASSES, (size,), generator=gen)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cpu_ms > 0:
            burn_cpu(self.cpu_ms / 1e3)
        if self.latency_ms > 0:
            time.sleep(self.latency_ms / 1e3)  # a read from slow storage: waiting, not computing
        return self.x[i], self.y[i]


def burn_cpu(seconds: float) -> None:
    """Busy CPU work for about ``seconds`` (decoding, augmenting...)."""
    end = time.perf_counter() + seconds
    data = b"x" * 256
    while time.perf_counter() < end:
        data = hashlib.sha256(data).digest() * 8


def make_model(hidden: int = 256) -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


class Trainer:
    """The minimal training step every scenario shares."""

    def __init__(self, hidden: int = 256, lr: float = 0.01) -> None:
        torch.manual_seed(0)
        self.model = make_model(hidden)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, batch: tuple[torch.Tensor, torch.Tensor], repeat: int = 1) -> torch.Tensor:
        x, y = batch
        loss = torch.zeros(())
        for _ in range(repeat):
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.opt.step()
        return loss.detach()


def emulate_accelerator() -> None:
    """Run the model's math on one thread.

    These scenarios use the CPU as their accelerator. On a GPU machine the training process needs
    about one host thread to drive the device, and the loader's workers have the other cores; one
    intra-op thread reproduces that split on a small CPU box (with torch's default of one thread
    per core, workers and compute would fight over the same cores).
    """
    torch.set_num_threads(1)


def loader(
    dataset: Dataset[Any], *, batch_size: int = 32, num_workers: int = 0, batch_sampler: bool = False, **kwargs: Any
) -> DataLoader[Any]:
    """The examples' DataLoader; ``batch_sampler``: one index per batch (``data.batch_indexing``'s fix)."""
    if num_workers == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs.pop("persistent_workers", None)
    if batch_sampler:
        sampler = BatchSampler(SequentialSampler(dataset), batch_size, drop_last=False)  # type: ignore[arg-type]
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=num_workers, **kwargs)
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, **kwargs)


def cli(run: Callable[..., Any], description: str, name: str) -> None:
    """``python examples/<scenario>.py [--report-dir DIR] [--quiet]``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--report-dir", default=None, help=f"where report.json goes (default runs/{name})")
    parser.add_argument("--quiet", action="store_true", help="print nothing (the report is still written)")
    args = parser.parse_args()
    kwargs: dict[str, Any] = {"console": not args.quiet}
    if args.report_dir:
        kwargs["report_dir"] = args.report_dir
    run(**kwargs)  # StallScope prints where the report went
