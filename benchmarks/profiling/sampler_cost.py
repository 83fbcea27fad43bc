"""What the background samplers cost: CPU of their threads at the default interval, memory, hot path.

    python benchmarks/profiling/sampler_cost.py [--seconds 10] [--interval 0.2]

1. CPU: each sampler runs on its own thread for ``--seconds`` while the main thread sleeps; the
   thread's CPU time comes from ``/proc/self/task/<tid>/schedstat`` (nanoseconds; falls back to
   the process's CPU time). The NVML sampler reads the real driver when one is installed, else
   the scripted stand-in from ``tests/nvml_stub`` (built with gcc), whose calls are cheaper than
   a real driver's: treat that figure as a floor.
2. Memory: 20,000 samples driven synchronously; the sampler's memory must not grow with them.
3. Hot path: a phase change (``enter`` + ``leave``) with this tree's timeline vs the one before
   the CUDA-event hook was added (``git show 0220700:stallscope/timeline/recorder.py``).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead import thread_cpu_ns  # noqa: E402  (the sibling benchmark)

from stallscope.signals.host_sampler import MIN_INTERVAL_S as HOST_MIN_INTERVAL_S  # noqa: E402
from stallscope.signals.host_sampler import HostSampler, PsutilProbe  # noqa: E402
from stallscope.signals.nvml import NvmlSampler  # noqa: E402
from stallscope.signals.sampler import PeriodicSampler  # noqa: E402
from stallscope.timeline.recorder import Timeline  # noqa: E402


def cpu_cost(sampler: PeriodicSampler[Any, Any], seconds: float) -> tuple[float, int]:
    """Share of one core the sampler's thread used, and the samples it took."""
    process_before = time.process_time_ns()
    sampler.start()
    thread = sampler._thread
    assert thread is not None
    while sampler.ticks < 1 and sampler.enabled:  # set-up (imports, nvmlInit) is a one-off
        time.sleep(0.01)
    before = thread_cpu_ns(thread)
    ticks_before = sampler.ticks
    start = time.perf_counter_ns()
    time.sleep(seconds)
    after = thread_cpu_ns(thread)
    wall = time.perf_counter_ns() - start
    ticks = sampler.ticks - ticks_before
    sampler.stop()
    if before is None or after is None:
        return (time.process_time_ns() - process_before) / wall, ticks
    return (after - before) / wall, ticks


def nvml_target() -> tuple[str, Any]:
    """('real', None) with an NVIDIA driver installed, else ('stub', the stub library)."""
    if ctypes.util.find_library("nvidia-ml"):
        return "real driver", None
    import nvml_stub

    if nvml_stub.gcc() is None:
        return "unavailable (no driver, no gcc)", None
    lib = nvml_stub.build(Path(tempfile.mkdtemp(prefix="stallscope-nvml-")))
    script = nvml_stub.write_script(lib.parent / "script.txt", sample_period_us=166_000, busy_util=60)
    os.environ["STUBNVML_SCRIPT"] = str(script)
    return "scripted stand-in", nvml_stub.load_in_process(lib)


def memory_growth(make: Any, samples: int = 20_000) -> tuple[int, int]:
    """Bytes the sampler held after ``samples // 2`` and after ``samples`` synchronous samples."""
    now = [0]
    sampler = make(lambda: now[0])
    tracemalloc.start()
    marks = []
    for i in range(samples):
        now[0] += 200_000_000
        sampler.sample_once()
        if i + 1 in (samples // 2, samples):
            marks.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    return marks[0], marks[1]


def phase_change_ns(timeline_cls: Any, n: int = 300_000) -> float:
    tl = timeline_cls()
    tl.start()
    pid = tl.phase_id("compute")
    enter, leave = tl.enter, tl.leave
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            enter(pid)
            leave()
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def old_timeline() -> Any:
    try:
        source = subprocess.run(
            ["git", "show", "0220700:stallscope/timeline/recorder.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "old_recorder.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_recorder", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.2, help="sample_interval_s (default: the default)")
    args = parser.parse_args()

    print(f"CPU of the sampler threads at sample_interval_s={args.interval} over {args.seconds:.0f} s")
    host = HostSampler(interval_s=max(args.interval, HOST_MIN_INTERVAL_S))
    share, ticks = cpu_cost(host, args.seconds)
    print(f"  host (psutil, every {host.interval_s:g} s): {share:.3%} of one core, {ticks} samples")

    kind, lib = nvml_target()
    if not kind.startswith("unavailable"):
        tl = Timeline()
        tl.start()
        nvml = NvmlSampler(target=0, interval_s=args.interval, probe=tl.probe, phase_names=tl.phase_names)
        share, ticks = cpu_cost(nvml, args.seconds)
        print(f"  nvml ({kind}): {share:.3%} of one core, {ticks} samples; notes: {list(nvml.notes()) or 'none'}")
    else:
        print(f"  nvml: {kind}")

    print("Memory over 20,000 samples (bytes held at half way -> at the end)")

    def make_host(clock: Any) -> HostSampler:
        s = HostSampler(interval_s=args.interval, probe=PsutilProbe(), cores=1, clock=clock)
        s.prime()
        return s

    half, end = memory_growth(make_host)
    print(f"  host: {half} -> {end}")
    if lib is not None:
        tl2 = Timeline()
        tl2.start()

        def make_nvml(clock: Any) -> NvmlSampler:
            wall = time.time_ns()

            def wall_clock() -> int:
                return wall + clock()

            def stub_clock() -> int:
                lib.stubnvml_set_time_us(wall_clock() // 1000)
                return int(clock())

            s = NvmlSampler(
                target=0,
                interval_s=args.interval,
                probe=tl2.probe,
                phase_names=tl2.phase_names,
                clock=stub_clock,
                wall_clock=wall_clock,
            )
            lib.stubnvml_set_time_us(wall // 1000)
            s._setup()
            return s

        half, end = memory_growth(make_nvml)
        print(f"  nvml: {half} -> {end}")

    old = old_timeline()
    new_ns = phase_change_ns(Timeline)
    if old is not None:
        old_ns = phase_change_ns(old)
        print(f"Hot path: enter+leave {new_ns:.0f} ns now, {old_ns:.0f} ns before the CUDA-event hook")
    else:
        print(f"Hot path: enter+leave {new_ns:.0f} ns")


if __name__ == "__main__":
    main()
