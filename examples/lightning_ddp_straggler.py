"""Planted straggler (Lightning): a ``strategy="ddp"`` fit on two CPU ranks where only rank 1 is
slow to read its samples.

``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` starts rank 1 itself (it runs this
script again). Rank 1's samples each take ``ms_per_sample`` to read (a sleep: slow storage),
``num_workers=0``; rank 0 waits for it in every backward's all-reduce. Expected top finding:
``data.workers`` naming rank 1 and its ``data`` phase, with the job's speedup.

    python examples/lightning_ddp_straggler.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import SyntheticDataset, cli, emulate_accelerator, loader  # noqa: E402
from ddp_common import WORKER_FLAG, job_report, rank_env, worker_settings  # noqa: E402
from lightning_common import import_lightning, module_class  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "lightning_ddp_straggler"
EXPECTED = "data.workers"
EXPECTED_RANK = 1
EXPECTED_PHASE = "data"
SMALL = {"epochs": 1, "batches": 24}


class SlowOnOneRank(SyntheticDataset):
    """Samples that are slow to read on ``slow_rank`` only (the rank is looked up at the first
    read, once ``torch.distributed`` is up)."""

    def __init__(self, size: int, *, slow_rank: int, latency_ms: float) -> None:
        super().__init__(size)
        self.slow_rank = slow_rank
        self.slow_latency_ms = latency_ms
        self.rank: int | None = None

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rank is None:
            dist = torch.distributed
            self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            self.latency_ms = self.slow_latency_ms if self.rank == self.slow_rank else 0.0
        return super().__getitem__(i)


def train(
    *,
    report_dir: str,
    console: bool = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 80,
    batch_size: int = 16,
    num_workers: int = 0,
    slow_rank: int = EXPECTED_RANK,
    ms_per_sample: float = 0.4,
    rank: int | None = None,
    csv_dir: str | None = None,
) -> None:
    """The fit; Lightning runs it on each rank. ``num_workers`` applies to ``rank`` only when it
    is given (a suggestion's ``"rank"``), else to every rank (the loader is built on each rank).
    ``csv_dir``: log to a ``CSVLogger`` there (StallScope's headline numbers included)."""
    pl = import_lightning(namespace)
    emulate_accelerator()
    me = int(os.environ.get("LOCAL_RANK", "0"))  # one node: the local rank is the rank
    dataset = SlowOnOneRank(2 * batches * batch_size, slow_rank=slow_rank, latency_ms=ms_per_sample)
    workers = num_workers if rank is None or rank == me else 0
    train_loader = loader(dataset, batch_size=batch_size, num_workers=workers)
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            max_epochs=epochs,
            callbacks=[StallScope(report_dir, console=console)],
            logger=pl.loggers.CSVLogger(csv_dir, name="", version="") if csv_dir else False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            default_root_dir=root,
        )
        trainer.fit(module_class(namespace)(), train_loader)


def run(*, report_dir: str = f"runs/{NAME}", console: Any = True, timeout_s: float = 300, **settings: Any) -> Report:
    """Start the fit in a fresh process (Lightning's launcher re-runs this script for rank 1);
    the job's report (rank 0's)."""
    worker = {"report_dir": str(Path(report_dir).resolve()), "console": console is not False, **settings}
    subprocess.run(
        [sys.executable, __file__, WORKER_FLAG, json.dumps(worker)], check=True, timeout=timeout_s, env=rank_env()
    )
    return job_report(report_dir)


if __name__ == "__main__":
    worker = worker_settings(sys.argv)
    if worker is not None:
        train(**worker)
    else:
        cli(run, __doc__ or NAME, NAME)
