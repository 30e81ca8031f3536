"""The search measures first, spends its budget where the gain is, says why it stops, and stops
when it has converged: replayed on the recorded landscapes (``autotune.replay.simulate``) bounded
by a
budget, not by a trial count, so that a budget rule that starves the search fails here. Tests
over recorded data, not timings: every replay is deterministic."""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

import pytest

from autotune.limit.evidence import Evidence
from autotune.record.attrs import ATTRS, FirstMeasurement, StopRecord
from autotune.replay.simulate import Landscape, replay
from autotune.search.loop import UNTRIED_SHARE
from autotune.search.screening import HELPS, plan
from tests.conftest import REPO

FIRST_ATTR = ATTRS[FirstMeasurement]
STOP_ATTR = ATTRS[StopRecord]

LANDSCAPES = REPO / "bench" / "landscapes"
#: Every recorded landscape that carries a first measurement.
WITH_PROBE = sorted(p for p in LANDSCAPES.glob("*.json") if Landscape.load(p).first)
LAB = LANDSCAPES / "lab-1gbit.json"
DEFAULT = LANDSCAPES / "default-loopback.json"
#: Short budgets (simulated seconds) and seeds of the budget-bound checks. 20 seeds: every
#: line below held on every window of 20 consecutive seeds of 0-159 (each run's budget kept;
#: no run stopped with a third left while a prior beyond the noise was untried; 37-40 of 40
#: runs a landscape judged; 5-minute median share 0.962-1.000), except the budget itself at
#: 180 s on the default landscape, which seeds 40, 45 and 52 overran by 5-8 % (not among the
#: seeds here).
SHORT = (180.0, 300.0)
SEEDS = 20


@functools.cache
def short_run(path: Path, seed: int, budget: float):
    """A replay bounded by ``budget`` alone; deterministic, so the checks below share it."""
    return replay(Landscape.load(path), seed=seed, n_trials=100000, budget_s=budget)


def screened(study) -> list[str]:
    return [t.user_attrs["screen"] for t in study.trials if "screen" in t.user_attrs]


def test_every_recorded_landscape_carries_its_first_measurement():
    assert {p.name for p in WITH_PROBE} >= {"lab-1gbit.json", "default-loopback.json"}
    for p in WITH_PROBE:
        first = Landscape.load(p).first
        assert first["comm"]["fit_bytes"] and len(set(first["comm"]["fit_bytes"])) >= 2


def test_a_comm_bound_run_screens_compression_first_because_its_first_measurement_said_so():
    land = Landscape.load(LAB)
    r = replay(land, seed=0, n_trials=100000, budget_s=300.0)
    ev = Evidence.from_attrs(r.study.user_attrs[FIRST_ATTR]["evidence"])
    assert ev.bound == "bandwidth"
    assert screened(r.study)[0] == "comm_hook=fp16"
    # the same landscape without the first measurement: the listed order, bf16 first
    fixed = replay(land, seed=0, n_trials=100000, budget_s=300.0, evidence=False)
    assert screened(fixed.study)[0] == "precision=bf16"
    assert FIRST_ATTR not in fixed.study.user_attrs


def test_priors_that_cannot_gain_beyond_the_noise_are_not_screened():
    land = Landscape.load(LAB)
    r = replay(land, seed=3, n_trials=100000, budget_s=600.0)
    assert "bucket_cap_mb=100" not in screened(r.study)  # two buckets: nothing to merge
    fixed = replay(land, seed=3, n_trials=100000, budget_s=600.0, evidence=False)
    assert "bucket_cap_mb=100" in screened(fixed.study)


@pytest.mark.parametrize("path", WITH_PROBE, ids=lambda p: p.stem)
def test_no_search_stops_with_a_third_left_while_a_prior_beyond_the_noise_is_untried(path):
    land = Landscape.load(path)
    judged = 0
    for budget in SHORT:
        for seed in range(SEEDS):
            r = short_run(path, seed, budget)
            # a budget is kept: the whole replayed run (search, re-validation, ablation)
            assert r.seconds <= budget * 1.05, (path.stem, budget, seed, r.seconds)
            stop = StopRecord.from_attrs(r.study.user_attrs[STOP_ATTR])
            if stop.left_s <= UNTRIED_SHARE * budget:
                continue
            judged += 1
            ev = Evidence.from_attrs(r.study.user_attrs[FIRST_ATTR]["evidence"])
            bar = 1 + max(ev.noise, HELPS)
            space = land.space().resolve(_target(land))
            todo, _ = plan(space, ev)
            done = set(screened(r.study))
            untried = [
                t.prior.label
                for t in todo
                if t.gain is not None and t.gain > bar and t.prior.label not in done
            ]
            assert not untried, (path.stem, budget, seed, stop, untried)
    # the rule was put to the test: runs did stop with over a third left (the reserve)
    assert judged >= SEEDS // 5, judged


def _target(land):
    from autotune.core.target import Target

    hw = land.meta.get("hardware") or {}
    return Target(
        backend="gloo",
        device="cpu",
        world_size=2,
        global_batch=128,
        cpus_per_rank=1,
        bf16=bool(hw.get("bf16")),
        bf16_native=bool(hw.get("bf16_native")),
    )


def test_every_stop_is_said_and_stored_with_its_reason():
    land = Landscape.load(DEFAULT)
    said: list[str] = []

    def emit(event):
        said.append(str(getattr(event, "text", "")))

    by_trials = replay(land, seed=1, n_trials=6, budget_s=600.0, emit=emit)
    stop = StopRecord.from_attrs(by_trials.study.user_attrs[STOP_ATTR])
    assert stop.kind == "n_trials" and "--n-trials 6" in stop.why
    assert any(line.startswith("Search stopped at") and "--n-trials 6" in line for line in said)
    by_budget = replay(land, seed=1, n_trials=100000, budget_s=120.0)
    stop = StopRecord.from_attrs(by_budget.study.user_attrs[STOP_ATTR])
    assert stop.kind == "budget" and stop.budget_s == 120.0
    assert "kept for re-validating" in stop.why or stop.why == "the budget is spent"
    assert by_budget.stop == "budget"


def test_a_crafted_stop_record_is_refused():
    good = StopRecord(kind="budget", why="x", at_s=1.0, budget_s=2.0).to_attrs()
    assert StopRecord.from_attrs(good).kind == "budget"
    for bad in ({**good, "kind": "rm -rf"}, {**good, "at_s": "1"}, {**good, "why": 3}, [1]):
        with pytest.raises(ValueError):
            StopRecord.from_attrs(bad)


#: Seeds of the long-budget replay (each runs until the search converges).
LONG_SEEDS = 10


@pytest.fixture(scope="module")
def long_runs():
    land = Landscape.load(DEFAULT)
    return [replay(land, seed=s, n_trials=100000, budget_s=7200.0) for s in range(LONG_SEEDS)]


def test_a_long_budget_stops_once_the_search_has_converged(long_runs):
    converged = [r for r in long_runs if r.stop == "converged"]
    assert len(converged) >= 0.9 * LONG_SEEDS, [r.stop for r in long_runs]
    used = statistics.median(r.seconds / 7200.0 for r in long_runs)
    assert used <= 0.25, used
    assert statistics.median(r.share for r in long_runs) >= 0.98


def test_no_early_stop_searches_on():
    land = Landscape.load(DEFAULT)
    r = replay(land, seed=0, n_trials=120, budget_s=7200.0, early_stop=False)
    assert r.stop == "n_trials"  # not converged: it ran to the trial limit


#: Median share of the oracle at 5-minute budgets, 100 seeds, as ``bench/replay.py --trials
#: 100000 --budget 300`` measured it (docs/benchmark.md): default 1.000, lab 1 Gbit 0.965,
#: 500 Mbit 0.997, 300 Mbit 0.963; the line sits under the lowest.
SHORT_MEDIAN_SHARE = 0.95


@pytest.mark.parametrize("path", WITH_PROBE, ids=lambda p: p.stem)
def test_a_five_minute_budget_holds_its_line_on_every_landscape(path):
    land = Landscape.load(path)
    runs = [short_run(path, s, 300.0) for s in range(SEEDS)]
    assert statistics.median(r.share for r in runs) >= SHORT_MEDIAN_SHARE
    # every seed screens first what its first measurement expects the most of
    ev = Evidence.from_attrs(runs[0].study.user_attrs[FIRST_ATTR]["evidence"])
    top = plan(land.space().resolve(_target(land)), ev)[0][0].prior.label
    assert all(screened(r.study)[0] == top for r in runs)
    if path.stem.startswith("lab-"):  # the lab's links: compression
        assert top == "comm_hook=fp16"


def test_a_resumed_study_takes_its_first_measurement_once():
    import optuna

    land = Landscape.load(LAB)
    storage = optuna.storages.InMemoryStorage()
    said: list[str] = []

    def emit(event):
        said.append(str(getattr(event, "text", "")))

    first = replay(land, seed=0, n_trials=4, budget_s=300.0, storage=storage, emit=emit)
    stored = first.study.user_attrs[FIRST_ATTR]
    assert any(s.startswith("First measurement (") for s in said)
    said.clear()
    again = replay(land, seed=1, n_trials=4, budget_s=300.0, storage=storage, emit=emit)
    assert again.study.user_attrs[FIRST_ATTR] == stored  # read back, not measured again
    assert any(s.startswith("First measurement (stored on the study)") for s in said)
    # a crafted record is refused with its reason, and the defaults are measured again
    again.study.set_user_attr(FIRST_ATTR, {"evidence": {"step_s": "rm -rf /"}})
    said.clear()
    replay(land, seed=2, n_trials=4, budget_s=300.0, storage=storage, emit=emit)
    assert any("stored first measurement is unreadable" in s for s in said)
    assert Evidence.from_attrs(again.study.user_attrs[FIRST_ATTR]["evidence"])


def test_the_first_measurement_is_taken_after_the_baselines_windows(monkeypatch):
    """The defaults' probe runs in the baseline trial's session, after its windows: it costs
    its own seconds (the recorded probe's steps, all-reduce rounds and sweep), not a set-up
    and warm-up of its own, and the baseline's recorded seconds are its own. On the 500 Mbit
    landscape the screening's first trial ends that much sooner than with a probe apart."""
    from autotune.record import trial as tr
    from autotune.record.study import baseline_trial
    from autotune.search import loop

    land = Landscape.load(LANDSCAPES / "lab-500mbit.json")
    probe = land.first or {}
    comm = probe["comm"]
    alone = (
        probe["steps"] * (probe["ddp"]["step"] + probe["compute"]["step"])
        + 3 * (comm["comm_s"] + comm["last_bucket_s"])
        + 4 * sum(comm["fit_s"])
    )

    def run():
        said: list[str] = []
        r = replay(
            land,
            seed=0,
            n_trials=4,
            budget_s=300.0,
            emit=lambda e: said.append(str(getattr(e, "text", ""))),
        )
        firsts = [s for s in said if s.startswith("First measurement (")]
        return r, firsts

    folded, firsts = run()
    assert len(firsts) == 1 and "after the baseline's windows" in firsts[0], firsts
    record = folded.study.user_attrs[FIRST_ATTR]["probe"]
    assert record["wall_s"] == pytest.approx(alone, abs=0.01) and alone < probe["wall_s"] - 4
    assert record["trial"] == 0 and record["bounds"] and record["breakdown"]
    # a probe apart: the recorded probe's whole seconds, set-up and warm-up included
    monkeypatch.setattr(loop, "fold_settings", lambda *a: None)
    apart, firsts = run()
    assert firsts == [firsts[0]] and firsts[0].startswith(
        f"First measurement ({probe['wall_s']:.0f} s):"
    )
    base = [tr.measured(baseline_trial(r.study), "wall_s") for r in (folded, apart)]
    assert base[0] == base[1]  # the baseline's own seconds, without the probe
    assert apart.found_s - folded.found_s == pytest.approx(probe["wall_s"] - alone, abs=0.01)


def test_a_baseline_taking_the_probe_after_its_windows_has_twice_the_trial_timeout():
    """With ``--trial-timeout T`` the baseline's windows and the probe were two runs, each
    within T; taken in one run, they get 2T, so a probe on a slow link does not fail the
    baseline that the probe apart would not have."""
    from autotune.core.config import TrialConfig
    from autotune.core.rank_io import AFTER_WINDOWS
    from autotune.definition.studydef import StudyDefinition
    from autotune.launch.measurer import RayMeasurer

    class Runner:  # what the measurer asks of its placement group
        def run(self, **kw):
            self.asked = kw

    runner = Runner()
    d = StudyDefinition(name="x", trial_timeout_s=40.0)
    measure = RayMeasurer(study=None, runners=[runner], definition=d)
    config = TrialConfig(global_batch=64)
    for limit, timeout in (
        (None, 40.0),
        ({"repeats": 3}, 40.0),  # a probe of its own
        ({"repeats": 3, AFTER_WINDOWS: True}, 80.0),
    ):
        measure(0, config, limit=limit)
        assert runner.asked["timeout_s"] == timeout and runner.asked["limit"] == limit
