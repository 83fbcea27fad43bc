"""The data-pipeline rules: data.workers, data.prefetch, data.persistent_workers."""

from __future__ import annotations

import dataclasses

import pytest
from signal_fakes import nvml
from test_analysis_loop_model import MS, ctx, loader, starved_span

from stallscope.analysis import loop_model
from stallscope.analysis.context import AnalysisConfig, Context
from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.finding import speedup_for
from stallscope.analysis.loop_model import PASS_START_BASE_S, PASS_START_PER_WORKER_S, build_loop_model
from stallscope.analysis.rules import data_persistent_workers, data_prefetch, data_workers
from stallscope.timeline.stats import Distribution, EpochBoundary, SpanStats


def test_data_workers_suggests_what_the_cores_can_run() -> None:
    context = ctx(starved_span(), cores=2)
    finding = data_workers.rule(context)
    assert finding is not None
    assert finding.suggestion == {"num_workers": 2}
    model = build_loop_model(context)
    assert model is not None
    expected = model.predict_saving_s(2) / 1.0  # the span lasts 1.0 s
    assert finding.est_saving_fraction == pytest.approx(expected, abs=1e-4)
    assert finding.est_speedup == pytest.approx(speedup_for(finding.est_saving_fraction), abs=1e-3)
    assert finding.evidence["load_cpu_measured"] is True
    assert "from 0 to 2" in finding.fix


def test_data_workers_on_a_cpu_trained_model_also_lowers_torch_threads() -> None:
    """Compute on the CPU with 2 intra-op threads on 2 cores: workers need cores of their own."""
    plain = data_workers.rule(ctx(starved_span(), cores=2))
    context = Context(
        span=starved_span(), loader=loader(), cores=2, config=AnalysisConfig(), batch_tensors=2, compute_threads=2
    )
    finding = data_workers.rule(context)
    assert plain is not None
    assert finding is not None
    assert finding.suggestion == {"num_workers": 2, "torch_num_threads": 1}
    assert "torch.set_num_threads(1)" in finding.fix
    assert finding.confidence == "low"
    assert finding.est_saving_fraction <= plain.est_saving_fraction


def test_a_fed_loop_gets_no_data_workers_finding() -> None:
    assert data_workers.rule(ctx(starved_span(wait_ms=0, consumer_ms=10))) is None


def test_lightning_wording() -> None:
    context = Context(
        span=starved_span(), loader=loader(), cores=2, config=AnalysisConfig(framework="lightning"), batch_tensors=2
    )
    finding = data_workers.rule(context)
    assert finding is not None
    assert "the train DataLoader" in finding.fix


def _respawning_span() -> SpanStats:
    """3 passes with 2 non-persistent workers: 300 ms iter(), 50 ms first batch, 20 ms shutdown;
    30 steps of 10 ms consumer time, no steady wait."""
    passes = [EpochBoundary(i, 300 * MS, 50 * MS, 20 * MS) for i in range(3)]
    step_total = 27 * 10 * MS + 3 * 60 * MS
    data = 3 * (300 + 50 + 20) * MS
    return SpanStats(
        wall_ns=step_total + 3 * (300 + 20) * MS,
        steps=30,
        epochs=3,
        step_total_ns=step_total,
        phase_ns={"data": data, "compute": 30 * 10 * MS, "other": 0},
        phase_counts={"data": 33, "compute": 30},
        step=Distribution.of([10 * MS] * 27 + [60 * MS] * 3),
        data_wait=Distribution.of([0] * 27 + [50 * MS] * 3),
        data_cpu_ns=None,
        process_cpu_ns=300 * MS,
        boundaries=tuple(passes),
    )


def test_persistent_workers_saves_every_respawn_but_the_first() -> None:
    span = _respawning_span()
    context = Context(span=span, loader=loader(workers=2), cores=4, config=AnalysisConfig())
    finding = data_persistent_workers.rule(context)
    assert finding is not None
    assert finding.suggestion == {"persistent_workers": True}
    assert finding.evidence["respawns"] == 2
    assert "so its 2 workers outlive the epoch" in finding.fix
    one_batch_ms = 2 * 10  # two workers keeping up with a 10 ms consumer: 20 ms per batch each
    saved_ms = 2 * (300 + 50 + 20 - one_batch_ms)
    assert finding.est_saving_fraction == pytest.approx(saved_ms / (span.wall_ns / MS), abs=1e-4)


def test_persistent_workers_already_on_or_no_workers_gives_nothing() -> None:
    span = _respawning_span()
    for cfg in (loader(workers=2, persistent=True), loader(workers=0)):
        assert data_persistent_workers.rule(Context(span=span, loader=cfg, cores=4, config=AnalysisConfig())) is None


def test_prefetch_fires_on_bursts_not_on_steady_starvation() -> None:
    steps = 100
    waits = [0] * 85 + [30 * MS] * 15  # most batches ready, a few very late
    span = SpanStats(
        wall_ns=steps * 10 * MS + sum(waits),
        steps=steps,
        epochs=1,
        step_total_ns=steps * 10 * MS + sum(waits),
        phase_ns={"data": sum(waits), "compute": steps * 10 * MS, "other": 0},
        phase_counts={"data": steps, "compute": steps},
        step=Distribution.of([10 * MS + w for w in waits]),
        data_wait=Distribution.of(waits),
        data_cpu_ns=None,
        process_cpu_ns=steps * 10 * MS,
        boundaries=(EpochBoundary(0, 0, 0, 0),),
    )
    context = Context(span=span, loader=loader(workers=2), cores=4, config=AnalysisConfig())
    finding = data_prefetch.rule(context)
    assert finding is not None
    assert finding.suggestion == {"prefetch_factor": 4}
    assert finding.confidence == "low"
    assert data_prefetch.rule(Context(span=starved_span(), loader=loader(2), cores=4, config=AnalysisConfig())) is None


def test_diagnose_ranks_and_filters_by_min_saving() -> None:
    found = diagnose(ctx(starved_span(), cores=2))
    assert [f.id for f in found][:1] == ["data.workers"]
    savings = [f.est_saving_fraction for f in found]
    assert savings == sorted(savings, reverse=True)
    strict = Context(span=starved_span(), loader=loader(), cores=2, config=AnalysisConfig(min_saving=0.99))
    assert diagnose(strict) == []


def test_data_workers_lowers_workers_whose_hand_over_costs_more_than_the_batch() -> None:
    from test_analysis_loop_model import handed_over

    context = handed_over(probe_s=0.3e-3)
    finding = data_workers.rule(context)
    assert finding is not None
    assert finding.suggestion == {"num_workers": 0}
    model = build_loop_model(context)
    assert model is not None
    assert finding.est_saving_fraction == pytest.approx(model.predict_saving_s(0) / context.span.wall_s, abs=1e-4)
    # 200 steps of 2.5 ms become 0.3 ms of indexing and a step that no longer starts cold after
    # a hand-over (the 1 ms less about 0.26 ms): about 1.04 ms, x2.4 or so
    assert model.predict_step_s(0) < 1.3e-3 - 0.2e-3
    assert 2.2 < finding.est_speedup < 2.6
    assert "from 2 to 0" in finding.fix
    assert "0.30 ms" in finding.fix  # the in-process batch, printed with its digits
    assert finding.evidence["load_source"] == "probe"


def _alternating_waits_span(waits_ms: tuple[float, ...], compute_ms: float, steps: int = 400) -> SpanStats:
    """Steps whose waits for data cycle through ``waits_ms`` (a worker-fed loop, CPU in the waits
    0.6 of their time), then ``compute_ms`` of compute."""
    from conftest import FakeClock

    from stallscope.timeline.recorder import Timeline

    clock, cpu = FakeClock(), FakeClock()
    timeline = Timeline(clock=clock, cpu_clock=cpu)
    timeline.start()
    timeline.begin_epoch(in_process_data=False)
    compute = timeline.phase_id("compute")
    for i in range(steps):
        wait = waits_ms[i % len(waits_ms)]
        timeline.data_begin()
        clock.advance_ms(wait)
        cpu.advance_ms(0.6 * wait)
        timeline.data_end(got_item=True)
        timeline.enter(compute)
        clock.advance_ms(compute_ms)
        cpu.advance_ms(compute_ms)
        timeline.leave()
    return timeline.end_epoch()


def test_ready_in_memory_batches_of_a_dataset_of_ones_own_get_no_more_workers() -> None:
    """Two workers at 20% CPU each, waits of 0.6 and 1.3 ms: no more than the hand-over of two
    tensors costs (1.3 ms). Behind files, the idle workers may be waiting on reads, and a third
    hides more of it; behind in-memory tensors of the user's own class (whose batches StallScope
    does not time), they may just be ahead, and a third cannot be shown to help."""
    from signal_fakes import host
    from signal_fakes import loader as loader_config

    span = _alternating_waits_span((0.6, 1.3), compute_ms=0.47)
    signals = host(wall_s=span.wall_s, main_cpu_s=0.7 * span.wall_s, workers_cpu_s=0.2 * span.wall_s, cores=2)

    def rule_for(in_memory: str | None) -> object:
        ctx = Context(
            span=span,
            loader=loader_config(num_workers=2, in_memory=in_memory),
            cores=2,
            config=AnalysisConfig(),
            host_signals=signals,
            batch_tensors=2,
            batch_bytes=4224,
        )
        return data_workers.rule(ctx)

    files = rule_for(None)
    assert files is not None
    assert files.suggestion == {"num_workers": 3}
    assert rule_for("tensors") is None
    assert rule_for("TensorDataset") is None


def test_in_memory_tensors_whose_loader_falls_behind_still_get_more_workers() -> None:
    """The same dataset class (a label tensor with a row per sample is enough to read as "in
    memory"; its __getitem__ may still read files), waits of 0.4 ms but one in four of 6 ms: the
    mean (1.8 ms) is under the hand-over's estimate, but a loader that keeps its batches ready
    does not leave some waits 15 times the fastest. More workers are still advised."""
    from signal_fakes import host
    from signal_fakes import loader as loader_config

    span = _alternating_waits_span((0.4, 0.4, 0.4, 6.0), compute_ms=0.47)
    signals = host(wall_s=span.wall_s, main_cpu_s=0.7 * span.wall_s, workers_cpu_s=0.2 * span.wall_s, cores=2)
    ctx = Context(
        span=span,
        loader=loader_config(num_workers=2, in_memory="tensors"),
        cores=2,
        config=AnalysisConfig(),
        host_signals=signals,
        batch_tensors=2,
        batch_bytes=4224,
    )
    finding = data_workers.rule(ctx)
    assert finding is not None
    assert finding.suggestion["num_workers"] > 2


def test_data_workers_never_raises_past_the_cores_for_a_hand_over_bound_loop() -> None:
    """Two workers on two cores, the wait is the hand-over itself: more workers cannot help."""
    from test_analysis_loop_model import handed_over

    assert data_workers.rule(handed_over(probe_s=None)) is None


def _starved_passes(passes: int) -> SpanStats:
    """``starved_span``'s 100 steps as ``passes`` passes over a loader with no workers."""
    return dataclasses.replace(
        starved_span(),
        epochs=passes,
        boundaries=tuple(EpochBoundary(i, 0, 8 * MS, 0) for i in range(passes)),
    )


@pytest.mark.parametrize("descriptors", [True, False])
def test_workers_for_a_loader_of_several_passes_are_kept_for_the_run(
    monkeypatch: pytest.MonkeyPatch, descriptors: bool
) -> None:
    """Five passes: workers started anew at each would pay their start-up four more times, so
    the suggestion sets persistent_workers too and its prediction counts it. With tensors passed
    as file descriptors (a wait for the busy worker's GIL in each hand-over) the count alone
    would lose: kept for the run, the workers still win."""
    monkeypatch.setattr(loop_model, "_tensors_as_descriptors", lambda: descriptors)
    context = ctx(_starved_passes(5), cores=2)
    finding = data_workers.rule(context)
    assert finding is not None
    assert finding.suggestion == {"num_workers": 2, "persistent_workers": True}
    assert "persistent_workers=True" in finding.snippet
    assert "each of the 5 epochs" in finding.fix
    model = build_loop_model(context)
    assert model is not None
    # each later pass would start two workers (the modelled spawn); kept, it still waits for its
    # first batch, made and handed over, as a pass of started workers does
    restart_s = PASS_START_BASE_S + 2 * PASS_START_PER_WORKER_S
    started = model.predict_saving_s(2, persistent=False)
    assert finding.est_saving_fraction == pytest.approx(started + 4 * restart_s, abs=1e-4)  # the span is 1.0 s


def test_a_start_up_worth_less_than_min_saving_leaves_the_workers_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same five passes where the four start-ups (about 15% of the span) are below the
    smallest saving worth a fix: the count alone, predicted without them (tensors passed by
    name: no wait for a worker's GIL)."""
    monkeypatch.setattr(loop_model, "_tensors_as_descriptors", lambda: False)
    span = _starved_passes(5)
    config = AnalysisConfig(min_saving=0.2)
    context = Context(span=span, loader=loader(), cores=2, config=config, batch_tensors=2)
    finding = data_workers.rule(context)
    assert finding is not None
    assert finding.suggestion == {"num_workers": 2}
    assert "persistent_workers" not in finding.fix
    model = build_loop_model(context)
    assert model is not None
    assert finding.est_saving_fraction == pytest.approx(model.predict_saving_s(2, persistent=False), abs=1e-4)


def test_one_pass_or_workers_running_already_give_the_count_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_model, "_tensors_as_descriptors", lambda: False)
    one = data_workers.rule(ctx(starved_span(), cores=2))
    assert one is not None
    assert one.suggestion == {"num_workers": 2}
    # two workers started at each of three passes: data.persistent_workers speaks for their
    # start-ups, so another count of them leaves persistent_workers to it
    context = Context(span=_respawning_span(), loader=loader(workers=2), cores=4, config=AnalysisConfig())
    model = build_loop_model(context)
    assert model is not None
    assert model.predict_saving_s(3, persistent=True) > 0.02 * model.steps * model.step_s
    assert not data_workers._keep_workers(context, model, 3)
    assert data_persistent_workers.rule(context) is not None


def test_workers_made_persistent_keep_only_the_first_pass_of_the_measured_start_up() -> None:
    """Two re-spawned workers made persistent: the span saves each later pass's measured
    start-up (300 ms iter(), 50 ms first batch, 20 ms shutdown, the pass's first step) less the
    batch a later pass still waits for, as data.persistent_workers counts it."""
    model = build_loop_model(
        Context(span=_respawning_span(), loader=loader(workers=2), cores=4, config=AnalysisConfig())
    )
    assert model is not None
    assert model.predict_saving_s(2) == pytest.approx(0.0)
    each_pass_s = (300 + 50 + 20 + 10) / 1e3
    one_batch_s = model.load_s + model.transfer_s + model.consumer_s
    assert model.predict_saving_s(2, persistent=True) == pytest.approx(2 * (each_pass_s - one_batch_s))


def test_another_worker_count_keeps_the_measured_start_up_of_each_pass() -> None:
    """Re-spawned workers with a slow start (300 ms a pass): more of them still pay it; that saving
    is data.persistent_workers', not data.workers'."""
    model = build_loop_model(
        Context(span=_respawning_span(), loader=loader(workers=2), cores=4, config=AnalysisConfig())
    )
    assert model is not None
    steady = model.steps * (model.step_s - model.predict_step_s(3))
    assert model.predict_saving_s(3) == pytest.approx(steady)
    # none at all removes the start-up (no spawn): the saving then counts it
    assert model.predict_saving_s(0) > model.steps * (model.step_s - model.predict_step_s(0))


def test_loading_on_a_crowded_host_is_not_mistaken_for_waiting_on_storage() -> None:
    """``next()`` gets 30% of a core for its CPU-bound work, and so does the compute: the host is
    shared, loading is still CPU work, so no more workers than cores. On a host where the compute
    gets its whole core, the same 30% means loading waits on storage, and more workers hide it."""
    from signal_fakes import context, record_span

    crowded = record_span(steps=40, data_ms=60, data_cpu_ms=18, compute_ms=10, compute_cpu_ms=3)
    quiet = record_span(steps=40, data_ms=60, data_cpu_ms=18, compute_ms=10)
    on_crowded = data_workers.rule(context(crowded, cores=2, loader=loader(), batch_tensors=2))
    on_quiet = data_workers.rule(context(quiet, cores=2, loader=loader(), batch_tensors=2))
    assert on_crowded is not None
    assert on_quiet is not None
    assert on_crowded.suggestion["num_workers"] <= 2
    assert on_quiet.suggestion["num_workers"] > 2


def test_loading_preempted_more_than_the_compute_is_still_cpu_work() -> None:
    """A host loaded several times over: ``next()`` gets 28% of its time on a core, the compute 60%
    (a long stretch of loading is preempted more often than a short one of compute). By those two
    shares alone loading looks like waiting on storage; the training thread's waits for a core (2 s
    per second it ran) show it was runnable the rest of the time, so no more workers than cores.
    Loading that really waits keeps its extra workers on the same host."""
    from signal_fakes import context, host, record_span

    preempted = record_span(steps=40, data_ms=60, data_cpu_ms=17, compute_ms=10, compute_cpu_ms=6)
    waiting = record_span(steps=40, data_ms=60, data_cpu_ms=2, compute_ms=10, compute_cpu_ms=6)
    busy = host(wall_s=2.8, main_cpu_s=0.9, cores=2, thread_cpu_s=0.9, thread_wait_s=1.8)
    unread = data_workers.rule(context(preempted, cores=2, loader=loader(), batch_tensors=2))
    read = data_workers.rule(context(preempted, cores=2, loader=loader(), batch_tensors=2, host_signals=busy))
    storage = data_workers.rule(context(waiting, cores=2, loader=loader(), batch_tensors=2, host_signals=busy))
    assert unread is not None
    assert read is not None
    assert storage is not None
    assert unread.suggestion["num_workers"] > 2  # the misreading the waits correct
    assert read.suggestion["num_workers"] <= 2
    assert read.evidence["thread_core_wait_per_cpu"] == pytest.approx(2.0)
    assert storage.suggestion["num_workers"] > 2


def test_workers_that_share_the_cores_with_training_give_a_range_both_ways() -> None:
    """0 -> 2 workers on 2 cores: the training step then competes with two busy workers, so the
    speedup may land below the estimate; 2 -> 0 for an in-memory loader frees the cores, so it
    may land above. The finding says so and is less sure."""
    more = data_workers.rule(ctx(starved_span(), cores=2))
    assert more is not None
    assert more.suggestion == {"num_workers": 2}
    low, high = more.evidence["est_speedup_range"]
    assert high == more.est_speedup
    assert low < more.est_speedup
    assert more.evidence["cores_demand_after"] > 2
    if high > data_workers.SPREAD * low:
        assert more.confidence == "medium"
        assert "may land anywhere from" in more.fix
    alone = data_workers.rule(ctx(starved_span(), cores=8))
    assert alone is not None
    assert "est_speedup_range" not in alone.evidence  # cores to spare: nothing shared


def test_dropping_workers_that_shared_the_cores_may_speed_the_step_up_too() -> None:
    """Two workers handing over in-memory batches on 2 cores, fewer (none) suggested: the
    training step no longer shares the cores, so the other end of the range is above the
    estimate."""
    from signal_fakes import host
    from test_analysis_loop_model import handed_over

    busy = host(wall_s=1.0, main_cpu_s=1.0, workers_cpu_s=1.6, cores=2)  # the workers' 1.6 cores measured
    finding = data_workers.rule(dataclasses.replace(handed_over(probe_s=0.3e-3), host_signals=busy))
    assert finding is not None
    assert finding.suggestion == {"num_workers": 0}
    low, high = finding.evidence["est_speedup_range"]
    assert low < finding.est_speedup < high
    assert "cores of work now" in finding.fix


def test_the_cold_steps_range_never_takes_the_step_below_half_of_what_was_measured() -> None:
    """A 0.4 ms step beside its workers, its batch 0.05 ms in-process: the cold cost is at its
    most already (half the step); the range's far end keeps the warm step at that half."""
    from test_analysis_loop_model import handed_over

    context = handed_over(probe_s=0.05e-3, wait_ms=1.5, compute_cpu_ms=0.4)
    context = dataclasses.replace(context, span=_short_consumer_span())
    finding = data_workers.rule(context)
    model = build_loop_model(context)
    assert finding is not None
    assert model is not None
    # the fastest a step could be without workers: half the measured consumer, and the batch
    fastest = model.step_s / (0.5 * model.consumer_s + model.load_s)
    assert finding.evidence["est_speedup_range"][1] <= fastest  # it read x31 before the bound


def _short_consumer_span() -> SpanStats:
    from signal_fakes import record_span

    return record_span(steps=200, data_ms=1.5, data_cpu_ms=1.5, compute_ms=0.4, in_process=False)


def test_dropping_workers_on_the_cpu_gives_the_range_of_the_step_starting_warm() -> None:
    """Without workers the step no longer starts cold after each hand-over; how much that saves
    varies from run to run: the range runs from none of it to twice the modelled cost."""
    from test_analysis_loop_model import handed_over

    context = handed_over(probe_s=0.3e-3)
    finding = data_workers.rule(context)
    model = build_loop_model(context)
    assert finding is not None
    assert model is not None
    wall = context.span.wall_s
    ends = []
    # twice d, at most what leaves the warm step at half the measured 1 ms
    for drag in (0.0, min(2 * model.step_drag_s, 0.5e-3)):
        other = dataclasses.replace(model, step_drag_s=drag)
        ends.append(round(1 / (1 - other.predict_saving_s(0) / wall), 3))
    assert finding.evidence["est_speedup_range"] == pytest.approx(ends, abs=2e-3)
    assert ends[0] < finding.est_speedup < ends[1]
    # the step's change: d less the share of it 0.3 ms of loading leaves (0.3 / 2 ms)
    change_ms = model.step_drag_s * (1 - 0.3e-3 / 2e-3) * 1e3
    assert finding.evidence["cold_step_ms"] == pytest.approx(change_ms, abs=1e-3)
    assert "warmer caches" in finding.fix
    assert f"from x{ends[0]:.2f} to x{ends[1]:.2f}" in finding.fix
    assert finding.confidence == "medium"  # a range that wide is not "high"


def test_sixteen_workers_on_two_cores_are_told_fewer_even_when_they_keep_up() -> None:
    """16 non-persistent workers on 2 cores, the loop fed (no steady wait): each of the 3 passes
    spawns all 16 (300 ms of set-up here). Fewer workers keep up and spawn fewer processes."""
    from signal_fakes import host

    span = _respawning_span()
    # the workers' CPU as the host sampler saw it: 4 ms a batch (and their start-up)
    sampled = host(wall_s=span.wall_s, main_cpu_s=0.3, workers_cpu_s=30 * 4e-3, cores=2)
    context = Context(span=span, loader=loader(workers=16), cores=2, config=AnalysisConfig(), host_signals=sampled)
    finding = data_workers.rule(context)
    assert finding is not None
    assert finding.suggestion["num_workers"] <= 2
    assert "from 16 to" in finding.fix
    assert "on 2 usable cores" in finding.fix
    assert finding.est_saving_fraction > 0
    # one core: the words agree with it
    sampled_one = host(wall_s=span.wall_s, main_cpu_s=0.3, workers_cpu_s=30 * 4e-3, cores=1)
    one = data_workers.rule(dataclasses.replace(context, cores=1, host_signals=sampled_one))
    assert one is not None
    assert "16 workers on 1 usable core are started" in one.fix
    assert one.title.startswith("16 workers on 1 usable core: more than it can run")
    assert "1 usable cores" not in one.fix + one.title
    # as many workers as cores, or no CPU measured: nothing to say while the loop is fed
    assert data_workers.rule(dataclasses.replace(context, loader=loader(workers=2))) is None
    assert data_workers.rule(dataclasses.replace(context, host_signals=None)) is None


def test_a_loader_without_persistent_workers_gets_the_count_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_model, "_tensors_as_descriptors", lambda: False)
    other = dataclasses.replace(loader(), kind="Batches", takes_persistent=False)
    context = Context(span=_starved_passes(5), loader=other, cores=2, config=AnalysisConfig(), batch_tensors=2)
    finding = data_workers.rule(context)
    assert finding is not None
    assert finding.suggestion == {"num_workers": 2}
    assert "persistent_workers" not in finding.fix


def test_on_a_gpu_busy_during_the_waits_keeping_the_workers_must_add_to_the_capped_saving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The five passes' waits are 80% of the span; NVML saw the GPU 80% busy during them, so at
    most 16% of the span can be saved. The count alone saves more than that (18.5% uncapped), so
    keeping the workers adds nothing a GPU would feel: the count alone."""
    monkeypatch.setattr(loop_model, "_tensors_as_descriptors", lambda: False)
    busy = Context(
        span=_starved_passes(5),
        loader=loader(),
        cores=2,
        config=AnalysisConfig(),
        batch_tensors=2,
        nvml=nvml(util_by_phase={"data": 0.8}),
    )
    model = build_loop_model(busy)
    assert model is not None
    assert model.predict_saving_s(2, persistent=False) > 0.16  # the span is 1.0 s
    finding = data_workers.rule(busy)
    assert finding is not None
    assert finding.suggestion == {"num_workers": 2}
    assert finding.est_saving_fraction == pytest.approx(0.16, abs=1e-3)


def test_the_workers_fix_in_trainer_words_keeps_its_caveats_and_not_its_dataloader_words() -> None:
    """The rule's own finding for a CPU-trained model (workers and torch's threads), put in
    TrainingArguments words: the thread advice once, nothing about a DataLoader, and the rule's
    closing sentences on what the prediction counts (``data_workers.caveats``) kept as they are."""
    from dataclasses import replace

    from stallscope.analysis.transformers_words import in_trainer_words

    context = Context(
        span=starved_span(), loader=loader(), cores=2, config=AnalysisConfig(), batch_tensors=2, compute_threads=2
    )
    finding = data_workers.rule(context)
    assert finding is not None
    hf = replace(context, config=AnalysisConfig(framework="transformers"))
    words = in_trainer_words(finding, hf)
    assert words.fix.count("torch.set_num_threads(1)") == 1
    assert "DataLoader" not in words.fix
    tail = data_workers.caveats(finding.fix)
    assert tail  # the cores shared, at least (and a GIL wait where the host's hand-over is slow)
    assert "intra-op" not in tail  # the thread advice comes before the caveats, not among them
    assert words.fix.endswith(tail)
