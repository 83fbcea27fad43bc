"""Lightning scenarios: real tiny ``Trainer.fit`` runs with a planted bottleneck, in both namespaces.

Each scenario lives in ``examples/`` (listed in ``examples/scenarios.py``'s ``LIGHTNING``) and runs
here at its ``SMALL`` size. The planted cause must rank first, its fix must name the Trainer or
DataLoader argument a Lightning user changes, and ``run()`` must take the setting the suggestion
names, so ``benchmarks/whatif.py`` can apply it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import scenarios  # noqa: E402

pytestmark = [
    pytest.mark.scenario,
    # Lightning 2.6 builds torch's ``LeafSpec``, which torch 2.13 deprecates; harmless here
    pytest.mark.filterwarnings(r"ignore:.isinstance.treespec, LeafSpec.. is deprecated:FutureWarning"),
]

#: words of each finding's fix in Lightning's terms (any one of them)
LIGHTNING_WORDS = {
    "data.workers": ("num_workers of the train DataLoader",),
    # log less often, or, for a logger that blocks, log from a background thread
    "logging.frequency": ("Trainer(log_every_n_steps=", "Trainer(logger=BackgroundLogger("),
    "validation.frequency": ("Trainer(",),
    "checkpoint.frequency": ("ModelCheckpoint(every_n_train_steps=",),
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_registry_lists_the_lightning_scenarios() -> None:
    assert scenarios.LIGHTNING == [
        "lightning_starved_loader",
        "lightning_slow_logger",
        "lightning_frequent_validation",
        "lightning_frequent_checkpoint",
        "lightning_one_epoch_validation",
        "lightning_max_steps_checkpoint",
    ]
    assert set(scenarios.LIGHTNING) <= set(scenarios.ALL)


@pytest.mark.parametrize("namespace", ["lightning", "pytorch_lightning"])
@pytest.mark.parametrize("name", scenarios.LIGHTNING)
def test_planted_cause_ranks_first(name: str, namespace: str, tmp_path: Path) -> None:
    module = _load(name)
    report = module.run(report_dir=str(tmp_path), console=False, namespace=namespace, **module.SMALL)
    on_disk = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    ids = [f["id"] for f in on_disk["findings"]]
    assert ids, f"{name}: no finding at all; phases: {on_disk['summary']['phase_fractions']}"
    assert ids[0] == module.EXPECTED, f"{name} ({namespace}): ranking {ids}"
    top = on_disk["findings"][0]
    assert top["est_speedup"] > 1.0
    assert any(words in top["fix"] + "\n" + top["snippet"] for words in LIGHTNING_WORDS[top["id"]]), top
    assert top["suggestion"], "the top finding must name the setting it assumes"
    accepted = inspect.signature(module.run).parameters
    assert set(top["suggestion"]) <= set(accepted), f"run() cannot apply {top['suggestion']}"
    assert on_disk["run"]["framework"] == "lightning"
    assert on_disk["complete"] is True
    assert report is not None
    assert report.complete
    assert [e["index"] for e in on_disk["epochs"]] == list(range(module.SMALL["epochs"]))


def test_checkpoint_scenario_takes_the_suggestions_name_for_the_interval() -> None:
    """The suggestion says ``every_n_train_steps``, Lightning's argument (SPEC §3)."""
    for name in ("lightning_frequent_checkpoint", "lightning_max_steps_checkpoint"):
        assert "every_n_train_steps" in inspect.signature(_load(name).run).parameters


def test_respawned_workers_point_at_persistent_workers(tmp_path: Path) -> None:
    """With workers that are re-spawned every epoch, the fix names ``persistent_workers`` of the
    train DataLoader and counts only the epochs after the first."""
    module = _load("lightning_starved_loader")
    report = module.run(report_dir=str(tmp_path), console=False, epochs=3, batches=8, num_workers=2)
    found = report.finding("data.persistent_workers")
    assert found is not None, [f.id for f in report.findings]
    assert found.suggestion == {"persistent_workers": True}
    assert "persistent_workers=True on the train DataLoader" in found.fix
    assert found.evidence["respawns"] == 2
    assert report.run.dataloader["num_workers"] == 2
