"""Figures read straight from Linux's /proc: two the host sampler reads once a second, the
training thread's time on a CPU and in the run queue, which it reads at each sample, and the
bytes this process wrote, which the checkpoint meter reads around each save.

psutil reads them too, and more: ``disk_io_counters()`` checks a sysfs path per block device on
every call, ``virtual_memory()`` parses every line of ``/proc/meminfo`` into a dozen fields. Here
a second costs one read of each file. Every reader returns None where the file is missing or
unexpected, and the sampler then asks psutil.
"""

from __future__ import annotations

import os
from pathlib import Path

#: /proc/diskstats counts sectors of 512 bytes, whatever the device's own sector size
SECTOR_BYTES = 512
#: the whole disks are listed again at least every this many reads (a disk hot-added shows in
#: /proc/diskstats a moment before /sys/block lists it)
RELIST_EVERY = 60


class DiskReads:
    """Bytes read from whole block devices since boot (partitions left out: their reads are
    their disk's too), from ``/proc/diskstats``."""

    def __init__(self, proc: Path = Path("/proc"), sys_block: Path = Path("/sys/block")) -> None:
        self._stats = proc / "diskstats"
        self._sys_block = sys_block
        #: the whole disks, as /sys/block names them ("/" in a name is "!" there: cciss!c0d0)
        self._disks: frozenset[str] = frozenset()
        #: the devices /proc/diskstats listed when the disks were last listed
        self._seen: frozenset[str] = frozenset()
        self._reads = 0

    def read(self) -> int | None:
        try:
            with open(self._stats, "rb") as fh:
                lines = [line.split() for line in fh]
        except OSError:
            return None
        names = [fields[2].decode(errors="replace").replace("/", "!") if len(fields) > 5 else "" for fields in lines]
        self._reads += 1
        if self._reads >= RELIST_EVERY or frozenset(names) != self._seen:  # devices came or went
            try:
                self._disks = frozenset(os.listdir(self._sys_block))
            except OSError:
                return None
            self._seen = frozenset(names)
            self._reads = 0
        total = 0
        try:
            for name, fields in zip(names, lines, strict=True):
                if name in self._disks:
                    total += int(fields[5])
        except ValueError:
            return None
        return total * SECTOR_BYTES


def meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """(available, total) bytes of the machine's memory; None without ``MemAvailable`` (kernels
    before 3.14, other systems)."""
    available = total = None
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if line.startswith(b"MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith(b"MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                if available is not None and total is not None:
                    return available, total
    except (OSError, ValueError, IndexError):
        return None
    return None


def machine_cpu(path: Path = Path("/proc/stat")) -> tuple[float, int] | None:
    """(CPU seconds the whole machine spent busy since boot, its online cores) from
    ``/proc/stat``: user, nice, system, irq, softirq and steal time of all cores (idle and
    iowait are not busy). None where the file is missing or unexpected."""
    try:
        with open(path, "rb") as fh:
            lines = fh.read().splitlines()
        fields = lines[0].split()
        if fields[0] != b"cpu":
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
        cores = sum(1 for line in lines if line.startswith(b"cpu") and line[3:4].isdigit())
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if ticks <= 0 or cores <= 0:
        return None
    return (user + nice + system + irq + softirq + steal) / ticks, cores


def written_bytes(path: Path = Path("/proc/self/io")) -> int | None:
    """Bytes this process has handed to ``write()`` and its kin since it started (``wchar`` of
    ``/proc/self/io``: files, pipes and sockets alike, counted when written, before any
    writeback). None where the file is missing, unreadable or unexpected."""
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def thread_schedstat(tid: int, proc: Path = Path("/proc")) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of thread ``tid`` of this process,
    from ``/proc/self/task/<tid>/schedstat``; the second is the wait in the run queue, which other
    processes on the same cores lengthen. None where the file is missing (a kernel without
    ``CONFIG_SCHED_INFO``, another system) or unexpected."""
    try:
        with open(proc / "self" / "task" / str(tid) / "schedstat", "rb") as fh:
            fields = fh.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
