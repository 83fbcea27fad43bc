"""``benchmarks/gpu_check.py`` on a machine without a GPU: one line saying what it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_without_a_gpu_it_says_so_and_fails() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: run the script itself")
    done = subprocess.run([sys.executable, str(PATH), "--only", "sync"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["gpu_check.py needs a CUDA GPU"]
