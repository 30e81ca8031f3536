"""Typed results of a trial: ``TrialResult`` over each rank's ``RankResult``
(``autotune.rank.measure``).

The launcher builds a ``TrialResult`` from what the ranks return; the objective reads it to
score the trial and write its attributes; re-validation reads its throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from autotune.core.rank_io import RankResult
from autotune.core.stats import Interval, median_ci

__all__ = ["RankResult", "TrialResult"]


@dataclass
class TrialResult:
    """One trial's measurement, put together from its ranks."""

    ranks: list[RankResult]
    """Each rank's result, in rank order."""
    wall_s: float
    """Seconds from launching the ranks to having every result."""

    @property
    def windows(self) -> list[float]:
        """Samples/s over all ranks per timed window (the slowest rank's time; every rank
        holds the same list)."""
        return self.ranks[0].windows

    @cached_property
    def interval(self) -> Interval:
        """Median of the windows with its 95 % interval."""
        return median_ci(self.windows)

    @property
    def throughput(self) -> float:
        """Samples/s over all ranks: the median window."""
        return self.interval.median

    @property
    def pruned(self) -> bool:
        return self.ranks[0].stop in ("pruned", "hopeless")

    @property
    def window_s(self) -> float:
        """Seconds inside timed windows."""
        return self.ranks[0].window_s

    @property
    def step_time_s(self) -> float:
        """Seconds per optimizer step at the median throughput."""
        samples_per_step = sum(r.samples for r in self.ranks) / self.ranks[0].steps
        return samples_per_step / self.throughput

    @property
    def kept(self) -> bool:
        """Whether the run measured on sessions its ranks kept from an earlier run of the
        configuration (``RankSpec.keep``)."""
        return self.ranks[0].session_runs > 1

    @property
    def overhead_s(self) -> float:
        """Seconds outside timed windows: process start and imports (fresh ranks only),
        process group, model, warm-up, and the result's way back."""
        return max(0.0, self.wall_s - self.window_s)

    @property
    def peak_memory_mb(self) -> float:
        """The largest peak memory of a rank."""
        return max(r.peak_memory_mb for r in self.ranks)

    @property
    def warmup_s(self) -> float:
        """Warm-up seconds of the slowest rank."""
        return max(r.warmup_s for r in self.ranks)

    @property
    def init_s(self) -> float:
        """Seconds before warm-up on the slowest rank: process group, model, DDP, DataLoader
        (and process start for fresh ranks, as far as the rank sees it)."""
        return max(r.setup_s - r.warmup_s for r in self.ranks)
