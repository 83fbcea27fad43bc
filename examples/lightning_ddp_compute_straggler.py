"""Planted compute straggler (Lightning): a ``strategy="ddp"`` fit on two CPU ranks where rank 1
does more work in each ``training_step``.

``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` starts rank 1 itself (it runs this
script again). On rank 1 each ``training_step`` runs the model ``1 + extra_passes`` times (as a
rank with longer sequences would), and its backward goes through all of them; rank 0 waits for it
in every backward's all-reduce, so both ranks' compute look alike. StallScope times each
``training_step`` through the hooks it puts on the DDP module Lightning made. Expected top finding:
``dist.straggler`` naming rank 1 and ``compute``; ``rank=1`` removes that rank's extra work.

    python examples/lightning_ddp_compute_straggler.py
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

NAME = "lightning_ddp_compute_straggler"
EXPECTED = "dist.straggler"
EXPECTED_RANK = 1
EXPECTED_PHASE = "compute"
SMALL = {"epochs": 1, "batches": 24}


def train(
    *,
    report_dir: str,
    console: bool = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 60,
    batch_size: int = 32,
    slow_rank: int = EXPECTED_RANK,
    extra_passes: int = 3,
    hidden: int = 1024,
    rank: int | None = None,
) -> None:
    """The fit; Lightning runs it on each rank (the common model, ``hidden`` wide). ``rank`` (a
    suggestion's): that rank's extra passes are removed."""
    pl = import_lightning(namespace)
    emulate_accelerator()
    me = int(os.environ.get("LOCAL_RANK", "0"))  # one node: the local rank is the rank
    extra = extra_passes if me == slow_rank and rank != me else 0
    base = module_class(namespace)

    class Module(base):  # type: ignore[misc,valid-type]
        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            for _ in range(extra):  # this rank's extra work; the backward goes through it too
                loss = loss + 0.0 * self.loss_fn(self.model(x), y)
            return loss

    train_loader = loader(SyntheticDataset(2 * batches * batch_size, seed=me), batch_size=batch_size)
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            max_epochs=epochs,
            callbacks=[StallScope(report_dir, console=console)],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            default_root_dir=root,
        )
        trainer.fit(Module(hidden=hidden), train_loader)


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
