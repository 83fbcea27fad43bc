"""Small numeric helpers shared by the rules."""

from __future__ import annotations

import math


def nice_ceil(value: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is >= ``value`` (intervals people pick)."""
    if value <= 1:
        return 1
    exp = math.floor(math.log10(value))
    for mantissa in (1, 2, 5, 10):
        candidate = mantissa * 10**exp
        if candidate >= value - 1e-9:
            return int(candidate)
    return int(10 ** (exp + 1))  # pragma: no cover - the loop always returns


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded for evidence."""
    return round(seconds * 1e3, 3)


def frac(value: float) -> float:
    """A fraction clamped to [0, 1] and rounded for the report."""
    return round(min(1.0, max(0.0, value)), 4)


def nice_floor_fraction(value: float) -> float:
    """The largest of 1, 0.5, 0.25, 0.2, 0.1, 0.05, 0.025, 0.02, 0.01, ... that is <= ``value``
    (fractions people pick); 1.0 for anything from 1 up, at least 1e-6."""
    if value >= 1:
        return 1.0
    scale = 1.0
    while scale > 1e-6:
        for mantissa in (0.5, 0.25, 0.2, 0.1):
            candidate = round(mantissa * scale, 10)
            if candidate <= value + 1e-12:
                return candidate
        scale /= 10
    return 1e-6


def fmt_ms(seconds: float) -> str:
    """A duration in milliseconds for text, with two significant digits below 10 ms ("0.052 ms",
    "3.7 ms", "41 ms"): a measured 0.05 ms never reads "0.0 ms"."""
    value = seconds * 1e3
    if value <= 0:
        return "0 ms"
    if value >= 10:
        return f"{value:.0f} ms"
    decimals = max(1, 1 - math.floor(math.log10(value)))
    return f"{value:.{decimals}f} ms"


def plural(noun: str) -> str:
    """``noun``'s plural, for the nouns fix texts count: "steps", "batches", "epochs", "passes"."""
    return f"{noun}es" if noun.endswith(("tch", "ss", "sh", "x")) else f"{noun}s"


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 ("1 worker", "2 workers")."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural(noun)}"


def every(n: float, noun: str) -> str:
    """How often, from ``n`` (a count, maybe a mean) ``noun``s apart: "every batch", "every 3
    batches", and for less than one, "3 times a step"."""
    if n <= 0:
        return f"every {noun}"
    if n < 0.75:
        return f"{round(1 / n)} times {'an' if noun[:1] in 'aeiou' else 'a'} {noun}"
    return f"every {noun}" if round(n) == 1 else f"every {n:.0f} {plural(noun)}"
