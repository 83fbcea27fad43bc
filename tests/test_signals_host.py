"""The host sampler: CPU of the training process and its workers, memory, disk; cgroup limits."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from stallscope.signals.host_sampler import CgroupMemory, HostSampler, MemoryReading, PsutilProbe, memory_risk_note

MS = 1_000_000
GIB = 1024**3


class FakeHost:
    """A scripted machine: set ``own``, ``reaped``, ``kids`` (pid -> [cpu s, direct]) between ticks."""

    def __init__(self) -> None:
        self.own = 0.0
        self.reaped = 0.0
        self.kids: dict[int, list[float | bool]] = {}
        self.mem = MemoryReading(rss=GIB, available=8 * GIB, limit=16 * GIB, stall_some_s=0.0, stall_full_s=0.0)
        self.disk: int | None = 0
        #: calls to ``children()``, the expensive refresh
        self.scans = 0

    def main_cpu(self) -> tuple[float, float]:
        return self.own, self.reaped

    def children(self) -> dict[int, bool]:
        self.scans += 1
        return {pid: bool(v[1]) for pid, v in self.kids.items()}

    def child_cpu(self, pid: int) -> float | None:
        kid = self.kids.get(pid)
        return None if kid is None else float(kid[0])

    def memory(self, pids: list[int]) -> MemoryReading | None:
        return self.mem

    def disk_read_bytes(self) -> int | None:
        return self.disk

    def reap(self, pid: int) -> None:
        """The worker exits and the parent reaps it: its whole CPU moves to the parent's totals."""
        cpu = self.kids.pop(pid)[0]
        self.reaped += float(cpu)


class Rig:
    def __init__(self, host: FakeHost) -> None:
        self.now = 0
        self.host = host
        self.sampler = HostSampler(interval_s=0.2, probe=host, cores=4, clock=lambda: self.now, slow_interval_s=1.0)
        self.sampler.prime()

    def tick(self, ms: float = 200) -> None:
        self.now += round(ms * MS)
        self.sampler.sample_once()


def test_cpu_of_the_main_process_and_of_workers_that_come_and_go() -> None:
    host = FakeHost()
    host.kids = {10: [5.0, True]}  # a worker that existed before: its earlier CPU is not ours
    rig = Rig(host)
    host.own = 0.1
    host.kids[10][0] = 5.15
    rig.tick(1000)
    host.kids[11] = [0.3, True]  # a new worker, found at the next refresh with CPU already used
    rig.tick(1000)
    host.kids[11][0] = 0.5
    host.kids[10][0] = 5.25
    rig.tick(200)
    host.kids[11][0] = 0.6  # then it exits and is reaped before the next look
    host.reap(11)
    host.reap(10)
    host.own = 0.4
    rig.tick(200)
    summary = rig.sampler.close_window()
    assert summary is not None
    # worker 10: 0.25 s since we started; worker 11: all of its 0.6 s
    assert summary.workers_cpu_s == pytest.approx(0.25 + 0.6)
    assert summary.main_cpu_s == pytest.approx(0.4)
    assert summary.wall_s == pytest.approx(2.4)
    assert summary.max_children == 2
    assert summary.cpu_busy_fraction == pytest.approx((0.4 + 0.85) / (2.4 * 4))


def test_a_short_lived_worker_never_seen_alive_still_counts() -> None:
    host = FakeHost()
    rig = Rig(host)
    host.reaped = 0.7  # born and reaped between two looks
    rig.tick()
    summary = rig.sampler.close_window()
    assert summary is not None
    assert summary.workers_cpu_s == pytest.approx(0.7)


def test_windows_split_the_run() -> None:
    host = FakeHost()
    rig = Rig(host)
    host.own = 1.0
    rig.tick(1000)
    first = rig.sampler.close_window()
    host.own = 1.5
    rig.tick(1000)
    second = rig.sampler.close_window()
    run = rig.sampler.run_summary()
    assert first is not None
    assert second is not None
    assert run is not None
    assert (first.main_cpu_s, second.main_cpu_s, run.main_cpu_s) == pytest.approx((1.0, 0.5, 1.5))
    assert second.wall_s == pytest.approx(1.0)


def test_the_followed_threads_cpu_and_waits_for_a_core_split_into_windows() -> None:
    host = FakeHost()
    thread = [1.0, 0.5]  # seconds on a CPU and in the run queue so far

    def read() -> tuple[float, float] | None:
        return (thread[0], thread[1]) if thread else None

    now = [0]
    sampler = HostSampler(interval_s=0.2, probe=host, cores=4, clock=lambda: now[0])
    sampler.follow_thread(read)
    sampler.prime()
    thread[:] = [1.4, 1.3]
    now[0] += 1000 * MS
    sampler.sample_once()
    first = sampler.close_window()
    thread[:] = [2.4, 1.4]
    now[0] += 1000 * MS
    sampler.sample_once()
    second = sampler.close_window()
    run = sampler.run_summary()
    assert first is not None
    assert second is not None
    assert run is not None
    assert (first.thread_cpu_s, first.thread_wait_s) == pytest.approx((0.4, 0.8))
    assert first.thread_wait_per_cpu == pytest.approx(2.0)
    assert second.thread_wait_per_cpu == pytest.approx(0.1)
    assert (run.thread_cpu_s, run.thread_wait_s) == pytest.approx((1.4, 0.9))
    # a reading that fails leaves its stretch out: a window of nothing else has no figures, the
    # run keeps what was read, and the readings after it count again from the next one
    thread.clear()
    now[0] += 1000 * MS
    sampler.sample_once()
    third = sampler.close_window()
    assert third is not None
    assert third.thread_cpu_s is None
    assert third.thread_wait_per_cpu is None
    thread[:] = [3.0, 2.0]
    now[0] += 1000 * MS
    sampler.sample_once()  # the first reading after the failure: nothing to subtract it from
    thread[:] = [3.5, 3.0]
    now[0] += 1000 * MS
    sampler.sample_once()
    fourth = sampler.close_window()
    after = sampler.run_summary()
    assert fourth is not None
    assert after is not None
    assert (fourth.thread_cpu_s, fourth.thread_wait_s) == pytest.approx((0.5, 1.0))
    assert (after.thread_cpu_s, after.thread_wait_s) == pytest.approx((1.9, 1.9))


def test_no_followed_thread_and_a_thread_that_barely_ran_say_nothing_of_waits() -> None:
    rig = Rig(FakeHost())
    rig.tick(1000)
    summary = rig.sampler.close_window()
    assert summary is not None
    assert summary.thread_cpu_s is None
    assert summary.thread_wait_per_cpu is None
    idle = dataclasses.replace(summary, thread_cpu_s=0.001, thread_wait_s=0.5)
    assert idle.thread_wait_per_cpu is None


def test_an_epoch_end_does_not_refresh_the_descendants() -> None:
    """The window closes on the training thread: it reads the known workers' CPU but leaves the
    refresh (every process on the machine) to the sampler's thread, even when one is due. A worker
    born in between is found at that refresh, with all the CPU time it used."""
    host = FakeHost()
    host.kids = {10: [1.0, True]}
    rig = Rig(host)
    scans = host.scans
    host.kids[10][0] = 1.5
    host.kids[11] = [0.2, True]  # born after the last refresh
    rig.now += 5000 * MS  # a refresh is long due
    first = rig.sampler.close_window()
    assert host.scans == scans
    assert first is not None
    assert first.workers_cpu_s == pytest.approx(0.5)
    host.kids[11][0] = 0.3
    rig.tick(1000)
    assert host.scans == scans + 1
    second = rig.sampler.close_window()
    assert second is not None
    assert second.workers_cpu_s == pytest.approx(0.3)
    assert second.max_children == 2


def test_epoch_ends_closer_than_one_interval_take_no_extra_sample() -> None:
    """Many short epochs: an epoch end takes a fresh sample only when its window is at least one
    sampling interval (0.2 s) long, so the samples keep the thread's own pace."""
    host = FakeHost()
    rig = Rig(host)
    rig.now += 200 * MS
    rig.sampler.close_window()  # a window of 0.2 s: sampled at its end
    before = rig.sampler.ticks
    for _ in range(10):  # ten 10 ms epochs
        rig.now += 10 * MS
        rig.sampler.close_window()
    assert rig.sampler.ticks == before
    rig.now += 200 * MS
    host.own = 0.05
    summary = rig.sampler.close_window()  # a window of 0.3 s: sampled at its end
    assert rig.sampler.ticks == before + 1
    assert summary is not None
    assert summary.main_cpu_s == pytest.approx(0.05)


def test_a_worker_missed_by_the_epoch_ends_reaches_the_run_when_the_sampler_stops() -> None:
    """A run shorter than the listing interval: the last window closed without listing, and the
    sampler's final sample lists the descendants, so the worker's CPU is in the run's totals."""
    host = FakeHost()
    rig = Rig(host)
    rig.tick(1000)  # listed: nothing yet
    host.kids[12] = [0.4, True]  # born after that
    rig.now += 300 * MS
    assert rig.sampler.close_window() is not None
    rig.now += 10 * MS
    rig.sampler.stop()
    run = rig.sampler.run_summary()
    assert run is not None
    assert run.workers_cpu_s == pytest.approx(0.4)
    assert run.max_children == 1


def test_the_probe_reads_this_process_cpu_like_psutil() -> None:
    import subprocess
    import sys

    import psutil

    burn = sum(i * i for i in range(300_000))  # some CPU time to read
    # and a reaped child's: it reaches this process's children totals
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    own, reaped = PsutilProbe().main_cpu()
    t = psutil.Process().cpu_times()
    assert burn > 0
    assert own == pytest.approx(t.user + t.system, abs=0.05)
    assert reaped == pytest.approx(t.children_user + t.children_system, abs=0.05)
    assert reaped > 0.05


def test_memory_available_and_stalls() -> None:
    host = FakeHost()
    rig = Rig(host)
    rig.tick(1000)
    host.mem = MemoryReading(rss=3 * GIB, available=GIB, limit=16 * GIB, stall_some_s=0.3, stall_full_s=0.1)
    rig.tick(1000)
    summary = rig.sampler.close_window()
    assert summary is not None
    assert summary.rss_max_bytes == 3 * GIB
    assert summary.mem_available_min_bytes == GIB
    assert summary.mem_used_fraction == pytest.approx(15 / 16)
    assert (summary.mem_stall_some_s, summary.mem_stall_full_s) == pytest.approx((0.3, 0.1))
    assert memory_risk_note(summary) == (
        "host memory reached 94% of its 16.0 GiB limit; the training process risks being killed when it "
        "runs out (fewer workers or a lower prefetch_factor use less)"
    )


def test_disk_read_rate() -> None:
    host = FakeHost()
    rig = Rig(host)
    host.disk = 50_000_000
    rig.tick(500)
    host.disk = None  # unreadable for a while: not counted
    rig.tick(500)
    summary = rig.sampler.close_window()
    assert summary is not None
    assert summary.disk_read_bytes_per_s == pytest.approx(100e6)


def test_a_probe_that_breaks_turns_the_sampler_off_with_a_note() -> None:
    host = FakeHost()
    rig = Rig(host)

    def broken() -> tuple[float, float]:
        raise PermissionError("no /proc")

    host.main_cpu = broken  # type: ignore[method-assign]
    rig.tick()
    assert not rig.sampler.enabled
    assert rig.sampler.notes() == ("host sampling is off: PermissionError: no /proc",)


def test_cgroup_v2_limit_working_set_and_pressure(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cgroup").write_text("0::/job\n")
    cg = tmp_path / "cg" / "job"
    cg.mkdir(parents=True)
    (cg / "memory.max").write_text(f"{4 * GIB}\n")
    (cg / "memory.current").write_text(f"{3 * GIB}\n")
    (cg / "memory.stat").write_text(f"anon 100\ninactive_file {GIB}\nactive_file 5\n")
    (cg / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500000\n"
    )
    memory = CgroupMemory(root=tmp_path / "cg", self_cgroup=tmp_path / "proc" / "cgroup")
    assert memory.limit_and_usage() == (4 * GIB, 2 * GIB)
    assert memory.stall_seconds() == (2.5, 0.5)
    (cg / "memory.max").write_text("max\n")
    assert memory.limit_and_usage() is None


def test_cgroup_v1_limit(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("4:memory:/docker/abc\n1:cpu:/\n")
    cg = tmp_path / "root" / "memory" / "docker" / "abc"
    cg.mkdir(parents=True)
    (cg / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (cg / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    (cg / "memory.stat").write_text("total_inactive_file 1024\n")
    memory = CgroupMemory(root=tmp_path / "root", self_cgroup=tmp_path / "cgroup")
    assert memory.limit_and_usage() == (2 * GIB, GIB - 1024)
    (cg / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory.limit_and_usage() is None


def test_no_cgroup_files_is_fine(tmp_path: Path) -> None:
    memory = CgroupMemory(root=tmp_path, self_cgroup=tmp_path / "missing")
    assert memory.limit_and_usage() is None


@pytest.mark.slow
def test_psutil_sees_real_dataloader_workers() -> None:
    """A smoke test on this machine: two DataLoader workers burning CPU are seen and measured."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Burn(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> torch.Tensor:
            x = torch.randn(64, 64)
            for _ in range(200):
                x = torch.tanh(x @ x) / 8
            return x

    now = [0]
    sampler = HostSampler(interval_s=0.05, probe=PsutilProbe(), cores=2, clock=lambda: now[0], slow_interval_s=0.0)
    sampler.prime()
    loader = DataLoader(Burn(), batch_size=2, num_workers=2)
    for step, _ in enumerate(loader):
        now[0] += 100 * MS
        sampler.sample_once()
        assert step < 100
    now[0] += 100 * MS
    sampler.sample_once()  # the workers have exited: their tail comes through the parent's totals
    summary = sampler.close_window()
    assert sampler.enabled, sampler.notes()
    assert summary is not None
    assert summary.max_children >= 2
    assert summary.workers_cpu_s > 0
    assert summary.rss_max_bytes is not None
    assert summary.rss_max_bytes > 0
    assert summary.mem_limit_bytes is not None
    assert summary.mem_available_min_bytes is not None
    assert os.getpid() == PsutilProbe()._main_pid


def test_a_short_window_no_sample_fell_in_is_none_and_keeps_its_start() -> None:
    """Epochs of a few milliseconds: a window shorter than the interval with no sample in it has
    no summary, and is not swapped for a new one (nothing to close); the sample that comes next
    counts in the next epoch's window, from the same start."""
    host = FakeHost()
    rig = Rig(host)
    window = rig.sampler._win
    rig.now += 5 * MS
    host.own = 0.004
    assert rig.sampler.close_window() is None
    assert rig.sampler._win is window
    assert host.scans == 1  # the priming listing only: no sample taken for the short window
    rig.tick(200)
    summary = rig.sampler.close_window()
    assert summary is not None
    assert summary.main_cpu_s == pytest.approx(0.004)
    assert summary.wall_s == pytest.approx(0.205)
    assert rig.sampler._win is not window
