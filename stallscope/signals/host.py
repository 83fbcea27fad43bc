"""Static facts about the host: how many cores this process may use."""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostInfo:
    """What the analysis needs to know about the machine."""

    #: host name
    name: str
    #: cores this process may run on: the affinity mask, capped by a cgroup CPU quota
    usable_cores: int
    #: logical cores of the machine
    logical_cores: int


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """Cores this process may use: ``sched_getaffinity`` capped by the cgroup v2/v1 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
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
    return HostInfo(name=platform.node(), usable_cores=usable_cores(), logical_cores=os.cpu_count() or 1)
