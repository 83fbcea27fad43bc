"""DataLoader introspection: the settings the data rules reason about."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoaderConfig:
    """The settings of the loader a pass iterates over (SPEC §3 ``run.dataloader``)."""

    #: worker processes; 0 = batches are made in the training process
    num_workers: int
    pin_memory: bool
    #: batches each worker loads ahead; None when ``num_workers == 0``
    prefetch_factor: int | None
    persistent_workers: bool
    #: None when the loader uses a batch sampler or yields unbatched items
    batch_size: int | None
    #: the loader's class name, for the report's notes
    kind: str = "DataLoader"

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "prefetch_factor": self.prefetch_factor,
            "persistent_workers": self.persistent_workers,
            "batch_size": self.batch_size,
        }


def inspect_loader(iterable: object) -> LoaderConfig | None:
    """Read the settings of a ``torch.utils.data.DataLoader`` (or a look-alike); None otherwise.

    Duck-typed on ``num_workers`` so that wrappers exposing the same attributes work too; torch is
    not imported here.
    """
    workers = getattr(iterable, "num_workers", None)
    if not isinstance(workers, int) or isinstance(workers, bool):
        return None
    prefetch = getattr(iterable, "prefetch_factor", None)
    batch_size = getattr(iterable, "batch_size", None)
    return LoaderConfig(
        num_workers=workers,
        pin_memory=bool(getattr(iterable, "pin_memory", False)),
        prefetch_factor=prefetch if isinstance(prefetch, int) and workers > 0 else (2 if workers > 0 else None),
        persistent_workers=bool(getattr(iterable, "persistent_workers", False)),
        batch_size=batch_size if isinstance(batch_size, int) and not isinstance(batch_size, bool) else None,
        kind=type(iterable).__name__,
    )
