"""Ablation: a profile that changes only what helps.

The re-validated winner changes several knobs at once; some carry the gain, others ride along
(and some, such as bf16 or gradient compression, change numerics for nothing). After
re-validation, ``ablate`` measures the winner against the winner with each changed knob set
back to its default, interleaved as re-validation is (``stats.interleave``: every variant
once per round, short runs), and takes each knob's contribution as the paired ratio
winner / winner-without-it with its 95 % interval (``stats.speedup_ci``).

A knob is kept when its interval lies above 1 (removing it costs more than the noise); the
others go back to their defaults in the exported profile. When no knob passes on its own
while the winner beat the defaults, the knobs act together: all are kept and the record says
so. A knob that cannot be removed alone (the rest would be illegal) is kept. Runs that fail
drop their variant (its knob is kept).

Called from the main thread after re-validation, on the first placement group; the record
(study user attribute ``ablation``) is read by ``export``. Rounds are what the budget left
holds (at least 2), at most the re-validation's.

The allocator pin is listed as a contribution too (``PIN``), though it is no knob: the
re-validation measured the pinned defaults against the user's job as it runs today, in new
processes (``validation.against_today``), and that ratio is its share. It is always kept:
every configuration, the winner included, was measured with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import optuna

from autotune.core.choice import interleave
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.events import Emit, Note
from autotune.core.knobs import changed_knobs
from autotune.core.stats import Interval, speedup_ci
from autotune.core.values import ratio_interval
from autotune.definition.space import ResolvedSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import Measurer
from autotune.record import trial as tr
from autotune.record.attrs import (
    AblationRecord,
    Contribution,
    JointCheck,
    ValidationRecord,
    save,
)
from autotune.search.budget import Budget
from autotune.search.interleaved import measure_interleaved
from autotune.search.screening import HELPS

__all__ = ["PIN", "ablate", "pin_contribution", "variants"]

WINNER = "winner"
#: The allocator pin's row of the contributions (``autotune.core.allocator``).
PIN = "allocator pin"
REDUCED = "without the unproven knobs"
#: The confidence of the interval a knob's contribution must lie above 1 in to be kept.
CONFIDENCE = 0.95


def variants(space: ResolvedSpace, params: dict[str, Any]) -> dict[str, dict[str, Any] | str]:
    """For each knob ``params`` changes from the defaults: the params without it (that knob,
    and the children it switched on, at their defaults), or why it cannot be removed alone."""
    defaults = space.defaults()
    out: dict[str, dict[str, Any] | str] = {}
    for name in changed_knobs(params, {n: defaults[n] for n in params}):
        values = space.values_from_params(params)
        values[name] = defaults[name]
        illegal = space.illegal(values)
        out[name] = illegal if illegal else {n: values[n] for n in space.active(values)}
    return out


@dataclass(frozen=True)
class _Bench:
    """What every measurement of one ablation shares: the winner's trial number, the
    configurations by key (``WINNER``, ``without K``), the re-measurement runs' settings, the
    budget, the measurer and where to say things."""

    number: int
    configs: dict[str, TrialConfig]
    short: MeasureSettings
    budget: Budget
    measure: Measurer
    emit: Emit

    def interleaved(
        self, keys: list[str], order: list[str]
    ) -> tuple[dict[str, list[float]], dict[str, str], float] | None:
        """``measure_interleaved`` of ``keys`` in ``order``, the winner essential."""
        return measure_interleaved(
            keys,
            order,
            lambda key: self.measure(self.number, self.configs[key], measure=self.short, keep=True),
            self.emit,
            essential=WINNER,
        )

    def with_config(self, key: str, config: TrialConfig) -> _Bench:
        return replace(self, configs={**self.configs, key: config})


def ablate(
    *,
    study: optuna.Study,
    definition: StudyDefinition,
    space: ResolvedSpace,
    validation: ValidationRecord | None,
    budget: Budget,
    measure: Measurer,
    emit: Emit,
) -> AblationRecord | None:
    """Ablate the re-validated winner (see the module doc); store and return the record. None
    with ``--no-ablate``, when nothing was validated, the winner changes fewer than two knobs,
    or the budget left holds fewer than two rounds."""
    if not definition.ablate or validation is None or not validation.beats_baseline:
        return None
    winner = study.trials[number := validation.trials[validation.winner]]
    options = variants(space, dict(winner.params))
    removable = {k: p for k, p in options.items() if isinstance(p, dict)}
    if len(options) < 2 or not removable:
        return None
    rounds = budget.ablation_rounds(len(removable))
    if rounds < 2:
        emit(Note("No budget left to ablate the winner: every knob it changes is kept"))
        return None
    configs = {WINNER: tr.config(winner)}
    for k, p in removable.items():
        configs[f"without {k}"] = TrialConfig.from_values(space.values_from_params(p), space.target)
    keys = list(configs)
    order = interleave(keys, rounds)
    emit(
        Note(
            f"Ablating trial {number}: each of its {len(removable)} changed knobs set back to "
            f"its default, {rounds} interleaved rounds ({len(order)} runs)"
        )
    )
    bench = _Bench(number, configs, definition.measure.rerun(), budget, measure, emit)
    done = bench.interleaved(keys, order)
    if done is None:
        emit(Note("The winner failed during ablation: every knob it changes is kept"))
        return None
    runs, failed, timed_s = done
    if len(runs[WINNER]) < rounds:  # the winner's run failed: the rounds before it stand
        rounds = len(runs[WINNER])
        order = order[: len(keys) * rounds]
    contributions, together = _contributions(options, runs, failed, winner.params)
    more = _settle(bench, contributions, runs, failed)
    if more is not None:
        timed_s += more
        contributions, together = _contributions(options, runs, failed, winner.params)
    values, dropped, joint = _drop_unproven(bench, space, winner.params, contributions, rounds)
    contributions.update(pin_contribution(validation))
    record = AblationRecord(
        trial=number,
        rounds=rounds,
        order=order,
        measurements={k: [round(x, 2) for x in xs] for k, xs in runs.items()},
        contributions=contributions,
        dropped=dropped,
        together=together,
        joint=joint,
        params={n: values[n] for n in space.active(values)},
        config=TrialConfig.from_values(values, space.target).to_dict(),
        timed_s=round(timed_s, 3),
    )
    save(study, record)
    _say(record, emit)
    return record


def _drop_unproven(
    bench: _Bench,
    space: ResolvedSpace,
    params: dict[str, Any],
    contributions: dict[str, Contribution],
    rounds: int,
) -> tuple[dict[str, Any], list[str], JointCheck | None]:
    """The winner's values with the knobs that proved nothing back at their defaults, those
    knobs, and the check of dropping two or more of them at once (which puts them all back
    when together they carry gain)."""
    dropped = [k for k, c in contributions.items() if not c.kept]
    values = space.values_from_params(dict(params))
    defaults = space.defaults()
    for k in dropped:
        values[k] = defaults[k]
    if len(dropped) < 2:
        return values, dropped, None
    # Each drop alone cost nothing beyond the noise; all of them at once is another
    # configuration, measured before it is exported.
    reduced = TrialConfig.from_values(values, space.target)
    joint = _check_joint(bench, dropped, reduced, rounds)
    if joint.kept_back:
        for k in dropped:
            others = ", ".join(o for o in dropped if o != k)
            contributions[k].kept = True
            contributions[k].why = f"dropped with {others}: {joint.why}"
        return space.values_from_params(dict(params)), [], joint
    return values, dropped, joint


def _settle(
    bench: _Bench,
    contributions: dict[str, Contribution],
    runs: dict[str, list[float]],
    failed: dict[str, str],
) -> float | None:
    """More rounds for the undecided knobs, where the budget left holds them: a knob about to
    be dropped although its median contribution is a gain, its interval only reaching down to
    1. The ablation's rounds are sized before the re-validation's extra rounds take what is
    left, and its share of the reserve for the joint check goes unused where fewer than two
    knobs drop: on the recorded 1 Gbit landscape 4 rounds dropped 5 MB buckets (1.033x [0.999,
    1.068] at a true 1.03x) and exported 0.965 of the best point in a third of the seeds, then
    spent 6 more rounds on the winner against the defaults; a real 10-minute run dropped 5 MB
    buckets at 1.020x [0.998, 1.043] after 9 rounds and returned 84 s. The new rounds, up to
    as many again as were measured, are added to ``runs`` (winner and undecided variants,
    interleaved); returns their seconds inside timed windows, None when none were measured.
    One extension, of a bounded size, decided before it is measured: a knob whose gain is
    nothing can still be kept, as in any test, at a little more than the stated confidence
    (a knob with no gain has a median above 1 half the time and gets the second look)."""
    undecided = [  # when no knob passed alone, all are kept together: none is undecided
        k
        for k, c in contributions.items()
        if not c.kept and c.speedup is not None and c.speedup[1] > 1
    ]
    if not undecided:
        return None
    keys = [WINNER] + [f"without {k}" for k in undecided]
    done = min(len(runs[k]) for k in keys)
    # where two or more knobs would drop, their joint check (two runs a round) keeps its room
    dropping = sum(not c.kept for c in contributions.values())
    joint = 2 * done if dropping >= 2 else 0
    extra = bench.budget.more_rounds(done, arms=len(keys), most=2 * done, keep_runs=joint)
    if extra < 2:
        return None
    bench.emit(
        Note(
            f"Undecided ({', '.join(undecided)}: a gain whose interval reaches 1): {extra} more "
            "interleaved rounds of the winner and the winner without it, where the budget "
            "left holds them"
        )
    )
    more = bench.interleaved(keys, interleave(keys, extra))
    if more is None:
        return None
    new, new_failed, timed_s = more
    for k, xs in new.items():
        runs[k].extend(xs)
    failed.update(new_failed)
    return timed_s


def _contributions(
    options: dict[str, dict[str, Any] | str],
    runs: dict[str, list[float]],
    failed: dict[str, str],
    params: dict[str, Any],
) -> tuple[dict[str, Contribution], bool]:
    """Each changed knob's contribution: the winner over the winner without it, paired by
    round; kept when it carries gain (``_carries``), or when it could not be measured. When
    none is kept, all are, together (the second value)."""
    out: dict[str, Contribution] = {}
    for k, p in options.items():
        key = f"without {k}"
        if isinstance(p, str):
            out[k] = Contribution(value=params[k], kept=True, why=f"cannot be removed alone: {p}")
        elif key in failed:
            why = f"the variant without it failed ({failed[key]})"
            out[k] = Contribution(value=params[k], kept=True, why=why)
        else:
            n = min(len(runs[WINNER]), len(runs[key]))  # paired by round
            sp = speedup_ci(runs[WINNER][:n], runs[key][:n], CONFIDENCE)
            out[k] = Contribution(
                value=params[k], speedup=[sp.low, sp.median, sp.high], kept=_carries(sp)
            )
    together = not any(c.kept for c in out.values())
    if together:
        for c in out.values():
            c.kept = True
    return out, together


#: Why a knob (or knobs set back together) is dropped: what ``_carries`` did not find.
NO_GAIN = f"less than {HELPS:.0%} and no gain beyond the noise"


def _carries(sp: Interval) -> bool:
    """Whether a knob (or knobs set back together) carries the winner's gain: the winner over
    itself without it has its 95 % interval above 1, or its median at ``HELPS`` (the
    screening's bar for a gain) or more, its interval still reaching 1. Few rounds prove only
    the largest gains: replayed 5-minute runs on the recorded default landscape ablated over
    2-3 rounds and dropped 5 MB buckets (a true 4.6 %) in a quarter of the seeds, exporting
    0.954 of the best point; keeping a median gain of 2 % or more, 85 % of the seeds export a
    point at 0.98 or more, against 62 %. A knob with less than that and no interval above 1
    is dropped: ``compile`` at 1.001x [0.980, 1.022] costs the job its compilation for
    nothing measured."""
    return sp.low > 1.0 or sp.median >= 1.0 + HELPS


def pin_contribution(validation: ValidationRecord) -> dict[str, Contribution]:
    """The allocator pin's row (``PIN``): the pinned defaults over the user's job as it runs
    today, as re-validation measured them; none where that was not measured."""
    today = validation.as_is
    if today is None or today.pin is None or None in today.pin.triple():
        return {}
    low, med, high = today.pin.triple()
    also = [c for c in today.changes if c != "the allocator pin"]  # e.g. the threads differ
    with_ = f", together with {' and '.join(also)}" if also else ""
    why = (
        f"not a knob: the defaults over your job as it runs today ({today.rounds} rounds, "
        f"new processes{with_}); every configuration was measured with it"
    )
    return {PIN: Contribution(value="on", kept=True, speedup=[low, med, high], why=why)}


def _shown(median: float, low: float, high: float) -> str:
    """A knob's ratio with its interval, to 3 decimals, or more where 3 would round a median
    under ``HELPS`` up to it (a median of 1.0197 read "1.020x ... dropped: less than 2%")."""
    digits = 3
    while digits < 6 and median < 1.0 + HELPS <= round(median, digits):
        digits += 1
    return ratio_interval(median, low, high, digits=digits)


def _say(record: AblationRecord, emit: Emit) -> None:
    for k, c in record.contributions.items():
        if c.speedup is None:
            emit(Note(f"  {k}={c.value}: kept ({c.why})"))
            continue
        low, med, high = c.speedup
        shown = _shown(med, low, high)
        if k == PIN:
            emit(Note(f"  {PIN}: {shown}, kept ({c.why})"))
        else:
            if not c.kept:
                verdict = f"dropped: {NO_GAIN}"
            elif low > 1.0 or record.together:
                verdict = "kept"
            elif med >= 1.0 + HELPS:
                verdict = f"kept: a gain of {HELPS:.0%} or more, not yet beyond the noise"
            else:  # set back in with the knobs checked together (``_check_joint``)
                verdict = "kept with the knobs checked together (below)"
            emit(Note(f"  {k}={c.value}: the winner is {shown} itself without it - {verdict}"))
    if record.together:
        emit(Note("No knob carries the gain alone beyond the noise: they are kept together"))
    if record.joint is not None:
        emit(Note(f"  without {', '.join(record.joint.knobs)} at once: {record.joint.why}"))


def _check_joint(bench: _Bench, knobs: list[str], reduced: TrialConfig, rounds: int) -> JointCheck:
    """The winner against ``reduced``: the winner with ``knobs`` (each of which failed to prove
    itself alone) set back at once, interleaved over at most ``rounds`` rounds. The knobs go
    back in (``kept_back``) when dropping them together costs more than the noise, or when the
    check cannot be made (too little budget left, a run failed): what is exported is then a
    measured configuration, the winner."""
    n = min(rounds, bench.budget.ablation_rounds(1))
    if n < 2:
        why = "not measured together (no budget left): kept"
        return JointCheck(knobs=knobs, rounds=n, kept_back=True, why=why)
    bench.emit(
        Note(f"Measuring trial {bench.number} {REDUCED} ({', '.join(knobs)}) once more: {n} rounds")
    )
    keys = [WINNER, REDUCED]
    done = bench.with_config(REDUCED, reduced).interleaved(keys, interleave(keys, n))
    if done is None or done[1]:
        return JointCheck(
            knobs=knobs, rounds=n, kept_back=True, why="a run of the check failed: kept"
        )
    runs, _, timed_s = done
    k = min(len(runs[WINNER]), len(runs[REDUCED]))
    sp = speedup_ci(runs[WINNER][:k], runs[REDUCED][:k], CONFIDENCE)
    kept_back = _carries(sp)
    verdict = "together they carry gain: kept" if kept_back else f"{NO_GAIN}: dropped"
    shown = _shown(sp.median, sp.low, sp.high)
    why = f"the winner is {shown} itself without them - {verdict}"
    return JointCheck(
        knobs=knobs,
        rounds=n,
        speedup=[sp.low, sp.median, sp.high],
        kept_back=kept_back,
        why=why,
        measurements={k: [round(x, 2) for x in xs] for k, xs in runs.items()},
        timed_s=round(timed_s, 3),
    )
