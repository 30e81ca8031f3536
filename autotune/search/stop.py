"""Why the search stops: the rules (``reserve_for``, ``Convergence``) and one record, said in
the log, stored on the study (user attribute ``stop``) and shown by the report.

The kinds:

* ``budget``: the budget left no longer holds another trial and the reserve kept for what
  follows the search (re-validation, ablation, the limit probe: ``budget.Budget.reserve_s``),
  or it is spent;
* ``converged``: a GP over the trials so far (Optuna's ``RegretBoundEvaluator``) bounded what
  any unmeasured point could still gain within the measured run-to-run noise, for
  ``CONVERGED_TRIALS`` trials in a row (``search.Search``); the rest of the budget is returned;
* ``n_trials``, ``patience``, ``grid``: the user's limits, or an exhausted grid;
* ``interrupted``, ``cluster_lost``, ``error``: the run was stopped from outside.
"""

from __future__ import annotations

import statistics
import threading
import warnings
from typing import Any

import optuna

from autotune.core.knobs import changed_knobs
from autotune.core.values import number
from autotune.definition.studydef import StudyDefinition
from autotune.limit.evidence import Evidence
from autotune.record import trial as tr
from autotune.record.attrs import FirstMeasurement, StopRecord, load
from autotune.record.study import (
    anchored_speedups,
    anchors,
    baseline_trial,
    complete,
    nearest,
    throughput,
)
from autotune.record.typed import RecordError
from autotune.search.budget import rounds_to_tell

__all__ = ["Convergence", "noise_rel", "reserve_for"]
__all__ += ["search_lines"]

#: Completed trials before convergence is judged (the GP's own minimum is 20).
CONVERGE_MIN_TRIALS = 20
#: Trials in a row whose GP regret bound is within the noise before the search ends.
CONVERGED_TRIALS = 5
#: From this many completed trials on, convergence is judged every ``JUDGE_EVERY`` trials
#: only (a GP fit grows with the cube of the trials; a long search that has not converged
#: by then is rarely a trial away from it).
JUDGE_ALL_UP_TO = 60
JUDGE_EVERY = 5
#: The least relative noise convergence is judged against.
NOISE_FLOOR = 0.01
#: The least noise a candidate's gain is judged against (``screening.HELPS``).
LEAST_NOISE = 0.02


def noise_rel(study: optuna.Study) -> float:
    """The measured run-to-run noise, relative: the larger of the median trial's interval
    half-width and the spread of the defaults' runs (1.96 standard deviations over their
    mean, from three runs on), at least ``NOISE_FLOOR``."""
    done = complete(study)
    rel = statistics.median([tr.rel_noise(t) for t in done]) if done else 0.0
    runs = [throughput(t) for t in anchors(study)]
    if len(runs) >= 3:
        rel = max(rel, 1.96 * statistics.stdev(runs) / statistics.fmean(runs))
    return max(rel, NOISE_FLOOR)


def reserve_for(
    study: optuna.Study,
    defaults: dict[str, Any],
    d: StudyDefinition,
    rejected: frozenset[tr.Point] = frozenset(),
) -> tuple[int, int, int | None]:
    """(candidates that earn a re-validation reserve, knobs of the best one's ablation, the
    rounds they need: None for the plan's). ``defaults``: the baseline's params; ``rejected``:
    points a re-validation of this run already measured and did not bear out (a resumed
    search keeps no room for them: ``Search.resume``).

    A candidate earns a full reserve when it beats the defaults nearest it beyond its noise
    (the low end of its speedup above 1: its own interval, or that run of the defaults' if
    wider: the first baseline can read cold and noisy, ±29 % in a real run whose later runs of
    the defaults read ±3-14 %) and
    could still be the winner (its high end reaches the best such candidate's low end): room
    is kept for what the re-validation can choose. When none does, but some trial read above
    the defaults inside its noise, room to re-validate that one alone (no ablation): the
    export is then checked, not taken from one noisy trial. The rounds are sized by the gain
    (``stats.rounds_to_tell``) when one candidate alone could win: telling 1.8x from the
    defaults takes fewer rounds than telling 1.03x."""
    done = complete(study)
    speedups = anchored_speedups(done)
    base = baseline_trial(study)
    runs = [t for t in done if tr.is_baseline(t)]

    def floor(t: optuna.trial.FrozenTrial) -> float:
        """The noise of the run of the defaults ``t``'s speedup is taken against."""
        ref = nearest(runs, t)
        return tr.rel_noise(ref) if ref is not None else 0.0

    seen = set(rejected) if base is None else {*rejected, tr.point(base)}
    beyond: list[tuple[optuna.trial.FrozenTrial, float, float]] = []
    above = 0
    for t in sorted(done, key=lambda t: -speedups.get(t.number, 0.0)):
        key = tr.point(t)
        if tr.is_baseline(t) or key in seen:
            continue
        seen.add(key)
        speedup, noise = speedups.get(t.number, 0.0), max(tr.rel_noise(t), floor(t))
        above += speedup > 1
        if speedup * (1 - noise) > 1:
            beyond.append((t, speedup * (1 - noise), speedup * (1 + noise)))
    if not beyond:
        return min(above, 1), 0, None
    best_low = beyond[0][1]
    beyond = [b for b in beyond if b[2] >= best_low][: d.validate_top]
    if not beyond:  # --validate-top 0: nothing is re-validated
        return 0, 0, None
    ablate = len(changed_knobs(beyond[0][0].params, defaults)) if d.ablate else 0
    rounds = None
    if len(beyond) == 1:
        best = beyond[0][0]
        rounds = rounds_to_tell(best_low - 1, max(floor(best), tr.rel_noise(best), LEAST_NOISE))
    return len(beyond), ablate, rounds


class Convergence:
    """The convergence stop (module doc), judged once per completed trial (every
    ``JUDGE_EVERY`` from ``JUDGE_ALL_UP_TO`` on; a judgement then stands for the trials
    since); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calm = 0  # trials in a row whose regret bound was within the noise
        self._judged = -1  # completed trials when it was last judged
        self._gp_failed: str | None = None
        self.reached: str | None = None
        """Why the search converged, once it has."""

    def judge(self, study: optuna.Study) -> tuple[str | None, str | None]:
        """(why the search has converged, or None; a GP failure to say once, or None)."""
        done = [t for t in complete(study) if t.values]
        n = len(done)
        with self._lock:
            due = n > self._judged and (n <= JUDGE_ALL_UP_TO or n - self._judged >= JUDGE_EVERY)
            if self.reached or n < CONVERGE_MIN_TRIALS or not due:
                return self.reached, None
            self._judged = n
        from optuna.terminator import RegretBoundEvaluator

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                regret = RegretBoundEvaluator().evaluate(done, study.direction)
        except Exception as e:  # noqa: BLE001 - no estimate is no stop; the search goes on
            with self._lock:
                first, self._gp_failed = self._gp_failed is None, f"{type(e).__name__}: {e}"
            return None, (self._gp_failed if first else None)
        noise = noise_rel(study) * max(throughput(t) for t in done)
        with self._lock:
            self._calm = self._calm + 1 if regret < noise else 0
            if self._calm >= CONVERGED_TRIALS:
                self.reached = (
                    f"converged: for {CONVERGED_TRIALS} trials in a row a GP over the "
                    f"{len(done)} completed trials bounds what any point could still gain at "
                    f"{number(regret)} samples/s, within the noise ({number(noise)})"
                )
            return self.reached, None


def search_lines(study: optuna.Study) -> list[tuple[str, str]]:
    """What the first measurement found and why the search stopped, for the report: the
    records read back and checked (an unreadable one says so)."""
    out = []
    try:
        first = load(study, FirstMeasurement)
        if first is not None:
            out.append(("first measurement", Evidence.from_attrs(first.evidence).describe()))
    except (RecordError, ValueError) as err:
        out.append(("first measurement", f"unreadable ({err})"))
    try:
        if (stop := load(study, StopRecord)) is not None:
            out.append(("search stopped", stop.line()))
    except RecordError as err:
        out.append(("search stopped", f"unreadable ({err})"))
    return out
