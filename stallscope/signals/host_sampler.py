"""The host side, sampled on a background thread: the training process and its DataLoader workers.

Per tick: CPU time of the main process and of each child process (DataLoader workers and anything
they spawn). About once a second: disk reads, resident memory of the process tree, memory
available to it (the machine's, capped by the cgroup's ``memory.max`` / ``memory.limit_in_bytes``
minus what the cgroup already uses), and the time tasks stalled on memory (PSI), when the kernel
reports it. Where the session names the training thread (``follow_thread``), also that thread's
time on a CPU and its time runnable but waiting for one (``/proc/self/task/<tid>/schedstat``):
how much other work on the same cores stretches the thread's own.

Workers come and go (non-persistent workers restart every epoch): the list of descendants is
refreshed about once a second, less often where listing them is expensive. On Linux a listing
reads the processes created since the previous one (``descendants.py``); elsewhere psutil reads
every process on the machine. Nothing is lost in between: a child found late counts all its CPU time
so far, and a child that exits is accounted through the parent's "children" CPU times, which the
kernel raises by a child's whole CPU time when the parent reaps it, so its last stretch is not
lost and nothing is counted twice.

``psutil`` sits behind the small ``HostProbe`` protocol so tests can script the machine.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from stallscope.signals.descendants import ProcDescendants
from stallscope.signals.host import usable_cores
from stallscope.signals.procfs import DiskReads, machine_cpu, meminfo
from stallscope.signals.sampler import Clock, PeriodicSampler

#: the list of descendants is refreshed at most every ``SCAN_BUDGET_FACTOR`` times what a
#: refresh costs (a full listing reads every process on the machine): at most 0.2% of a core
SCAN_BUDGET_FACTOR = 500
#: host figures change slowly: sampling them more often than this costs CPU for nothing
MIN_INTERVAL_S = 1.0
#: a window whose training thread ran less than this says nothing of its waits for a core
MIN_THREAD_CPU_S = 0.01
#: a cgroup v1 limit at least this large means "no limit"
_UNLIMITED = 1 << 60


class MemoryReading(NamedTuple):
    """Memory of the host and of this process tree at one instant, bytes."""

    #: resident memory of the main process and its children
    rss: int
    #: memory this process tree can still get: the host's available memory, capped by the
    #: cgroup's limit minus its usage
    available: int
    #: the effective limit: the cgroup's limit, or the host's total memory
    limit: int
    #: cumulative time tasks stalled on memory (PSI "some" / "full"), seconds; None without PSI
    stall_some_s: float | None
    stall_full_s: float | None


class HostProbe(Protocol):
    """What the host sampler reads; ``PsutilProbe`` is the real one."""

    def main_cpu(self) -> tuple[float, float]:
        """(CPU seconds of the main process, CPU seconds of its children already reaped)."""

    def children(self) -> dict[int, bool]:
        """Live descendants: pid -> whether it is a direct child of the main process."""

    def child_cpu(self, pid: int) -> float | None:
        """CPU seconds of one descendant; None when it is gone."""

    def memory(self, pids: list[int]) -> MemoryReading | None:
        """Memory now, with the RSS of the main process and ``pids``."""

    def disk_read_bytes(self) -> int | None:
        """Bytes read from block devices since boot (the whole machine); None when unknown."""


class HostSample(NamedTuple):
    """One tick, for the ring of recent samples."""

    now_ns: int
    main_cpu_s: float
    workers_cpu_s: float
    children: int


@dataclass(frozen=True)
class HostSummary:
    """What the host looked like over one window. CPU figures are in cores (1.0 = one core busy)."""

    #: sampled wall time, seconds
    wall_s: float
    #: CPU seconds of the training process / of its child processes (DataLoader workers)
    main_cpu_s: float
    workers_cpu_s: float
    #: most child processes alive at once
    max_children: int
    #: cores this process may use
    cores: int
    #: peak resident memory of the process tree, bytes
    rss_max_bytes: int | None
    #: least memory still available to the process tree, and the limit it counts against
    mem_available_min_bytes: int | None
    mem_limit_bytes: int | None
    #: seconds tasks stalled on memory in the window (PSI "some" and "full"); None without PSI
    mem_stall_some_s: float | None
    mem_stall_full_s: float | None
    #: machine-wide disk read rate, bytes per second
    disk_read_bytes_per_s: float | None
    #: cores busy with processes outside this process tree, on average (the machine's busy cores
    #: less this tree's), and the machine's cores; None when the machine's CPU was not read
    others_cores: float | None = None
    machine_cores: int | None = None
    #: the training thread's seconds on a CPU, and runnable but waiting in the run queue for one;
    #: None where they were not read (no thread followed, no schedstat)
    thread_cpu_s: float | None = None
    thread_wait_s: float | None = None

    @property
    def main_cores(self) -> float:
        return self.main_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def workers_cores(self) -> float:
        return self.workers_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def thread_wait_per_cpu(self) -> float | None:
        """Seconds the training thread waited for a core per second it ran (0 on a quiet host, 2
        where two other busy threads share its core); None where not measured or it barely ran."""
        if self.thread_cpu_s is None or self.thread_wait_s is None or self.thread_cpu_s < MIN_THREAD_CPU_S:
            return None
        return self.thread_wait_s / self.thread_cpu_s

    @property
    def cpu_busy_fraction(self) -> float:
        """Share of the usable cores the process tree kept busy, in [0, 1]."""
        if self.wall_s <= 0 or self.cores <= 0:
            return 0.0
        return min(1.0, (self.main_cpu_s + self.workers_cpu_s) / (self.wall_s * self.cores))

    @property
    def mem_used_fraction(self) -> float | None:
        """Largest share of the memory limit in use, in [0, 1]."""
        if self.mem_available_min_bytes is None or not self.mem_limit_bytes:
            return None
        return min(1.0, max(0.0, 1.0 - self.mem_available_min_bytes / self.mem_limit_bytes))


class _Tally:
    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.main_cpu = 0.0
        self.workers_cpu = 0.0
        self.max_children = 0
        self.rss_max: int | None = None
        self.avail_min: int | None = None
        self.limit: int | None = None
        self.stall_some: float | None = None
        self.stall_full: float | None = None
        self.disk_bytes = 0
        self.disk_ns = 0
        self.others_cpu = 0.0
        self.others_ns = 0
        #: the followed thread's CPU and run-queue seconds over the samples read; None while none
        #: was (a stretch whose reading failed is left out: the figures are a ratio)
        self.thread: tuple[float, float] | None = None


class HostSampler(PeriodicSampler[HostSummary, HostSample]):
    """Samples the process tree and host memory. See the module docstring."""

    name = "host"

    def __init__(
        self,
        *,
        interval_s: float,
        probe: HostProbe | None = None,
        cores: int | None = None,
        clock: Clock = time.perf_counter_ns,
        slow_interval_s: float = 1.0,
        machine: Callable[[], tuple[float, int] | None] | None = None,
    ) -> None:
        """``machine``: (busy CPU seconds of the whole machine, its cores), read on the slow ticks;
        by default ``/proc/stat`` when the probe is the real one, nothing with a scripted probe."""
        super().__init__(interval_s=interval_s, clock=clock)
        self._machine = machine if machine is not None or probe is not None else machine_cpu
        self._last_machine: float | None = None
        self._last_machine_ns = 0
        self._machine_cores: int | None = None
        #: this process tree's CPU seconds since the last reading of the machine's
        self._own_since_machine = 0.0
        self._probe = probe
        self._cores = cores
        self._slow_ns = int(slow_interval_s * 1e9)
        self._tracked: dict[int, tuple[float, bool]] = {}  # pid -> (CPU seconds last seen, direct child)
        self._last_main: tuple[float, float] | None = None
        self._last_disk: int | None = None
        self._last_disk_ns: int | None = None
        self._next_scan: int | None = None
        self._last_ns: int | None = None
        self._last_slow: int | None = None
        self._last_stall: tuple[float | None, float | None] = (None, None)
        self._win: _Tally | None = None
        self._all: _Tally | None = None
        self._read_thread: Callable[[], tuple[float, float] | None] | None = None
        self._last_thread: tuple[float, float] | None = None

    def follow_thread(self, read: Callable[[], tuple[float, float] | None]) -> None:
        """Read ``read()`` (the training thread's seconds on a CPU and in the run queue, as
        ``procfs.thread_schedstat``) at each sample; before ``start``."""
        self._read_thread = read

    def _setup(self) -> None:
        if self._probe is None:
            try:
                self._probe = PsutilProbe()
            except ImportError:
                self.disable(reason="psutil is not installed; pip install psutil")
                return
        if self._cores is None:
            self._cores = usable_cores()
        self.prime()

    def prime(self) -> None:
        """Take the baseline readings (``start`` does this on the thread; tests call it directly)."""
        probe = self._require_probe()
        now = self._clock()
        self._last_main = probe.main_cpu()
        for pid, direct in probe.children().items():
            cpu = probe.child_cpu(pid)
            if cpu is not None:
                self._tracked[pid] = (cpu, direct)  # existed before: only later CPU counts
        self._last_disk = probe.disk_read_bytes()
        self._last_disk_ns = now
        self._read_machine(now)
        self._last_thread = self._read_thread() if self._read_thread is not None else None
        self._last_ns = now
        with self._lock:
            self._win = _Tally(now)
            self._all = _Tally(now)

    def _read_machine(self, now_ns: int) -> tuple[float, int] | None:
        """(busy CPU seconds of the machine, ns) since the last reading (None the first time, or
        when it cannot be read); this process tree's CPU since then starts again from 0."""
        reading = self._machine() if self._machine is not None else None
        self._own_since_machine = 0.0
        last, last_ns = self._last_machine, self._last_machine_ns
        if reading is None:
            self._last_machine = None
            return None
        busy, self._machine_cores = reading
        self._last_machine, self._last_machine_ns = busy, now_ns
        if last is None or now_ns <= last_ns:
            return None
        return max(0.0, busy - last), now_ns - last_ns

    def _require_probe(self) -> HostProbe:
        if self._probe is None:
            raise RuntimeError("the host sampler has no probe")
        return self._probe

    def _tick(self, now_ns: int, *, scan: bool = True) -> None:
        """One sample. Without ``scan`` the list of descendants is not refreshed, even when due: a
        child born since the last refresh is found at the next one (at the latest when the
        sampler stops), with all its CPU time. The reads (which may block) and the bookkeeping
        of what was last seen belong to the sampler's thread; only adding the sample to the
        windows holds the lock."""
        probe = self._probe
        if probe is None or self._win is None or self._all is None or self._last_main is None or self._last_ns is None:
            return  # not primed yet (the thread is still setting up)
        slow = self._last_slow is None or now_ns - self._last_slow >= self._slow_ns
        if slow:
            self._last_slow = now_ns
        if scan and (self._next_scan is None or now_ns >= self._next_scan):
            # a full listing reads every process on the machine: keep it under ~0.2% of a core
            began = time.perf_counter_ns()
            live = probe.children()
            cost = time.perf_counter_ns() - began
            self._next_scan = now_ns + max(self._slow_ns, SCAN_BUDGET_FACTOR * cost)
            for pid, direct in live.items():
                if pid not in self._tracked:
                    # born since the last look: everything it used so far is new
                    self._tracked[pid] = (0.0, direct)
        workers = 0.0
        gone_counted = 0.0
        for pid, (last, direct) in list(self._tracked.items()):
            cpu = probe.child_cpu(pid)
            if cpu is None:
                del self._tracked[pid]
                if direct:
                    gone_counted += last  # its total reappears in the parent's children times
                continue
            workers += max(0.0, cpu - last)
            self._tracked[pid] = (cpu, direct)
        # the parent is read after the children, so a child reaped in between is in its totals
        own, reaped = probe.main_cpu()
        last_own, last_reaped = self._last_main
        self._last_main = (own, reaped)
        # may dip below zero for a tick when a reap raced the reads; the window's sum stays right
        workers += (reaped - last_reaped) - gone_counted
        main = max(0.0, own - last_own)
        disk_delta: int | None = None
        disk_dt = 0
        self._own_since_machine += main + workers
        others: tuple[float, int] | None = None
        if slow:
            own = self._own_since_machine
            machine = self._read_machine(now_ns)
            others = None if machine is None else (max(0.0, machine[0] - own), machine[1])
            disk = probe.disk_read_bytes()
            if disk is not None and self._last_disk is not None and self._last_disk_ns is not None:
                disk_delta, disk_dt = disk - self._last_disk, now_ns - self._last_disk_ns
            self._last_disk, self._last_disk_ns = disk, now_ns
        thread = self._thread_delta()
        self._last_ns = now_ns
        memory = probe.memory(list(self._tracked)) if slow else None
        stall_delta: tuple[float | None, float | None] = (None, None)
        if memory is not None:
            last_some, last_full = self._last_stall
            stall_delta = (
                memory.stall_some_s - last_some if memory.stall_some_s is not None and last_some is not None else None,
                memory.stall_full_s - last_full if memory.stall_full_s is not None and last_full is not None else None,
            )
            self._last_stall = (memory.stall_some_s, memory.stall_full_s)
        with self._lock:
            self._add(now_ns, main, workers, disk_delta, disk_dt, memory, stall_delta, others, thread)

    def _thread_delta(self) -> tuple[float, float] | None:
        """The followed thread's (CPU, run-queue) seconds since the last sample; None when it is
        not followed, or this reading or the last one failed (that stretch is left out)."""
        last = self._last_thread
        now = self._read_thread() if self._read_thread is not None else None
        self._last_thread = now
        if now is None or last is None:
            return None
        return max(0.0, now[0] - last[0]), max(0.0, now[1] - last[1])

    def _add(
        self,
        now_ns: int,
        main: float,
        workers: float,
        disk_delta: int | None,
        disk_dt: int,
        memory: MemoryReading | None,
        stall_delta: tuple[float | None, float | None],
        others: tuple[float, int] | None = None,
        thread: tuple[float, float] | None = None,
    ) -> None:
        """Add one sample to the windows (the lock held). ``others``: (CPU seconds of other
        processes, ns) since the last reading of the machine's CPU; ``thread``: the followed
        thread's (CPU, run-queue) seconds since the last sample, None when not read."""
        if self._win is None or self._all is None:
            return
        for t in (self._win, self._all):
            t.end_ns = now_ns
            t.main_cpu += main
            t.workers_cpu += workers
            t.max_children = max(t.max_children, len(self._tracked))
            if disk_delta is not None and disk_delta >= 0:
                t.disk_bytes += disk_delta
                t.disk_ns += disk_dt
            if others is not None:
                t.others_cpu += others[0]
                t.others_ns += others[1]
            if thread is not None:
                cpu, wait = t.thread or (0.0, 0.0)
                t.thread = (cpu + thread[0], wait + thread[1])
            if memory is not None:
                t.rss_max = max(t.rss_max or 0, memory.rss)
                t.avail_min = memory.available if t.avail_min is None else min(t.avail_min, memory.available)
                t.limit = memory.limit
                some, full = stall_delta
                if some is not None:
                    t.stall_some = (t.stall_some or 0.0) + max(0.0, some)
                if full is not None:
                    t.stall_full = (t.stall_full or 0.0) + max(0.0, full)
        self._ring.append(HostSample(now_ns, main, workers, len(self._tracked)))

    # -- summaries (training thread) -----------------------------------------------------

    def close_window(self) -> HostSummary | None:
        # a sample now, so the window ends where the epoch does: taken by the sampler's thread
        # (reads of /proc may block), without the refresh of the descendants (a full listing
        # reads every process on the machine: 1 ms here, more on big hosts); when the thread
        # does not answer in time, the window ends at its latest sample. Not for a window shorter
        # than one sampling interval (many short epochs): its end is then the latest sample, and
        # the epoch ends cost no more samples than the thread's own pace
        window = self._win
        if window is None or self._clock() - window.start_ns >= self.interval_s * 1e9:
            self._fresh(self._close_tick)
        elif window.end_ns <= window.start_ns:
            # a short window no sample fell in (most epochs of a few milliseconds): its summary is
            # None, and the next one would start where it did, so there is nothing to swap (a
            # sample the thread adds meanwhile goes to the next window, as if taken just after)
            return None
        return self._summary(self._with_lock(self._swap_window))  # None when the lock timed out

    def _close_tick(self, now_ns: int) -> None:
        self._tick(now_ns, scan=False)

    def _final_tick(self, now_ns: int) -> None:
        # a last sample with the descendants listed, so that workers born since the last listing
        # (a run shorter than the listing interval) reach the run's totals
        self._next_scan = None
        self._tick(now_ns)

    def _finish(self) -> None:
        if self._thread is None:  # driven by hand (tests): the last sample is taken here
            self.sample_once(self._final_tick)

    def _swap_window(self) -> _Tally | None:
        window = self._win
        if window is not None:
            self._win = _Tally(window.end_ns)
        return window

    def run_summary(self) -> HostSummary | None:
        return self._with_lock(lambda: self._summary(self._all))

    def _summary(self, t: _Tally | None) -> HostSummary | None:
        if t is None or t.end_ns <= t.start_ns:
            return None
        return HostSummary(
            wall_s=(t.end_ns - t.start_ns) / 1e9,
            main_cpu_s=t.main_cpu,
            workers_cpu_s=max(0.0, t.workers_cpu),
            max_children=t.max_children,
            cores=self._cores or 1,
            rss_max_bytes=t.rss_max,
            mem_available_min_bytes=t.avail_min,
            mem_limit_bytes=t.limit,
            mem_stall_some_s=t.stall_some,
            mem_stall_full_s=t.stall_full,
            disk_read_bytes_per_s=t.disk_bytes / (t.disk_ns / 1e9) if t.disk_ns > 0 else None,
            others_cores=t.others_cpu / (t.others_ns / 1e9) if t.others_ns > 0 else None,
            machine_cores=self._machine_cores if t.others_ns > 0 else None,
            thread_cpu_s=t.thread[0] if t.thread is not None else None,
            thread_wait_s=t.thread[1] if t.thread is not None else None,
        )


#: host memory counts as close to its limit above this share in use
MEMORY_RISK = 0.9


def memory_risk_note(summary: HostSummary | None) -> str | None:
    """A note for the report when host memory came close to its limit (a risk, not a time cost)."""
    if summary is None:
        return None
    used = summary.mem_used_fraction
    if used is None or used < MEMORY_RISK or not summary.mem_limit_bytes:
        return None
    gib = summary.mem_limit_bytes / 1024**3
    return (
        f"host memory reached {used:.0%} of its {gib:.1f} GiB limit; the training process risks being "
        "killed when it runs out (fewer workers or a lower prefetch_factor use less)"
    )


# -- the real machine ------------------------------------------------------------------------


class CgroupMemory:
    """This process's cgroup memory limit, usage and pressure (v2, else v1); all optional."""

    def __init__(self, root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")) -> None:
        self.limit_file: Path | None = None
        self.usage_file: Path | None = None
        self.stat_file: Path | None = None
        self.pressure_file: Path | None = None
        self.v2 = False
        entries: dict[str, str] = {}
        try:
            for line in self_cgroup.read_text().splitlines():
                parts = line.split(":", 2)
                if len(parts) == 3:
                    for controller in parts[1].split(",") if parts[1] else [""]:
                        entries[controller] = parts[2]
        except OSError:
            pass
        if "" in entries and "memory" not in entries:  # cgroup v2
            for base in (root / entries[""].lstrip("/"), root):
                if (base / "memory.max").exists():
                    self.v2 = True
                    self.limit_file, self.usage_file = base / "memory.max", base / "memory.current"
                    self.stat_file, self.pressure_file = base / "memory.stat", base / "memory.pressure"
                    break
        else:
            rel = entries.get("memory", "/").lstrip("/")
            for base in (root / "memory" / rel, root / "memory"):
                if (base / "memory.limit_in_bytes").exists():
                    self.limit_file, self.usage_file = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
                    self.stat_file = base / "memory.stat"
                    break
        if self.pressure_file is None or not self.pressure_file.exists():
            self.pressure_file = Path("/proc/pressure/memory")

    def limit_and_usage(self) -> tuple[int, int] | None:
        """(limit, working set) in bytes; None when unlimited or unreadable. The working set leaves
        out inactive file cache, which the kernel reclaims before it kills anything."""
        if self.limit_file is None or self.usage_file is None:
            return None
        try:
            text = self.limit_file.read_text().strip()
            if text == "max":
                return None
            limit = int(text)
            if limit >= _UNLIMITED:
                return None
            usage = int(self.usage_file.read_text().strip())
        except (OSError, ValueError):
            return None
        inactive = 0
        if self.stat_file is not None:
            key = "inactive_file" if self.v2 else "total_inactive_file"
            try:
                for line in self.stat_file.read_text().splitlines():
                    name, _, value = line.partition(" ")
                    if name == key:
                        inactive = int(value)
                        break
            except (OSError, ValueError):
                pass
        return limit, max(0, usage - inactive)

    def stall_seconds(self) -> tuple[float | None, float | None]:
        """Cumulative memory stall time (PSI "some", "full"), seconds."""
        if self.pressure_file is None:
            return None, None
        try:
            text = self.pressure_file.read_text()
        except OSError:
            self.pressure_file = None
            return None, None
        out: dict[str, float] = {}
        for line in text.splitlines():
            kind, *fields = line.split()
            for f in fields:
                if f.startswith("total="):
                    out[kind] = int(f[6:]) / 1e6
        return out.get("some"), out.get("full")


class PsutilProbe:
    """``HostProbe`` over psutil (imported when the probe is made)."""

    def __init__(self, pid: int | None = None, cgroup: CgroupMemory | None = None) -> None:
        psutil: Any = importlib.import_module("psutil")  # untyped; imported when a probe is made
        self._ps = psutil
        self._main: Any = psutil.Process(pid if pid is not None else os.getpid())
        self._main_pid = self._main.pid
        self._procs: dict[int, Any] = {}
        #: the cheap listing of descendants on Linux (see ``descendants.py``); None: psutil's
        self._descendants = ProcDescendants(self._main_pid) if ProcDescendants.available() else None
        #: disk reads from /proc/diskstats, where it reads (else psutil's, which may count in other
        #: units: one source for a whole run, so that differences stay right)
        disk = DiskReads()
        self._disk = disk if disk.read() is not None else None
        self._cgroup = cgroup if cgroup is not None else CgroupMemory()
        self._gone: tuple[type[BaseException], ...] = (psutil.NoSuchProcess, psutil.AccessDenied)

    def main_cpu(self) -> tuple[float, float]:
        # for this process, os.times() reads the same counters in one system call, no /proc
        # parsing (Linux: times(2) and /proc/<pid>/stat; elsewhere psutil may lack children's)
        t = os.times() if self._main_pid == os.getpid() else self._main.cpu_times()
        return t.user + t.system, t.children_user + t.children_system

    def children(self) -> dict[int, bool]:
        out = self._listing()
        for pid in list(out):
            if pid not in self._procs:
                try:
                    self._procs[pid] = self._ps.Process(pid)
                except self._gone:
                    del out[pid]
        for pid in set(self._procs) - set(out):
            del self._procs[pid]
        return out

    def _listing(self) -> dict[int, bool]:
        if self._descendants is not None:
            return self._descendants.listing()
        try:
            kids = self._main.children(recursive=True)
        except self._gone:
            return {}
        out: dict[int, bool] = {}
        for proc in kids:
            self._procs.setdefault(proc.pid, proc)  # ``children()`` keeps the handle psutil made
            try:
                out[proc.pid] = proc.ppid() == self._main_pid
            except self._gone:
                continue
        return out

    def child_cpu(self, pid: int) -> float | None:
        proc = self._procs.get(pid)
        if proc is None:
            return None
        try:
            t = proc.cpu_times()
        except self._gone:
            self._procs.pop(pid, None)
            return None
        return float(t.user + t.system)

    def memory(self, pids: list[int]) -> MemoryReading | None:
        rss = _rss(self._main, self._gone)
        for pid in pids:
            proc = self._procs.get(pid)
            if proc is not None:
                rss += _rss(proc, self._gone)
        machine = meminfo()
        if machine is None:
            vm = self._ps.virtual_memory()
            machine = int(vm.available), int(vm.total)
        available, limit = machine
        cg = self._cgroup.limit_and_usage()
        if cg is not None:
            cg_limit, cg_used = cg
            limit = min(limit, cg_limit)
            available = min(available, max(0, cg_limit - cg_used))
        some, full = self._cgroup.stall_seconds()
        return MemoryReading(rss=rss, available=available, limit=limit, stall_some_s=some, stall_full_s=full)

    def disk_read_bytes(self) -> int | None:
        if self._disk is not None:
            return self._disk.read()
        try:
            counters = self._ps.disk_io_counters()
        except (OSError, RuntimeError):
            return None
        return int(counters.read_bytes) if counters is not None else None


def _rss(proc: Any, gone: tuple[type[BaseException], ...]) -> int:
    try:
        return int(proc.memory_info().rss)
    except gone:
        return 0
