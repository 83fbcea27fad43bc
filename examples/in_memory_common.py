"""The in-memory scenarios' shared loop: a ``TensorDataset`` already in memory, a small model.

The most common small-data set-up: ``DataLoader(TensorDataset(X, Y), batch_size=64,
shuffle=True, num_workers=N)``. Making a batch is a few microseconds of indexing per sample, so
handing batches over from worker processes costs more than it hides, and indexing once per batch
instead of once per sample is the cheaper way to load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from common import CLASSES, FEATURES, Trainer, emulate_accelerator
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from stallscope import Report, StallScope

#: quick settings for tests: two passes of 200 batches
SMALL = {"epochs": 2, "rows": 64 * 200}


def make_loader(
    rows: int, *, batch_size: int, num_workers: int, batch_sampler: bool, **loader_kwargs: Any
) -> DataLoader[Any]:
    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(
        torch.randn(rows, FEATURES, generator=gen), torch.randint(0, CLASSES, (rows,), generator=gen)
    )
    if num_workers == 0:
        loader_kwargs.pop("prefetch_factor", None)
        loader_kwargs.pop("persistent_workers", None)
    if batch_sampler:
        # one index per batch: the dataset is indexed with a list of batch_size indices at once
        sampler = BatchSampler(RandomSampler(dataset), batch_size=batch_size, drop_last=False)
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=num_workers, **loader_kwargs)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers, **loader_kwargs)


def run(
    *,
    report_dir: str,
    console: Any = True,
    epochs: int = 3,
    rows: int = 20_000,
    batch_size: int = 64,
    num_workers: int = 0,
    batch_sampler: bool = False,
    **loader_kwargs: Any,
) -> Report | None:
    emulate_accelerator()
    data = make_loader(
        rows, batch_size=batch_size, num_workers=num_workers, batch_sampler=batch_sampler, **loader_kwargs
    )
    trainer = Trainer()
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    trainer.step(batch)
    return scope.report


def apply_suggestion(suggestion: Mapping[str, Any]) -> dict[str, Any]:
    """The ``run()`` settings that apply a suggestion of ``data.workers`` or ``data.batch_indexing``."""
    settings: dict[str, Any] = {}
    for key, value in suggestion.items():
        if key == "batch_sampler":
            settings["batch_sampler"] = bool(value)
        elif key in ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory"):
            settings[key] = value
        elif key != "non_blocking":
            raise ValueError(f"the in-memory scenarios cannot apply {key!r}")
    return settings
