"""What StallScope adds to loop (d), many short epochs, in CPU instructions of the training thread.

``overhead.py --only d`` times whole runs of 100 epochs of 30 steps, and on a shared VM its
ratios move by 3 to 4% between runs, more than a change to the epoch-end work. This script counts
instead: it runs one whole loop (d) run, bare or watched (``overhead.py``'s ``bare_epochs`` and
``watched_epochs``: start-up, every epoch end, the final report and panel), under
``valgrind --tool=callgrind`` in its own process, and reads the instructions the training thread
executed between two ``os.getppid()`` calls around it (callgrind dumps its counters at each). Each
process first runs the loop once bare and once watched, so that both meet the same code first.

``--cache-sim`` also counts the training thread's first-level cache misses (callgrind's simulated
32 kB caches): an epoch end runs cold, after the steps' own work, and each miss costs a trip to
the second level or further that the instruction count does not show.

The host sampler's thread and the report writer's are not the training thread: their work is
left out (under valgrind a run takes some 50 times longer while the sampler keeps its wall-clock
period, so it would sample 50 times too often). ``step_cost.py`` measures the sampler's share.

    .venv/bin/python benchmarks/profiling/epoch_instructions.py [--cache-sim] [--epochs 100]
    (about 10 minutes on 2 cores with --cache-sim; needs valgrind)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instructions import callgrind_command, find_valgrind, window_counts  # noqa: E402  (the sibling script)

ROOT = Path(__file__).resolve().parents[2]


def child(variant: str, epochs: int) -> None:
    """One loop (d) run in ``variant`` (bare, watched) between two ``os.getppid()`` marks."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from overhead import EPOCH_STEPS, tiny_loop

    torch.set_num_threads(1)
    loop = tiny_loop(EPOCH_STEPS)
    report_dir = tempfile.mkdtemp(prefix="stallscope-epoch-instructions-")
    loop.bare_epochs(2)
    loop.watched_epochs(2, report_dir)
    os.getppid()
    if variant == "bare":
        loop.bare_epochs(epochs)
    else:
        loop.watched_epochs(epochs, report_dir)
    os.getppid()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=100, help="epochs of the measured run (default 100)")
    parser.add_argument("--cache-sim", action="store_true", help="also count first-level cache misses")
    parser.add_argument("--child", nargs=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.epochs)
        return 0
    valgrind = find_valgrind("epoch_instructions.py")
    if valgrind is None:
        return 2
    out_dir = Path(tempfile.mkdtemp(prefix="stallscope-callgrind-"))
    procs = {}
    for variant in ("bare", "watched"):
        command = callgrind_command(
            valgrind, out_dir, __file__, [f"--epochs={args.epochs}", "--child", variant], cache_sim=args.cache_sim
        )
        log = (out_dir / f"{variant}.log").open("w")
        procs[variant] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
    counts = {}
    for variant, (proc, log) in procs.items():
        rc = proc.wait()
        log.close()
        if rc != 0:
            print(f"{variant}: exit {rc}; see {out_dir}/{variant}.log", file=sys.stderr)
            return 1
        counts[variant] = window_counts(out_dir, proc.pid)
    bare, watched = counts["bare"], counts["watched"]
    print(f"loop (d), {args.epochs} epochs: the training thread's counts over one whole run")
    print("| event | bare | watched | StallScope adds | share | per epoch |")
    print("|---|---|---|---|---|---|")
    for event in bare:
        added = watched[event] - bare[event]
        share = f"{added / bare[event]:.2%}" if bare[event] else "-"
        print(f"| {event} | {bare[event]:,} | {watched[event]:,} | {added:,} | {share} | {added / args.epochs:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
