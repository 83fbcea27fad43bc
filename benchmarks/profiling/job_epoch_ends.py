"""Where each rank of loop (e) pauses at its epoch ends, and whether the ranks pause together.

A rank's epoch end is a pause of its training thread between two steps; the other ranks wait
for it at the next step's all-reduce. So pauses of two ranks at the same epoch end cost the job
about the longer of the two, and pauses at different epoch ends cost it both. This runs loop
(e) of ``overhead.py`` (loop (d), 100 epochs of 30 tiny steps, as a two-rank gloo job under
``torchrun``) watched ``--runs`` times, each between bare runs, with each rank's
``StallScope._end_epoch`` timed on the wall clock, and prints for each run: each rank's pauses
added up, the job's share of them (the longer of the two ranks' pause at each epoch end, added
up; what the job loses if nothing else moves), how much of it is beyond the rank that pauses
more (what pauses at different epoch ends add), and the epochs where a rank paused longer than
``--long-us``. The run's end (``Session.finish``) is not in these numbers.

    .venv/bin/python benchmarks/profiling/job_epoch_ends.py [--runs 4] [--long-us 300]
    (about one minute on 2 cores)

docs/overhead.md, "The ranks pause together", has this VM's numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JOB_FLAG = "--job-rank"
EPOCHS = 100


def job_rank(runs: int, out_dir: Path) -> None:
    """One rank: its epoch ends' pauses in each watched run, into ``out_dir/rank-<R>.json``."""
    import torch.distributed as dist
    from overhead import EPOCH_STEPS, job_loop

    from stallscope.hooks.scope import StallScope

    loop = job_loop(EPOCH_STEPS)
    pauses: list[int] = []
    real = StallScope._end_epoch

    def timed(self: StallScope, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return real(self, *args, **kwargs)
        finally:
            pauses.append(time.perf_counter_ns() - start)

    StallScope._end_epoch = timed  # type: ignore[method-assign]
    report_dir = tempfile.mkdtemp(prefix="stallscope-epoch-ends-")
    out: list[list[int]] = []
    for _ in range(runs):
        dist.barrier()
        loop.bare_epochs(EPOCHS)
        dist.barrier()
        pauses.clear()
        loop.watched_epochs(EPOCHS, report_dir)
        out.append(list(pauses))
    dist.barrier()
    (out_dir / f"rank-{dist.get_rank()}.json").write_text(json.dumps(out), encoding="utf-8")
    dist.destroy_process_group()


def summary(by_rank: dict[int, list[list[int]]], long_ns: int) -> list[str]:
    """Each run's line and its long pauses, ranks 0 and 1 side by side."""
    lines = []
    for run, (p0, p1) in enumerate(zip(by_rank[0], by_rank[1], strict=True), 1):
        s0, s1 = sum(p0) / 1e6, sum(p1) / 1e6
        job = sum(max(a, b) for a, b in zip(p0, p1, strict=False)) / 1e6
        lines.append(
            f"run {run}: rank 0 {s0:.1f} ms, rank 1 {s1:.1f} ms; the job's (the longer at each epoch end) "
            f"{job:.1f} ms, {job - max(s0, s1):.1f} ms beyond rank {0 if s0 >= s1 else 1}'s"
        )
        pairs = list(zip(p0, p1, strict=False))
        long = [f"{i}:{a / 1e3:.1f}/{b / 1e3:.1f}" for i, (a, b) in enumerate(pairs) if max(a, b) > long_ns]
        lines.append(f"  epoch ends over {long_ns / 1e3:g} us, epoch:rank 0/rank 1 ms: {' '.join(long)}")
        lines.append(
            f"  only rank 0: {sum(a > long_ns >= b for a, b in pairs)}, only rank 1: "
            f"{sum(b > long_ns >= a for a, b in pairs)}, both: {sum(min(a, b) > long_ns for a, b in pairs)}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4, help="watched runs (default 4)")
    parser.add_argument("--long-us", type=float, default=300.0, help="a long pause, us (default 300)")
    parser.add_argument(JOB_FLAG, type=Path, help=argparse.SUPPRESS)  # a rank's: where its numbers go
    args = parser.parse_args()
    if args.runs < 1 or args.long_us <= 0:
        parser.error("--runs must be >= 1, --long-us > 0")
    if args.job_rank:
        job_rank(args.runs, args.job_rank)
        return 0
    from overhead import JOB_ENV, job_command

    with tempfile.TemporaryDirectory(prefix="stallscope-epoch-ends-") as out:
        command = job_command(__file__, JOB_FLAG, out, "--runs", str(args.runs))
        done = subprocess.run(command, env=JOB_ENV, check=False, capture_output=True, text=True)
        files = [Path(out) / f"rank-{r}.json" for r in (0, 1)]
        if done.returncode or not all(f.exists() for f in files):
            sys.stderr.write(done.stderr[-4000:])
            return done.returncode or 1
        by_rank = {r: json.loads(f.read_text(encoding="utf-8")) for r, f in enumerate(files)}
    for line in summary(by_rank, round(args.long_us * 1e3)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
