"""What autotune stores on a trial, and how each value is read back: the only module besides
``record.attrs`` and ``record.study`` that touches ``user_attrs`` (tests/unit/test_layout.py).

A trial's user attributes:

* marks, set when the trial is queued (``enqueue``): ``baseline`` (a run of the defaults),
  ``anchor`` (why a later run of the defaults was queued), ``screen`` (the prior it screens)
  with ``expected_gain``, ``combination`` (the priors it combines), ``fold`` (the prior a
  fold-over trial leaves out);
* when it starts: ``driver`` (``record.study.driver_identity``) and ``config``
  (``TrialConfig.to_dict``);
* when it is measured: the fields of ``Measurement``; on a configuration that changes
  numerics, ``numerics_drift`` or ``numerics_unjudged``, on an fp32 one ``fp32_drift``;
* ``wall_s`` (its seconds, measured or not), ``logs`` (its kept rank logs), and on a FAIL
  trial ``reason`` (a ``FailureReason`` value) and ``reason_detail``.

Every reader checks the type of what it reads: a value of the wrong type reads as absent
(a trial is one row of a study that may be someone else's; the study-level records, which
decisions rest on, are refused instead: ``record.attrs``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.core.config import STUDY_FIX, TrialConfig
from autotune.core.errors import TrialFailed
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.record.attrs import IntervalRecord
from autotune.record.typed import RecordError, read

__all__ = [
    "MARKS",
    "Measurement",
    "Point",
    "anchor",
    "combination",
    "config",
    "config_dict",
    "drift_attrs",
    "fp32_drift",
    "driver",
    "enqueue",
    "fold",
    "interval",
    "interval_record",
    "is_baseline",
    "logs",
    "loss_curve",
    "measured",
    "measurement",
    "on_top",
    "on_top_of",
    "point",
    "reason",
    "reason_detail",
    "rel_noise",
    "save_config",
    "save_drift",
    "save_driver",
    "save_failure",
    "save_logs",
    "save_measurement",
    "save_wall",
    "screen_label",
    "speedup",
]

AnyTrial = optuna.Trial | FrozenTrial

#: The marks a trial may be queued with, and their types.
MARKS: dict[str, type | tuple[type, ...]] = {
    "baseline": bool,
    "anchor": str,
    "screen": str,
    "expected_gain": (int, float),
    "combination": list,
    "fold": str,
    "on_top": str,
    "base": int,
}


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """A measured trial's figures (``save_measurement``; the windows' throughput interval is
    the trial's value's evidence)."""

    throughput: float
    interval: IntervalRecord
    windows: list[float]
    stop: str
    warmup_steps: int
    step_time_s: float
    peak_memory_mb: list[float]
    steps: int
    window_s: float
    wall_s: float
    overhead_s: float
    warmup_s: float
    """Where the overhead went, on the slowest rank: the warm-up steps, and (``init_s``) the
    rest before them (process group, model, DDP, DataLoader; process start when fresh)."""
    init_s: float
    loss: float | None
    """The last loss (None: not reported)."""
    nodes: list[str | None] = field(default_factory=list)
    """Where each rank ran, in rank order."""
    speedup: float | None = None
    """Over the defaults (None: another driver's baseline is not measured yet)."""
    tokens_per_s: float | None = None
    loss_curve: list[float] = field(default_factory=list)

    @classmethod
    def of(
        cls, result: TrialResult, speedup: float | None, tokens_per_sample: int | None = None
    ) -> Measurement:
        ranks = result.ranks
        return cls(
            throughput=round(result.throughput, 3),
            interval=read(IntervalRecord, result.interval.to_dict(), "interval"),
            windows=[round(w, 2) for w in result.windows],
            stop=ranks[0].stop,
            warmup_steps=ranks[0].warmup_steps,
            step_time_s=round(result.step_time_s, 6),
            peak_memory_mb=[r.peak_memory_mb for r in ranks],
            steps=ranks[0].steps,
            window_s=round(result.window_s, 3),
            wall_s=round(result.wall_s, 3),
            overhead_s=round(result.overhead_s, 3),
            warmup_s=round(result.warmup_s, 3),
            init_s=round(result.init_s, 3),
            loss=ranks[0].loss if math.isfinite(ranks[0].loss) else None,
            nodes=[r.node_ip for r in ranks],
            speedup=None if speedup is None else round(speedup, 4),
            tokens_per_s=(
                round(result.throughput * tokens_per_sample, 1) if tokens_per_sample else None
            ),
            loss_curve=[float(f"{x:.6g}") for x in ranks[0].loss_curve],
        )

    def to_attrs(self) -> dict[str, Any]:
        """The attributes as stored (``speedup`` and ``tokens_per_s`` left out when None)."""
        out = asdict(self)
        for k in ("speedup", "tokens_per_s"):
            if out[k] is None:
                del out[k]
        return out


# -- marks -------------------------------------------------------------------------------------


def enqueue(study: optuna.Study, params: dict[str, Any], **marks: Any) -> None:
    """Queue a trial of ``params`` with ``marks`` (``MARKS``)."""
    for k, v in marks.items():
        if k not in MARKS or not isinstance(v, MARKS[k]):
            raise TypeError(f"trial mark {k}={v!r} is not one of {sorted(MARKS)}")
    study.enqueue_trial(params, user_attrs=marks)


def _get(t: AnyTrial, key: str, kind: type | tuple[type, ...]) -> Any:
    v = t.user_attrs.get(key)
    if isinstance(v, bool) and kind is not bool:  # bool is an int to isinstance
        return None
    return v if isinstance(v, kind) else None


def is_baseline(t: AnyTrial) -> bool:
    """Whether ``t`` runs the defaults (the baseline or a later anchor)."""
    return _get(t, "baseline", bool) is True


def anchor(t: AnyTrial) -> str | None:
    """Why a later run of the defaults was queued (None: not an anchor)."""
    return _get(t, "anchor", str) or None


def screen_label(t: AnyTrial) -> str | None:
    return _get(t, "screen", str)


def combination(t: AnyTrial) -> list[str] | None:
    v = _get(t, "combination", list)
    return None if v is None else [x for x in v if isinstance(x, str)]


def fold(t: AnyTrial) -> str | None:
    return _get(t, "fold", str)


def on_top(t: AnyTrial) -> str | None:
    """What a screening trial was screened on top of, in words: the lever's label, then each
    partner stacked on it (``"comm_hook=fp16 + bucket_cap_mb=5"``); None: moved alone."""
    return _get(t, "on_top", str)


def on_top_of(t: AnyTrial) -> int | None:
    """The number of the trial a screening trial on top of a lever is rated against (the
    lever's, or the last partner stacked on it); None: moved alone, or queued before the
    trial's number was recorded (then the lever's own trial)."""
    return _get(t, "base", int)


#: A point of the space (``point``).
Point = tuple[tuple[str, Any], ...]


def point(t: AnyTrial) -> Point:
    """The point of the space ``t`` ran: its params, in a form that compares and hashes (two
    trials of one configuration have the same point)."""
    return tuple(sorted(t.params.items()))


# -- what the trial ran and measured -----------------------------------------------------------


def driver(t: AnyTrial) -> str:
    return _get(t, "driver", str) or ""


def config_dict(t: AnyTrial) -> dict[str, Any] | None:
    """The configuration as stored (unchecked: ``config`` checks it)."""
    return _get(t, "config", dict)


def config(t: AnyTrial, where: str | None = None, fix: str = STUDY_FIX) -> TrialConfig:
    """The configuration ``t`` ran, checked (``TrialConfig.from_dict``); ``RecordError`` when
    it has none."""
    raw = config_dict(t)
    where = where or f"trial {t.number}"
    if raw is None:
        raise RecordError(
            f"study record {where}: no configuration stored; the study was "
            f"written by another program - use another --study-name"
        )
    return TrialConfig.from_dict(raw, where=where, fix=fix)


def measured(t: AnyTrial, key: str) -> float | None:
    """A number of the trial's measurement (``Measurement``'s fields) or ``wall_s``; None when
    absent or not a finite number."""
    v = _get(t, key, (int, float))
    return float(v) if v is not None and math.isfinite(v) else None


def speedup(t: AnyTrial) -> float | None:
    return measured(t, "speedup")


def rel_noise(t: AnyTrial) -> float:
    """The relative half-width of ``t``'s 95 % interval as stored (0 when it has none)."""
    raw = t.user_attrs.get("interval")
    v = raw.get("rel_half_width") if isinstance(raw, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def interval_record(t: AnyTrial) -> IntervalRecord | None:
    """The trial's throughput interval as stored (None: not measured, or not readable)."""
    raw = t.user_attrs.get("interval")
    if raw is None:
        return None
    try:
        return read(IntervalRecord, raw, f"trial {t.number} interval")
    except RecordError:
        return None


def interval(t: AnyTrial) -> Interval | None:
    """The trial's throughput interval (None: not measured, or by an autotune without)."""
    rec = interval_record(t)
    try:
        return None if rec is None else rec.interval()
    except ValueError:  # not low <= median <= high
        return None


def measurement(t: AnyTrial) -> Measurement | None:
    """The whole measurement, checked (None: not measured, or not what autotune writes)."""
    try:
        return read(Measurement, dict(t.user_attrs), f"trial {t.number}")
    except (RecordError, ValueError):
        return None


def loss_curve(t: AnyTrial) -> list[float] | None:
    v = _get(t, "loss_curve", list)
    return v if v and all(isinstance(x, (int, float)) for x in v) else None


def logs(t: AnyTrial) -> str:
    return _get(t, "logs", str) or ""


def reason(t: AnyTrial) -> str:
    """A FAIL trial's reason (a ``FailureReason`` value; ``unknown`` when none is stored)."""
    return _get(t, "reason", str) or "unknown"


def reason_detail(t: AnyTrial) -> str:
    return _get(t, "reason_detail", str) or ""


def drift_attrs(t: AnyTrial) -> dict[str, Any]:
    """The numerics guard's findings on ``t`` (``numerics_drift``, ``numerics_unjudged``)."""
    return {
        k: t.user_attrs[k]
        for k in ("numerics_drift", "numerics_unjudged")
        if isinstance(t.user_attrs.get(k), (int, float, str))
    }


def fp32_drift(t: AnyTrial) -> float | None:
    """An fp32 trial's loss drift from the baseline's (``inf`` stored as text)."""
    v = t.user_attrs.get("fp32_drift")
    if v == "inf":
        return math.inf
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# -- writing -----------------------------------------------------------------------------------


def save_driver(trial: optuna.Trial, driver_id: str) -> None:
    """Who runs ``trial``: the objective's first write, before anything can take time (the
    sampler's suggestions), so that a driver killed then is known by its trial."""
    trial.set_user_attr("driver", driver_id)


def save_config(trial: optuna.Trial, config_: TrialConfig) -> None:
    """What ``trial`` runs."""
    trial.set_user_attr("config", config_.to_dict())


def save_logs(trial: optuna.Trial, path: str) -> None:
    trial.set_user_attr("logs", path)


def save_wall(trial: optuna.Trial, wall_s: float) -> None:
    trial.set_user_attr("wall_s", round(wall_s, 3))


def save_measurement(trial: optuna.Trial, m: Measurement) -> None:
    for k, v in m.to_attrs().items():
        trial.set_user_attr(k, v)


def save_drift(trial: optuna.Trial, found: dict[str, Any]) -> None:
    """The numerics guard's findings (``numerics_drift``/``fp32_drift``/``numerics_unjudged``)."""
    for k, v in found.items():
        trial.set_user_attr(k, v)


def save_failure(trial: optuna.Trial, failure: TrialFailed) -> None:
    """Why ``trial`` fails: attributes ``reason`` and ``reason_detail``."""
    trial.set_user_attr("reason", str(failure.reason))
    trial.set_user_attr("reason_detail", failure.detail)
