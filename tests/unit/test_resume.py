"""The time the end-of-run plan kept for a winner goes back to the search when the re-validation
chose nothing (``Assembly._resume``, ``Search.resume``): the search resumes while the budget
left holds ``RESUME_TRIALS`` trials and the room a new candidate needs, keeps no room for the
candidates already measured, and the new trials are re-validated without them. Planned rounds
add up runs at their mean time (``Budget._rerun_mean``), so the end stays within the budget.

The landscape here is flat: every point is the recorded defaults' runs, so whatever a search
trial reads above the defaults is noise, and the re-validation rightly chooses nothing on most
seeds."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from autotune.core.events import Note
from autotune.definition.studydef import StudyDefinition
from autotune.record.attrs import StopRecord, ValidationRecord, load
from autotune.replay.simulate import Landscape, replay
from autotune.search.assembly import RESUME_TRIALS
from autotune.search.budget import Budget
from tests.conftest import REPO

DEFAULT = REPO / "bench" / "landscapes" / "default-loopback.json"
LAB500 = REPO / "bench" / "landscapes" / "lab-500mbit.json"
#: Seeds replayed; on 4 of these 12 the re-validation chose nothing with room left.
SEEDS = range(8, 20)


@pytest.fixture(scope="module")
def flat() -> Landscape:
    land = Landscape.load(DEFAULT)
    defaults = land.runs[land.baseline_key]
    return dataclasses.replace(land, runs={k: defaults for k in land.runs}, first=None)


def lines(said: list) -> list[str]:
    return [e.text for e in said if isinstance(e, Note)]


def test_a_re_validation_that_chose_nothing_gives_its_time_back_to_the_search(flat):
    resumed = went_on = 0
    for seed in SEEDS:
        said: list = []
        r = replay(
            flat, seed=seed, n_trials=100_000, budget_s=600, early_stop=False, emit=said.append
        )
        assert r.seconds <= 600, (seed, r.seconds)
        notes = lines(said)
        told = [t for t in notes if t.startswith("The re-validation chose nothing; ")]
        stops = [t for t in notes if t.startswith("Search stopped at ")]
        record = load(r.study, ValidationRecord)
        if not told:
            assert record is None or not record.earlier
            assert len(stops) == 1
            continue
        (line,) = told
        assert record is not None and record.earlier, seed
        # the candidates set aside are not measured again
        again = set(record.trials) - {"baseline"}
        assert again.isdisjoint(record.earlier), (seed, again, record.earlier)
        points = {tuple(sorted(r.study.trials[n].params.items())) for n in record.earlier.values()}
        for key in again:
            assert tuple(sorted(r.study.trials[record.trials[key]].params.items())) not in points
        if line.endswith("re-validating those next"):  # no room to search: the next ones
            went_on += 1
            assert len(stops) == 1 and notes.index(stops[0]) < notes.index(line)
            continue
        resumed += 1
        assert "the search resumes" in line
        trials = int(line.split("holds about ")[1].split()[0])
        assert trials >= RESUME_TRIALS
        assert len(stops) == 2 and notes.index(stops[0]) < notes.index(line) < notes.index(stops[1])
        # the stored stop is the second one, and the search ran trials after the first
        stop = load(r.study, StopRecord)
        assert stop is not None and stop.line() == stops[1]
        first_at = stops[0].split("Search stopped at ")[1].split(" of ")[0]
        assert first_at != stop.line().split("Search stopped at ")[1].split(" of ")[0]
    assert resumed >= 2 and went_on >= 1, (resumed, went_on)


def test_a_winner_or_another_stop_keeps_the_search_stopped():
    """A winner gets its ablation and more rounds; --n-trials ends the search for good."""
    land = Landscape.load(LAB500)
    for seed in range(3):
        said: list = []
        replay(land, seed=seed, n_trials=100_000, budget_s=600, early_stop=False, emit=said.append)
        assert not [t for t in lines(said) if "resumes" in t]
    said = []
    r = replay(land, seed=0, n_trials=6, budget_s=600, emit=said.append)
    assert r.stop == "n_trials" and not [t for t in lines(said) if "resumes" in t]


def test_the_room_to_search_again_is_what_is_left_after_a_new_candidate_s_reserve():
    now = [0.0]
    b = Budget(StudyDefinition(name="t", budget_s=600, limit=False), clock=lambda: now[0])
    b.start()
    assert b.search_room(to_revalidate=1, as_is=False) is None  # no trial yet: no time to plan from
    for _ in range(3):
        b.trial_done(10.0, 5.0)
    kept = b.reserve_s(to_revalidate=2, ablate=3)
    assert kept > b.reserve_s(to_revalidate=1) > 0
    now[0] = 600 - kept - 35  # 35 s beside the reserve: three 10 s trials
    assert b.search_room(to_revalidate=2, ablate=3, as_is=False) == (3, 10.0, kept)
    now[0] = 600 - kept + 5
    assert b.search_room(to_revalidate=2, ablate=3, as_is=False)[0] == 0


def test_rounds_planned_ahead_add_up_runs_at_their_mean():
    """Runs whose overhead varies: the median (4 s) would plan 5 rounds of 2 runs in 44 s
    where they take 55 s; the mean (5.5 s) plans 4."""
    now = [0.0]
    b = Budget(StudyDefinition(name="t", budget_s=1000, limit=False), clock=lambda: now[0])
    b.start()
    walls = [4.0, 4.0, 4.0, 10.0]
    for w in walls:
        b.rerun_done(w)
    now[0] = 1000 - 44
    assert b.more_rounds(0) == int(44 // (2 * statistics.fmean(walls))) == 4
