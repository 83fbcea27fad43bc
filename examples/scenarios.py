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
    "nanogpt_loop",
    "generator_loop",
]

LIGHTNING: list[str] = [
    "lightning_starved_loader",
    "lightning_slow_logger",
    "lightning_frequent_validation",
    "lightning_frequent_checkpoint",
    "lightning_one_epoch_validation",
    "lightning_max_steps_checkpoint",
]

#: Lightning as people write it: advice that must not make the run worse (logging from
#: ``validation_step``, a fit bounded by ``max_time``); ``benchmarks/whatif.py`` runs them and
#: ``tests/test_hooks_lightning_advice.py`` applies each one's advice once
LIGHTNING_ADVICE: list[str] = [
    "lightning_validation_logging",
    "lightning_max_time_validation",
]

#: distributed jobs of two CPU ranks; ``run`` launches the ranks itself (``ddp_common.py``)
DISTRIBUTED: list[str] = [
    "ddp_straggler",
    "lightning_ddp_straggler",
    "transformers_ddp_straggler",
    "ddp_compute_straggler",
    "lightning_ddp_compute_straggler",
]

#: real tiny `transformers.Trainer` runs (a GPT-2 built from a config)
TRANSFORMERS: list[str] = [
    "transformers_starved_loader",
    "transformers_frequent_save",
    "transformers_frequent_eval",
]

ALL = PLAIN + LIGHTNING + LIGHTNING_ADVICE + TRANSFORMERS + DISTRIBUTED
