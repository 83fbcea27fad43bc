"""Where does the between-run scatter of the idle fraction come from?

Runs the two reference jobs of ``benchmarks/gate_noise.py`` as CI runs them: every few runs a fresh
Python process (``--per-process`` runs in each), the jobs alternating. For every run it records the
report's idle fraction and idle windows, its own per-step timings (wait for the batch, compute),
the CPU time of the machine's other processes (``/proc/stat``) and the process id. Then, per job:

* the whole-run idle fraction's between-run standard deviation, that of the first run of each
  process and of the later ones;
* the idle fraction with the first 1, 2, 4 ... 32 steps left out (the start of a run: DataLoader
  worker start-up, first batches, allocator and thread-pool warm-up);
* the first and the last window against the rest;
* the scatter between processes against the scatter between runs of one process (pooled);
* the correlation with the other processes' CPU time (a busy machine).

    flock -x /work/bench.lock .venv/bin/python benchmarks/gate_scatter.py [--processes 6] [--per-process 3] [--steps N]

Timing-based: report the machine's load (``uptime``) with the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

from common import Trainer, emulate_accelerator, loader  # noqa: E402
from gate_noise import JOBS, FixedWorkDataset, Job, _rounds  # noqa: E402

from stallscope import StallScope  # noqa: E402

SKIPS = (0, 1, 2, 4, 8, 16, 32)


def _proc_stat() -> list[int]:
    """The machine's CPU time so far, in jiffies: user nice system idle iowait irq softirq steal."""
    with open("/proc/stat", encoding="ascii") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def one_run(job: Job, report_dir: Path) -> dict[str, Any]:
    """One run of ``job`` (as ``gate_noise.run_job`` does it), timed step by step."""
    emulate_accelerator()
    data = loader(
        FixedWorkDataset(job.batches * job.batch_size, rounds=_rounds(job.cpu_ms / 1e3)),
        batch_size=job.batch_size,
        num_workers=job.workers,
    )
    trainer = Trainer(hidden=job.hidden)
    stat0, self0, child0 = _proc_stat(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    steps: list[tuple[float, float]] = []
    with StallScope(str(report_dir), console=False) as scope:
        mark = time.perf_counter()
        for batch in scope.iter(data):
            got = time.perf_counter()
            with scope.phase("compute"):
                trainer.step(batch, repeat=job.repeat)
            done = time.perf_counter()
            steps.append((got - mark, done - got))
            mark = done
    stat1 = _proc_stat()
    ours = _cpu(resource.RUSAGE_SELF) - self0 + _cpu(resource.RUSAGE_CHILDREN) - child0
    busy = sum(stat1[i] - stat0[i] for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")
    report = scope.report
    assert report is not None
    return {
        "idle": report.summary.gpu_idle_fraction,
        "wall_s": report.summary.wall_s,
        "windows": [dict(w) for w in report.summary.idle_windows],
        "steps": steps,
        "other_cpu_s": busy - ours,
        "pid": os.getpid(),
    }


def child(name: str, steps: int, runs: int, out: Path) -> None:
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    job = replace(JOBS[name], batches=steps) if steps else JOBS[name]
    with tempfile.TemporaryDirectory(prefix="gate-scatter-") as tmp, out.open("a", encoding="utf-8") as f:
        for i in range(runs):
            row = one_run(job, Path(tmp) / str(i))
            row.update(job=name, index_in_process=i)
            f.write(json.dumps(row) + "\n")


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) * 100 if len(values) > 1 else math.nan


def _idle_after(steps: list[list[float]], skip: int) -> float:
    rest = steps[skip:]
    wait = sum(s[0] for s in rest)
    return wait / (wait + sum(s[1] for s in rest))


def _corr(x: list[float], y: list[float]) -> float:
    mx, my = statistics.mean(x), statistics.mean(y)
    vx = sum((a - mx) ** 2 for a in x)
    vy = sum((b - my) ** 2 for b in y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / math.sqrt(vx * vy) if vx * vy > 0 else math.nan


def analyse(rows: list[dict[str, Any]], name: str) -> list[str]:
    runs = [r for r in rows if r["job"] == name]
    if len(runs) < 3:
        return [f"{name}: too few runs"]
    idle = [r["idle"] for r in runs]
    lines = [
        f"{name}: {len(runs)} runs in {len({r['pid'] for r in runs})} processes, "
        f"{len(runs[0]['steps'])} steps, {statistics.mean(r['wall_s'] for r in runs):.2f} s a run",
        f"  whole-run idle: mean {statistics.mean(idle):.1%}, between-run sd {_sd(idle):.2f} pp",
    ]
    for first in (True, False):
        part = [r["idle"] for r in runs if (r["index_in_process"] == 0) is first]
        if len(part) > 1:
            lines.append(f"  {'first run of a process' if first else 'later runs'}: sd {_sd(part):.2f} pp")
    after = ", ".join(f"{k}: {_sd([_idle_after(r['steps'], k) for r in runs]):.2f}" for k in SKIPS)
    lines.append(f"  sd (pp) with the first k steps left out, k = {after}")
    first_w = [r["windows"][0]["idle_fraction"] for r in runs]
    last_w = [r["windows"][-1]["idle_fraction"] for r in runs]
    lines.append(
        f"  first window: mean {statistics.mean(first_w):.1%} sd {_sd(first_w):.1f} pp; last window: mean "
        f"{statistics.mean(last_w):.1%} sd {_sd(last_w):.1f} pp; windows per run {len(runs[0]['windows'])}"
    )
    by_pid: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        by_pid[r["pid"]].append(r["idle"])
    dev = [v - statistics.mean(vs) for vs in by_pid.values() for v in vs]
    dof = len(dev) - len(by_pid)
    if dof > 0:
        within = math.sqrt(sum(d * d for d in dev) / dof) * 100
        lines.append(f"  scatter between runs of one process (pooled sd): {within:.2f} pp")
    other = [r["other_cpu_s"] for r in runs]
    lines.append(
        f"  other processes' CPU during a run: mean {statistics.mean(other):.2f} s, max {max(other):.2f} s; "
        f"correlation with idle {_corr(other, idle):+.2f}"
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=6, help="fresh processes per job (default 6)")
    parser.add_argument("--per-process", type=int, default=3, help="runs in each process (default 3)")
    parser.add_argument("--steps", type=int, default=0, help="steps a run (default: gate_noise.py's)")
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS))
    parser.add_argument("--child", nargs=3, metavar=("JOB", "RUNS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.steps, int(args.child[1]), Path(args.child[2]))
        return 0
    with tempfile.TemporaryDirectory(prefix="gate-scatter-") as tmp:
        out = Path(tmp) / "runs.jsonl"
        for _ in range(args.processes):
            for name in args.jobs:
                command = [sys.executable, __file__, "--steps", str(args.steps)]
                subprocess.run([*command, "--child", name, str(args.per_process), str(out)], check=True)
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    for name in args.jobs:
        print("\n".join(analyse(rows, name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
