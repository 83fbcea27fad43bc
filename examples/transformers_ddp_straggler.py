"""Planted straggler (transformers): a ``Trainer`` job of two CPU ranks under ``torchrun`` (gloo)
where only rank 1's ``data_collator`` is slow (a wait per batch: slow storage), with
``dataloader_num_workers=0``. Rank 0 waits for rank 1 in every backward's all-reduce, which it
records as compute. Expected top finding: ``data.workers`` naming rank 1 and its ``data`` phase.

    python examples/transformers_ddp_straggler.py      # launches 2 ranks with torchrun
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cli  # noqa: E402
from ddp_common import job_report, torchrun, worker_settings  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "transformers_ddp_straggler"
EXPECTED = "data.workers"
#: the rank and the phase the top finding must name
EXPECTED_RANK = 1
EXPECTED_PHASE = "data"
SMALL = {"epochs": 1, "batches": 24}


def train(
    *,
    report_dir: str,
    console: bool = True,
    epochs: int = 2,
    batches: int = 60,
    latency_ms: float = 30.0,
    slow_rank: int = EXPECTED_RANK,
    dataloader_num_workers: int = 0,
    rank: int | None = None,
) -> None:
    """One rank's ``Trainer.train()`` (each process ``torchrun`` starts runs it); ``batches``
    per rank. ``dataloader_num_workers`` applies to ``rank`` only when it is given."""
    from transformers_common import CostlyCollator
    from transformers_common import train as train_tiny

    me = int(os.environ.get("RANK", "0"))
    workers = dataloader_num_workers if rank is None or rank == me else 0
    train_tiny(
        report_dir=report_dir,
        console=console,
        epochs=epochs,
        batches=batches * 2,  # the Trainer's sampler gives each of the two ranks half
        collator=CostlyCollator(latency_ms=latency_ms if me == slow_rank else 0.0),
        dataloader_num_workers=workers,
        ddp_backend="gloo",
    )


def run(*, report_dir: str = f"runs/{NAME}", console: Any = True, **settings: Any) -> Report | None:
    """Launch the two ranks with ``torchrun``; the job's report (rank 0's)."""
    torchrun(__file__, {"report_dir": str(Path(report_dir).resolve()), "console": console is not False, **settings})
    return job_report(report_dir)


if __name__ == "__main__":
    worker = worker_settings(sys.argv)
    if worker is not None:
        train(**worker)
    else:
        cli(run, __doc__ or NAME, NAME)
