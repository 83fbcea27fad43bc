"""DataLoader introspection: the settings the data rules reason about.

Everything here runs once per pass over a loader (at ``iter()``), never per step. It reads
attributes and calls no code of the user's dataset, except ``probe_batch_s``, which builds one
batch of a ``torch.utils.data.TensorDataset`` (pure indexing) in this process to time it.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

#: what the dataset holds: ``TensorDataset`` (torch's), ``tensors`` (a map-style dataset whose
#: attributes hold tensors with one row per sample), None (anything else, or not known)
InMemory = Literal["TensorDataset", "tensors"]

#: the probe times batches of at most this many bytes (a bigger batch is not worth copying twice)
PROBE_MAX_BYTES = 64 * 2**20


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
    #: whether the dataset already sits in memory as tensors (see ``InMemory``)
    in_memory: InMemory | None = None
    #: the loader calls ``dataset[i]`` once per sample and collates the samples (automatic
    #: batching over single indices, and no ``__getitems__`` on the dataset)
    per_sample_indexing: bool = False
    #: the sampler draws in random order (``shuffle=True``, or a ``DistributedSampler`` that
    #: shuffles); None when not known
    shuffle: bool | None = None
    #: the sampler's class name (``RandomSampler``, ``DistributedSampler``, ...); None when the
    #: loader has none
    sampler: str | None = None
    #: the name of the loader's own ``collate_fn``; None for torch's default ones (or none)
    collate: str | None = None
    drop_last: bool = False
    #: the loader has a ``persistent_workers`` setting (a torch ``DataLoader``, not every loader
    #: with a ``num_workers``)
    takes_persistent: bool = True

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
    if batch_size is None and type(iterable).__module__.startswith("accelerate."):
        # Accelerate's DataLoaderShard is made from the loader's batch sampler: its batch size is there
        batch_size = getattr(getattr(iterable, "batch_sampler", None), "batch_size", None)
    dataset = getattr(iterable, "dataset", None)
    in_memory = _in_memory(dataset)
    batched = getattr(iterable, "batch_sampler", None) is not None
    sampler = _real_sampler(iterable)
    sampler_kind = None if sampler is None else _sampler_kind(sampler)
    shuffle = _shuffles(sampler, sampler_kind)
    return LoaderConfig(
        num_workers=workers,
        pin_memory=bool(getattr(iterable, "pin_memory", False)),
        prefetch_factor=prefetch if isinstance(prefetch, int) and workers > 0 else (2 if workers > 0 else None),
        persistent_workers=bool(getattr(iterable, "persistent_workers", False)),
        batch_size=batch_size if isinstance(batch_size, int) and not isinstance(batch_size, bool) else None,
        kind=type(iterable).__name__,
        in_memory=in_memory,
        per_sample_indexing=in_memory is not None and batched and not getattr(dataset, "__getitems__", None),
        shuffle=shuffle,
        sampler=sampler_kind,
        collate=_own_collate(getattr(iterable, "collate_fn", None)),
        drop_last=bool(getattr(iterable, "drop_last", False)),
        takes_persistent=hasattr(iterable, "persistent_workers"),
    )


def _own_collate(collate: object) -> str | None:
    """The name of a ``collate_fn`` of the user's (a function, or an object's class), None for
    torch's ``default_collate`` and ``default_convert`` or none."""
    if collate is None:
        return None
    func = getattr(collate, "func", None)  # a functools.partial: the function it calls
    if isinstance(collate, functools.partial) and func is not None:
        return _own_collate(func)
    module = getattr(collate, "__module__", "") or ""
    if module.startswith("transformers."):
        # the Trainer's own collators (RemoveColumnsCollator wraps the one it was given)
        inner = getattr(collate, "data_collator", None)
        return _own_collate(inner) if inner is not None and inner is not collate else None
    if module.startswith("torch.utils.data"):
        return None
    name = getattr(collate, "__qualname__", None) or type(collate).__qualname__
    return str(name)[:80]


#: the samplers whose order is known, by class name (a subclass counts as its base: Accelerate's
#: ``SeedableRandomSampler`` is a ``RandomSampler``)
_KNOWN_SAMPLERS = ("DistributedSampler", "RandomSampler", "SequentialSampler")


def _real_sampler(iterable: object) -> object:
    """The sampler the loader's indices come from: a loader made from a ``batch_sampler``
    (Accelerate's ``DataLoaderShard`` always is) has a placeholder ``SequentialSampler`` as its
    ``sampler``, so the batch samplers are followed down (``BatchSamplerShard.batch_sampler``,
    then ``BatchSampler.sampler``)."""
    batch = getattr(iterable, "batch_sampler", None)
    for _ in range(4):
        inner = getattr(batch, "batch_sampler", None)
        if inner is None:
            break
        batch = inner
    found = getattr(batch, "sampler", None)
    return found if found is not None else getattr(iterable, "sampler", None)


def _sampler_kind(sampler: object) -> str:
    """A known sampler's name where the sampler is one or a subclass of one, else its own."""
    for cls in type(sampler).__mro__:
        if cls.__name__ in _KNOWN_SAMPLERS:
            return cls.__name__
    return type(sampler).__name__


def _shuffles(sampler: object, kind: str | None) -> bool | None:
    """Whether ``sampler`` draws in random order: a ``RandomSampler`` does, a ``SequentialSampler``
    does not, a ``DistributedSampler`` as its ``shuffle`` says; None for any other."""
    if kind == "RandomSampler":
        return True
    if kind == "SequentialSampler":
        return False
    if kind == "DistributedSampler":
        shuffle = getattr(sampler, "shuffle", None)
        return shuffle if isinstance(shuffle, bool) else None
    return None


#: a loader read from ``LoaderReader``'s memory is read anew at every this many passes: what its
#: changeable settings do not show (a batch sampler's batch size, a dataset whose samples grow)
#: is then at most this many passes old
REREAD_EVERY = 16


class LoaderReader:
    """``inspect_loader`` once per loader: a pass over the same iterable as the last one, with the
    same changeable settings (``num_workers``, ``pin_memory``, ``prefetch_factor``; a
    ``DataLoader`` refuses new values of the others once made), reuses the last reading, except
    at every ``REREAD_EVERY``-th pass. Many short epochs over one loader then read it (and count
    its first batch) once in 16. Holds the last iterable until ``forget``."""

    __slots__ = ("_last", "_reused")

    def __init__(self) -> None:
        self._last: tuple[object, tuple[object, ...], LoaderConfig | None] | None = None
        self._reused = 0

    def read(self, iterable: object) -> tuple[LoaderConfig | None, bool]:
        """The loader's settings, and whether they were read anew (a new iterable, new settings,
        or the periodic re-read: its first batch is worth looking at again)."""
        settings = (
            getattr(iterable, "num_workers", None),
            getattr(iterable, "pin_memory", None),
            getattr(iterable, "prefetch_factor", None),
        )
        last = self._last
        if last is not None and last[0] is iterable and last[1] == settings and self._reused < REREAD_EVERY - 1:
            self._reused += 1
            return last[2], False
        loader = inspect_loader(iterable)
        self._last = (iterable, settings, loader)
        self._reused = 0
        return loader, True

    def forget(self) -> None:
        """Drop the last iterable (the run is over: the user's loader is not held)."""
        self._last = None


def _in_memory(dataset: object) -> InMemory | None:
    """Whether a loader's dataset holds its samples as rows of in-memory tensors."""
    torch: Any = sys.modules.get("torch")
    if torch is None or dataset is None:
        return None
    data = torch.utils.data
    if isinstance(dataset, data.TensorDataset):
        return "TensorDataset"
    if not isinstance(dataset, data.Dataset) or isinstance(dataset, data.IterableDataset):
        return None
    try:
        rows = len(dataset)
        fields = vars(dataset).values()
    except Exception:
        return None
    for value in fields:
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows and rows > 0:
            return "tensors"
    return None


def probe_batch_s(iterable: object, *, repeats: int = 8) -> float | None:
    """Seconds this process takes for one ``next()`` of the loader's ``TensorDataset`` without
    workers (one ``dataset[i]`` per sample, then ``default_collate``), the fastest of ``repeats``
    after a first one (other work on the machine only adds to a batch's time: the fastest is the
    batch's own cost); None for any other loader, where building a batch would run user code.

    With worker processes this is what a batch would cost without them: the loop model compares
    it with the hand-over. It goes through a ``DataLoader`` of its own, so the loader's own
    per-batch machinery (sampler, fetcher) is in the figure.
    """
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    data = torch.utils.data
    dataset = getattr(iterable, "dataset", None)
    batch_size = getattr(iterable, "batch_size", None)
    if not isinstance(dataset, data.TensorDataset) or type(dataset).__getitem__ is not data.TensorDataset.__getitem__:
        return None
    if getattr(iterable, "collate_fn", None) is not data.default_collate:
        return None
    if not isinstance(batch_size, int) or batch_size < 1:
        return None
    batches = min(repeats + 1, len(dataset) // batch_size)
    row_bytes = sum(t[0].numel() * t.element_size() for t in dataset.tensors)
    if batches < 2 or row_bytes * batch_size > PROBE_MAX_BYTES:
        return None
    # a generator of its own: a DataLoader's iterator draws its base seed from one, and the
    # global one is the user's (a draw from it would change the run's later random numbers)
    it = iter(data.DataLoader(dataset, batch_size=batch_size, num_workers=0, generator=torch.Generator()))
    next(it)  # the first one warms up
    times = []
    for _ in range(batches - 1):
        start = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass(frozen=True)
class StartSummary:
    """The validation loader's start-ups measured so far: from the start of a validation run to
    its first hook (``setup_data`` and ``iter()``: the workers spawned, Lightning's evaluation
    loop)."""

    #: validation runs measured (the sanity check's included) and their start-ups' total, ns
    runs: int
    total_ns: int

    @property
    def each_s(self) -> float:
        return self.total_ns / self.runs / 1e9 if self.runs else 0.0


class StartMeter:
    """Times each validation run's start-up: ``begin`` when the run starts, ``started`` at its
    first hook (an unmatched ``started`` is ignored). Two clock reads per validation run."""

    __slots__ = ("_clock", "_begun", "_runs", "_total_ns")

    def __init__(self, *, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock
        self._begun: int | None = None
        self._runs = 0
        self._total_ns = 0

    def begin(self) -> None:
        self._begun = self._clock()

    def started(self) -> None:
        begun, self._begun = self._begun, None
        if begun is not None:
            self._runs += 1
            self._total_ns += max(0, self._clock() - begun)

    def summary(self) -> StartSummary | None:
        """The start-ups so far; None before the first."""
        return StartSummary(self._runs, self._total_ns) if self._runs else None
