"""The search driver: the baseline first, then the first measurement of the defaults, then
trials until a stop.

The first measurement (``search.first_look.first_measurement``) is the limit probe of the baseline's
configuration, taken once and stored on the study (``record.attrs.FirstMeasurement``): it orders the
screening by expected gain and skips what cannot help (``screening.plan``). Where the measurer can
(``folds_probe``), the baseline trial takes it after its own windows, in the same session
(``first_look.fold_settings``): no set-up and warm-up of its own. The search stops
for one of the reasons in ``autotune.search.stop``, each said in one line and stored on the study:

* **budget**: another trial and the reserve no longer fit. The reserve covers the
  re-validation and ablation of the candidates that beat the defaults *beyond their noise*
  (a candidate within it earns no room of its own), and the limit probe. While screening
  priors whose expected gain is beyond the noise are untried and more than a third of the
  budget is left, the reserve does not stop the search (``UNTRIED_SHARE``).
* **converged** (``--no-early-stop`` turns it off): once the screening is done and at least
  ``stop.CONVERGE_MIN_TRIALS`` trials completed, after each trial (every 5th from 60 on) a GP
  over them (Optuna's ``RegretBoundEvaluator``) bounds how much any point of the space could
  still beat the best by; when that bound is below the measured run-to-run noise
  (``stop.noise_rel`` of the best) ``stop.CONVERGED_TRIALS`` times in a row, the search ends
  and the rest of the budget goes back (``stop.Convergence``).
* ``--n-trials``, ``--patience``, an exhausted grid.

Every trial runs on a worker thread, one per placement group, each calling
``study.optimize(n_trials=1)`` in turn; Optuna's storage hands each thread its trial, and
TPE's constant liar sees the trials in flight. Every trial keeps Optuna's own life cycle
(states, ``catch``, callbacks), and the objective (``objective.Objective``) maps its ends to
states.

The main thread only waits (``_off_main``). Ctrl-C (or SIGTERM, ``errors.Terminated``) lands
there, never inside Optuna's ask or tell (an interrupt there left a trial RUNNING): it marks
the objective ``interrupted``, kills every running trial's ranks (``Measurer.abort``), so each
trial fails and is recorded ``interrupted`` by its own thread, waits for the threads, and
re-raises to the caller, which exports the best profile so far.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence

import optuna
from optuna.trial import TrialState

from autotune.core.errors import FailureReason, InterruptedAgain, TrialFailed, interrupted_by
from autotune.core.events import BudgetStarted, Emit, Note
from autotune.definition.space import ResolvedSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import Measurer, Placement
from autotune.record import trial as tr
from autotune.record.attrs import StopRecord, save
from autotune.record.study import (
    baseline_trial,
    baselines,
    complete,
    enqueue_anchor,
    enqueue_baseline,
    throughput,
)
from autotune.search.budget import Budget
from autotune.search.first_look import first_measurement, fold_settings
from autotune.search.objective import Objective
from autotune.search.screening import Screening
from autotune.search.stop import Convergence, reserve_for

__all__ = ["ANCHOR_EVERY", "BASELINE_POLL_S", "Search"]

#: Trials recorded without running (``search.failing``): not counted as trials run.
KNOWN = FailureReason.KNOWN_FAILING.value

#: Seconds between looks at a baseline another driver is running.
BASELINE_POLL_S = 2.0
#: Trials between two runs of the defaults (``Search._reanchor``).
ANCHOR_EVERY = 10
#: How long Ctrl-C waits for the aborted trials to be recorded.
ABORT_WAIT_S = 30.0
#: While more than this share of the budget is left, untried screening priors whose expected
#: gain is beyond the noise are screened whatever the reserve would say.
UNTRIED_SHARE = 1 / 3


class Search:
    """Trials of ``study`` on ``runners`` until ``budget`` is spent."""

    def __init__(
        self,
        *,
        study: optuna.Study,
        space: ResolvedSpace,
        definition: StudyDefinition,
        runners: Sequence[Placement],
        objective: Objective,
        measure: Measurer,
        budget: Budget,
        emit: Emit,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.study = study
        self.space = space
        self.d = definition
        self.runners = runners
        self.objective = objective
        self.measure = measure
        self.budget = budget
        self.emit = emit
        #: Called from the main thread before the baseline, between trials and while waiting
        #: for concurrent trials (``tuner`` re-asserts its SIGTERM handler there).
        self.tick = tick or (lambda: None)
        d = definition
        self.screening = Screening(study, space) if d.screening and d.sampler != "grid" else None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._asking = threading.Lock()  # taking the next trial, with concurrent trials
        self._held = threading.local()
        self._finished = 0  # trials this invocation ran to an end
        self._stale = 0  # of them, in a row, not better than the best before them
        self._said_no_reserve = False  # the search goes on without a reserve: said once
        self._best: float | None = None
        self.stop: StopRecord | None = None
        """Why the search stopped (``autotune.search.stop``)."""
        self.rejected: frozenset[tr.Point] = frozenset()
        """Points the reserve keeps no room for (``resume``)."""
        self._convergence = Convergence()

    def run(self) -> None:
        """Search until the budget is spent (or a trial stops the run by raising)."""
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.budget.start()
        self.tick()
        self.emit(BudgetStarted(budget_s=self.budget.total_s, spent_s=self.budget.elapsed_s()))
        with self.budget.phase("search"):  # the baseline and the first measurement included
            if not self._search():
                return
        self._said_stop()

    def resume(self, rejected: frozenset[tr.Point], why: str) -> None:
        """Search again, after the search stopped on the budget and what followed it returned
        time (``search.assembly``): trials until a stop, as ``run``'s, with no room kept for
        the ``rejected`` points (a re-validation measured them and did not bear them out).
        ``why`` is said first; the new stop is said and stored as the first was."""
        self.emit(Note(why))
        self.rejected = rejected
        self.stop = None
        with self.budget.phase("search"):
            self._off_main([lambda r=r: self._trials_on(r) for r in self.runners])
        self._said_stop()

    def _said_stop(self) -> None:
        """Say and store why the search stopped (the budget, when every thread found it
        spent)."""
        if self.stop is None:
            self._stopped("budget", "the budget is spent")
        assert self.stop is not None
        self.emit(Note(self.stop.line()))
        save(self.study, self.stop)

    def _search(self) -> bool:
        """The baseline, the first measurement, the trials (``run``); False when the budget
        ran out before the baseline."""
        if self.screening is not None:  # the first measurement after the baseline's windows
            self.objective.probe_with_baseline = fold_settings(self.study, self.d, self.measure)
        ready: list[bool] = []
        self._off_main([lambda: ready.append(self._baseline_first())])
        self.objective.probe_with_baseline = None
        if not ready or not ready[0]:
            return False
        with self._lock:  # a resumed study: --patience counts from the best it already has
            self._best = max((throughput(t) for t in complete(self.study)), default=None)
        if self.screening is not None:
            self._off_main([self._first_look])
        self._off_main([lambda r=r: self._trials_on(r) for r in self.runners])
        return True

    def _stopped(self, kind: str, why: str, kept_s: float = 0.0) -> None:
        """Record the first reason the search stops (later threads find it set)."""
        with self._lock:
            if self.stop is not None:
                return
            self.stop = StopRecord(
                kind=kind,
                why=why,
                at_s=self.budget.elapsed_s(),
                budget_s=self.budget.total_s,
                kept_s=kept_s,
            )

    def record_stop(self, kind: str, why: str) -> None:
        """The run was stopped from outside the search (``tuner``): record and store why,
        unless the search had stopped already (then the stop came during what follows it)."""
        if self.stop is not None:
            return
        self._stopped(kind, why)
        assert self.stop is not None
        # the storage that stopped the run may be gone: the log line is said all the same
        with contextlib.suppress(Exception):
            save(self.study, self.stop)
        self.emit(Note(self.stop.line()))

    def _first_look(self) -> None:
        """The first measurement (``search.first_look``), given to the screening."""
        assert self.screening is not None
        self.screening.evidence = first_measurement(
            study=self.study,
            space=self.space,
            measure=self.measure,
            definition=self.d,
            budget=self.budget,
            emit=self.emit,
            folded=self.objective.baseline_probe,
        )

    def _one_trial(self, serial: bool = False) -> None:
        """One trial through ``study.optimize``. ``serial``: take the trial (Optuna's ask,
        which pops a queued trial first) under a lock, so that two threads never pop the same
        queued trial (SQLite has no row lock: both would run it, and the second to tell it
        fails); the lock is let go as soon as the objective starts."""
        if not serial:
            self.study.optimize(
                self.objective, n_trials=1, catch=(TrialFailed,), callbacks=[self._between_trials]
            )
            return
        self._asking.acquire()
        self._held.value = True
        try:
            self.study.optimize(
                self._taken, n_trials=1, catch=(TrialFailed,), callbacks=[self._between_trials]
            )
        finally:
            self._let_go()

    def _taken(self, trial: optuna.Trial) -> float | tuple[float, float]:
        """The objective, once this thread holds its trial."""
        self._let_go()
        return self.objective(trial)

    def _let_go(self) -> None:
        if getattr(self._held, "value", False):
            self._held.value = False
            self._asking.release()

    def _baseline_first(self) -> bool:
        """Measure the baseline before any other trial: every speedup, the trial timeout and
        the pruning bar come from it. Where several drivers share the study, the one that
        takes the enqueued baseline runs it and the others wait for it. False when the budget
        ran out first."""
        said = False
        while baseline_trial(self.study) is None:
            if self.budget.left_s() <= 0 or self._stop.is_set():
                return False
            states = [t.state for t in baselines(self.study)]
            if TrialState.WAITING in states:
                self._one_trial()  # Optuna takes the enqueued (WAITING) trial first
            elif TrialState.RUNNING in states:
                if not said:
                    self.emit(Note("Waiting for the baseline, run by another driver"))
                    said = True
                # a driver that died (kill -9) leaves it RUNNING: Optuna's heartbeat fails it
                optuna.storages.fail_stale_trials(self.study)
                time.sleep(BASELINE_POLL_S)
            else:  # another driver's baseline failed, or was never enqueued: run one here
                enqueue_baseline(self.study, self.space)
        return True

    def _count(self, trial: optuna.trial.FrozenTrial) -> None:
        """``trial`` has ended: count it for ``--n-trials`` and ``--patience`` (a trial not run,
        its value known failing, is not counted: ``search.failing``)."""
        if trial.state == TrialState.FAIL and tr.reason(trial) == KNOWN:
            return
        value = trial.values[0] if trial.state == TrialState.COMPLETE and trial.values else None
        with self._lock:
            self._finished += 1
            if value is not None and (self._best is None or value > self._best):
                self._best, self._stale = value, 0
            elif not tr.is_baseline(trial):
                self._stale += 1

    def _limit_reached(self) -> bool:
        d = self.d
        sampler = self.study.sampler
        with self._lock:
            if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(
                self.study
            ):  # what its study.stop() ended with one study.optimize call
                why = ("grid", "every point of the grid is measured")
            elif d.n_trials is not None and self._finished >= d.n_trials:
                why = ("n_trials", f"--n-trials {d.n_trials}: {self._finished} trials run")
            elif d.patience is not None and self._stale >= d.patience:
                why = (
                    "patience",
                    f"--patience {d.patience}: {self._stale} trials in a row did not beat the best",
                )
            else:
                return False
        self._stopped(*why)
        return True

    def _room_for_another(self) -> bool:
        """Whether another trial is to run: no limit reached, not converged, and the budget
        holds the trial and the reserve (module doc); the first reason to stop is recorded."""
        left = self.budget.left_s()
        if left <= 0:
            self._stopped("budget", "the budget is spent")
            return False
        if self._limit_reached() or self._converged():
            return False
        wall = self.budget.trial_s()
        if wall is None:
            return True
        if self._untried_beyond_noise() and left > UNTRIED_SHARE * self.budget.total_s:
            if left >= wall:  # the evidence says a prior can gain: screen it first
                return True
            self._stopped("budget", f"{left:.0f} s left, less than a trial ({wall:.0f} s)")
            return False
        qualify, ablate, rounds = reserve_for(
            self.study, self.space.baseline_params(), self.d, self.rejected
        )
        kept = self.budget.reserve_s(to_revalidate=qualify, ablate=ablate, rounds=rounds)
        if left >= wall + kept:
            if left < 2 * wall + kept:  # the last trial: the helpers' combination, if due
                self._partners_first(left, wall, kept)
            return True
        if self._partners_first(left, wall, self.budget.reserve_s(to_revalidate=1, rounds=rounds)):
            return True
        if self.budget.nothing_to_keep():  # the reserve would go back unused: trials instead
            return self._on_without_reserve(left, wall)
        what = f"{qualify} candidate(s)" if qualify else "no candidate"
        self._stopped(
            "budget",
            f"{left:.0f} s left does not hold a trial ({wall:.0f} s) and the {kept:.0f} s kept "
            f"for re-validating {what}"
            + (
                f" and ablating {ablate} knobs"
                if qualify and ablate >= 2 and self.budget.reserve_keeps_ablation()
                else ""
            )
            + (" and the limit probe" if self.budget.limit_runs else ""),
            kept_s=kept,
        )
        return False

    def _on_without_reserve(self, left: float, wall: float) -> bool:
        """The budget left holds no re-validation at all (``Budget.nothing_to_keep``): the
        search goes on while a trial and the limit probes fit, said once, and the export will be
        the best trial as measured; else it stops, saying so."""
        probe = " and the limit probe" if self.budget.limit_runs else ""
        if not self.budget.holds(wall, wall):
            why = f"{left:.0f} s left does not hold a trial ({wall:.0f} s){probe}"
            self._stopped("budget", why)
            return False
        if not self._said_no_reserve:
            self._said_no_reserve = True
            self.emit(
                Note(
                    f"Nothing kept for re-validation: the {left:.0f} s left hold not even one "
                    "candidate over 2 rounds; the search goes on while the budget holds a "
                    f"trial ({wall:.0f} s){probe}, and the best is exported as measured"
                )
            )
        return True

    def _partners_first(self, left: float, wall: float, kept: float) -> bool:
        """Whether the screened helpers' combination is the next trial, the last the budget
        holds with ``kept`` seconds kept after it: it is due (``Screening.claim_partners``) and
        comes before the run of the defaults that closes the screening, said in one line."""
        s = self.screening
        if s is None or left < wall + kept or not s.claim_partners():
            return False
        self.emit(
            Note(
                f"The screened helpers' combination runs next, before the search stops: "
                f"{left:.0f} s left hold one more trial ({wall:.0f} s) and the {kept:.0f} s "
                "kept after it, not also the run of the defaults that closes the screening"
            )
        )
        return True

    def _untried_beyond_noise(self) -> bool:
        """Untried screening priors whose expected gain is beyond the noise (the plan keeps
        only those, and the unmodelled ones, whose gain is None)."""
        if self.screening is None:
            return False
        return any(p.gain is not None for p in self.screening.untried())

    def _converged(self) -> bool:
        """The convergence stop (module doc; ``stop.Convergence``), once the screening is done
        and unless ``--no-early-stop``, a multi-objective study or a grid."""
        d = self.d
        if not d.early_stop or d.multi_objective or d.sampler == "grid":
            return False
        if self.screening is not None and self.screening.is_open():
            return False
        why, failed = self._convergence.judge(self.study)
        if failed:
            self.emit(
                Note(
                    f"Convergence not judged: the GP over the trials failed ({failed}); "
                    "the budget stops the search"
                )
            )
        if why is None:
            return False
        self._stopped(
            "converged",
            f"{why}; {self.budget.left_s():.0f} s of the budget "
            "returned (--no-early-stop searches on)",
        )
        return True

    def _between_trials(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna's callback after each trial: count it."""
        self._count(trial)

    def _queue_next(self) -> None:
        """Queue the designed start's next trial, or a run of the defaults when one is due;
        called only when another trial fits and is asked for at once, so a stop leaves
        nothing queued."""
        if self.screening is not None:
            done = self.screening.step()
            if done is not None:
                self.emit(done)
        self._reanchor()

    def _reanchor(self) -> None:
        """Queue a run of the defaults when ``ANCHOR_EVERY`` trials have ended since the last:
        speedups are taken against the defaults measured nearest in time, so neither a cold
        first baseline nor the slow drift of a shared machine biases them."""
        with self._lock:
            trials = self.study.get_trials(deepcopy=False)
            marked = [t for t in trials if tr.is_baseline(t)]
            if any(not t.state.is_finished() for t in marked):
                return  # one is queued or running
            last = max((t.number for t in marked), default=-1)
            since = [t for t in trials if t.number > last and tr.reason(t) != KNOWN]
            if sum(t.state.is_finished() for t in since) >= ANCHOR_EVERY:
                enqueue_anchor(self.study, self.space, f"every {ANCHOR_EVERY} trials")

    def _trials_on(self, runner: Placement) -> None:
        """One worker thread: trials on ``runner``, one after another, until the budget, a
        limit or a stop. A cluster with no room left raises ``ClusterLost`` before a trial is
        asked for in vain."""
        self.measure.use(runner)
        while not self._stop.is_set() and self._room_for_another():
            runner.ensure_placed()
            self._queue_next()  # right before this thread asks for its next trial
            self._one_trial(serial=True)

    def _off_main(self, jobs: list[Callable[[], object]]) -> None:
        """Run each of ``jobs`` on its own thread while the main thread waits and ticks. The
        first error of any job (``ClusterLost``, ``BaselineFailed``, a bug) stops them all and
        is raised here; Ctrl-C stops them as the module doc says. The wait is on events, not
        ``Thread.join``: a join that Ctrl-C interrupts can mark a running thread stopped
        (CPython 3.11, ``Thread._wait_for_tstate_lock``)."""
        errors: list[BaseException] = []
        done: list[threading.Event] = []  # one per thread started

        def work(job: Callable[[], object], finished: threading.Event) -> None:
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - raised again from the main thread
                errors.append(e)
                self._stop.set()
            finally:
                finished.set()

        try:  # Ctrl-C can land while a thread starts, and its trial may be running by then
            for i, job in enumerate(jobs):
                finished = threading.Event()
                name = f"trial-runner-{i}"
                thread = threading.Thread(target=work, args=(job, finished), name=name, daemon=True)
                done.append(finished)  # before start(): Ctrl-C can land inside it
                thread.start()
            while not all(e.is_set() for e in done):
                self.tick()
                next(e for e in done if not e.is_set()).wait(timeout=0.5)
        except KeyboardInterrupt as e:
            self.objective.interrupt(interrupted_by(e))
            self._stop.set()
            self.measure.abort()
            deadline = time.monotonic() + ABORT_WAIT_S
            try:
                for finished in done:
                    finished.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except KeyboardInterrupt as again:  # pressed twice: not the first, handled again
                raise InterruptedAgain() from again
            raise
        if errors:
            raise errors[0]
