"""Findings in ``transformers.TrainingArguments`` words (SPEC §1b, §3: a suggestion's keys are the
loop kind's own vocabulary).

The rules reason in neutral terms (``num_workers``, ``every_n_steps``, ``log_every_n_steps``...)
with the run's shape where it matters (the frequency rules count what the Trainer will really do:
``save_steps``/``eval_steps`` count optimizer steps across epochs, and a step-based strategy also
saves and evaluates at the run's last step). This module renames each suggestion's keys to the
``TrainingArguments`` field that sets them, and writes the fix and the snippet as that field; the
prediction, the evidence and the title stay the rule's. A key with no ``TrainingArguments`` field
(a dataset's indexing, an asynchronous logger) keeps its neutral name and the fix says what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding
from stallscope.analysis.rules import data_workers

#: neutral DataLoader keys -> the ``TrainingArguments`` field the Trainer builds its loaders from
LOADER_FIELDS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "prefetch_factor": "dataloader_prefetch_factor",
    "persistent_workers": "dataloader_persistent_workers",
}


def _args(suggestion: Mapping[str, Any]) -> str:
    return "TrainingArguments(..., " + ", ".join(f"{k}={v!r}" for k, v in suggestion.items()) + ")"


def _loader(f: Finding, ctx: Context) -> Finding:
    suggestion: dict[str, Any] = {}
    for key, value in f.suggestion.items():
        if key == "non_blocking":  # Accelerate copies batches with non_blocking when memory is pinned
            suggestion["accelerator_config"] = {"non_blocking": bool(value)}
        else:
            suggestion[LOADER_FIELDS.get(key, key)] = value
    fields = {k: v for k, v in suggestion.items() if k != "torch_num_threads"}
    parts = [f"{k}={v!r}" for k, v in fields.items()]
    fix = f"Set {', '.join(parts)} in TrainingArguments (the Trainer builds its train DataLoader from them)."
    if "dataloader_num_workers" in suggestion and ctx.loader is not None:
        now = ctx.loader.num_workers
        workers = suggestion["dataloader_num_workers"]
        if suggestion.get("dataloader_persistent_workers"):
            fix = (
                f"Set dataloader_num_workers={workers} (now {now}) and dataloader_persistent_workers=True in"
                " TrainingArguments: without it the Trainer's loader starts its worker processes anew every epoch."
                " The prediction is for both together."
            )
        else:
            fix = f"Set dataloader_num_workers={workers} in TrainingArguments (now {now})."
    snippet = _args(fields)
    if "torch_num_threads" in suggestion:
        threads = suggestion["torch_num_threads"]
        fix += (
            f" Training runs on the CPU: also call torch.set_num_threads({threads}) so the workers and the compute"
            " do not stall each other."
        )
        snippet = f"torch.set_num_threads({threads})\n{snippet}"
    if f.id == data_workers.ID:
        fix += data_workers.caveats(f.fix)  # what the prediction counts and how far it may be off
    return replace(f, suggestion=suggestion, fix=fix, snippet=snippet)


def _total(ctx: Context) -> int | None:
    return ctx.shape.total_steps if ctx.shape is not None else None


def _checkpoint(f: Finding, ctx: Context) -> Finding:
    k = int(f.suggestion.get("every_n_steps", 0)) or 1
    total = _total(ctx)
    capped = total is not None and k > total
    if capped and total is not None:
        k = total  # the Trainer saves at the last step anyway: once in the run
    suggestion = {"save_strategy": "steps", "save_steps": k}
    fix = f"Save every {k} optimizer steps: {_args(suggestion)}; the Trainer also saves at the run's last step."
    if capped:
        fix += f" That is one save in this run of {total} steps."
    fix += (
        " If saves still take long, save_only_model=True leaves the optimizer and scheduler state out of each"
        " checkpoint (a run cannot then resume from it); the prediction does not count that."
    )
    return replace(f, suggestion=suggestion, fix=fix, snippet=_args(suggestion))


def _logging(f: Finding, ctx: Context) -> Finding:
    suggestion: dict[str, Any] = {}
    if "log_every_n_steps" in f.suggestion:
        suggestion = {"logging_strategy": "steps", "logging_steps": f.suggestion["log_every_n_steps"]}
    if f.suggestion.get("async_logging"):
        suggestion["async_logging"] = True
        fix = (
            "Each call to the report_to integrations waits: hand the logs to a background thread (a TrainerCallback"
            " whose on_log puts them on a queue that a thread drains, in place of the integration)."
        )
        if "logging_steps" in suggestion:
            steps = suggestion["logging_steps"]
            fix += f" And log every {steps} steps ({_args({'logging_steps': steps})})."
        snippet = _args({k: v for k, v in suggestion.items() if k != "async_logging"}) if len(suggestion) > 1 else ""
        return replace(f, suggestion=suggestion, fix=fix, snippet=snippet or "# a TrainerCallback that queues on_log")
    fix = f"Log every {suggestion['logging_steps']} optimizer steps: {_args(suggestion)}."
    return replace(f, suggestion=suggestion, fix=fix, snippet=_args(suggestion))


def _amp(f: Finding, ctx: Context) -> Finding:
    precision = str(f.suggestion.get("precision", ""))
    suggestion = {"bf16": True} if precision.startswith("bf16") else {"fp16": True}
    fix = f"Train in mixed precision: {_args(suggestion)}."
    return replace(f, suggestion=suggestion, fix=fix, snippet=_args(suggestion))


def _batch_size(f: Finding, ctx: Context) -> Finding:
    suggestion = {"per_device_train_batch_size": f.suggestion.get("batch_size")}
    fix = f"Raise the batch size: {_args(suggestion)}."
    return replace(f, suggestion=suggestion, fix=fix, snippet=_args(suggestion))


TRANSLATE: dict[str, Callable[[Finding, Context], Finding]] = {
    "data.workers": _loader,
    "data.prefetch": _loader,
    "data.persistent_workers": _loader,
    "data.pin_memory": _loader,
    "checkpoint.frequency": _checkpoint,
    "logging.frequency": _logging,
    "compute.amp": _amp,
    "compute.batch_size": _batch_size,
}


def in_trainer_words(finding: Finding, ctx: Context) -> Finding:
    """``finding`` as a ``transformers.Trainer`` user would apply it; unchanged where its setting
    has no ``TrainingArguments`` field (validation's is written by its rule)."""
    translate = TRANSLATE.get(finding.id)
    return finding if translate is None else translate(finding, ctx)
