from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from stallscope._exceptions import ReportError
from stallscope.analysis.finding import Finding
from stallscope.report.schema import (
    SCHEMA_VERSION,
    DeviceInfo,
    Report,
    RunInfo,
    Summary,
    finding_from_dict,
    finding_to_dict,
    report_from_dict,
    report_to_dict,
    summary_to_dict,
)

MakeReport = Callable[..., Report]


def _minimal() -> dict[str, Any]:
    """The least a report needs to be read (what an old or hand-written file may hold)."""
    return {
        "schema_version": 1,
        "run": {},
        "summary": {
            "wall_s": 1.5,
            "steps": 3,
            "steps_per_s": 2.0,
            "gpu_idle_fraction": 0.25,
            "idle_source": "nvml",
            "phase_fractions": {"compute": 0.75, "data": 0.25},
        },
    }


def test_schema_version_is_one() -> None:
    assert SCHEMA_VERSION == 1


def test_round_trip_gives_back_an_equal_report(
    make_report: MakeReport, make_summary: Callable[..., Summary], make_finding: Callable[..., Finding]
) -> None:
    report = make_report(
        summary=make_summary(
            nvml={"util_mean": 0.37, "util_p10": 0.1, "util_p50": 0.4, "mem_used_max_bytes": 123},
            idle_windows=({"steps": 16, "wall_s": 0.5, "idle_fraction": 0.25},),
            phase_seconds={"data": 1.2, "compute": 0.8},
            step_time_s={"mean": 0.02, "p10": 0.01, "p50": 0.02, "p90": 0.03, "max": 0.04},
            data_wait_s={"mean": 0.012},
        ),
        tail=make_summary(wall_s=0.25, steps=0),
        findings=(
            make_finding(),
            make_finding(
                id="checkpoint.frequency",
                est_saving_fraction=0.1,
                suggestion={"every_n_steps": 500},
                est_speedup_bound="lower",
            ),
        ),
    )
    assert report_from_dict(report_to_dict(report)) == report


def test_round_trip_through_json_text(make_report: MakeReport) -> None:
    report = make_report(
        run=RunInfo(
            started_at="2024-05-01T12:00:00+00:00",
            host="gpu-box",
            torch_version="2.13.0",
            device=DeviceInfo(kind="cuda", name="NVIDIA H100", index=1, uuid="GPU-5c1a"),
        )
    )
    data = report_to_dict(report)
    assert json.loads(json.dumps(data)) == data
    assert report_from_dict(json.loads(json.dumps(data))) == report


def test_layout_follows_the_spec(make_report: MakeReport) -> None:
    data = report_to_dict(make_report(complete=False))
    assert data["schema_version"] == 1
    assert data["complete"] is False
    assert {"started_at", "host", "torch_version", "device", "dataloader"} <= data["run"].keys()
    assert data["run"]["device"] == {"kind": "cpu", "name": "Some CPU", "index": None}  # no uuid key
    assert data["run"]["dataloader"]["batch_size"] == 32
    summary_keys = {"wall_s", "steps", "steps_per_s", "gpu_idle_fraction", "idle_source", "phase_fractions"}
    assert summary_keys <= data["summary"].keys()
    assert "nvml" not in data["summary"]  # absent, not null, when NVML was not sampled
    assert data["epochs"][0]["index"] == 0
    assert summary_keys <= data["epochs"][0]["summary"].keys()
    finding = data["findings"][0]
    assert {"id", "title", "est_saving_fraction", "est_speedup", "confidence", "evidence", "fix", "suggestion"} <= (
        finding.keys()
    )
    assert finding["suggestion"] == {"num_workers": 4}
    assert finding["est_speedup_bound"] == "estimate"
    assert data["notes"] == ["a note"]


def test_a_floor_round_trips_and_an_older_finding_reads_as_an_estimate(make_finding: Callable[..., Finding]) -> None:
    floor = finding_to_dict(make_finding(est_speedup_bound="lower"))
    assert floor["est_speedup_bound"] == "lower"
    assert finding_from_dict(floor, "f").est_speedup_bound == "lower"
    del floor["est_speedup_bound"]
    assert finding_from_dict(floor, "f").est_speedup_bound == "estimate"
    with pytest.raises(ReportError, match="est_speedup_bound"):
        finding_from_dict({**floor, "est_speedup_bound": "upper"}, "f")


def test_no_dataloader_key_for_a_plain_iterable(make_report: MakeReport) -> None:
    report = make_report(
        run=RunInfo(started_at="", host="h", torch_version="", device=DeviceInfo(kind="cpu", name="c"))
    )
    data = report_to_dict(report)
    assert "dataloader" not in data["run"]
    assert report_from_dict(data).run.dataloader is None


def test_nan_and_infinity_become_null(
    make_report: MakeReport, make_summary: Callable[..., Summary], make_finding: Callable[..., Finding]
) -> None:
    report = make_report(
        summary=make_summary(nvml={"util_mean": math.nan, "mem_used_max_bytes": math.inf}),
        findings=(make_finding(evidence={"ratio": math.nan, "nested": [1.0, -math.inf]}),),
    )
    data = report_to_dict(report)
    assert data["summary"]["nvml"] == {"util_mean": None, "mem_used_max_bytes": None}
    assert data["findings"][0]["evidence"] == {"ratio": None, "nested": [1.0, None]}
    json.dumps(data, allow_nan=False)  # strict JSON


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("phase_fractions", {"compute": math.nan}),
        ("phase_seconds", {"compute": math.inf}),
        ("step_time_s", {"mean": -math.inf, "p50": 1.0}),
        ("data_wait_s", {"mean": 1e308, "max": 1e308}),  # finite, but their sum is not
        ("idle_windows", ({"steps": 2, "wall_s": math.nan, "idle_fraction": 0.5},)),
    ],
)
def test_a_summary_of_numbers_is_copied_and_any_other_is_cleaned(
    make_summary: Callable[..., Summary], field: str, bad: Any
) -> None:
    """Summaries of finite numbers go to the JSON as they are (checked with C's loops); a NaN or an
    infinity anywhere in them still becomes null, and the result is the same either way."""
    clean = make_summary(idle_windows=({"steps": 2, "wall_s": 0.5, "idle_fraction": 0.25},))
    out = summary_to_dict(clean)
    assert out["phase_fractions"] == dict(clean.phase_fractions)
    assert out["phase_fractions"] is not clean.phase_fractions  # a copy
    assert out["idle_windows"] == [{"steps": 2, "wall_s": 0.5, "idle_fraction": 0.25}]
    data = summary_to_dict(make_summary(**{field: bad}))
    json.dumps(data, allow_nan=False)  # strict JSON
    cleaned = data[field] if field != "idle_windows" else data[field][0]
    if field == "data_wait_s":
        assert cleaned == {"mean": 1e308, "max": 1e308}
    else:
        assert None in cleaned.values()


def test_a_minimal_report_reads_with_defaults() -> None:
    report = report_from_dict(_minimal())
    assert report.summary.steps == 3
    assert report.summary.gpu_idle_fraction == 0.25
    assert report.summary.phase_fractions == {"compute": 0.75, "data": 0.25}
    assert report.summary.nvml is None
    assert report.epochs == ()
    assert report.findings == ()
    assert report.notes == ()
    assert report.run.device.kind == "unknown"
    assert report.run.dataloader is None


def test_report_finding_looks_up_by_id(make_report: MakeReport, make_finding: Callable[..., Finding]) -> None:
    pin = make_finding(id="data.pin_memory", est_saving_fraction=0.1)
    report = make_report(findings=(make_finding(), pin))
    assert report.finding("data.pin_memory") is pin
    assert report.finding("compute.amp") is None


def test_summary_rejects_an_unknown_idle_source(make_summary: Callable[..., Summary]) -> None:
    with pytest.raises(ValueError, match="'guess'"):
        make_summary(idle_source="guess")


def _set(path: str, value: Any) -> dict[str, Any]:
    """``_minimal()`` with the dotted ``path`` set to ``value``."""
    data = copy.deepcopy(_minimal())
    data["findings"] = [
        {"id": "data.workers", "title": "t", "est_saving_fraction": 0.5, "est_speedup": 2.0, "fix": "f"}
    ]
    data["epochs"] = [{"index": 0, "summary": copy.deepcopy(data["summary"]), "findings": []}]
    node: Any = data
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


def test_the_probe_documents_itself() -> None:
    data = _set("summary.steps", 7)
    assert data["summary"]["steps"] == 7
    report = report_from_dict(data)
    assert report.summary.steps == 7
    assert report.epochs[0].summary.steps == 3
    assert report.findings[0].id == "data.workers"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "top level is not a JSON object"),
        ("report", "top level is not a JSON object"),
        ({"run": {}}, "no schema_version"),
        ({**_minimal(), "schema_version": 2}, "schema_version 2 is newer than this StallScope reads (1)"),
        ({**_minimal(), "schema_version": "1"}, "schema_version must be a positive integer"),
        ({**_minimal(), "schema_version": True}, "schema_version must be a positive integer"),
        ({**_minimal(), "schema_version": 0}, "schema_version must be a positive integer"),
        ({k: v for k, v in _minimal().items() if k != "summary"}, "report.summary is missing"),
        ({k: v for k, v in _minimal().items() if k != "run"}, "report.run is missing"),
        (_set("summary.gpu_idle_fraction", 1.5), "gpu_idle_fraction must be a fraction in [0, 1], got 1.5"),
        (_set("summary.gpu_idle_fraction", -0.01), "gpu_idle_fraction must be a fraction in [0, 1]"),
        (_set("summary.gpu_idle_fraction", 37), "gpu_idle_fraction must be a fraction in [0, 1]"),
        (_set("summary.gpu_idle_fraction", "0.3"), "gpu_idle_fraction has the wrong type (str)"),
        (_set("summary.gpu_idle_fraction", None), "gpu_idle_fraction has the wrong type"),
        (_set("summary.phase_fractions", {"data": 1.2}), "phase_fractions.data must be a fraction in [0, 1]"),
        (_set("summary.phase_fractions", {"data": True}), "phase_fractions.data must be a fraction in [0, 1]"),
        (_set("summary.phase_fractions", [0.5]), "phase_fractions has the wrong type"),
        (_set("epochs.0.summary.phase_fractions", {"x": -1}), "report.epochs[0].summary.phase_fractions.x"),
        (_set("summary.idle_source", "guess"), "idle_source is 'guess'"),
        (_set("summary.steps", 2.5), "report.summary.steps has the wrong type (float)"),
        (_set("summary.wall_s", "long"), "report.summary.wall_s has the wrong type (str)"),
        (_set("summary", []), "report.summary has the wrong type"),
        (_set("findings.0.est_saving_fraction", 2), "report.findings[0].est_saving_fraction must be a fraction"),
        (_set("findings.0.id", "data.magic"), "unknown finding id 'data.magic'"),
        (_set("findings.0", "data.workers"), "report.findings[0] is not an object"),
        (_set("epochs.0", 3), "report.epochs[0] is not an object"),
        (_set("findings", {}), "report.findings must be a list, got dict"),
        (_set("summary.idle_windows", [1, 2]), "idle_windows must be a list of objects"),
    ],
)
def test_bad_reports_raise_one_line_report_errors(data: Any, message: str) -> None:
    with pytest.raises(ReportError) as caught:
        report_from_dict(data)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("run.usable_cores", "many"),
        ("notes", 5),
        ("epochs.0.findings", 5),
        ("findings.0.evidence", 5),
        ("findings.0.suggestion", ["num_workers", 4]),
        ("summary.phase_seconds", [1, 2]),
        ("summary.step_time_s", "fast"),
        ("summary.nvml", [0.5]),
    ],
)
def test_wrongly_typed_optional_fields_raise_report_errors(path: str, value: Any) -> None:
    """Not a TypeError or ValueError from deep inside: the CLI turns only ReportError into exit 2."""
    with pytest.raises(ReportError) as caught:
        report_from_dict(_set(path, value))
    assert "\n" not in str(caught.value)


def _epoch(index: int, **keys: Any) -> dict[str, Any]:
    return {"index": index, "summary": _minimal()["summary"], "findings": [], **keys}


def test_groups_of_epochs_round_trip() -> None:
    """An epoch diagnosed with a later one says so (``diagnosed_with``); the later one holds the
    group's findings and ``covers_epochs``; an epoch diagnosed alone has neither key."""
    data = {**_minimal(), "epochs": [_epoch(0, diagnosed_with=1), _epoch(1, covers_epochs=[0, 1]), _epoch(2)]}
    report = report_from_dict(data)
    assert [(e.diagnosed_with, e.covers_epochs) for e in report.epochs] == [(1, None), (None, (0, 1)), (None, None)]
    out = report_to_dict(report)["epochs"]
    assert out[0]["diagnosed_with"] == 1
    assert out[1]["covers_epochs"] == [0, 1]
    assert "diagnosed_with" not in out[2]
    assert "covers_epochs" not in out[2]
    assert report_from_dict(json.loads(json.dumps(report_to_dict(report)))) == report


@pytest.mark.parametrize(
    ("epochs", "message"),
    [
        ([_epoch(0, covers_epochs=[0, 0])], "covers_epochs must be"),
        ([_epoch(2, covers_epochs=[0, 1])], "covers_epochs must be"),
        ([_epoch(1, covers_epochs=[0, "1"])], "covers_epochs must be"),
        ([_epoch(1, covers_epochs=[0, 1, 2])], "covers_epochs must be"),
        ([_epoch(1, diagnosed_with=1)], "diagnosed_with must name a later epoch"),
        ([_epoch(1, diagnosed_with=-2)], "non-negative integer"),
        ([_epoch(0, diagnosed_with=1, covers_epochs=[0, 0])], "covers_epochs must be"),
        ([_epoch(0, diagnosed_with=1), _epoch(1)], "does not hold epoch 0"),
        ([_epoch(0, diagnosed_with=2), _epoch(1), _epoch(2, covers_epochs=[1, 2])], "does not hold epoch 0"),
    ],
)
def test_bad_groups_of_epochs_are_report_errors(epochs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ReportError, match=message):
        report_from_dict({**_minimal(), "epochs": epochs})


def test_an_epoch_with_findings_of_its_own_cannot_be_diagnosed_with_another(
    make_finding: Callable[..., Finding],
) -> None:
    finding = finding_to_dict(make_finding())
    data = {**_minimal(), "epochs": [{**_epoch(0, diagnosed_with=1), "findings": [finding]}, _epoch(1)]}
    with pytest.raises(ReportError, match="diagnosed_with and findings of its own"):
        report_from_dict(data)
