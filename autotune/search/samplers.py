"""Optuna's samplers, chosen by name, and the one thing added to them: learning from failures.

Optuna's TPE only learns from COMPLETE and PRUNED trials; a FAIL trial is invisible to it, so a
setting that crashed the ranks would be proposed again and again. autotune keeps such trials
FAIL (that is what happened) but shows them to TPE as PRUNED trials without intermediate values,
the worst observations TPE knows, so it moves away from them. Trials that failed for a reason
outside the configuration (``interrupted``) are not shown.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Container, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.core.compat import STUDY_TRIALS_METHOD, call_study_trials
from autotune.core.errors import ConfigError
from autotune.launch.failures import learned_reasons
from autotune.record import trial as tr

__all__ = ["LEARNED_REASONS", "FailureAwareTPESampler", "make_sampler"]

#: Failure reasons that say something about the configuration (``FailureReason.learned``).
LEARNED_REASONS = learned_reasons()


class _FailuresAsPruned:
    """A read-only view of a study in which configuration failures look like PRUNED trials.

    Optuna's samplers read trials through a private method of the study
    (``autotune.core.compat.STUDY_TRIALS_METHOD``); the view answers that one, and forwards
    everything else to the study."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        if name == STUDY_TRIALS_METHOD:
            return self._trials
        return getattr(self._study, name)

    def _trials(
        self,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
        use_cache: bool = False,
    ) -> list[FrozenTrial]:
        trials = call_study_trials(
            self._study, deepcopy=deepcopy, states=states, use_cache=use_cache
        )
        if states is None or TrialState.PRUNED not in states:
            return trials
        failed = []
        for t in self._study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            if tr.reason(t) in LEARNED_REASONS:
                shown = copy.copy(t)
                shown.state = TrialState.PRUNED
                failed.append(shown)
        return sorted([*trials, *failed], key=lambda t: t.number)


class FailureAwareTPESampler(optuna.samplers.TPESampler):
    """TPE that also learns from trials that failed because of their configuration."""

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return super().infer_relative_search_space(_FailuresAsPruned(study), trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return super().sample_relative(_FailuresAsPruned(study), trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return super().sample_independent(
            _FailuresAsPruned(study), trial, param_name, param_distribution
        )


def make_sampler(
    name: str, seed: int | None, grid: dict[str, Sequence[Any]] | None = None
) -> optuna.samplers.BaseSampler:
    """Optuna's own samplers; TPE is multivariate, groups conditional dimensions, learns from
    configuration failures and lies constantly about trials in flight. ``grid`` is needed
    for ``grid``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            # constant_liar: trials in flight (concurrent trials, other drivers on the same
            # storage) count as bad results, so trials started together do not pile up
            return FailureAwareTPESampler(
                seed=seed, multivariate=True, group=True, n_startup_trials=8, constant_liar=True
            )
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "cmaes":
            return optuna.samplers.CmaEsSampler(
                seed=seed, n_startup_trials=8, warn_independent_sampling=False
            )
        if name == "grid":
            return optuna.samplers.GridSampler(dict(grid or {}), seed=seed)
    raise ConfigError(f"--sampler: unknown sampler {name!r}")
