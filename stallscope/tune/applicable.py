"""Which suggestions a trial applies in place, by the loop's framework.

A suggestion is applied whole or not at all (SPEC §3): one key that the trial cannot set where it
sees the object (a ``torch.save`` in the user's loop, ``non_blocking`` in a plain loop's
``.to()``, a logger to wrap in a thread) makes the whole suggestion one to apply by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stallscope.tune.loaders import LOADER_KEYS

#: Trainer arguments a Lightning trial sets before the fit uses them
LIGHTNING_TRAINER_KEYS = frozenset(
    {"log_every_n_steps", "val_check_interval", "check_val_every_n_epoch", "limit_val_batches"}
)
#: ModelCheckpoint arguments a Lightning trial sets on the Trainer's checkpoint callbacks
LIGHTNING_CHECKPOINT_KEYS = frozenset({"every_n_train_steps", "async_save"})

#: TrainingArguments a transformers trial sets at the end of ``Trainer.__init__``
TRANSFORMERS_KEYS = frozenset(
    {
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_prefetch_factor",
        "dataloader_persistent_workers",
        "logging_strategy",
        "logging_steps",
        "save_strategy",
        "save_steps",
        "eval_strategy",
        "eval_steps",
    }
)

#: ``torch.set_num_threads(n)`` in the trial's process, at its first step (``data.workers`` on a
#: CPU: the workers and the compute's intra-op threads share the cores)
THREADS_KEY = "torch_num_threads"

IN_PLACE: Mapping[str, frozenset[str]] = {
    "plain": LOADER_KEYS | {THREADS_KEY},
    # Lightning copies a batch to the device with non_blocking=True itself
    "lightning": LOADER_KEYS | LIGHTNING_TRAINER_KEYS | LIGHTNING_CHECKPOINT_KEYS | {"non_blocking", THREADS_KEY},
    "transformers": TRANSFORMERS_KEYS | {THREADS_KEY},
}


#: the key that names the one rank of a job a suggestion is for (``dist.straggler``'s, a job's
#: ``data.workers``): its loader settings are applied on that rank only
RANK_KEY = "rank"


def in_place(framework: str, suggestion: Mapping[str, Any]) -> bool:
    """Whether a trial of a ``framework`` loop applies ``suggestion`` (every key of it). A
    suggestion for one rank (``"rank"``) is applied in place when the rest of it is DataLoader
    settings and the thread count (a trial rebuilds the loader of that rank only, and sets the
    threads there)."""
    keys = IN_PLACE.get(framework, frozenset())
    rest = set(suggestion) - {RANK_KEY}
    if RANK_KEY in suggestion:
        return bool(rest) and rest <= keys & (LOADER_KEYS | {THREADS_KEY})
    return bool(rest) and rest <= keys
