"""Which phase the GPU was busy in: aligning utilization samples with the timeline.

NVML reports utilization per sample period (the share of the period in which a kernel ran); the
timeline knows which phase the loop was in. The sampler thread reads the timeline's ``probe`` at
each tick, so nothing runs on the training thread. Two consecutive probes split the time between
them into at most two *segments*: the stretch in which the loop changed phase (known only as time
per phase, from the totals) and the stretch since the last change, wholly in one phase.
Utilization samples are spread over the segments they overlap; a segment no later sample can
reach is folded into the tallies, so only a handful are ever pending.

Per phase, utilization ``u_p`` is estimated by weighted least squares over the samples::

    util(sample) ~ sum_p share_p(sample) * u_p

When every sample lies in one phase this is the plain mean per phase; when phases change within
a sample period, samples with different mixes still separate the ``u_p``. A phase is reported
only when its standard error is small: a phase that only ever appears in the same mix (phases
much shorter than NVML's sample period, 1/6 s to 1 s) cannot be told apart and is left out
rather than given a blended number. Only running sums are kept: memory is bounded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from stallscope.timeline.recorder import PhaseProbe

#: ridge weight pulling each phase's estimate toward its share-weighted mean (numerical safety)
RIDGE = 0.001
#: a phase's utilization is reported when its standard error is at most this, and when the
#: mixes of phases in the samples inflate its variance at most this much over samples wholly
#: inside the phase (noise in real utilization is not the independent noise the error assumes)
MAX_STDERR = 0.08
MAX_INFLATION = 25.0
#: a phase needs this share of the correlated time to get a utilization of its own
MIN_PHASE_SHARE = 0.005
#: samples whose phase shares are known exactly for less than this share are left out of the fit
MIN_EXACT = 0.5
#: a sample counts as lying in one phase when that phase has at least this share of it
PURE_SHARE = 0.95


@dataclass(frozen=True)
class Segment:
    """A stretch of time with known time shares per phase."""

    start_ns: int
    end_ns: int
    #: (phase id, share of the segment) pairs, shares summing to 1
    shares: tuple[tuple[int, float], ...]


def split(a: PhaseProbe, b: PhaseProbe) -> list[Segment]:
    """The segments between probe ``a`` and the later probe ``b``."""
    if b.now_ns <= a.now_ns:
        return []
    if b.since_ns <= a.now_ns:  # no change of phase since ``a``
        return [Segment(a.now_ns, b.now_ns, ((b.phase, 1.0),))]
    n = max(len(a.totals_ns), len(b.totals_ns), a.phase + 1)
    before = list(a.totals_ns) + [0] * (n - len(a.totals_ns))
    after = list(b.totals_ns) + [0] * (n - len(b.totals_ns))
    delta = [after[i] - before[i] for i in range(n)]
    delta[a.phase] -= a.now_ns - a.since_ns  # credited to a.phase, but before ``a`` was taken
    total = sum(d for d in delta if d > 0)
    shares = tuple((i, d / total) for i, d in enumerate(delta) if d > 0) if total > 0 else ((b.phase, 1.0),)
    segments = [Segment(a.now_ns, b.since_ns, shares)]
    if b.now_ns > b.since_ns:
        segments.append(Segment(b.since_ns, b.now_ns, ((b.phase, 1.0),)))
    return segments


class UtilTally:
    """Running sums of utilization over one window: overall and per phase."""

    def __init__(self) -> None:
        #: utilization samples seen
        self.samples = 0
        #: samples per whole percent (0..100), for percentiles
        self.hist = [0] * 101
        #: time the samples cover, ns
        self.sample_ns = 0
        #: utilization x period summed, ns
        self.busy_ns = 0.0
        # normal equations of the per-phase fit, weighted by covered time (ns)
        self.gram: dict[tuple[int, int], float] = {}
        self.rhs: dict[int, float] = {}
        self.weight: dict[int, float] = {}
        #: time folded from single-phase segments, ns
        self.pure_ns = 0.0
        #: time of all samples in the fit, ns
        self.fitted_ns = 0.0
        #: weighted sum of squared utilization and number of samples in the fit (standard errors)
        self.yy = 0.0
        self.rows = 0

    def add_sample(self, util: float, period_ns: int) -> None:
        util = min(1.0, max(0.0, util))
        self.samples += 1
        self.hist[round(util * 100)] += 1
        self.sample_ns += period_ns
        self.busy_ns += util * period_ns

    def add_row(self, shares: dict[int, float], weight_ns: float, util: float, *, exact: float = 1.0) -> None:
        """One sample for the per-phase fit: it covered ``weight_ns`` with these phase shares, of
        which the share ``exact`` is known exactly. Shares spread evenly over a stretch in which
        the loop changed phase several times are only approximate and would bias the fit toward
        the mean, so such samples weigh less, and not at all below ``MIN_EXACT``."""
        if weight_ns <= 0 or exact < MIN_EXACT:
            return
        w = float(weight_ns) * exact * exact
        y = min(1.0, max(0.0, util))
        items = sorted(shares.items())
        for i, (p, sp) in enumerate(items):
            self.weight[p] = self.weight.get(p, 0.0) + w * sp
            self.rhs[p] = self.rhs.get(p, 0.0) + w * sp * y
            for q, sq in items[i:]:
                self.gram[(p, q)] = self.gram.get((p, q), 0.0) + w * sp * sq
        self.fitted_ns += w
        self.yy += w * y * y
        self.rows += 1
        if max(shares.values()) >= PURE_SHARE:
            self.pure_ns += w

    # -- results -------------------------------------------------------------------------

    def mean(self) -> float | None:
        """Time-weighted mean utilization, None without samples."""
        return self.busy_ns / self.sample_ns if self.sample_ns > 0 else None

    def quantile(self, q: float) -> float | None:
        """The utilization below which a share ``q`` of the samples lie (whole percents)."""
        if self.samples == 0:
            return None
        rank = q * (self.samples - 1)
        seen = 0
        for percent, count in enumerate(self.hist):
            seen += count
            if seen > rank:
                return percent / 100
        return 1.0  # pragma: no cover - the loop always returns

    def resolution(self) -> float | None:
        """Share of the correlated time that lay wholly in one phase (1.0: no mixing at all)."""
        return self.pure_ns / self.fitted_ns if self.fitted_ns > 0 else None

    def by_phase(self) -> dict[int, float]:
        """Estimated utilization per phase id, for phases it can be told for (see module doc)."""
        total = sum(self.weight.values())
        if total <= 0:
            return {}
        phases = sorted(p for p, w in self.weight.items() if w > 0)
        n = len(phases)
        index = {p: i for i, p in enumerate(phases)}
        a = [[0.0] * n for _ in range(n)]
        for (p, q), g in self.gram.items():
            if p in index and q in index:
                a[index[p]][index[q]] += g
                if p != q:
                    a[index[q]][index[p]] += g
        gram = [row[:] for row in a]  # without the ridge, for the standard errors
        b = [self.rhs.get(p, 0.0) for p in phases]
        for p, i in index.items():
            a[i][i] += RIDGE * self.weight[p]
            b[i] *= 1.0 + RIDGE  # the ridge pulls toward the mean rhs/weight
        u = _solve(a, b)
        if u is None:  # cannot happen with the ridge term
            return {}
        # standard errors, with the weights rescaled to sample counts
        scale = self.rows / self.fitted_ns if self.fitted_ns > 0 else 0.0
        rss = self.yy - 2 * sum(u[i] * b[i] / (1.0 + RIDGE) for i in range(n))
        rss += sum(
            u[i] * self.gram.get((p, q), 0.0) * u[index[q]] * (1 if p == q else 2)
            for p, i in index.items()
            for q in phases
            if p <= q
        )
        sigma2 = max(rss, 0.0) * scale / max(1, self.rows - n)
        out: dict[int, float] = {}
        for p, i in index.items():
            if self.weight[p] < MIN_PHASE_SHARE * total:
                continue
            unit = [1.0 if j == i else 0.0 for j in range(n)]
            column = _solve(gram, unit)
            if column is None or scale <= 0:
                continue
            # variance inflation: how much worse than samples wholly inside phase p the mixes are
            inflation = column[i] * self.weight[p]
            if inflation <= MAX_INFLATION and sigma2 * column[i] / scale <= MAX_STDERR**2:
                out[p] = min(1.0, max(0.0, u[i]))
        return out


def _solve(a: list[list[float]], r: list[float]) -> list[float] | None:
    """Solve ``a x = r`` by Gaussian elimination with partial pivoting; None when singular."""
    n = len(r)
    m = [row[:] + [r[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for row in m for v in row[:n])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(col + 1, n):
            f = m[i][col] / m[col][col]
            if f:
                for j in range(col, n + 1):
                    m[i][j] -= f * m[col][j]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x


class PhaseCorrelator:
    """Turns probes into segments and tells each utilization sample its phase shares (sampler thread)."""

    def __init__(self, *, max_segments: int = 256) -> None:
        self._last: PhaseProbe | None = None
        self._segments: deque[Segment] = deque(maxlen=max_segments)

    @property
    def segments(self) -> int:
        return len(self._segments)

    def observe(self, probe: PhaseProbe) -> None:
        """A new probe: the time since the previous one becomes segments."""
        if self._last is not None:
            self._segments.extend(split(self._last, probe))
        self._last = probe

    def shares(self, start_ns: int, end_ns: int) -> tuple[dict[int, float], int, float]:
        """Phase shares of ``(start_ns, end_ns]``, how much of it the segments cover (ns), and how
        much of that lies in single-phase segments, whose shares are exact (0..1).

        Samples come in time order, so segments that end before this one starts are dropped.
        """
        segments = self._segments
        while segments and segments[0].end_ns <= start_ns:
            segments.popleft()
        out: dict[int, float] = {}
        covered = 0
        exact = 0
        for seg in segments:
            if seg.start_ns >= end_ns:
                break
            overlap = min(end_ns, seg.end_ns) - max(start_ns, seg.start_ns)
            if overlap <= 0:
                continue
            covered += overlap
            if len(seg.shares) == 1:
                exact += overlap
            for p, share in seg.shares:
                out[p] = out.get(p, 0.0) + share * overlap
        if covered <= 0:
            return {}, 0, 0.0
        return {p: v / covered for p, v in out.items()}, covered, exact / covered
