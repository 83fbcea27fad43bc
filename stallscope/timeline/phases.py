"""The phase vocabulary of SPEC §2."""

from __future__ import annotations

DATA = "data"
H2D = "h2d"
COMPUTE = "compute"
LOGGING = "logging"
CHECKPOINT = "checkpoint"
VALIDATION = "validation"
OTHER = "other"

#: Built-in phases, in report order. Any other name is allowed and counts as host work.
BUILTIN_PHASES: tuple[str, ...] = (DATA, H2D, COMPUTE, LOGGING, CHECKPOINT, VALIDATION, OTHER)


def check_phase_name(name: object) -> str:
    """Return ``name`` if it can name a phase (any non-empty string), else raise ``ValueError``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"phase name must be a non-empty string, got {name!r}")
    return name
