"""The report's record of the recent steps: its JSON form, its bound, and what a hostile report
cannot make it do."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from stallscope import StallScope
from stallscope._exceptions import ReportError
from stallscope.report.io import load_report
from stallscope.report.recent import (
    MAX_RECENT_STEPS,
    RecentSteps,
    recent_from_dict,
    recent_to_dict,
)
from stallscope.report.schema import report_from_dict, report_to_dict


def _record(steps: int, rank: int | None = 0, seed: int = 0) -> RecentSteps:
    """A record like a busy GPU job's: ~150 ms steps, a few phases, microsecond resolution."""
    rng = random.Random(seed)
    starts, at = [], 12_345_678
    phases: dict[str, list[int]] = {"data": [], "h2d": [], "compute": [], "logging": [], "other": []}
    for _ in range(steps):
        starts.append(at)
        step = 0
        for name, mean in (("data", 4_000), ("h2d", 900), ("compute", 140_000), ("logging", 300), ("other", 60)):
            us = max(0, int(rng.gauss(mean, mean / 5)))
            phases[name].append(us)
            step += us
        at += step
    return RecentSteps(
        rank=rank,
        host="node-1",
        first_step=1_000_000 - steps,
        run_start_unix_us=1_795_782_105_142_687,
        start_us=tuple(starts),
        phases_us={k: tuple(v) for k, v in phases.items()},
    )


def test_the_json_form_reads_back_the_same() -> None:
    record = _record(100)
    assert recent_from_dict(json.loads(json.dumps(recent_to_dict(record))), "r") == record


def test_4096_steps_of_8_ranks_stay_under_a_megabyte() -> None:
    """The issue's bound: the record of 4096 steps x 8 ranks, as the report writes it, < 1 MB."""
    records = [recent_to_dict(_record(4096, rank, seed=rank)) for rank in range(8)]
    size = len(json.dumps(records, separators=(",", ":")))
    assert size < 1_000_000, size


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"start_delta_us": [1, -5]}, "out of range"),
        ({"start_delta_us": "1,2"}, "must be a list of integers"),
        ({"start_delta_us": [1, 2.5]}, "integers only"),
        ({"start_delta_us": [1, True]}, "integers only"),
        ({"phases_us": {"data": [1]}}, "has 1 steps, start_delta_us 2"),
        ({"phases_us": {"data": [1, 10**16]}}, "out of range"),
        ({"phases_us": []}, "must be an object"),
        ({"rank": -1}, "rank must be"),
        ({"host": 5}, "host must be a string"),
        ({"first_step": "0"}, "first_step"),
        ({"run_start_unix_us": 1 << 60}, "run_start_unix_us"),
    ],
)
def test_a_malformed_record_is_a_one_line_report_error(change: dict[str, Any], message: str) -> None:
    d = {"rank": 0, "host": "h", "first_step": 0, "run_start_unix_us": 0, "start_delta_us": [1, 2], "phases_us": {}}
    d.update(change)
    with pytest.raises(ReportError, match=message):
        recent_from_dict(d, "report.recent_steps[0]")


def test_a_record_too_long_is_refused_before_it_is_read() -> None:
    d = {"start_delta_us": [0] * (MAX_RECENT_STEPS + 1), "phases_us": {}}
    with pytest.raises(ReportError, match="more than"):
        recent_from_dict(d, "r")


def test_a_run_keeps_its_last_steps_and_the_report_reads_them_back(tmp_path: Path) -> None:
    """A real plain loop with recent_steps=16: the report holds its last 16 steps, their phases
    adding up to each step's time between starts (steps follow each other within an epoch)."""
    with StallScope(report_dir=tmp_path, console=False, recent_steps=16) as scope:
        for _ in scope.iter(range(50)):
            with scope.phase("compute"):
                time.sleep(0.0005)
            with scope.phase("logging"):
                pass
    report = load_report(tmp_path)
    assert len(report.recent) == 1
    record = report.recent[0]
    assert record.rank is None
    assert record.first_step == 34
    assert record.steps == 16
    assert set(record.phases_us) >= {"compute", "logging"}
    assert all(record.phases_us["compute"][i] >= 500 for i in range(16))
    for i in range(15):
        gap = record.start_us[i + 1] - record.start_us[i] - record.duration_us(i)
        assert 0 <= gap <= len(record.phases_us)  # each phase's time is floored to a microsecond
    assert abs(record.run_start_unix_us / 1e6 - time.time()) < 3600
    assert report_from_dict(json.loads(json.dumps(report_to_dict(report)))) == report
    # the samplers' series: times within the run, values numbers
    for s in report.series:
        assert len(s.t_ms) == len(s.values)
        assert all(0 <= t <= report.summary.wall_s * 1000 + 1000 for t in s.t_ms)


def _report_dict(ranks: int, *, series: bool, host: str = "node-1", phase: str = "data") -> dict[str, Any]:
    records = [recent_to_dict(_record(50, rank if ranks > 1 else None, seed=rank)) for rank in range(ranks)]
    for record in records:
        record["host"] = host
        record["phases_us"] = {(phase if name == "data" else name): v for name, v in record["phases_us"].items()}
    data: dict[str, Any] = {"schema_version": 1, "complete": True, "notes": ["a \u2028 note\x1b[31m"]}
    data["recent_steps"] = records
    if series:
        data["series"] = [{"name": "host_cpu", "unit": "cores", "t_ms": [1.5, 2.5], "values": [0.5, 1.25]}]
    return data


@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("series", [False, True])
@pytest.mark.parametrize(("host", "phase"), [("node-1", "data"), ('"h\\o\x00st\u2028', 'd"a\nt\x1ba ü')])
def test_the_report_text_is_json_dumps_to_the_byte(ranks: int, series: bool, host: str, phase: str) -> None:
    """``report.json`` writes the record's lists of ints in C (``_native.json_ints``): the text is
    the one ``json.dumps`` writes, with names that need escaping, with and without the series."""
    from stallscope.report.io import _dumps, report_json

    data = _report_dict(ranks, series=series, host=host, phase=phase)
    assert report_json(data) == _dumps(data)
    assert json.loads(report_json(data)) == data


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["recent_steps"][0]["start_delta_us"].__setitem__(3, True),  # a bool is not an int here
        lambda d: d["recent_steps"][0]["phases_us"]["compute"].__setitem__(0, 2**70),  # past 64 bits
        lambda d: d["recent_steps"][0]["phases_us"]["compute"].__setitem__(0, 1.5),
        lambda d: d["recent_steps"][0].__setitem__("start_delta_us", tuple(d["recent_steps"][0]["start_delta_us"])),
        lambda d: d.__setitem__("later", 1),  # a key after the record: written by json.dumps alone
        lambda d: d.pop("recent_steps"),
        lambda d: d.__setitem__("recent_steps", []),
        lambda d: d.__setitem__("recent_steps", tuple(d["recent_steps"])),
        lambda d: [d.pop(k) for k in ("schema_version", "complete", "notes")],  # the record alone
        lambda d: d.update(recent_steps=d.pop("recent_steps")),  # the series before the record
        lambda d: d["recent_steps"][0].__setitem__(5, "x"),  # a key that is not a str
        lambda d: d["recent_steps"][0]["phases_us"].__setitem__(7, [1, 2]),
    ],
)
def test_what_the_c_writer_cannot_write_json_dumps_does(change: Any) -> None:
    from stallscope.report.io import _dumps, report_json

    data = _report_dict(2, series=True)
    change(data)
    try:
        want = _dumps(data)
    except TypeError:  # json.dumps refuses it: so must the report's writer
        with pytest.raises(TypeError):
            report_json(data)
        return
    assert report_json(data) == want


def test_json_ints_writes_any_64_bit_int_and_refuses_the_rest() -> None:
    from stallscope.timeline.stats import native_json_ints

    if native_json_ints is None:
        pytest.skip("the Python twin is in use")
    rng = random.Random(7)
    values = [0, -1, 1, 9, 10, -10, 2**63 - 1, -(2**63), *(rng.randrange(-(2**63), 2**63) for _ in range(500))]
    assert native_json_ints(values) == json.dumps(values, separators=(",", ":"))
    assert native_json_ints(tuple(values)) == json.dumps(values, separators=(",", ":"))
    assert native_json_ints([]) == "[]"
    for bad in ([True], [2**63], [-(2**63) - 1], [1.0], ["1"], [None]):
        assert native_json_ints(bad) is None
    with pytest.raises(TypeError):
        native_json_ints(iter([1]))
