"""The cost of rank 0's gather at each epoch end of a distributed job (SPEC §3a).

Launches a two-rank gloo job on this machine with ``torchrun`` (a tiny DDP loop, so the ranks
are in step as in real training), runs ``--epochs`` short epochs, and prints, per rank, the time
spent in the exchange per epoch (rank 0: collecting the other's summary, waiting included; rank
1: posting its own) and the whole epoch end (diagnosis, report writes, the exchange, and with
``--console`` the panel rank 0 prints), with its mean as a share of the run. ``--step-ms`` makes
each step at least that long (a sleep in the compute phase), for epochs of a realistic length:
``--epochs 50 --batches 20 --step-ms 10 --console`` is 50 epochs of about 200 ms.

    .venv/bin/python benchmarks/dist_gather.py [--epochs 20] [--batches 10] [--step-ms 0] [--console]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from ddp_common import WORKER_FLAG, rank_env, worker_settings  # noqa: E402


def worker(report_dir: str, epochs: int, batches: int, step_ms: float = 0.0, console: bool = False) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from stallscope import StallScope

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(16, 64), torch.randint(0, 10, (16,))) for _ in range(batches)]
    ends: list[float] = []
    gathers: list[float] = []
    started = time.perf_counter()
    with StallScope(report_dir, console=console) as scope:
        session = scope._session
        end_epoch = session.end_epoch

        def timed_end_epoch(*args: Any, **kwargs: Any) -> object:  # the epoch ends when its iterator is exhausted
            job = session.job
            assert job is not None
            before, start = job.gather_s, time.perf_counter()
            try:
                return end_epoch(*args, **kwargs)
            finally:
                ends.append(time.perf_counter() - start)
                gathers.append(job.gather_s - before)

        session.end_epoch = timed_end_epoch  # type: ignore[method-assign]
        for _ in range(epochs):
            for x, y in scope.iter(data):
                with scope.phase("compute"):
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    if step_ms:
                        time.sleep(step_ms / 1e3)
    wall = time.perf_counter() - started
    row = {"rank": dist.get_rank(), "gather_s": gathers, "epoch_end_s": ends, "wall_s": wall}
    print("RESULT " + json.dumps(row), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--step-ms", type=float, default=0.0, help="each step at least this long (a sleep)")
    parser.add_argument("--console", action="store_true", help="rank 0 prints its panels (to a pipe)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "report_dir": tmp,
            "epochs": args.epochs,
            "batches": args.batches,
            "step_ms": args.step_ms,
            "console": args.console,
        }
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               __file__, WORKER_FLAG, json.dumps(settings)]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=rank_env(), timeout=600).stdout
    for line in sorted(out.splitlines()):
        if not line.startswith("RESULT {"):
            continue
        row = json.loads(line.removeprefix("RESULT "))
        g = [s * 1e3 for s in row["gather_s"][1:]]  # the first epoch also connects to the store
        e = [s * 1e3 for s in row["epoch_end_s"][1:]]
        print(
            f"rank {row['rank']}: exchange per epoch median {statistics.median(g):.2f} ms, max {max(g):.2f} ms; "
            f"whole epoch end median {statistics.median(e):.2f} ms, mean {statistics.mean(e):.2f} ms, "
            f"max {max(e):.2f} ms; all epoch ends {sum(row['epoch_end_s']) / row['wall_s']:.2%} of the run "
            f"({row['wall_s']:.1f} s; first epoch: exchange {row['gather_s'][0] * 1e3:.2f} ms; "
            f"{len(g)} epochs after it)"
        )


if __name__ == "__main__":
    settings = worker_settings(sys.argv)
    if settings is not None:
        worker(**settings)
    else:
        main()
