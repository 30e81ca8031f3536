"""The budget the end-of-run plan kept but did not use goes to more rounds against the
defaults (``validation.more_rounds``): of the winner, up to ``WINNER_ROUNDS`` in all; without one,
a second look at the candidate that read highest, up to ``SECOND_LOOK_ROUNDS``, judged at
``SECOND_LOOK_CONFIDENCE``. Only where the search stopped on the budget, the limit probes'
share still kept; a winner the further rounds no longer show beyond the noise is dropped, and
the run says what it did."""

from __future__ import annotations

from autotune.core.choice import choose, interleave
from autotune.core.events import Note
from autotune.core.stats import speedup_text
from autotune.core.values import ratio_interval
from autotune.definition.studydef import StudyDefinition
from autotune.record.attrs import ValidationRecord, load, save
from autotune.record.typed import read
from autotune.replay.simulate import Landscape, replay
from autotune.search.budget import MAX_ROUNDS, Budget
from autotune.search.validation import (
    SECOND_LOOK_CONFIDENCE,
    SECOND_LOOK_ROUNDS,
    WINNER_ROUNDS,
    more_rounds,
)
from tests.conftest import REPO
from tests.unit.test_validation_as_is import DEFAULTS, result, study_with

LAB500 = REPO / "bench" / "landscapes" / "lab-500mbit.json"


def test_the_budget_holds_more_rounds_at_the_re_validation_s_own_run_time():
    now = [0.0]
    b = Budget(StudyDefinition(name="t", budget_s=200, limit=False), clock=lambda: now[0])
    b.start()
    assert b.more_rounds(3) == 0  # no re-validation run yet: nothing to plan from
    for _ in range(4):
        b.rerun_done(10.0)
    now[0] = 100.0  # 100 s left: 5 rounds of two 10 s runs
    assert b.more_rounds(3) == 5
    assert b.more_rounds(MAX_ROUNDS - 2) == 2  # never past MAX_ROUNDS in all
    # the ablation's second look keeps the joint check's runs: 4 of 10 s leave 3 rounds
    assert b.more_rounds(3, keep_runs=4) == 3
    assert b.more_rounds(3, most=6) == 3  # up to as many again as were measured
    now[0] = 185.0
    assert b.more_rounds(3) == 0  # 15 s hold no round of 20 s


def test_time_the_plan_did_not_use_goes_to_more_rounds_within_the_budget():
    """At 10 minutes on the 500 Mbit landscape the plan kept room for an ablation of the best
    candidate's knobs; where the winner's ablation took less, the rest was returned (the run
    ended at 514 s of 600 on seeds 0 and 2). It now measures the winner in further rounds."""
    land = Landscape.load(LAB500)
    grew = 0
    for seed in range(4):
        said: list = []
        r = replay(
            land, seed=seed, n_trials=100_000, budget_s=600, early_stop=False, emit=said.append
        )
        assert r.stop == "budget" and r.seconds <= 600, (seed, r.seconds)
        notes = [e.text for e in said if isinstance(e, Note)]
        asked = [t for t in notes if t.startswith("The budget left holds ")]
        record = load(r.study, ValidationRecord)
        assert record is not None and record.beats_baseline
        rounds = len(record.measurements["baseline"])
        assert len(record.measurements[record.winner]) == rounds == record.speedup.n
        if not asked:
            continue
        grew += 1
        asked_for = int(asked[0].split()[4])
        (after,) = [t for t in notes if t.startswith("After ")]
        assert after.startswith(f"After {rounds} rounds: {record.winner}: "), after
        # as many as the budget left held when they ran: the last may not fit (planned at the
        # mean run), never more than were asked for
        extra = int(record.reason.split(" of them with the budget")[0].split()[-1])
        assert 1 <= extra <= asked_for, (asked_for, record.reason)
        # the further rounds alternate the two arms, after the plan's rounds of every arm
        tail = record.order[-2 * extra :]
        assert sorted(tail) == sorted(["baseline", record.winner] * extra)
        assert all(tail[i] != tail[i + 1] for i in range(0, len(tail), 2))
        assert rounds <= WINNER_ROUNDS
    assert grew >= 2


def test_a_search_that_ended_for_another_reason_gives_the_time_back():
    """--n-trials (as --patience, or the convergence stop) ends the search before the budget:
    the time the plan leaves is the user's, not more rounds'."""
    said: list = []
    r = replay(Landscape.load(LAB500), seed=0, n_trials=6, budget_s=600, emit=said.append)
    assert r.stop == "n_trials" and load(r.study, ValidationRecord) is not None
    assert not [e for e in said if isinstance(e, Note) and "more round" in e.text]


class Stand:
    """Runs at set throughputs by trial number (a wobble of +-1 by run)."""

    def __init__(self, values: dict[int, float]) -> None:
        self.values, self.runs = values, 0

    def __call__(self, number, config, *, measure, keep=False):
        assert keep  # the further rounds measure on kept sessions (``rank.kept``)
        self.runs += 1
        return result(self.values[number] + (self.runs % 3) - 1, None)


def after_more_rounds(measured: dict[str, list[float]], stand: Stand, budget_s: float = 100):
    """``measured`` (the baseline, trial 0, and "trial 1") as the re-validation's record, then
    ``more_rounds`` with ``budget_s`` left at 2 s a run: (its record, the lines it said)."""
    study = study_with()
    keys = list(measured)
    v = choose(measured, "baseline")
    data = {
        **v.to_dict(),
        "trials": {"baseline": 0, "trial 1": 1},
        "order": interleave(keys, len(measured["baseline"])),
        "measurements": measured,
    }
    record = read(ValidationRecord, data, "validation")
    save(study, record)
    budget = Budget(StudyDefinition(name="t", budget_s=budget_s, limit=False), clock=lambda: 0.0)
    budget.start()
    budget.rerun_done(2.0)
    said: list = []
    checked = more_rounds(
        study=study,
        record=record,
        measure=stand,
        emit=said.append,
        definition=StudyDefinition(name="t", trainer="mlp"),
        budget=budget,
        defaults=DEFAULTS,
    )
    assert load(study, ValidationRecord) == checked  # stored: the export reads it
    return checked, [e.text for e in said if isinstance(e, Note)]


def shown(record: ValidationRecord, key: str) -> str:
    """``key``'s speedup over the defaults in ``record``, as its reason writes it."""
    sp = record.results[key].speedup
    return ratio_interval(sp.median, sp.low, sp.high, digits=3)


def test_a_winner_the_further_rounds_do_not_bear_out_is_dropped_and_the_run_says_so():
    """The plan's 3 rounds had trial 1 ahead by chance; every further run reads the same."""
    measured = {"baseline": [100.0, 101.0, 100.5], "trial 1": [105.0, 105.5, 104.8]}
    assert choose(measured, "baseline").winner == "trial 1"
    checked, notes = after_more_rounds(measured, Stand({0: 100.0, 1: 100.0}))
    assert not checked.beats_baseline and checked.winner == "baseline"
    assert len(checked.measurements["trial 1"]) == WINNER_ROUNDS
    dropped = f"trial 1 no longer beats the defaults beyond the noise over {WINNER_ROUNDS} rounds"
    assert checked.reason.startswith(dropped)
    was = speedup_text(choose(measured, "baseline").speedup)  # the plan's 3 rounds: 1.05x
    assert f"({shown(checked, 'trial 1')}; it measured {was})" in checked.reason
    assert any(t.startswith(f"After {WINNER_ROUNDS} rounds: {dropped}") for t in notes), notes


#: Ten rounds on a machine whose runs spread by 10-20 %: trial 1 reads about 1.06x, within
#: the noise.
NOISY = {
    "baseline": [100.0, 120.0, 90.0, 110.0, 95.0, 105.0, 100.0, 115.0, 85.0, 100.0],
    "trial 1": [118.0, 112.0, 96.0, 104.0, 110.0, 101.0, 119.0, 113.0, 88.0, 120.0],
}


def test_without_a_winner_the_candidate_that_read_highest_gets_a_second_look():
    assert not choose(NOISY, "baseline").beats_baseline  # the plan's rounds showed nothing
    checked, notes = after_more_rounds(NOISY, Stand({0: 100.0, 1: 110.0}))
    assert notes[0].startswith("The budget left holds 20 more round(s) of trial 1 ")
    assert f"judged at {SECOND_LOOK_CONFIDENCE:.1%}" in notes[0]
    assert len(checked.measurements["trial 1"]) == SECOND_LOOK_ROUNDS
    assert checked.beats_baseline and checked.winner == "trial 1"
    sp = checked.speedup
    assert 1.0 < sp.low < sp.median < sp.high and sp.n == SECOND_LOOK_ROUNDS
    assert "a second look" in checked.reason and "not ablated" in checked.reason


def test_a_second_look_that_finds_nothing_keeps_the_defaults_and_says_how_close():
    checked, notes = after_more_rounds(NOISY, Stand({0: 100.0, 1: 100.0}))
    assert not checked.beats_baseline and checked.winner == "baseline"
    assert checked.reason.startswith("no candidate beat the defaults beyond the noise; trial 1")
    sp = checked.results["trial 1"].speedup
    assert sp.n == SECOND_LOOK_ROUNDS and sp.low < 1 < sp.high  # how close it came, not 1
    assert f"measured {shown(checked, 'trial 1')} over 30 rounds" in checked.reason
    assert notes[-1] == f"After {SECOND_LOOK_ROUNDS} rounds: {checked.reason}"


def test_no_second_look_when_no_candidate_read_above_the_defaults():
    below = {"baseline": NOISY["trial 1"], "trial 1": NOISY["baseline"]}
    checked, notes = after_more_rounds(below, Stand({0: 100.0, 1: 100.0}))
    assert notes == [] and len(checked.measurements["baseline"]) == 10
