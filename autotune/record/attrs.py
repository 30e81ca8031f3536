"""The study-level records autotune stores on an Optuna study, one dataclass each, with the
attribute that holds it; ``save`` writes one, ``load`` reads it back type-checked
(``record.typed``): a study may be someone else's or an older autotune's, and a record that
is not what autotune writes is a ``RecordError`` naming the attribute and the field.

| attribute | record | written by |
| --- | --- | --- |
| ``autotune`` | ``RunRecord`` | ``search.opening.open_study`` |
| ``first_measurement`` | ``FirstMeasurement`` | ``search.first_look`` |
| ``screening`` | ``{label: ScreenEffect}`` | ``search.screening`` |
| ``stop`` | ``StopRecord`` | ``search.loop`` |
| ``validation`` | ``ValidationRecord`` | ``search.validation`` |
| ``ablation`` | ``AblationRecord`` | ``search.ablation`` |
| ``limit`` | ``LimitRecord`` | ``limit.probe`` |

Attribute names and field names are the ones earlier releases wrote: older and shared studies
and the optuna-dashboard read them as they were.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.core.stats import Interval, precise, speedup_text
from autotune.definition.durations import format_duration
from autotune.record.typed import RecordError, read, write

if TYPE_CHECKING:
    import optuna

__all__ = [
    "ATTRS",
    "STOP_KINDS",
    "AblationRecord",
    "ArmRecord",
    "AsIsRecord",
    "Contribution",
    "FirstMeasurement",
    "IntervalRecord",
    "JointCheck",
    "LimitRecord",
    "RunRecord",
    "ScreenEffect",
    "StopRecord",
    "ValidationRecord",
    "load",
    "load_readable",
    "load_screening",
    "save",
    "save_screening",
]

R = TypeVar("R")

STOP_KINDS = (
    "budget",
    "converged",
    "n_trials",
    "patience",
    "grid",
    "interrupted",
    "cluster_lost",
    "error",
)


@dataclass(frozen=True, kw_only=True)
class IntervalRecord:
    """A stored ``stats.Interval`` (``Interval.to_dict``): an unbounded side is None."""

    median: float
    low: float | None
    high: float | None
    n: int
    rel_half_width: float | None = None

    def interval(self) -> Interval:
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        return Interval(median=self.median, low=low, high=high, n=self.n)

    def triple(self) -> list[float | None]:
        """``[low, median, high]``, as the profile lists a speedup."""
        return [self.low, self.median, self.high]


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """The run's own record (attribute ``autotune``): a study without it is not autotune's."""

    version: int = 1
    workload: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    space: dict[str, Any] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class FirstMeasurement:
    """The limit probe of the defaults right after the baseline: the evidence the screening is
    ordered by (``limit.evidence.Evidence.to_attrs``, checked again by ``Evidence``) and the
    probe's own record (``limit.probe.probe_one``)."""

    evidence: dict[str, Any]
    probe: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ScreenEffect:
    """One screened prior: its trial, how that ended, its speedup over the defaults (None when
    it did not end with a measurement) and whether it helps beyond ``screening.HELPS``. A
    prior screened on top of a lever (``on_top``: the lever's label) helps by its ``gain``
    over the lever's trial."""

    label: str
    trial: int
    state: str
    speedup: float | None
    interval: IntervalRecord | None = None
    helps: bool = False
    moves: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    on_top: str | None = None
    gain: float | None = None


@dataclass(frozen=True, kw_only=True)
class StopRecord:
    """Why the search stopped (attribute ``stop``; ``search.stop``)."""

    kind: str
    why: str
    """One line, for people."""
    at_s: float
    """Seconds of the budget used when the search stopped."""
    budget_s: float
    kept_s: float = 0.0
    """Of the budget left then, the seconds kept for what follows the search."""

    def __post_init__(self) -> None:
        if self.kind not in STOP_KINDS:
            raise RecordError(
                f"stop record: kind {self.kind!r} is not one of {', '.join(STOP_KINDS)}"
            )
        for name in ("at_s", "budget_s", "kept_s"):  # stored to the hundredth of a second
            object.__setattr__(self, name, round(getattr(self, name), 2))

    @property
    def left_s(self) -> float:
        return max(self.budget_s - self.at_s, 0.0)

    def line(self) -> str:
        at, budget = format_duration(round(self.at_s)), format_duration(round(self.budget_s))
        return f"Search stopped at {at} of {budget}: {self.why}"

    def to_attrs(self) -> dict[str, Any]:
        """As stored (``save``)."""
        return write(self)

    @classmethod
    def from_attrs(cls, raw: object) -> StopRecord:
        """A stored record read back and checked (a study may be someone else's)."""
        return read(cls, raw, "stop")


@dataclass(frozen=True, kw_only=True)
class ArmRecord:
    """One arm of the re-validation (``stats.choose``): its throughput and its speedup over
    the defaults, paired by round."""

    throughput: IntervalRecord
    speedup: IntervalRecord
    beats_baseline: bool


def _x(ci: IntervalRecord) -> str:
    """``1.59x [1.50, 1.68]``, or why it is no result (``stats.speedup_text``)."""
    return speedup_text(ci.interval())


@dataclass(frozen=True, kw_only=True)
class AsIsRecord:
    """The user's job as it runs today (the defaults without the allocator pin, with
    torchrun's threads), measured in re-validation against the pinned defaults and the winner,
    interleaved, every arm in new processes (``search.validation``); or why it was not
    (``reason``, and no figures)."""

    reason: str = ""
    rounds: int = 0
    order: list[str] = field(default_factory=list)
    measurements: dict[str, list[float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)
    """What autotune's defaults add to the job as it runs today."""
    pinned: dict[str, bool | None] = field(default_factory=dict)
    """Per arm: whether its rank processes read glibc's allocator back as pinned (None: not
    read: script mode, or no glibc 2.33)."""
    today: IntervalRecord | None = None
    """The winner over the job as it runs today, paired by round."""
    pin: IntervalRecord | None = None
    """The pinned defaults over the job as it runs today: what ``changes`` alone give."""
    timed_s: float = 0.0

    def line(self, knobs: IntervalRecord | None) -> str:
        """One line for people: the speedup over the job as it runs today, the part of it
        autotune's defaults give (``pin``), and the part the tuned knobs give (``knobs``: the
        re-validation's winner over the defaults; None when the defaults won); or why there
        is none."""
        if self.reason:
            return f"your job as it runs today: {self.reason}"
        of = " and ".join(self.changes) or "the allocator pin"
        tuned = "" if knobs is None else f", {_x(knobs)} from the tuned knobs"
        if self.pin is None:
            why = "; ".join(f"{k}: {v}" for k, v in self.failed.items())
            return f"your job as it runs today: the defaults' runs failed ({why})"
        shown = self.pin if self.today is None else self.today
        if not precise(shown.interval()):  # no headline figure (``stats.speedup_text``)
            return f"your job as it runs today: {_x(shown)}"
        if self.today is None or self.today == self.pin:
            alone = "" if self.today is not None else " (the winner's runs failed)"
            return f"{_x(self.pin)} your job as it runs today, from {of}{alone}{tuned}"
        head = f"{_x(self.today)} your job as it runs today"
        return f"{head} (of which {of} {_x(self.pin)}){tuned}"


@dataclass(frozen=True, kw_only=True)
class ValidationRecord:
    """The last re-validation (attribute ``validation``; ``search.validation``)."""

    winner: str
    speedup: IntervalRecord
    beats_baseline: bool
    results: dict[str, ArmRecord]
    reason: str
    trials: dict[str, int]
    order: list[str]
    measurements: dict[str, list[float]]
    failed: dict[str, str] = field(default_factory=dict)
    timed_s: float = 0.0
    after_trial: int = 0
    as_is: AsIsRecord | None = None
    """The user's job as it runs today, measured against the defaults and the winner."""
    earlier: dict[str, int] = field(default_factory=dict)
    """Candidates an earlier re-validation of the run measured and did not bear out, before
    the search resumed with the time it left (``search.assembly``), by key and trial."""

    def __post_init__(self) -> None:
        for key in (self.winner, "baseline"):
            if key not in self.results or key not in self.trials:
                raise RecordError(f"study record validation: {key!r} has no result or trial")
        if "baseline" not in self.measurements:
            raise RecordError("study record validation: the defaults' runs are missing")


@dataclass(kw_only=True)
class Contribution:
    """One knob of the ablated winner: its value, the winner's speedup over itself without
    it (``[low, median, high]``, when measured), and whether the profile keeps it."""

    value: Any
    kept: bool
    speedup: list[float] | None = None
    why: str | None = None


@dataclass(frozen=True, kw_only=True)
class JointCheck:
    """The knobs the ablation would drop, measured dropped together against the winner."""

    knobs: list[str]
    kept_back: bool
    why: str = ""
    speedup: list[float] | None = None
    rounds: int | None = None
    measurements: dict[str, list[float]] | None = None
    timed_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class AblationRecord:
    """The ablation of the re-validated winner (attribute ``ablation``; ``search.ablation``)."""

    trial: int
    rounds: int
    order: list[str]
    measurements: dict[str, list[float]]
    contributions: dict[str, Contribution]
    dropped: list[str]
    together: bool
    joint: JointCheck | None
    params: dict[str, Any]
    config: dict[str, Any]
    timed_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class LimitRecord:
    """The limit probes at the end of a run (attribute ``limit``; ``limit.probe``): of the
    defaults and of the tuned configuration, each the probe's record or ``{"trial",
    "failed"}``, and what the probes cost."""

    baseline: dict[str, Any] | None = None
    tuned: dict[str, Any] | None = None
    cost_s: float | None = None

    def probes(self) -> dict[str, dict[str, Any]]:
        """The probes it holds by label (``limit.probe.summary_line`` reads this form): each a
        failed probe's record or one whose figures are all there, of their types; a probe
        record that is neither (a crafted study) is left out (``problems`` says why)."""
        return {k: v for k, v in self._labelled() if _probe_problem(v) is None}

    def problems(self) -> list[str]:
        """Why each probe record that ``probes`` leaves out could not be read."""
        return [f"{k}: {why}" for k, v in self._labelled() if (why := _probe_problem(v))]

    def _labelled(self) -> list[tuple[str, dict[str, Any]]]:
        return [(k, v) for k, v in (("baseline", self.baseline), ("tuned", self.tuned)) if v]


#: A probe's figures (``limit.probe.bounds``): numbers, the two that may be None apart.
_BOUNDS = (
    "samples_per_s",
    "compute_ceiling",
    "ideal_bound",
    "share_of_ceiling",
    "share_of_ideal",
    "comm_share",
    "exposed_comm_share",
)
_BOUNDS_OPTIONAL = ("hidden_share", "busbw_gbit_s")
#: A probe's breakdown of the step (``limit.probe.breakdown``), in seconds.
_PARTS = ("data", "forward", "backward", "exposed_comm", "optimizer")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _probe_problem(rec: Any) -> str | None:
    """Why ``rec`` is not a probe record autotune writes (None: it is one, or a failed one)."""
    if not isinstance(rec, dict):
        return f"not a mapping ({type(rec).__name__})"
    if "bounds" not in rec:
        return None  # a failed probe: {trial, failed}
    b, parts = rec.get("bounds"), rec.get("breakdown")
    if not isinstance(b, dict) or not isinstance(parts, dict):
        return "bounds and breakdown must be mappings"
    bad = [k for k in _BOUNDS if not _number(b.get(k))]
    bad += [k for k in _BOUNDS_OPTIONAL if b.get(k) is not None and not _number(b.get(k))]
    bad += [f"breakdown.{k}" for k in _PARTS if not _number(parts.get(k))]
    if not _number(b.get("share_of_ideal")) or b["share_of_ideal"] <= 0:
        bad.append("share_of_ideal > 0")
    if not isinstance(rec.get("world_size"), int) or not isinstance(rec.get("next"), str):
        bad.append("world_size and next")
    if rec.get("trace") is not None and not isinstance(rec.get("trace"), str):
        bad.append("trace")
    return f"{', '.join(bad[:4])} missing or not of their type" if bad else None


#: Each record's attribute.
ATTRS: dict[type, str] = {
    RunRecord: "autotune",
    FirstMeasurement: "first_measurement",
    StopRecord: "stop",
    ValidationRecord: "validation",
    AblationRecord: "ablation",
    LimitRecord: "limit",
}
SCREENING = "screening"


def save(study: optuna.Study, record: Any) -> None:
    """Store ``record`` on ``study`` under its attribute."""
    study.set_user_attr(ATTRS[type(record)], write(record))


def load(study: optuna.Study, cls: type[R]) -> R | None:
    """The study's ``cls`` record, checked; None when it has none; ``RecordError`` when what it
    holds is not one."""
    name = ATTRS[cls]
    raw = study.user_attrs.get(name)
    return None if raw is None else read(cls, raw, name)


def load_readable(study: optuna.Study, cls: type[R]) -> R | None:
    """``load``, with a record that is not what autotune writes read as none: for what only
    shows a record (the run's summary, the report's figures, the profile's limit section),
    where the report says elsewhere what could not be read."""
    try:
        return load(study, cls)
    except RecordError:
        return None


def save_screening(study: optuna.Study, effects: dict[str, ScreenEffect]) -> None:
    study.set_user_attr(SCREENING, {k: write(e) for k, e in effects.items()})


def load_screening(study: optuna.Study) -> dict[str, ScreenEffect] | None:
    """The screening's effects by label, checked; None while the screening is open."""
    raw = study.user_attrs.get(SCREENING)
    return None if raw is None else read(dict[str, ScreenEffect], raw, SCREENING)
