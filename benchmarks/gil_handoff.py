"""``data.workers`` on loaders that hold the GIL and loaders that let go of it: predicted and realized.

    .venv/bin/python benchmarks/gil_handoff.py [--repeats 3]

``whatif.py``'s starved-loader scenarios burn CPU in ``hashlib`` calls. This checks the loop
model's wait for a busy worker's GIL in the hand-over (``analysis/loop_model.py``, ``g u``) on two
kinds of loading the examples do not have, each in a plain loop with ``num_workers=0`` (~80% of
the time waiting for data), then with the suggested workers:

* ``python``: every sample runs a bytecode loop (about 0.6 ms): the worker holds its GIL while
  it makes a batch;
* ``torch``: every sample runs a few small matrix products: the GIL is let go inside each op.

Per kind: the ``data.workers`` finding's predicted speedup and hand-over wait (from each
``num_workers=0`` run) and the realized speedup (median wall time of the runs without workers
over the median with the suggested ones), interleaved ``--repeats`` times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
from common import CLASSES, FEATURES, Trainer, emulate_accelerator  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

KINDS = ("python", "torch")


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples whose ``__getitem__`` works in Python bytecode or in torch ops."""

    def __init__(self, n: int, kind: str) -> None:
        self.n = n
        self.kind = kind
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=gen)
        self.y = torch.randint(0, CLASSES, (n,), generator=gen)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "python":
            total = 0
            for k in range(12_000):  # the GIL stays with this thread
                total += k * k
        else:
            a = torch.randn(160, 160)
            for _ in range(6):  # each op lets go of the GIL while it runs
                a = a @ a
                a = a / a.norm()
        return self.x[i], self.y[i]


def run(kind: str, workers: int, report_dir: str) -> Report:
    """Two epochs of 100 batches of 16 in a plain loop, watched."""
    emulate_accelerator()
    data = DataLoader(Samples(1600, kind), batch_size=16, num_workers=workers)
    trainer = Trainer()
    with StallScope(report_dir, console=False) as scope:
        for _ in range(2):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    trainer.step(batch, repeat=4)
    report = scope.report
    assert report is not None
    return report


def measure(kind: str, repeats: int, tmp: str) -> dict[str, Any]:
    """Interleaved runs without workers and with the suggested ones (2 until one is suggested)."""
    before: list[float] = []
    after: list[float] = []
    predicted: list[float] = []
    waits: list[float] = []
    suggested = 2
    for _ in range(repeats):
        report = run(kind, 0, f"{tmp}/{kind}-0")
        before.append(report.summary.wall_s)
        found = [f for f in report.findings if f.id == "data.workers"]
        if found:
            suggested = int(found[0].suggestion["num_workers"])
            predicted.append(found[0].est_speedup)
            waits.append(float(found[0].evidence.get("gil_wait_per_batch_ms") or 0.0))
        after.append(run(kind, suggested, f"{tmp}/{kind}-{suggested}").summary.wall_s)
    realized = statistics.median(before) / statistics.median(after)
    return {
        "kind": kind,
        "workers": suggested,
        "predicted": statistics.median(predicted) if predicted else None,
        "gil_wait_ms": statistics.median(waits) if waits else None,
        "realized": realized,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved pairs of runs per kind (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stallscope-gil-") as tmp:
        rows = [measure(kind, args.repeats, tmp) for kind in KINDS]
    print("| loading | suggested | predicted | hand-over wait (ms a batch) | realized | error |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if row["predicted"] is None:
            print(f"| {row['kind']} | - | no data.workers finding | - | x{row['realized']:.2f} | - |")
            continue
        error = abs(row["predicted"] - row["realized"]) / row["realized"]
        print(
            f"| {row['kind']} | num_workers={row['workers']} | x{row['predicted']:.2f} | {row['gil_wait_ms']:.1f}"
            f" | x{row['realized']:.2f} | {error:.0%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
