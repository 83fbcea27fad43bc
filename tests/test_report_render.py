from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from rich.console import Console

from stallscope.analysis.finding import Finding
from stallscope.report.render import format_text, print_diagnosis, render_panel
from stallscope.report.schema import Summary

MakeSummary = Callable[..., Summary]
MakeFinding = Callable[..., Finding]

HEADLINE = "accelerator idle 60% (host_phases)  ·  100 steps in 2.00 s (50.0 steps/s)"


@pytest.fixture
def findings(make_finding: MakeFinding) -> tuple[Finding, ...]:
    return (
        make_finding(),
        make_finding(
            id="checkpoint.frequency",
            title="Checkpoint saves block training 12% of the time",
            est_saving_fraction=0.1,
            est_speedup=1.111,
            confidence="medium",
            fix="Save a checkpoint every 500 steps.",
            suggestion={"every_n_steps": 500},
            snippet="if step % 500 == 0:\n    torch.save(state, path)",
        ),
    )


def _render(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=100)
    console.print(renderable)
    out = console.file.getvalue()
    assert isinstance(out, str)
    return out


# -- plain text ------------------------------------------------------------------------------


def test_text_has_headline_bars_and_ranked_fixes(make_summary: MakeSummary, findings: tuple[Finding, ...]) -> None:
    text = format_text("epoch 0", make_summary(), findings)
    lines = text.splitlines()
    assert lines[0] == f"StallScope · epoch 0: {HEADLINE}"
    # bars are 28 wide: 0.6 * 28 = 16.8 -> 17 filled, 0.4 * 28 = 11.2 -> 11 filled
    assert "    data         " + "#" * 17 + "." * 11 + "  60.0%" in lines
    assert "    compute      " + "#" * 11 + "." * 17 + "  40.0%" in lines
    assert not any("h2d" in line for line in lines)  # phases with no time are left out
    assert lines.index("    data         " + "#" * 17 + "." * 11 + "  60.0%") < lines.index(
        "    compute      " + "#" * 11 + "." * 17 + "  40.0%"
    )
    first = lines.index("    1. data.workers  x2.00 faster (saves 50% of wall time)  confidence high")
    second = lines.index("    2. checkpoint.frequency  x1.11 faster (saves 10% of wall time)  confidence medium")
    assert first < second
    assert lines[first + 1] == "       Training waits for data 60% of the time"
    assert lines[first + 2] == "       Set num_workers=4 in the DataLoader."
    assert lines[first + 3] == "         DataLoader(dataset, num_workers=4)"
    assert "       Save a checkpoint every 500 steps." in lines
    assert "             torch.save(state, path)" in lines


def test_a_floor_reads_at_least(make_summary: MakeSummary, make_finding: MakeFinding) -> None:
    floor = make_finding(est_speedup=5.2, est_saving_fraction=0.81, est_speedup_bound="lower")
    text = format_text("epoch 0", make_summary(), [floor])
    assert "    1. data.workers  at least x5.20 faster (saves 81% of wall time)  confidence high" in text.splitlines()
    assert "at least x5.20 faster" in _render(render_panel("epoch 0", make_summary(), [floor]))
    estimate = format_text("epoch 0", make_summary(), [make_finding(est_speedup=5.2, est_saving_fraction=0.81)])
    assert "at least" not in estimate


def test_text_without_findings_says_no_fix(make_summary: MakeSummary) -> None:
    text = format_text("run (3 epochs)", make_summary(), (), notes=("NVML is not available",))
    assert "no fix predicted to save 2% or more of wall time" in text
    assert "fixes, best first" not in text
    assert text.splitlines()[-1] == "  note: NVML is not available"


def test_text_shows_at_most_five_fixes(make_summary: MakeSummary, make_finding: MakeFinding) -> None:
    ids = ["data.workers", "data.prefetch", "data.pin_memory", "host.sync", "compute.amp", "gpu.throttle"]
    many = [make_finding(id=finding_id, est_saving_fraction=0.1) for finding_id in ids]
    text = format_text("epoch 0", make_summary(), many)
    assert "    5. " in text
    assert "    6. " not in text


# -- rich panel ------------------------------------------------------------------------------


def test_panel_has_title_headline_bars_and_ranked_fixes(
    make_summary: MakeSummary, findings: tuple[Finding, ...]
) -> None:
    out = _render(render_panel("epoch 0", make_summary(), findings, notes=("a short run",)))
    assert "StallScope · epoch 0" in out
    assert HEADLINE in out
    assert "Where the time went" in out
    assert "█" * 17 + "░" * 11 + "  60.0%" in out
    assert "█" * 11 + "░" * 17 + "  40.0%" in out
    assert " 1. data.workers  x2.00 faster (saves 50% of wall time)" in out
    assert " 2. checkpoint.frequency  x1.11 faster (saves 10% of wall time)" in out
    assert out.index("1. data.workers") < out.index("2. checkpoint.frequency")
    assert "Set num_workers=4 in the DataLoader." in out
    assert "DataLoader(dataset, num_workers=4)" in out
    assert "note: a short run" in out


def test_panel_without_findings_says_no_fix(make_summary: MakeSummary) -> None:
    out = _render(render_panel("epoch 0", make_summary(), ()))
    assert "No fix predicted to save 2% or more of wall time." in out
    assert "Fixes, best first" not in out


def test_square_brackets_in_user_text_are_not_markup(make_summary: MakeSummary, make_finding: MakeFinding) -> None:
    finding = make_finding(fix="Set loader[num_workers] to [bold]4[/bold].")
    out = _render(render_panel("epoch 0", make_summary(), (finding,)))
    assert "Set loader[num_workers] to [bold]4[/bold]." in out
    assert "Set loader[num_workers] to [bold]4[/bold]." in format_text("epoch 0", make_summary(), (finding,))


# -- printing --------------------------------------------------------------------------------


def test_print_uses_plain_text_when_not_a_terminal(
    console: Console, make_summary: MakeSummary, findings: tuple[Finding, ...]
) -> None:
    print_diagnosis(console, "epoch 0", make_summary(), findings)
    out = console.file.getvalue()
    assert out.startswith(f"StallScope · epoch 0: {HEADLINE}\n")
    assert "╭" not in out
    assert "█" not in out
    assert "1. data.workers" in out
    assert "\x1b[" not in out  # no colour codes in logs


def test_print_uses_the_panel_on_a_terminal(make_summary: MakeSummary, findings: tuple[Finding, ...]) -> None:
    terminal = Console(file=io.StringIO(), width=100, force_terminal=True)
    print_diagnosis(terminal, "epoch 0", make_summary(), findings)
    out = terminal.file.getvalue()
    assert "╭" in out
    assert "█" in out
    assert "data.workers" in out
    assert "Where the time went" in out


def test_a_cpu_only_run_names_the_cpu_not_an_accelerator(make_summary: MakeSummary) -> None:
    """On a CPU-only run the CPU does the training: its idle time is not an idle accelerator's."""
    cpu = "CPU (no GPU): training idle 60% (host_phases)  ·  100 steps in 2.00 s (50.0 steps/s)"
    assert format_text("run", make_summary(), (), device="cpu").startswith(f"StallScope · run: {cpu}")
    assert cpu in _render(render_panel("run", make_summary(), (), device="cpu"))
    for device in ("cuda", None):
        assert format_text("run", make_summary(), (), device=device).startswith(f"StallScope · run: {HEADLINE}")
        assert HEADLINE in _render(render_panel("run", make_summary(), (), device=device))
