"""A value that failed in every trial with it is not run again (``search.failing``)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotune.search.failing import FAILS_TO_DROP, known_failing, queued_by_design

DEFAULTS = {"precision": "fp32", "bucket_cap_mb": 25, "num_workers": 0}
DISTS = {
    "precision": CategoricalDistribution(["fp32", "bf16"]),
    "bucket_cap_mb": CategoricalDistribution([5, 25, 100]),
    "num_workers": CategoricalDistribution([0, 2]),
}


def add(study, state, reason=None, **params):
    attrs = {} if reason is None else {"reason": reason}
    p = {**DEFAULTS, **params}
    study.add_trial(
        create_trial(
            state=state,
            params=p,
            distributions=DISTS,
            value=1.0 if state == TrialState.COMPLETE else None,
            user_attrs=attrs,
        )
    )


def test_a_value_failing_in_every_trial_with_it_is_known_failing_after_two():
    study = optuna.create_study(direction="maximize")
    proposed = {**DEFAULTS, "precision": "bf16", "num_workers": 2}
    add(study, TrialState.FAIL, "timeout", precision="bf16", bucket_cap_mb=5)
    assert known_failing(study, proposed, DEFAULTS) is None  # once is not a pattern
    add(study, TrialState.FAIL, "crash", precision="bf16", num_workers=2)
    assert FAILS_TO_DROP == 2
    assert known_failing(study, proposed, DEFAULTS) == ("precision=bf16", 2, "timeout, crash")
    # num_workers=2 failed only once; bucket_cap_mb=5 is not in the proposal
    assert known_failing(study, {**DEFAULTS, "num_workers": 2}, DEFAULTS) is None
    # the defaults' own values are never dropped
    assert known_failing(study, DEFAULTS, DEFAULTS) is None


def test_a_value_that_ever_ran_or_failed_for_no_reason_of_its_own_is_not_dropped():
    study = optuna.create_study(direction="maximize")
    for _ in range(3):
        add(study, TrialState.FAIL, "interrupted", precision="bf16")  # Ctrl-C says nothing
        add(study, TrialState.FAIL, "node_lost", precision="bf16")
    assert known_failing(study, {"precision": "bf16"}, DEFAULTS) is None
    add(study, TrialState.FAIL, "timeout", precision="bf16")
    add(study, TrialState.FAIL, "timeout", precision="bf16")
    assert known_failing(study, {"precision": "bf16"}, DEFAULTS) == (
        "precision=bf16",
        2,
        "timeout x2",
    )
    add(study, TrialState.PRUNED, precision="bf16", bucket_cap_mb=100)  # it runs, if slowly
    assert known_failing(study, {"precision": "bf16"}, DEFAULTS) is None


def test_the_trials_autotune_queues_itself_always_run():
    def trial(**attrs):
        return create_trial(
            state=TrialState.COMPLETE, params={}, distributions={}, value=1.0, user_attrs=attrs
        )

    assert queued_by_design(trial(baseline=True))
    assert queued_by_design(trial(screen="precision=bf16"))
    assert queued_by_design(trial(combination=["a", "b"]))
    assert queued_by_design(trial(fold="a"))
    assert not queued_by_design(trial())


def test_a_combination_rule_never_ran_the_value_and_does_not_count_against_it():
    study = optuna.create_study(direction="maximize")
    for _ in range(3):  # illegal: a rule about the combination, known before anything ran
        add(study, TrialState.FAIL, "illegal", precision="bf16", num_workers=2)
    assert known_failing(study, {"precision": "bf16"}, DEFAULTS) is None
