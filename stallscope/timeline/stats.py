"""Immutable summaries of a span of the timeline (one epoch, or the whole run)."""

from __future__ import annotations

import math
import operator
import os
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

try:  # the C module's twin of ``Distribution.of`` for the recorder's arrays (``_native.c``)
    from stallscope.timeline import _native
except ImportError:  # not built: the Python code alone
    _native = None  # type: ignore[assignment]
#: ``_native.order_stats``, None where the C module is not built, is from an older checkout, or
#: is turned off (``STALLSCOPE_NO_NATIVE``, as recorder.py's hot path)
_order_stats = None if os.environ.get("STALLSCOPE_NO_NATIVE") else getattr(_native, "order_stats", None)
#: ``report.build.summarize``'s numbers of an epoch's snapshot in C (``_native.summary_numbers``)
native_summary_numbers = None if os.environ.get("STALLSCOPE_NO_NATIVE") else getattr(_native, "summary_numbers", None)
#: a list of ints as JSON text in C (``_native.json_ints``), for ``report.io.report_json``
native_json_ints = None if os.environ.get("STALLSCOPE_NO_NATIVE") else getattr(_native, "json_ints", None)


@dataclass(frozen=True)
class Distribution:
    """Order statistics of per-step durations, in seconds, over the recent-steps window."""

    #: number of steps the statistics were computed from (at most the window size)
    n: int
    mean: float
    p10: float
    p50: float
    p90: float
    max: float

    @classmethod
    def of(cls, values_ns: Sequence[int]) -> Distribution:
        """Summarise ``values_ns`` (nanoseconds); an empty sequence gives all zeros."""
        if not values_ns:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        if _order_stats is not None and type(values_ns) is array and values_ns.typecode == "q":
            numbers = _order_stats(values_ns)  # the same numbers, without an int object a value
            if numbers is not None:
                return cls(*numbers)
        ordered = sorted(values_ns)
        n = len(ordered)
        # positional, and ``quantile``'s arithmetic inline: an epoch's report makes two of these
        last = n - 1
        qs = []
        for q in (0.10, 0.50, 0.90):
            pos = last * q
            lo = math.floor(pos)
            hi = lo + 1 if lo < last else last
            qs.append((ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)) / 1e9)
        return cls(n, sum(ordered) / n / 1e9, qs[0], qs[1], qs[2], ordered[-1] / 1e9)


def quantile(ordered: Sequence[int], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty sequence."""
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class EpochBoundary:
    """Start-up and tear-down cost of one pass over the loader."""

    #: epoch index, from 0
    index: int
    #: time in ``iter(loader)`` (worker start-up), ns
    iter_ns: int
    #: wait for the epoch's first batch, ns
    first_wait_ns: int
    #: the final ``next()`` that ended the epoch (worker shutdown), ns
    last_wait_ns: int


@dataclass(frozen=True)
class IdleWindow:
    """One window of consecutive steps: the unit the CI gate compares runs with."""

    #: steps in this window
    steps: int
    #: wall time of those steps, ns
    wall_ns: int
    #: time the accelerator was busy during them, ns (host_phases: the compute phase)
    busy_ns: int

    @property
    def idle_fraction(self) -> float:
        if self.wall_ns <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.busy_ns / self.wall_ns))


@dataclass(frozen=True)
class RecentSteps:
    """The span's recent steps one by one, oldest first (at most the recent-steps window): what
    the scatter of step times and the steps around a save are read from."""

    #: each step's wall time, ns
    duration_ns: Sequence[int]
    #: its wait for the batch, ns
    wait_ns: Sequence[int]
    #: its time in the compute phase, ns
    compute_ns: Sequence[int]
    #: the phases entered in it: bit ``i`` for phase id ``i`` (``timeline.phases.BUILTIN_PHASES``
    #: order for the built-in ones)
    kinds: Sequence[int]

    def __len__(self) -> int:
        return len(self.duration_ns)

    @cached_property
    def work_ns(self) -> list[int]:
        """Each step's own work, ns: its wall time less its wait for data (a loader's wobble is the
        data rules' evidence, not the step's). Made once: the scatter check and the frequency
        rules both read it."""
        if len(self.duration_ns) != len(self.wait_ns):
            raise ValueError("duration_ns and wait_ns differ in length")
        # at C speed (a run's report reads up to 4,096 steps): a wait is part of its step, so the
        # clamp at 0 is needed only where a step's record is off
        work = list(map(operator.sub, self.duration_ns, self.wait_ns))
        if work and min(work) < 0:
            work = [w if w > 0 else 0 for w in work]
        return work


@dataclass(frozen=True)
class SpanStats:
    """Everything measured over one span of a run: an epoch, or the run so far.

    Phase times partition the span's wall time exactly: every nanosecond belongs to one phase.
    """

    #: wall time of the span, ns
    wall_ns: int
    #: completed steps (items yielded by ``scope.iter``)
    steps: int
    #: passes over a loader started in the span
    epochs: int
    #: total time per phase, ns; always holds every built-in phase, custom ones when used
    phase_ns: Mapping[str, int]
    #: how many times each phase was entered (``data``: one per ``next()``)
    phase_counts: Mapping[str, int]
    #: sum of the completed steps' wall times, ns (time between epochs is in no step)
    step_total_ns: int
    #: per-step wall time, recent window
    step: Distribution
    #: per-step wait for the batch, recent window
    data_wait: Distribution
    #: CPU time of this process spent inside in-process ``next()`` calls, ns; None when the
    #: loader had worker processes (their CPU is not this process's)
    data_cpu_ns: int | None
    #: CPU time of the whole process (all threads) over the span, ns
    process_cpu_ns: int
    #: start-up and tear-down of each pass over a loader in the span
    boundaries: tuple[EpochBoundary, ...] = ()
    #: idle windows (run span only; empty for epochs)
    windows: tuple[IdleWindow, ...] = field(default=())
    #: the recent steps one by one, oldest first; None when not recorded
    recent: RecentSteps | None = field(default=None, compare=False, repr=False)
    #: of the in-process ``next()`` calls' time, what was neither on a CPU nor blocked (the
    #: training thread made no voluntary context switch: it waited on no storage), ns; scaled
    #: from the sampled calls as ``data_cpu_ns`` is; None where ``data_cpu_ns`` is
    data_still_ns: int | None = None

    @property
    def wall_s(self) -> float:
        return self.wall_ns / 1e9

    def phase_s(self, name: str) -> float:
        return self.phase_ns.get(name, 0) / 1e9

    def phase_fraction(self, name: str) -> float:
        if self.wall_ns <= 0:
            return 0.0
        return self.phase_ns.get(name, 0) / self.wall_ns


class SpanSnapshot:
    """A span's statistics (an epoch's, or the run's so far) before the sorting that their
    percentiles need: the timeline takes it cheaply on the training thread at an epoch end
    (``Timeline.end_epoch_snapshot``, ``Timeline.run_snapshot``), ``stats()`` finishes it later,
    on any thread (the report writer's).

    ``span`` is the span's ``SpanStats`` with placeholders for ``step`` and ``data_wait``, or a
    function that makes it when first asked for: an epoch end of a short epoch needs only its
    steps, wall time and phase times (``steps``, ``epochs``, ``wall_ns``, ``phase_ns``, given with
    the function), and the rest (the phase counts, the data CPU, the record itself) waits for its
    report. Two threads asking at once may both make it; they make equal ones. A span made by
    the function has no idle windows (only a run's ``SpanStats``, given made, has them):
    ``report.build.summarize`` of a snapshot counts on it."""

    __slots__ = (
        "_span",
        "_make",
        "steps",
        "epochs",
        "wall_ns",
        "phase_ns",
        "step",
        "data_wait",
        "compute",
        "kinds",
        "group",
    )

    def __init__(
        self,
        span: SpanStats | Callable[[], SpanStats],
        step: Sequence[int],
        data_wait: Sequence[int],
        compute: Sequence[int] = (),
        kinds: Sequence[int] = (),
        *,
        steps: int = 0,
        epochs: int = 0,
        wall_ns: int = 0,
        phase_ns: Mapping[str, int] | None = None,
    ) -> None:
        #: the span's recent steps' wall times (ns; at most the recent-steps window), their waits
        #: for data (ns), their compute times (ns), and the phases entered in each
        #: (``RecentSteps.kinds``)
        self.step = step
        self.data_wait = data_wait
        self.compute = compute
        self.kinds = kinds
        if isinstance(span, SpanStats):
            self._span: SpanStats | None = span
            self._make: Callable[[], SpanStats] | None = None
            steps, epochs, wall_ns, phase_ns = span.steps, span.epochs, span.wall_ns, span.phase_ns
        else:
            self._span, self._make = None, span
        #: the span's completed steps, passes, wall time and time per phase (``SpanStats``'s)
        self.steps = steps
        self.epochs = epochs
        self.wall_ns = wall_ns
        self.phase_ns: Mapping[str, int] = phase_ns if phase_ns is not None else {}
        #: an epoch's snapshot: the snapshot of the group of epochs it closes (itself when it is
        #: long enough alone), None when it closes none (``Timeline``'s ``group_steps``)
        self.group: SpanSnapshot | None = None

    @property
    def span(self) -> SpanStats:
        """The span's statistics, with placeholders for ``step`` and ``data_wait``."""
        span = self._span
        if span is None:
            make = self._make
            assert make is not None
            span = self._span = make()
        return span

    @property
    def made(self) -> SpanStats | None:
        """The span's statistics where they were made already (``span``), else None."""
        return self._span

    def unsorted(self) -> SpanStats:
        """``span`` with the recent steps one by one (``SpanStats.recent``), without the sorting
        that ``stats`` does: its distributions stay placeholders. What the frequency rules read
        of the run so far at an epoch end: its totals, and the steps right after each run of a
        phase (``after_s``), so that an epoch's finding and the run's count the same."""
        span = self.span
        if not len(self.compute) == len(self.step) == len(self.kinds):
            return span
        out = object.__new__(SpanStats)
        out.__dict__.update(span.__dict__, recent=RecentSteps(self.step, self.data_wait, self.compute, self.kinds))
        return out

    def stats(self) -> SpanStats:
        """The span's ``SpanStats``: the snapshot's, with its distributions and recent steps (a copy
        of its fields, cheaper than ``dataclasses.replace``, which an epoch end of a short epoch paid
        for)."""
        recent = (
            RecentSteps(self.step, self.data_wait, self.compute, self.kinds)
            if len(self.compute) == len(self.step) == len(self.kinds)
            else None
        )
        stats = object.__new__(SpanStats)
        stats.__dict__.update(
            self.span.__dict__,
            step=Distribution.of(self.step),
            data_wait=Distribution.of(self.data_wait),
            recent=recent,
        )
        return stats
