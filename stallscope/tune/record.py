"""``tune.json``: what the search measured and the settings that won (written atomically)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stallscope.tune.search import Candidate, TrialRecord, TuneResult

SCHEMA_VERSION = 1


def _candidate(c: Candidate) -> dict[str, Any]:
    return {
        "finding": c.finding,
        "change": c.change,
        "settings": c.settings,
        "predicted": c.predicted,
        "bound": c.bound,
        "neighbour": c.neighbour,
        "realized": c.realized.to_json() if c.realized else None,
        "verdict": c.verdict,
        "kept": c.kept,
        "note": c.note,
        "reused_pairs": c.reused,
        "stopped_early": c.futile,
        "head_to_head_rounds": len(c.solo),
    }


def _trial(t: TrialRecord, result: TuneResult) -> dict[str, Any]:
    c = result.candidates[t.candidate] if t.candidate is not None else None
    out = t.outcome
    return {
        "number": t.number,
        "label": t.label,
        "settings": t.settings,
        "round": t.round,
        "candidate": t.candidate,
        "predicted": c.predicted if c else None,
        "realized": c.realized.to_json() if c and c.realized else None,
        "kept": c.kept if c else None,
        "status": out.status if out else "not run",
        "message": out.message if out else "",
        "steps_per_s": out.steps_per_s if out else None,
        "steps": (out.result or {}).get("steps") if out else None,
        "wall_s": out.wall_s if out else None,
        "applied": (out.result or {}).get("applied") if out else None,
        "report": str(out.report) if out and out.report.exists() else None,
        "log": str(out.log) if out else None,
    }


def to_json(result: TuneResult) -> dict[str, Any]:
    errors = result.prediction_errors
    return {
        "schema_version": SCHEMA_VERSION,
        "command": result.command,
        "framework": result.framework,
        "budget_s": result.options.budget_s,
        "wall_s": result.wall_s,
        "trial_budget": {
            "warmup_steps": result.options.warmup_steps,
            "steps": result.trial_steps,
            "seconds": result.trial_seconds,
        },
        "min_saving": result.options.min_saving,
        "interrupted": result.interrupted,
        "stopped_because": result.stopped_because,
        "baseline_steps_per_s": result.baseline_steps_per_s,
        "trials": [_trial(t, result) for t in result.trials],
        "candidates": [_candidate(c) for c in result.candidates],
        "by_hand": [
            {
                "finding": b.finding,
                "suggestion": dict(b.suggestion),
                "predicted": b.predicted,
                "bound": b.bound,
                "fix": b.fix,
            }
            for b in result.by_hand
        ],
        "best": {"settings": result.best, "speedup": result.speedup},
        "prediction_error": max(errors) if errors else None,
    }


def write(result: TuneResult, path: Path) -> None:
    """Write ``tune.json`` at ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(to_json(result), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
