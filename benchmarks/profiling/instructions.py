"""What StallScope adds to a step, in CPU instructions: counts that the host's noise cannot move.

On a shared VM, whole-run ratios (``overhead.py``) move by several percent from run to run, more
than StallScope costs. This script counts instead. It runs loops (a) and (c) of ``overhead.py``
under ``valgrind --tool=callgrind``, bare and watched, each in its own process (in parallel), and
reads the instructions the training thread executed over a window of steps after a warm-up. The
window is cut by a ``os.getppid()`` call at each end, where callgrind dumps its counters.
``--ablate`` adds loop (c) with StallScope's Lightning probes left out, to tell what costs.
Loop ``n`` is no loop of ``overhead.py``: the recording alone, ``scope.iter`` and
``scope.phase("compute")`` around ``pass``, against the same loop over the bare iterator. With no
step of torch's around it, its count moves by a few instructions between runs, not thousands.

The host sampler is set to sample nothing during these runs. Under valgrind the process runs some
50 times slower while the sampler keeps its wall-clock period, so it would sample 50 times too
often. Its cost is measured as CPU share in ``step_cost.py``, and its thread is not the training
thread anyway. For the same reason the data wait's CPU clock, read once per 20 ms of wall time,
is read on about every step here: the watched counts are a little high.

``--cache-sim`` also counts the training thread's first-level cache misses (callgrind's simulated
32 kB instruction and data caches, 8-way, 64-byte lines): each is a trip to the second level or
further, a few to a few tens of nanoseconds that the instruction count does not show.

Each process first runs a short watched loop (or fit), so that the bare one too has met
StallScope's classes before the window: CPython numbers classes for its cache of type lookups
in the order they are first looked up, and the numbers help decide which of the loop's own
lookups collide in that cache. Without it the bare and watched processes drew different
collisions, thousands of instructions a step on (c) that had nothing to do with StallScope. It
does not make them repeat: the names' addresses take part too, and two runs of (c) on the same
code still gave 4,225 and 16,069 added instructions a step.

Instructions are not time: cache misses between two steps make StallScope's few instructions
dearer than the step's own. They are a floor that repeats, good for comparing two versions of
the code, if run more than once: between runs the bare counts moved by up to 0.5% of a step
(Lightning's; the plain loop's by 0.03%), and the watched ones by up to 10,000 instructions a
step on (c). Address-space randomisation is turned off (``setarch -R``, where it is installed),
which takes away one source of that.

    .venv/bin/python benchmarks/profiling/instructions.py [--loops a,c,n] [--warm 200] [--steps 400] [--ablate]
                                                [--cache-sim]
    (about 9 minutes on 2 cores for a,c, 2 minutes for n; --ablate adds a third process to loop
    (c); needs valgrind)
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("bare", "watched")
#: with ``--ablate``, for loop (c): StallScope with neither of its Lightning probes installed (it
#: records no steps: what being a callback costs). (One probe without the other is no measure of
#: its share: the compute hook then takes its slow path, in Python, at every step.)
ABLATIONS = ("noprobes",)


def child(loop: str, variant: str, warm: int, steps: int) -> None:
    """Run loop ``loop`` in ``variant``, calling ``os.getppid()`` before step ``warm`` and before
    step ``warm + steps``: the window callgrind reports."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from overhead import lightning_parts, null_console, tiny_loop

    from stallscope import StallScope
    from stallscope.hooks import lightning as hooks

    torch.set_num_threads(1)
    total = warm + steps + 50
    marks = (warm, warm + steps)
    report_dir = tempfile.mkdtemp(prefix="stallscope-instructions-")

    def scope() -> StallScope:
        return StallScope(report_dir, console=null_console(), sample_interval_s=3600)

    # every variant first runs one short watched fit (loop (c)) or loop, so the bare process too
    # has met StallScope's classes (the module docstring says why)
    if loop == "c":
        trainer, model, data = lightning_parts(20, [scope()])
        trainer.fit(model, data)
    else:
        with scope() as watched:
            for x, _y in watched.iter(tiny_loop(steps=20).batches):
                with watched.phase("compute"):
                    x.sum()
    if loop == "n":
        if variant == "bare":
            for i, _ in enumerate(iter(range(total))):
                if i in marks:
                    os.getppid()
                pass
        else:
            with scope() as watched:
                compute = watched.phase("compute")
                for i, _ in enumerate(watched.iter(range(total))):
                    if i in marks:
                        os.getppid()
                    with compute:
                        pass
        return
    if loop == "a":
        plain = tiny_loop(steps=total)
        if variant == "bare":
            for i, (x, y) in enumerate(plain.batches):
                if i in marks:
                    os.getppid()
                loss = plain.train_step(x, y)
                if i % 50 == 0:
                    loss.item()
        else:
            with scope() as watched:
                for i, (x, y) in enumerate(watched.iter(plain.batches)):
                    if i in marks:
                        os.getppid()
                    with watched.phase("compute"):
                        loss = plain.train_step(x, y)
                    if i % 50 == 0:
                        with watched.phase("logging"):
                            loss.item()
        return
    if variant == "noprobes":
        hooks.attach_fetch_probe = hooks.attach_step_probe = _no_probe

    def mark(batch_idx: int) -> None:
        if batch_idx in marks:
            os.getppid()

    trainer, model, data = lightning_parts(total, [] if variant == "bare" else [scope()], on_step=mark)
    trainer.fit(model, data)


def _no_probe(*args: object, **kwargs: object) -> Callable[[], None]:
    return lambda: None


def callgrind_command(
    valgrind: str, out_dir: Path, script: str, script_args: list[str], *, cache_sim: bool
) -> list[str]:
    """``python script script_args`` under callgrind: each thread counted apart, a dump at each
    ``os.getppid()`` mark, output to ``out_dir/out.<pid>``. Addresses can decide the order sets of
    objects are walked in, and so the count: ``setarch -R`` keeps them the same from run to run,
    where util-linux provides it."""
    setarch = shutil.which("setarch")
    prefix = [setarch, platform.machine(), "-R"] if setarch else []
    return [
        *prefix,
        valgrind,
        "--tool=callgrind",
        "--separate-threads=yes",
        "--dump-before=getppid",
        *(["--cache-sim=yes"] if cache_sim else []),
        f"--callgrind-out-file={out_dir}/out.%p",
        sys.executable,
        script,
        *script_args,
    ]


def find_valgrind(script: str) -> str | None:
    """valgrind's path; None, with a line on stderr naming ``script``, when it is not installed."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print(f"{script}: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
    return valgrind


def window_counts(out_dir: Path, pid: int) -> dict[str, int]:
    """The training thread's counts between the two marks, by callgrind event name (``Ir``: the
    instructions; with ``--cache-sim``, ``I1mr``, ``D1mr``, ``D1mw``: first-level cache misses):
    callgrind's second dump."""
    dump = out_dir / f"out.{pid}.2-01"  # dump 2 (at the second mark) of thread 1 (the main one)
    events: list[str] = []
    for line in dump.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            values = [int(value) for value in line.split()[1:]]
            values += [0] * (len(events) - len(values))  # callgrind leaves out trailing zeros
            return dict(zip(events, values, strict=True))
    raise RuntimeError(f"no summary line in {dump}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--loops", default="a,c", help="comma-separated: a and c (overhead.py's loops), n (the recording alone)"
    )
    parser.add_argument("--warm", type=int, default=200, help="steps before the window")
    parser.add_argument("--steps", type=int, default=400, help="steps in the window")
    parser.add_argument("--ablate", action="store_true", help="loop (c) also without StallScope's probes")
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="also count first-level cache misses (callgrind's simulated 32 kB caches; twice as slow)",
    )
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm < 1 or args.steps < 1:
        parser.error("--warm and --steps must be >= 1")
    loops = [loop.strip() for loop in args.loops.split(",") if loop.strip()]
    if not loops or any(loop not in ("a", "c", "n") for loop in loops):
        parser.error(f"--loops takes a comma-separated list of a, c and n, got {args.loops!r}")
    if args.child:
        child(args.child[0], args.child[1], args.warm, args.steps)
        return 0
    valgrind = find_valgrind("instructions.py")
    if valgrind is None:
        return 2
    out_dir = Path(tempfile.mkdtemp(prefix="stallscope-callgrind-"))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for loop in loops:
        variants = VARIANTS + (ABLATIONS if args.ablate and loop == "c" else ())
        print(f"loop ({loop}): {len(variants)} processes under callgrind ...", file=sys.stderr, flush=True)
        procs = {}
        for variant in variants:
            command = callgrind_command(
                valgrind,
                out_dir,
                __file__,
                ["--child", loop, variant, f"--warm={args.warm}", f"--steps={args.steps}"],
                cache_sim=args.cache_sim,
            )
            log = (out_dir / f"{loop}-{variant}.log").open("w")
            procs[variant] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log)
        failed = []
        for variant, (proc, log) in procs.items():
            rc = proc.wait()
            log.close()
            if rc != 0:
                failed.append(f"loop ({loop}) {variant}: exit {rc}; see {out_dir}/{loop}-{variant}.log")
            else:
                counts[loop, variant] = window_counts(out_dir, proc.pid)
        if failed:
            print("\n".join(failed), file=sys.stderr)
            return 1
    print(f"instructions of the training thread per step, over {args.steps} steps after {args.warm}")
    print("| loop | bare | watched | StallScope adds | share |")
    print("|---|---|---|---|---|")
    for loop in loops:
        bare = counts[loop, "bare"]["Ir"] / args.steps
        watched = counts[loop, "watched"]["Ir"] / args.steps
        share = "-" if loop == "n" else f"{(watched - bare) / bare:.2%}"  # n's bare step does nothing
        print(f"| ({loop}) | {bare:,.0f} | {watched:,.0f} | {watched - bare:,.0f} | {share} |")
    if args.ablate and "c" in loops:
        bare = counts["c", "bare"]["Ir"] / args.steps
        print("| loop (c), StallScope ... | instructions a step over bare |")
        print("|---|---|")
        print(f"| without its probes | {counts['c', 'noprobes']['Ir'] / args.steps - bare:,.0f} |")
        print(f"| with its probes (watched) | {counts['c', 'watched']['Ir'] / args.steps - bare:,.0f} |")
    if args.cache_sim:
        print("first-level cache misses of the training thread per step (instruction; data read + written)")
        print("| loop | L1i bare | L1i watched | StallScope adds | L1d bare | L1d watched | StallScope adds |")
        print("|---|---|---|---|---|---|---|")
        for loop in loops:
            bare_c, watched_c = counts[loop, "bare"], counts[loop, "watched"]
            i_bare, i_watched = bare_c["I1mr"] / args.steps, watched_c["I1mr"] / args.steps
            d_bare = (bare_c["D1mr"] + bare_c["D1mw"]) / args.steps
            d_watched = (watched_c["D1mr"] + watched_c["D1mw"]) / args.steps
            print(
                f"| ({loop}) | {i_bare:,.0f} | {i_watched:,.0f} | {i_watched - i_bare:,.0f} "
                f"| {d_bare:,.0f} | {d_watched:,.0f} | {d_watched - d_bare:,.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
