"""What a run says while it runs, as typed events; the loop emits them, subscribers show them.

The tuning loop (``search``, ``objective``, ``validation``, ``tuner``) never prints. It calls an
``Emit`` (any callable taking an event) with one of the dataclasses below. The live display
and the plain log (``progress.RunView``) are subscribers; so are tests, which collect events in
a list.

Events may be emitted from any thread (concurrent trials run in threads of their own): a
subscriber that keeps state must be safe to call from several threads, and must not raise.
Text carried by events is plain text, never markup: a gloo error such as
``[/path/pair.cc:537]`` must reach the user as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from autotune.core.stats import Interval

__all__ = [
    "BudgetStarted",
    "Emit",
    "Event",
    "Note",
    "Outcome",
    "ScreeningDone",
    "StudyOpened",
    "TrialFinished",
    "TrialStarted",
    "ValidationDone",
    "ValidationRun",
    "ValidationStarted",
    "ignore",
]


class Outcome(str, Enum):
    """How a trial ended, as the display counts it."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Note:
    """A line of the run's log that belongs to no other event."""

    text: str


@dataclass(frozen=True, kw_only=True)
class StudyOpened:
    """The study is open: new or resumed, what it searches and what it leaves out."""

    name: str
    created: bool
    trials: int
    """Trials the study held when it was opened."""
    dimensions: list[str]
    left_out: list[str] = field(default_factory=list)
    """Knobs left out on this backend/device, each with its reason."""
    closed: list[int] = field(default_factory=list)
    """Trials left RUNNING by a driver that died, closed now as FAIL (interrupted)."""


@dataclass(frozen=True, kw_only=True)
class BudgetStarted:
    """The search starts (just before the first trial); the budget's clock started
    ``spent_s`` ago (with the command: Ray's start and the placement count)."""

    budget_s: float
    spent_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TrialStarted:
    """A trial (or a re-validation run) starts measuring."""

    tag: str
    """``baseline``, ``trial N``, or ``re-validating trial N``."""
    changes: dict[str, Any]
    """The settings that differ from the defaults."""


@dataclass(frozen=True, kw_only=True)
class TrialFinished:
    """A search trial ended."""

    tag: str
    number: int
    outcome: Outcome
    elapsed_s: float
    """Seconds since the budget started."""
    changes: dict[str, Any]
    throughput: float | None = None
    """Samples/s, the median window (None when it failed)."""
    rel_half_width: float | None = None
    """Half-width of the throughput's 95 % interval over its median."""
    windows: int = 0
    speedup: float | None = None
    """Against the baseline; None when it failed or no baseline is measured yet."""
    reason: str | None = None
    """Why it failed (a ``FailureReason`` value)."""
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class ValidationStarted:
    """Re-validation of ``candidates`` against the baseline, interleaved."""

    candidates: list[str]
    rounds: int
    runs: int


@dataclass(frozen=True, kw_only=True)
class ValidationRun:
    """One re-validation run of ``key`` (``baseline`` or ``trial N``) ended."""

    key: str
    throughput: float | None = None
    rel_half_width: float | None = None
    failure: str | None = None
    """``reason: detail`` when the run failed."""


@dataclass(frozen=True, kw_only=True)
class ValidationDone:
    """Re-validation ended: the choice, or why there is none (``winner`` None)."""

    winner: str | None
    beats_baseline: bool = False
    speedup: Interval | None = None
    """The winner's speedup over the defaults, paired by round."""
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ScreeningDone:
    """Every screening trial has ended (``autotune.search.screening``): each prior's measured
    effect,
    and the labels combined into the next trial (empty: fewer than two helped)."""

    effects: list[dict[str, Any]]
    """Per prior: ``label``, ``trial``, ``state``, ``speedup`` (None unless COMPLETE),
    ``interval`` of the trial's throughput, ``helps``."""
    combined: list[str] = field(default_factory=list)


Event = (
    Note
    | ScreeningDone
    | StudyOpened
    | BudgetStarted
    | TrialStarted
    | TrialFinished
    | ValidationStarted
    | ValidationRun
    | ValidationDone
)
#: A subscriber: called with each event.
Emit = Callable[[Event], None]


def ignore(event: Any) -> None:
    """The subscriber that shows nothing."""
