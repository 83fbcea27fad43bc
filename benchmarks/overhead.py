"""Overhead: the same training loop bare and watched, interleaved in one process.

Loops:
  (a) tiny plain loop, ~150 us steps        target watched/bare <= 1.02
  (b) plain loop with ~5 ms steps           target <= 1.005
  (c) tiny Lightning fit                     target <= 1.02 (against Lightning without StallScope)
  (d) many short epochs: 100 epochs of 30 steps of loop (a), and a Lightning fit of 50 epochs
      of 30 steps                             target <= 1.05, in process CPU time and wall time
  (e) loop (d) as a job: two gloo ranks under torchrun, each 100 epochs of 30 steps of loop (a)'s
      model in DistributedDataParallel        target <= 1.05, rank 0 and rank 1, both clocks
  (f) tiny transformers ``Trainer.train()`` (a one-layer model, 3000 optimizer steps)
                                              target <= 1.02 in process CPU time

Each pair runs the bare and the watched variant back to back (alternating which goes first),
each after a full garbage collection; the ratio reported is the median over pairs.
torch.profiler (and for (c) Lightning's SimpleProfiler and an empty callback) are measured on
the same loops for comparison. A watched run includes everything a user pays: the epoch-end
diagnosis, the printed panel (to a null console) and the report write.

    .venv/bin/python benchmarks/overhead.py [--pairs 15] [--processes 1] [--only a b c] [--memory]
                                            [--no-profiler] [--comparisons-everywhere]
                                            [--markdown FILE]

Loop (d) is about the work at each epoch end (the diagnosis, the panel, the report), which a
30-step epoch pays as often as a 30,000-step one; each of its pairs also reads the process's CPU
time (``time.process_time``: all threads, StallScope's report writer included), which a busy
neighbour disturbs less than the wall time. Its plain loop is also measured interleaved with bare
epochs inside one run (``PlainLoop.interleaved_epochs``), which the VM's bursts cannot tell
apart. See docs/overhead.md, "Many short epochs".

A ratio can differ more between processes than between pairs in one process, hence
``--processes``. On a shared VM a neighbour's burst slows a whole run by up to 40%, so whole-run
ratios move by several percent; ``step_cost.py`` resolves the per-step cost of loop (a) to
about half a microsecond instead.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from torch import nn  # noqa: E402

from stallscope import StallScope  # noqa: E402

TARGETS = {"a": 1.02, "b": 1.005, "c": 1.02, "d": 1.05, "e": 1.05, "f": 1.02}
#: steps per run: a watched run pays its fixed costs (epoch-end diagnosis, report writes) once
TINY_STEPS = 20_000
MEDIUM_STEPS = 500
LIGHTNING_STEPS = 3000
#: loop (f): optimizer steps of a tiny transformers Trainer fit
TRANSFORMERS_STEPS = 3000
#: loop (d): epochs of EPOCH_STEPS steps, plain and Lightning
SHORT_EPOCHS = 100
LIGHTNING_SHORT_EPOCHS = 50
EPOCH_STEPS = 30
#: the memory check: a no-op step this many times
MEMORY_STEPS = 1_000_000


def hot_path() -> str:
    """Which timeline hot path StallScope runs here: its C extension, or the Python twin."""
    from stallscope.timeline import recorder

    if recorder.NATIVE:
        return "C (stallscope/timeline/_native.c)"
    return "Python (the C extension is not built, or STALLSCOPE_NO_NATIVE is set)"


def null_console() -> Console:
    return Console(file=io.StringIO(), width=100)


def tiny_loop(steps: int = TINY_STEPS) -> PlainLoop:
    """Loop (a): a 32-32-1 MLP on batches of 8 (also what ``step_cost.py`` measures)."""
    return PlainLoop(features=32, hidden=32, batch=8, steps=steps)


class PlainLoop:
    """A plain training loop over in-memory batches."""

    def __init__(self, *, features: int, hidden: int, batch: int, steps: int, repeat: int = 1) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.batches = [(torch.randn(batch, features), torch.randn(batch, 1)) for _ in range(steps)]
        self.repeat = repeat
        self.loss_fn = nn.MSELoss()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeat):
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.opt.step()
        return loss

    def bare_pass(self) -> None:
        """One pass over the batches, as a user's loop would run it."""
        for step, (x, y) in enumerate(self.batches):
            loss = self.train_step(x, y)
            if step % 50 == 0:
                loss.item()

    def watched_pass(self, scope: StallScope) -> None:
        """The same pass under ``scope``: the loader through ``scope.iter``, two phases marked."""
        for step, (x, y) in enumerate(scope.iter(self.batches)):
            with scope.phase("compute"):
                loss = self.train_step(x, y)
            if step % 50 == 0:
                with scope.phase("logging"):
                    loss.item()

    def bare(self) -> float:
        t0 = time.perf_counter()
        self.bare_pass()
        return time.perf_counter() - t0

    def watched(self, report_dir: str) -> float:
        t0 = time.perf_counter()
        with StallScope(report_dir, console=null_console()) as scope:
            self.watched_pass(scope)
        return time.perf_counter() - t0

    def bare_epochs(self, epochs: int) -> float:
        """Loop (d), bare: ``epochs`` passes over the batches."""
        t0 = time.perf_counter()
        for _ in range(epochs):
            self.bare_pass()
        return time.perf_counter() - t0

    def watched_epochs(self, epochs: int, report_dir: str) -> float:
        """Loop (d), watched: one scope, ``epochs`` passes, the console on (to memory)."""
        t0 = time.perf_counter()
        with StallScope(report_dir, console=null_console()) as scope:
            for _ in range(epochs):
                self.watched_pass(scope)
        return time.perf_counter() - t0

    def interleaved_epochs(self, epochs: int, report_dir: str) -> tuple[float, float, float, float]:
        """Loop (d), bare and watched epoch by epoch in one run: two bare epochs, then a watched
        one (``scope.iter``, its epoch end included), ``epochs`` times inside one scope. Returns
        the CPU seconds and wall seconds of the bare epochs and of the watched ones. Each watched
        epoch sits beside bare ones, so a neighbour's burst on this shared VM slows both alike,
        where whole runs of a second each land on either side of it.

        What the watched side holds: its epochs; the scope's start and end (the final report and
        panel); the CPU time of StallScope's own threads (the host sampler, the report writer);
        and what an epoch end costs the steps after it, whose code and data it pushed out of the
        caches: here the next epoch is a bare one, which runs slower than the bare epoch after
        it, and that difference is charged to the watched side (the second bare epoch of each
        pair is the bare baseline; with a third bare epoch in the watched one's place, the
        first and second differ by nothing on average). The bare epochs lengthen the run
        StallScope sees, so its panels and report writes, on a wall-clock budget, come more often
        per epoch than in a run of the watched epochs alone: an upper bound there (the table's
        numbers are of this kind)."""
        cpu, wall = time.thread_time, time.perf_counter
        cold_cpu = cold_wall = bare_cpu = bare_wall = watched_cpu = watched_wall = 0.0
        c0, w0 = cpu(), wall()
        scope = StallScope(report_dir, console=null_console())
        scope.__enter__()
        watched_cpu += cpu() - c0
        watched_wall += wall() - w0
        try:
            for _ in range(epochs):
                marks = [(cpu(), wall())]
                for _bare in range(2):
                    self.bare_pass()
                    marks.append((cpu(), wall()))
                self.watched_pass(scope)
                marks.append((cpu(), wall()))
                (c0, w0), (c1, w1), (c2, w2), (c3, w3) = marks
                cold_cpu += c1 - c0
                cold_wall += w1 - w0
                bare_cpu += c2 - c1
                bare_wall += w2 - w1
                watched_cpu += c3 - c2
                watched_wall += w3 - w2
            # read before the scope ends them (the sampler's last sample, at the end, is left out)
            watched_cpu += _threads_cpu("stallscope-")
        finally:
            c0, w0 = cpu(), wall()
            scope.__exit__(None, None, None)
            watched_cpu += cpu() - c0
            watched_wall += wall() - w0
        # the bare epoch after a watched one paid for the caches that epoch end emptied
        watched_cpu += cold_cpu - bare_cpu
        watched_wall += cold_wall - bare_wall
        return bare_cpu, watched_cpu, bare_wall, watched_wall

    def torch_profiled(self) -> float:
        from torch.profiler import ProfilerActivity, profile

        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for step, (x, y) in enumerate(self.batches):
                loss = self.train_step(x, y)
                if step % 50 == 0:
                    loss.item()
                prof.step()
        return time.perf_counter() - t0


def thread_cpu_ns(thread: threading.Thread) -> int | None:
    """The CPU time ``thread`` has used so far, ns (``/proc/self/task/<tid>/schedstat``); None
    where there is no such file (the thread ended, not Linux)."""
    try:
        return int(Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _threads_cpu(prefix: str) -> float:
    """CPU seconds of this process's threads whose name starts with ``prefix``, so far."""
    named = (thread_cpu_ns(t) for t in threading.enumerate() if t.name.startswith(prefix))
    return sum(ns for ns in named if ns is not None) / 1e9


def lightning_fit(mode: str, steps: int, report_dir: str, epochs: int = 1) -> float:
    """A tiny Lightning fit of ``epochs`` epochs of ``steps`` steps; mode: bare, watched, simple
    (SimpleProfiler), empty (a Callback that overrides nothing: what Lightning's own dispatch
    costs for any callback)."""
    import lightning.pytorch as pl
    from lightning.pytorch.profilers import SimpleProfiler

    callbacks: list[Any] = []
    if mode == "watched":
        callbacks = [StallScope(report_dir, console=null_console())]
    elif mode == "empty":
        callbacks = [pl.Callback()]
    # its summary goes to a file in report_dir, not to the console
    profiler = SimpleProfiler(dirpath=report_dir, filename="simple-profiler") if mode == "simple" else None
    trainer, model, data = lightning_parts(steps, callbacks, profiler=profiler, epochs=epochs)
    t0 = time.perf_counter()
    trainer.fit(model, data)
    return time.perf_counter() - t0


class _TinyRegressor(nn.Module):
    """The smallest model a ``transformers.Trainer`` trains: a dict of tensors in, ``loss`` out."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.layer(x).squeeze(-1), labels)}


def transformers_fit(mode: str, steps: int, report_dir: str) -> float:
    """A tiny ``transformers.Trainer.train()`` of ``steps`` optimizer steps; mode: bare or watched.
    Returns the wall seconds of ``train()``."""
    import transformers

    transformers.logging.set_verbosity_error()
    x = torch.randn(steps * 8, 32)
    data = [{"x": x[i], "labels": x[i].sum()} for i in range(len(x))]
    args = transformers.TrainingArguments(
        output_dir=str(Path(report_dir) / "trainer"),
        per_device_train_batch_size=8,
        num_train_epochs=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        logging_steps=10_000,
    )
    callbacks = [StallScope(report_dir, console=null_console())] if mode == "watched" else []
    trainer = transformers.Trainer(model=_TinyRegressor(), args=args, train_dataset=data, callbacks=callbacks)
    t0 = time.perf_counter()
    trainer.train()
    return time.perf_counter() - t0


def lightning_parts(
    steps: int,
    callbacks: list[Any],
    *,
    profiler: Any = None,
    on_step: Callable[[int], None] | None = None,
    epochs: int = 1,
) -> tuple[Any, Any, Any]:
    """Loop (c): (trainer, model, train loader) of a tiny fit of ``steps`` steps an epoch, one
    epoch (loop (d): ``epochs``).
    ``on_step(batch_idx)`` runs at the start of each training step (``lightning_segments.py``
    and ``instructions.py`` mark steps with it)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # "GPU available: ..." per fit

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(32, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if on_step is not None:
                on_step(batch_idx)
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(steps * 8, 32), torch.randn(steps * 8, 1)), batch_size=8)
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        profiler=profiler,
    )
    return trainer, Tiny(), data


def memory_check(report_dir: str) -> tuple[float, int, float]:
    """RSS growth (MB) and report size (bytes) of a MEMORY_STEPS no-op loop, and its seconds."""
    import psutil

    process = psutil.Process()
    items = range(MEMORY_STEPS)
    before = process.memory_info().rss
    t0 = time.perf_counter()
    with StallScope(report_dir, console=False) as scope:
        compute = scope.phase("compute")
        for _ in scope.iter(items):
            with compute:
                pass
    seconds = time.perf_counter() - t0
    grown = (process.memory_info().rss - before) / 2**20
    return grown, (Path(report_dir) / "report.json").stat().st_size, seconds


def _clean(run: Callable[[], float]) -> float:
    """``run()`` after a full garbage collection. With the ~400k objects torch and Lightning
    leave on the heap, one full collection takes ~110 ms here (8% of a tiny Lightning fit); when
    it falls inside a run depends on what ran before, so it would land on either side of a pair
    at random. Collecting first starts every run from the same heap; the collections a run's own
    allocations trigger still fall inside it."""
    gc.collect()
    return run()


def pairs(bare: Callable[[], float], other: Callable[[], float], n: int) -> tuple[float, float, float]:
    """Median ratio other/bare over ``n`` interleaved pairs, with the medians of both."""
    ratios, b_times, o_times = [], [], []
    _clean(bare)
    _clean(other)  # warm-up
    for i in range(n):
        if i % 2:
            o, b = _clean(other), _clean(bare)
        else:
            b, o = _clean(bare), _clean(other)
        ratios.append(o / b)
        b_times.append(b)
        o_times.append(o)
    return statistics.median(ratios), statistics.median(b_times), statistics.median(o_times)


def _timed(run: Callable[[], float]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``_clean(run)``."""
    cpu = time.process_time()
    wall = _clean(run)
    return wall, time.process_time() - cpu


def pairs_cpu(bare: Callable[[], float], other: Callable[[], float], n: int) -> tuple[float, float, float]:
    """Like ``pairs``, in both clocks: (median wall ratio, median CPU ratio, median bare wall)."""
    walls, cpus, b_times = [], [], []
    _timed(bare)
    _timed(other)  # warm-up
    for i in range(n):
        if i % 2:
            o, b = _timed(other), _timed(bare)
        else:
            b, o = _timed(bare), _timed(other)
        walls.append(o[0] / b[0])
        cpus.append(o[1] / b[1])
        b_times.append(b[0])
    return statistics.median(walls), statistics.median(cpus), statistics.median(b_times)


Row = tuple[str, str, str, float, float, float | None]


def measure(args: argparse.Namespace, tmp: str) -> list[Row]:
    """The rows of the table, measured in this process: (loop key, loop, tool, median ratio,
    bare step seconds, target)."""
    torch.set_num_threads(1)
    rows: list[Row] = []
    loops = {
        "a": ("tiny plain loop", tiny_loop()),
        "b": ("~5 ms plain loop", PlainLoop(features=256, hidden=1024, batch=256, steps=MEDIUM_STEPS, repeat=2)),
    }
    for key in args.only or sorted(TARGETS):
        if key == "d":
            rows.extend(short_epochs(args, tmp))
        elif key == "e":
            rows.extend(job_epochs(args))
        elif key == "f":

            def hf(mode: str) -> Callable[[], float]:
                return lambda: transformers_fit(mode, TRANSFORMERS_STEPS, tmp)

            try:
                _, ratio, b = pairs_cpu(hf("bare"), hf("watched"), args.pairs)
            except ImportError as exc:  # transformers not installed
                print(f"(f) skipped: {exc}", file=sys.stderr)
                continue
            label = "tiny transformers Trainer fit, CPU time"
            rows.append((key, label, "StallScope", ratio, b / TRANSFORMERS_STEPS, TARGETS[key]))
        elif key in loops:
            label, loop = loops[key]
            ratio, b, w = pairs(loop.bare, lambda loop=loop: loop.watched(tmp), args.pairs)
            steps = len(loop.batches)
            rows.append((key, label, "StallScope", ratio, b / steps, TARGETS[key]))
            if not args.no_profiler:
                ratio, b, _ = pairs(loop.bare, loop.torch_profiled, max(3, args.pairs // 3))
                rows.append((key, label, "torch.profiler", ratio, b / steps, None))
        else:
            steps = LIGHTNING_STEPS

            def fit(mode: str) -> Callable[[], float]:
                return lambda: lightning_fit(mode, LIGHTNING_STEPS, tmp)

            try:
                ratio, b, _ = pairs(fit("bare"), fit("watched"), args.pairs)
            except Exception as exc:  # Lightning missing or not wired yet
                print(f"(c) skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rows.append((key, "tiny Lightning fit", "StallScope", ratio, b / steps, TARGETS[key]))
            if not args.no_profiler:
                ratio, b, _ = pairs(fit("bare"), fit("empty"), max(3, args.pairs // 3))
                rows.append((key, "tiny Lightning fit", "an empty pl.Callback()", ratio, b / steps, None))
                ratio, b, _ = pairs(fit("bare"), fit("simple"), max(3, args.pairs // 3))
                rows.append((key, "tiny Lightning fit", "SimpleProfiler", ratio, b / steps, None))
    return rows


def short_epochs(args: argparse.Namespace, tmp: str) -> list[Row]:
    """Loop (d): many short epochs, plain and Lightning, in wall time and in CPU time."""
    rows: list[Row] = []
    loop = tiny_loop(EPOCH_STEPS)
    steps = SHORT_EPOCHS * EPOCH_STEPS
    label = f"{SHORT_EPOCHS} plain epochs of {EPOCH_STEPS} steps"
    wall, cpu, b = pairs_cpu(
        lambda: loop.bare_epochs(SHORT_EPOCHS), lambda: loop.watched_epochs(SHORT_EPOCHS, tmp), args.pairs
    )
    rows.append(("d", label, "StallScope, CPU time", cpu, b / steps, TARGETS["d"]))
    rows.append(("d", label, "StallScope, wall time", wall, b / steps, TARGETS["d"]))
    # the same, each watched epoch beside a bare one (``PlainLoop.interleaved_epochs``)
    loop.interleaved_epochs(3, tmp)  # warm-up
    runs = []
    for _ in range(args.pairs):
        gc.collect()
        runs.append(loop.interleaved_epochs(SHORT_EPOCHS, tmp))
    b = statistics.median(r[2] for r in runs)
    label = f"{SHORT_EPOCHS} plain epochs of {EPOCH_STEPS} steps, interleaved with bare epochs"
    cpu = statistics.median(r[1] / r[0] for r in runs)
    wall = statistics.median(r[3] / r[2] for r in runs)
    rows.append(("d", label, "StallScope, CPU time", cpu, b / steps, TARGETS["d"]))
    rows.append(("d", label, "StallScope, wall time", wall, b / steps, TARGETS["d"]))

    def fit(mode: str) -> Callable[[], float]:
        return lambda: lightning_fit(mode, EPOCH_STEPS, tmp, epochs=LIGHTNING_SHORT_EPOCHS)

    label = f"{LIGHTNING_SHORT_EPOCHS} Lightning epochs of {EPOCH_STEPS} steps"
    try:
        wall, cpu, b = pairs_cpu(fit("bare"), fit("watched"), args.pairs)
    except Exception as exc:  # Lightning missing
        print(f"(d) Lightning skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return rows
    steps = LIGHTNING_SHORT_EPOCHS * EPOCH_STEPS
    rows.append(("d", label, "StallScope, CPU time", cpu, b / steps, TARGETS["d"]))
    rows.append(("d", label, "StallScope, wall time", wall, b / steps, TARGETS["d"]))
    return rows


def job_epochs(args: argparse.Namespace) -> list[Row]:
    """Loop (e): loop (d) as a two-rank job (gloo, one thread a rank), launched with ``torchrun``;
    each rank runs the pairs itself (both ranks in the same order) and reports its medians."""
    settings = {"pairs": args.pairs, "epochs": SHORT_EPOCHS, "steps": EPOCH_STEPS}
    command = job_command(__file__, JOB_FLAG, json.dumps(settings))
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=JOB_ENV, timeout=1800).stdout
    rows: list[Row] = []
    for line in sorted(line for line in out.splitlines() if line.startswith("{")):
        got = json.loads(line)
        label = f"2 ranks (gloo), {SHORT_EPOCHS} epochs of {EPOCH_STEPS} steps, rank {got['rank']}"
        step = got["bare_s"] / (SHORT_EPOCHS * EPOCH_STEPS)
        rows.append(("e", label, "StallScope, CPU time", got["cpu"], step, TARGETS["e"]))
        rows.append(("e", label, "StallScope, wall time", got["wall"], step, TARGETS["e"]))
    return rows


def job_command(script: str, *args: str) -> list[str]:
    """``script`` with ``args`` as a two-rank job on this machine (``torchrun``; with ``JOB_ENV``)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script, *args]


#: a rank of loop (e) computes on one thread, like the bare loop it is measured against
JOB_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def job_loop(steps: int) -> PlainLoop:
    """One rank's loop (e): loop (a) of ``steps`` steps on a DDP model (gloo, one thread)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    loop = tiny_loop(steps)
    loop.model = nn.parallel.DistributedDataParallel(loop.model)
    loop.opt = torch.optim.SGD(loop.model.parameters(), lr=1e-3)
    return loop


def together(run: Callable[..., float]) -> Callable[..., float]:
    """``run``, started by every rank of the job at once (a barrier first)."""
    import torch.distributed as dist

    def ranks_in_step(*args: Any) -> float:
        dist.barrier()
        return run(*args)

    return ranks_in_step


def job_rank(pairs: int, epochs: int, steps: int) -> None:
    """One rank of loop (e): prints one JSON line with its median ratios."""
    import torch.distributed as dist

    loop = job_loop(steps)
    tmp = tempfile.mkdtemp(prefix="stallscope-overhead-job-")
    wall, cpu, bare = pairs_cpu(
        together(lambda: loop.bare_epochs(epochs)), together(lambda: loop.watched_epochs(epochs, tmp)), pairs
    )
    line = {"rank": dist.get_rank(), "wall": wall, "cpu": cpu, "bare_s": bare}
    print(json.dumps(line), flush=True)
    dist.destroy_process_group()


#: loop (e)'s ranks run this file again with this flag and their settings
JOB_FLAG = "--job-rank"


def across_processes(args: argparse.Namespace, argv: list[str]) -> list[tuple[Row, float | None, float | None]]:
    """Run the measurement in ``args.processes`` fresh processes, one after the other. A ratio
    measured in one process can sit several percent off another's (where the allocator put the
    tensors and StallScope's objects, which core ran it), far more than pairs within a process
    vary: many processes with a few pairs each resolve a ratio better than one with many pairs.
    Each StallScope row is the median over processes, with the lowest and highest. The
    comparison rows (torch.profiler, SimpleProfiler, an empty callback) come from the first
    process only, unless ``--comparisons-everywhere``.

    Each worker gets this command's own arguments: the ``--processes 1 --rows-json`` appended
    after them win, and a worker returns its rows before ``--memory`` or ``--markdown`` apply."""
    runs: list[list[Row]] = []
    for i in range(args.processes):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [sys.executable, __file__, *argv, "--processes", "1", "--rows-json", out.name]
            if i > 0 and not args.comparisons_everywhere:
                command.append("--no-profiler")
            print(f"process {i + 1}/{args.processes} ...", file=sys.stderr, flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            runs.append([tuple(row) for row in json.loads(Path(out.name).read_text(encoding="utf-8"))])
    by_row: dict[tuple[str, str, str], list[Row]] = {}
    for rows in runs:
        for row in rows:
            by_row.setdefault((row[0], row[1], row[2]), []).append(row)
    combined: list[tuple[Row, float | None, float | None]] = []
    for same in by_row.values():
        ratios = [row[3] for row in same]
        first = same[0]
        step = statistics.median(row[4] for row in same)
        row = (first[0], first[1], first[2], statistics.median(ratios), step, first[5])
        if len(ratios) > 1:
            combined.append((row, min(ratios), max(ratios)))
        else:  # measured in one process only: no spread to show
            combined.append((row, None, None))
    return combined


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=15, help="bare/watched pairs per loop and process")
    parser.add_argument("--processes", type=int, default=1, help="repeat in this many fresh processes (median)")
    parser.add_argument("--only", nargs="*", choices=sorted(TARGETS), help="loops to run (default: all)")
    parser.add_argument(
        "--no-profiler",
        action="store_true",
        help="skip the comparison rows (torch.profiler, SimpleProfiler, an empty callback)",
    )
    parser.add_argument(
        "--comparisons-everywhere",
        action="store_true",
        help="with --processes: measure the comparison rows in every process, not only the first",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--memory", action="store_true", help=f"also run the {MEMORY_STEPS:,}-step memory check")
    parser.add_argument("--rows-json", type=Path, help=argparse.SUPPRESS)  # a worker process's output
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    if args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    tmp = tempfile.mkdtemp(prefix="stallscope-overhead-")
    results: list[tuple[Row, float | None, float | None]]
    if args.processes > 1:
        results = across_processes(args, sys.argv[1:])
    else:
        results = [(row, row[3], row[3]) for row in measure(args, tmp)]
        if args.rows_json:
            args.rows_json.write_text(json.dumps([row for row, _, _ in results]), encoding="utf-8")
            return 0
    if args.memory:
        grown, size, seconds = memory_check(tmp)
        print(
            f"memory: {MEMORY_STEPS:,} no-op steps in {seconds:.1f} s: RSS grew {grown:.1f} MB (target <= 20), "
            f"report.json {size / 1e3:.0f} kB (target < 1000)"
        )
    spread = args.processes > 1
    header = "| loop | step (bare) | tool | watched / bare |" + (" lowest - highest |" if spread else "") + " target |"
    lines = [header, "|---|---|---|---|" + ("---|" if spread else "") + "---|"]
    for (key, label, tool, ratio, step_s, target), low, high in results:
        verdict = "-" if target is None else f"<= {target} {'met' if ratio <= target else 'MISSED'}"
        cells = [f"({key}) {label}", f"{step_s * 1e6:.0f} us", tool, f"{ratio:.3f}"]
        if spread:
            cells.append("-" if low is None or high is None else f"{low:.3f} - {high:.3f}")
        lines.append("| " + " | ".join([*cells, verdict]) + " |")
    table = "\n".join(lines)
    print(f"hot path: {hot_path()}")
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    if JOB_FLAG in sys.argv:
        job_rank(**json.loads(sys.argv[sys.argv.index(JOB_FLAG) + 1]))
        sys.exit(0)
    sys.exit(main())
