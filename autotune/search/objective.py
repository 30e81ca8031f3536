"""The objective: what one search trial does, as Optuna calls it.

suggest → configuration → legality → measure → attributes → numerics verdict → value.

Every way a trial ends maps to one Optuna state in ``__call__``, as Optuna's own
``_optimize._run_trial`` maps exceptions: a measurement returns its value (COMPLETE); a trial
clearly below the incumbent raises ``TrialPruned`` (PRUNED); a ``TrialFailed`` is recorded
with its reason and re-raised for ``study.optimize(catch=...)`` (FAIL; the run goes on); a
failed baseline raises ``BaselineFailed`` and a lost cluster ``ClusterLost`` (both stop the
run); a trial whose ranks Ctrl-C or SIGTERM killed (``interrupted`` set by the main thread,
``search.Search._off_main``) is recorded ``interrupted``. Each measured or failed trial is
told to the budget and emitted as an event (a lost cluster stops the run instead, and the
caller says so).

Called by Optuna from the worker thread running the trial, never the main one; one
``Objective`` serves every thread of a run (its state is the study's, the budget's, behind
their own locks, and ``interrupted``).
"""

from __future__ import annotations

import math
import shutil
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from autotune.core.config import TrialConfig
from autotune.core.errors import (
    BaselineFailed,
    ClusterLost,
    FailureReason,
    TrialFailed,
)
from autotune.core.events import Emit, Note, Outcome, TrialFinished, TrialStarted
from autotune.core.knobs import changed_knobs
from autotune.core.numerics import changes_numerics, drift
from autotune.core.rank_io import kept_overhead_s
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.definition.space import ResolvedSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import Measurer
from autotune.record import trial as tr
from autotune.record.study import (
    DRIVER,
    anchors,
    baseline_trial,
    in_present_terms,
    incumbent,
    tag,
    throughput,
)
from autotune.search.budget import Budget
from autotune.search.failing import known_failing, queued_by_design
from autotune.search.first_look import Folded

__all__ = ["Objective", "keep_logs"]


@dataclass(frozen=True)
class _Kind:
    """Which run a trial is: of the defaults or not, and whether the defaults were measured
    before it (a later run of the defaults is an anchor)."""

    baseline: bool
    measured_before: bool

    @property
    def first(self) -> bool:
        """The first run of the defaults: the baseline every speedup is over."""
        return self.baseline and not self.measured_before


def keep_logs(trial: optuna.Trial, log_dir: Path | None) -> None:
    """Keep a trial's rank logs: their directory goes on the trial (``logs``). The rule: the
    baseline's and every failed trial's logs are kept; a trial that completes or is pruned
    has its logs deleted at once, so the directory grows only with failures."""
    if log_dir is not None and log_dir.is_dir():
        tr.save_logs(trial, str(log_dir))


class Objective:
    """The objective of one run's study."""

    def __init__(
        self,
        *,
        study: optuna.Study,
        space: ResolvedSpace,
        definition: StudyDefinition,
        measure: Measurer,
        budget: Budget,
        emit: Emit,
        tokens_per_sample: int | None = None,
        logs: Path | None = None,
    ) -> None:
        self.study, self.space, self.d = study, space, definition
        #: Where each trial's rank output goes (``trial-N/rank-R.log``); None: not kept.
        self.logs = logs
        self.measure = measure
        self.budget = budget
        self.emit = emit
        self.tokens_per_sample = tokens_per_sample  # language models: tokens/s recorded too
        #: Set on Ctrl-C or SIGTERM (``interrupt``): a trial failing now was killed by it.
        self.interrupted = threading.Event()
        #: What interrupted the run, for the trials it killed.
        self.interrupted_by = "Ctrl-C"
        self._lock = threading.Lock()
        self._dropped: set[str] = set()  # known failing values said (``_not_run``)
        #: The first measurement's settings, for the first run of the defaults to take after
        #: its windows (``first_look.fold_settings``); None: that run measures only itself.
        self.probe_with_baseline: dict[str, Any] | None = None
        #: What that probe measured and its seconds, once the baseline has run.
        self.baseline_probe: Folded | None = None

    def interrupt(self, by: str) -> None:
        """Ctrl-C or SIGTERM (``by``) landed on the search driver's main thread, which is
        killing every running trial: a trial failing from now on is recorded ``interrupted``."""
        self.interrupted_by = by
        self.interrupted.set()

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        tr.save_driver(trial, DRIVER)
        t0 = self.budget.now()
        values = self.space.suggest(trial)
        config = TrialConfig.from_values(values, self.space.target)
        tr.save_config(trial, config)
        # every measured run of the defaults: the first is the baseline, the latest the
        # nearest so far
        runs = anchors(self.study)
        # a run of the defaults after the first baseline: it re-anchors speedups, and failing
        # is a trial's failure, not the run's
        kind = _Kind(tr.is_baseline(trial), bool(runs))
        changes = changed_knobs(trial.params, self.space.defaults())
        if not queued_by_design(trial):
            found = known_failing(self.study, trial.params, self.space.defaults())
            if found is not None:
                raise self._not_run(trial, *found, changes=changes)
        self.emit(TrialStarted(tag=tag(trial), changes=changes))
        try:
            result = self._measure(trial, values, config, kind)
        except ClusterLost as e:
            tr.save_failure(trial, TrialFailed(FailureReason.CLUSTER_LOST, str(e)))
            raise
        except TrialFailed as e:
            raise self._failed(trial, e, kind, changes, t0) from None
        probe_s = self._probe_taken(result)
        result = replace(result, wall_s=result.wall_s - probe_s)  # the trial's own seconds
        # None: another driver's baseline is not measured yet (a shared study's first minutes)
        # an anchor's speedup is its drift from the first baseline
        ref = None if not runs else throughput(runs[0 if kind.baseline else -1])
        speedup = 1.0 if kind.first else result.throughput / ref if ref else None
        measured = tr.Measurement.of(result, speedup, self.tokens_per_sample)
        found: dict[str, Any] = {}
        # the first baseline is the reference; a later run of the defaults (an anchor) is an
        # fp32 rerun, which tells how exactly the workload repeats its steps
        drifted = None if kind.first else self._drift(config, measured.loss_curve, found)
        tr.save_measurement(trial, measured)
        tr.save_drift(trial, found)
        if not self.d.multi_objective:  # Optuna takes no intermediate values there
            for i, w in enumerate(result.windows):
                trial.report(w, i)  # the dashboard's intermediate values: one per window
        hopeless = result.ranks[0].stop == "hopeless"  # one-step windows: no rerun estimate
        if kind.first:  # what the defaults' trace will cost (``Budget.trace_s``)
            self.budget.defaults_step_s = result.step_time_s
        rerun_s, kept_s = (None, None) if hopeless else self._rerun_s(result)
        self.budget.trial_done(self.budget.now() - t0 - probe_s, rerun_s, kept_s)
        if drifted is not None:  # over pruning too: the more telling verdict
            self._fail(trial, drifted, changes)
            raise drifted
        self._finished(trial, result, speedup, changes)
        if result.pruned:
            if result.ranks[0].stop == "hopeless":
                raise optuna.TrialPruned(
                    f"in warm-up: its steps ran at {result.throughput:.1f} samples/s, "
                    f"{self.d.measure.hopeless_factor:g}x or more below the incumbent's interval"
                )
            raise optuna.TrialPruned(
                f"upper bound {result.interval.high:.1f} below the incumbent's interval"
            )
        if self.d.multi_objective:
            return result.throughput, result.peak_memory_mb
        return result.throughput

    def _measure(
        self, trial: optuna.Trial, values: dict[str, Any], config: TrialConfig, kind: _Kind
    ) -> TrialResult:
        """Measure ``trial``'s configuration, keeping the rank logs the rule keeps."""
        log_dir = None if self.logs is None else self.logs / f"trial-{trial.number}"
        illegal = self.space.illegal(values)
        if illegal:
            raise TrialFailed(FailureReason.ILLEGAL, illegal)
        # Pruning compares throughput only: it would cut memory-lean configurations short
        # in a multi-objective study, and Optuna has no pruning there.
        prune = not (kind.baseline or self.d.multi_objective)
        bar = self._bar(trial) if prune else None
        limit = self.probe_with_baseline if kind.first else None
        try:
            result = self.measure(trial.number, config, bar, log_dir=log_dir, limit=limit)
        except TrialFailed as e:
            keep_logs(trial, log_dir)  # a failure's output is what the user reads first
            if log_dir is None or not log_dir.is_dir() or str(log_dir) in e.detail:
                raise
            raise TrialFailed(e.reason, f"{e.detail} (output in {log_dir})") from None
        except BaseException:
            keep_logs(trial, log_dir)
            raise
        if kind.first:
            keep_logs(trial, log_dir)  # what the defaults printed, to compare with
        elif log_dir is not None:  # a trial that ran: its output is not kept
            shutil.rmtree(log_dir, ignore_errors=True)
        return result

    def _probe_taken(self, result: TrialResult) -> float:
        """Keep what a probe after the windows measured (``baseline_probe``); its seconds
        (0: none was taken), which are the first measurement's, not the trial's."""
        rank = result.ranks[0]
        if self.probe_with_baseline is None or rank.limit is None:
            return 0.0
        self.baseline_probe = (rank.limit, rank.probe_s)
        return rank.probe_s

    def _failed(
        self, trial: optuna.Trial, e: TrialFailed, kind: _Kind, changes: dict, t0: float
    ) -> Exception:
        """Record a failed trial and tell the budget; what to raise: the failure, or
        ``BaselineFailed`` when the first run of the defaults failed."""
        failure = e
        if self.interrupted.is_set():  # its ranks were killed by Ctrl-C in another thread
            failure = TrialFailed(
                FailureReason.INTERRUPTED, f"{self.interrupted_by} during the trial"
            )
        wall = self.budget.now() - t0
        tr.save_wall(trial, wall)
        self.budget.trial_done(wall)
        self._fail(trial, failure, changes)
        if kind.first:
            return BaselineFailed(
                f"the baseline trial (PyTorch defaults) failed: {failure}; the workload "
                f"must run with the defaults before it can be tuned"
            )
        return failure

    def _rerun_s(self, result: TrialResult) -> tuple[float, float | None]:
        """What a re-measurement run of this configuration will cost: the trial's overhead
        (its set-up and the same warm-up), and its windows; and a later run on its kept
        session (``rank.kept``: a discarded step and the windows), None where the measurer
        keeps none."""
        windows_s = self.d.measure.rerun_windows * result.window_s / len(result.windows)
        kept = kept_overhead_s(result.step_time_s) + windows_s
        return result.overhead_s + windows_s, kept if self.measure.keeps_sessions else None

    def _bar(self, trial: optuna.Trial) -> Interval | None:
        """The interval a trial is pruned below: the incumbent's; for a screening trial the
        baseline's, since screening asks whether a knob beats the defaults, not the best;
        either as the machine runs now (``record.study.in_present_terms``)."""
        if tr.screen_label(trial) is not None:
            runs = anchors(self.study)  # the first is the baseline (``baseline_trial``)
            if runs and (bar := in_present_terms(runs, runs[0])) is not None:
                return bar
        return incumbent(self.study)

    def _finished(
        self, trial: optuna.Trial, result: TrialResult, speedup: float | None, changes: dict
    ) -> None:
        self.emit(
            TrialFinished(
                tag=tag(trial),
                number=trial.number,
                outcome=Outcome.PRUNED if result.pruned else Outcome.COMPLETE,
                elapsed_s=self.budget.elapsed_s(),
                changes=changes,
                throughput=result.interval.median,
                rel_half_width=result.interval.rel_half_width,
                windows=len(result.windows),
                speedup=speedup,
            )
        )

    def _not_run(
        self, trial: optuna.Trial, value: str, fails: int, reasons: str, *, changes: dict
    ) -> TrialFailed:
        """``trial`` proposes ``value``, known failing (``search.failing``): recorded FAIL
        without running, said in one line the first time the value is dropped."""
        with self._lock:
            first = value not in self._dropped
            self._dropped.add(value)
        if first:
            self.emit(
                Note(
                    f"Not run again: {value} failed in all {fails} trials with it ({reasons}); "
                    "the sampler's trials with it are recorded known_failing without running"
                )
            )
        failure = TrialFailed(
            FailureReason.KNOWN_FAILING,
            f"{value} failed in all {fails} earlier trials with it ({reasons})",
        )
        tr.save_wall(trial, 0.0)
        self._fail(trial, failure, changes)  # a trial of the study: its line and its record
        return failure

    def _fail(self, trial: optuna.Trial, failure: TrialFailed, changes: dict) -> None:
        """Record why ``trial`` fails and say so."""
        tr.save_failure(trial, failure)
        self.emit(
            TrialFinished(
                tag=tag(trial),
                number=trial.number,
                outcome=Outcome.FAILED,
                elapsed_s=self.budget.elapsed_s(),
                changes=changes,
                reason=str(failure.reason),
                detail=failure.detail,
            )
        )

    def _drift(
        self, config: TrialConfig, curve: list[float], attrs: dict[str, Any]
    ) -> TrialFailed | None:
        """The numerics guard (``autotune.core.numerics``): record the drift of a configuration that
        changes numerics in ``attrs``; the failure to record when it is over the tolerance and
        the study does not allow drift.

        An fp32 trial's curve is compared with the baseline's as well and kept as
        ``fp32_drift``: the workload's own run-to-run difference. Built-in workloads repeat
        their steps exactly (far below 0.1 %); a script that seeds neither its model nor its
        data order does not, and then no verdict is given (``numerics_unjudged`` says why)."""
        changed = changes_numerics(config)
        base = baseline_trial(self.study)
        base_curve = None if base is None else tr.loss_curve(base)
        stored = (tr.config_dict(base) or {}) if base is not None else {}
        if base is not None and stored.get("global_batch") != config.global_batch:
            base_curve = None  # --free-batch: other samples per step, no like-for-like curve
        found = drift(curve, base_curve) if base_curve else None
        if found is None:
            return None
        value, steps = found
        # an fp32 trial's drift is the workload's own repeat error, not a verdict on it
        attrs["numerics_drift" if changed else "fp32_drift"] = (
            round(value, 5) if math.isfinite(value) else "inf"
        )
        if not changed:
            return None
        tol = self.d.drift_tolerance
        if value <= tol or self.d.allow_drift:
            return None
        floor = self._fp32_drift()
        # a seeded script repeats within 0.1 %; one seeded from the clock differed by 3.7 %
        if floor > tol / 5:
            attrs["numerics_unjudged"] = (
                f"fp32 runs of this workload differ from the baseline's by up to {floor:.1%}: "
                f"its steps do not repeat (seed the model and the data order)"
            )
            return None
        return TrialFailed(
            FailureReason.NUMERICS_DRIFT,
            f"{' '.join(changed)}: the loss of the first {steps} steps differs from the fp32 "
            f"baseline's by {value:.1%} (tolerance {tol:.0%}); --allow-drift keeps such settings",
        )

    def _fp32_drift(self) -> float:
        """The largest ``fp32_drift`` recorded so far in the study (0 when none)."""
        seen = [tr.fp32_drift(t) for t in self.study.get_trials(deepcopy=False)]
        return max((x for x in seen if x is not None), default=0.0)
