"""The numerics guard's pure rules: which settings change numerics, and the drift measure."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from autotune.core.config import TrialConfig
from autotune.core.numerics import CURVE_STEPS, MIN_STEPS, changes_numerics, drift


def test_only_precision_and_compression_change_numerics():
    assert changes_numerics(TrialConfig()) == []
    # reordering sums (buckets, views, accumulation at the same global batch) does not count
    same = TrialConfig(
        ddp={"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True},
        micro_batch=8,
        accumulation_steps=4,
    )
    assert changes_numerics(same) == []
    assert changes_numerics(TrialConfig(precision="bf16", global_batch=128)) == ["precision=bf16"]
    assert changes_numerics(TrialConfig(precision="tf32")) == ["precision=tf32"]
    both = TrialConfig(precision="fp16", comm_hook={"name": "powersgd"})
    assert changes_numerics(both) == ["precision=fp16", "comm_hook=powersgd"]


def test_drift_is_the_mean_absolute_difference_relative_to_the_baseline():
    base = [2.0] * 10
    assert drift(base, base) == (0.0, 10)
    value, n = drift([2.2] * 10, base)
    assert n == 10 and value == pytest.approx(0.1)
    # differences of either sign add up: a curve that crosses the baseline is not "no drift"
    value, _ = drift([2.2, 1.8] * 5, base)
    assert value == pytest.approx(0.1)


def test_drift_compares_the_common_first_steps_only():
    base = [1.0] * 30
    curve = [1.0] * CURVE_STEPS + [100.0] * 14  # what comes after the recorded steps is ignored
    assert drift(curve, base) == (0.0, CURVE_STEPS)
    assert drift([1.5] * 12, base) == (pytest.approx(0.5), 12)


def test_no_verdict_without_enough_steps_or_a_baseline_loss():
    assert drift([1.0] * (MIN_STEPS - 1), [1.0] * 20) is None
    assert drift([1.0] * 20, [0.0] * 20) is None


def test_a_non_finite_loss_is_infinite_drift():
    value, _ = drift([1.0] * 9 + [math.nan], [1.0] * 10)
    assert value == math.inf


def guard_after(fp32_drift: float | None, **study_settings):
    """``Objective._drift`` (its rule only) on a real in-memory study: a baseline with a
    falling loss curve and, when given, an fp32 trial that differed from it by ``fp32_drift``."""
    import optuna
    from optuna.trial import create_trial

    from autotune.search.objective import Objective

    study = optuna.create_study(direction="maximize")
    base_curve = [1.0 / (k + 1) for k in range(CURVE_STEPS)]
    study.add_trial(
        create_trial(
            value=1.0,
            user_attrs={
                "baseline": True,
                "config": {"global_batch": 128},
                "loss_curve": base_curve,
            },
        )
    )
    if fp32_drift is not None:
        study.add_trial(create_trial(value=1.0, user_attrs={"fp32_drift": fp32_drift}))
    settings = {"drift_tolerance": 0.05, "allow_drift": False, **study_settings}
    guard = SimpleNamespace(study=study, d=SimpleNamespace(**settings))
    guard._fp32_drift = lambda: Objective._fp32_drift(guard)
    return guard, base_curve


def test_the_guard_fails_a_drifting_setting_of_a_workload_that_repeats_its_steps():
    from autotune.core.errors import FailureReason
    from autotune.search.objective import Objective

    for floor in (None, 0.0005):  # no fp32 rerun yet; a rerun within 0.1 %
        guard, base = guard_after(floor)
        attrs = {"loss_curve": [x * 1.2 for x in base]}
        failure = Objective._drift(
            guard, TrialConfig(precision="bf16", global_batch=128), attrs["loss_curve"], attrs
        )
        assert failure is not None and failure.reason == FailureReason.NUMERICS_DRIFT
        assert attrs["numerics_drift"] == pytest.approx(0.2)


def test_an_fp32_rerun_records_the_floor_and_a_workload_that_does_not_repeat_is_unjudged():
    from autotune.search.objective import Objective

    guard, base = guard_after(None)
    attrs = {"loss_curve": [x * 1.03 for x in base]}
    fp32 = TrialConfig(global_batch=128)
    assert (
        Objective._drift(guard, fp32, attrs["loss_curve"], attrs) is None
    )  # an fp32 trial never fails it
    assert attrs["fp32_drift"] == pytest.approx(0.03) and "numerics_drift" not in attrs
    guard, base = guard_after(0.03)  # a script seeded from the clock (3.7 % in one run)
    attrs = {"loss_curve": [x * 1.2 for x in base]}
    assert (
        Objective._drift(
            guard, TrialConfig(precision="bf16", global_batch=128), attrs["loss_curve"], attrs
        )
        is None
    )
    assert "do not repeat" in attrs["numerics_unjudged"] and "3.0%" in attrs["numerics_unjudged"]
