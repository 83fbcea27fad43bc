"""Planted bottleneck (transformers): ``eval_strategy="steps", eval_steps=2`` over an evaluation
set of 16 batches, so evaluation takes most of the run.

Expected top finding: ``validation.frequency``, naming ``TrainingArguments(eval_steps=...)``;
the run still evaluates (at its last step at least).

    python examples/transformers_frequent_eval.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cli  # noqa: E402
from transformers_common import train  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "transformers_frequent_eval"
EXPECTED = "validation.frequency"
SMALL = {"epochs": 1, "batches": 30}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 60,
    eval_batches: int = 16,
    eval_strategy: str = "steps",
    eval_steps: int = 2,
    eval_dataset_fraction: float = 1.0,
) -> Report | None:
    """``eval_dataset_fraction``: evaluate on that part of the evaluation set (a suggestion's
    next lever when fewer evaluations alone are not enough)."""
    return train(
        report_dir=report_dir,
        console=console,
        epochs=epochs,
        batches=batches,
        eval_batches=max(1, round(eval_batches * eval_dataset_fraction)),
        eval_strategy=eval_strategy,
        eval_steps=eval_steps,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
