"""The measurement protocol: when timing starts, when it stops, when a trial is pruned, and how
the final configuration is chosen from interleaved re-measurements.

Everything here is a pure, deterministic function of the numbers it is given (no resampling, no
randomness). A *window* is a fixed number of timed steps; it yields one samples/s value.
Repeated runs of one configuration vary by about ±7 % and many configurations differ by less,
so every decision is taken on an interval, never on a single number.

Rules (``n`` = number of windows, ``conf`` = confidence, 0.95 by default):

- Warm-up of a measurement, ``SettleRule.kept_from``: the first ``min_steps`` steps are always
  discarded (CUDA / NCCL init, autotuning, DDP's bucket rebuild, the optimizer's state), then
  timing starts and the first windows settle the rest: window ``j`` is kept, and every window
  after it, once its throughput is no more than ``rel_tol`` below the median of the ``window``
  windows after it; the windows before it were still warming up (slower), and none of them is
  counted. A window faster than the ones after it is noise, not warm-up, and is kept. Until
  a window is kept, each is sized from the one before it where that one's steps ran more
  than a quarter off the size's (the first from the last discarded step), so a long warm-up
  does not leave the windows short; a window sized otherwise than the ones after it is
  warm-up too, so the kept windows all have one size. Once
  the discarded steps and the windows before ``j`` reach ``max_steps``, ``j`` is kept whatever
  follows. A window of steps says as much as a median of steps and costs nothing extra: the
  steps that settle it are measured steps, where the rule it replaces spent two to four steps
  a run on checking (``bench/settle.py`` judges both on recorded steps).
- Warm-up of a limit probe, ``SettleRule.settled_at``: after ``min_steps``, the first step
  index ``i`` at which the median of steps ``[i-window, i)`` differs by at most ``rel_tol``
  (relative) from the median of ``[i-2*window, i-window)``; never later than ``max_steps``
  (``settled_at`` then returns ``max_steps``). The probe times single steps after it.
- Throughput interval, ``median_ci``: the point is the median of the windows (one slow window
  does not move it). If n is large enough for the order-statistic interval ``[x(1), x(n)]`` to
  reach ``conf`` (``1 - 2**(1-n) >= conf``: n >= 6 at 95 %), the interval is the
  Hettmansperger-Sheather interpolated sign-test interval: distribution-free, robust to outlying
  windows, and near-nominal coverage instead of the 97-99 % of raw order statistics. For smaller
  n it is Student's ``mean ± t(conf, n-1)·s/√n``: exact for normal noise, where mean = median,
  and for such small n it always contains the median. One window: ``(-inf, +inf)``; the spread
  is unknown, so one window never stops or prunes anything.
- Stop, ``StopRule.decide``: stop once ``n >= min_windows`` and the interval's half-width is at
  most ``rel_half_width × median`` ("converged"); otherwise stop at ``n >= max_windows`` ("cap").
- Prune, ``PruneRule.should_prune``: once ``n >= min_windows``, prune only if the trial's upper
  bound is below the incumbent × ``(1 - margin)``, where the incumbent counts as its *lower* bound
  when it is an ``Interval``: the two intervals must not overlap, so noise alone rarely prunes.
  With two windows the t-interval (t = 12.7 at 95 %) is wide on purpose: only gross losers go.
  Pass the incumbent as an ``Interval``; a bare number ignores the incumbent's own noise.
  ``PruneRule.hopeless`` acts on the same windows whether they settled or not: windows
  running ``hopeless_factor`` times or more below the incumbent end the trial (stop
  ``hopeless``) before the rest of its warm-up.
- Speedup, ``speedup_ci``: the ratio is estimated on log ratios. Interleaved measurements are
  paired by index (``candidate[i]`` with ``baseline[i]``, same round) so drift common to both
  (thermal, other tenants) cancels: t-interval of the mean log ratio, exponentiated; the point
  (``Interval.median``) is ``exp(mean log ratio)``, the geometric mean of the ratios. Unequal
  lengths or ``paired=False``: Welch's interval for the difference of the mean logs.
- The final choice from interleaved re-measurements and their order: ``core.choice``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.special import stdtrit

from autotune.core import values
from autotune.core.values import PRECISE

__all__ = [
    "Interval",
    "PruneRule",
    "SettleRule",
    "StopRule",
    "median_ci",
    "precise",
    "rounds_to_settle",
    "speedup_ci",
    "speedup_text",
]


_SIG_DIGITS = 6


def _round(x: float) -> float | None:
    """``x`` to 6 significant digits; None for an infinite bound (JSON has no infinity)."""
    if math.isinf(x):
        return None
    return float(f"{x:.{_SIG_DIGITS}g}")


@dataclass(frozen=True)
class Interval:
    """A point estimate (``median``) with a ``[low, high]`` interval from ``n`` values."""

    median: float
    low: float
    high: float
    n: int

    def __post_init__(self) -> None:
        if not self.low <= self.median <= self.high:
            raise ValueError(f"need low <= median <= high, got {self}")

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def rel_half_width(self) -> float:
        """``half_width / median``; inf when the interval is unbounded or the median is 0."""
        hw = self.half_width
        if hw == 0:
            return 0.0
        if math.isinf(hw) or self.median == 0:
            return math.inf
        return hw / abs(self.median)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (6 significant digits; an infinite bound is None) for trial user attrs."""
        rel = self.rel_half_width
        return {
            "median": _round(self.median),
            "low": _round(self.low),
            "high": _round(self.high),
            "n": int(self.n),
            "rel_half_width": None if math.isinf(rel) else round(rel, 6),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Interval:
        """Inverse of ``to_dict`` (None bounds become ∓inf; extra keys are ignored)."""
        low = -math.inf if d["low"] is None else float(d["low"])
        high = math.inf if d["high"] is None else float(d["high"])
        return cls(median=float(d["median"]), low=low, high=high, n=int(d["n"]))


def precise(ci: Interval, within: float = PRECISE) -> bool:
    """Whether ``ci`` lies within +-``within`` of its median (``values.precise``)."""
    return values.precise(ci.median, ci.low, ci.high, within)


def rounds_to_settle(ci: Interval, within: float = PRECISE, most: int = 100) -> int | None:
    """Paired rounds after which an interval of ``ci``'s spread (its ``n`` rounds, its width
    on the log scale ``speedup_ci`` works on) would lie within +-``within``; None when ``ci``
    shows no finite spread, or more than ``most`` would be needed."""
    if ci.n < 2 or not 0 < ci.low <= ci.high < math.inf:
        return None
    sd = math.log(ci.high / ci.low) / 2 * math.sqrt(ci.n) / _t_quantile(0.95, ci.n - 1)
    goal = math.log(1 + within)  # the tighter side: log(1 + w) < -log(1 - w)
    return next(
        (k for k in range(2, most + 1) if _t_quantile(0.95, k - 1) * sd / math.sqrt(k) <= goal),
        None,
    )


def speedup_text(ci: Interval, *, digits: int = 2) -> str:
    """``ci`` as ``values.speedup_interval`` writes a speedup with its interval, saying how
    many rounds would settle one too wide to be a result."""
    settle = None if precise(ci) else rounds_to_settle(ci)
    return values.speedup_interval(ci.median, ci.low, ci.high, ci.n, digits=digits, settle=settle)


def _as_array(samples: Sequence[float], what: str, positive: bool = False) -> np.ndarray:
    x = np.asarray(samples, dtype=float).ravel()
    if x.size == 0:
        raise ValueError(f"{what}: no values")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: values must be finite, got {list(samples)!r}")
    if positive and not np.all(x > 0):
        raise ValueError(f"{what}: values must be positive, got {list(samples)!r}")
    return x


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


@lru_cache(maxsize=1024)
def _t_quantile(confidence: float, df: float) -> float:
    return float(stdtrit(df, 0.5 + confidence / 2))


def _sign_coverage(n: int, d: int) -> float:
    """Coverage of ``[x(d), x(n-d+1)]`` for the median: ``P(d <= B <= n-d)``, B ~ Bin(n, 1/2)."""
    below = sum(math.comb(n, i) for i in range(d)) / 2**n
    return max(0.0, 1.0 - 2.0 * below)


@lru_cache(maxsize=1024)
def _hs_weights(n: int, confidence: float) -> tuple[int, float] | None:
    """``(d, lam)`` of the Hettmansperger-Sheather (1986) interval, or None if n is too small.

    ``d`` is the largest depth whose order-statistic interval covers >= ``confidence``; the
    bounds are interpolated ``lam`` of the way towards depth ``d + 1``.
    """
    if _sign_coverage(n, 1) < confidence:
        return None
    d = 1
    while d + 1 <= n // 2 and _sign_coverage(n, d + 1) >= confidence:
        d += 1
    g_d, g_next = _sign_coverage(n, d), _sign_coverage(n, d + 1)
    frac = (g_d - confidence) / (g_d - g_next) if g_d > g_next else 0.0
    lam = (n - d) * frac / (d + (n - 2 * d) * frac) if frac > 0 else 0.0
    return d, lam


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> Interval:
    """Median of ``samples`` with a ``confidence`` interval for the median (see module doc).

    One sample gives ``(-inf, +inf)``; no sample, or a non-finite one, raises ValueError.
    """
    _check_confidence(confidence)
    x = np.sort(_as_array(samples, "median_ci"))
    n = int(x.size)
    med = float(np.median(x))
    if n == 1:
        return Interval(med, -math.inf, math.inf, 1)
    hs = _hs_weights(n, confidence)
    if hs is not None:
        d, lam = hs  # 1-based depth d: x(d) is x[d - 1]
        low = (1 - lam) * x[d - 1] + lam * x[d]
        high = (1 - lam) * x[n - d] + lam * x[n - d - 1]
    else:
        mean = float(x.mean())
        hw = _t_quantile(confidence, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
        low, high = mean - hw, mean + hw
    return Interval(med, min(float(low), med), max(float(high), med), n)


@dataclass
class SettleRule:
    """Where warm-up ends: in a measurement's windows (``kept_from``), or in a limit probe's
    per-step times (``settled_at``); see module doc."""

    window: int = 5
    rel_tol: float = 0.05
    min_steps: int = 3
    max_steps: int = 200

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_steps < 0 or self.max_steps < 1 or not self.rel_tol > 0:
            raise ValueError(f"invalid {self}")

    @property
    def earliest(self) -> int:
        """The smallest index ``settled_at`` can return: ``min_steps + 2 * window``."""
        return self.min_steps + 2 * self.window

    def kept_from(self, windows: Sequence[float], sizes: Sequence[int]) -> int | None:
        """Index of the first window a measurement keeps (the windows before it are warm-up),
        or None: not known yet. ``windows``: samples/s of each window timed so far, after
        ``min_steps`` discarded steps; ``sizes``: the steps of each (see module doc)."""
        if self.rel_tol >= 1:  # no window can run that far below another: each is kept
            return 0 if windows else None
        w = self.window
        before = self.min_steps  # steps before window j
        for j, rate in enumerate(windows):
            if before >= self.max_steps:
                return j
            after = windows[j + 1 : j + 1 + w]
            if len(after) < w:
                return None
            ref = float(np.median(after))
            if rate >= (1 - self.rel_tol) * ref and set(sizes[j : j + 1 + w]) == {sizes[j]}:
                return j
            before += sizes[j]
        return None

    def settled_at(self, step_times: Sequence[float]) -> int | None:
        """Index of the first timed step (earlier steps are warm-up), or None: not settled yet.

        Returns ``max_steps`` once ``len(step_times) >= max_steps`` without settling earlier.
        """
        t = np.asarray(step_times, dtype=float)
        w = self.window
        last = min(len(t), self.max_steps)
        for i in range(self.earliest, last + 1):
            prev = float(np.median(t[i - 2 * w : i - w]))
            recent = float(np.median(t[i - w : i]))
            if prev > 0 and abs(recent - prev) <= self.rel_tol * prev:
                return i
        return self.max_steps if len(t) >= self.max_steps else None


@dataclass
class StopRule:
    """When a trial has measured enough windows (see module doc)."""

    rel_half_width: float = 0.03
    min_windows: int = 3
    max_windows: int = 12
    confidence: float = 0.95

    def __post_init__(self) -> None:
        _check_confidence(self.confidence)
        if not 1 <= self.min_windows <= self.max_windows or not self.rel_half_width > 0:
            raise ValueError(f"invalid {self}")

    def decide(self, window_throughputs: Sequence[float]) -> tuple[bool, str]:
        """``(True, "converged")``, ``(True, "cap")`` or ``(False, "measuring")``."""
        n = len(window_throughputs)
        if n < self.min_windows:
            return False, "measuring"
        ci = median_ci(window_throughputs, self.confidence)
        if ci.rel_half_width <= self.rel_half_width:
            return True, "converged"
        if n >= self.max_windows:
            return True, "cap"
        return False, "measuring"


@dataclass
class PruneRule:
    """Prune a trial only when it is clearly below the incumbent (see module doc)."""

    min_windows: int = 2
    margin: float = 0.0
    confidence: float = 0.95
    hopeless_factor: float = 4.0

    def __post_init__(self) -> None:
        _check_confidence(self.confidence)
        if self.min_windows < 2 or not 0 <= self.margin < 1 or not self.hopeless_factor > 1:
            raise ValueError(f"invalid {self}")

    def should_prune(
        self, window_throughputs: Sequence[float], incumbent: Interval | float | None
    ) -> bool:
        """True when ``upper(trial) < bar × (1 - margin)``; bar = incumbent's low bound or value."""
        if incumbent is None or len(window_throughputs) < self.min_windows:
            return False
        bar = incumbent.low if isinstance(incumbent, Interval) else float(incumbent)
        if not math.isfinite(bar):
            return False
        trial = median_ci(window_throughputs, self.confidence)
        return trial.high < bar * (1 - self.margin)

    def hopeless(
        self, window_rates: Sequence[float], incumbent: Interval | float | None
    ) -> float | None:
        """How many times slower than the incumbent's low bound the windows so far ran (their
        median, settled or not), once ``min_windows`` ran (an interval needs two), when that
        is ``hopeless_factor`` or more; else None. Such a trial cannot come near the
        incumbent whatever more windows would say (a bf16 step emulated on a CPU ran 20x
        slower), and waiting for its warm-up to settle spent whole trial timeouts. The
        windows follow the discarded first steps (compilation, cuDNN's search, the
        allocator), which are never judged."""
        if incumbent is None or len(window_rates) < self.min_windows:
            return None
        bar = incumbent.low if isinstance(incumbent, Interval) else float(incumbent)
        rate = float(np.median(window_rates))
        if not math.isfinite(bar) or bar <= 0 or rate <= 0:
            return None
        return bar / rate if bar / rate >= self.hopeless_factor else None


def _exp_interval(center: float, hw: float, n: int) -> Interval:
    return Interval(math.exp(center), math.exp(center - hw), math.exp(center + hw), n)


def speedup_ci(
    candidate: Sequence[float],
    baseline: Sequence[float],
    confidence: float = 0.95,
    paired: bool = True,
) -> Interval:
    """Interval for throughput ratio candidate/baseline; ``median`` is exp(mean log ratio).

    Paired by index when ``paired`` and the lengths match (``n`` = pairs), else Welch on the
    logs (``n`` = the smaller sample). Too few values for a spread gives ``(0, inf)``.
    """
    _check_confidence(confidence)
    lc = np.log(_as_array(candidate, "speedup_ci candidate", positive=True))
    lb = np.log(_as_array(baseline, "speedup_ci baseline", positive=True))
    if paired and lc.size == lb.size:
        d = lc - lb
        n = int(d.size)
        if n < 2:
            return _exp_interval(float(d.mean()), math.inf, n)
        hw = _t_quantile(confidence, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
        return _exp_interval(float(d.mean()), hw, n)
    n1, n2 = int(lc.size), int(lb.size)
    center = float(lc.mean() - lb.mean())
    if min(n1, n2) < 2:
        return _exp_interval(center, math.inf, min(n1, n2))
    v1, v2 = float(lc.var(ddof=1)) / n1, float(lb.var(ddof=1)) / n2
    se2 = v1 + v2
    if se2 == 0:
        return _exp_interval(center, 0.0, min(n1, n2))
    df = se2**2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))
    return _exp_interval(center, _t_quantile(confidence, df) * math.sqrt(se2), min(n1, n2))
