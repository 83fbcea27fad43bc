"""Planted bottleneck (transformers): ``save_strategy="steps", save_steps=2``, so every other
optimizer step waits for a whole checkpoint (model, optimizer, scheduler, RNG and trainer state).

Expected top finding: ``checkpoint.frequency``, naming ``TrainingArguments(save_steps=...)``;
the run still saves (at its last step at least).

    python examples/transformers_frequent_save.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cli  # noqa: E402
from transformers_common import train  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "transformers_frequent_save"
EXPECTED = "checkpoint.frequency"
SMALL = {"epochs": 1, "batches": 30}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 60,
    save_strategy: str = "steps",
    save_steps: int = 2,
) -> Report | None:
    return train(
        report_dir=report_dir,
        console=console,
        epochs=epochs,
        batches=batches,
        save_strategy=save_strategy,
        save_steps=save_steps,
        save_total_limit=2,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
