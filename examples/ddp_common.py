"""Shared pieces of the distributed scenarios: launching a script's ranks as real processes.

A distributed scenario's ``run(**settings)`` launches its own ranks with ``torchrun`` (or, for
Lightning, one process whose Trainer starts the others) and returns the job's report, which rank
0 wrote; so tests and ``benchmarks/whatif.py`` call it like any other scenario. The ranks run
the script again with ``--worker SETTINGS_JSON``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stallscope import Report, load_report

WORKER_FLAG = "--worker"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_settings(argv: Sequence[str]) -> dict[str, Any] | None:
    """The settings this process runs a rank with, when it was started as a worker."""
    if WORKER_FLAG in argv:
        return dict(json.loads(argv[list(argv).index(WORKER_FLAG) + 1]))
    return None


def rank_env() -> dict[str, str]:
    """The ranks' environment: one OpenMP thread each (two ranks share a small CPU box)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def torchrun(
    script: str | Path,
    settings: Mapping[str, Any],
    *,
    nproc: int = 2,
    timeout_s: float = 300,
    node: tuple[int, int, int] | None = None,
) -> subprocess.CompletedProcess[str] | None:
    """Run ``script --worker SETTINGS`` under ``torchrun`` on this machine: ``nproc`` ranks, or,
    with ``node=(nnodes, node_rank, port)``, one "node" of a job whose rank 0 listens on
    ``127.0.0.1:port``. The ranks' output goes to this process's output (``capture`` off)."""
    if node is None:
        where = ["--standalone", "--nnodes", "1"]
    else:
        nnodes, node_rank, port = node
        where = [
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(node_rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
        ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        "--nproc-per-node",
        str(nproc),
        str(script),
        WORKER_FLAG,
        json.dumps(dict(settings)),
    ]
    return subprocess.run(cmd, check=True, timeout=timeout_s, env=rank_env(), text=True)


def job_report(report_dir: str | Path) -> Report:
    """The job's report (rank 0's). Under ``stallscope tune`` it is in the trial's folder
    (``STALLSCOPE_TRIAL_DIR``/report, docs/tune.md), not in ``report_dir``."""
    trial = os.environ.get("STALLSCOPE_TRIAL_DIR")
    folder = Path(trial) / "report" if trial else Path(report_dir)
    return load_report(folder / "report.json")
