"""Re-validation: the search's best few configurations and the baseline measured again,
interleaved (A, B, C, A, ...), and the winner chosen from those numbers only
(``autotune.core.stats.choose``). The search's best value is biased upwards (the maximum of many
noisy measurements); these runs are not.

Each run measures ``rerun_windows`` windows (``MeasureSettings.rerun``): the comparison's
noise is between runs (the machine drifts), not between the windows of one run, so short runs
in more rounds say more than long runs in few (docs/search.md weighs 3 windows against 4).
Called from the main thread after the search, on the first placement group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from autotune.core.compare import choose, interleave
from autotune.core.errors import TrialFailed
from autotune.core.knobs import changed_knobs
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measure import Measurer
from autotune.launch.results import TrialResult
from autotune.record import trial as tr
from autotune.record.attrs import ValidationRecord, save
from autotune.record.study import anchored_speedups, baseline_trial, complete
from autotune.record.typed import read
from autotune.report.events import (
    Emit,
    Note,
    TrialStarted,
    ValidationDone,
    ValidationRun,
    ValidationStarted,
)

__all__ = ["candidates", "measure_interleaved", "revalidate"]


def candidates(study: optuna.Study, top: int) -> dict[str, optuna.trial.FrozenTrial]:
    """The ``top`` COMPLETE trials fastest against the defaults measured nearest to each in
    time (``record.study.anchored_speedup``) and above them, one per configuration, by key
    ``trial N``; never the defaults themselves."""
    base = baseline_trial(study)
    if base is None:
        return {}
    out: dict[str, optuna.trial.FrozenTrial] = {}
    seen = {tuple(sorted(base.params.items()))}
    done = complete(study)
    speedups = anchored_speedups(done)
    for t in sorted(done, key=lambda t: -speedups[t.number]):
        key = tuple(sorted(t.params.items()))
        if tr.is_baseline(t) or key in seen or speedups[t.number] <= 1.0:
            continue
        seen.add(key)
        out[f"trial {t.number}"] = t
        if len(out) == top:
            break
    return out


def measure_interleaved(
    keys: list[str],
    order: list[str],
    run: Callable[[str], TrialResult],
    emit: Emit,
    *,
    essential: str,
) -> tuple[dict[str, list[float]], dict[str, str], float] | None:
    """Measure each of ``keys`` in the ``order`` given with ``run`` (an interleaved design:
    every key once per round), saying each result (``ValidationRun``); a key whose run fails is not
    measured again. Returns each key's throughputs (a failed key's up to its failure), the
    failed keys with their reason, and the seconds inside timed windows; None as soon as the
    ``essential`` key fails (the comparison has no reference then). Re-validation and
    ablation (``autotune.search.ablation``) both measure this way."""
    runs: dict[str, list[float]] = {k: [] for k in keys}
    failed: dict[str, str] = {}
    timed_s = 0.0
    for key in order:
        if key in failed:
            continue
        try:
            result = run(key)
        except TrialFailed as e:
            failed[key] = f"{e.reason}: {e.detail}"
            emit(ValidationRun(key=key, failure=failed[key]))
            if key == essential:
                return None
            continue
        runs[key].append(result.throughput)
        timed_s += result.window_s
        ci = result.interval
        emit(ValidationRun(key=key, throughput=ci.median, rel_half_width=ci.rel_half_width))
    return runs, failed, timed_s


def revalidate(
    *,
    study: optuna.Study,
    definition: StudyDefinition,
    plan: tuple[int, int] | None,
    measure: Measurer,
    emit: Emit,
    defaults: dict[str, Any],
) -> ValidationRecord | None:
    """Measure the best ``plan[0]`` configurations and the baseline again over ``plan[1]``
    interleaved rounds; store the choice made from those numbers on the study (user attribute
    ``validation``) and return it. None when there is no plan, nothing above the baseline, the
    baseline failed, or every candidate failed. ``defaults``: the space's defaults, for what
    each run changes."""
    base = baseline_trial(study)
    if plan is None or base is None:
        return None
    top, rounds = plan
    picked = candidates(study, top)
    if not picked:
        emit(Note("No trial measured above the baseline: nothing to re-validate"))
        return None
    keys = ["baseline", *picked]
    order = interleave(keys, rounds)
    rerun = definition.measure.rerun()
    emit(ValidationStarted(candidates=list(picked), rounds=rounds, runs=len(order)))
    trials = {"baseline": base, **picked}

    def run(key: str) -> TrialResult:
        changes = changed_knobs(trials[key].params, defaults)
        emit(TrialStarted(tag=f"re-validating {key}", changes=changes))
        return measure(trials[key].number, tr.config(trials[key]), measure=rerun)

    done = measure_interleaved(keys, order, run, emit, essential="baseline")
    if done is None:
        emit(ValidationDone(winner=None, reason="The baseline failed: re-validation abandoned"))
        return None
    runs, failed, timed_s = done
    runs = {k: v for k, v in runs.items() if k not in failed}
    if len(runs) < 2:
        emit(ValidationDone(winner=None, reason="Every candidate failed: nothing to re-validate"))
        return None
    v = choose(runs, "baseline")
    record = read(ValidationRecord, {
        **v.to_dict(),
        "trials": {k: trials[k].number for k in runs},
        "order": order,
        "measurements": {k: [round(x, 2) for x in xs] for k, xs in runs.items()},
        "failed": failed,
        "timed_s": round(timed_s, 3),
        "after_trial": max(t.number for t in study.get_trials(deepcopy=False)),
    }, "validation")  # fmt: skip
    save(study, record)
    sp = v.speedup
    emit(ValidationDone(winner=v.winner, beats_baseline=v.beats_baseline,
                        speedup=(sp.low, sp.median, sp.high), reason=v.reason))  # fmt: skip
    return record
