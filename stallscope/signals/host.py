"""Static facts about the host: how many cores this process may use, and the CPU's name.

They come from /sys (the cgroup's CPU quota) and /proc (``cpuinfo``), and a read there can block
for good (a wedged file system, a process stuck in the kernel), so ``host_info`` reads them on a
helper thread and waits for it at most ``READ_WAIT_S``, once; past that it goes on with the
affinity mask alone, and ``cpu_name`` with the machine's architecture (``os.uname``: no file).
"""

from __future__ import annotations

import math
import os
import platform
import threading
from dataclasses import dataclass
from pathlib import Path

from stallscope._threads import start_quiet

#: how long ``host_info`` waits for its reads of /sys and /proc on the helper thread, seconds
READ_WAIT_S = 0.2


@dataclass(frozen=True)
class HostInfo:
    """What the analysis needs to know about the machine."""

    #: host name
    name: str
    #: cores this process may run on: the affinity mask, capped by a cgroup CPU quota
    usable_cores: int
    #: logical cores of the machine
    logical_cores: int


def _affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """Cores this process may use: ``sched_getaffinity`` capped by the cgroup v2/v1 CPU quota."""
    cores = _affinity_cores()
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota(root: Path) -> float | None:
    """The CPU quota in cores, or None when unlimited or unreadable."""
    try:
        text = (root / "cpu.max").read_text().split()
        if len(text) == 2 and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def host_info() -> HostInfo:
    """The host's facts; the reads of /sys and /proc on a helper thread, waited for at most
    ``READ_WAIT_S`` (see the module docstring)."""
    found: list[int] = []

    def read() -> None:
        if not _CPU_NAME:
            _CPU_NAME.append(_read_cpu_name())
        found.append(usable_cores())

    thread = threading.Thread(target=read, name="stallscope-host-info", daemon=True)
    start_quiet(thread)
    thread.join(READ_WAIT_S)
    cores = found[0] if found else _affinity_cores()
    return HostInfo(name=platform.node(), usable_cores=cores, logical_cores=os.cpu_count() or 1)


#: the CPU's model name, once read (``host_info``'s helper thread)
_CPU_NAME: list[str] = []


def cpu_name() -> str:
    """The CPU's model name, as read by ``host_info``; the architecture until then."""
    return _CPU_NAME[0] if _CPU_NAME else platform.machine() or "cpu"


def _read_cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "cpu"
