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
    """Return ``name`` if it can name a phase, else raise ``ValueError`` naming it."""
    if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 64:
        raise ValueError(f"phase name must be a non-empty printable string of at most 64 characters, got {name!r}")
    return name
