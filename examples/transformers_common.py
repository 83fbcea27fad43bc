"""What the transformers scenarios share: a tiny GPT-2 built from a config (nothing downloaded, no
tokenizer), synthetic token batches, and one ``Trainer.train()`` watched by ``StallScope``.

The CPU stands in for the accelerator, on one intra-op thread (``common.emulate_accelerator``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import burn_cpu, emulate_accelerator  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched: the model is built from a config

VOCAB = 128
SEQ_LEN = 32


class TokenDataset(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences (``input_ids`` and ``labels``), ``size`` of them."""

    def __init__(self, size: int, *, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (size, SEQ_LEN), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class CostlyCollator:
    """A ``data_collator`` that burns ``cpu_ms`` of CPU per batch (tokenizing, augmenting,
    padding...), then stacks the samples; picklable, so it runs in the loader's workers too."""

    def __init__(self, cpu_ms: float = 0.0, latency_ms: float = 0.0) -> None:
        self.cpu_ms = cpu_ms
        self.latency_ms = latency_ms

    def __call__(self, samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if self.cpu_ms > 0:
            burn_cpu(self.cpu_ms / 1e3)
        if self.latency_ms > 0:
            time.sleep(self.latency_ms / 1e3)
        return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def tiny_model(seed: int = 0) -> torch.nn.Module:
    """A two-layer GPT-2, 64 wide, from its config."""
    import transformers

    transformers.logging.set_verbosity_error()  # the tiny config's notes about its token ids
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ_LEN, n_layer=2, n_embd=64, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def train(
    *,
    report_dir: str,
    console: Any,
    epochs: int,
    batches: int,
    batch_size: int = 8,
    collator: CostlyCollator | None = None,
    eval_batches: int = 0,
    threads: int | None = None,
    **arguments: Any,
) -> Report | None:
    """``Trainer.train()`` of the tiny model on ``batches`` batches a epoch, watched by
    ``StallScope``; ``arguments`` go to ``TrainingArguments`` (``dataloader_num_workers``,
    ``save_steps``, ``eval_steps``...). Checkpoints go to ``<report_dir>/trainer``."""
    import transformers

    emulate_accelerator()
    if threads is not None:
        torch.set_num_threads(threads)
    settings: dict[str, Any] = {
        "output_dir": str(Path(report_dir) / "trainer"),
        "per_device_train_batch_size": batch_size,
        "per_device_eval_batch_size": batch_size,
        "num_train_epochs": epochs,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "save_strategy": "no",
        "logging_strategy": "steps",
        "logging_steps": 10_000,
        "learning_rate": 1e-3,
        "seed": 0,
    }
    settings.update({k: v for k, v in arguments.items() if v is not None})
    scope = StallScope(report_dir, console=console)
    eval_dataset = TokenDataset(eval_batches * batch_size, seed=1) if eval_batches else None
    trainer = transformers.Trainer(
        model=tiny_model(),
        args=transformers.TrainingArguments(**settings),
        train_dataset=TokenDataset(batches * batch_size),
        eval_dataset=eval_dataset,
        data_collator=collator or CostlyCollator(),
        callbacks=[scope],
    )
    trainer.train()
    return scope.report
