"""Planted compute straggler: a plain DDP loop of two ranks where rank 1 does more work a step.

Each rank trains the common tiny model wrapped in ``DistributedDataParallel`` (gloo, CPU). Rank 1
runs ``extra_passes`` more forward and backward passes each step, outside DDP's all-reduce
(``no_sync``), as a rank with longer sequences or a slower device would. Rank 0 waits for it in
every backward's all-reduce, which it records as compute: both ranks' ``compute`` look alike. The
forward passes StallScope times on the DDP module tell them apart. Expected top finding:
``dist.straggler`` naming rank 1 and ``compute``, with the job's speedup if rank 1's extra work
went away (``rank=1``: what applying the suggestion means here).

    python examples/ddp_compute_straggler.py               # launches 2 ranks with torchrun
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, cli, emulate_accelerator, loader, make_model  # noqa: E402
from ddp_common import job_report, torchrun, worker_settings  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "ddp_compute_straggler"
EXPECTED = "dist.straggler"
EXPECTED_RANK = 1
EXPECTED_PHASE = "compute"
SMALL = {"epochs": 1, "batches": 24}


def train(
    *,
    report_dir: str,
    console: bool = True,
    epochs: int = 2,
    batches: int = 60,
    batch_size: int = 32,
    slow_rank: int = EXPECTED_RANK,
    extra_passes: int = 1,
    hidden: int = 1024,
    rank: int | None = None,
) -> None:
    """One rank's training (the common model, ``hidden`` wide). ``rank`` (a suggestion's): that
    rank's extra passes are removed."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    me = dist.get_rank()
    emulate_accelerator()
    extra = extra_passes if me == slow_rank and rank != me else 0
    data = loader(SyntheticDataset(batches * batch_size, seed=me), batch_size=batch_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(make_model(hidden))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for x, y in scope.iter(data):
                with scope.phase("compute"):
                    opt.zero_grad(set_to_none=True)
                    for _ in range(extra):  # rank 1's extra work, without an all-reduce
                        with model.no_sync():
                            loss_fn(model(x), y).backward()
                    loss_fn(model(x), y).backward()  # DDP's all-reduce: a fast rank waits here
                    opt.step()
    dist.destroy_process_group()


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
