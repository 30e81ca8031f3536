"""The budget the end-of-run plan kept but did not use goes to more rounds of the winner
against the defaults (``validation.more_rounds``): where the search stopped on the budget
only, up to ``MAX_ROUNDS`` in all, the limit probes' share still kept; a winner the further
rounds no longer show beyond the noise is dropped, saying so."""

from __future__ import annotations

from autotune.core.choice import choose, interleave
from autotune.core.events import Note
from autotune.definition.studydef import StudyDefinition
from autotune.record.attrs import ValidationRecord, load, save
from autotune.record.typed import read
from autotune.replay.simulate import Landscape, replay
from autotune.search.budget import MAX_ROUNDS, Budget
from autotune.search.validation import more_rounds
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
        extra = int(asked[0].split()[4])
        (after,) = [t for t in notes if t.startswith("After ")]
        assert after.startswith(f"After {rounds} rounds: {record.winner} "), after
        # the further rounds alternate the two arms, after the plan's rounds of every arm
        tail = record.order[-2 * extra :]
        assert sorted(tail) == sorted(["baseline", record.winner] * extra)
        assert all(tail[i] != tail[i + 1] for i in range(0, len(tail), 2))
        assert rounds <= MAX_ROUNDS and f"{extra} of them with the budget" in record.reason
    assert grew >= 2


def test_a_search_that_ended_for_another_reason_gives_the_time_back():
    """--n-trials (as --patience, or the convergence stop) ends the search before the budget:
    the time the plan leaves is the user's, not more rounds'."""
    said: list = []
    r = replay(Landscape.load(LAB500), seed=0, n_trials=6, budget_s=600, emit=said.append)
    assert r.stop == "n_trials" and load(r.study, ValidationRecord) is not None
    assert not [e for e in said if isinstance(e, Note) and "more round" in e.text]


class Flat:
    """Every run at about the defaults' throughput, the winner's too (a wobble by run): the
    plan's 3 rounds had it ahead by chance."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, number, config, *, measure):
        self.runs += 1
        return result(100.0 + (self.runs % 3), None)


def test_a_winner_the_further_rounds_do_not_bear_out_is_dropped_and_the_run_says_so():
    study = study_with()
    keys = ["baseline", "trial 1"]
    measured = {"baseline": [100.0, 101.0, 100.5], "trial 1": [105.0, 105.5, 104.8]}
    v = choose(measured, "baseline")
    assert v.winner == "trial 1"
    data = {
        **v.to_dict(),
        "trials": {"baseline": 0, "trial 1": 1},
        "order": interleave(keys, 3),
        "measurements": measured,
    }
    record = read(ValidationRecord, data, "validation")
    save(study, record)
    now = [0.0]
    budget = Budget(StudyDefinition(name="t", budget_s=100, limit=False), clock=lambda: now[0])
    budget.start()
    budget.rerun_done(2.0)
    said: list = []
    checked = more_rounds(
        study=study,
        record=record,
        measure=Flat(),
        emit=said.append,
        definition=StudyDefinition(name="t", trainer="mlp"),
        budget=budget,
        defaults=DEFAULTS,
    )
    assert checked is not None and not checked.beats_baseline and checked.winner == "baseline"
    assert len(checked.measurements["trial 1"]) == MAX_ROUNDS
    dropped = f"trial 1 no longer beats the defaults beyond the noise over {MAX_ROUNDS} rounds"
    assert checked.reason.startswith(dropped)
    assert load(study, ValidationRecord) == checked  # stored: the export keeps the defaults
    notes = [e.text for e in said if isinstance(e, Note)]
    assert any(t.startswith(f"After {MAX_ROUNDS} rounds: {dropped}") for t in notes), notes
