"""How a gate verdict reads: plain lines (logs, ``AssertionError``), rich text, JSON.

``format_verdict`` and ``render_verdict`` build output from a ``Verdict``; ``print_verdict`` is
the only function here that writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from stallscope.analysis.regression import Explanation, RunFacts, Verdict
from stallscope.report.render import gain_text
from stallscope.report.safe import plain

#: version of the ``--format json`` object; bumped when a field changes meaning or goes away
VERDICT_FORMAT_VERSION = 2

#: how a caller names the reports: one path, or one per run
Paths = str | Sequence[str] | None


def pct(fraction: float) -> str:
    return f"{fraction:.1%}"


def points(delta: float) -> str:
    """A difference of fractions in percentage points: ``+4.4 pp``."""
    # the sign is the change's own: a fall too small to show is "-0.0 pp", not "+0.0 pp"
    return f"{'-' if delta < 0 else '+'}{abs(round(delta * 100, 1)):.1f} pp"


def rounded(delta: float) -> float:
    """A difference of two report fractions (6 decimals each) for JSON, without float noise:
    ``0.000372``, not ``0.00037199999999999993``."""
    return round(delta, 6) + 0.0  # + 0.0 turns -0.0 into 0.0


def _spread_pp(delta: float) -> str:
    return f"{round(delta * 100, 1) + 0.0:.1f} pp"


def headline(verdict: Verdict) -> str:
    """One line: the decision and the numbers behind it."""
    word = "REGRESSION" if verdict.regressed else "OK"
    cur = verdict.current_idle
    if verdict.baseline_idle is not None and verdict.increase is not None and verdict.allowed_increase is not None:
        n = len(verdict.baseline)
        if verdict.paired:
            text = (
                f"{word}: accelerator idle {pct(cur)} on the head commit vs {pct(verdict.baseline_idle)} on the base, "
                f"paired over {n} run{'s' if n != 1 else ''} each"
            )
        else:
            of = f" (mean of {n} runs)" if n > 1 else ""
            text = f"{word}: accelerator idle {pct(cur)} vs baseline {pct(verdict.baseline_idle)}{of}"
        text += f" ({points(verdict.increase)}, allowed {points(verdict.allowed_increase)})"
        if verdict.over_max_idle and verdict.settings.max_idle is not None:
            text += f"; above the {pct(verdict.settings.max_idle)} maximum"
        return text
    limit = verdict.settings.max_idle if verdict.settings.max_idle is not None else 1.0
    relation = "above" if verdict.over_max_idle else "within"
    return f"{word}: accelerator idle {pct(cur)}, {relation} the allowed maximum {pct(limit)}"


def spread_lines(verdict: Verdict) -> list[str]:
    """The runs' spread and the bound the increase was held against (empty for a ceiling)."""
    sp = verdict.spread
    if sp is None or verdict.increase is None:
        return []
    sd = f", spread (sd) {_spread_pp(sp.sd)}" if sp.sd is not None else ""
    if verdict.paired:
        pairs = ", ".join(
            f"{pct(b.idle_fraction)} -> {pct(h.idle_fraction)}"
            for b, h in zip(verdict.baseline, verdict.current, strict=True)
        )
        lines = [f"pairs (base -> head): {pairs}; mean difference {points(sp.mean)}{sd}"]
    else:
        values = ", ".join(pct(v) for v in sp.values)
        label = "baseline runs" if sp.n > 1 else "baseline run"
        mean = f"; mean {pct(sp.mean)}" if sp.n > 1 else ""
        lines = [f"{label}: {values} idle{mean}{sd}"]
    if sp.bound is None or sp.t is None or sp.sd is None or sp.factor is None:
        lines.append(
            f"between-run noise unknown with {sp.n} {'pair' if verdict.paired else 'baseline run'}"
            f"{'s' if sp.n != 1 else ''}: the allowed {points(verdict.settings.max_increase)} alone decides "
            f"(see the note)"
        )
        return lines
    q = f"{sp.quantile:.0%}" if round(sp.quantile * 100, 6).is_integer() else f"{sp.quantile:.1%}"
    df = sp.n - 1
    if verdict.paired:
        formula = (
            f"bound: {q} one-sided paired t-test, the mean difference must exceed t x sd / sqrt({sp.n}) = "
            f"{sp.t:.2f} x {_spread_pp(sp.sd)} / {sp.n**0.5:.2f} = {points(sp.bound)} (t with {df} degrees of freedom)"
        )
        crossed = verdict.over_bound
        where = f"the mean difference {points(sp.mean)}"
    else:
        formula = (
            f"bound: {q} prediction bound for a healthy run = mean + t x sd x sqrt(1+1/{sp.n}) = "
            f"{pct(sp.mean)} + {sp.t:.2f} x {_spread_pp(sp.sd)} x {(1 + 1 / sp.n) ** 0.5:.2f} = {pct(sp.bound)} "
            f"(t with {df} degrees of freedom)"
        )
        crossed = verdict.over_bound
        where = f"the current run's {pct(verdict.current_idle)}"
    lines.append(formula)
    runs = "the pairs" if verdict.paired else "healthy runs"
    if crossed:
        lines.append(f"{where} is above the bound: beyond what {runs} scatter")
    else:
        lines.append(f"{where} is within the bound: no more than {runs} scatter")
    return lines


def noise_line(verdict: Verdict) -> str | None:
    """The within-run evidence (the idle windows) in one sentence, when it was computed."""
    iv = verdict.interval
    if iv is None:
        return None
    where = f"{iv.confidence:.0%} block-bootstrap interval of the increase {points(iv.low)} to {points(iv.high)}"
    where += f" ({iv.current_windows} vs {iv.baseline_windows} windows, blocks of {iv.block_windows})"
    if iv.above_zero:
        return f"{where}: above zero, the windows see idle time go up"
    if iv.high < 0:
        return f"{where}: below zero, idle time went down"
    if verdict.over_threshold:
        return (
            f"{where}: includes zero, so the windows alone cannot tell; idle time that comes in bursts "
            f"(a validation or a checkpoint a few times a run) looks like this, and the run-level numbers decide"
        )
    return f"{where}: includes zero"


def close_line(verdict: Verdict) -> str | None:
    """A pass that used most of its allowance says so."""
    if not verdict.close or verdict.increase is None or verdict.allowed_increase is None:
        return None
    spare = verdict.allowed_increase - verdict.increase
    short = _spread_pp(spare) if spare >= 0.0005 else "less than 0.1 pp"
    return (
        f"close: the increase {points(verdict.increase)} is {short} short of the allowed "
        f"{points(verdict.allowed_increase)}"
    )


def _finding_line(rank: int, e: Explanation) -> str:
    f = e.finding
    extra = []
    if e.grown_phase is not None:
        extra.append(f"about the {e.grown_phase} phase, which grew")
    if e.new:
        extra.append("new since the baseline")
    tail = f"  [{'; '.join(extra)}]" if extra else ""
    return f"{rank}. {f.id}  {gain_text(f)}{tail}"


def _where(paths: Paths) -> str:
    if paths is None:
        return ""
    if isinstance(paths, str):
        return f" {paths}"
    return f" {', '.join(paths)}" if len(paths) <= 2 else f" {paths[0]} ... {paths[-1]}"


def _facts(label: str, paths: Paths, runs: tuple[RunFacts, ...]) -> str | None:
    if not runs:
        return None
    first = runs[0]
    if len(runs) == 1:
        return (
            f"{label:<8}{_where(paths)}: {first.steps} steps, {first.device_kind}, idle from {first.idle_source}, "
            f"{first.windows} idle windows"
        )
    steps = sorted({r.steps for r in runs})
    windows = sorted({r.windows for r in runs})
    span = str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
    wins = str(windows[0]) if len(windows) == 1 else f"{windows[0]}-{windows[-1]}"
    return (
        f"{label:<8}{_where(paths)}: {len(runs)} runs of {span} steps, {first.device_kind}, "
        f"idle from {first.idle_source}, {wins} idle windows each"
    )


def verdict_lines(verdict: Verdict, *, current_path: Paths = None, baseline_path: Paths = None) -> list[str]:
    lines = [headline(verdict)]
    lines.extend(f"  {line}" for line in spread_lines(verdict))
    if (noise := noise_line(verdict)) is not None:
        lines.append(f"  windows: {noise}")
    if (close := close_line(verdict)) is not None:
        lines.append(f"  {close}")
    if verdict.baseline and verdict.settings.max_idle is not None and not verdict.over_max_idle:
        lines.append(
            f"  ceiling: idle {pct(verdict.current_idle)} is within the allowed maximum "
            f"{pct(verdict.settings.max_idle)}"
        )
    if verdict.regressed:
        grown = verdict.grown_phases
        if grown:
            lines.append("  phases that grew (share of wall time, baseline -> current):")
            lines.extend(
                f"    {d.phase:<12} {pct(d.baseline):>6} -> {pct(d.current):>6}  {points(d.delta)}" for d in grown
            )
        if verdict.explanations:
            lines.append("  findings that explain it, those about a phase that grew first, then best first:")
            for rank, e in enumerate(verdict.explanations, start=1):
                lines.append(f"    {_finding_line(rank, e)}")
                if e.finding.fix:
                    lines.append(f"       fix: {e.finding.fix}")
        else:
            lines.append("  the current run has no finding that predicts a saving of 2% or more")
    lines.extend(f"  note: {n}" for n in verdict.notes)
    for label, paths, runs in (
        ("current", current_path, verdict.current),
        ("baseline", baseline_path, verdict.baseline),
    ):
        if (facts := _facts(label, paths, runs)) is not None:
            lines.append(f"  {facts}")
    return lines


def format_verdict(verdict: Verdict, *, current_path: Paths = None, baseline_path: Paths = None) -> str:
    """The verdict as plain lines: what ``check`` prints and what ``stallscope.testing`` raises."""
    lines = verdict_lines(verdict, current_path=current_path, baseline_path=baseline_path)
    return "\n".join(plain(line) for line in lines)


def render_verdict(verdict: Verdict, *, current_path: Paths = None, baseline_path: Paths = None) -> Text:
    """The same lines, the headline coloured for terminals."""
    lines = [plain(line) for line in verdict_lines(verdict, current_path=current_path, baseline_path=baseline_path)]
    text = Text(lines[0], style="bold red" if verdict.regressed else "bold green")
    for line in lines[1:]:
        text.append("\n")
        stripped = line.lstrip()
        style = "dim" if stripped.startswith(("note:", "current", "baseline")) else ""
        text.append(line, style="yellow" if stripped.startswith("close:") else style)
    return text


def print_verdict(
    console: Console, verdict: Verdict, *, current_path: Paths = None, baseline_path: Paths = None
) -> None:
    console.print(
        render_verdict(verdict, current_path=current_path, baseline_path=baseline_path),
        soft_wrap=True,
        highlight=False,
    )


def _facts_dict(f: RunFacts) -> dict[str, Any]:
    return {
        "name": f.name,
        "gpu_idle_fraction": f.idle_fraction,
        "idle_source": f.idle_source,
        "device_kind": f.device_kind,
        "steps": f.steps,
        "idle_windows": f.windows,
        "complete": f.complete,
    }


def _paths_value(paths: Paths) -> str | list[str] | None:
    return paths if paths is None or isinstance(paths, str) else list(paths)


def verdict_to_dict(verdict: Verdict, *, current_path: Paths = None, baseline_path: Paths = None) -> dict[str, Any]:
    """The machine-readable verdict that ``check --format json`` prints."""
    iv = verdict.interval
    sp = verdict.spread
    s = verdict.settings
    return {
        "verdict": "regression" if verdict.regressed else "pass",
        "exit_code": verdict.exit_code,
        "summary": headline(verdict),
        "method": verdict.method,
        "paired": verdict.paired,
        "current": {
            "path": _paths_value(current_path),
            "gpu_idle_fraction": verdict.current_idle,
            "runs": [_facts_dict(f) for f in verdict.current],
        },
        "baseline": None
        if verdict.baseline_idle is None
        else {
            "path": _paths_value(baseline_path),
            "gpu_idle_fraction": verdict.baseline_idle,
            "runs": [_facts_dict(f) for f in verdict.baseline],
        },
        "increase": None if verdict.increase is None else rounded(verdict.increase),
        "allowed_increase": verdict.allowed_increase,
        "max_increase": s.max_increase,
        "over_threshold": verdict.over_threshold,
        "spread": None
        if sp is None
        else {
            "values": list(sp.values),
            "n": sp.n,
            "mean": sp.mean,
            "sd": sp.sd,
            "quantile": sp.quantile,
            "t": sp.t,
            "factor": sp.factor,
            "bound": sp.bound,
        },
        "over_bound": verdict.over_bound,
        "false_alarm": s.false_alarm,
        "close": verdict.close,
        "max_idle": s.max_idle,
        "over_max_idle": verdict.over_max_idle,
        "interval": None
        if iv is None
        else {
            "low": rounded(iv.low),
            "high": rounded(iv.high),
            "confidence": iv.confidence,
            "resamples": iv.resamples,
            "seed": iv.seed,
            "block_windows": iv.block_windows,
            "above_zero": iv.above_zero,
        },
        "phase_deltas": [
            {"phase": d.phase, "baseline": d.baseline, "current": d.current, "delta": rounded(d.delta)}
            for d in verdict.phase_deltas
        ],
        "findings": [
            {
                "id": e.finding.id,
                "title": e.finding.title,
                "est_speedup": e.finding.est_speedup,
                "est_saving_fraction": e.finding.est_saving_fraction,
                "fix": e.finding.fix,
                "suggestion": dict(e.finding.suggestion),
                "new": e.new,
                "grown_phase": e.grown_phase,
            }
            for e in verdict.explanations
        ],
        "notes": list(verdict.notes),
        "format_version": VERDICT_FORMAT_VERSION,
    }
