"""The measurement protocol (autotune.core.stats) on synthetic timings; every random draw is
seeded."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from scipy import stats as sps

from autotune.core.choice import NO_WINNER_REASON, choose, interleave
from autotune.core.stats import (
    Interval,
    PruneRule,
    SettleRule,
    StopRule,
    median_ci,
    speedup_ci,
)

# ---------------------------------------------------------------------------------- Interval


def test_interval_widths_and_dict_round_trip():
    ci = Interval(median=1234.56789, low=1200.0, high=1300.0, n=7)
    assert ci.half_width == 50.0
    assert ci.rel_half_width == pytest.approx(50.0 / 1234.56789)
    d = ci.to_dict()
    assert d["median"] == 1234.57  # 6 significant digits
    assert d["n"] == 7
    assert Interval.from_dict(d) == Interval(1234.57, 1200.0, 1300.0, 7)


def test_unbounded_interval_is_json_safe_and_round_trips():
    ci = Interval(5.0, -math.inf, math.inf, 1)
    assert ci.rel_half_width == math.inf
    d = ci.to_dict()
    json.dumps(d, allow_nan=False)  # no Infinity in the stored user attr
    assert d["low"] is None and d["high"] is None
    assert Interval.from_dict(d) == ci


def test_interval_rejects_a_median_outside_its_bounds():
    with pytest.raises(ValueError):
        Interval(median=2.0, low=0.0, high=1.0, n=3)


# ---------------------------------------------------------------------------------- median_ci


def test_one_sample_has_an_unbounded_interval_and_none_is_an_error():
    ci = median_ci([100.0])
    assert (ci.median, ci.low, ci.high, ci.n) == (100.0, -math.inf, math.inf, 1)
    with pytest.raises(ValueError):
        median_ci([])
    with pytest.raises(ValueError):
        median_ci([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError):
        median_ci([1.0, 2.0], confidence=1.0)


def test_small_n_is_the_student_t_interval_of_the_mean():
    x = [98.0, 101.0, 100.0, 103.0]  # median 100.5, mean 100.5
    ci = median_ci(x)
    ref = sps.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert ci.median == 100.5
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high))


def test_order_statistic_interval_from_six_values_matches_hand_computation():
    # n=6, 95 %: depth 1 covers 1-2/64 = 0.96875, depth 2 covers 0.78125;
    # I = (0.96875-0.95)/0.1875 = 0.1, lambda = 5*0.1/(1+4*0.1) = 5/14.
    lam = 5 / 14
    ci = median_ci([6.0, 1.0, 5.0, 2.0, 4.0, 3.0])
    assert ci.median == 3.5
    assert ci.low == pytest.approx(1 + lam)
    assert ci.high == pytest.approx(6 - lam)
    # At exactly the raw coverage of [x(1), x(6)] there is nothing to interpolate.
    exact = median_ci([6.0, 1.0, 5.0, 2.0, 4.0, 3.0], confidence=1 - 2 / 64)
    assert (exact.low, exact.high) == pytest.approx((1.0, 6.0))


@pytest.mark.parametrize("n", [5, 8, 15])
def test_median_interval_covers_the_true_median_about_95_percent(n):
    rng = np.random.default_rng(1234 + n)
    draws = rng.normal(loc=1000.0, scale=40.0, size=(2000, n))
    covered = [ci.low <= 1000.0 <= ci.high for ci in map(median_ci, draws)]
    assert 0.93 <= np.mean(covered) <= 0.98


def test_one_slow_window_does_not_blow_up_the_interval():
    rng = np.random.default_rng(7)
    x = list(1000.0 * (1 + 0.005 * rng.standard_normal(9))) + [500.0]  # a GC-stalled window
    ci = median_ci(x)
    assert ci.rel_half_width < 0.01
    mean_t_hw = sps.t.ppf(0.975, 9) * np.std(x, ddof=1) / math.sqrt(10)
    assert ci.half_width < mean_t_hw / 5  # what a mean ± t·s/√n interval would have given


# ---------------------------------------------------------------------------------- SettleRule


def _decay(seed: int, steps: int = 100) -> np.ndarray:
    rng = np.random.default_rng(seed)
    k = np.arange(steps)
    return (1.0 + 2.0 * np.exp(-k / 5.0)) * (1 + rng.uniform(-0.02, 0.02, steps))


@pytest.mark.parametrize("seed", range(10))
def test_exponential_warmup_settles_after_the_decay_not_during_it(seed):
    rule = SettleRule()
    t = _decay(seed)
    i = rule.settled_at(t)
    assert i is not None
    # When timing starts, the noiseless step time is within rel_tol of its steady value.
    assert 2.0 * math.exp(-i / 5.0) <= rule.rel_tol
    assert i <= 40  # and not long after
    assert abs(np.median(t[i:]) - 1.0) < 0.01
    # Online use: prefixes before i are "not yet", longer ones give the same index.
    assert rule.settled_at(t[: i - 1]) is None
    assert rule.settled_at(t[:i]) == i
    assert rule.settled_at(t[: i + 20]) == i


def test_flat_timings_settle_at_the_earliest_possible_index():
    rule = SettleRule()
    t = 0.1 * (1 + 0.01 * np.random.default_rng(3).standard_normal(50))
    assert rule.earliest == rule.min_steps + 2 * rule.window == 13
    assert rule.settled_at(t[:12]) is None
    assert rule.settled_at(t) == 13


@pytest.mark.parametrize("spike_at", [3, 5, 8, 10, 12])
def test_a_single_gc_spike_does_not_prevent_settling(spike_at):
    t = np.full(30, 0.1)
    t[spike_at] = 1.0  # a 10x pause inside one of the compared windows
    assert SettleRule().settled_at(t) == 13


def test_step_change_is_excluded_from_timing():
    t = np.r_[np.full(10, 2.0), np.full(30, 1.0)]  # e.g. a cache that fills after 10 steps
    # Both compared windows must have a majority of fast steps: [8, 13) and [13, 18).
    assert SettleRule().settled_at(t) == 18
    assert SettleRule().settled_at(t[:17]) is None


def test_steady_decrease_never_settles_and_hits_max_steps():
    rule = SettleRule()
    t = 0.98 ** np.arange(300)  # 10 % faster every window of 5 steps
    assert rule.settled_at(t[:199]) is None
    assert rule.settled_at(t[:200]) == 200
    assert rule.settled_at(t) == 200
    linear = SettleRule(max_steps=40)
    lin = 10.0 - 0.2 * np.arange(60)
    assert linear.settled_at(lin[:39]) is None
    assert linear.settled_at(lin[:40]) == 40


# ------------------------------------------------------- SettleRule over a measurement's windows


def test_windows_are_kept_from_the_first_one_not_slower_than_the_ones_after_it():
    rule = SettleRule(window=1, rel_tol=0.05, min_steps=2, max_steps=100)
    # one window says nothing yet: the one after it decides
    assert rule.kept_from([100.0], [4] * 1) is None
    assert rule.kept_from([100.0, 101.0], [4] * 2) == 0
    # a first window 4 % below the next is kept; 10 % below is warm-up
    assert rule.kept_from([96.0, 100.0], [4] * 2) == 0
    assert rule.kept_from([90.0, 100.0], [4] * 2) is None
    assert rule.kept_from([90.0, 100.0, 99.0], [4] * 3) == 1
    # a decaying warm-up: kept from the first window within 5 % of the next
    assert rule.kept_from([60.0, 80.0, 95.0, 99.0, 100.0, 101.0], [4] * 6) == 2
    # a first window faster than the ones after it is noise, not warm-up: kept
    assert rule.kept_from([120.0, 100.0], [4] * 2) == 0


def test_a_tolerance_of_1_or_more_keeps_the_first_window_without_waiting_for_the_next():
    # no window runs 100 % below another: a one-window measurement (min and max windows 1)
    # ends at its window
    assert SettleRule(window=1, rel_tol=1.0).kept_from([100.0], [4]) == 0
    assert SettleRule(window=1, rel_tol=1.0).kept_from([], []) is None
    assert SettleRule(window=1, rel_tol=0.99).kept_from([100.0], [4]) is None


def test_windows_settle_over_the_median_of_the_next_ones():
    rule = SettleRule(window=2, rel_tol=0.05, min_steps=2, max_steps=100)
    assert rule.kept_from([100.0, 100.0], [4] * 2) is None  # two windows after it are needed
    # one slow window after it (a GC pause) does not move the median it is judged against
    assert rule.kept_from([100.0, 60.0, 101.0], [4] * 3) == 0


def test_windows_that_never_settle_are_kept_once_the_warm_up_reaches_max_steps():
    rule = SettleRule(window=1, rel_tol=0.05, min_steps=2, max_steps=14)
    rising = [50.0 * 1.1**i for i in range(10)]  # 10 % faster every window
    assert rule.kept_from(rising[:3], [4] * 3) is None  # 2 + 2 * 4 steps: not yet 14
    # window 3 starts after 2 + 3 * 4 = 14 steps: kept, whatever follows
    assert rule.kept_from(rising[:4], [4] * 4) == 3
    assert rule.kept_from(rising, [4] * 10) == 3


# ---------------------------------------------------------------------------------- StopRule


def test_low_noise_stops_at_min_windows():
    rule = StopRule()
    w = list(1000.0 * (1 + 0.005 * np.random.default_rng(11).standard_normal(12)))
    assert rule.decide(w[:1]) == (False, "measuring")
    assert rule.decide(w[:2]) == (False, "measuring")
    assert rule.decide(w[:3]) == (True, "converged")


def test_never_stops_before_min_windows_even_on_identical_values():
    assert StopRule().decide([1000.0, 1000.0]) == (False, "measuring")  # zero-width interval
    assert StopRule(min_windows=5).decide([1000.0] * 4) == (False, "measuring")
    assert StopRule(min_windows=5).decide([1000.0] * 5) == (True, "converged")


def test_a_converged_interval_at_the_cap_reports_converged():
    rule = StopRule(min_windows=3, max_windows=3)
    assert rule.decide([1000.0, 1002.0, 998.0]) == (True, "converged")
    assert rule.decide([1070.0, 930.0, 1000.0]) == (True, "cap")


def test_seven_percent_spread_runs_to_the_cap():
    w = [1070.0, 930.0, 1000.0] * 4
    rule = StopRule()
    assert all(rule.decide(w[:n]) == (False, "measuring") for n in range(1, 12))
    assert rule.decide(w) == (True, "cap")


def test_seven_percent_noise_needs_more_windows():
    rule = StopRule()
    stopped_at, caps = [], 0
    for seed in range(100):
        w = 1000.0 * (1 + 0.04 * np.random.default_rng(seed).standard_normal(12))
        n = next(n for n in range(1, 13) if rule.decide(w[:n])[0])
        stopped_at.append(n)
        caps += rule.decide(w[:n])[1] == "cap"
    assert np.mean(stopped_at) >= 6
    assert np.mean(np.array(stopped_at) == rule.min_windows) < 0.2
    assert caps >= 10


# ---------------------------------------------------------------------------------- PruneRule


def test_clear_loser_is_pruned_after_min_windows():
    rule = PruneRule()
    w = list(500.0 * (1 + 0.01 * np.random.default_rng(5).standard_normal(3)))
    incumbent = median_ci(1000.0 * (1 + 0.04 * np.random.default_rng(6).standard_normal(8)))
    assert not rule.should_prune(w[:1], incumbent)
    assert rule.should_prune(w[:2], incumbent)
    assert rule.should_prune(w[:2], 1000.0)


def test_none_incumbent_never_prunes():
    assert not PruneRule().should_prune([10.0, 10.0, 10.0], None)


def test_three_percent_slower_with_seven_percent_noise_is_not_pruned_on_noise():
    rule = PruneRule()
    pruned_early = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        incumbent = median_ci(1000.0 * (1 + 0.04 * rng.standard_normal(8)))
        w = 970.0 * (1 + 0.04 * rng.standard_normal(4))
        pruned_early += any(rule.should_prune(w[:n], incumbent) for n in (2, 3, 4))
    assert pruned_early / 200 <= 0.10
    # A fixed realisation, checked at every look from min_windows to 6 windows.
    rng = np.random.default_rng(2024)
    incumbent = median_ci(1000.0 * (1 + 0.04 * rng.standard_normal(8)))
    w = 970.0 * (1 + 0.04 * rng.standard_normal(6))
    assert not any(rule.should_prune(w[:n], incumbent) for n in range(2, 7))


def test_interval_incumbent_is_compared_by_its_lower_bound():
    w = [940.0, 950.0, 945.0]  # upper bound about 957
    trial = median_ci(w)
    incumbent = Interval(median=1000.0, low=950.0, high=1040.0, n=8)
    assert incumbent.low < trial.high < incumbent.median  # below the median, not the low bound
    assert PruneRule().should_prune(w, incumbent.median)
    assert not PruneRule().should_prune(w, incumbent)
    assert not PruneRule().should_prune(w, Interval(1000.0, -math.inf, math.inf, 1))


def test_margin_demands_a_bigger_gap():
    w = [940.0, 950.0, 945.0]  # upper bound about 957
    assert PruneRule(margin=0.0).should_prune(w, 1000.0)
    assert not PruneRule(margin=0.05).should_prune(w, 1000.0)


# ---------------------------------------------------------------------------------- speedup_ci


def test_speedup_point_is_the_geometric_mean_ratio():
    ci = speedup_ci([2.0, 8.0], [1.0, 1.0])
    assert ci.median == pytest.approx(4.0)
    assert ci.n == 2


def test_true_speedup_of_1_2_is_found_and_beats_1():
    rng = np.random.default_rng(21)
    base = 1000.0 * (1 + 0.03 * rng.standard_normal(8))
    cand = 1200.0 * (1 + 0.03 * rng.standard_normal(8))
    ci = speedup_ci(cand, base)
    assert ci.low <= 1.2 <= ci.high
    assert ci.low > 1.0


def test_paired_interval_matches_a_one_sample_t_on_log_ratios():
    rng = np.random.default_rng(22)
    base = 1000.0 * (1 + 0.03 * rng.standard_normal(6))
    cand = 1100.0 * (1 + 0.03 * rng.standard_normal(6))
    ref = sps.ttest_1samp(np.log(cand) - np.log(base), 0.0).confidence_interval(0.95)
    ci = speedup_ci(cand, base)
    assert (math.log(ci.low), math.log(ci.high)) == pytest.approx((ref.low, ref.high))


def test_unpaired_interval_is_welch_on_logs_and_used_for_unequal_lengths():
    rng = np.random.default_rng(23)
    base = 1000.0 * (1 + 0.02 * rng.standard_normal(7))
    cand = 1100.0 * (1 + 0.05 * rng.standard_normal(5))
    ref = sps.ttest_ind(np.log(cand), np.log(base), equal_var=False).confidence_interval(0.95)
    ci = speedup_ci(cand, base)
    assert (math.log(ci.low), math.log(ci.high)) == pytest.approx((ref.low, ref.high))
    assert speedup_ci(cand[:5], base[:5], paired=False) != speedup_ci(cand[:5], base[:5])


def test_common_drift_cancels_in_the_paired_ratio():
    rng = np.random.default_rng(24)
    slow = np.r_[np.ones(5), np.full(5, 0.8)]  # the machine slows 20 % half-way
    base = 1000.0 * slow * (1 + 0.01 * rng.standard_normal(10))
    cand = 1200.0 * slow * (1 + 0.01 * rng.standard_normal(10))
    paired = speedup_ci(cand, base)
    unpaired = speedup_ci(cand, base, paired=False)
    assert paired.low <= 1.2 <= paired.high
    assert abs(paired.median / 1.2 - 1) < 0.01
    assert paired.rel_half_width < 0.015
    assert unpaired.rel_half_width > 4 * paired.rel_half_width


def test_no_speedup_is_within_noise():
    rng = np.random.default_rng(25)
    base = 1000.0 * (1 + 0.04 * rng.standard_normal(8))
    cand = 1000.0 * (1 + 0.04 * rng.standard_normal(8))
    ci = speedup_ci(cand, base)
    assert ci.low <= 1.0 <= ci.high


def test_speedup_rejects_non_positive_throughput_and_one_pair_is_unbounded():
    with pytest.raises(ValueError):
        speedup_ci([1.0, 0.0], [1.0, 1.0])
    ci = speedup_ci([2.0], [1.0])
    assert (ci.median, ci.low, ci.high) == (2.0, 0.0, math.inf)


# ---------------------------------------------------------------------------------- choose


def _rounds(seed: int, n: int = 8) -> np.ndarray:
    """Per-round drift shared by every configuration measured in that round."""
    return 1.0 + 0.05 * np.random.default_rng(seed).standard_normal(n)


def _measure(level: float, drift: np.ndarray, noise: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(1000.0 * level * drift * (1 + noise * rng.standard_normal(drift.size)))


def test_search_best_that_re_measures_worse_is_not_chosen():
    drift = _rounds(30)
    measurements = {
        "defaults": _measure(1.00, drift, 0.01, 31),
        "search_best": _measure(0.97, drift, 0.01, 32),  # won the search on a lucky trial
        "runner_up": _measure(1.10, drift, 0.01, 33),
    }
    v = choose(measurements, baseline="defaults")
    assert v.winner == "runner_up" and v.beats_baseline
    assert v.speedup.low > 1.0
    assert v.results["search_best"]["beats_baseline"] is False
    assert Interval.from_dict(v.results["search_best"]["speedup"]).high < 1.0


def test_a_candidate_must_beat_the_baseline_beyond_noise_before_its_median_counts():
    drift = _rounds(40)
    measurements = {
        "defaults": _measure(1.00, drift, 0.005, 41),
        "bold": _measure(1.15, drift, 0.15, 42),  # higher median, interval reaches below 1
        "steady": _measure(1.06, drift, 0.005, 43),
    }
    bold = speedup_ci(measurements["bold"], measurements["defaults"])
    steady = speedup_ci(measurements["steady"], measurements["defaults"])
    assert bold.median > steady.median and bold.low <= 1.0 < steady.low  # the premise
    v = choose(measurements, baseline="defaults")
    assert v.winner == "steady"
    assert v.speedup == steady


def test_among_those_that_beat_the_baseline_the_highest_median_wins():
    drift = _rounds(50)
    measurements = {
        "defaults": _measure(1.00, drift, 0.005, 51),
        "tight": _measure(1.12, drift, 0.005, 52),
        "faster": _measure(1.15, drift, 0.08, 53),  # wider interval, lower bound still > 1
    }
    v = choose(measurements, baseline="defaults")
    faster = Interval.from_dict(v.results["faster"]["speedup"])
    tight = Interval.from_dict(v.results["tight"]["speedup"])
    assert faster.low > 1.0 and tight.low > 1.0 and faster.low < tight.low  # the premise
    assert v.winner == "faster"
    assert "2 of 2 candidates" in v.reason


def test_all_candidates_within_noise_keep_the_defaults():
    drift = _rounds(60)
    measurements = {
        "defaults": _measure(1.00, drift, 0.04, 61),
        "a": _measure(1.01, drift, 0.04, 62),
        "b": _measure(0.99, drift, 0.04, 63),
    }
    v = choose(measurements, baseline="defaults")
    assert v.winner == "defaults" and not v.beats_baseline
    assert v.reason == NO_WINNER_REASON
    assert (v.speedup.low, v.speedup.median, v.speedup.high) == (1.0, 1.0, 1.0)
    assert set(v.results) == {"defaults", "a", "b"}
    assert not any(r["beats_baseline"] for r in v.results.values())
    json.dumps(v.to_dict(), allow_nan=False)


def test_choose_needs_the_baseline():
    with pytest.raises(ValueError):
        choose({"a": [1.0, 2.0]}, baseline="defaults")


# ---------------------------------------------------------------------------------- interleave


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_every_round_measures_every_key_once_and_positions_rotate(k):
    keys = ["base"] + [f"c{i}" for i in range(1, k)]
    order = interleave(keys, rounds=k)
    assert Counter(order) == {key: k for key in keys}
    rounds = [order[r * k : (r + 1) * k] for r in range(k)]
    assert all(sorted(r) == sorted(keys) for r in rounds)
    for pos in range(k):  # over k rounds each key takes every position once
        assert sorted(r[pos] for r in rounds) == sorted(keys)


def test_no_key_always_goes_first():
    order = interleave(["base", "a", "b"], rounds=3)
    assert Counter(order) == {"base": 3, "a": 3, "b": 3}
    assert {order[0], order[3], order[6]} == {"base", "a", "b"}


def test_two_keys_alternate_abba():
    assert interleave(["base", "a"], rounds=4) == ["base", "a", "a", "base"] * 2


@pytest.mark.parametrize("k, rounds, times", [(4, 4, 1), (3, 6, 2)])
def test_each_key_follows_every_other_key_equally_often(k, rounds, times):
    keys = [str(i) for i in range(k)]
    order = interleave(keys, rounds)
    pairs = Counter(
        (order[r * k + j], order[r * k + j + 1]) for r in range(rounds) for j in range(k - 1)
    )
    assert pairs == {(a, b): times for a in keys for b in keys if a != b}


def test_interleave_rejects_duplicate_keys():
    with pytest.raises(ValueError):
        interleave(["a", "a"], rounds=2)


def test_windows_hopelessly_below_the_incumbent_are_pruned_from_the_second_one():
    rule = PruneRule()
    bar = Interval(median=1000.0, low=950.0, high=1050.0, n=5)
    assert rule.hopeless([50.0], bar) is None  # one window: no interval to record yet
    assert rule.hopeless([50.0, 50.0], bar) == pytest.approx(19.0)  # 19x below the low bound
    assert PruneRule(min_windows=3).hopeless([50.0, 50.0], bar) is None
    # judged on the median: one slow window among good ones is not hopeless
    assert rule.hopeless([50.0, 980.0, 1010.0], bar) is None
    # below the bar, but less than 4x: for the prune rule to judge
    assert rule.hopeless([300.0] * 3, bar) is None
    assert PruneRule(hopeless_factor=2.5).hopeless([300.0] * 3, bar) == pytest.approx(950 / 300)
    assert rule.hopeless([50.0], None) is None
    with pytest.raises(ValueError):
        PruneRule(hopeless_factor=1.0)


# ------------------------------------------------------------------ figures people read


def test_a_speedup_is_shown_with_its_interval_only_when_it_is_within_25_percent():
    from autotune.core.stats import precise, rounds_to_settle, speedup_text
    from autotune.core.values import speedup_interval

    assert speedup_text(Interval(1.59, 1.50, 1.68, 5)) == "1.59x [1.50, 1.68]"
    assert speedup_text(Interval(1.0, 0.76, 1.24, 3)) == "1.00x [0.76, 1.24]"  # the edge
    # two rounds in new processes: the 5-minute run's "As today 1.29x [0.36, 4.65]"
    wide = Interval(1.29, 0.36, 4.65, 2)
    assert not precise(wide) and precise(Interval(1.29, 1.0, 1.6, 4))
    assert speedup_text(wide) == (
        "not measured precisely enough (2 rounds: 0.36-4.65x; about 5 rounds would settle it)"
    )
    # the rounds are those at which the same spread gives +-25 %: t(n-1) sd / sqrt(n)
    sd = math.log(4.65 / 0.36) / 2 * math.sqrt(2) / sps.t.ppf(0.975, 1)
    assert all(sps.t.ppf(0.975, k - 1) * sd / math.sqrt(k) > math.log(1.25) for k in (2, 3, 4))
    assert sps.t.ppf(0.975, 4) * sd / math.sqrt(5) <= math.log(1.25)
    assert rounds_to_settle(wide) == 5
    assert rounds_to_settle(Interval(1.0, 0.0, math.inf, 1)) is None
    assert (
        speedup_text(Interval(1.0, 0.0, math.inf, 1)) == "not measured precisely enough (1 round)"
    )
    # an unbounded side (None, as stored) is never precise
    assert speedup_interval(1.2, None, 1.3, 3) == "not measured precisely enough (3 rounds)"


def test_a_hopeless_factor_of_1_or_less_is_refused_in_one_line_naming_it():
    from autotune.core.config import MeasureSettings
    from autotune.core.errors import ConfigError

    for bad in (1, 0.5):
        with pytest.raises(ConfigError, match=r"^hopeless_factor must be a number > 1 .*got"):
            MeasureSettings(hopeless_factor=bad)
    assert MeasureSettings(hopeless_factor=10).prune_rule().hopeless_factor == 10
