"""The CUDA-event timer in a process's first training run, where CUDA initialises lazily.

Each variant runs in a fresh process: a first copy to the GPU (the CUDA context, as an earlier
cell of a notebook or a data check would make it), then one ``gpu_check.py`` scenario, watched.
Every event StallScope's timer records is wrapped: the host cost of each record and the device
span of each timed compute phase are logged. The script prints, per run, the idle fraction
StallScope reported and from which source, NVML's mean utilization beside it, and the timer's
first spans, its timed and untimed phases and its gap between timed phases.

``--old`` (in each pair, the first) runs the timer as it was before: the first compute phase
timed, the gap between timed phases unbounded and no window borrowing the run's busy time per
phase (``WARMUP_PHASES = 0``, ``MAX_GAP_NS`` and ``MIN_WINDOW_PHASES`` out of reach).

    python benchmarks/profiling/cuda_first_run.py [--scenarios pageable starved]
    (about a minute on an H100 host; needs a CUDA GPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child(scenario: str, old: bool) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check
    import torch

    from stallscope.signals import collector, cuda_events

    if old:
        cuda_events.WARMUP_PHASES = 0
        cuda_events.MAX_GAP_NS = 10**15
        cuda_events.MIN_WINDOW_PHASES = 10**9
        init = cuda_events.CudaComputeTimer.__init__

        def old_init(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs["warmup"] = 0
            init(self, *args, **kwargs)

        cuda_events.CudaComputeTimer.__init__ = old_init  # type: ignore[method-assign]

    records: list[float] = []
    spans: list[float] = []
    timers: list[Any] = []
    real_factory = collector.event_factory

    class Logged:
        def __init__(self, event: Any) -> None:
            self.event = event

        def record(self) -> None:
            t0 = time.perf_counter()
            self.event.record()
            records.append((time.perf_counter() - t0) * 1e6)

        def query(self) -> bool:
            return bool(self.event.query())

        def elapsed_time(self, end: Any) -> float:
            ms = float(self.event.elapsed_time(end.event))
            spans.append(ms)
            return ms

    def factory() -> Any:
        make = real_factory()
        return None if make is None else (lambda: Logged(make()))

    collector.event_factory = factory  # type: ignore[assignment]
    real_timer = collector.CudaComputeTimer

    def timer(*args: Any, **kwargs: Any) -> Any:
        made = real_timer(*args, **kwargs)
        timers.append(made)
        return made

    collector.CudaComputeTimer = timer  # type: ignore[misc,assignment]
    torch.zeros(1).to("cuda")  # the CUDA context only, as an earlier copy makes it
    torch.cuda.synchronize()
    run, _ = gpu_check.SCENARIOS[scenario]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = run(f"{tmp}/run", False)
    s = report.summary
    out: dict[str, Any] = {
        "scenario": scenario,
        "timer": "old" if old else "new",
        "steps": s.steps,
        "wall_s": round(s.wall_s, 3),
        "idle_source": s.idle_source,
        "gpu_idle_fraction": round(s.gpu_idle_fraction, 3),
        "nvml_util_mean": (s.nvml or {}).get("util_mean"),
        "compute_fraction": round(s.phase_fractions.get("compute", 0.0), 3),
        "top_findings": [(f.id, f.est_speedup) for f in report.findings[:3]],
        "first_spans_ms": [round(x, 3) for x in spans[:6]],
        "median_span_ms": round(statistics.median(spans), 3) if spans else None,
        "timed_spans": len(spans),
        "first_records_us": [round(x, 1) for x in records[:6]],
        "median_record_us": round(statistics.median(records), 1) if records else None,
    }
    if timers:
        t = timers[-1]
        out["untimed"] = t._untimed
        out["gap_ms"] = round(t.gap_ns / 1e6, 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="*", default=["pageable", "starved"])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--old", action="store_true", help="with --child: the timer as it was (see above)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.old)))
        return 0
    results = []
    for scenario in args.scenarios:
        for old in (True, False):
            cmd = [sys.executable, __file__, "--child", scenario, *(["--old"] if old else [])]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            result = (
                json.loads(lines[-1])
                if lines
                else {"scenario": scenario, "timer": "old" if old else "new", "error": done.stderr[-800:]}
            )
            results.append(result)
            print(json.dumps(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
