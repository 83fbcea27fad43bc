"""What StallScope costs per step of a plain loop, in microseconds, measured around real steps.

``overhead.py`` times whole runs, bare against watched. On a shared 2-core VM a whole run can
take 40% longer when a neighbour is busy, so its ratios move by several percent between runs and
between processes; a 1% difference needs hundreds of pairs there. This script resolves the
per-step cost instead: one long loop (a) of ``overhead.py`` (the same model, batches and loss
read every 50 steps), cut into chunks of ``--chunk`` steps. Each round runs one chunk of every
variant, in random order, and the cost of a variant is the median over rounds of (its chunk -
the bare chunk) / chunk. A noisy moment falls on one chunk, not on a whole variant.

Variants (every watched chunk reads its items from one long ``scope.iter``, so no epoch ends
inside the measurement; the fold of the event log happens inside the chunks, as in a real run):
  bare      the loop alone
  clock2    a bare generator that reads the clock around each ``next()``: the floor of timing
            the data wait from a Python generator (StallScope's Python twin does; its C stream
            runs no Python frame per item, so it can cost less)
  iter      ``for batch in scope.iter(loader)``
  phase     ``scope.iter`` plus ``with scope.phase("compute")`` around the step and
            ``scope.phase("logging")`` around the loss read: loop (a) watched

Then, separately, the same recording around a no-op body with warm caches (the CPU work alone,
steady even on a noisy host), what a run pays once: start-up, epoch end and finish of a scope over a short
loop (median of ``--runs``), and the CPU time the host sampler's thread takes per second of a
watched run. ``--steps`` sets the run length used to turn those into a share; the estimate
printed for loop (a) is 1 + (per-step cost + fixed cost / steps) / bare step + sampler share.

    .venv/bin/python benchmarks/profiling/step_cost.py [--rounds 80] [--chunk 1000] [--runs 15] [--steps 20000]
        [--warm-steps 200000] [--sampler-seconds 10]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from stallscope import StallScope  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import hot_path, null_console, tiny_loop  # noqa: E402

Batch = tuple[torch.Tensor, torch.Tensor]


def _clock2(it: Iterator[Batch], sink: list[int]) -> Iterator[Batch]:
    clock = time.perf_counter_ns
    for item in it:
        sink.append(clock())
        yield item
        sink.append(clock())
        if len(sink) > 4096:
            sink.clear()


def per_step(rounds: int, chunk: int) -> dict[str, list[float]]:
    """Microseconds per step: the bare step (``bare``) and each variant's cost over it, one
    value per round."""
    loop = tiny_loop()
    step = loop.train_step
    sink: list[int] = []
    tmp = tempfile.mkdtemp(prefix="stallscope-step-cost-")
    with StallScope(tmp, console=False) as scope:
        # one stream for both watched variants: a second scope.iter would end the first's pass
        stream = iter(scope.iter(itertools.cycle(loop.batches)))
        plain = itertools.cycle(loop.batches)
        timed = _clock2(itertools.cycle(loop.batches), sink)
        compute = scope.phase("compute")
        logging = scope.phase("logging")

        def run(items: Iterator[Batch], phases: bool) -> Callable[[], None]:
            def chunk_of_steps() -> None:
                if phases:  # loop (a) watched
                    for i, (x, y) in enumerate(itertools.islice(items, chunk)):
                        with compute:
                            loss = step(x, y)
                        if i % 50 == 0:
                            with logging:
                                loss.item()
                else:
                    for i, (x, y) in enumerate(itertools.islice(items, chunk)):
                        loss = step(x, y)
                        if i % 50 == 0:
                            loss.item()

            return chunk_of_steps

        variants = {
            "bare": run(plain, False),
            "clock2": run(timed, False),
            "iter": run(stream, False),
            "phase": run(stream, True),
        }
        for fn in variants.values():
            fn()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        rng = random.Random(0)
        gc.collect()
        for _ in range(rounds):
            rng.shuffle(names)
            for name in names:
                t0 = time.perf_counter_ns()
                variants[name]()
                times[name].append((time.perf_counter_ns() - t0) / chunk / 1e3)
    base = times["bare"]
    out = {"bare": base}
    for name, values in times.items():
        if name != "bare":
            out[name] = [v - b for v, b in zip(values, base, strict=True)]
    return out


def fixed_ms(runs: int) -> tuple[float, float]:
    """(median ms, lowest ms) a scope costs beyond its steps: start-up, one epoch end, finish,
    over a 20-step loop of no-op steps (measured against the same loop bare)."""
    items = list(range(20))
    tmp = tempfile.mkdtemp(prefix="stallscope-fixed-")
    costs = []
    for _ in range(runs + 1):
        gc.collect()
        t0 = time.perf_counter_ns()
        for _ in items:
            pass
        bare = time.perf_counter_ns() - t0
        gc.collect()
        t0 = time.perf_counter_ns()
        with StallScope(tmp, console=null_console()) as scope:
            for _ in scope.iter(items):
                with scope.phase("compute"):
                    pass
        costs.append((time.perf_counter_ns() - t0 - bare) / 1e6)
    costs = costs[1:]  # the first pays imports and first-use costs
    return statistics.median(costs), min(costs)


def warm_ns(steps: int, runs: int) -> tuple[float, float]:
    """(median ns, bare ns) a step of ``scope.iter`` plus ``scope.phase("compute")`` costs around
    a no-op body, caches warm: the recording's own work (four events a step, and their fold),
    without the cache misses a real step adds. Far steadier on a noisy host than the real loop."""
    items = range(steps)
    tmp = tempfile.mkdtemp(prefix="stallscope-warm-")
    costs = []
    for _ in range(runs):
        with StallScope(tmp, console=False) as scope:
            compute = scope.phase("compute")
            t0 = time.perf_counter_ns()
            for _ in scope.iter(items):
                with compute:
                    pass
            costs.append((time.perf_counter_ns() - t0) / steps)
    t0 = time.perf_counter_ns()
    for _ in items:
        pass
    return statistics.median(costs), (time.perf_counter_ns() - t0) / steps


def sampler_share(seconds: float) -> float:
    """CPU time the host sampler's thread takes per wall second of a watched run (a core's
    share), from that thread's own CPU clock around its set-up and each of its samples. (On a
    GPU machine the NVML sampler's thread adds its own; there is none here.) The set-up is also
    in ``fixed_ms``, where the short loop ends before it does: counted twice, on the safe side."""
    from stallscope.signals.host_sampler import HostSampler

    used = [0]

    def timed(fn: Callable[..., None]) -> Callable[..., None]:
        def wrapper(*args: object, **kwargs: object) -> None:
            t0 = time.thread_time_ns()  # these run on the sampler's own thread
            try:
                fn(*args, **kwargs)
            finally:
                used[0] += time.thread_time_ns() - t0

        return wrapper

    original = HostSampler._setup, HostSampler.sample_once
    HostSampler._setup = timed(HostSampler._setup)  # type: ignore[method-assign]
    HostSampler.sample_once = timed(HostSampler.sample_once)  # type: ignore[method-assign]
    try:
        loop = tiny_loop(steps=1)
        step = loop.train_step
        x, y = loop.batches[0]
        tmp = tempfile.mkdtemp(prefix="stallscope-sampler-")
        t0 = time.perf_counter()
        with StallScope(tmp, console=False) as scope:
            for _ in scope.iter(itertools.repeat(None)):
                step(x, y)
                if time.perf_counter() - t0 >= seconds:
                    break
        wall = time.perf_counter() - t0
    finally:
        HostSampler._setup, HostSampler.sample_once = original  # type: ignore[method-assign]
    return used[0] / 1e9 / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=80, help="chunks of each variant")
    parser.add_argument("--chunk", type=int, default=1000, help="steps per chunk")
    parser.add_argument("--runs", type=int, default=15, help="short scopes for the fixed cost")
    parser.add_argument("--steps", type=int, default=20_000, help="run length for the estimate (overhead.py's (a))")
    parser.add_argument("--warm-steps", type=int, default=200_000, help="no-op steps for the warm-cache cost")
    parser.add_argument("--sampler-seconds", type=float, default=10.0, help="length of the sampler CPU run")
    args = parser.parse_args()
    for name, least in (("rounds", 2), ("chunk", 1), ("runs", 1), ("steps", 1), ("warm_steps", 1)):
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}")
    if args.sampler_seconds <= 0:
        parser.error("--sampler-seconds must be > 0")
    torch.set_num_threads(1)
    print(f"per step: {args.rounds} rounds of {args.chunk}-step chunks ...", file=sys.stderr, flush=True)
    costs = per_step(args.rounds, args.chunk)
    bare_us = statistics.median(costs["bare"])
    print(f"hot path: {hot_path()}")
    print(f"bare step: {bare_us:.1f} us (median of chunks)")
    print("| variant | us per step over bare (median) | middle half of rounds |")
    print("|---|---|---|")
    for name in ("clock2", "iter", "phase"):
        q = statistics.quantiles(costs[name], n=4)
        print(f"| {name} | {statistics.median(costs[name]):.2f} | {q[0]:.2f} to {q[2]:.2f} |")
    print(f"fixed cost per run: {args.runs} short scopes ...", file=sys.stderr, flush=True)
    median_ms, low_ms = fixed_ms(args.runs)
    print(f"fixed cost per run (start-up, epoch end, finish): {median_ms:.1f} ms (lowest {low_ms:.1f})")
    warm, bare_ns = warm_ns(args.warm_steps, 5)
    print(f"no-op step, caches warm ({args.warm_steps:,} steps, median of 5): {warm:.0f} ns (bare {bare_ns:.0f} ns)")
    print(f"sampler threads: {args.sampler_seconds:.0f} s watched run ...", file=sys.stderr, flush=True)
    share = sampler_share(args.sampler_seconds)
    print(f"host sampler thread: {share * 100:.3f}% of a core")
    per = statistics.median(costs["phase"])
    run_us = args.steps * bare_us
    estimate = 1 + per / bare_us + median_ms * 1e3 / run_us + share
    print(
        f"estimate for loop (a), {args.steps:,} steps: 1 + {per:.2f}/{bare_us:.1f} (per step) "
        f"+ {median_ms:.1f} ms / {run_us / 1e6:.2f} s (fixed) + {share:.4f} (threads) = {estimate:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
