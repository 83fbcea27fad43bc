"""Report records (SPEC §3) and their JSON form.

``to_dict`` / ``from_dict`` are the only places that know the JSON layout. ``from_dict`` reads
every ``schema_version`` up to ``SCHEMA_VERSION`` and raises ``ReportError`` on anything else.
An older report is first brought up to date one version at a time by the steps in ``UPGRADES``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from stallscope._exceptions import ReportError
from stallscope.analysis.finding import Finding
from stallscope.report.recent import (
    RecentSteps,
    Series,
    recent_from_dict,
    recent_to_dict,
    series_from_dict,
    series_to_dict,
)

SCHEMA_VERSION = 1

#: ``UPGRADES[n]`` turns the JSON object of a version-``n`` report into a version-``n + 1`` one.
#: Version 1 is the first, so there is no step yet; a change to the format bumps
#: ``SCHEMA_VERSION`` and adds the step from the previous version here.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}

#: where ``gpu_idle_fraction`` came from (SPEC §3)
IDLE_SOURCES = ("cuda_events", "nvml", "host_phases")


@dataclass(frozen=True)
class DeviceInfo:
    """The accelerator the run used."""

    #: ``cuda``, ``cpu``, ``mps``, ...
    kind: str
    #: human name, e.g. "NVIDIA H100 80GB HBM3" or the CPU model
    name: str
    #: torch device index, None for the CPU
    index: int | None = None
    #: GPU UUID as NVML reports it, when known
    uuid: str | None = None


@dataclass(frozen=True)
class RunInfo:
    """Where and how the run happened."""

    #: ISO 8601 UTC time the scope started
    started_at: str
    host: str
    torch_version: str
    device: DeviceInfo
    #: the loader's settings (``LoaderConfig.to_dict``) when a DataLoader was iterated
    dataloader: Mapping[str, Any] | None = None
    stallscope_version: str = ""
    #: ``plain`` or ``lightning``
    framework: str = "plain"
    #: cores this process could use
    usable_cores: int = 1
    #: this process's rank in a distributed job (SPEC §3a); None when not distributed
    rank: int | None = None
    #: processes in the job; None when not distributed
    world_size: int | None = None
    #: this process's rank on its host; None when not distributed or not known
    local_rank: int | None = None


@dataclass(frozen=True)
class Summary:
    """Where the time of a span (an epoch or the run) went."""

    wall_s: float
    steps: int
    steps_per_s: float
    #: fraction of wall time the accelerator had no work, in [0, 1]
    gpu_idle_fraction: float
    #: one of ``IDLE_SOURCES``
    idle_source: str
    #: fraction of wall time per phase; sums to 1
    phase_fractions: Mapping[str, float]
    #: seconds per phase
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    #: per-step wall time over the recent-steps window: mean, p10, p50, p90, max (seconds)
    step_time_s: Mapping[str, float] = field(default_factory=dict)
    #: per-step wait for data over the same window (seconds)
    data_wait_s: Mapping[str, float] = field(default_factory=dict)
    #: NVML aggregates (SPEC §3), None when NVML was not sampled
    nvml: Mapping[str, Any] | None = None
    #: idle fraction per window of consecutive steps (run summary only), for the CI gate
    idle_windows: tuple[Mapping[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.idle_source not in IDLE_SOURCES:
            raise ValueError(f"idle_source must be one of {IDLE_SOURCES}, got {self.idle_source!r}")


@dataclass(frozen=True)
class RankEntry:
    """One rank of a distributed job, as rank 0 gathered it (SPEC §3a ``ranks[]``)."""

    rank: int
    host: str
    steps: int
    wall_s: float
    steps_per_s: float
    #: fraction of the rank's wall time its accelerator had no work, in [0, 1]
    gpu_idle_fraction: float
    #: fractions of the rank's wall time per phase; sum to 1
    phase_fractions: Mapping[str, float]
    #: per-step wait for data on this rank (seconds): mean, p10, p50, p90, max
    data_wait_s: Mapping[str, float] = field(default_factory=dict)
    #: seconds per phase on this rank
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    #: train epochs this rank closed
    epochs: int = 0
    #: its forward passes (``signals/forward.py``; empty when none was timed): ``per_step`` (ms of
    #: forward per step), ``calls``, one pass's ``p10`` / ``p50`` / ``p90`` (ms), ``source``
    forward_ms: Mapping[str, Any] = field(default_factory=dict)
    #: the node (torchrun's ``GROUP_RANK``) and the machine (hostname and boot id) it ran on
    node_rank: int | None = None
    host_id: str = ""
    #: the cores its own diagnosis counted on: its machine's usable cores shared among every rank
    #: of the job on that machine (whatever their node)
    cores: int | None = None


@dataclass(frozen=True)
class EpochReport:
    """One epoch (SPEC §3 ``epochs[]``): its own summary, and the findings of the diagnosis it
    closes. An epoch too short to judge is diagnosed with the next ones, as a group that closes
    at the first epoch end where they are long enough together (``analysis/diagnose.py``,
    ``too_short``): the closing epoch holds the group's findings and ``covers_epochs``, each
    other epoch of the group no findings and ``diagnosed_with``."""

    index: int
    summary: Summary
    findings: tuple[Finding, ...] = ()
    #: the first and last epoch (this one) of the group its findings are of; None when they are
    #: of this epoch alone, or when it closes no group
    covers_epochs: tuple[int, int] | None = None
    #: the epoch that holds the findings of this epoch's group (a later one); None when this epoch
    #: holds them, or when its group has not closed yet (a report written mid-run)
    diagnosed_with: int | None = None

    @cached_property
    def json_dict(self) -> dict[str, Any]:
        """The epoch as ``report.json`` holds it, made once: every report written after the epoch
        holds it (hundreds of epochs, rewritten at each mid-run write). Read it, never change it."""
        out: dict[str, Any] = {
            "index": self.index,
            "summary": summary_to_dict(self.summary),
            "findings": [finding_to_dict(f) for f in self.findings],
        }
        if self.covers_epochs is not None:
            out["covers_epochs"] = list(self.covers_epochs)
        if self.diagnosed_with is not None:
            out["diagnosed_with"] = self.diagnosed_with
        return out


@dataclass(frozen=True)
class Report:
    """The whole report, as written to ``report.json``."""

    run: RunInfo
    summary: Summary
    epochs: tuple[EpochReport, ...] = ()
    #: findings for the run so far, best first
    findings: tuple[Finding, ...] = ()
    #: things the user should know about the measurement (missing NVML, internal errors, ...)
    notes: tuple[str, ...] = ()
    #: True once the scope has exited; False in reports written at epoch ends
    complete: bool = False
    schema_version: int = SCHEMA_VERSION
    #: the time after the last epoch's end (final reports): the epochs and the tail add up to the run
    tail: Summary | None = None
    #: a distributed job's ranks, on the job's report (rank 0's ``report.json``); else empty
    ranks: tuple[RankEntry, ...] = ()
    #: the most recent steps, one record per rank (``report/recent.py``); the samplers' series
    recent: tuple[RecentSteps, ...] = ()
    series: tuple[Series, ...] = ()

    def finding(self, finding_id: str) -> Finding | None:
        """The run-level finding with ``finding_id``, if any."""
        return next((f for f in self.findings if f.id == finding_id), None)


# -- to JSON ---------------------------------------------------------------------------------


#: the types most of a report is made of, which need no cleaning
_PLAIN = frozenset((str, int, bool, type(None)))


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become None, tuples lists, mappings dicts."""
    kind = type(value)
    if kind in _PLAIN:  # no ABC check for most of a report
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if kind is dict or isinstance(value, Mapping):
        # plain values and finite floats are copied without a call (a summary is mostly those)
        return {
            str(k): v if type(v) in _PLAIN or (type(v) is float and math.isfinite(v)) else _clean(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def finding_to_dict(f: Finding) -> dict[str, Any]:
    return _clean(  # type: ignore[no-any-return]
        {
            "id": f.id,
            "title": f.title,
            "est_saving_fraction": f.est_saving_fraction,
            "est_speedup": f.est_speedup,
            "est_speedup_bound": f.est_speedup_bound,
            "confidence": f.confidence,
            "evidence": dict(f.evidence),
            "fix": f.fix,
            "suggestion": dict(f.suggestion),
            "snippet": f.snippet,
        }
    )


_STR = frozenset((str,))


def _numbers(value: Any) -> dict[str, Any] | None:
    """A copy of ``value`` when it is a dict of names to finite numbers (what ``summarize`` makes),
    checked with C's loops; None when it is anything else, for ``_clean`` to copy."""
    if type(value) is not dict:
        return None
    try:
        # a finite sum: no NaN or infinity among them (TypeError for anything but numbers; a sum
        # that overflows goes the slow way)
        finite = math.isfinite(sum(value.values()))
    except (TypeError, OverflowError):
        return None
    if not finite or not set(map(type, value)) <= _STR:
        return None
    return dict(value)


def summary_to_dict(s: Summary) -> dict[str, Any]:
    # a summary ``summarize`` made holds dicts of finite numbers: copied as they are (every
    # report holds every epoch's); anything else is cleaned
    fractions = _numbers(s.phase_fractions)
    seconds = _numbers(s.phase_seconds)
    step_time = _numbers(s.step_time_s)
    data_wait = _numbers(s.data_wait_s)
    windows = [_numbers(w) for w in s.idle_windows]
    try:
        scalars = math.isfinite(s.wall_s + s.steps + s.steps_per_s + s.gpu_idle_fraction)
    except (TypeError, OverflowError):
        scalars = False
    if (
        scalars
        and fractions is not None
        and seconds is not None
        and step_time is not None
        and data_wait is not None
        and s.nvml is None
        and None not in windows
        and type(s.idle_source) is str
    ):
        fast: dict[str, Any] = {
            "wall_s": s.wall_s,
            "steps": s.steps,
            "steps_per_s": s.steps_per_s,
            "gpu_idle_fraction": s.gpu_idle_fraction,
            "idle_source": s.idle_source,
            "phase_fractions": fractions,
            "phase_seconds": seconds,
            "step_time_s": step_time,
            "data_wait_s": data_wait,
        }
        if windows:
            fast["idle_windows"] = windows
        return fast
    out: dict[str, Any] = {
        "wall_s": s.wall_s,
        "steps": s.steps,
        "steps_per_s": s.steps_per_s,
        "gpu_idle_fraction": s.gpu_idle_fraction,
        "idle_source": s.idle_source,
        "phase_fractions": dict(s.phase_fractions),
        "phase_seconds": dict(s.phase_seconds),
        "step_time_s": dict(s.step_time_s),
        "data_wait_s": dict(s.data_wait_s),
    }
    if s.nvml is not None:
        out["nvml"] = dict(s.nvml)
    if s.idle_windows:
        out["idle_windows"] = [dict(w) for w in s.idle_windows]
    return _clean(out)  # type: ignore[no-any-return]


def rank_to_dict(e: RankEntry) -> dict[str, Any]:
    out: dict[str, Any] = _clean(
        {
            "rank": e.rank,
            "host": e.host,
            "steps": e.steps,
            "wall_s": e.wall_s,
            "steps_per_s": e.steps_per_s,
            "gpu_idle_fraction": e.gpu_idle_fraction,
            "phase_fractions": dict(e.phase_fractions),
            "phase_seconds": dict(e.phase_seconds),
            "data_wait_s": dict(e.data_wait_s),
            "epochs": e.epochs,
            "forward_ms": dict(e.forward_ms) or None,
            "node_rank": e.node_rank,
            "host_id": e.host_id or None,
            "cores": e.cores,
        }
    )
    for key in ("forward_ms", "node_rank", "host_id", "cores"):  # absent where not known
        if out[key] is None:
            del out[key]
    return out


def report_to_dict(r: Report) -> dict[str, Any]:
    run: dict[str, Any] = {
        "started_at": r.run.started_at,
        "host": r.run.host,
        "torch_version": r.run.torch_version,
        "stallscope_version": r.run.stallscope_version,
        "framework": r.run.framework,
        "usable_cores": r.run.usable_cores,
        "device": {k: v for k, v in vars(r.run.device).items() if v is not None or k == "index"},
    }
    if r.run.dataloader is not None:
        run["dataloader"] = dict(r.run.dataloader)
    if r.run.rank is not None:
        run.update(rank=r.run.rank, world_size=r.run.world_size, local_rank=r.run.local_rank)
    # the summaries and findings come out of their ``*_to_dict`` clean already: cleaning them
    # again doubled the time a report with hundreds of epochs takes to write
    out: dict[str, Any] = {
        "schema_version": r.schema_version,
        "complete": r.complete,
        "run": _clean(run),
        "summary": summary_to_dict(r.summary),
        "epochs": [e.json_dict for e in r.epochs],
        "findings": [finding_to_dict(f) for f in r.findings],
        "notes": [str(n) for n in r.notes],
    }
    if r.tail is not None:
        out["tail"] = summary_to_dict(r.tail)
    if r.ranks:
        out["ranks"] = [rank_to_dict(e) for e in r.ranks]
    if r.recent:
        out["recent_steps"] = [recent_to_dict(e) for e in r.recent]
    if r.series:
        out["series"] = [series_to_dict(e) for e in r.series]
    return out


# -- from JSON -------------------------------------------------------------------------------


def _req(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise ReportError(f"{where}.{key} is missing")
    return _typed(obj[key], kind, f"{where}.{key}")


def _typed(value: Any, kind: type | tuple[type, ...], field: str) -> Any:
    """``value`` when it is of JSON type ``kind`` (float: any number; bool is not a number)."""
    wanted = (int, float) if kind is float else kind
    if value is None or not isinstance(value, wanted) or (isinstance(value, bool) and kind is not bool):
        raise ReportError(f"{field} has the wrong type ({type(value).__name__})")
    return value


def _opt(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any) -> Any:
    """An optional field: ``default`` when absent or null, ``ReportError`` when of another type."""
    value = obj.get(key)
    return default if value is None else _typed(value, kind, f"{where}.{key}")


#: the largest count a report may hold (steps, cores, indices): far above any real run
MAX_COUNT = 2**53


def _count(obj: Mapping[str, Any], key: str, where: str, *, minimum: int = 0, default: int | None = None) -> int:
    """A whole number in [minimum, MAX_COUNT]; required unless ``default`` is given."""
    if default is not None and obj.get(key) is None:
        return default
    value = int(_req(obj, key, int, where))
    if not minimum <= value <= MAX_COUNT:
        raise ReportError(f"{where}.{key} must be an integer >= {minimum}, got {value!r}")
    return value


#: the largest amount a report may hold (seconds: over 30 years; rates: a billion a second)
MAX_AMOUNT = 1e9
#: how far a span's phase fractions may sum from 1 (each is rounded to 6 decimals)
FRACTION_SUM_TOLERANCE = 0.01


def _amount(value: Any, field: str) -> float:
    """A number in [0, ``MAX_AMOUNT``] (seconds, rates): the parser already turned non-finite
    ones away."""
    number = float(_typed(value, float, field))
    if not number >= 0.0:
        raise ReportError(f"{field} must be >= 0, got {value!r}")
    if number > MAX_AMOUNT:
        raise ReportError(f"{field} is out of range ({value!r} is above {MAX_AMOUNT:g})")
    return number


def _phase_fractions(d: Mapping[str, Any], where: str) -> dict[str, float]:
    """A span's ``phase_fractions``: each in [0, 1], together 1 (or all 0: a span with no time)."""
    fractions = _req(d, "phase_fractions", Mapping, where)
    for name, value in fractions.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
            raise ReportError(f"{where}.phase_fractions.{name} must be a fraction in [0, 1]")
    total = math.fsum(fractions.values())
    if total > 0 and abs(total - 1.0) > FRACTION_SUM_TOLERANCE:
        raise ReportError(f"{where}.phase_fractions sum to {total:.4g}, not 1 (fractions of the wall time)")
    return {str(k): float(v) for k, v in fractions.items()}


def _amounts(obj: Mapping[str, Any], key: str, where: str) -> dict[str, float]:
    """An optional object of numbers >= 0 (``phase_seconds``, ``step_time_s``...)."""
    values = _opt_map(obj, key, where) or {}
    return {str(k): _amount(v, f"{where}.{key}.{k}") for k, v in values.items()}


def _fraction(obj: Mapping[str, Any], key: str, where: str) -> float:
    value = float(_req(obj, key, float, where))
    if not 0.0 <= value <= 1.0:
        raise ReportError(f"{where}.{key} must be a fraction in [0, 1], got {value!r}")
    return value


def _opt_map(obj: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    """An optional JSON object: None when absent or null, ``ReportError`` when not an object."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReportError(f"{where}.{key} must be an object, got {type(value).__name__}")
    return dict(value)


def _opt_list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    """An optional JSON array: empty when absent or null, ``ReportError`` when not an array."""
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ReportError(f"{where}.{key} must be a list, got {type(value).__name__}")
    return value


def finding_from_dict(d: Mapping[str, Any], where: str) -> Finding:
    if not isinstance(d, Mapping):
        raise ReportError(f"{where} is not an object")
    confidence = _opt(d, "confidence", str, where, "medium")
    speedup = float(_req(d, "est_speedup", float, where))
    if not speedup > 0:
        raise ReportError(f"{where}.est_speedup must be > 0, got {speedup!r}")
    bound = _opt(d, "est_speedup_bound", str, where, "estimate")  # reports written before it: estimates
    try:
        return Finding(
            id=_req(d, "id", str, where),
            title=_opt(d, "title", str, where, ""),
            est_saving_fraction=_fraction(d, "est_saving_fraction", where),
            est_speedup=speedup,
            confidence=confidence if confidence in ("high", "medium", "low") else "medium",
            evidence=_opt_map(d, "evidence", where) or {},
            fix=_opt(d, "fix", str, where, ""),
            suggestion=_opt_map(d, "suggestion", where) or {},
            snippet=_opt(d, "snippet", str, where, ""),
            est_speedup_bound=bound,
        )
    except ValueError as exc:
        raise ReportError(f"{where}: {exc}") from None


def summary_from_dict(d: Mapping[str, Any], where: str) -> Summary:
    if not isinstance(d, Mapping):
        raise ReportError(f"{where} is not an object")
    fractions = _phase_fractions(d, where)
    source = _req(d, "idle_source", str, where)
    if source not in IDLE_SOURCES:
        raise ReportError(f"{where}.idle_source is {source!r}, expected one of {', '.join(IDLE_SOURCES)}")
    windows = d.get("idle_windows") or []
    if not isinstance(windows, list) or not all(isinstance(w, Mapping) for w in windows):
        raise ReportError(f"{where}.idle_windows must be a list of objects")
    for i, w in enumerate(windows):
        idle = w.get("idle_fraction")
        if not isinstance(idle, (int, float)) or isinstance(idle, bool) or not 0.0 <= idle <= 1.0:
            raise ReportError(f"{where}.idle_windows[{i}].idle_fraction must be a fraction in [0, 1]")
        _count(w, "steps", f"{where}.idle_windows[{i}]", default=0)
        if w.get("wall_s") is not None:
            _amount(w["wall_s"], f"{where}.idle_windows[{i}].wall_s")
    return Summary(
        wall_s=_amount(_req(d, "wall_s", float, where), f"{where}.wall_s"),
        steps=_count(d, "steps", where),
        steps_per_s=_amount(_req(d, "steps_per_s", float, where), f"{where}.steps_per_s"),
        gpu_idle_fraction=_fraction(d, "gpu_idle_fraction", where),
        idle_source=source,
        phase_fractions=fractions,
        phase_seconds=_amounts(d, "phase_seconds", where),
        step_time_s=_amounts(d, "step_time_s", where),
        data_wait_s=_amounts(d, "data_wait_s", where),
        nvml=_opt_map(d, "nvml", where),
        idle_windows=tuple(dict(w) for w in windows),
    )


def rank_from_dict(d: Any, where: str) -> RankEntry:
    if not isinstance(d, Mapping):
        raise ReportError(f"{where} is not an object")
    fractions = _phase_fractions(d, where)
    epochs = d.get("epochs", 0)
    node = d.get("node_rank")
    cores = d.get("cores")
    return RankEntry(
        rank=_count(d, "rank", where),
        host=str(d.get("host", "")),
        steps=_count(d, "steps", where),
        wall_s=_amount(_req(d, "wall_s", float, where), f"{where}.wall_s"),
        steps_per_s=_amount(_req(d, "steps_per_s", float, where), f"{where}.steps_per_s"),
        gpu_idle_fraction=_fraction(d, "gpu_idle_fraction", where),
        phase_fractions=fractions,
        data_wait_s=_opt_map(d, "data_wait_s", where) or {},
        phase_seconds=_opt_map(d, "phase_seconds", where) or {},
        epochs=epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else 0,
        forward_ms=_opt_map(d, "forward_ms", where) or {},
        node_rank=node if isinstance(node, int) and not isinstance(node, bool) else None,
        host_id=str(d.get("host_id") or ""),
        cores=cores if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0 else None,
    )


def _opt_int(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReportError(f"{where}.{key} must be a non-negative integer, got {value!r}")
    return value


def upgrade_dict(d: Mapping[str, Any], version: int) -> dict[str, Any]:
    """Bring a version-``version`` report's JSON object up to ``SCHEMA_VERSION`` (a copy)."""
    data = dict(d)
    while version < SCHEMA_VERSION:
        step = UPGRADES.get(version)
        if step is None:
            raise ReportError(f"schema_version {version} cannot be upgraded to {SCHEMA_VERSION} by this StallScope")
        try:
            data = step(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportError(f"cannot upgrade schema_version {version}: {exc!r}") from None
        version += 1
        data["schema_version"] = version
    return data


def report_from_dict(d: Any) -> Report:
    """Parse a report's JSON object. Raises ``ReportError`` with a one-line reason."""
    if not isinstance(d, Mapping):
        raise ReportError("not a StallScope report (the top level is not a JSON object)")
    if "schema_version" not in d:
        raise ReportError("not a StallScope report (no schema_version)")
    version = d["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ReportError(f"schema_version must be a positive integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ReportError(
            f"schema_version {version} is newer than this StallScope reads ({SCHEMA_VERSION}); upgrade stallscope"
        )
    if version < SCHEMA_VERSION:
        d = upgrade_dict(d, version)
        version = SCHEMA_VERSION
    run = _req(d, "run", Mapping, "report")
    device = _opt(run, "device", Mapping, "report.run", {})
    dataloader = _opt_map(run, "dataloader", "report.run")
    epochs = _opt_list(d, "epochs", "report")
    findings = _opt_list(d, "findings", "report")
    notes = _opt_list(d, "notes", "report")
    for i, note in enumerate(notes):
        _typed(note, str, f"report.notes[{i}]")
    index = device.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= MAX_COUNT):
        raise ReportError(f"report.run.device.index must be null or an integer >= 0, got {index!r}")
    return Report(
        schema_version=version,
        complete=_opt(d, "complete", bool, "report", True),
        run=RunInfo(
            started_at=_opt(run, "started_at", str, "report.run", ""),
            host=_opt(run, "host", str, "report.run", ""),
            torch_version=_opt(run, "torch_version", str, "report.run", ""),
            device=DeviceInfo(
                kind=_opt(device, "kind", str, "report.run.device", "unknown"),
                name=_opt(device, "name", str, "report.run.device", ""),
                index=index,
                uuid=_opt(device, "uuid", str, "report.run.device", None),
            ),
            dataloader=dataloader,
            stallscope_version=_opt(run, "stallscope_version", str, "report.run", ""),
            framework=_opt(run, "framework", str, "report.run", "plain"),
            usable_cores=_count(run, "usable_cores", "report.run", minimum=1, default=1),
            rank=_opt_int(run, "rank", "report.run"),
            world_size=_opt_int(run, "world_size", "report.run"),
            local_rank=_opt_int(run, "local_rank", "report.run"),
        ),
        summary=summary_from_dict(_req(d, "summary", Mapping, "report"), "report.summary"),
        epochs=_checked_epochs(tuple(_epoch_from_dict(e, f"report.epochs[{i}]") for i, e in enumerate(epochs))),
        findings=tuple(finding_from_dict(f, f"report.findings[{i}]") for i, f in enumerate(findings)),
        notes=tuple(notes),
        tail=summary_from_dict(_req(d, "tail", Mapping, "report"), "report.tail")
        if d.get("tail") is not None
        else None,
        ranks=tuple(rank_from_dict(e, f"report.ranks[{i}]") for i, e in enumerate(_opt_list(d, "ranks", "report"))),
        recent=tuple(
            recent_from_dict(e, f"report.recent_steps[{i}]")
            for i, e in enumerate(_opt_list(d, "recent_steps", "report"))
        ),
        series=tuple(
            series_from_dict(e, f"report.series[{i}]") for i, e in enumerate(_opt_list(d, "series", "report"))
        ),
    )


def _epoch_from_dict(e: Any, where: str) -> EpochReport:
    if not isinstance(e, Mapping):
        raise ReportError(f"{where} is not an object")
    index = _count(e, "index", where)
    findings = tuple(
        finding_from_dict(f, f"{where}.findings[{j}]") for j, f in enumerate(_opt_list(e, "findings", where))
    )
    covers = e.get("covers_epochs")
    if covers is not None:
        ok = (
            isinstance(covers, list)
            and len(covers) == 2
            and all(isinstance(c, int) and not isinstance(c, bool) for c in covers)
            and 0 <= covers[0] < covers[1] == index
        )
        if not ok:
            raise ReportError(f"{where}.covers_epochs must be [first, {index}] with first < {index}, got {covers!r}")
        covers = (covers[0], covers[1])
    diagnosed_with = _opt_int(e, "diagnosed_with", where)
    if diagnosed_with is not None:
        if diagnosed_with <= index:
            raise ReportError(f"{where}.diagnosed_with must name a later epoch than {index}, got {diagnosed_with!r}")
        if findings or covers is not None:
            raise ReportError(f"{where} has diagnosed_with and findings of its own")
    return EpochReport(
        index=index,
        summary=summary_from_dict(_req(e, "summary", Mapping, where), f"{where}.summary"),
        findings=findings,
        covers_epochs=covers,
        diagnosed_with=diagnosed_with,
    )


def _checked_epochs(epochs: tuple[EpochReport, ...]) -> tuple[EpochReport, ...]:
    _check_groups(epochs)
    return epochs


def _check_groups(epochs: tuple[EpochReport, ...]) -> None:
    """Each ``diagnosed_with`` names an epoch whose ``covers_epochs`` holds it, where the report
    keeps that epoch (a long run keeps only its first and latest epochs)."""
    by_index = {e.index: e for e in epochs}
    for i, e in enumerate(epochs):
        if e.diagnosed_with is None or e.diagnosed_with not in by_index:
            continue
        covers = by_index[e.diagnosed_with].covers_epochs
        if covers is None or not covers[0] <= e.index <= covers[1]:
            raise ReportError(
                f"report.epochs[{i}].diagnosed_with is {e.diagnosed_with}, whose covers_epochs "
                f"({list(covers) if covers else None}) does not hold epoch {e.index}"
            )
