"""The unit of advice: one finding (SPEC §3 ``findings[]``, ids of SPEC §4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Confidence = Literal["high", "medium", "low"]

#: what ``est_speedup`` is (SPEC §3): the model's best guess, or a floor the fix should reach
SpeedupBound = Literal["estimate", "lower"]
SPEEDUP_BOUNDS: tuple[str, ...] = ("estimate", "lower")

#: Every finding id of SPEC §4. Rules may only emit these.
FINDING_IDS: frozenset[str] = frozenset(
    {
        "data.workers",
        "data.batch_indexing",
        "data.pin_memory",
        "data.prefetch",
        "data.persistent_workers",
        "data.cpu_bound",
        "data.io_bound",
        "checkpoint.frequency",
        "logging.frequency",
        "validation.frequency",
        "host.sync",
        "host.overhead",
        "compute.amp",
        "compute.batch_size",
        "gpu.throttle",
        "host.memory",
        "dist.straggler",
        "dist.dataparallel",
    }
)


@dataclass(frozen=True)
class Finding:
    """A diagnosed cause of idle time and the change that recovers it."""

    #: stable id from SPEC §4, e.g. ``data.workers``
    id: str
    #: one line naming the problem with its number, e.g. "Training waits for data 62% of the time"
    title: str
    #: fraction of wall time the fix would recover, in [0, 1]
    est_saving_fraction: float
    #: predicted throughput ratio after the fix (1.0 = no gain)
    est_speedup: float
    #: how much the prediction can be trusted
    confidence: Confidence
    #: the measurements the estimate was made from (JSON scalars)
    evidence: Mapping[str, Any]
    #: the fix in one sentence, naming the parameter and the value
    fix: str
    #: the exact setting the prediction assumes (SPEC §3), ``{}`` when there is nothing to set
    suggestion: Mapping[str, Any] = field(default_factory=dict)
    #: a code snippet that applies the fix
    snippet: str = ""
    #: ``"lower"`` when the fix only removes work, so ``est_speedup`` is a floor (removing it may
    #: also speed up the steps around it, which the model does not count); else ``"estimate"``
    est_speedup_bound: SpeedupBound = "estimate"

    def __post_init__(self) -> None:
        if self.id not in FINDING_IDS:
            raise ValueError(f"unknown finding id {self.id!r}")
        if not 0.0 <= self.est_saving_fraction <= 1.0:
            raise ValueError(f"est_saving_fraction must be in [0, 1], got {self.est_saving_fraction!r}")
        if self.est_speedup_bound not in SPEEDUP_BOUNDS:
            raise ValueError(f"est_speedup_bound must be one of {SPEEDUP_BOUNDS}, got {self.est_speedup_bound!r}")


def speedup_for(saving_fraction: float) -> float:
    """Throughput ratio after recovering ``saving_fraction`` of the wall time."""
    saving_fraction = min(max(saving_fraction, 0.0), 0.99)
    return 1.0 / (1.0 - saving_fraction)
