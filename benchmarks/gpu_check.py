"""StallScope on a real CUDA GPU: the device-side signals and the advice, checked end to end.

The project's machines have no GPU; this script is run by hand when one is at hand. It trains
small real loops on CUDA with a planted bottleneck each, prints what StallScope measured (idle
source, NVML utilization, CUDA-event busy time, notes) and its top findings, applies the top
finding's suggestion (or the change its fix text names, for findings with nothing to set) and
compares the predicted speedup with the realized one (median wall time of interleaved runs, same
number of steps). It also checks that a watched loop adds no host-device synchronisation
(``torch.cuda.set_sync_debug_mode("error")`` around a sync-free loop) and what a tiny GPU step
pays for being watched.

    python benchmarks/gpu_check.py [--only NAME ...] [--repeats 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from common import SyntheticDataset, burn_cpu  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

DEV = "cuda"


def mlp(width: int, depth: int, inputs: int = 64, outputs: int = 10) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


class Step:
    """One optimizer step on CUDA, optionally under bf16 autocast, optionally reading the loss."""

    def __init__(self, model: nn.Module, *, precision: str = "32", read_loss: bool = False) -> None:
        torch.manual_seed(0)
        self.model = model.to(DEV)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()
        self.bf16 = "bf16" in precision
        self.read_loss = read_loss

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        if self.read_loss:
            loss.item()  # a host-device synchronisation every step


def _loop(
    scope: StallScope, data: Any, step: Step, *, epochs: int, non_blocking: bool = False, host_ms: float = 0.0
) -> None:
    for _ in range(epochs):
        for x, y in scope.iter(data):
            with scope.phase("h2d"):
                x = x.to(DEV, non_blocking=non_blocking)
                y = y.to(DEV, non_blocking=non_blocking)
            with scope.phase("compute"):
                step(x, y)
            if host_ms:
                with scope.phase("metrics"):
                    burn_cpu(host_ms / 1e3)  # host-side bookkeeping after each step


def _finish() -> None:
    torch.cuda.synchronize()


# -- scenarios: run(report_dir, console, **settings) -> Report --------------------------------


def starved(
    report_dir: str, console: Any, *, num_workers: int = 0, epochs: int = 2, batches: int = 80, **kw: Any
) -> Report:
    """CPU-heavy samples (64 x 0.08 ms a batch) built in the training process; a ~1 ms GPU step."""
    dataset = SyntheticDataset(batches * 64, cpu_ms=0.08)
    data = DataLoader(dataset, batch_size=64, num_workers=num_workers, **kw)
    step = Step(mlp(2048, 4))
    with StallScope(report_dir, console=console) as scope:
        _loop(scope, data, step, epochs=epochs)
    _finish()
    return scope.report


def pageable(
    report_dir: str,
    console: Any,
    *,
    pin_memory: bool = False,
    non_blocking: bool = False,
    epochs: int = 2,
    batches: int = 40,
    num_workers: int = 4,
    **kw: Any,
) -> Report:
    """Large in-memory batches (32 MB each) copied from pageable memory; a small GPU step."""
    n = batches * 128
    x = torch.randn(n, 64 * 1024)
    y = torch.randint(0, 10, (n,))
    sampler = BatchSampler(SequentialSampler(range(n)), 128, drop_last=False)
    data = DataLoader(
        TensorDataset(x, y),
        sampler=sampler,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        **kw,
    )
    step = Step(mlp(1024, 2, inputs=64 * 1024))
    with StallScope(report_dir, console=console) as scope:
        _loop(scope, data, step, epochs=epochs, non_blocking=non_blocking)
    _finish()
    return scope.report


def _gpu_batches(batches: int, batch: int, features: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(batch, features, generator=gen).to(DEV), torch.randint(0, 10, (batch,), generator=gen).to(DEV))
        for _ in range(batches)
    ]


def synced(
    report_dir: str,
    console: Any,
    *,
    read_loss: bool = True,
    precision: str = "32",
    epochs: int = 2,
    batches: int = 150,
    **_: Any,
) -> Report:
    """Each step reads the loss (``.item()``), then 2 ms of host bookkeeping: GPU and host never overlap."""
    data = _gpu_batches(batches, 512, 64)
    step = Step(mlp(4096, 2), read_loss=read_loss, precision=precision)
    with StallScope(report_dir, console=console) as scope:
        _loop(scope, data, step, epochs=epochs, host_ms=2.0)
    _finish()
    return scope.report


def fp32_bound(
    report_dir: str, console: Any, *, precision: str = "32", epochs: int = 2, batches: int = 20, **_: Any
) -> Report:
    """Large float32 matmuls on data already on the GPU: device-bound."""
    data = _gpu_batches(batches, 8192, 64)
    step = Step(mlp(8192, 4), precision=precision)
    with StallScope(report_dir, console=console) as scope:
        _loop(scope, data, step, epochs=epochs)
    _finish()
    return scope.report


def lightning_starved(
    report_dir: str, console: Any, *, num_workers: int = 0, epochs: int = 2, batches: int = 80, **_: Any
) -> Report:
    """A Lightning fit on the GPU whose loader builds CPU-heavy samples in the training process."""
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(2048, 4)
            self.loss_fn = nn.CrossEntropyLoss()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return self.loss_fn(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> Any:
            dataset = SyntheticDataset(batches * 64, cpu_ms=0.08)
            return DataLoader(dataset, batch_size=64, num_workers=num_workers, persistent_workers=num_workers > 0)

    scope = StallScope(report_dir, console=console)
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        max_epochs=epochs,
        callbacks=[scope],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module())
    _finish()
    assert scope.report is not None
    return scope.report


def cpu_after_cuda(report_dir: str, console: Any, **_: Any) -> Report:
    """A CPU training run in a process that used CUDA before (and freed what it held): it must be
    read as a CPU run (``host_phases``), not as a GPU that sat idle."""
    held = torch.ones(1024, device=DEV)
    del held
    torch.cuda.synchronize()
    return _cpu_run(report_dir, console)


def cpu_beside_cuda(report_dir: str, console: Any, **_: Any) -> Report:
    """A CPU training run in a process that holds a tensor on the GPU all along (an earlier model,
    as in a notebook): a CPU run too, not a GPU 100% busy (its CUDA events would time an idle
    stream)."""
    held = torch.ones(1024, device=DEV)
    torch.cuda.synchronize()
    try:
        return _cpu_run(report_dir, console)
    finally:
        del held


def _cpu_run(report_dir: str, console: Any) -> Report:
    dataset = SyntheticDataset(40 * 16, cpu_ms=0.3)
    data = DataLoader(dataset, batch_size=16)
    model = mlp(256, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with StallScope(report_dir, console=console) as scope:
        for _ in range(2):
            for x, y in scope.iter(data):
                with scope.phase("compute"):
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
    return scope.report


#: name -> (run, how the fix is applied when the suggestion has nothing to set)
def transformers_starved(
    report_dir: str,
    console: Any,
    *,
    dataloader_num_workers: int = 0,
    epochs: int = 2,
    batches: int = 60,
    **kw: Any,
) -> Report:
    """``transformers.Trainer`` on the GPU (the tiny GPT-2 of ``examples/transformers_common.py``)
    whose ``data_collator`` burns 10 ms of CPU a batch in the training process."""
    from transformers_common import CostlyCollator, train

    report = train(
        report_dir=report_dir,
        console=console,
        epochs=epochs,
        batches=batches,
        batch_size=64,
        collator=CostlyCollator(cpu_ms=10.0),
        dataloader_num_workers=dataloader_num_workers,
        use_cpu=False,
        **kw,
    )
    _finish()
    assert report is not None
    return report


SCENARIOS: dict[str, tuple[Callable[..., Report], dict[str, dict[str, Any]]]] = {
    "starved": (starved, {}),
    "pageable": (pageable, {}),
    "pageable_w2": (functools.partial(pageable, num_workers=2), {}),
    "pageable_w8": (functools.partial(pageable, num_workers=8), {}),
    "synced": (synced, {"host.sync": {"read_loss": False}}),
    "fp32_bound": (fp32_bound, {"compute.amp": {"precision": "bf16-mixed"}}),
    "lightning_starved": (lightning_starved, {}),
    "cpu_after_cuda": (cpu_after_cuda, {}),
    "cpu_beside_cuda": (cpu_beside_cuda, {}),
    "transformers_starved": (transformers_starved, {}),
}


def describe(report: Report) -> dict[str, Any]:
    s = report.summary
    out: dict[str, Any] = {
        "device": {"kind": report.run.device.kind, "name": report.run.device.name, "uuid": report.run.device.uuid},
        "steps": s.steps,
        "wall_s": round(s.wall_s, 3),
        "idle_source": s.idle_source,
        "gpu_idle_fraction": round(s.gpu_idle_fraction, 3),
        "phase_fractions": {k: round(v, 3) for k, v in s.phase_fractions.items() if v >= 0.005},
        "nvml": {
            k: v
            for k, v in (s.nvml or {}).items()
            if k in ("util_mean", "util_p50", "samples", "util_by_phase", "mem_used_max_bytes")
        },
        "notes": list(report.notes),
        "findings": [
            {
                "id": f.id,
                "est_speedup": f.est_speedup,
                "bound": f.est_speedup_bound,
                "confidence": f.confidence,
                "suggestion": dict(f.suggestion),
                "title": f.title,
                "evidence": dict(f.evidence),
            }
            for f in report.findings[:4]
        ],
    }
    return out


def check(name: str, repeats: int, console: Any) -> dict[str, Any]:
    run, fixes = SCENARIOS[name]
    with tempfile.TemporaryDirectory() as tmp:
        first = run(f"{tmp}/first", console)
        result: dict[str, Any] = {"scenario": name, "before": describe(first)}
        if not first.findings:
            return result
        top = first.findings[0]
        settings = dict(top.suggestion) or fixes.get(top.id)
        settings = {k: v for k, v in (settings or {}).items() if k != "rank"}
        if not settings:
            result["applied"] = None
            return result
        walls: dict[str, list[float]] = {"before": [], "after": []}
        result["applied"] = settings
        for i in range(repeats):
            for label, kwargs in (("before", {}), ("after", settings)):
                try:
                    report = run(f"{tmp}/{label}{i}", False, **kwargs)
                except TypeError as exc:  # the scenario has no knob for this suggestion
                    result["applied"] = f"not applicable: {exc}"
                    return result
                walls[label].append(report.summary.wall_s / max(1, report.summary.steps))
                if label == "after" and i == 0:
                    result["after"] = describe(report)
        realized = statistics.median(walls["before"]) / statistics.median(walls["after"])
        result["applied"] = settings
        result["predicted"] = top.est_speedup
        result["bound"] = top.est_speedup_bound
        result["realized"] = round(realized, 3)
        result["step_ms"] = {k: [round(w * 1e3, 2) for w in v] for k, v in walls.items()}
        result["error"] = round(abs(top.est_speedup - realized) / realized, 3)
        return result


# -- no synchronisation added; the cost of watching a tiny GPU step -----------------------------


def _tiny(steps: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Step]:
    return _gpu_batches(64, 256, 64), Step(mlp(256, 2))


def _cycle(data: list[Any], steps: int) -> Iterator[Any]:
    for i in range(steps):
        yield data[i % len(data)]


def _tiny_epochs(scope: StallScope, data: list[Any], step: Step, *, epochs: int, steps: int) -> None:
    """``epochs`` watched passes of ``steps`` tiny steps each, the step as the compute phase."""
    for _ in range(epochs):
        for x, y in scope.iter(_cycle(data, steps)):
            with scope.phase("compute"):
                step(x, y)


def no_sync_added(steps: int = 2000) -> dict[str, Any]:
    """A sync-free watched loop under sync debug mode "error": any sync StallScope added raises
    inside it, which it contains and reports as a note. First, that the mode is on: ``.item()``
    raises under it."""
    data, step = _tiny(steps)
    torch.cuda.set_sync_debug_mode("error")
    try:
        data[0][0].sum().item()
        control = "no error: the debug mode does not see syncs here"
    except RuntimeError as exc:
        control = f"raised as expected: {str(exc)[:80]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with tempfile.TemporaryDirectory() as tmp:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with StallScope(tmp, console=False) as scope:
                _tiny_epochs(scope, data, step, epochs=3, steps=steps // 3)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        report = scope.report
        assert report is not None
        return {
            "control": control,
            "notes": list(report.notes),
            "idle_source": report.summary.idle_source,
            "steps": report.summary.steps,
        }


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``fn()``, the GPU's queue drained before and after."""
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0


def overhead(steps: int = 2000, pairs: int = 7) -> dict[str, Any]:
    """Watched / bare time of a tiny GPU step (launch-bound, about 1 ms here), interleaved, median
    of the pairs, in wall and in process CPU time; also watched without the CUDA-event timer, and
    what one timed compute phase (two event records, a poll every 16) costs the host."""
    from stallscope.signals import collector, cuda_events

    data, step = _tiny(steps)

    def bare() -> None:
        for x, y in _cycle(data, steps):
            step(x, y)

    def watched() -> None:
        with tempfile.TemporaryDirectory() as tmp, StallScope(tmp, console=False) as scope:
            _tiny_epochs(scope, data, step, epochs=1, steps=steps)

    real_factory = collector.event_factory

    def no_timer() -> None:
        collector.event_factory = lambda: None  # type: ignore[assignment]
        try:
            watched()
        finally:
            collector.event_factory = real_factory

    variants = {"bare": bare, "watched": watched, "watched_no_events": no_timer}
    for fn in variants.values():
        _timed(fn)
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(pairs):
        for name, fn in variants.items():
            runs[name].append(_timed(fn))
    out: dict[str, Any] = {"step_us_bare": round(statistics.median(w for w, _ in runs["bare"]) / steps * 1e6, 1)}
    for name in ("watched", "watched_no_events"):
        wall = [w / b[0] for (w, _), b in zip(runs[name], runs["bare"], strict=True)]
        cpu = [c / b[1] for (_, c), b in zip(runs[name], runs["bare"], strict=True)]
        out[name] = {"wall": round(statistics.median(wall), 3), "cpu": round(statistics.median(cpu), 3)}
        out[name + "_wall_ratios"] = [round(r, 3) for r in wall]
    timer = cuda_events.CudaComputeTimer(cuda_events.event_factory() or (lambda: torch.cuda.Event(enable_timing=True)))
    n = 5000
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        timer.begin()
        timer.end()
    per_pair = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    loop = (time.perf_counter() - t0) / n
    out["timer_begin_end_us"] = round((per_pair - loop) * 1e6, 2)
    out["timer_gap_ms"] = round(timer.gap_ns / 1e6, 2)
    return out


def epoch_sources(epochs: int = 60, steps: int = 30) -> dict[str, Any]:
    """Many short epochs of the tiny GPU step, watched: each epoch's idle fraction and where it
    came from, with the CUDA-event windows as they are and with short windows not borrowing the
    run's busy time per phase (``MIN_WINDOW_PHASES`` out of reach), one run each."""
    from stallscope.signals import cuda_events

    data, step = _tiny(steps)

    def run() -> Report:
        with tempfile.TemporaryDirectory() as tmp, StallScope(tmp, console=False) as scope:
            _tiny_epochs(scope, data, step, epochs=epochs, steps=steps)
        torch.cuda.synchronize()
        report = scope.report
        assert report is not None
        return report

    out: dict[str, Any] = {"shape": f"{epochs} epochs of {steps} steps"}
    real = cuda_events.MIN_WINDOW_PHASES
    for label, least in (("own_windows_only", 10**9), ("borrowing", real)):
        cuda_events.MIN_WINDOW_PHASES = least
        try:
            report = run()
        finally:
            cuda_events.MIN_WINDOW_PHASES = real
        sources: dict[str, int] = {}
        idles = []
        for epoch in report.epochs:
            sources[epoch.summary.idle_source] = sources.get(epoch.summary.idle_source, 0) + 1
            idles.append(epoch.summary.gpu_idle_fraction)
        out[label] = {
            "run_idle": round(report.summary.gpu_idle_fraction, 3),
            "run_source": report.summary.idle_source,
            "nvml_util_mean": (report.summary.nvml or {}).get("util_mean"),
            "epoch_sources": sources,
            "epoch_idle_min_median_max": [
                round(min(idles), 3),
                round(statistics.median(idles), 3),
                round(max(idles), 3),
            ],
        }
    return out


def pin_costs(mb: int = 32, repeats: int = 20) -> dict[str, Any]:
    """What ``data.pin_memory``'s model assumes, timed alone on this host: copying a ``mb`` MB
    batch to the GPU from pageable memory, pinning it (``Tensor.pin_memory``, as the loader's
    pin thread does; torch's pinned host allocator caches the buffers), and copying the pinned
    batch; medians in ms."""
    x = torch.randn(mb * 256 * 1024)
    times: dict[str, list[float]] = {"pageable_copy": [], "pin": [], "pinned_copy": [], "host_copy": []}
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.to(DEV)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        pinned = x.pin_memory()
        t2 = time.perf_counter()
        pinned.to(DEV, non_blocking=True)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        x.clone()
        t4 = time.perf_counter()
        for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[key].append(dt * 1e3)
    out: dict[str, Any] = {"mb": mb}
    out.update({f"{k}_ms": round(statistics.median(v), 3) for k, v in times.items()})
    out["pinned_speedup"] = round(out["pageable_copy_ms"] / out["pinned_copy_ms"], 2)
    return out


def short_epochs(epochs: int = 100, steps: int = 30, pairs: int = 7) -> dict[str, Any]:
    """Loop (d) on the GPU: the tiny step as many short epochs (100 of 30 steps), bare and watched
    with the console on (rendered to memory), interleaved, median of the pairs in wall and in
    process CPU time: the whole per-epoch cost on CUDA (the CUDA-event and NVML windows, the
    device's memory, the epochs that wait)."""
    import io

    from rich.console import Console

    data, step = _tiny(steps)

    def bare() -> None:
        for _ in range(epochs):
            for x, y in _cycle(data, steps):
                step(x, y)

    def watched() -> None:
        console = Console(file=io.StringIO(), width=100)
        with tempfile.TemporaryDirectory() as tmp, StallScope(tmp, console=console) as scope:
            _tiny_epochs(scope, data, step, epochs=epochs, steps=steps)

    _timed(bare)
    _timed(watched)
    runs: dict[str, list[tuple[float, float]]] = {"bare": [], "watched": []}
    for _ in range(pairs):
        runs["bare"].append(_timed(bare))
        runs["watched"].append(_timed(watched))
    wall = [w / b for (w, _), (b, _) in zip(runs["watched"], runs["bare"], strict=True)]
    cpu = [c / b for (_, c), (_, b) in zip(runs["watched"], runs["bare"], strict=True)]
    return {
        "shape": f"{epochs} epochs of {steps} steps",
        "step_us_bare": round(statistics.median(w for w, _ in runs["bare"]) / (epochs * steps) * 1e6, 1),
        "wall": round(statistics.median(wall), 3),
        "cpu": round(statistics.median(cpu), 3),
        "wall_ratios": [round(r, 3) for r in wall],
        "cpu_ratios": [round(r, 3) for r in cpu],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="scenario names, or one of: sync, overhead, short_epochs, pin_costs, epoch_sources",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--panels", action="store_true", help="print the first run's panels")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check.py needs a CUDA GPU")
    warnings.simplefilter("ignore")
    names = args.only or [*SCENARIOS, "sync", "overhead", "short_epochs"]
    results: list[dict[str, Any]] = []
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for name in names:
        t0 = time.perf_counter()
        try:
            if name == "sync":
                result: dict[str, Any] = {"scenario": "sync", **no_sync_added()}
            elif name == "overhead":
                result = {"scenario": "overhead", **overhead()}
            elif name == "short_epochs":
                result = {"scenario": "short_epochs", **short_epochs()}
            elif name == "pin_costs":
                result = {"scenario": "pin_costs", **pin_costs()}
            elif name == "epoch_sources":
                result = {"scenario": "epoch_sources", **epoch_sources()}
            else:
                result = check(name, args.repeats, args.panels)
        except Exception as exc:  # keep going: one broken scenario must not hide the others
            import traceback

            traceback.print_exc()
            result = {"scenario": name, "error": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(result)
        print(json.dumps(result, indent=1, default=str), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
