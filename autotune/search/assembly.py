"""The run's components, built in one place from a study definition and a measurer.

``assemble`` wires, over one opened study and its resolved space, what ``autotune run`` does
between opening the study and exporting the profile:

* the ``Budget`` of the definition, on ``clock`` (from ``started`` when the command's start
  counts);
* the ``Objective`` Optuna calls for each search trial, measuring with ``measure``;
* the ``Search`` driving the trials on ``measure.runners``, one thread each;
* and, on the returned ``Assembly``, ``conclude()``: what follows the search - re-validate the
  best few against the baseline, interleaved (``validation.revalidate``), then ablate the
  winner (``ablation.ablate``). Where the search stopped on the budget and that chose nothing,
  the time the plan kept for a winner goes back to the search (``Search.resume``) while it
  holds ``RESUME_TRIALS`` trials and a new candidate's room, and the new trials are
  re-validated in turn (the candidates already measured are not); what is left then goes to
  more rounds (``validation.more_rounds``).

``measure`` is any ``launch.measurer.Measurer`` (a Protocol). Two callers pass one:

* ``tuner.run``, the real run: the Ray-backed ``launch.measurer.RayMeasurer`` over the run's
  placement groups, the wall clock from the command's start, the SIGTERM ``tick``, the rank
  logs' directory and the workload's tokens per sample;
* ``replay.simulate.replay``, the replay benchmark: its recorded-landscape
  ``ReplayMeasurer``, whose simulated clock is the budget's.

Both then call ``search.run()`` and ``conclude()``; the limit probes and the export stay the
real run's (``tuner``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autotune.core.events import Emit, Note
from autotune.definition.space import ResolvedSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import Measurer
from autotune.rank.limit_probe import PROFILED_STEPS
from autotune.record.attrs import ValidationRecord
from autotune.search.ablation import ablate
from autotune.search.budget import Budget
from autotune.search.loop import Search
from autotune.search.objective import Objective
from autotune.search.stop import reserve_for
from autotune.search.validation import candidates, more_rounds, rejected, revalidate

#: Search trials the budget left must hold, beside the room a new candidate needs, for the
#: search to resume after a re-validation that chose nothing (``Assembly._resume``): one
#: trial is a single draw, and the re-validation's room would be spent on it.
RESUME_TRIALS = 2

__all__ = ["Assembly", "assemble"]


@dataclass(frozen=True, kw_only=True)
class Assembly:
    """One run's components (``assemble``)."""

    study: optuna.Study
    space: ResolvedSpace
    definition: StudyDefinition
    measure: Measurer
    budget: Budget
    objective: Objective
    search: Search
    emit: Emit
    #: Where the re-validation's first run of the defaults writes their Chrome trace (the run's
    #: ``logs/limit``; None: no trace is taken): the first measurement takes none
    #: (``search.first_look``).
    defaults_trace: Path | None = None
    #: The traces this run took, by the limit probe's label (``baseline``), for its record.
    traced: dict[str, Path] = field(default_factory=dict)

    def validation_plan(self) -> tuple[int, int] | None:
        """The re-validation's (candidates, rounds) now (``Budget.validation_plan``), for
        what the reserve kept (``stop.reserve_for``): the candidates that could still win,
        and the knobs and rounds of the best one's ablation, whose share it leaves."""
        contenders, knobs, rounds = reserve_for(
            self.study, self.space.baseline_params(), self.definition, self.search.rejected
        )
        return self.budget.validation_plan(knobs, rounds, contenders=contenders)

    def conclude(self) -> None:
        """What follows the search (module doc): re-validate and ablate (``_choose``); where
        that chose nothing and left room, search again and choose among the new trials
        (``_resume``); then, where the search stopped on the budget, spend what is left on more
        rounds (``validation.more_rounds``). A search that converged, or that ``--n-trials``
        or ``--patience`` ended, gives the time left back."""
        checked = self._choose()
        if self._resume(checked):
            checked = self._choose(earlier=checked) or checked
        stop = self.search.stop
        if stop is not None and stop.kind == "budget":
            with self.budget.phase("re-validation"):
                more_rounds(
                    study=self.study,
                    record=checked,
                    measure=self.measure,
                    emit=self.emit,
                    definition=self.definition,
                    budget=self.budget,
                    defaults=self.space.defaults(),
                )

    def _choose(self, earlier: ValidationRecord | None = None) -> ValidationRecord | None:
        """Re-validate the best few against the baseline, interleaved
        (``validation.revalidate``; ``earlier``: the re-validation before a resumed search),
        then ablate the winner (``ablation.ablate``)."""
        with self.budget.phase("re-validation"):
            checked = revalidate(
                study=self.study,
                definition=self.definition,
                plan=self.validation_plan(),
                measure=self.measure,
                emit=self.emit,
                defaults=self.space.defaults(),
                budget=self.budget,
                earlier=earlier,
                trace=None if "baseline" in self.traced else self.defaults_trace,
                traced=self.traced,
            )
        with self.budget.phase("ablation"):
            ablate(
                study=self.study,
                definition=self.definition,
                space=self.space,
                validation=checked,
                budget=self.budget,
                measure=self.measure,
                emit=self.emit,
            )
        return checked

    def _resume(self, checked: ValidationRecord | None) -> bool:
        """Whether to choose again (``_choose``), after a search that stopped on the budget
        and a re-validation that chose nothing: the plan kept time for a winner's ablation.
        The candidates that re-validation measured are set aside (``validation.rejected``).
        Where the budget left holds ``RESUME_TRIALS`` trials beside the room the resumed search
        would keep (``stop.reserve_for`` over the trials not set aside; ``Budget.search_room``),
        the search resumes first (``Search.resume``); where it does not, but trials above the
        defaults were not reached, those are re-validated next, without searching."""
        stop = self.search.stop
        if stop is None or stop.kind != "budget" or (checked and checked.beats_baseline):
            return False
        set_aside = rejected(self.study, checked)
        qualify, ablate, rounds = reserve_for(
            self.study, self.space.baseline_params(), self.definition, set_aside
        )
        # the comparison with the job as it runs today, once measured with the defaults, is
        # not kept room for again
        as_is = checked is None or checked.as_is is None
        room = self.budget.search_room(
            to_revalidate=max(qualify, 1), ablate=ablate, rounds=rounds, as_is=as_is
        )
        if room is None:
            return False
        trials, wall, kept = room
        left = self.budget.left_s()
        if trials >= RESUME_TRIALS:
            what = (
                f"its {len(set_aside)} candidate(s) are not re-validated again"
                if set_aside
                else "no trial read above the defaults"
            )
            self.budget.keep_as_is = as_is
            self.search.resume(
                set_aside,
                f"The re-validation chose nothing; the budget left ({left:.0f} s) holds about "
                f"{trials} more trial(s) ({wall:.0f} s each) beside the {kept:.0f} s kept for "
                f"what they find: the search resumes ({what})",
            )
            return True
        if not candidates(self.study, 1, set_aside):
            return False
        if self.budget.validation_plan(ablate, rounds, as_is=as_is) is None:  # no room for them
            return False
        self.search.rejected, self.budget.keep_as_is = set_aside, as_is
        self.emit(
            Note(
                f"The re-validation chose nothing; the budget left ({left:.0f} s) holds no more "
                f"search beside the {kept:.0f} s the trials it did not reach would keep: "
                "re-validating those next"
            )
        )
        return True


def assemble(
    *,
    study: optuna.Study,
    space: ResolvedSpace,
    definition: StudyDefinition,
    measure: Measurer,
    emit: Emit,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
    tick: Callable[[], None] | None = None,
    tokens_per_sample: int | None = None,
    logs: Path | None = None,
    trace_dir: Path | None = None,
) -> Assembly:
    """The components of a run of ``study`` (opened, over ``space``) as ``definition`` asks,
    measuring with ``measure`` (module doc). ``clock`` and ``started``: the budget's
    (``Budget``); ``tick``: called from the main thread while the search waits
    (``Search``); ``tokens_per_sample`` and ``logs``: the objective's (``Objective``);
    ``trace_dir``: where the defaults' Chrome trace goes (``Assembly.defaults_trace``; None:
    none is taken; nor is one in script mode or without the limit probe)."""
    budget = Budget(definition, clock, started=started)
    objective = Objective(
        study=study,
        space=space,
        definition=definition,
        measure=measure,
        budget=budget,
        emit=emit,
        tokens_per_sample=tokens_per_sample,
        logs=logs,
    )
    search = Search(
        study=study,
        space=space,
        definition=definition,
        runners=measure.runners,
        objective=objective,
        measure=measure,
        budget=budget,
        emit=emit,
        tick=tick,
    )
    traced = trace_dir is not None and definition.limit and not definition.command
    budget.trace_steps = PROFILED_STEPS if traced else 0
    return Assembly(
        study=study,
        space=space,
        definition=definition,
        measure=measure,
        budget=budget,
        objective=objective,
        search=search,
        emit=emit,
        defaults_trace=trace_dir / "baseline.trace.json" if trace_dir and traced else None,
    )
