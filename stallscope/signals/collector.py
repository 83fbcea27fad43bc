"""The background signals of one run: which samplers run, on which GPU, and their window summaries.

``Session`` owns one ``SignalCollector``. It starts the host sampler at once (every
``sample_interval_s`` but at most once a second, plus once at each epoch end) and the NVML sampler
as soon as there is a GPU to sample: ``nvml_device`` when given, else the GPU torch uses, found
on the training thread (``check_device``, at each pass start and epoch end) once the user's code
has initialised CUDA; StallScope never initialises it. On CUDA it also times the compute phase
with CUDA events through ``Timeline.watch``.

Every method contains its own failures: a broken part turns itself off with a note, and the
collector never raises into the session.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from stallscope._exceptions import from_signal_handler
from stallscope.signals.cuda_events import (
    CudaComputeTimer,
    CudaDevice,
    CudaSummary,
    batch_pinning,
    cuda_allocations,
    cuda_facts,
    event_factory,
)
from stallscope.signals.host_sampler import MIN_INTERVAL_S as HOST_MIN_INTERVAL_S
from stallscope.signals.host_sampler import HostProbe, HostSampler, HostSummary
from stallscope.signals.nvml import NvmlSampler, NvmlSummary
from stallscope.signals.procfs import thread_schedstat
from stallscope.signals.sampler import PeriodicSampler, Sampler
from stallscope.timeline.phases import COMPUTE
from stallscope.timeline.recorder import Timeline


@dataclass(frozen=True)
class Signals:
    """What the background signals measured over one window (an epoch or the run)."""

    nvml: NvmlSummary | None = None
    host: HostSummary | None = None
    cuda: CudaSummary | None = None
    #: the CUDA device torch uses, None off CUDA
    cuda_device: CudaDevice | None = None


_NO_SIGNALS = Signals()


class WindowMark(NamedTuple):
    """The windows of an epoch whose close waits (``SignalCollector.mark_windows``)."""

    #: NVML's samples of the epoch, set aside (``NvmlSampler.mark_window``)
    nvml: object | None
    host: HostSummary | None
    cuda: CudaSummary | None
    #: the CUDA device as last read (``_refresh_device``)
    device: CudaDevice | None


#: at most this share of the time between epoch ends goes to reading the CUDA device's peak
#: memory anew (``SignalCollector._refresh_device``)
REFRESH_SHARE = 0.0025


class SignalCollector:
    """Starts, feeds and stops the samplers of one run. See the module docstring."""

    def __init__(
        self,
        timeline: Timeline,
        *,
        nvml_device: int | str | None,
        interval_s: float,
        host_probe: HostProbe | None = None,
        nvml_load: Callable[[], Any] | None = None,
        cores: int | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        host: bool = True,
    ) -> None:
        self._timeline = timeline
        self._nvml_device = nvml_device
        self._interval_s = interval_s
        self._nvml_load = nvml_load
        self._clock = clock
        self._notes: list[str] = []
        self.host: HostSampler | None = None
        if host:
            host_interval = max(interval_s, HOST_MIN_INTERVAL_S)
            self.host = HostSampler(interval_s=host_interval, probe=host_probe, cores=cores, clock=clock)
        #: a scripted host (tests) has no training thread to read from /proc
        self._real_host = host_probe is None
        self.nvml: NvmlSampler | None = None
        self.timer: CudaComputeTimer | None = None
        self.cuda_device: CudaDevice | None = None
        self._cuda_checked = False
        #: no epoch end reads the CUDA device's peak memory anew before this clock reading
        self._refresh_at = 0
        #: the CUDA allocator's count of allocations (``cuda_allocations``) when CUDA was taken
        #: as this run's device, until an epoch confirms it; and when it was given up (``_idle_cuda``)
        self._allocations_then: int | None = None
        self._cuda_confirmed = False
        self._given_up_at: int | None = None
        #: CUDA holds tensors, but this run does no work there: a CPU run (``_idle_cuda``)
        self.cuda_idle = False
        self._batch_checked = False
        self._started = False
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._guard("host", self._start_host)
        if self._nvml_device is not None:
            self._guard("nvml", lambda: self._start_nvml(self._nvml_device))
        self.check_device()

    def stop(self) -> None:
        """Stop every sampler (each join is bounded) and detach from the timeline."""
        if self._stopped:
            return
        self._stopped = True
        self._guard("cuda", self._timeline.unwatch)
        if self.timer is not None:
            self._guard("cuda", self.timer.release)
        samplers = self._samplers()
        for sampler in samplers:  # all at once: their last samples overlap, so do the waits
            if isinstance(sampler, PeriodicSampler):
                self._guard(sampler.name, sampler.request_stop)
        for sampler in samplers:
            self._guard(sampler.name, sampler.stop)

    def _start_host(self) -> None:
        if self.host is not None:
            if self._real_host:
                # started by the training thread: its waits for a core tell CPU work from I/O
                self.host.follow_thread(functools.partial(thread_schedstat, threading.get_native_id()))
            self.host.start()

    def _start_nvml(self, target: int | str | None) -> None:
        if self._stopped:
            return
        if self.nvml is None:
            kwargs: dict[str, Any] = {}
            if self._nvml_load is not None:
                kwargs["load"] = self._nvml_load
            timeline = self._timeline
            self.nvml = NvmlSampler(
                target=target,
                interval_s=self._interval_s,
                probe=timeline.probe,
                phase_names=timeline.phase_names,
                clock=self._clock,
                **kwargs,
            )
            self.nvml.start()
        elif target is not None:
            self.nvml.set_target(target)

    # -- training-thread hooks -----------------------------------------------------------

    def check_device(self) -> None:
        """Pick up the CUDA device once the user's code has initialised CUDA (cheap when done)."""
        if self._cuda_checked or self._stopped:
            return
        self._guard("cuda", self._check_device)

    def _check_device(self) -> None:
        facts = cuda_facts()
        if facts is None:
            return
        allocations = self._allocations()
        if self.cuda_idle and (allocations is None or allocations == self._given_up_at):
            return  # still nothing of this run's on the GPU
        self.cuda_idle = False
        self._allocations_then = allocations
        self._cuda_checked = True
        self.cuda_device = facts
        if self._nvml_device is None:
            if facts.uuid is not None:
                self._start_nvml(facts.uuid)
            else:
                self.note("torch reports no UUID for its GPU, so NVML cannot tell which GPU it is; pass nvml_device")
        new_event = event_factory()
        if new_event is not None:
            self.timer = CudaComputeTimer(new_event, clock=self._clock)
            self._timeline.watch(self._timeline.phase_id(COMPUTE), self.timer.begin, self.timer.end)

    def begin_pass(self) -> None:
        """A pass over the loader starts: look for the GPU, check the next batch for pinning."""
        self._batch_checked = False
        self.check_device()

    def note_batch(self, batch: object) -> None:
        """Check one batch per pass for pageable (unpinned) CPU tensors, on CUDA runs only."""
        if self._batch_checked or self.timer is None:
            return
        self._batch_checked = True
        timer = self.timer

        def check() -> None:
            timer.note_batch(*batch_pinning(batch, in_use=True))

        self._guard("cuda", check)

    # -- windows -------------------------------------------------------------------------

    def close_window(self, *, steps: int = 1, host: bool = True) -> Signals:
        """The signals of the epoch that just ended (of ``steps`` steps); starts the next window.
        The run's use of CUDA is confirmed at an epoch end after the one that took the device
        (a model whose memory appears only in its first step is taken here, not at a pass start).
        ``host``: close the host's window too (only where a diagnosis is made: see
        ``mark_windows``)."""
        taken = self.cuda_device is not None
        self.check_device()
        if taken and steps > 0 and self.cuda_device is not None and not self._cuda_confirmed:
            self._guard("cuda", self._confirm_cuda)
        return self.marked_signals(self.mark_windows(host=host))

    def close_group(self, epoch: Signals, *, alone: bool, host: bool = False) -> Signals:
        """The signals of the group of epochs diagnosed together that ``epoch`` (its own signals,
        with the host's window closed) closes; starts the next group. ``alone``: the epoch is the
        group, and its own signals are the group's. The host's window is the group's already:
        only an epoch end that closes a group closes it (``mark_windows``); ``host``: it was not
        closed with the epoch's, close it now."""
        nvml = self._summary("nvml", self.nvml.close_group) if self.nvml is not None else None
        cuda = self._summary("cuda", self.timer.close_group) if self.timer is not None else None
        host_summary = epoch.host
        if host and self.host is not None and not self._stopped:
            host_summary = self._summary("host", self.host.close_window)
        if alone:
            return epoch
        if nvml is None and cuda is None and host_summary is None and epoch.cuda_device is None:
            return _NO_SIGNALS
        return Signals(nvml=nvml, host=host_summary, cuda=cuda, cuda_device=epoch.cuda_device)

    @property
    def on_cuda(self) -> bool | None:
        """True once the run was seen on CUDA, False when CUDA was given up as idle
        (``_confirm_cuda``), None when not known (``compute_threads`` then looks itself)."""
        if self.cuda_device is not None:
            return True
        return False if self.cuda_idle else None

    def _allocations(self) -> int | None:
        return cuda_allocations(sys.modules.get("torch"))

    def _confirm_cuda(self) -> None:
        """At the end of the first epoch with steps since CUDA was taken as this run's device: did
        the run allocate anything on it? A model on the GPU allocates its activations every step.
        A process that holds tensors on the GPU (an earlier model in a notebook, another part of
        the program) while this run trains on the CPU does not: its CUDA events would time an idle
        stream (the host's own time, read as a GPU 100% busy) and NVML another workload's use, so
        the run is read as a CPU run (``_idle_cuda``) until the allocator moves."""
        now = self._allocations()
        then = self._allocations_then
        if now is None or then is None or now != then:
            self._cuda_confirmed = True
            return
        self._idle_cuda(now)

    def _idle_cuda(self, allocations: int) -> None:
        self.cuda_idle = True
        self._given_up_at = allocations
        self._cuda_checked = False  # a later pass start looks again (``_check_device``)
        self.cuda_device = None
        if self.timer is not None:
            with contextlib.suppress(Exception):
                self._timeline.unwatch()
            self.timer.release()
            self.timer = None
        if self.nvml is not None and self._nvml_device is None:  # one the user named stays
            self.nvml.stop()
            self.nvml = None
        self.note(
            "CUDA holds tensors in this process, but this run allocated nothing on the GPU in its first "
            "epoch: it is read as a run on the CPU"
        )

    @property
    def windows_wait(self) -> bool:
        """Whether an epoch end may set its windows aside (``mark_windows``) and the epoch's
        ``Signals`` be made later (``marked_signals``): always, but on CUDA not before an epoch
        confirmed that the run works there (``_confirm_cuda``, at a ``close_window``)."""
        return self.cuda_device is None or self._cuda_confirmed

    @property
    def epoch_windows(self) -> bool:
        """Whether an epoch has windows of its own to close besides the host's (NVML's, the CUDA
        events', the CUDA device's memory): without, ``mark_windows(host=False)`` marks nothing."""
        return self.nvml is not None or self.timer is not None or self.cuda_device is not None

    def mark_windows(self, *, host: bool = True) -> WindowMark:
        """``close_window`` for an epoch whose close waits: each window is closed now, cheaply
        (NVML's samples set aside, not summarised; the CUDA events' totals; the host's window;
        the device as last read), and summarised when the epoch is closed (``marked_signals``).
        ``host=False``: the host's window stays open (an epoch too short to be diagnosed alone:
        the host's numbers serve the diagnoses only, and the group's is made when it closes)."""
        nvml = self._summary("nvml", self.nvml.mark_window) if self.nvml is not None else None
        host_summary = None
        if host and self.host is not None:
            host_summary = self._summary("host", self.host.close_window)
        cuda = self._summary("cuda", self.timer.close_window) if self.timer is not None else None
        return WindowMark(nvml, host_summary, cuda, self._refresh_device())

    def marked_signals(self, mark: WindowMark | None) -> Signals:
        """The ``Signals`` of the windows ``mark_windows`` closed (None: nothing was marked)."""
        if mark is None:
            return _NO_SIGNALS
        nvml_sampler, window = self.nvml, mark.nvml
        nvml = None
        if nvml_sampler is not None and window is not None:
            nvml = self._summary("nvml", lambda: nvml_sampler.window_summary(window))
        if nvml is None and mark.host is None and mark.cuda is None and mark.device is None:
            return _NO_SIGNALS  # a short epoch on the CPU: frozen, so one serves them all
        return Signals(nvml=nvml, host=mark.host, cuda=mark.cuda, cuda_device=mark.device)

    def run_window(self) -> Signals:
        """The signals of the whole run so far."""
        return Signals(
            nvml=self._summary("nvml", self.nvml.run_summary if self.nvml is not None else None),
            host=self._summary("host", self.host.run_summary if self.host is not None else None),
            cuda=self._summary("cuda", self.timer.run_summary if self.timer is not None else None),
            cuda_device=self._refresh_device(now=True),
        )

    def _refresh_device(self, *, now: bool = False) -> CudaDevice | None:
        """The CUDA device with its peak memory as of now (``now``), or as of a recent epoch end:
        reading it takes tens of microseconds, so an epoch end reads it anew once at least
        ``1 / REFRESH_SHARE`` times as long as the last reading took has passed."""
        if self.cuda_device is not None and not self._stopped:
            start = self._clock()
            if now or start >= self._refresh_at:
                fresh = cuda_facts(in_use=True)  # peak memory moves on
                if fresh is not None:
                    self.cuda_device = fresh
                end = self._clock()
                self._refresh_at = end + round((end - start) / REFRESH_SHARE)
        return self.cuda_device

    def notes(self) -> list[str]:
        out = list(self._notes)
        for sampler in self._samplers():
            out.extend(n for n in sampler.notes() if n not in out)
        if self.timer is not None and self.timer.note and self.timer.note not in out:
            out.append(self.timer.note)
        return out

    def _samplers(self) -> list[Sampler[Any]]:
        return [s for s in (self.nvml, self.host) if s is not None]

    def note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)

    # -- containment ---------------------------------------------------------------------

    def _summary(self, part: str, fn: Callable[[], Any] | None) -> Any:
        if fn is None:
            return None
        try:
            return fn()
        except Exception as exc:
            if from_signal_handler(exc):  # the user's, not this part's
                raise
            self._off(part, exc)
            return None

    def _guard(self, part: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:
            if from_signal_handler(exc):
                raise
            self._off(part, exc)

    def _off(self, part: str, exc: BaseException) -> None:
        self.note(f"the {part} signals turned themselves off ({type(exc).__name__}: {exc})")
        if part == "nvml" and self.nvml is not None:
            self.nvml.disable(exc)
            self.nvml.stop()
        elif part == "host" and self.host is not None:
            self.host.disable(exc)
            self.host.stop()
        elif part == "cuda":
            self._cuda_checked = True
            with contextlib.suppress(Exception):
                self._timeline.unwatch()
            self.timer = None
