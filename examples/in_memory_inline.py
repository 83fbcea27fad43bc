"""Planted bottleneck: an in-memory ``TensorDataset`` with num_workers=0:
every batch is 64 ``dataset[i]`` calls and a collate.
Expected top finding: ``data.batch_indexing`` (one index per batch).

    python examples/in_memory_inline.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cli  # noqa: E402
from in_memory_common import SMALL, apply_suggestion  # noqa: E402
from in_memory_common import run as run_in_memory  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "in_memory_inline"
EXPECTED = "data.batch_indexing"
__all__ = ["EXPECTED", "NAME", "SMALL", "apply_suggestion", "run"]


def run(
    *, report_dir: str = f"runs/{NAME}", console: Any = True, num_workers: int = 0, **settings: Any
) -> Report | None:
    return run_in_memory(report_dir=report_dir, console=console, num_workers=num_workers, **settings)


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
