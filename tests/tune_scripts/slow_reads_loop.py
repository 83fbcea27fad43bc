"""A plain loop that waits on slow reads (``num_workers=1``), for ``stallscope tune``'s tests.

``TUNE_TEST_HANG=candidates``: a trial with settings to apply (not trial 0, not a baseline) hangs
at its third step, as a job can (a deadlock, a stuck read), so that tune must stop it.
"""

from __future__ import annotations

import json
import os
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
    plan = json.loads(os.environ.get("STALLSCOPE_TRIAL_PLAN", "{}"))
    hang = os.environ.get("TUNE_TEST_HANG") == "candidates" and bool(plan.get("settings"))
    data = DataLoader(SlowReads(), batch_size=4, num_workers=1)
    with StallScope("runs/slow_reads_loop", console=False) as scope:
        for step, batch in enumerate(scope.iter(data)):
            with scope.phase("compute"):
                (batch * 2).sum()
            if hang and step == 2:
                time.sleep(3600)


if __name__ == "__main__":
    main()
