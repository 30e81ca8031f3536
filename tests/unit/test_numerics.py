"""The numerics guard's pure rules: which settings change numerics, and the drift measure."""

from __future__ import annotations

import math

import pytest

from autotune.config import TrialConfig
from autotune.numerics import CURVE_STEPS, MIN_STEPS, changes_numerics, drift


def test_only_precision_and_compression_change_numerics():
    assert changes_numerics(TrialConfig()) == []
    # reordering sums (buckets, views, accumulation at the same global batch) does not count
    same = TrialConfig(ddp={"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True},
                       micro_batch=8, accumulation_steps=4)  # fmt: skip
    assert changes_numerics(same) == []
    assert changes_numerics(TrialConfig(precision="bf16")) == ["precision=bf16"]
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
