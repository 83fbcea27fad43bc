"""The registry of planted-bottleneck scenarios: tests and ``benchmarks/whatif.py`` read it.

Each entry is a module in ``examples/`` defining ``NAME``, ``EXPECTED`` (the finding id that must
rank first, or None for a healthy loop), ``run(**settings) -> Report`` (settings include
``report_dir``, ``console`` and the knobs a suggestion names) and ``SMALL`` (settings for a quick
test-sized run).
"""

from __future__ import annotations

PLAIN = [
    "starved_loader",
    "slow_reads",
    "blocking_checkpoint",
    "chatty_logging",
    "respawned_workers",
    "frequent_validation",
    "healthy",
    "short_blocking_checkpoint",
    "in_memory_inline",
    "in_memory_one_worker",
    "in_memory_two_workers",
]

LIGHTNING: list[str] = [
    "lightning_starved_loader",
    "lightning_slow_logger",
    "lightning_frequent_validation",
    "lightning_frequent_checkpoint",
    "lightning_one_epoch_validation",
    "lightning_max_steps_checkpoint",
]

#: distributed jobs of two CPU ranks; ``run`` launches the ranks itself (``ddp_common.py``)
DISTRIBUTED: list[str] = [
    "ddp_straggler",
    "lightning_ddp_straggler",
    "ddp_compute_straggler",
    "lightning_ddp_compute_straggler",
]

ALL = PLAIN + LIGHTNING + DISTRIBUTED
