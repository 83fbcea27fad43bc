"""Fixtures of the fault matrix: the stand-in NVML driver, built once."""

from __future__ import annotations

from pathlib import Path

import nvml_stub
import pytest


@pytest.fixture(scope="session")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the stand-in ``libnvidia-ml.so.1`` (skips without a C compiler)."""
    if nvml_stub.gcc() is None:
        pytest.skip("gcc is not available to build the stand-in libnvidia-ml.so.1")
    return nvml_stub.build(tmp_path_factory.mktemp("nvml")).parent
