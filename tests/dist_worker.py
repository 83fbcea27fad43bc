"""One rank of the small distributed jobs ``tests/test_distributed_runs.py`` launches.

``python tests/dist_worker.py SETTINGS_JSON`` under ``torchrun`` or with ``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` / ``MASTER_PORT`` set. Settings (all optional) are lists indexed by rank where they
differ between ranks: ``report_dirs``, ``batches``, ``epochs``, ``latency_ms`` (per sample),
``gather_timeout_s``, and ``ddp`` (wrap the model in DDP: one all-reduce per step), ``raise_at``
([rank, epoch, step]: that rank raises there), ``die_at`` (the same, but the process exits at once,
without cleanup), ``stall_at`` (the same, but that rank waits there until a signal ends it, two
minutes at most), ``term_at`` (the same, but that rank sends itself SIGTERM there, as a launcher
or a scheduler would), ``epoch_barrier`` (the ranks meet at each epoch's start: a rank that dies
in an epoch dies after every rank began it; a list of epochs: at those epochs' starts only), ``hidden``
(two hidden layers of that width: more compute a step), ``extra_passes`` (forward and backward
passes a step beyond the first, outside DDP's all-reduce: a compute straggler), ``join`` (each epoch
inside DDP's ``Join``: ranks with fewer batches shadow the others' all-reduces), ``times`` (a
folder: a rank that raises writes there how long its exception took to leave the scope,
``rank-<R>.s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.utils.data import DataLoader, TensorDataset

from stallscope import StallScope
from stallscope.hooks import distributed


class Slow(TensorDataset):
    def __init__(self, n: int, latency_ms: float) -> None:
        super().__init__(torch.randn(n, 16), torch.randint(0, 4, (n,)))
        self.latency_ms = latency_ms

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        if self.latency_ms:
            time.sleep(self.latency_ms / 1e3)
        return super().__getitem__(i)


def main(settings: dict[str, object]) -> None:
    torch.set_num_threads(1)
    if "gather_timeout_s" in settings:
        distributed.GATHER_TIMEOUT_S = float(settings["gather_timeout_s"])  # type: ignore[arg-type]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()

    def mine(key: str, default: object) -> object:
        value = settings.get(key, default)
        return value[rank] if isinstance(value, list) else value

    batches = int(mine("batches", 8))  # type: ignore[call-overload]
    epochs = int(mine("epochs", 2))  # type: ignore[call-overload]
    data = DataLoader(Slow(batches * 8, float(mine("latency_ms", 0.0))), batch_size=8)  # type: ignore[arg-type]
    torch.manual_seed(0)
    hidden = int(settings.get("hidden", 0))  # type: ignore[call-overload]
    model: nn.Module = nn.Linear(16, 4)
    if hidden:  # two hidden layers: a forward of about a millisecond at 1024
        model = nn.Sequential(
            nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 4)
        )
    extra = int(mine("extra_passes", 0))  # type: ignore[call-overload]
    if settings.get("ddp", False):
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    raise_at = settings.get("raise_at")
    die_at = settings.get("die_at")
    stall_at = settings.get("stall_at")
    term_at = settings.get("term_at")
    raised = 0.0
    try:
        with StallScope(str(mine("report_dirs", "out")), console=bool(settings.get("console", True))) as scope:
            for epoch in range(epochs):
                meet = settings.get("epoch_barrier")
                if meet is True or (isinstance(meet, list) and epoch in meet):
                    dist.barrier()
                joined = Join([model]) if settings.get("join") else contextlib.nullcontext()
                with joined:
                    for step, (x, y) in enumerate(scope.iter(data)):
                        if raise_at == [rank, epoch, step]:
                            raised = time.perf_counter()
                            raise RuntimeError("planted failure")
                        if die_at == [rank, epoch, step]:
                            os._exit(3)
                        if stall_at == [rank, epoch, step]:
                            time.sleep(120)
                        if term_at == [rank, epoch, step]:
                            os.kill(os.getpid(), signal.SIGTERM)
                        with scope.phase("compute"):
                            opt.zero_grad()
                            for _ in range(extra):  # gradients accumulated without an all-reduce
                                with model.no_sync():  # type: ignore[operator]
                                    nn.functional.cross_entropy(model(x), y).backward()
                            nn.functional.cross_entropy(model(x), y).backward()
                            opt.step()
    except RuntimeError:
        if raised and settings.get("times"):
            Path(str(settings["times"]), f"rank-{rank}.s").write_text(f"{time.perf_counter() - raised:.3f}")
        raise
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
