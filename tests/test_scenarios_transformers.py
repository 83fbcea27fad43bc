"""transformers scenarios: real tiny ``Trainer.train()`` runs with a planted bottleneck.

Each scenario lives in ``examples/`` (listed in ``examples/scenarios.py``'s ``TRANSFORMERS``) and
runs here at its ``SMALL`` size. The planted cause must rank first, its suggestion must be in
``TrainingArguments`` words, never turn evaluation or saving off for the run, and ``run()`` must
take every key of it, so ``benchmarks/whatif.py`` can apply it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import scenarios  # noqa: E402

pytestmark = pytest.mark.scenario

#: the ``TrainingArguments`` fields each finding's suggestion sets
TRAINER_KEYS = {
    "data.workers": {"dataloader_num_workers", "torch_num_threads"},
    "checkpoint.frequency": {"save_strategy", "save_steps"},
    "validation.frequency": {"eval_strategy", "eval_steps", "eval_dataset_fraction"},
}


@pytest.fixture(autouse=True)
def _threads() -> Any:
    """The examples set torch's intra-op threads (``emulate_accelerator``): put them back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_registry_lists_the_transformers_scenarios() -> None:
    assert scenarios.TRANSFORMERS == [
        "transformers_starved_loader",
        "transformers_frequent_save",
        "transformers_frequent_eval",
    ]
    assert set(scenarios.TRANSFORMERS) <= set(scenarios.ALL)


@pytest.mark.parametrize("name", scenarios.TRANSFORMERS)
def test_planted_cause_ranks_first(name: str, tmp_path: Path) -> None:
    module = importlib.import_module(name)
    report = module.run(report_dir=str(tmp_path), console=False, **module.SMALL)
    on_disk = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    ids = [f["id"] for f in on_disk["findings"]]
    assert ids, f"{name}: no finding at all; phases: {on_disk['summary']['phase_fractions']}"
    assert ids[0] == module.EXPECTED, f"{name}: ranking {ids}"
    top = on_disk["findings"][0]
    assert top["est_speedup"] > 1.0
    assert set(top["suggestion"]) <= TRAINER_KEYS[top["id"]], top["suggestion"]
    assert "TrainingArguments" in top["fix"] + top["snippet"], top
    accepted = inspect.signature(module.run).parameters
    assert set(top["suggestion"]) <= set(accepted), f"run() cannot apply {top['suggestion']}"
    assert on_disk["run"]["framework"] == "transformers"
    assert on_disk["complete"] is True
    assert report is not None
    assert report.summary.steps == module.SMALL["batches"]
    # max_steps is read: an interval is at most the run's steps, so the run still saves and
    # evaluates (with a step strategy the Trainer also does both at the last step)
    for key in ("save_steps", "eval_steps"):
        if key in top["suggestion"]:
            assert 1 <= top["suggestion"][key] <= module.SMALL["batches"]
            assert top["suggestion"][key.replace("_steps", "_strategy")] == "steps"


def test_a_two_rank_trainer_job_names_the_straggling_rank(tmp_path: Path) -> None:
    """``torchrun`` with two CPU ranks (gloo), rank 1's collator slow: rank 0 alone writes the
    job's report, and its top finding names rank 1's data, in ``TrainingArguments`` words. (Rank
    0 waits for rank 1 in the backward's all-reduce and in the token count the Trainer gathers
    after the batches are in: both are compute, not rank 0's data.)"""
    module = importlib.import_module("transformers_ddp_straggler")
    module.run(report_dir=str(tmp_path), console=False, **module.SMALL)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    top = report["findings"][0]
    assert top["id"] == module.EXPECTED, [f["id"] for f in report["findings"]]
    assert top["evidence"]["rank"] == module.EXPECTED_RANK
    assert top["evidence"]["phase"] == module.EXPECTED_PHASE
    assert top["suggestion"]["rank"] == module.EXPECTED_RANK
    assert top["suggestion"]["dataloader_num_workers"] >= 1
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    fractions = {r["rank"]: r["phase_fractions"]["data"] for r in report["ranks"]}
    assert fractions[1] > 3 * fractions[0], fractions
    assert report["run"]["framework"] == "transformers"
    assert sorted(p.name for p in (tmp_path / "ranks").iterdir()) == ["rank-0.json", "rank-1.json"]
