"""The validated, keyword-only configuration of a ``StallScope``."""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

# GPU-<uuid>, MIG-<uuid>, and the older MIG-GPU-<uuid>/<gi>/<ci> form
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+(/[0-9]+/[0-9]+)?$")
#: most recent steps kept for percentiles (two int64 rings: 16 MB at this bound)
MAX_RECENT_STEPS = 1_000_000


def check_nvml_device(value: object) -> int | str | None:
    """``None``, a non-negative NVML index, or a GPU/MIG UUID string; else ``ValueError``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"nvml_device must be an NVML index or a GPU UUID, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"nvml_device must be a non-negative NVML index, got {value!r}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():
            return int(text)
        if _UUID.match(text):
            return text
    raise ValueError(f"nvml_device must be an NVML index or a UUID like 'GPU-5c1a…', got {value!r}")


@dataclass(frozen=True)
class ScopeConfig:
    """Everything a ``StallScope`` was configured with."""

    #: folder of ``report.json``; None writes no file
    report_dir: Path | None = Path("stallscope")
    #: print the diagnosis at each epoch end (a ``rich.console.Console`` to print there)
    console: bool | Console = True
    #: NVML index or UUID of the GPU to sample; None = the one torch uses
    nvml_device: int | str | None = None
    #: findings predicted to save less than this fraction of wall time are not shown
    min_saving: float = 0.02
    #: seconds between background samples (NVML, host)
    sample_interval_s: float = 0.2
    #: steps kept for percentiles
    recent_steps: int = 4096
    #: an epoch's panel is printed when this many seconds passed since the last one (the first
    #: epoch's and the run's always are); 0 prints every epoch's; None (the default) prints every
    #: epoch's unless the panels would take more than 0.25% of the run (many very short epochs)
    print_interval_s: float | None = None
    #: write ``report.html`` beside the final ``report.json``
    html: bool = True

    @classmethod
    def create(
        cls,
        report_dir: str | os.PathLike[str] | None = "stallscope",
        *,
        console: bool | Console = True,
        nvml_device: int | str | None = None,
        min_saving: float = 0.02,
        sample_interval_s: float = 0.2,
        recent_steps: int = 4096,
        print_interval_s: float | None = None,
        html: bool = True,
    ) -> ScopeConfig:
        if report_dir is not None and not isinstance(report_dir, (str, os.PathLike)):
            raise ValueError(f"report_dir must be a path or None, got {report_dir!r}")
        if isinstance(report_dir, str) and not report_dir.strip():
            raise ValueError(f"report_dir must not be empty, got {report_dir!r}")
        if report_dir is not None and _is_file(Path(report_dir)):
            raise ValueError(f"report_dir must be a folder, got {str(report_dir)!r}, which is a file")
        if not isinstance(console, (bool, Console)):
            raise ValueError(f"console must be True, False or a rich Console, got {console!r}")
        if isinstance(min_saving, bool) or not isinstance(min_saving, (int, float)) or not 0 <= min_saving < 1:
            raise ValueError(f"min_saving must be a fraction in [0, 1), got {min_saving!r}")
        if (
            isinstance(sample_interval_s, bool)
            or not isinstance(sample_interval_s, (int, float))
            or not 0 < sample_interval_s <= threading.TIMEOUT_MAX  # what Event.wait accepts; rejects nan, inf
        ):
            raise ValueError(f"sample_interval_s must be a number of seconds > 0, got {sample_interval_s!r}")
        if (
            isinstance(recent_steps, bool)
            or not isinstance(recent_steps, int)
            or not 16 <= recent_steps <= MAX_RECENT_STEPS
        ):
            raise ValueError(f"recent_steps must be an int in [16, {MAX_RECENT_STEPS}], got {recent_steps!r}")
        if print_interval_s is not None and (
            isinstance(print_interval_s, bool)
            or not isinstance(print_interval_s, (int, float))
            or not 0 <= print_interval_s < math.inf  # rejects nan, inf and negatives
        ):
            raise ValueError(f"print_interval_s must be None or a number of seconds >= 0, got {print_interval_s!r}")
        if not isinstance(html, bool):
            raise ValueError(f"html must be True or False, got {html!r}")
        return cls(
            # resolved now, so a chdir during training does not move the report
            report_dir=_resolved(Path(report_dir)) if report_dir is not None else None,
            console=console,
            nvml_device=check_nvml_device(nvml_device),
            min_saving=float(min_saving),
            sample_interval_s=float(sample_interval_s),
            recent_steps=recent_steps,
            print_interval_s=None if print_interval_s is None else float(print_interval_s),
            html=html,
        )


def _is_file(path: Path) -> bool:
    """Whether ``path`` names something that is not a folder (the user's mistake, refused). A
    path that cannot even be looked at (a name too long, a symlink loop, no permission) is not:
    like any folder that cannot be written, it costs the report file a note, never the run."""
    try:
        return path.exists() and not path.is_dir()
    except OSError:
        return False


def _resolved(path: Path) -> Path:
    """``path`` made absolute, symlinks resolved where they can be (a loop cannot: then as given,
    made absolute)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop, before Python 3.13
        return Path(os.path.abspath(path))
