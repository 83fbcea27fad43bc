"""How much faster a candidate ran than its baseline, from interleaved pairs (pure).

Each round runs the baseline and the candidates once, one after the other, so a pair (baseline,
candidate) of one round saw about the same machine: a host busy with other work slows both. The
realized speedup of a pair is the candidate's throughput over the baseline's; over the rounds, the
speedup's interval is a Student-t interval on the mean of the pairs' log ratios (90% two-sided by
default), and its middle value the median ratio.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

#: Student's t, 95th percentile (a 90% two-sided interval), by degrees of freedom
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812}
_T95_LARGE = ((12, 1.782), (15, 1.753), (20, 1.725), (30, 1.697))

Decision = Literal["keep", "drop", "undecided"]


def t95(df: int) -> float:
    """The 95th percentile of Student's t with ``df`` degrees of freedom (``df`` >= 1)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df!r}")
    if df in _T95:
        return _T95[df]
    for limit, value in _T95_LARGE:
        if df <= limit:
            return value
    return 1.645


@dataclass(frozen=True)
class Speedup:
    """A realized speedup: candidate throughput over baseline throughput, over ``pairs`` pairs."""

    #: the median of the pairs' ratios
    median: float
    #: the interval's ends (equal to the median with a single pair: no interval)
    low: float
    high: float
    pairs: int

    @property
    def width(self) -> float:
        """How wide the interval is, as a ratio (``high / low``; 1.0 when exact)."""
        return self.high / self.low if self.low > 0 else math.inf

    def to_json(self) -> dict[str, float | int]:
        return {"median": self.median, "low": self.low, "high": self.high, "pairs": self.pairs}


def paired_speedup(pairs: Sequence[tuple[float, float]]) -> Speedup:
    """The speedup of ``(baseline, candidate)`` throughput pairs (steps per second, > 0)."""
    if not pairs:
        raise ValueError("no pairs")
    logs = []
    for base, cand in pairs:
        if not (base > 0 and cand > 0):
            raise ValueError(f"throughputs must be > 0, got {(base, cand)!r}")
        logs.append(math.log(cand / base))
    median = math.exp(statistics.median(logs))
    if len(logs) < 2:
        return Speedup(median, median, median, 1)
    mean = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Speedup(median, math.exp(mean - half), math.exp(mean + half), len(logs))


def decide(speedup: Speedup, min_saving: float) -> Decision:
    """``keep`` when the whole interval is above ``1 + min_saving``, ``drop`` when the whole
    interval is below it (the change cannot be worth it), else ``undecided``."""
    threshold = 1.0 + min_saving
    if speedup.pairs < 2:
        return "undecided"
    if speedup.low > threshold:
        return "keep"
    if speedup.high < threshold:
        return "drop"
    return "undecided"
