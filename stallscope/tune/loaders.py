"""A DataLoader rebuilt with a trial's settings (``num_workers``, ``pin_memory``, ...).

A DataLoader cannot change its settings once made, so the trial makes a new one over the same
dataset, sampler and collate function, with the settings changed. ``LOADER_KEYS`` are the keys it
can apply; a suggestion with any other key is not the loader's to apply.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

#: the suggestion keys a rebuilt DataLoader applies
LOADER_KEYS = frozenset({"num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_sampler"})


def is_loader(obj: object) -> bool:
    """``obj`` is a ``torch.utils.data.DataLoader`` (torch imported only when the user did)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(obj, torch.utils.data.DataLoader)


def rebuild(loader: Any, settings: Mapping[str, Any]) -> Any:
    """A DataLoader like ``loader`` with the loader keys of ``settings`` applied. Returns ``loader``
    itself when no key changes anything; raises ``ValueError`` when a setting cannot be applied to
    this loader (``batch_sampler`` with a collate function of the user's)."""
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset
    from torch.utils.data._utils.collate import default_collate

    keys = {k: v for k, v in settings.items() if k in LOADER_KEYS}
    if not keys:
        return loader
    workers = int(keys.get("num_workers", loader.num_workers))
    if workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {workers!r}")
    kwargs: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": bool(keys.get("pin_memory", loader.pin_memory)),
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
    }
    if getattr(loader, "pin_memory_device", ""):
        kwargs["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if workers > 0:
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
        prefetch = keys.get("prefetch_factor", loader.prefetch_factor)
        kwargs["prefetch_factor"] = 2 if prefetch is None else int(prefetch)
        kwargs["persistent_workers"] = bool(keys.get("persistent_workers", loader.persistent_workers))
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last, collate_fn=loader.collate_fn)
    elif keys.get("batch_sampler") and loader.batch_size is not None:
        if loader.collate_fn is not default_collate:
            raise ValueError("batch_sampler: the loader has its own collate_fn, which takes samples, not batches")
        # one index per batch: dataset[list of indices] makes the whole batch (data.batch_indexing)
        kwargs["sampler"] = BatchSampler(loader.sampler, loader.batch_size, drop_last=loader.drop_last)
        kwargs["batch_size"] = None
    elif loader.batch_size is not None:
        kwargs.update(
            sampler=loader.sampler,
            batch_size=loader.batch_size,
            drop_last=loader.drop_last,
            collate_fn=loader.collate_fn,
        )
    elif loader.batch_sampler is not None:
        kwargs.update(batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn)
    else:
        kwargs.update(sampler=loader.sampler, batch_size=None, collate_fn=loader.collate_fn)
    return DataLoader(dataset, **kwargs)
