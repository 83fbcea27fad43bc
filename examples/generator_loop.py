"""Planted bottleneck: a generator that builds whole batches in the training process.

``make_batches`` yields ready ``(x, y)`` batches, each costing ~10 ms of CPU (decoding,
augmenting); the loop iterates it with ``scope.iter`` and the model waits for every batch. It is
not a Dataset of samples, so the fix is an ``IterableDataset`` yielding those batches, read by
``DataLoader(ds, batch_size=None, num_workers=N)``, each worker making its share of them.
Expected top finding: ``data.workers``.

    python examples/generator_loop.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import CLASSES, FEATURES, Trainer, burn_cpu, cli, emulate_accelerator  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "generator_loop"
EXPECTED = "data.workers"
SMALL = {"epochs": 1, "batches": 24}


def make_batches(
    batches: int, batch_size: int, cpu_ms: float, *, worker: int = 0, workers: int = 1
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Ready batches, ``cpu_ms`` of CPU work each: of ``batches`` in all, every ``workers``-th one
    from the ``worker``-th (each batch seeded by its index, so the shards add up to the whole)."""
    for i in range(worker, batches, workers):
        gen = torch.Generator().manual_seed(i)
        burn_cpu(cpu_ms / 1e3)
        yield torch.randn(batch_size, FEATURES, generator=gen), torch.randint(0, CLASSES, (batch_size,), generator=gen)


class Batches(IterableDataset[tuple[torch.Tensor, ...]]):
    """The fix: the same batches from DataLoader workers, worker ``k`` of ``n`` making only every
    ``n``-th one (without that, each worker would make and yield all of them)."""

    def __init__(self, batches: int, batch_size: int, cpu_ms: float) -> None:
        self.args = (batches, batch_size, cpu_ms)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        info = get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from make_batches(*self.args, worker=k, workers=n)


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 100,
    num_workers: int = 0,
    batch_size: int = 16,
    cpu_ms_per_batch: float = 10.0,
) -> Report | None:
    """``num_workers`` (the suggestion's key): 0 iterates the generator itself; more reads the
    same batches through ``DataLoader(Batches(...), batch_size=None, num_workers=num_workers)``."""
    emulate_accelerator()
    trainer = Trainer()
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            if num_workers == 0:
                source: Any = make_batches(batches, batch_size, cpu_ms_per_batch)
            else:
                source = DataLoader(
                    Batches(batches, batch_size, cpu_ms_per_batch), batch_size=None, num_workers=num_workers
                )
            for batch in scope.iter(source):
                with scope.phase("compute"):
                    trainer.step(batch, repeat=4)
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
