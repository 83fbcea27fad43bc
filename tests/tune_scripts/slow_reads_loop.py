"""A plain loop that waits on slow reads (``num_workers=1``), for ``stallscope tune``'s tests."""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

from stallscope import StallScope


class SlowReads(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)  # a read from slow storage
        return torch.full((8,), float(i))


def main() -> None:
    torch.set_num_threads(1)
    data = DataLoader(SlowReads(), batch_size=4, num_workers=1)
    with StallScope("runs/slow_reads_loop", console=False) as scope:
        for batch in scope.iter(data):
            with scope.phase("compute"):
                (batch * 2).sum()


if __name__ == "__main__":
    main()
