"""The final choice from interleaved re-measurements, and their order (the rules of
``core.stats`` apply to every interval here):

- Final choice, ``choose``: only the interleaved re-measurements count (never the search's trial
  values, which are optimistically biased by selection). A candidate beats the baseline when its
  speedup's lower bound is > 1. Among those the highest speedup point wins (ties: higher lower
  bound, then input order); if none does, the baseline wins: keep the defaults.
- Order, ``interleave``: one round measures every key once; round ``r`` uses row ``r`` of a
  Williams design (a Latin square for k keys, plus its mirror when k is odd), so over k rounds
  each key takes every position once, and over k (even k) or 2k (odd k) rounds each key follows
  every other key equally often. For two keys this is A B B A, which cancels linear drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.core.stats import Interval, median_ci, speedup_ci
from autotune.core.values import ratio_interval

__all__ = ["NO_WINNER_REASON", "Validation", "choose", "interleave"]

NO_WINNER_REASON = "no candidate beat the defaults beyond the noise; keep the defaults"


@dataclass
class Validation:
    """Outcome of the interleaved re-validation (see ``choose``)."""

    winner: str  # a candidate key, or the baseline key
    speedup: Interval  # the winner's speedup vs the baseline (exactly 1 for the baseline)
    beats_baseline: bool
    results: dict[str, dict] = field(default_factory=dict)  # key -> throughput, speedup, beats
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, e.g. for a study user attr."""
        return {
            "winner": self.winner,
            "speedup": self.speedup.to_dict(),
            "beats_baseline": self.beats_baseline,
            "results": self.results,
            "reason": self.reason,
        }


def _fmt(ci: Interval) -> str:
    return ratio_interval(ci.median, ci.low, ci.high, digits=3)


def choose(
    measurements: Mapping[str, Sequence[float]], baseline: str, confidence: float = 0.95
) -> Validation:
    """Pick the configuration to keep from interleaved re-measurements (see module doc).

    ``measurements[key][i]`` is key's throughput in round ``i``; candidates are paired with the
    baseline by round. ``results`` has an entry for every key, the baseline included.
    """
    if baseline not in measurements:
        raise ValueError(f"baseline {baseline!r} not among the measured keys {list(measurements)}")
    base = measurements[baseline]
    base_ci = median_ci(base, confidence)
    one = Interval(1.0, 1.0, 1.0, base_ci.n)
    results: dict[str, dict] = {
        baseline: {
            "throughput": base_ci.to_dict(),
            "speedup": one.to_dict(),
            "beats_baseline": False,
        }
    }
    beating: list[tuple[str, Interval]] = []
    for key, values in measurements.items():
        if key == baseline:
            continue
        sp = speedup_ci(values, base, confidence)
        beats = sp.low > 1.0
        results[key] = {
            "throughput": median_ci(values, confidence).to_dict(),
            "speedup": sp.to_dict(),
            "beats_baseline": beats,
        }
        if beats:
            beating.append((key, sp))
    if not beating:
        return Validation(baseline, one, False, results, NO_WINNER_REASON)
    # max() keeps the first of equal keys, so input order breaks exact ties.
    key, sp = max(beating, key=lambda kv: (kv[1].median, kv[1].low))
    n_cand = len(measurements) - 1
    reason = (
        f"{key}: {_fmt(sp)} vs the defaults ({confidence:.0%} interval, {sp.n} paired rounds); "
        f"{len(beating)} of {n_cand} candidates beat the defaults beyond the noise"
    )
    return Validation(key, sp, True, results, reason)


def _williams_rows(k: int) -> list[list[int]]:
    first = [0]
    lo, hi = 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(x + j) % k for x in first] for j in range(k)]
    if k % 2 == 1:
        rows += [row[::-1] for row in rows]
    return rows


def interleave(keys: Sequence[str], rounds: int) -> list[str]:
    """Measurement order: ``rounds`` rounds, each key once per round, Williams-design rows."""
    if len(set(keys)) != len(keys):
        raise ValueError(f"interleave: duplicate keys in {list(keys)}")
    if rounds < 0:
        raise ValueError(f"interleave: rounds must be >= 0, got {rounds}")
    if not keys:
        return []
    rows = _williams_rows(len(keys))
    return [keys[i] for r in range(rounds) for i in rows[r % len(rows)]]
