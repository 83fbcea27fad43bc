"""``data.batch_indexing``: an in-memory dataset of tensors indexed one sample at a time."""

from __future__ import annotations

import pytest
from signal_fakes import context, loader, record_span

from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.loop_model import COLD_GAP_S, build_loop_model
from stallscope.analysis.rules import data_batch_indexing
from stallscope.analysis.rules.data_batch_indexing import (
    BATCH_PER_INDEX_S,
    COLLATE_PER_TENSOR_S,
    COPY_PER_BYTE_S,
    GATHER_PER_TENSOR_S,
    PER_SAMPLE_PER_TENSOR_S,
    PER_SAMPLE_S,
)

#: a batch of 64 rows of 64 floats and a label: two tensors, 64 * (64 * 4 + 8) bytes
BATCH, TENSORS, NBYTES = 64, 2, 64 * (64 * 4 + 8)
#: the modelled per-sample and once-per-batch costs of that batch, written out
BEFORE = (
    BATCH * (PER_SAMPLE_S + TENSORS * PER_SAMPLE_PER_TENSOR_S)
    + TENSORS * COLLATE_PER_TENSOR_S
    + NBYTES * COPY_PER_BYTE_S
)
AFTER = BATCH * BATCH_PER_INDEX_S + TENSORS * GATHER_PER_TENSOR_S + NBYTES * COPY_PER_BYTE_S


def in_memory(**overrides: object) -> object:
    fields: dict[str, object] = {
        "batch_size": BATCH,
        "in_memory": "TensorDataset",
        "per_sample_indexing": True,
        "shuffle": True,
    }
    fields.update(overrides)
    return loader(**fields)


def ctx(
    *,
    steps: int = 200,
    data_ms: float = 0.7,
    compute_ms: float = 2.0,
    framework: str = "plain",
    **loader_fields: object,
) -> object:
    """In-process loading of 0.7 ms a batch (all CPU), then 2 ms of compute per step."""
    span = record_span(steps=steps, data_ms=data_ms, data_cpu_ms=data_ms, compute_ms=compute_ms)
    return context(
        span,
        cores=2,
        framework=framework,
        loader=in_memory(**loader_fields),
        batch_tensors=TENSORS,
        batch_bytes=NBYTES,
    )


def test_the_modelled_ratio_is_what_the_benchmark_measured() -> None:
    """The once-per-batch gather of this batch costs about a quarter of per-sample indexing
    (benchmarks/handoff.py: 0.054 vs 0.27 ms of CPU on the 2-core box)."""
    assert 0.15 < AFTER / BEFORE < 0.35


def test_a_tensor_dataset_gets_one_index_per_batch() -> None:
    c = ctx()
    f = data_batch_indexing.rule(c)  # type: ignore[arg-type]
    assert f is not None
    assert f.id == "data.batch_indexing"
    assert f.suggestion == {"batch_sampler": True}
    # the measured 0.7 ms scaled by the modelled ratio, on each of the 200 steps of 2.7 ms; the
    # step after the shorter loading starts less cold (its share of d: the loading's time over
    # COLD_GAP_S)
    model = build_loop_model(c)  # type: ignore[arg-type]
    assert model is not None
    assert model.step_drag_s > 0
    cut_s = 0.7e-3 * (1 - AFTER / BEFORE)
    cut_s += model.step_drag_s * cut_s / COLD_GAP_S
    assert f.est_saving_fraction == pytest.approx(200 * cut_s / (200 * 2.7e-3), abs=1e-3)
    assert f.est_speedup == pytest.approx(1 / (1 - f.est_saving_fraction), abs=1e-3)
    assert f.evidence["per_sample_us"] == pytest.approx(700 / 64, abs=1e-3)
    assert f.confidence == "medium"
    assert "BatchSampler(RandomSampler(dataset), batch_size=64, drop_last=False)" in f.snippet
    assert "batch_size=None" in f.snippet
    assert "0.70 ms per batch of 64 (0.011 ms per sample)" in f.title


def test_a_dataset_of_its_own_class_saves_at_most_the_modelled_indexing() -> None:
    """Its __getitem__ may do more than slice: 2 ms a batch, of which only the indexing goes."""
    c = ctx(data_ms=2.0, in_memory="tensors")
    f = data_batch_indexing.rule(c)  # type: ignore[arg-type]
    assert f is not None
    model = build_loop_model(c)  # type: ignore[arg-type]
    assert model is not None
    cut_s = BEFORE - AFTER
    # 2 ms of loading left each step cold in full; what is left of it, in proportion
    cut_s += model.step_drag_s * (1 - (2.0e-3 - cut_s) / COLD_GAP_S)
    assert f.est_saving_fraction == pytest.approx(200 * cut_s / (200 * 4.0e-3), abs=1e-3)
    assert f.confidence == "low"
    assert "__getitems__" in f.fix


def test_sequential_order_is_kept() -> None:
    f = data_batch_indexing.rule(ctx(shuffle=False, drop_last=True))  # type: ignore[arg-type]
    assert f is not None
    assert "BatchSampler(SequentialSampler(dataset), batch_size=64, drop_last=True)" in f.snippet


def test_a_distributed_sampler_stays_inside_so_each_rank_keeps_its_share() -> None:
    """A plain DDP loop's DistributedSampler: the BatchSampler draws from it, the loader's own
    (its seed, shuffle and share as they are; a Sequential- or RandomSampler over the whole
    dataset would give every rank every sample), and the loop's set_epoch moves to it."""
    for shuffle in (True, False):
        f = data_batch_indexing.rule(ctx(sampler="DistributedSampler", shuffle=shuffle))  # type: ignore[arg-type]
        assert f is not None
        assert "base = loader.sampler  # its DistributedSampler" in f.snippet
        assert "BatchSampler(base, batch_size=64, drop_last=False)" in f.snippet
        assert "RandomSampler" not in f.snippet
        assert "SequentialSampler" not in f.snippet
        assert "set_epoch(epoch)" in f.fix
        assert f.suggestion == {"batch_sampler": True}


def test_a_distributed_lightning_fit_keeps_a_distributed_sampler_and_turns_lightnings_off() -> None:
    """Lightning would wrap a BatchSampler passed as sampler in its DistributedSamplerWrapper,
    which lists it anew on each rank in that rank's own random order: the batches would overlap.
    So the snippet keeps a DistributedSampler inside and turns Lightning's off; that is a Trainer
    setting, so the suggestion says it (tune lists it by hand)."""
    f = data_batch_indexing.rule(ctx(framework="lightning", sampler="DistributedSampler", shuffle=True))  # type: ignore[arg-type]
    assert f is not None
    assert "base = DistributedSampler(dataset, shuffle=True)" in f.snippet
    assert "Trainer(use_distributed_sampler=False)" in f.fix
    assert "on_train_epoch_start" in f.fix
    assert f.suggestion == {"batch_sampler": True, "use_distributed_sampler": False}
    single = data_batch_indexing.rule(ctx(framework="lightning", sampler="RandomSampler", shuffle=True))  # type: ignore[arg-type]
    assert single is not None
    assert "BatchSampler(RandomSampler(dataset), batch_size=64, drop_last=False)" in single.snippet
    assert single.suggestion == {"batch_sampler": True}


def test_a_sampler_of_the_users_own_is_wrapped_as_it_is() -> None:
    f = data_batch_indexing.rule(ctx(sampler="WeightedRandomSampler", shuffle=None))  # type: ignore[arg-type]
    assert f is not None
    assert "base = loader.sampler  # the loader's WeightedRandomSampler, as it is now" in f.snippet
    assert "BatchSampler(base, batch_size=64" in f.snippet
    assert "SequentialSampler" not in f.snippet


@pytest.mark.parametrize(
    "fields",
    [
        {"per_sample_indexing": False},  # a BatchSampler as sampler, or __getitems__, already
        {"in_memory": None},  # not known to hold tensors
        {"batch_size": None},
    ],
)
def test_no_finding_when_batches_are_not_indexed_per_sample_from_memory(fields: dict[str, object]) -> None:
    assert data_batch_indexing.rule(ctx(**fields)) is None  # type: ignore[arg-type]


def test_not_with_workers_whose_in_process_cost_is_unknown() -> None:
    span = record_span(steps=200, data_ms=0.7, compute_ms=2.0, in_process=False)
    c = context(span, cores=2, loader=in_memory(num_workers=2), batch_tensors=TENSORS, batch_bytes=NBYTES)
    assert data_batch_indexing.rule(c) is None


def test_a_short_run_marks_its_findings_low_confidence() -> None:
    long_run = diagnose(ctx(steps=400))  # type: ignore[arg-type]
    short_run = diagnose(ctx(steps=20))  # type: ignore[arg-type]
    assert [f.id for f in long_run][:1] == ["data.batch_indexing"]
    assert long_run[0].confidence == "medium"
    assert short_run
    assert {f.confidence for f in short_run} == {"low"}
