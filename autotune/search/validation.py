"""Re-validation: the search's best few configurations and the baseline measured again,
interleaved (A, B, C, A, ...), and the winner chosen from those numbers only
(``autotune.core.stats.choose``). The search's best value is biased upwards (the maximum of many
noisy measurements); these runs are not.

Each run measures ``rerun_windows`` windows (``MeasureSettings.rerun``): the comparison's
noise is between runs (the machine drifts), not between the windows of one run, so short runs
in more rounds say more than long runs in few (docs/search.md weighs 3 windows against 4).
Called from the main thread after the search, on the first placement group.

Then the user's job as it runs today (``against_today``): the defaults without anything
autotune adds (no allocator pin, torchrun's threads; ``core.config.as_it_runs``), interleaved
with the pinned defaults and the winner, each run in new rank processes. ``mallopt`` cannot be
undone in a process, so that job needs processes that never pinned; and glibc's dynamic
thresholds catch up in reused processes (docs/measurement.md) but not in a user's new ones, so
the arms it is compared with start afresh too: the same regime on every side. The candidates'
own comparison stays in the warm pool, where more rounds fit.

The plan keeps room for an ablation of the best candidate's knobs; when the winner changes
fewer, when there is no winner to ablate, or when its runs were quicker than planned, time is
left once the ablation ends. Where the search stopped on the budget (not where it converged,
or where ``--n-trials`` or ``--patience`` ended it: that time goes back to the user),
``more_rounds`` spends it on further rounds against the defaults, still leaving the limit
probes their share:
- of the winner, up to ``MAX_ROUNDS`` in all: the headline's interval narrows, and nothing is
  chosen again, except that a winner the further rounds no longer show beyond the noise is
  dropped;
- without a winner, of the candidate that read highest above the defaults: a second look, up
  to ``SECOND_LOOK_ROUNDS``, judged at ``SECOND_LOOK_CONFIDENCE`` (two judgements of one
  comparison at 2.5 % each). A candidate it shows beyond the noise becomes the winner, not
  ablated (the ablation's turn has passed), and the record and the run say so.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from autotune.core import allocator
from autotune.core.choice import Validation, choose, interleave
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import TrialFailed
from autotune.core.events import (
    Emit,
    Note,
    TrialStarted,
    ValidationDone,
    ValidationStarted,
)
from autotune.core.knobs import changed_knobs
from autotune.core.numerics import changes_numerics
from autotune.core.results import TrialResult
from autotune.core.stats import speedup_ci, speedup_text
from autotune.core.values import ratio_interval
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import Measurer
from autotune.limit.probe import traced_run
from autotune.record import trial as tr
from autotune.record.attrs import AsIsRecord, IntervalRecord, ValidationRecord, save
from autotune.record.study import anchored_speedups, baseline_trial, complete
from autotune.record.typed import read, write
from autotune.search.budget import MAX_ROUNDS, Budget
from autotune.search.interleaved import measure_interleaved
from autotune.search.screening import HELPS

__all__ = [
    "TODAY",
    "against_today",
    "candidates",
    "more_rounds",
    "rejected",
    "revalidate",
]

#: The key of the user's job as it runs today.
TODAY = "as it runs today"


def candidates(
    study: optuna.Study,
    top: int,
    rejected: frozenset[tr.Point] = frozenset(),
    passed: list[str] | None = None,
) -> dict[str, optuna.trial.FrozenTrial]:
    """The ``top`` COMPLETE trials fastest against the defaults measured nearest to each in
    time (``record.study.anchored_speedup``) and above them, one per configuration, by key
    ``trial N``; never the defaults themselves, nor a point of ``rejected`` (measured by an
    earlier re-validation of this run and not borne out: ``rejected``), nor a trial that adds
    a numerics-changing setting to a leaner one and reads within ``HELPS`` of it
    (``passenger``). ``passed``: where given, one line for each such passenger that read
    faster than the last candidate taken, saying why it is not among them."""
    base = baseline_trial(study)
    if base is None:
        return {}
    out: dict[str, optuna.trial.FrozenTrial] = {}
    seen = {*rejected, tr.point(base)}
    done = complete(study)
    speedups = anchored_speedups(done)
    changes = {t.number: changed_knobs(t.params, base.params) for t in done}
    for t in sorted(done, key=lambda t: -speedups[t.number]):
        key = tr.point(t)
        if tr.is_baseline(t) or key in seen or speedups[t.number] <= 1.0:
            continue
        leaner = passenger(t, done, speedups, changes)
        if leaner is not None:
            if passed is not None:
                added = ", ".join(
                    f"{k}={v}" for k, v in changes[t.number].items() if k not in changes[leaner]
                )
                passed.append(
                    f"Not re-validated: trial {t.number} ({speedups[t.number]:.2f}x) adds {added} "
                    f"to trial {leaner} ({speedups[leaner]:.2f}x) and reads within the noise of "
                    "it: a change to what is computed that no trial could tell is worth it"
                )
            continue
        seen.add(key)
        out[f"trial {t.number}"] = t
        if len(out) == top:
            break
    return out


def passenger(
    t: optuna.trial.FrozenTrial,
    done: list[optuna.trial.FrozenTrial],
    speedups: dict[int, float],
    changes: dict[int, dict[str, Any]],
) -> int | None:
    """The leaner trial of ``done`` (its number) whose knobs ``t`` changes at its values, and more,
    one of them changing what is computed (``core.numerics.changes_numerics``: lower precision,
    a compressing hook), without reading above it by more than ``HELPS`` or, where wider, the
    two trials' noise (their intervals' relative half-widths, combined); None when there is
    none, and ``t`` competes. What it adds did not help in the search, as a screened partner
    that does not join the stack (``screening.Stack``), and costs numerics: the leaner trial
    competes in its place. On the recorded 500 Mbit landscape the fp16 hook with 5 MB buckets,
    and with bf16 on top (0.3 % apart), were both screened; where the plan held one candidate,
    half of the replayed 5-minute runs took the one with bf16 and had no budget left to ablate
    it; at 300 Mbit bf16 on top of the hook read 2.3 % above it on trials +-1.5 % and +-3.6 %
    wide, and a quarter of the runs exported it (0.975 of the best; the hook with 5 MB buckets
    is 0.983, and a lower precision whose gain no trial could tell is not worth what it
    changes). A knob that leaves the numerics alone is not judged here, on one trial each: 5 MB
    buckets on top of the hook gain 2 % at 300 Mbit, within one trial's noise, and the
    re-validation's rounds and the ablation tell."""
    mine = changes[t.number]
    numerics = set(changes_numerics(tr.config(t)))
    for u in done:
        theirs = changes[u.number]
        if not theirs or len(theirs) >= len(mine) or speedups[u.number] <= 1.0:
            continue
        margin = max(HELPS, math.hypot(tr.rel_noise(t), tr.rel_noise(u)))
        within = speedups[t.number] <= (1 + margin) * speedups[u.number]
        subset = all(mine.get(k) == x for k, x in theirs.items())
        if within and subset and numerics - set(changes_numerics(tr.config(u))):
            return u.number
    return None


def rejected(study: optuna.Study, record: ValidationRecord | None) -> frozenset[tr.Point]:
    """The points of the candidates ``record`` set aside (``_set_aside``)."""
    if record is None:
        return frozenset()
    trials = study.get_trials(deepcopy=False)  # one read: ``study.trials`` copies them all
    return frozenset(tr.point(trials[n]) for n in _set_aside(record).values())


def _set_aside(record: ValidationRecord | None) -> dict[str, int]:
    """The candidates ``record`` measured and did not choose (a winner that beats the defaults
    is chosen), those whose run failed, and those an earlier re-validation set aside, by key
    and trial."""
    if record is None:
        return {}
    out = dict(record.earlier)
    for key, n in record.trials.items():
        if key != "baseline" and not (record.beats_baseline and key == record.winner):
            out[key] = n
    for key in record.failed:
        if key.removeprefix("trial ").isdigit():
            out[key] = int(key.removeprefix("trial "))
    return out


def revalidate(
    *,
    study: optuna.Study,
    definition: StudyDefinition,
    plan: tuple[int, int] | None,
    measure: Measurer,
    emit: Emit,
    defaults: dict[str, Any],
    budget: Budget | None = None,
    earlier: ValidationRecord | None = None,
    trace: Path | None = None,
    traced: dict[str, Path] | None = None,
) -> ValidationRecord | None:
    """Measure the best ``plan[0]`` configurations and the baseline again over ``plan[1]``
    interleaved rounds, then the job as it runs today (``against_today``); store the record
    (attribute ``validation``) and return it. None when there is nothing to compare.

    ``trace``: where the first run of the defaults writes a Chrome trace of a few DDP steps
    after its windows (``limit.probe.traced_run``; the first measurement takes none), put in
    ``traced`` (``baseline``) once written, for the limit probe's record.

    ``earlier``: the re-validation of this run before the search resumed (``Assembly``): its
    candidates are not measured again (``rejected``), the record names them
    (``ValidationRecord.earlier``), and its comparison with the job as it runs today stands
    unless this one finds a winner to compare."""
    base = baseline_trial(study)
    if plan is None or base is None:
        return None
    top, rounds = plan
    passed: list[str] = []
    picked = candidates(study, top, rejected(study, earlier), passed)
    for line in passed:
        emit(Note(line))
    if not picked:
        more = " not re-validated already" if earlier is not None else ""
        emit(Note(f"No trial{more} measured above the baseline: nothing to re-validate"))
        return None
    keys = ["baseline", *picked]
    order = interleave(keys, rounds)
    rerun = definition.measure.rerun()
    emit(ValidationStarted(candidates=list(picked), rounds=rounds, runs=len(order)))
    trials = {"baseline": base, **picked}

    run = _rerun(trials, measure, emit, rerun, defaults, trace, traced)
    done = measure_interleaved(keys, order, run, emit, essential="baseline", budget=budget)
    if budget is not None and trace is not None:
        budget.trace_steps = 0  # taken, or not to be: its run was the first of the defaults
    if done is None:
        emit(ValidationDone(winner=None, reason="The baseline failed: re-validation abandoned"))
        return None
    runs, failed, timed_s = done
    order = order[: len(keys) * len(runs["baseline"])]  # the rounds the budget held
    runs = {k: v for k, v in runs.items() if k not in failed}
    if len(runs) < 2:
        emit(ValidationDone(winner=None, reason="Every candidate failed: nothing to re-validate"))
        return None
    v = choose(runs, "baseline")
    emit(
        ValidationDone(
            winner=v.winner,
            beats_baseline=v.beats_baseline,
            reason=v.reason,
            speedup=v.speedup,
        )
    )
    record = read(
        ValidationRecord,
        {
            **v.to_dict(),
            "trials": {k: trials[k].number for k in runs},
            "order": order,
            "measurements": {k: [round(x, 2) for x in xs] for k, xs in runs.items()},
            "failed": failed,
            "timed_s": round(timed_s, 3),
            "after_trial": max(t.number for t in study.get_trials(deepcopy=False)),
            "earlier": _set_aside(earlier),
        },
        "validation",
    )
    # without a winner, the comparison of the defaults that ``earlier`` measured stands
    kept_today = earlier is not None and earlier.as_is is not None and not v.beats_baseline
    if kept_today:
        record = replace(record, as_is=earlier.as_is)
    save(study, record)  # kept whatever stops the comparison with the job as it runs today
    if kept_today:
        return record
    arms = {k: trials[k] for k in ("baseline", v.winner)}
    with contextlib.nullcontext() if budget is None else budget.phase("as today"):
        today = against_today(
            measure, emit, arms, rounds=rounds, rerun=rerun, defaults=defaults, budget=budget
        )
    return record if today is None else _with_today(study, record, today, emit)


def _rerun(
    trials: dict[str, optuna.trial.FrozenTrial],
    measure: Measurer,
    emit: Emit,
    rerun: MeasureSettings,
    defaults: dict[str, Any],
    trace: Path | None = None,
    traced: dict[str, Path] | None = None,
) -> Callable[[str], TrialResult]:
    """A re-validation run of ``trials[key]``, said as it starts; the first of the baseline
    takes the trace to ``trace`` (``revalidate``)."""
    pending = [] if trace is None else [trace]

    def run(key: str) -> TrialResult:
        changes = changed_knobs(trials[key].params, defaults)
        emit(TrialStarted(tag=f"re-validating {key}", changes=changes))
        number, config = trials[key].number, tr.config(trials[key])
        if key != "baseline" or not pending:
            return measure(number, config, measure=rerun, keep=True)
        result, written = traced_run(measure, number, config, pending.pop(), rerun, emit)
        if written is not None and traced is not None:
            traced["baseline"] = written
        return result

    return run


#: Rounds in all the winner's further rounds may take (``more_rounds``): the budget left after
#: the ablation goes to a narrower interval on the exported speedup. Capped at ``MAX_ROUNDS``,
#: real 10-minute runs returned 70 s and 84 s (the reserve's share for the ablation's joint
#: check, which runs only where two or more knobs drop) with the winner at 9-10 rounds.
WINNER_ROUNDS = 2 * MAX_ROUNDS
#: Rounds in all a second look may take (``more_rounds``): where the plan's rounds showed no
#: candidate beyond the noise, the one that read highest. On a machine whose re-validation runs
#: spread by 15-25 %, 10 rounds cannot tell a 1.15x gain from none; 30 can.
SECOND_LOOK_ROUNDS = 3 * MAX_ROUNDS
#: Its confidence: that comparison is judged twice (after the plan's rounds, then with the
#: further ones), so each judgement gets half of the 5 % a single one has (Bonferroni).
SECOND_LOOK_CONFIDENCE = 0.975


def _lead(record: ValidationRecord) -> tuple[str, int, float] | None:
    """The arm ``more_rounds`` measures further, the rounds it may reach in all and the
    confidence it is judged at: the winner (``WINNER_ROUNDS``, 95 %); without one, the candidate
    that read highest above the defaults, measured in every round (a second look:
    ``SECOND_LOOK_ROUNDS``, ``SECOND_LOOK_CONFIDENCE``); None when none read above them."""
    if record.beats_baseline:
        return record.winner, WINNER_ROUNDS, 0.95
    n = len(record.measurements["baseline"])
    best: tuple[float, str] | None = None
    for key, arm in record.results.items():
        if key == "baseline" or len(record.measurements.get(key, [])) != n:
            continue
        median = arm.speedup.median
        if median > 1 and (best is None or median > best[0]):
            best = (median, key)
    return None if best is None else (best[1], SECOND_LOOK_ROUNDS, SECOND_LOOK_CONFIDENCE)


def more_rounds(
    *,
    study: optuna.Study,
    record: ValidationRecord | None,
    measure: Measurer,
    emit: Emit,
    definition: StudyDefinition,
    budget: Budget,
    defaults: dict[str, Any],
) -> ValidationRecord | None:
    """The budget left after the re-validation and the ablation spent on further interleaved
    rounds of one arm against the defaults (module doc; ``_lead`` says which), as many as
    ``Budget.more_rounds`` holds; the record with them, stored, or ``record`` as it was when
    no arm read above the defaults, there is no room or a run fails."""
    lead = None if record is None else _lead(record)
    if record is None or lead is None:
        return record
    key, most, confidence = lead
    base = "baseline"
    done = len(record.measurements[base])
    extra = budget.more_rounds(done, most=most)
    if extra < 1:
        return record
    keys = [base, key]
    order = interleave(keys, done + extra)[len(keys) * done :]  # the alternation goes on
    trials = {k: study.trials[record.trials[k]] for k in keys}
    why = (
        "for a narrower interval"
        if record.beats_baseline
        else f"a second look at the candidate that read highest, judged at {confidence:.1%}"
    )
    emit(
        Note(
            f"The budget left holds {extra} more round(s) of {key} against the defaults: "
            f"measuring them, {why} (the plan kept room its work did not use)"
        )
    )
    run = _rerun(trials, measure, emit, definition.measure.rerun(), defaults)
    got = measure_interleaved(keys, order, run, emit, essential=base, budget=budget)
    if got is None or key in got[1] or not got[0][base]:
        failed = "a run of the defaults failed" if got is None else f"{key}'s run failed"
        emit(Note(f"The further rounds stopped ({failed}): the re-validation's figures stand"))
        return record
    runs, _, timed_s = got
    n = len(runs[base])
    measured = {
        base: [*record.measurements[base], *runs[base]],
        key: [*record.measurements[key], *runs[key][:n]],
    }
    v = choose(measured, base, confidence)
    data = write(record)
    data["results"].update(v.results)
    data["measurements"].update({k: [round(x, 2) for x in xs] for k, xs in measured.items()})
    data["order"] = [*record.order, *order[: len(keys) * n]]
    data["timed_s"] = round(record.timed_s + timed_s, 3)
    data.update(_verdict(record, key, v, done, n, confidence))
    emit(Note(f"After {done + n} rounds: {data['reason']}"))
    checked = read(ValidationRecord, data, "validation")
    save(study, checked)
    return checked


def _verdict(
    record: ValidationRecord, key: str, v: Validation, done: int, n: int, confidence: float
) -> dict[str, Any]:
    """The record's winner, speedup and reason once ``key`` was measured in ``n`` more rounds
    than the ``done`` it had (``v``: the comparison of all of them with the defaults)."""
    # the arm's own interval: v's speedup is the winner's, 1 when the defaults win
    sp = read(IntervalRecord, v.results[key]["speedup"], "validation").interval()
    beats = v.beats_baseline
    was = speedup_text(record.results[key].speedup.interval())
    shown = ratio_interval(sp.median, sp.low, sp.high, digits=3)
    over = f"{confidence:.1%} interval, {sp.n} paired rounds, {n} of them with the budget left"
    if beats and record.beats_baseline:
        return {"speedup": sp.to_dict(), "reason": f"{key}: {shown} vs the defaults ({over})"}
    if beats:  # a second look found it
        return {
            "winner": key,
            "beats_baseline": True,
            "speedup": sp.to_dict(),
            "reason": (
                f"{key}: {shown} vs the defaults ({over}; a second look: after {done} rounds "
                f"no candidate was beyond the noise, and it read {was}; not ablated)"
            ),
        }
    if record.beats_baseline:  # the further rounds do not bear the winner out
        return {
            "winner": "baseline",
            "beats_baseline": False,
            "speedup": v.speedup.to_dict(),  # the defaults' own: 1
            "reason": (
                f"{key} no longer beats the defaults beyond the noise over {done + n} rounds "
                f"({shown}; it measured {was}); keep the defaults"
            ),
        }
    return {
        "reason": (
            f"no candidate beat the defaults beyond the noise; {key}, the closest, measured "
            f"{shown} over {done + n} rounds ({confidence:.1%} interval); keep the defaults"
        )
    }


def _with_today(
    study: optuna.Study, record: ValidationRecord, today: AsIsRecord, emit: Emit
) -> ValidationRecord:
    """``record`` with the comparison with the job as it runs today, stored and said."""
    record = replace(record, as_is=today)
    save(study, record)
    emit(Note(today.line(record.speedup if record.beats_baseline else None)))
    return record


def against_today(
    measure: Measurer,
    emit: Emit,
    arms: dict[str, optuna.trial.FrozenTrial],
    *,
    rounds: int,
    rerun: MeasureSettings,
    defaults: dict[str, Any],
    budget: Budget | None = None,
) -> AsIsRecord | None:
    """The user's job as it runs today (the defaults of ``arms["baseline"]`` without what
    autotune adds) against the pinned defaults and the winner (the other key of ``arms``, when
    it is not the baseline), interleaved over ``rounds`` rounds (with ``budget``: the rounds
    it plans, ``Budget.as_is_rounds``), each run in new processes (module doc). A record
    saying why not when the measurer cannot run that job, the budget left it out or holds no
    rounds, or its run fails; None where the measurer has no such job at all (the replay)."""
    as_is, fresh = getattr(measure, "as_is", None), getattr(measure, "fresh", None)
    if as_is is None or fresh is None:
        return None
    base = tr.config(arms["baseline"])
    today = as_is(base)
    if isinstance(today, str):
        return AsIsRecord(reason=today)
    keys = [TODAY, *arms]
    if budget is not None:
        rounds = budget.as_is_rounds(len(keys))
        if rounds == 0:
            return AsIsRecord(reason=budget.as_is_left_out(len(keys)))
    if rounds < 2:
        return AsIsRecord(reason=f"not measured: {rounds} round(s) give no interval")
    configs = {TODAY: today, **{k: tr.config(t) for k, t in arms.items()}}
    said = {TODAY: {"allocator pin": "off", "threads": today.threads}}
    said.update({k: changed_knobs(t.params, defaults) for k, t in arms.items()})
    pinned: dict[str, bool | None] = {}
    failure: list[str] = []
    order = interleave(keys, rounds)
    emit(
        Note(
            f"Measuring your job as it runs today against the defaults"
            f"{'' if len(keys) == 2 else ' and ' + keys[-1]}: {rounds} interleaved rounds, "
            f"every run in new processes ({len(order)} runs)"
        )
    )

    def run(key: str) -> TrialResult:
        emit(TrialStarted(tag=f"re-validating {key}", changes=said[key]))
        number = arms.get(key, arms["baseline"]).number
        try:
            result = fresh(number, configs[key], measure=rerun, pin=key != TODAY)
        except TrialFailed as e:
            failure.append(f"{e.reason}: {e.detail}")
            raise
        pinned[key] = _pinned(result)
        return result

    done = measure_interleaved(keys, order, run, emit, essential=TODAY)
    if done is None:
        return AsIsRecord(reason=f"not measured: its run failed ({failure[-1]})", order=order)
    runs, failed, timed_s = done
    rounds = len(runs[TODAY])  # fewer than planned where its run failed (measure_interleaved)
    return AsIsRecord(
        rounds=rounds,
        order=order[: len(keys) * rounds],
        failed=failed,
        changes=_added(today, base),
        pinned=pinned,
        timed_s=round(timed_s, 3),
        measurements={k: [round(x, 2) for x in xs] for k, xs in runs.items()},
        pin=_ratio(runs, "baseline", failed),
        today=_ratio(runs, keys[-1], failed),
    )


def _ratio(runs: dict[str, list[float]], key: str, failed: dict[str, str]) -> IntervalRecord | None:
    """``key`` over the job as it runs today, paired by round; None when ``key`` failed."""
    if key in failed:
        return None
    n = min(len(runs[key]), len(runs[TODAY]))
    return read(IntervalRecord, speedup_ci(runs[key][:n], runs[TODAY][:n]).to_dict(), "as_is")


def _pinned(result: TrialResult) -> bool | None:
    """Whether every rank read glibc's allocator back as pinned (``allocator.pinned``); None
    when a rank did not say (script mode)."""
    seen = [r.applied.get("allocator_pinned") for r in result.ranks]
    return None if None in seen or not seen else all(seen)


def _added(today: TrialConfig, base: TrialConfig) -> list[str]:
    """What autotune's defaults ``base`` add to the job as it runs ``today``, in words."""
    out = ["the allocator pin"] if any(k in base.env for k in allocator.ENV) else []
    if today.threads != base.threads:
        out.append(f"{base.threads} threads a rank (today {today.threads})")
    return out
