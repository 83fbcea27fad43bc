"""The statistics of the CI gate: Student's t, the healthy runs' bound, the block bootstrap.

Pure and deterministic (the bootstrap takes a seed); ``stallscope.analysis.regression`` turns
them into a verdict and docs/ci-gate.md explains the choices.

*Prediction bound* (several baseline runs): ``n`` healthy runs with idle fractions of mean ``m`` and
sample standard deviation ``s``. If healthy runs scatter normally, one more healthy run lies below
``m + t(q, n - 1) * s * sqrt(1 + 1/n)`` with probability ``q`` exactly (``t(q, df)`` is Student's
t quantile), whatever the true spread: the bound pays for estimating the spread from few runs.

*Paired bound* (base and head runs interleaved on one machine): the differences ``d_i`` of ``n``
pairs; a one-sided paired t-test at level ``1 - q`` calls the mean difference real when it is above
``t(q, n - 1) * s_d / sqrt(n)``.

*Moving-block bootstrap* (the windows inside runs): neighbouring idle windows are correlated (a slow
stretch spans several), so resampling single windows understates the uncertainty of a run's mean.
Each run's windows are resampled in blocks of ``L`` neighbours (circularly, so every window is
equally likely), ``L = round(k ** (1/3))`` for ``k`` windows (the usual rate for block bootstraps);
``L = 1`` is the ordinary bootstrap, ``L = k`` returns the run's own mean every time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

#: bootstrap resamples and the coverage of its interval
RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0


# -- Student's t -----------------------------------------------------------------------------


def t_central(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` (integer >= 1) degrees of freedom, ``t >= 0``.

    The closed forms for integer ``df`` (Abramowitz & Stegun 26.7.3 and 26.7.4): with
    ``theta = atan(t / sqrt(df))`` and ``c = cos(theta) ** 2``, a finite series in ``c``.
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df!r}")
    theta = math.atan(t / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    c = cos * cos
    if df % 2 == 0:  # sin(theta) * (1 + 1/2 c + 1*3/(2*4) c^2 + ... up to c^((df-2)/2))
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c * (2 * k - 1) / (2 * k)
            total += term
        return sin * total
    if df == 1:
        return 2.0 * theta / math.pi
    # odd: 2/pi * (theta + sin cos (1 + 2/3 c + 2*4/(3*5) c^2 + ... up to c^((df-3)/2)))
    term, total = 1.0, 1.0
    for k in range(1, (df - 1) // 2):
        term *= c * (2 * k) / (2 * k + 1)
        total += term
    return 2.0 / math.pi * (theta + sin * cos * total)


def t_quantile(q: float, df: int) -> float:
    """The ``q``-quantile (``0.5 <= q < 1``) of Student's t with ``df`` degrees of freedom."""
    if not 0.5 <= q < 1.0:
        raise ValueError(f"q must be in [0.5, 1), got {q!r}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df!r}")
    target = 2.0 * q - 1.0  # P(|T| < t)
    low, high = 0.0, 1.0
    while t_central(high, df) < target:
        high *= 2.0
    for _ in range(100):  # bisection: the CDF is increasing
        mid = (low + high) / 2.0
        if t_central(mid, df) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


# -- the runs' spread ------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """How much repeated runs scatter, and the line a regression has to cross.

    For baseline runs ``values`` are their idle fractions and ``bound`` an idle fraction (the
    prediction bound for one more healthy run); for pairs ``values`` are the differences head
    minus base and ``bound`` a mean difference. ``sd`` needs two values, the bound three.
    """

    values: tuple[float, ...]
    mean: float
    #: sample standard deviation (n - 1 in the denominator); None for a single value
    sd: float | None
    #: coverage of the bound: 1 - the false-alarm rate it allows
    quantile: float
    #: Student's t quantile at ``quantile`` with n - 1 degrees of freedom; None below 3 values
    t: float | None
    #: what multiplies ``sd``: t * sqrt(1 + 1/n) (prediction) or t / sqrt(n) (paired)
    factor: float | None
    bound: float | None

    @property
    def n(self) -> int:
        return len(self.values)


def _mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def prediction_spread(values: Sequence[float], quantile: float) -> Spread:
    """The baseline runs' spread and the one-sided prediction bound for one more healthy run."""
    if not values:
        raise ValueError("prediction_spread needs at least one value")
    mean, sd = _mean_sd(values)
    n = len(values)
    t = factor = bound = None
    if n >= 3 and sd is not None:
        t = t_quantile(quantile, n - 1)
        factor = t * math.sqrt(1.0 + 1.0 / n)
        bound = mean + factor * sd
    return Spread(tuple(values), mean, sd, quantile, t, factor, bound)


def paired_spread(differences: Sequence[float], quantile: float) -> Spread:
    """The pairs' differences and the mean difference a one-sided paired t-test calls real."""
    if not differences:
        raise ValueError("paired_spread needs at least one difference")
    mean, sd = _mean_sd(differences)
    n = len(differences)
    t = factor = bound = None
    if n >= 3 and sd is not None:
        t = t_quantile(quantile, n - 1)
        factor = t / math.sqrt(n)
        bound = factor * sd
    return Spread(tuple(differences), mean, sd, quantile, t, factor, bound)


# -- the windows inside runs -----------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One idle window as the bootstrap sees it."""

    idle_fraction: float
    #: the window's weight in a run's mean: its wall time (or 1 when unknown)
    weight: float


@dataclass(frozen=True)
class Interval:
    """A block-bootstrap percentile interval of the increase (current minus baseline)."""

    low: float
    high: float
    confidence: float
    resamples: int
    seed: int
    #: windows in the current run(s) and in the baseline run(s), all together
    current_windows: int
    baseline_windows: int
    #: the longest block of neighbouring windows resampled together
    block_windows: int = 1

    @property
    def above_zero(self) -> bool:
        return self.low > 0.0


def weighted_mean(windows: Sequence[Window]) -> float:
    total = sum(w.weight for w in windows)
    return sum(w.idle_fraction * w.weight for w in windows) / total if total > 0 else 0.0


def block_length(windows: int) -> int:
    """The block length for ``windows`` windows: ``round(windows ** (1/3))``, at least 1."""
    root: float = windows ** (1.0 / 3.0)
    return max(1, round(root))


def _block_resample_mean(run: Sequence[tuple[float, float]], block: int, rng: random.Random) -> float:
    """The weighted mean of one circular block resample of ``run`` ((idle * weight, weight) pairs)."""
    k = len(run)
    num = den = 0.0
    taken = 0
    while taken < k:
        start = rng.randrange(k)
        for j in range(min(block, k - taken)):
            part, weight = run[(start + j) % k]
            num += part
            den += weight
        taken += min(block, k - taken)
    return num / den if den > 0 else 0.0


def bootstrap_increase(
    current: Sequence[Sequence[Window]],
    baseline: Sequence[Sequence[Window]],
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
    block: int | None = None,
) -> Interval:
    """Percentile interval of ``mean(current runs) - mean(baseline runs)`` by a moving-block bootstrap.

    Each argument is a list of runs, each run its windows. Every run is resampled on its own, in
    circular blocks of ``block`` neighbouring windows (default: ``block_length`` of its window
    count; never longer than the run); a side's value is the mean of its runs' weighted means.
    """
    runs = [list(r) for r in current], [list(r) for r in baseline]
    if not runs[0] or not runs[1] or any(not r for side in runs for r in side):
        raise ValueError("bootstrap_increase needs at least one window in each run")
    if block is not None and block < 1:
        raise ValueError(f"block must be >= 1, got {block!r}")
    rng = random.Random(seed)
    pairs = [[[(w.idle_fraction * w.weight, w.weight) for w in r] for r in side] for side in runs]
    blocks = [[min(len(r), block or block_length(len(r))) for r in side] for side in runs]

    def side_mean(side: int) -> float:
        means = [_block_resample_mean(r, b, rng) for r, b in zip(pairs[side], blocks[side], strict=True)]
        return sum(means) / len(means)

    diffs = sorted(side_mean(0) - side_mean(1) for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0
    low = diffs[max(0, math.floor(tail * resamples))]
    high = diffs[min(resamples - 1, math.ceil((1.0 - tail) * resamples) - 1)]
    return Interval(
        low=low,
        high=high,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        current_windows=sum(len(r) for r in runs[0]),
        baseline_windows=sum(len(r) for r in runs[1]),
        block_windows=max(max(b) for b in blocks),
    )
