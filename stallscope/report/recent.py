"""The report's record of the most recent steps and the samplers' series, and their JSON form.

``RecentSteps`` is one rank's last steps (at most ``recent_steps``, 4096 by default): when each
began and its time in each phase, in microseconds. It is made from ``Timeline.recent_record`` (two
array copies at the epoch end; the conversion below runs when the report is built). In JSON it is
columnar and delta-coded, so 4096 steps take some 100 kB whatever the run's length::

    {"rank": 0, "host": "node-1", "first_step": 995904, "run_start_unix_us": 1795782105142687,
     "start_delta_us": [8123456, 151, 149, ...],  # the first: after the run's start; then after the previous
     "phases_us": {"data": [12, 10, ...], "compute": [120, 118, ...], ...}}

A phase with no time in any kept step is left out; each step's phases add up to its duration.

``Series`` is a sampler's recent readings (NVML utilization, the host's and the workers' CPU), at
most the sampler's ring (512 readings), times in ms after the run's start.

A report is input from whoever made it: ``recent_from_dict`` and ``series_from_dict`` check types,
signs, lengths and bounds, and raise ``ReportError`` with a one-line reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import floordiv, sub
from typing import Any

from stallscope._exceptions import ReportError
from stallscope.timeline.recorder import RecentRecord

#: the most steps a rank's record may hold in a report read back (the default keeps 4096)
MAX_RECENT_STEPS = 1 << 20
#: the most readings a series may hold in a report read back (the samplers keep 512)
MAX_SERIES_POINTS = 1 << 16
#: the largest time a record may hold, us (over 30 years)
MAX_US = 10**15
#: the largest unix time a record may hold, us (the year 2500 or so)
MAX_UNIX_US = 1 << 54


@dataclass(frozen=True)
class RecentSteps:
    """One rank's most recent steps, oldest first."""

    #: the rank (None: not a distributed run) and its host
    rank: int | None
    host: str
    #: the run's steps before the first one kept (its index, counting from 0)
    first_step: int
    #: the unix time of the run's start, us: a step began at ``run_start_unix_us + start_us[i]``
    run_start_unix_us: int
    #: when each step began, us after the run's start
    start_us: tuple[int, ...]
    #: phase name -> each step's time in it, us (phases with time in some step, report order)
    phases_us: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.start_us)

    def duration_us(self, i: int) -> int:
        """Step ``i``'s duration, us (the sum of its phases)."""
        return sum(values[i] for values in self.phases_us.values())


@dataclass(frozen=True)
class Series:
    """A sampler's recent readings."""

    #: what was read: ``gpu_util`` (a fraction), ``host_cpu`` and ``workers_cpu`` (cores)
    name: str
    unit: str
    #: when each reading was taken, ms after the run's start
    t_ms: tuple[float, ...]
    values: tuple[float, ...]


def recent_from_record(record: RecentRecord, *, rank: int | None, host: str, unix_ns: int) -> RecentSteps:
    """The report's form of ``record``; ``unix_ns``: the unix time when ``record.clock_ns`` was read."""
    width = len(record.columns)
    count = len(record.start_ns)
    origin = record.run_start_ns
    # ``map`` over C functions: a run's end converts up to 4,096 steps of each phase
    start_us = tuple(map(floordiv, map(sub, record.start_ns, repeat(origin)), repeat(1000)))
    flat = record.phase_ns
    phases: dict[str, tuple[int, ...]] = {}
    for c, name in enumerate(record.columns):
        if not name:
            continue
        column = flat[c::width]
        if any(column):
            phases[name] = tuple(map(floordiv, column, repeat(1000)))
    return RecentSteps(
        rank=rank,
        host=host,
        first_step=record.steps - count,
        run_start_unix_us=(unix_ns - (record.clock_ns - origin)) // 1000,
        start_us=start_us,
        phases_us=phases,
    )


def series_from_samples(name: str, unit: str, points: Sequence[tuple[int, float]], run_start_ns: int) -> Series | None:
    """A series from (clock ns, value) readings, those after the run's start; None when empty."""
    kept = [(t, v) for t, v in points if t >= run_start_ns and math.isfinite(v)]
    if not kept:
        return None
    return Series(
        name=name,
        unit=unit,
        t_ms=tuple(round((t - run_start_ns) / 1e6, 1) for t, _ in kept),
        values=tuple(round(v, 4) for _, v in kept),
    )


# -- JSON --------------------------------------------------------------------------------------


def recent_to_dict(r: RecentSteps) -> dict[str, Any]:
    deltas = list(map(sub, r.start_us, (0, *r.start_us)))
    out: dict[str, Any] = {"rank": r.rank, "host": r.host} if r.rank is not None else {"host": r.host}
    out.update(
        first_step=r.first_step,
        run_start_unix_us=r.run_start_unix_us,
        start_delta_us=deltas,
        phases_us={name: list(values) for name, values in r.phases_us.items()},
    )
    return out


def series_to_dict(s: Series) -> dict[str, Any]:
    return {"name": s.name, "unit": s.unit, "t_ms": list(s.t_ms), "values": list(s.values)}


def _int_list(value: Any, where: str, *, limit: int, signed: bool = False) -> list[int]:
    if not isinstance(value, list):
        raise ReportError(f"{where} must be a list of integers")
    if len(value) > limit:
        raise ReportError(f"{where} holds {len(value)} items, more than {limit}")
    if not all(type(v) is int for v in value):
        raise ReportError(f"{where} must hold integers only")
    low = -MAX_US if signed else 0
    if value and not (low <= min(value) and max(value) <= MAX_US):
        raise ReportError(f"{where} holds an integer out of range")
    return value


def _str(d: Mapping[str, Any], key: str, where: str) -> str:
    value = d.get(key, "")
    if not isinstance(value, str):
        raise ReportError(f"{where}.{key} must be a string")
    return value


def recent_from_dict(d: Any, where: str) -> RecentSteps:
    if not isinstance(d, Mapping):
        raise ReportError(f"{where} is not an object")
    rank = d.get("rank")
    if rank is not None and (type(rank) is not int or not 0 <= rank <= 1 << 31):
        raise ReportError(f"{where}.rank must be null or an integer >= 0")
    first = d.get("first_step", 0)
    if type(first) is not int or not 0 <= first <= 1 << 53:
        raise ReportError(f"{where}.first_step must be an integer >= 0")
    unix = d.get("run_start_unix_us", 0)
    if type(unix) is not int or not 0 <= unix <= MAX_UNIX_US:
        raise ReportError(f"{where}.run_start_unix_us must be an integer >= 0")
    deltas = _int_list(d.get("start_delta_us"), f"{where}.start_delta_us", limit=MAX_RECENT_STEPS)
    start: list[int] = []
    at = 0
    for v in deltas:
        at += v
        start.append(at)
    if start and start[-1] > MAX_US:
        raise ReportError(f"{where}.start_delta_us adds up to a time out of range")
    phases = d.get("phases_us", {})
    if not isinstance(phases, Mapping):
        raise ReportError(f"{where}.phases_us must be an object")
    out: dict[str, tuple[int, ...]] = {}
    for name, values in phases.items():
        column = _int_list(values, f"{where}.phases_us.{name}", limit=MAX_RECENT_STEPS)
        if len(column) != len(start):
            raise ReportError(f"{where}.phases_us.{name} has {len(column)} steps, start_delta_us {len(start)}")
        out[str(name)] = tuple(column)
    return RecentSteps(
        rank=rank,
        host=_str(d, "host", where),
        first_step=first,
        run_start_unix_us=unix,
        start_us=tuple(start),
        phases_us=out,
    )


def series_from_dict(d: Any, where: str) -> Series:
    if not isinstance(d, Mapping):
        raise ReportError(f"{where} is not an object")
    t = d.get("t_ms")
    values = d.get("values")
    if not isinstance(t, list) or not isinstance(values, list) or len(t) != len(values):
        raise ReportError(f"{where}.t_ms and .values must be lists of the same length")
    if len(t) > MAX_SERIES_POINTS:
        raise ReportError(f"{where} holds {len(t)} readings, more than {MAX_SERIES_POINTS}")
    for v in (*t, *values):
        if type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v <= MAX_US:
            raise ReportError(f"{where} holds a reading that is not a number >= 0")
    return Series(
        name=_str(d, "name", where),
        unit=_str(d, "unit", where),
        t_ms=tuple(float(v) for v in t),
        values=tuple(float(v) for v in values),
    )
