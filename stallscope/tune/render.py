"""The search as rich renderables: the table of candidates, the winning settings as a snippet.

Every string from a setting, a report or a child's output passes ``plain`` (SPEC §6) and is set
as ``Text`` (never as markup).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stallscope.report.safe import plain
from stallscope.tune.applicable import (
    LIGHTNING_CHECKPOINT_KEYS,
    LIGHTNING_TRAINER_KEYS,
    RANK_KEY,
    THREADS_KEY,
    TRANSFORMERS_KEYS,
)
from stallscope.tune.loaders import LOADER_KEYS
from stallscope.tune.search import WORKER_KEYS, Candidate, TuneResult, head_to_head


def _x(value: float | None, bound: str = "estimate") -> str:
    if value is None:
        return "-"
    return f"{'>=' if bound == 'lower' else ''}x{value:.2f}"


def _verdict(c: Candidate) -> str:
    if c.kept:
        return "kept"
    if c.verdict == "undecided":
        return "measuring"
    return {"drop": "no", "keep": "no (another kept)"}.get(c.verdict, c.verdict)


def table(result: TuneResult) -> Table:
    """One row for trial 0 and one per candidate: predicted, realized (median and 90% interval),
    pairs measured, kept or not. Fits 80 columns."""
    t = Table(title="stallscope tune", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    t.add_column("setting tried (finding)", overflow="fold", min_width=22)
    t.add_column("predicted", justify="right", no_wrap=True)
    t.add_column("realized [90%]", justify="right", min_width=8)  # the interval under the median, if need be
    t.add_column("pairs", justify="right")
    t.add_column("kept", min_width=12, overflow="fold")  # "loss changed", "not applied" whole
    if result.baseline_steps_per_s is not None:
        t.add_row(Text("as configured (trial 0)"), "", Text(f"{result.baseline_steps_per_s:.1f} steps/s"), "", "")
    for c in result.candidates:
        r = c.realized
        realized = "-" if r is None else _x(r.median) + (f" [{r.low:.2f}-{r.high:.2f}]" if r.pairs >= 2 else "")
        t.add_row(
            Text(plain(f"{c.label} ({c.finding or '-'}{', neighbour' if c.neighbour else ''})")),
            Text(_x(c.predicted, c.bound)),
            Text(realized),
            Text(str(r.pairs) if r else "0"),
            Text(plain(_verdict(c))),
        )
    return t


def _predicted_beside(result: TuneResult, neighbour: Candidate) -> Candidate | None:
    """The predicted value whose head-to-head ``neighbour`` ran (the rounds without the baseline
    that measured both)."""
    return next((c for c in result.candidates if not c.neighbour and set(c.solo) & set(neighbour.solo)), None)


def snippet(framework: str, settings: Mapping[str, Any]) -> str:
    """The kept settings as code for the user's framework."""

    def args(keys: frozenset[str]) -> str:
        return ", ".join(f"{k}={settings[k]!r}" for k in sorted(settings) if k in keys)

    lines = []
    where = f"on rank {settings[RANK_KEY]}: " if RANK_KEY in settings else ""  # a setting of one rank's loader
    if THREADS_KEY in settings:
        lines.append(f"{where}torch.set_num_threads({settings[THREADS_KEY]!r})")
    loader = {k: v for k, v in settings.items() if k in LOADER_KEYS and k != "batch_sampler"}
    if loader:
        lines.append(f"{where}DataLoader(..., {args(frozenset(loader))})")
    if settings.get("batch_sampler"):
        lines.append(
            f"{where}DataLoader(dataset, sampler=BatchSampler(sampler, batch_size, drop_last), batch_size=None)"
        )
    if framework == "transformers":
        if hf := args(TRANSFORMERS_KEYS):
            lines.append(f"TrainingArguments(..., {hf})")
        return "\n".join(lines)
    if framework == "lightning":
        if trainer := args(LIGHTNING_TRAINER_KEYS):
            lines.append(f"Trainer(..., {trainer})")
        if checkpoint := args(LIGHTNING_CHECKPOINT_KEYS - {"async_save"}):
            lines.append(f"ModelCheckpoint(..., {checkpoint})")
        if settings.get("async_save"):
            lines.append("Trainer(..., plugins=[AsyncCheckpointIO()])")
    return "\n".join(lines)


def summary(result: TuneResult, out: str) -> RenderableType:
    """What the search hands back: the settings that won, the speedup, by-hand suggestions, and
    how close the predictions came."""
    parts: list[RenderableType] = [table(result)]
    if result.stopped_because:
        parts.append(Text(f"stopped: {plain(result.stopped_because)}"))
    if result.best:
        parts.append(Text(f"best: x{result.speedup:.2f} over trial 0 with these settings:"))
        parts.extend(Text("    " + plain(line)) for line in snippet(result.framework, result.best).splitlines())
    else:
        parts.append(Text("best: the command as configured (no change was surely faster)"))
    for b in result.by_hand:
        setting = ", ".join(f"{k}={v!r}" for k, v in b.suggestion.items())
        parts.append(
            Text(plain(f"apply by hand: {b.finding} ({setting}), predicted {_x(b.predicted, b.bound)}: {b.fix}"))
        )
    for c in result.candidates:  # why a prediction was not tried, stopped early, or set aside
        said = c.verdict not in ("keep", "drop", "undecided")  # skipped, loss changed, not applied, failed...
        if (said or c.futile) and c.note and not (c.neighbour and (c.verdict == "skipped" or c.futile)):
            why = c.note
            if c.verdict == "loss changed":
                workers = any(k in c.change for k in WORKER_KEYS)
                why = (
                    f"not kept, the loss changed: {why} (a setting kept must train on the same data in the same order"
                    + (
                        "; a dataset that draws random samples in __getitem__ draws other ones with other workers)"
                        if workers
                        else ")"
                    )
                )
            parts.append(Text(plain(f"{c.label} ({c.finding}): {why}")))
        if c.reused:
            parts.append(Text(plain(f"{c.label}: {c.reused} of its {len(c.pairs)} pairs measured in an earlier step")))
        main = _predicted_beside(result, c) if c.neighbour and c.solo else None
        head = head_to_head(main, c) if main is not None else None
        if main is not None and head is not None:
            alone = len(set(c.solo) & set(main.solo))
            parts.append(
                Text(
                    plain(
                        f"{c.label} against {main.label}: {_x(head.median)} [{head.low:.2f}-{head.high:.2f}] over "
                        f"{head.pairs} rounds, the last {alone} without the baseline (both were kept against it)"
                    )
                )
            )
    errors = result.prediction_errors
    if errors:
        parts.append(Text(f"predictions were within {max(errors):.0%} on this job ({len(errors)} measured)"))
    parts.append(Text(f"wrote {plain(out)}"))
    return Group(*parts)
