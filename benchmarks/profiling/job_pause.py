"""What a pause between steps costs a bare run, in one process and in a two-rank gloo job.

StallScope's work at an epoch end is a pause in the training thread between two steps. In one
process a pause of p costs the run about p (plus the caches the next steps refill). In a job the
other ranks wait for the paused one in the next step's all-reduce, and on a machine whose cores
the ranks and gloo's threads keep busy (loop (e) of ``overhead.py`` on 2 cores) the wait and the
wake-ups after it cost more than p. This measures that factor on the bare loop, with no StallScope:
loop (e)'s bare loop (loop (a)'s model in DistributedDataParallel, one thread a rank) runs blocks
of ``--steps`` steps, with and without a pause every 30 steps (an epoch of loop (d)), alternating
which goes first; the factor is (wall time with pauses - without) / (the pauses' total), the
median over ``--blocks`` pairs, with its quartiles. A pause is a ``time.sleep`` (the thread
lets go of its core, as it does when it waits for a store or a lock) or a busy loop of the same
length (it keeps the core, as StallScope's own work does). In the job the pause is on rank 0
alone (``rank0``, where a job's epoch end costs most) or on both ranks at once (``both``).

    .venv/bin/python benchmarks/profiling/job_pause.py [--pauses-ms 1 5] [--blocks 12] [--steps 900]
    (about 6 minutes on 2 cores with the defaults)

``overhead.py``'s row (e) compares whole watched runs with bare ones on rank 0's wall time: a
factor over 1 here is how much more a job's epoch ends cost that row than the same work costs
row (d). docs/overhead.md, "What a pause costs a job", has this VM's numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JOB_FLAG = "--job-rank"
#: steps between two pauses: one epoch of loop (d)
EPOCH_STEPS = 30

#: runs a block: (steps, pause in seconds or 0, "sleep" or "busy", who pauses: None in one process,
#: "rank0" or "both" in the job) -> its wall time
RunBlock = Callable[[int, float, str, "str | None"], float]


def pause(seconds: float, how: str) -> None:
    """A pause of ``seconds``: a sleep, or a busy loop on the clock."""
    if how == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def blocks(run_block: RunBlock, args: argparse.Namespace, paused: Sequence[str | None]) -> dict[str, list[float]]:
    """For each pause length and kind: the factor of each pair of blocks (see the docstring)."""
    factors: dict[str, list[float]] = {}
    for ms in args.pauses_ms:
        for how in ("sleep", "busy"):
            for who in paused:
                key = f"{how} {ms:g} ms" + (f" on {who}" if who else "")
                got = factors.setdefault(key, [])
                for k in range(args.blocks):
                    walls = {}
                    for with_pauses in (True, False) if k % 2 else (False, True):
                        walls[with_pauses] = run_block(args.steps, ms / 1e3 if with_pauses else 0.0, how, who)
                    total = len(range(0, args.steps, EPOCH_STEPS)) * ms / 1e3  # the pauses a block makes
                    got.append((walls[True] - walls[False]) / total)
    return factors


def summary(factors: dict[str, list[float]], where: str) -> list[str]:
    """One line a pause: the median factor and its quartiles."""
    lines = []
    for key, values in factors.items():
        low, _, high = statistics.quantiles(values, n=4)
        lines.append(
            f"{where}, {key}: wall added / pause {statistics.median(values):.2f} (quartiles {low:.2f} - {high:.2f})"
        )
    return lines


def one_process(args: argparse.Namespace) -> list[str]:
    """The factors in this process: loop (a)'s model, one thread."""
    import torch
    from overhead import tiny_loop

    torch.set_num_threads(1)
    loop = tiny_loop(EPOCH_STEPS)
    return summary(blocks(_runner(loop, rank=0), args, (None,)), "one process")


def _runner(loop: Any, *, rank: int) -> RunBlock:
    """Blocks of ``loop``'s steps as this rank (0 in one process) runs them."""
    batches = loop.batches

    def run_block(steps: int, seconds: float, how: str, who: str | None) -> float:
        if who is not None:  # a job's ranks start each block together
            import torch.distributed as dist

            dist.barrier()
        start = time.perf_counter()
        for i in range(steps):
            if seconds and i % EPOCH_STEPS == 0 and (who != "rank0" or rank == 0):
                pause(seconds, how)
            loop.train_step(*batches[i % len(batches)])
        return time.perf_counter() - start

    return run_block


def job_rank(args: argparse.Namespace) -> None:
    """One rank of the job; rank 0 prints its factors as one JSON line."""
    import torch.distributed as dist
    from overhead import job_loop

    loop = job_loop(EPOCH_STEPS)
    rank = dist.get_rank()
    run_block = _runner(loop, rank=rank)
    run_block(300, 0.0, "sleep", "both")  # both meet the code first
    factors = blocks(run_block, args, ("rank0", "both"))
    if rank == 0:  # rank 0's wall time, as overhead.py's row (e)
        print(json.dumps(factors), flush=True)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pauses-ms", type=float, nargs="+", default=[1.0, 5.0], help="pause lengths (ms)")
    parser.add_argument("--blocks", type=int, default=12, help="pairs of blocks a pause (default 12)")
    parser.add_argument("--steps", type=int, default=900, help="steps a block (default 900)")
    parser.add_argument(JOB_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.blocks < 2 or args.steps < EPOCH_STEPS or any(ms <= 0 for ms in args.pauses_ms):
        parser.error(f"--blocks must be >= 2, --steps >= {EPOCH_STEPS}, each pause > 0")
    if args.job_rank:
        job_rank(args)
        return 0
    from overhead import JOB_ENV, job_command

    for line in one_process(args):
        print(line, flush=True)
    command = job_command(__file__, JOB_FLAG, "--blocks", str(args.blocks), "--steps", str(args.steps))
    command += ["--pauses-ms", *(f"{ms:g}" for ms in args.pauses_ms)]
    done = subprocess.run(command, env=JOB_ENV, check=False, capture_output=True, text=True)
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not rows:
        sys.stderr.write(done.stderr[-4000:])
        return done.returncode or 1
    for line in summary(json.loads(rows[-1]), "two-rank job, rank 0's wall"):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
