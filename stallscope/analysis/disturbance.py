"""A disturbed measurement: other processes kept a large share of the machine's cores busy.

Their work slows the run's steps in ways no fix of the run's own recovers, and it moves with
what the other processes do, so every finding of such a span is trusted one step less, and the
report says why. Only spans with enough sampled time count (the machine's CPU is read once a
second).
"""

from __future__ import annotations

import dataclasses

from stallscope.analysis.finding import Confidence, Finding
from stallscope.signals.host_sampler import HostSummary

#: other processes busy on at least this share of the machine's cores disturb the timings
OTHERS_SHARE = 0.5
#: ... when the host was sampled for at least this long
MIN_SAMPLED_S = 5.0

_LOWER: dict[Confidence, Confidence] = {"high": "medium", "medium": "low", "low": "low"}


def others_share(host: HostSummary | None) -> float | None:
    """Share of the machine's cores other processes kept busy; None when not measured."""
    if host is None or host.others_cores is None or not host.machine_cores or host.wall_s < MIN_SAMPLED_S:
        return None
    return min(1.0, max(0.0, host.others_cores / host.machine_cores))


def disturbed(host: HostSummary | None) -> bool:
    share = others_share(host)
    return share is not None and share >= OTHERS_SHARE


def lowered(finding: Finding) -> Finding:
    """``finding`` trusted one step less."""
    return dataclasses.replace(finding, confidence=_LOWER[finding.confidence])


def disturbance_note(host: HostSummary | None) -> str | None:
    """The report's note for a disturbed run, else None."""
    if not disturbed(host) or host is None or host.others_cores is None:
        return None
    return (
        f"other processes kept {host.others_cores:.1f} of the machine's {host.machine_cores} cores busy during"
        " the run: the timings are disturbed, so every finding's confidence is one step lower"
    )
