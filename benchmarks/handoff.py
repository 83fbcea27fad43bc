"""What a batch costs in-process, and what handing it over from a DataLoader worker adds.

    .venv/bin/python benchmarks/handoff.py [--batches 300] [--repeats 3]

For in-memory ``TensorDataset`` batches of several sizes and tensor counts this measures, per batch:

1. ``in-process``: CPU time of one ``next()`` with ``num_workers=0`` (the sampler, one
   ``dataset[i]`` per sample, ``default_collate``), and the same with one index per batch (a
   ``BatchSampler`` as ``sampler``, ``batch_size=None``).
2. ``worker``: CPU time one worker spends per batch (``psutil`` on the child process, with a
   consumer slow enough that the worker always runs ahead, so it never spins waiting). What it
   spends beyond the in-process ``next()`` is the worker's side of the hand-over: collating into
   shared memory, pickling, queueing, serving the file descriptors.
3. ``main``: wall time of ``next()`` in the training process when the batch is already waiting
   in the queue: unpickling, receiving the shared-memory file descriptors, mapping them.

A linear fit over the cases gives the per-batch, per-tensor and per-byte constants of
``stallscope/analysis/loop_model.py``. CPU times are used where they can be: the host is shared,
so wall times are noisy; the medians of ``--repeats`` runs are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


@dataclass(frozen=True)
class Case:
    name: str
    rows: int
    #: the shape of one sample of each tensor (``()`` for a scalar label)
    shapes: tuple[tuple[int, ...], ...]
    batch_size: int

    def dataset(self) -> TensorDataset:
        gen = torch.Generator().manual_seed(0)
        return TensorDataset(*(torch.randn(self.rows, *s, generator=gen) for s in self.shapes))

    @property
    def tensors(self) -> int:
        return len(self.shapes)

    @property
    def batch_bytes(self) -> int:
        return sum(4 * self.batch_size * _numel(s) for s in self.shapes)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


CASES = (
    Case("32 floats + label, batch 64", 20_000, ((32,), ()), 64),
    Case("32 floats + label, batch 256", 20_000, ((32,), ()), 256),
    Case("4 tensors, batch 64", 20_000, ((32,), (), (32,), ()), 64),
    Case("8 tensors, batch 64", 20_000, ((32,), (), (32,), (), (32,), (), (32,), ()), 64),
    Case("3x32x32 + label, batch 64", 4_000, ((3, 32, 32), ()), 64),
    Case("3x128x128 + label, batch 32", 600, ((3, 128, 128), ()), 32),
)


def endless(loader: DataLoader[Any]) -> Iterator[Any]:
    while True:
        yield from loader


def in_process_cpu_s(loader: DataLoader[Any], batches: int) -> float:
    """CPU seconds per ``next()`` of an in-process loader."""
    it = endless(loader)
    for _ in range(10):
        next(it)
    start = time.process_time()
    for _ in range(batches):
        next(it)
    return (time.process_time() - start) / batches


def through_worker_s(loader: DataLoader[Any], batches: int, gap_s: float) -> tuple[float, float, float]:
    """(worker CPU per batch, main wall per ready batch, main CPU per ready batch), one worker."""
    it = iter(loader)
    for _ in range(5):
        next(it)
    time.sleep(0.2)
    children = psutil.Process().children()
    if len(children) != 1:
        raise RuntimeError(f"expected one worker process, found {len(children)}")
    worker = children[0]

    def worker_cpu() -> float:
        t = worker.cpu_times()
        return float(t.user + t.system)

    walls: list[float] = []
    cpus: list[float] = []
    before = worker_cpu()
    for _ in range(batches):
        time.sleep(gap_s)  # the worker has the next batch (and the one after) ready by now
        w0, c0 = time.perf_counter(), time.thread_time()
        next(it)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.thread_time() - c0)
    # the worker made `batches` batches beyond the ones already queued when the count started
    per_batch = (worker_cpu() - before) / batches
    del it
    return per_batch, statistics.median(walls), statistics.median(cpus)


def measure(case: Case, batches: int) -> dict[str, float]:
    ds = case.dataset()
    per_sample = DataLoader(ds, batch_size=case.batch_size, shuffle=True, num_workers=0)
    batched = DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), case.batch_size, False), batch_size=None)
    in_proc = in_process_cpu_s(per_sample, batches)
    in_proc_batched = in_process_cpu_s(batched, batches)
    workers = DataLoader(
        ds,
        batch_size=case.batch_size,
        sampler=RandomSampler(ds, replacement=True, num_samples=10**8),  # never runs out
        num_workers=1,
        persistent_workers=True,
        prefetch_factor=2,
    )
    # a gap the worker surely beats: a few times its in-process cost plus a margin
    gap = max(0.004, 4 * in_proc + 0.002 + case.batch_bytes * 2e-9)
    worker_cpu, main_wall, main_cpu = through_worker_s(workers, max(40, batches // 2), gap)
    return {
        "in_process": in_proc,
        "in_process_batched": in_proc_batched,
        "worker_cpu": worker_cpu,
        "worker_extra": worker_cpu - in_proc,
        "main_wall": main_wall,
        "main_cpu": main_cpu,
    }


def step_cpu_s(loader: DataLoader[Any], hidden: int, steps: int) -> float:
    """Median thread CPU seconds of one training step of a small MLP fed by ``loader``."""
    torch.manual_seed(0)
    features = loader.dataset[0][0].numel()
    model = torch.nn.Sequential(
        torch.nn.Linear(features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = endless(loader)
    cpus: list[float] = []
    for i in range(steps + 30):
        x, y = next(it)
        c0 = time.thread_time()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y.long() % 10).backward()
        opt.step()
        if i >= 30:  # past the workers' start and the first batches already queued
            cpus.append(time.thread_time() - c0)
    return statistics.median(cpus)


def drag(hidden: int, steps: int) -> tuple[float, float]:
    """(step CPU with in-process loading, step CPU with one worker) for a 64-float batch of 64."""
    ds = TensorDataset(torch.randn(20_000, 64), torch.randint(0, 10, (20_000,)))
    inline = step_cpu_s(DataLoader(ds, batch_size=64, shuffle=True), hidden, steps)
    worker = DataLoader(ds, batch_size=64, shuffle=True, num_workers=1, persistent_workers=True)
    return inline, step_cpu_s(worker, hidden, steps)


def print_drag(repeats: int, steps: int) -> None:
    print("| step | in-process loading ms | one worker ms | drag ms |")
    print("|---|---|---|---|")
    for hidden in (256, 1024):
        pairs = []
        for _ in range(repeats):
            print(f"measuring the drag, hidden {hidden} ...", file=sys.stderr, flush=True)
            pairs.append(drag(hidden, steps))
        inline = statistics.median(p[0] for p in pairs)
        worker = statistics.median(p[1] for p in pairs)
        diff = statistics.median(p[1] - p[0] for p in pairs)
        print(f"| MLP 64-{hidden}-{hidden}-10 | {inline * 1e3:.3f} | {worker * 1e3:.3f} | {diff * 1e3:.3f} |")


def fit(rows: list[tuple[Case, float]]) -> tuple[float, float, float]:
    """Least squares ``cost = base + per_tensor * tensors + per_byte * bytes``."""
    a = torch.tensor([[1.0, c.tensors, c.batch_bytes] for c, _ in rows], dtype=torch.float64)
    b = torch.tensor([[v] for _, v in rows], dtype=torch.float64)
    sol = torch.linalg.lstsq(a, b).solution.flatten().tolist()
    return sol[0], sol[1], sol[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=300, help="batches timed per case and loader")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; medians are printed")
    parser.add_argument("--drag-only", action="store_true", help="measure only the drag on the step (item 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.drag_only:
        print_drag(args.repeats, args.batches)
        return 0
    results: dict[str, list[dict[str, float]]] = {c.name: [] for c in CASES}
    for _ in range(args.repeats):
        for case in CASES:
            print(f"measuring {case.name} ...", file=sys.stderr, flush=True)
            results[case.name].append(measure(case, args.batches))
    keys = ("in_process", "in_process_batched", "worker_cpu", "worker_extra", "main_wall", "main_cpu")
    print("| case | tensors | batch KB | " + " | ".join(f"{k} ms" for k in keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    med: dict[str, dict[str, float]] = {}
    for case in CASES:
        med[case.name] = {k: statistics.median(r[k] for r in results[case.name]) for k in keys}
        cells = " | ".join(f"{med[case.name][k] * 1e3:.3f}" for k in keys)
        print(f"| {case.name} | {case.tensors} | {case.batch_bytes / 1e3:.1f} | {cells} |")
    for key in ("worker_extra", "main_wall"):
        base, per_tensor, per_byte = fit([(c, med[c.name][key]) for c in CASES])
        print(
            f"{key}: {base * 1e3:.3f} ms per batch + {per_tensor * 1e3:.3f} ms per tensor "
            f"+ {per_byte * 1e9:.3f} ms per MB"
        )
    print()
    print_drag(args.repeats, args.batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
