"""The host figures read straight from /proc: disk reads and the machine's memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.signals.procfs import RELIST_EVERY, DiskReads, meminfo, thread_schedstat


def _diskstats(path: Path, rows: dict[str, int]) -> None:
    """Write a /proc/diskstats with ``rows``: device name -> sectors read."""
    lines = [
        f"   8       {i} {name} 100 7 {sectors} 40 0 0 0 0 0 50 40 0 0 0 0 0 0"
        for i, (name, sectors) in enumerate(rows.items())
    ]
    (path / "diskstats").write_text("\n".join(lines) + "\n")


def test_whole_disks_count_and_partitions_do_not(tmp_path: Path) -> None:
    blocks = tmp_path / "block"
    for disk in ("sda", "nvme0n1", "loop0"):
        (blocks / disk).mkdir(parents=True)
    _diskstats(tmp_path, {"sda": 1000, "sda1": 600, "sda2": 400, "nvme0n1": 10, "nvme0n1p1": 10, "loop0": 3})
    reads = DiskReads(proc=tmp_path, sys_block=blocks)
    assert reads.read() == (1000 + 10 + 3) * 512


def test_a_disk_that_comes_later_is_counted(tmp_path: Path) -> None:
    blocks = tmp_path / "block"
    (blocks / "sda").mkdir(parents=True)
    _diskstats(tmp_path, {"sda": 1000})
    reads = DiskReads(proc=tmp_path, sys_block=blocks)
    assert reads.read() == 1000 * 512
    (blocks / "sdb").mkdir()
    _diskstats(tmp_path, {"sda": 1200, "sdb": 5, "sdb1": 5})
    assert reads.read() == 1205 * 512


def test_a_disk_listed_in_sysfs_after_diskstats_is_counted_soon(tmp_path: Path) -> None:
    blocks = tmp_path / "block"
    (blocks / "sda").mkdir(parents=True)
    _diskstats(tmp_path, {"sda": 1000, "sdb": 5})  # sdb is in diskstats, not yet in /sys/block
    reads = DiskReads(proc=tmp_path, sys_block=blocks)
    assert reads.read() == 1000 * 512
    (blocks / "sdb").mkdir()
    counts = {reads.read() for _ in range(RELIST_EVERY)}
    assert counts == {1000 * 512, 1005 * 512}  # counted once the disks are listed again


def test_a_disk_with_a_slash_in_its_name(tmp_path: Path) -> None:
    blocks = tmp_path / "block"
    (blocks / "cciss!c0d0").mkdir(parents=True)
    _diskstats(tmp_path, {"cciss/c0d0": 70, "cciss/c0d0p1": 70})
    assert DiskReads(proc=tmp_path, sys_block=blocks).read() == 70 * 512


def test_a_missing_or_broken_diskstats_reads_as_unknown(tmp_path: Path) -> None:
    blocks = tmp_path / "block"
    (blocks / "sda").mkdir(parents=True)
    reads = DiskReads(proc=tmp_path, sys_block=blocks)
    assert reads.read() is None
    (tmp_path / "diskstats").write_text("   8       0 sda 100 7 many 40\n")
    assert reads.read() is None


def test_meminfo_reads_available_and_total(tmp_path: Path) -> None:
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    9000 kB\nBuffers: 1 kB\n")
    assert meminfo(path) == (9000 * 1024, 16000 * 1024)
    path.write_text("MemTotal:       16000 kB\nMemFree:         1000 kB\n")  # a kernel before 3.14
    assert meminfo(path) is None
    assert meminfo(tmp_path / "missing") is None


@pytest.mark.skipif(not Path("/proc/diskstats").exists(), reason="needs Linux's /proc")
def test_this_machine_agrees_with_psutil() -> None:
    import psutil

    available, total = meminfo() or (0, 0)
    assert total == psutil.virtual_memory().total
    assert 0 < available <= total
    before = psutil.disk_io_counters()
    ours = DiskReads().read()
    after = psutil.disk_io_counters()
    if before is None or after is None:
        pytest.skip("no block devices here")
    assert ours is not None
    assert before.read_bytes <= ours <= after.read_bytes


def test_a_threads_schedstat_reads_its_cpu_and_run_queue_seconds(tmp_path: Path) -> None:
    task = tmp_path / "self" / "task" / "42"
    task.mkdir(parents=True)
    (task / "schedstat").write_text("2500000000 750000000 311\n")
    assert thread_schedstat(42, proc=tmp_path) == pytest.approx((2.5, 0.75))
    (task / "schedstat").write_text("2500000000\n")  # unexpected
    assert thread_schedstat(42, proc=tmp_path) is None
    assert thread_schedstat(43, proc=tmp_path) is None  # no such thread, or no schedstat


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_this_threads_schedstat_counts_its_cpu_time() -> None:
    import threading
    import time

    tid = threading.get_native_id()
    if not (Path("/proc/self/task") / str(tid) / "schedstat").exists():
        pytest.skip("this kernel keeps no schedstat")
    before = thread_schedstat(tid)
    cpu_before = time.thread_time()
    end = cpu_before + 0.05
    while time.thread_time() < end:
        pass
    after = thread_schedstat(tid)
    assert before is not None
    assert after is not None
    # the kernel's count and Python's clock of the same thread's CPU time agree (up to a tick)
    assert after[0] - before[0] == pytest.approx(time.thread_time() - cpu_before, abs=0.02)
    assert after[1] >= before[1]
