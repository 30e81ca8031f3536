"""The search benchmark on recorded measurements holds its line: the tuner as shipped (the
designed screening, then TPE, re-anchoring, re-validation and ablation), replayed on the
recorded default landscape (``bench/landscapes/default-loopback.json``) for 20 seeds, against
random search on the same seeds. The 100-seed figures are ``bench/replay.py``'s
(docs/benchmark.md has the table); the lines here are set for the seeds run here. A test over
recorded data, not a timing: every replay is deterministic."""

from __future__ import annotations

import math

import pytest

from autotune.replay.simulate import Landscape, replay
from autotune.replay.table import summarise
from autotune.search.loop import ANCHOR_EVERY
from tests.conftest import REPO

LANDSCAPE = REPO / "bench" / "landscapes" / "default-loopback.json"
SEEDS = 20
TRIALS = 15
#: ``python bench/replay.py --seeds 100`` measured median share 1.000, 10th percentile 1.000,
#: 75/25/0 wins/ties/losses (docs/benchmark.md); the lines sit under it, so that the test
#: fails when a change loses ground. The issue's 80 % wins is out of reach on this landscape
#: for any search: random search itself exports a point within 1 % of the best in about a
#: quarter of the seeds, and those can only be ties.
#: Over 20 seeds: on every window of 20 consecutive seeds of 0-159 (141 windows) the median
#: share, the 10th percentile, the share at >= 0.98 and beats-or-ties were all 1.000, and the
#: wins exceeded the losses by 11 or more; the win share alone moved, 0.55-0.95 (median 0.75;
#: seeds 0-19: 0.90), so its line is 0.50 here, not 100 seeds' 0.70.
WIN_SHARE = 0.50
BEATS_OR_TIES = 0.95
MEDIAN_SHARE = 0.98
P10_SHARE = 0.97


def replayed(path, seeds: int = SEEDS):
    """Random search and the tuner as shipped, replayed on the landscape at ``path`` for
    ``seeds`` seeds of ``TRIALS`` trials: ``summarise``'s table."""
    land = Landscape.load(path)
    results = []
    for seed in range(seeds):
        for name, sampler, screening in (("random", "random", False), ("tuner", "tpe", True)):
            r = replay(land, seed=seed, sampler=sampler, screening=screening, n_trials=TRIALS)
            results.append(
                {
                    "strategy": name,
                    "seed": seed,
                    "value": r.value,
                    "share": r.share,
                    "trials": r.trials,
                }
            )
    return summarise(results)


@pytest.fixture(scope="module")
def table():
    return replayed(LANDSCAPE)


def test_the_landscape_is_what_the_benchmark_says():
    land = Landscape.load(LANDSCAPE)
    assert len(land.runs) >= 48 and land.baseline_key in land.runs
    assert all(len(runs) >= 1 for runs in land.runs.values())


def test_the_tuner_beats_random_search_on_the_recorded_landscape(table):
    tuner = table["tuner"]
    assert tuner["seeds"] == SEEDS and tuner["median_trials"] == TRIALS
    assert tuner["win_share"] >= WIN_SHARE, tuner
    assert tuner["beats_or_ties"] >= BEATS_OR_TIES, tuner
    assert tuner["median_share"] >= MEDIAN_SHARE, tuner
    assert tuner["p10_share"] >= P10_SHARE, tuner
    assert tuner["median_share"] >= table["random"]["median_share"], table
    assert tuner["wins"] > tuner["losses"], tuner


def test_a_grid_search_stops_when_every_point_is_measured():
    """Optuna's GridSampler ends the search once its grid is exhausted (it calls
    ``study.stop()``); with one ``study.optimize(n_trials=1)`` per trial the search asks the
    sampler itself. Without that, this run goes on re-measuring points until its 500 trials."""
    land = Landscape.load(LANDSCAPE)
    r = replay(
        land,
        seed=0,
        sampler="grid",
        screening=False,
        n_trials=500,
        budget_s=1e7,
        validate_top=0,
        ablation=False,
    )
    grid = math.prod(len(choices) for choices in land.grid.values())
    anchors = 1 + grid // ANCHOR_EVERY  # the baseline and the runs of the defaults between
    assert grid <= r.trials <= grid + anchors + 1


LAB = REPO / "bench" / "landscapes" / "lab-1gbit.json"
#: Seeds of the lab landscape's replay: 30, not 20, because here the comparison with random
#: search is close. Over windows of consecutive seeds of 0-159, 20 seeds gave wins > losses in
#: 124 of 141 windows and a larger share at >= 0.98 than random search in 126; 30 seeds gave
#: both in all 131 windows, with median share >= 0.992, share at >= 0.98 >= 0.767 and
#: beats-or-ties >= 0.767 (100 seeds' 0.78 line would fail some windows: 0.75 here).
LAB_SEEDS = 30


def test_on_the_lab_landscape_the_tuner_does_at_least_as_well_as_random_search():
    """The network lab at 1 Gbit (24 points, the best 1.90x the defaults: fp16 hook, bucket
    views, bf16). ``python bench/replay.py --landscape bench/landscapes/lab-1gbit.json`` measured
    median share 0.994, 84 % of seeds at >= 0.98, and 33/48/19 % wins/ties/losses against
    random search over 100 seeds, which with 15 trials covers much of 24 points; the lines
    here sit under what ``LAB_SEEDS`` seeds give. (The release before: 89 % and 33/56/11. The
    first measurement costs this landscape's probe, 14 s, and finds the fp16 hook first, so the
    room kept for re-validating it starts earlier: the search ran 13 trials of 15 in the
    median seed. docs/benchmark.md.)"""
    table = replayed(LAB, LAB_SEEDS)
    tuner, rand = table["tuner"], table["random"]
    assert tuner["seeds"] == LAB_SEEDS
    assert tuner["median_share"] >= 0.99, tuner
    assert tuner["at_98"] >= 0.75 and tuner["at_98"] > rand["at_98"], table
    assert tuner["beats_or_ties"] >= 0.75, tuner
    assert tuner["wins"] > tuner["losses"], tuner


DRIFTING = REPO / "bench" / "landscapes" / "default-loopback-drifting.json"


def test_a_drifting_landscape_slows_every_run_alike_and_its_failing_value_times_out():
    from autotune.record import trial as tr
    from autotune.record.study import anchors, throughput

    land, base = Landscape.load(DRIFTING), Landscape.load(LANDSCAPE)
    assert land.runs == base.runs and land.drift == -0.38
    assert land.failing == {"num_workers=2": ("timeout", 51.0)}
    assert land.drifted(0) == 1.0 and math.isclose(land.drifted(1800), 0.81)

    def defaults(landscape):
        r = replay(landscape, seed=0, n_trials=1000, budget_s=1800, early_stop=False)
        return r, [throughput(t) for t in anchors(r.study)]

    r, runs = defaults(land)
    # the runs of the defaults read lower as the half hour goes on, as the drift says (0.81
    # at its end); on the recorded landscape the same seed's stay within its noise
    assert len(runs) >= 10 and runs[-1] < 0.85 * runs[0], runs
    steady = defaults(base)[1]
    assert min(steady) > 0.95 * steady[0], steady
    # the value that times out ran twice, each 51 s, then no more (search.failing)
    failed = [t for t in r.study.trials if t.params.get("num_workers") == 2]
    reasons = [tr.reason(t) for t in failed if t.state.name == "FAIL"]
    assert reasons[:2] == ["timeout", "timeout"] and set(reasons[2:]) <= {"known_failing"}


def test_a_replayed_rerun_on_a_kept_session_costs_its_discarded_step_and_the_call():
    """A re-measurement run of a point whose session is kept (``keep``) is charged a step at
    the point's step time and ``KEPT_CALL_S``, not the recorded run's set-up; its first run
    costs the recorded seconds, and a run that keeps nothing lets every kept session go."""
    import random
    import statistics

    from autotune.core.config import MeasureSettings
    from autotune.core.rank_io import KEPT_CALL_S, REARM_STEPS
    from autotune.replay import simulate

    land = Landscape.load(LANDSCAPE)
    space = land.space().resolve(simulate._target(land))
    m = simulate.ReplayMeasurer(land, None, space, None, random.Random(0))
    drawn = random.Random(0)  # the same draws as the measurer's, in the same order
    config, key = m._points[0]
    rerun = MeasureSettings().rerun()

    def outside(**kw):
        """The run's seconds outside its windows, the recorded run's set-up and warm-up as
        a run discarding ``rerun``'s steps has them, and its step's seconds."""
        r = m(0, config, measure=rerun, **kw)
        run = drawn.choice(land.runs[key])
        step_s = config.global_batch / statistics.median(run.windows)
        fewer = max((run.stepped_warmup or 0) - rerun.discarded_steps, 0)
        recorded = max(run.overhead_s - fewer * step_s, 0.0)
        return r.wall_s - r.window_s, r.kept, recorded, step_s

    built, kept, recorded, _ = outside(keep=True)
    assert not kept and built == pytest.approx(recorded) and built > 0  # its session built
    again, kept, recorded, step_s = outside(keep=True)
    assert kept and again == pytest.approx(REARM_STEPS * step_s + KEPT_CALL_S)
    assert again < recorded
    own, kept, recorded, _ = outside()  # a run of its own: the kept session goes
    assert not kept and own == pytest.approx(recorded)
    anew, kept, recorded, _ = outside(keep=True)
    assert not kept and anew == pytest.approx(recorded)
