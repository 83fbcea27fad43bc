"""A two-rank DDP loop (gloo, CPU) where rank 1 waits on slow reads (``num_workers=0``) and rank 0
waits for it in the all-reduce, for ``stallscope tune``'s tests under ``torchrun --standalone
--nproc-per-node 2``.

``TUNE_TEST_HANG=N``: in trial N, rank 1 hangs at its third step, deaf to SIGTERM (as a rank
stuck in native code can be); rank 0 then waits in the all-reduce. torchrun passes tune's SIGTERM
on and waits 30 s for the ranks: tune must kill both ranks (each in a session of its own under
torchrun) as well as torchrun itself.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stallscope import StallScope


class SlowReads(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.latency_s)  # a read from slow storage
        return torch.full((8,), float(i % 7)), torch.tensor(i % 2)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hang = os.environ.get("TUNE_TEST_HANG") == os.environ.get("STALLSCOPE_TRIAL", "-") and rank == 1
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = DataLoader(SlowReads(0.002 if rank == 1 else 0.0), batch_size=4, num_workers=0)
    with StallScope("runs/ddp_loop", console=False) as scope:
        for step, (x, y) in enumerate(scope.iter(data)):
            if hang and step == 2:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # nor woken by its loader's workers' end
                time.sleep(3600)
            with scope.phase("compute"):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
