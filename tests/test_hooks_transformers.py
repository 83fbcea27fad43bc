"""The transformers integration (``stallscope/hooks/transformers.py``): real tiny ``Trainer.train()``
runs of a GPT-2 built from a config, on the CPU, with synthetic tokens; and the touch points
checked against the installed transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import transformers_common as common  # noqa: E402

from stallscope import StallScope  # noqa: E402
from stallscope.hooks.transformers import PRIVATE_PROBES, PUBLIC_PROBES, attach_trainer_probes, find_trainer  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """The model's math on one intra-op thread, as in the examples: a busy 2-core host then runs
    these fits in a few seconds each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _trainer(
    tmp_path: Path,
    scope: StallScope | None,
    *,
    batches: int = 6,
    collator: common.CostlyCollator | None = None,
    **arguments: Any,
) -> Any:
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "num_train_epochs": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "save_strategy": "no",
        "logging_steps": 10_000,
    }
    settings.update(arguments)
    eval_dataset = common.TokenDataset(8, seed=1) if settings.get("eval_strategy", "no") != "no" else None
    return transformers.Trainer(
        model=common.tiny_model(),
        args=transformers.TrainingArguments(**settings),
        train_dataset=common.TokenDataset(batches * 4),
        eval_dataset=eval_dataset,
        data_collator=collator or common.CostlyCollator(),
        callbacks=[] if scope is None else [scope],
    )


def test_every_method_probed_is_on_the_installed_trainer() -> None:
    """The touch points, public and private, still exist: a release that renames one fails here
    (and StallScope then turns itself off with a note instead of timing the wrong thing)."""
    for name in (*PUBLIC_PROBES, *PRIVATE_PROBES):
        assert callable(getattr(transformers.Trainer, name, None)), f"transformers.Trainer.{name} is gone"


def test_attach_refuses_a_trainer_without_the_touch_points() -> None:
    class Moved:
        def get_batch_samples(self) -> None:
            return None

    with pytest.raises(RuntimeError, match=r"has no Trainer\.log"):
        attach_trainer_probes(Moved(), lambda what, original: original)


def test_the_trainer_is_found_from_its_callback_events(tmp_path: Path) -> None:
    """``find_trainer`` reaches the Trainer through ``CallbackHandler.call_event``; nothing is
    found when an event is called by hand."""
    seen: list[Any] = []

    class Spy(transformers.TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen.append(find_trainer(self))

    spy = Spy()
    trainer = _trainer(tmp_path, None, batches=2)
    trainer.add_callback(spy)
    trainer.train()
    assert seen == [trainer]
    assert find_trainer(spy) is None


def test_one_line_train_records_every_phase_and_step(tmp_path: Path) -> None:
    """``callbacks=[StallScope()]`` and nothing else: a step per optimizer step, each phase where
    it belongs, the probes gone after ``train()``, the report written."""
    scope = StallScope(tmp_path / "scope", console=False)
    trainer = _trainer(
        tmp_path,
        scope,
        batches=8,
        gradient_accumulation_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=3,
        logging_steps=1,
    )
    trainer.train()
    report = scope.report
    assert report is not None
    assert report.complete
    assert report.run.framework == "transformers"
    assert report.summary.steps == 4  # 8 micro-batches, 2 per optimizer step
    seconds = report.summary.phase_seconds
    for phase in ("data", "compute", "logging", "validation", "checkpoint"):
        assert seconds.get(phase, 0) > 0, (phase, seconds)
    assert not {*PUBLIC_PROBES, *PRIVATE_PROBES} & set(vars(trainer)), "a probe was left on the Trainer"
    assert [e.index for e in report.epochs] == [0]
    on_disk = json.loads((tmp_path / "scope" / "report.json").read_text(encoding="utf-8"))
    assert on_disk["summary"]["steps"] == 4
    assert not [note for note in report.notes if "turned itself off" in note]


def test_the_data_wait_counts_every_micro_batch(tmp_path: Path) -> None:
    """A collator that sleeps 40 ms a batch, 2 micro-batches a step: the data total holds all 8
    sleeps, and no more: it is within 4 sleeps of the same Trainer's train loader timed by hand
    (``next()`` after ``next()``, Accelerate's look-ahead included), where a batch counted twice
    would add 8."""

    scope = StallScope(tmp_path / "scope", console=False)
    trainer = _trainer(
        tmp_path, scope, batches=8, gradient_accumulation_steps=2, collator=common.CostlyCollator(latency_ms=40)
    )
    trainer.train()
    report = scope.report
    assert report is not None
    assert report.summary.steps == 4
    data_s = report.summary.phase_seconds["data"]
    assert data_s >= 8 * 0.040, report.summary.phase_seconds
    reference_s = 0.0
    batches = iter(trainer.get_train_dataloader())
    while True:
        start = time.perf_counter()
        try:
            next(batches)
        except StopIteration:
            break
        finally:
            reference_s += time.perf_counter() - start
    # one micro-batch a step would miss 4 sleeps (the bound above), each batch twice add 8; the rest
    # is the CPU work beside the sleeps, which a machine busy with other processes stretches
    # differently in the two passes (seen: 0.42 s against 0.36 s at a load of 10 on 2 cores)
    assert abs(data_s - reference_s) < 4 * 0.040, (data_s, reference_s)


def test_headline_numbers_go_through_the_trainers_log(tmp_path: Path) -> None:
    """Once per epoch, ``stallscope/...`` through ``Trainer.log``: in ``state.log_history``
    and handed to every callback's ``on_log`` (the ``report_to`` integrations)."""
    logged: list[dict[str, float]] = []

    class Integration(transformers.TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            logged.append(dict(logs or {}))

    scope = StallScope(tmp_path / "scope", console=False)
    trainer = _trainer(tmp_path, scope, batches=3, num_train_epochs=2)
    trainer.add_callback(Integration())
    trainer.train()
    headlines = [logs for logs in logged if "stallscope/data_fraction" in logs]
    assert len(headlines) == 2
    assert 0.0 <= headlines[0]["stallscope/gpu_idle_fraction"] <= 1.0
    assert sum(1 for h in trainer.state.log_history if "stallscope/steps_per_s" in h) == 2
    report = scope.report
    assert report is not None
    for epoch in report.epochs:  # StallScope's own log is not the run's logging
        assert epoch.summary.phase_seconds.get("logging", 0) == 0


def test_the_panel_is_printed_at_each_epoch_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scope = StallScope(tmp_path / "scope", print_interval_s=0)  # every diagnosis's
    _trainer(tmp_path, scope, batches=3, num_train_epochs=2).train()
    out = capsys.readouterr().out
    # epochs too short to judge: diagnosed together at the end, in the run's panel
    assert "StallScope · epoch" not in out
    assert "StallScope · run (2 epochs)" in out
    assert "report:" in out
    assert scope.report is not None
    assert [(e.diagnosed_with, e.covers_epochs) for e in scope.report.epochs] == [(1, None), (None, (0, 1))]


def test_the_users_exception_propagates_and_the_report_is_written(tmp_path: Path) -> None:
    class Broken(common.CostlyCollator):
        calls = 0

        def __call__(self, samples: list[Any]) -> Any:
            Broken.calls += 1
            if Broken.calls == 4:
                raise ValueError("bad sample")
            return super().__call__(samples)

    scope = StallScope(tmp_path / "scope", console=False)
    trainer = _trainer(tmp_path, scope, batches=6, collator=Broken())
    with pytest.raises(ValueError, match="bad sample"):
        trainer.train()
    report = scope.report
    assert report is not None
    assert report.complete
    # Accelerate's loader reads one batch ahead: the fourth batch is made in the third step's wait
    assert report.summary.steps == 2
    assert any("ValueError: bad sample" in note for note in report.notes)
    assert not set(PUBLIC_PROBES) & set(vars(trainer))


def test_an_exception_in_the_training_step_ends_the_run(tmp_path: Path) -> None:
    scope = StallScope(tmp_path / "scope", console=False)
    trainer = _trainer(tmp_path, scope, batches=4)
    original = trainer.compute_loss

    def compute_loss(*args: Any, **kwargs: Any) -> Any:
        if trainer.state.global_step == 2:
            raise RuntimeError("nan in the loss")
        return original(*args, **kwargs)

    trainer.compute_loss = compute_loss
    with pytest.raises(RuntimeError, match="nan in the loss"):
        trainer.train()
    report = scope.report
    assert report is not None
    assert report.complete
    assert any("RuntimeError: nan in the loss" in note for note in report.notes)


def test_a_second_train_is_a_new_run(tmp_path: Path) -> None:
    scope = StallScope(tmp_path / "scope", console=False)
    trainer = _trainer(tmp_path, scope, batches=3)
    trainer.train()
    first = scope.report
    trainer.train()
    second = scope.report
    assert first is not None
    assert second is not None
    assert first is not second
    assert second.summary.steps == 3


def test_the_run_shape_and_loader_are_read_from_the_arguments(tmp_path: Path) -> None:
    scope = StallScope(tmp_path / "scope", console=False)
    trainer = _trainer(tmp_path, scope, batches=6, max_steps=4)
    trainer.train()
    report = scope.report
    assert report is not None
    assert report.summary.steps == 4
    assert report.run.dataloader is not None
    assert report.run.dataloader["num_workers"] == 0
    assert report.run.dataloader["pin_memory"] is False  # no accelerator: the Trainer pins nothing
    assert report.run.dataloader["batch_size"] == 4  # through Accelerate's DataLoaderShard
    shape = scope._session.shape
    assert shape is not None
    assert shape.total_steps == 4


def test_import_stallscope_works_without_transformers(tmp_path: Path) -> None:
    """``import stallscope`` imports no transformers, and the scope still works as a plain loop."""
    code = (
        "import sys\n"
        "sys.modules['transformers'] = None\n"
        "sys.modules['accelerate'] = None\n"
        "import stallscope\n"
        f"with stallscope.StallScope({str(tmp_path)!r}, console=False) as scope:\n"
        "    for _ in scope.iter(range(3)):\n"
        "        pass\n"
        "assert scope.report.summary.steps == 3\n"
        "assert 'transformers' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_an_accelerate_loop_is_a_plain_loop(tmp_path: Path) -> None:
    """``accelerator.prepare(model, optimizer, loader)`` and ``scope.iter(loader)``: the settings
    are read through Accelerate's ``DataLoaderShard`` (its batch size from the batch sampler it
    wraps), a step per batch, and every batch's wait counted once. The shard reads one batch
    ahead: a pass's first ``next()`` makes two batches and its last none, so the waits move one
    step earlier and add up to the same."""
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    model = common.tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(
        common.TokenDataset(24), batch_size=4, collate_fn=common.CostlyCollator(latency_ms=20)
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with StallScope(tmp_path, console=False) as scope:
        for _ in range(2):
            for batch in scope.iter(loader):
                with scope.phase("compute"):
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                    optimizer.zero_grad()
    report = scope.report
    assert report is not None
    assert report.summary.steps == 12
    assert report.run.dataloader == {
        "num_workers": 0,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": False,
        "batch_size": 4,
    }
    assert report.summary.phase_seconds["data"] >= 12 * 0.020
    assert [e.summary.steps for e in report.epochs] == [6, 6]
