"""DataLoader introspection: in-memory datasets, per-sample indexing, the in-process probe."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

from stallscope.hooks.environment import batch_bytes
from stallscope.signals import loader as loader_module
from stallscope.signals.loader import REREAD_EVERY, LoaderReader, inspect_loader, probe_batch_s


def tensor_dataset(rows: int = 640) -> TensorDataset:
    return TensorDataset(torch.randn(rows, 8), torch.randint(0, 3, (rows,)))


class RowsOfTensors(Dataset[Any]):
    """A dataset of its own class whose items are rows of its tensors."""

    def __init__(self, rows: int = 640) -> None:
        self.x = torch.randn(rows, 8)
        self.y = torch.zeros(rows)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("inspection and probing must not call the user's __getitem__")


class Batched(RowsOfTensors):
    def __getitems__(self, indices: list[int]) -> Any:
        return [(self.x[i], self.y[i]) for i in indices]


class Files(Dataset[Any]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("not called")


def test_a_tensor_dataset_indexed_per_sample() -> None:
    cfg = inspect_loader(DataLoader(tensor_dataset(), batch_size=64, shuffle=True))
    assert cfg is not None
    assert cfg.in_memory == "TensorDataset"
    assert cfg.per_sample_indexing
    assert cfg.shuffle is True
    assert cfg.to_dict()["batch_size"] == 64  # the report's fields are unchanged


def test_the_sampler_and_its_order_are_read() -> None:
    """A DistributedSampler's order is its ``shuffle``; another sampler's is not known."""
    from torch.utils.data import DistributedSampler, WeightedRandomSampler

    ds = tensor_dataset()
    for shuffle in (True, False):
        sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=shuffle)
        cfg = inspect_loader(DataLoader(ds, sampler=sampler, batch_size=64))
        assert cfg is not None
        assert (cfg.sampler, cfg.shuffle) == ("DistributedSampler", shuffle)
    weighted = inspect_loader(DataLoader(ds, sampler=WeightedRandomSampler([1.0] * len(ds), len(ds)), batch_size=64))
    assert weighted is not None
    assert (weighted.sampler, weighted.shuffle) == ("WeightedRandomSampler", None)
    ordered = inspect_loader(DataLoader(ds, batch_size=64))
    assert ordered is not None
    assert (ordered.sampler, ordered.shuffle) == ("SequentialSampler", False)


def test_a_loader_made_from_a_batch_sampler_is_read_through_it() -> None:
    """Accelerate's DataLoaderShard is made from a batch sampler: its ``sampler`` is a placeholder
    SequentialSampler, and the order is that of the sampler inside; a RandomSampler's subclass
    (Accelerate's SeedableRandomSampler) is a RandomSampler."""
    from accelerate.data_loader import prepare_data_loader

    ds = tensor_dataset()
    shard = prepare_data_loader(DataLoader(ds, batch_size=8, shuffle=True), num_processes=2, process_index=0)
    cfg = inspect_loader(shard)
    assert cfg is not None
    assert (cfg.sampler, cfg.shuffle) == ("RandomSampler", True)


def test_a_collate_fn_of_the_users_is_named() -> None:
    ds = tensor_dataset()

    def pad_batch(samples: list[object]) -> object:
        return samples

    class Collator:
        def __call__(self, samples: list[object]) -> object:
            return samples

    assert inspect_loader(DataLoader(ds, batch_size=4)).collate is None  # type: ignore[union-attr]
    named = inspect_loader(DataLoader(ds, batch_size=4, collate_fn=pad_batch))
    assert named is not None
    assert named.collate is not None
    assert named.collate.endswith("pad_batch")
    made = inspect_loader(DataLoader(ds, batch_size=4, collate_fn=Collator()))
    assert made is not None
    assert made.collate is not None
    assert made.collate.endswith("Collator")
    partial = inspect_loader(DataLoader(ds, batch_size=4, collate_fn=functools.partial(pad_batch)))
    assert partial is not None
    assert partial.collate is not None
    assert partial.collate.endswith("pad_batch")
    # a transformers Trainer always sets a collator of its own: that is no user's
    from transformers import default_data_collator
    from transformers.trainer_utils import RemoveColumnsCollator

    trainers = inspect_loader(DataLoader(ds, batch_size=4, collate_fn=default_data_collator))
    assert trainers is not None
    assert trainers.collate is None
    wrapped = RemoveColumnsCollator(pad_batch, signature_columns=["x"])
    assert inspect_loader(DataLoader(ds, batch_size=4, collate_fn=wrapped)).collate.endswith("pad_batch")  # type: ignore[union-attr]


def test_a_batch_sampler_as_sampler_indexes_once_per_batch() -> None:
    ds = tensor_dataset()
    cfg = inspect_loader(DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), 64, False), batch_size=None))
    assert cfg is not None
    assert cfg.in_memory == "TensorDataset"
    assert not cfg.per_sample_indexing


def test_datasets_of_their_own_class() -> None:
    rows = inspect_loader(DataLoader(RowsOfTensors(), batch_size=64))
    batched = inspect_loader(DataLoader(Batched(), batch_size=64))
    files = inspect_loader(DataLoader(Files(), batch_size=4))
    assert rows is not None
    assert batched is not None
    assert files is not None
    assert (rows.in_memory, rows.per_sample_indexing) == ("tensors", True)
    assert (batched.in_memory, batched.per_sample_indexing) == ("tensors", False)  # __getitems__
    assert (files.in_memory, files.per_sample_indexing) == (None, False)


def test_the_probe_times_a_tensor_dataset_only() -> None:
    seconds = probe_batch_s(DataLoader(tensor_dataset(), batch_size=64, num_workers=0))
    assert seconds is not None
    assert 0 < seconds < 1.0
    assert probe_batch_s(DataLoader(RowsOfTensors(), batch_size=64)) is None  # user code: not run
    assert probe_batch_s(DataLoader(tensor_dataset(), batch_size=64, collate_fn=lambda b: b)) is None
    assert probe_batch_s(DataLoader(tensor_dataset(rows=64), batch_size=64)) is None  # one batch only


def test_the_probe_leaves_the_users_random_numbers_alone() -> None:
    """A seeded run draws the same numbers with the probe as without it."""
    loader = DataLoader(tensor_dataset(), batch_size=64, num_workers=0)
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    assert probe_batch_s(loader) is not None
    assert torch.equal(torch.rand(4), expected)


def test_batch_bytes_counts_nested_tensors() -> None:
    batch = (torch.zeros(64, 8), {"y": torch.zeros(64, dtype=torch.int64), "name": "x"})
    assert batch_bytes(batch) == 64 * 8 * 4 + 64 * 8
    assert batch_bytes(["no tensors"]) is None


def test_the_probe_takes_the_fastest_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other processes only ever slow a batch down: one slowed by a busy moment (9 ms here) must
    not stand for the batch's own cost (1 ms)."""
    durations = [0.004, 0.001, 0.009, 0.009, 0.002, 0.009, 0.003, 0.009]
    readings = iter([t for i, d in enumerate(durations) for t in (10.0 * i, 10.0 * i + d)])
    monkeypatch.setattr(loader_module.time, "perf_counter", lambda: next(readings))
    seconds = probe_batch_s(DataLoader(tensor_dataset(), batch_size=64, num_workers=0))
    assert seconds == pytest.approx(0.001)


def test_a_loader_is_read_once_until_its_changeable_settings_change() -> None:
    """``LoaderReader``: the same DataLoader again is not read again (its reading comes back, not
    fresh); new ``num_workers`` / ``pin_memory`` / ``prefetch_factor`` values, or another loader,
    are; ``forget`` drops the loader."""
    data = TensorDataset(torch.randn(8, 2))
    loader = DataLoader(data, batch_size=4)
    reader = LoaderReader()
    first, fresh = reader.read(loader)
    assert fresh
    assert first is not None
    assert first.num_workers == 0
    again, fresh = reader.read(loader)
    assert again is first
    assert not fresh
    loader.num_workers, loader.prefetch_factor = 2, 4
    changed, fresh = reader.read(loader)
    assert fresh
    assert changed is not None
    assert (changed.num_workers, changed.prefetch_factor) == (2, 4)
    other = DataLoader(data, batch_size=2)
    read, fresh = reader.read(other)
    assert fresh
    assert read is not None
    assert read.batch_size == 2
    plain, fresh = reader.read([1, 2, 3])
    assert plain is None
    assert fresh
    reader.forget()
    _, fresh = reader.read(other)
    assert fresh
    # what the settings do not show (a batch sampler's batch size) is read again every 16 passes
    again = [reader.read(other)[1] for _ in range(2 * REREAD_EVERY)]
    assert again == ([False] * (REREAD_EVERY - 1) + [True]) * 2


def test_a_loader_of_another_kind_may_not_take_persistent_workers() -> None:
    class Batches:  # a loader of its own, with workers of its own, and no persistent_workers
        num_workers = 0
        batch_size = 8

        def __iter__(self) -> Iterator[int]:
            return iter(())

    torch_loader = inspect_loader(DataLoader(tensor_dataset(), batch_size=64))
    other = inspect_loader(Batches())
    assert torch_loader is not None
    assert torch_loader.takes_persistent
    assert other is not None
    assert not other.takes_persistent
