"""The first measurement: the limit probe of the defaults, taken once with the baseline trial
(or read back from a resumed or shared study), and the screening order it gives. In script mode
the probe is the script's own steps, timed, and the link's fit (``script.first_measurement``).

Where the measurer can (``folds_probe``), the baseline trial takes the probe in its own session
after its windows (``fold_settings``; ``core.rank_io.AFTER_WINDOWS``), which warmed the step up:
the probe costs its own seconds, not a set-up and warm-up of its own (5 s of 16 at 500 Mbit).
The objective keeps what it measured (``Objective.baseline_probe``, ``Folded``) apart from the
baseline's own seconds. Otherwise (script mode, a baseline another driver ran) the probe is a
run of its own right after the baseline (``limit.probe.probe_one``).

``first_measurement`` runs on a search thread before any other trial. It says in one line what
bounds the step (``limit.evidence.Evidence.describe``), the order the screening will take with each
prior's expected gain, and each prior skipped with its figure; or, where there is no probe
(``--no-limit``, a failed probe), that the priors go in their listed order. The
record is the study's ``first_measurement`` attribute (``record.attrs.FirstMeasurement``): the
evidence (checked when read back) and the probe's own record, which the probe at the end of
the run reuses.

The probe takes no Chrome trace: every screening trial waits for it, and the trace serves the
user, not the search (two DDP steps and their export, about 2.5 s of a 1.3 s step at 500
Mbit). The defaults' trace is taken after the windows of the re-validation's first run of the
defaults, which runs anyway, or, where the run re-validates nothing, at the end where the
budget holds a run for it (``tuner._limit``, ``limit.probe.measure_limit``).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.events import Emit, Note
from autotune.core.rank_io import AFTER_WINDOWS
from autotune.core.values import speedup
from autotune.definition.space import ResolvedSpace
from autotune.definition.studydef import StudyDefinition
from autotune.limit.evidence import Evidence
from autotune.limit.probe import COMM_REPEATS, completed, probe_one
from autotune.record import trial as tr
from autotune.record.attrs import FirstMeasurement, load, save
from autotune.record.study import baseline_trial
from autotune.record.typed import RecordError
from autotune.search.budget import Budget
from autotune.search.screening import HELPS, plan

__all__ = ["Folded", "first_measurement", "fold_settings", "probe_steps"]

#: What the baseline trial's probe after its windows measured (``RankResult.limit``) and its
#: seconds.
Folded = tuple[dict[str, Any], float]


def first_measurement(
    *,
    study: optuna.Study,
    space: ResolvedSpace,
    measure: Any,
    definition: StudyDefinition,
    budget: Budget,
    emit: Emit,
    folded: Folded | None = None,
) -> Evidence | None:
    """The evidence the screening is ordered by (module doc); None where there is none.
    ``folded``: the probe the baseline trial took after its windows (``fold_settings``)."""
    ev = _stored(study, emit)
    if ev is None:
        ev = _probe_defaults(study, space, measure, definition, budget, emit, folded)
    if ev is None:
        return None
    todo, skipped = plan(space, ev)
    if todo or skipped:
        order = ", ".join(
            p.prior.label + ("" if p.gain is None else f" (<= {speedup(p.gain)})") for p in todo
        )
        emit(Note(f"Screening order from the first measurement: {order or 'nothing'}"))
        bar = max(ev.noise, HELPS)
        for p in skipped:
            if p.prior.compute_only and ev.bound != "compute":  # compile: compute-bound only
                emit(
                    Note(
                        f"Not screened: {p.prior.label}: the step is {ev.bound}-bound, and it "
                        "shortens only compute"
                    )
                )
                continue
            emit(
                Note(
                    f"Not screened: {p.prior.label}: at most {speedup(p.gain, 3)} on this step, "
                    f"within the noise (±{bar:.1%})"
                )
            )
    return ev


def fold_settings(study: optuna.Study, definition: StudyDefinition, measure: Any) -> dict | None:
    """The probe's settings for the baseline trial to take after its windows, where the first
    measurement will be taken here and the measurer can take it in the trial's session
    (``folds_probe``); None: the baseline runs alone, and the first measurement (if any)
    after it."""
    if not (definition.limit and getattr(measure, "folds_probe", False)):
        return None
    try:
        if load(study, FirstMeasurement) is not None:
            return None
    except RecordError:  # unreadable: measured again, and said so (``_stored``)
        pass
    return {"repeats": COMM_REPEATS, AFTER_WINDOWS: True}


def _stored(study: optuna.Study, emit: Emit) -> Evidence | None:
    try:
        first = load(study, FirstMeasurement)
        if first is None:
            return None
        ev = Evidence.from_attrs(first.evidence)
    except (RecordError, ValueError) as e:
        emit(
            Note(
                f"The study's stored first measurement is unreadable ({e}); measuring the "
                "defaults again"
            )
        )
        return None
    emit(Note(f"First measurement (stored on the study): {ev.describe()}"))
    return ev


def probe_steps(samples_per_s: float | None, global_batch: int) -> int | None:
    """DDP steps (and as many bare ones) for the first measurement, at the baseline's step
    time: the probe's fewest (``rank.limit_probe.least_steps``: 8, or as many as take 4 s
    where steps are slow, at least 4), not two windows' worth; None: unknown. A breakdown
    needs a few steps, and every screening trial waits for them: about 8 s of steps, as
    before, took 7 of a 1.3 s step at 500 Mbit where 4 take the probe's 4 s.
    ``samples_per_s``: the baseline's throughput."""
    if not samples_per_s or samples_per_s <= 0:
        return None
    from autotune.rank.limit_probe import least_steps

    return least_steps(global_batch / samples_per_s)


def _probe_defaults(
    study: optuna.Study,
    space: ResolvedSpace,
    measure: Any,
    d: StudyDefinition,
    budget: Budget,
    emit: Emit,
    folded: Folded | None,
) -> Evidence | None:
    """The limit probe of the baseline's configuration, ``folded`` into the baseline trial
    where it was, else a probe of its own; None (said) when there is none."""
    if not d.limit:
        emit(Note("No first measurement (--no-limit): screening in the priors' listed order"))
        return None
    if not getattr(measure, "can_probe", True):
        emit(
            Note(
                "No first measurement (this measurer has none): screening in the priors' "
                "listed order"
            )
        )
        return None
    base = baseline_trial(study)
    if base is None or base.state != TrialState.COMPLETE:
        return None
    if folded is None and budget.left_s() <= 0:
        return None
    started = budget.elapsed_s()
    device = space.target.device
    try:  # untraced: every screening trial waits for it (``Assembly.defaults_trace`` later)
        if folded is not None:  # taken after the baseline's windows, in its session
            probed, took = folded
            if "failed" in probed:
                raise TrialFailed(FailureReason.CRASH, str(probed["failed"]))
            record = completed(
                dict(probed, measure_s=round(took, 2)),
                base.number,
                tr.config(base),
                free_batch=d.free_batch,
                device=device,
                wall_s=took,
            )
        else:
            record = probe_one(
                measure,
                base.number,
                tr.config(base),
                free_batch=d.free_batch,
                device=device,
                steps=probe_steps(
                    base.values[0] if base.values else None, space.target.global_batch
                ),
            )
            took = budget.elapsed_s() - started
        ev = Evidence.from_probe(record, device=device, noise=max(tr.rel_noise(base), HELPS))
    except (TrialFailed, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        emit(
            Note(
                f"The first measurement failed ({type(e).__name__}: {e}): screening in the "
                "priors' listed order"
            )
        )
        return None
    save(study, FirstMeasurement(evidence=ev.to_attrs(), probe=record))
    where = ", after the baseline's windows" if folded is not None else ""
    emit(Note(f"First measurement ({took:.0f} s{where}): {ev.describe()}"))
    return ev
