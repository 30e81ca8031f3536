"""The samplers: each builds, and TPE learns to avoid settings that fail."""

from __future__ import annotations

import optuna
import pytest

from autotune.search.samplers import FailureAwareTPESampler, make_sampler


class Crash(Exception):
    pass


def proposals_of_the_failing_choice(sampler: optuna.samplers.BaseSampler, reason: str) -> int:
    """Run 60 trials where hook=b always fails; count how often b is proposed after 10."""

    def objective(trial: optuna.Trial) -> float:
        hook = trial.suggest_categorical("hook", ["a", "b", "c"])
        x = trial.suggest_float("x", 0, 1)
        if hook == "b":
            trial.set_user_attr("reason", reason)
            raise Crash("b crashes the ranks")
        return x + (0.5 if hook == "c" else 0.0)

    study = optuna.create_study(direction="maximize", sampler=sampler)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(objective, n_trials=60, catch=(Crash,))
    return sum(1 for t in study.trials[10:] if t.params["hook"] == "b")


def test_tpe_learns_from_configuration_failures_where_plain_tpe_cannot():
    plain = proposals_of_the_failing_choice(
        optuna.samplers.TPESampler(seed=3, n_startup_trials=8), "crash"
    )
    aware = proposals_of_the_failing_choice(
        FailureAwareTPESampler(seed=3, n_startup_trials=8), "crash"
    )
    assert plain >= 10  # plain TPE never sees the failures: b stays a third of proposals
    assert aware <= plain / 3


def test_interruptions_teach_nothing():
    # a trial stopped by Ctrl-C says nothing about its settings
    interrupted = proposals_of_the_failing_choice(
        FailureAwareTPESampler(seed=3, n_startup_trials=8), "interrupted"
    )
    plain = proposals_of_the_failing_choice(
        optuna.samplers.TPESampler(seed=3, n_startup_trials=8), "interrupted"
    )
    assert interrupted == plain


@pytest.mark.parametrize("name", ["tpe", "gp", "random", "cmaes"])
def test_named_samplers_build(name):
    assert isinstance(make_sampler(name, 0), optuna.samplers.BaseSampler)
