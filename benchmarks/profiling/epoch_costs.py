"""Where a watched loop (d) run spends StallScope's CPU time, by function, on the training thread.

``overhead.py --only d`` gives one ratio per run; this splits it. Each listed StallScope function
is wrapped to add up the training thread's CPU time spent inside it (``time.thread_time_ns``, about
0.6 us a reading here, so a wrapped call reads about 1.2 us high); then loop (d), 100 epochs of 30
steps of loop (a) with the console on (to memory), runs bare and watched ``--runs`` times each,
alternating, each after a full garbage collection. The table gives each function's CPU time per
run, per call and its calls per run (inclusive: a function's time includes the wrapped ones it
calls). The work of other threads (the host sampler's, the report writer's) is not in the table;
the ratio on the first line, in process CPU time, includes them, and the wrappers' own cost. The
second line splits the process's CPU time by thread: the training thread's, StallScope's own
threads' (each ``stallscope-*`` thread's CPU time from its start to its end) and the rest, bare and
watched; the third, the rest by thread name (``/proc/self/task/*/schedstat`` around each run: in a
job, gloo's ``gloo_tcp_loop`` and ``pt_gloo_runloop`` threads and the store's).

An epoch end costs what it touches: between real training steps, whose work has evicted
StallScope's code and data from the caches, a function runs several times slower than in a loop
of its own (``timeit`` of the same call).

    .venv/bin/python benchmarks/profiling/epoch_costs.py [--runs 8] [--epochs 100] [--cuda | --job]
    (about 20 seconds on 2 cores)

``--cuda`` runs the loop with its model and batches on the GPU, where every epoch end also
closes the CUDA events' and NVML's windows, and adds those functions and the wall time spent in
each (a CUDA call may wait without using the CPU).

``--job`` runs loop (e) instead: the loop as a two-rank gloo job under ``torchrun`` (a DDP
model, both ranks starting each run together), and prints each rank's table, with the parts a
job adds (the exchange of the ranks' epochs, rank 0's job epoch, the forward passes' timer).
Its first line's ratio counts the process's gloo threads too, and the barrier before each run.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (module, class, method): the scope's start, the epoch end, the next pass's set-up, the run's end
WRAPPED = (
    ("stallscope.hooks.scope", "StallScope", "__init__"),
    ("stallscope.hooks.scope", "StallScope", "__enter__"),
    ("stallscope.hooks.scope", "StallScope", "_end_epoch"),
    ("stallscope.hooks.scope", "StallScope", "_inspect"),
    ("stallscope.hooks.scope", "StallScope", "_first_item"),
    ("stallscope.hooks.session", "Session", "end_epoch"),
    ("stallscope.hooks.session", "Session", "_wait"),
    ("stallscope.hooks.session", "Session", "_settle"),
    ("stallscope.hooks.session", "Session", "_known"),
    ("stallscope.hooks.session", "Session", "_print_epoch"),
    ("stallscope.hooks.session", "Session", "note_loader"),
    ("stallscope.hooks.session", "Session", "finish"),
    ("stallscope.hooks.session", "Session", "summarize"),
    ("stallscope.hooks.session", "Session", "write"),
    ("stallscope.timeline.recorder", "Timeline", "end_epoch_snapshot"),
    ("stallscope.timeline.recorder", "Timeline", "mark_epoch"),
    ("stallscope.timeline.recorder", "Timeline", "_fold_closing"),
    ("stallscope.timeline.recorder", "Timeline", "_flush"),
    ("stallscope.timeline.recorder", "Timeline", "begin_epoch"),
    ("stallscope.timeline.recorder", "Timeline", "stream"),
    ("stallscope.timeline.recorder", "Timeline", "resume"),
    ("stallscope.timeline.stats", "SpanSnapshot", "stats"),
    ("stallscope.signals.collector", "SignalCollector", "close_window"),
    ("stallscope.hooks.session", "Session", "_write_html"),
    ("stallscope.hooks.session", "Session", "print"),
    ("stallscope.hooks.session", "Session", "build_report"),
    ("stallscope.report.writer", "ReportWriter", "write_final"),
    ("stallscope.report.writer", "ReportWriter", "_write_locked"),
)

#: the same, for the parts a CUDA run adds (``--cuda``)
WRAPPED_CUDA = (
    ("stallscope.signals.collector", "SignalCollector", "_refresh_device"),
    ("stallscope.signals.collector", "SignalCollector", "_confirm_cuda"),
    ("stallscope.signals.collector", "SignalCollector", "check_device"),
    ("stallscope.signals.collector", "SignalCollector", "note_batch"),
    ("stallscope.signals.nvml", "NvmlSampler", "close_window"),
    ("stallscope.signals.nvml", "NvmlSampler", "run_summary"),
    ("stallscope.signals.cuda_events", "CudaComputeTimer", "close_window"),
    ("stallscope.signals.cuda_events", "CudaComputeTimer", "run_summary"),
    ("stallscope.hooks.session", "Session", "_close_epoch"),
    ("stallscope.hooks.session", "Session", "_keep_epoch"),
    ("stallscope.hooks.session", "Session", "_device"),
    ("stallscope.hooks.session", "Session", "_report_job"),
    ("stallscope.report.writer", "ReportWriter", "submit"),
)

#: the same, for the parts a distributed job adds (``--job``)
WRAPPED_JOB = (
    ("stallscope.hooks.session", "Session", "_close_epoch"),
    ("stallscope.hooks.session", "Session", "_keep_epoch"),
    ("stallscope.hooks.session", "Session", "_close_job_epoch"),
    ("stallscope.hooks.session", "Session", "_note_forward"),
    ("stallscope.hooks.session", "Session", "_write_own_later"),
    ("stallscope.hooks.session", "Session", "_print_job_epoch"),
    ("stallscope.hooks.distributed", "Job", "close_epoch"),
    ("stallscope.hooks.distributed", "Job", "_gather"),
    ("stallscope.hooks.distributed", "Job", "_post"),
    ("stallscope.hooks.distributed", "Job", "_collect"),
    ("stallscope.hooks.distributed", "Job", "_take_posts"),
    ("stallscope.hooks.distributed", "Job", "_receive"),
    ("stallscope.hooks.distributed", "Job", "_take"),
    ("stallscope.hooks.distributed", "Job", "_close_group"),
    ("stallscope.hooks.distributed", "Job", "finish"),
    ("stallscope.hooks.distributed", "Exchange", "post"),
    ("stallscope.hooks.distributed", "Exchange", "collect"),
    ("stallscope.hooks.distributed", "Exchange", "take"),
)

#: a rank of ``--job`` runs this file again with this flag
JOB_FLAG = "--job-rank"


def wrap(
    fn: Callable[..., Any], label: str, spent: Counter[str], calls: Counter[str], walls: Counter[str] | None = None
) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        wall = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.thread_time_ns() - start
            calls[label] += 1
            if walls is not None:
                walls[label] += time.perf_counter_ns() - wall

    return timed


def count_threads(spent: Counter[str], prefix: str = "stallscope-") -> None:
    """Add each ``prefix`` thread's CPU time, from its start to its end, to ``spent`` by name."""
    run = threading.Thread.run

    def counted(self: threading.Thread) -> None:
        if not self.name.startswith(prefix):
            run(self)
            return
        start = time.thread_time_ns()
        try:
            run(self)
        finally:
            spent[self.name] += time.thread_time_ns() - start

    threading.Thread.run = counted  # type: ignore[method-assign]


def native_threads() -> dict[int, tuple[str, float]]:
    """Each thread of this process by id, other than the calling one: its name (``comm``: torch's
    and gloo's threads name themselves, Python's are ``python``) and its CPU seconds so far
    (``procfs.thread_schedstat``); empty where ``/proc`` has no such files."""
    from stallscope.signals.procfs import thread_schedstat

    own = threading.get_native_id()
    threads: dict[int, tuple[str, float]] = {}
    try:
        tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return threads
    for tid in tids:
        if tid == own:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue  # ended meanwhile
        stat = thread_schedstat(tid)
        if stat is not None:
            threads[tid] = (name, stat[0])
    return threads


def add_native(spent: Counter[str], before: dict[int, tuple[str, float]]) -> None:
    """Add to ``spent``, by name, the CPU time (ns) each thread alive at ``before`` and now used
    since (a thread that started or ended in between is not counted: StallScope's,
    ``count_threads``)."""
    for tid, (name, seconds) in native_threads().items():
        if tid in before and before[tid][0] == name:
            spent[name] += round((seconds - before[tid][1]) * 1e9)


def to_cuda(loop: Any) -> None:
    """Move loop (a)'s model, optimizer and batches to the GPU."""
    import torch

    loop.model.cuda()
    loop.opt = torch.optim.SGD(loop.model.parameters(), lr=1e-3)
    loop.batches = [(x.cuda(), y.cuda()) for x, y in loop.batches]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8, help="bare and watched runs each (default 8)")
    parser.add_argument("--epochs", type=int, default=100, help="epochs of 30 steps a run (default 100)")
    parser.add_argument("--cuda", action="store_true", help="the loop on the GPU (see above)")
    parser.add_argument("--job", action="store_true", help="loop (e): two gloo ranks under torchrun, a table each")
    parser.add_argument(JOB_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runs < 1 or args.epochs < 1:
        parser.error("--runs and --epochs must be >= 1")
    if args.job and args.cuda:
        parser.error("--job runs on the CPU")
    if args.job:
        import subprocess

        from overhead import JOB_ENV, job_command

        command = job_command(__file__, JOB_FLAG, "--runs", str(args.runs), "--epochs", str(args.epochs))
        return subprocess.run(command, env=JOB_ENV, check=False).returncode
    job = args.job_rank

    import importlib

    import torch
    from overhead import EPOCH_STEPS, tiny_loop

    from stallscope.hooks import session

    torch.set_num_threads(1)
    spent: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    walls: Counter[str] = Counter()
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda needs a CUDA GPU")
    extra = WRAPPED_CUDA if args.cuda else WRAPPED_JOB if job else ()
    for module_name, class_name, name in (*WRAPPED, *extra):
        cls = getattr(importlib.import_module(module_name), class_name)
        setattr(cls, name, wrap(getattr(cls, name), f"{class_name}.{name}", spent, calls, walls))
    session.diagnose = wrap(session.diagnose, "diagnose (an epoch's or the run's)", spent, calls, walls)
    # the run's end, by part (module functions, wrapped where the session and the writer find them)
    from stallscope.report import io

    session.recent_from_record = wrap(session.recent_from_record, "recent_from_record", spent, calls, walls)
    session.render_report = wrap(session.render_report, "render_report (report.html)", spent, calls, walls)
    io.report_to_dict = wrap(io.report_to_dict, "report_to_dict", spent, calls, walls)
    if args.cuda:
        from stallscope.signals import collector

        collector.cuda_facts = wrap(collector.cuda_facts, "cuda_facts", spent, calls, walls)

    if job:
        from stallscope.hooks import distributed

        distributed.job_summary = wrap(distributed.job_summary, "job_summary", spent, calls, walls)
        distributed.summary_from_dict = wrap(distributed.summary_from_dict, "summary_from_dict", spent, calls, walls)
        distributed._payload = wrap(distributed._payload, "_payload", spent, calls, walls)
        distributed._span = wrap(distributed._span, "_span", spent, calls, walls)
    if job:  # loop (e): a DDP model, each run started together
        import torch.distributed as dist
        from overhead import job_loop, together

        loop = job_loop(EPOCH_STEPS)
        loop.bare_epochs = together(loop.bare_epochs)  # type: ignore[method-assign]
        loop.watched_epochs = together(loop.watched_epochs)  # type: ignore[method-assign]
    else:
        loop = tiny_loop(EPOCH_STEPS)
    if args.cuda:
        to_cuda(loop)
    threads: Counter[str] = Counter()
    count_threads(threads)
    report_dir = tempfile.mkdtemp(prefix="stallscope-epoch-costs-")
    loop.bare_epochs(3)  # both meet the code once before counting
    loop.watched_epochs(3, report_dir)
    spent.clear()
    calls.clear()
    walls.clear()
    threads.clear()
    bare = watched = 0.0
    own = {"bare": 0.0, "watched": 0.0}  # the training thread's CPU seconds
    native = {"bare": Counter[str](), "watched": Counter[str]()}  # the other threads', by name
    for _ in range(args.runs):
        gc.collect()
        others = native_threads()
        start, mine = time.process_time(), time.thread_time()
        loop.bare_epochs(args.epochs)
        bare += time.process_time() - start
        own["bare"] += time.thread_time() - mine
        add_native(native["bare"], others)
        gc.collect()
        others = native_threads()
        start, mine = time.process_time(), time.thread_time()
        loop.watched_epochs(args.epochs, report_dir)
        watched += time.process_time() - start
        own["watched"] += time.thread_time() - mine
        add_native(native["watched"], others)
    if job:  # one rank's table after the other's
        rank = dist.get_rank()
        for turn in range(dist.get_world_size()):
            dist.barrier()
            if turn == rank:
                _table(args, spent, calls, walls, bare, watched, f"loop (e), rank {rank}", own, threads, native)
        dist.destroy_process_group()
        return 0
    _table(args, spent, calls, walls, bare, watched, "loop (d)", own, threads, native)
    return 0


def _table(
    args: argparse.Namespace,
    spent: Counter[str],
    calls: Counter[str],
    walls: Counter[str],
    bare: float,
    watched: float,
    loop: str,
    own: dict[str, float],
    threads: Counter[str],
    native: dict[str, Counter[str]],
) -> None:
    from overhead import EPOCH_STEPS

    runs = args.runs
    print(
        f"{loop}, {args.epochs} epochs of {EPOCH_STEPS} steps: bare {bare / runs * 1e3:.1f} ms of CPU a run, "
        f"watched {watched / runs * 1e3:.1f} ms ({watched / bare:.3f}, the wrappers' cost included)"
    )
    helpers = sum(threads.values()) / 1e9
    by_name = ", ".join(f"{name} {ns / runs / 1e6:.1f}" for name, ns in threads.most_common())
    print(
        f"by thread, ms a run: training thread bare {own['bare'] / runs * 1e3:.1f}, watched "
        f"{own['watched'] / runs * 1e3:.1f}; StallScope's threads {helpers / runs * 1e3:.1f} ({by_name or 'none'}); "
        f"the rest bare {(bare - own['bare']) / runs * 1e3:.1f}, watched "
        f"{(watched - own['watched'] - helpers) / runs * 1e3:.1f}"
    )
    names = sorted(set(native["bare"]) | set(native["watched"]), key=lambda n: -native["bare"][n])
    by_thread = (f"{n} {native['bare'][n] / runs / 1e6:.1f} / {native['watched'][n] / runs / 1e6:.1f}" for n in names)
    if names:
        print("of the rest, threads alive through each run, by name, ms a run bare / watched: " + ", ".join(by_thread))
    print(
        f"{'function (inclusive)':44s} {'ms a run':>9s} {'% of bare':>9s} {'us a call':>9s} {'calls a run':>11s}"
        f" {'wall ms a run':>13s}"
    )
    for label, ns in spent.most_common():
        per_run_ms = ns / runs / 1e6
        print(
            f"{label:44s} {per_run_ms:9.2f} {per_run_ms / (bare / runs * 1e3):9.2%} "
            f"{ns / calls[label] / 1e3:9.1f} {calls[label] / runs:11.1f} {walls[label] / runs / 1e6:13.2f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
