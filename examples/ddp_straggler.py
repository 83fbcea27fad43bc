"""Planted straggler: a plain DDP loop of two ranks where only rank 1 is slow to read its samples.

Each rank trains the common tiny model wrapped in ``DistributedDataParallel`` (gloo, CPU), with
``num_workers=0``. Rank 1's samples each take ``ms_per_sample`` to read (a sleep: slow storage);
rank 0's are instant. Rank 0 therefore waits for rank 1 in every backward's all-reduce, which it
records as compute. Expected top finding: ``data.workers`` naming rank 1 and its ``data`` phase,
with the job's speedup.

    python examples/ddp_straggler.py               # launches 2 ranks with torchrun
    torchrun --nproc-per-node 2 examples/ddp_straggler.py --worker '{"report_dir": "runs/ddp"}'
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, cli, emulate_accelerator, loader, make_model  # noqa: E402
from ddp_common import job_report, torchrun, worker_settings  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "ddp_straggler"
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
    batches: int = 80,
    batch_size: int = 16,
    num_workers: int = 0,
    slow_rank: int = EXPECTED_RANK,
    ms_per_sample: float = 0.4,
    rank: int | None = None,
) -> None:
    """One rank's training (run by each process ``torchrun`` starts). ``num_workers`` applies to
    ``rank`` only when it is given (a suggestion's ``"rank"``), else to every rank."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    me = dist.get_rank()
    emulate_accelerator()
    latency = ms_per_sample if me == slow_rank else 0.0
    dataset = SyntheticDataset(batches * batch_size, latency_ms=latency, seed=me)
    workers = num_workers if rank is None or rank == me else 0
    data = loader(dataset, batch_size=batch_size, num_workers=workers)
    torch.manual_seed(0)
    model = DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for x, y in scope.iter(data):
                with scope.phase("compute"):
                    opt.zero_grad(set_to_none=True)
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
