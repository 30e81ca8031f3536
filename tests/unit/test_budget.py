"""The budget (pure logic): how much of it the final re-validation may take, whether another
trial fits, and that asking never changes it."""

from __future__ import annotations

import pytest

from autotune.definition.studydef import StudyDefinition
from autotune.search.budget import MAX_ROUNDS, Budget, RunCost, validation_plan


def plan(budget_s, wall_s, top=3, rounds=5):
    d = StudyDefinition(name="t", validate_top=top, validate_rounds=rounds)
    return validation_plan(d, budget_s, RunCost(wall_s, wall_s))


def test_a_long_budget_gets_every_candidate_and_grows_to_the_most_rounds():
    assert plan(3600, 8) == (3, 10)  # 40 runs x 8 s = 320 s, a third of an hour is 1200 s


@pytest.mark.parametrize(
    ("budget", "wall", "expected"),
    [
        (600, 6, (3, 8)),  # 4 x 5 x 6 = 120 s <= 200 s; grown while 4 x r x 6 <= 200
        (300, 8, (1, 6)),  # 4 and 3 candidates x 5 rounds x 8 s > 100 s; 2 x 5 x 8 = 80: grown
        (180, 6, (1, 5)),  # a 3-minute run: one candidate over five rounds, 60 s
        (120, 8, (1, 2)),  # rounds go only once one candidate is left: 2 x 2 x 8 = 32 <= 40
        (70, 8, (1, 2)),  # 32 s: over a third, within half of the budget
        (60, 8, None),  # 32 s > half of 60 s: no re-validation
    ],
)
def test_the_plan_shrinks_candidates_then_rounds_then_grows_rounds(budget, wall, expected):
    got = plan(budget, wall)
    assert got == expected
    if got is not None:
        top, rounds = got
        assert (top + 1) * rounds * wall <= budget / 2
        if 5 < rounds < 10:  # grown as far as a third of the budget holds
            assert (top + 1) * (rounds + 1) * wall > budget / 3


def test_the_aimed_rounds_are_a_floor_when_they_fit():
    assert plan(600, 6, rounds=3) == (3, 8)  # grown like the default
    assert plan(3600, 8, top=1, rounds=12) == (1, 12)  # more than MAX_ROUNDS when asked


def test_validate_top_zero_turns_it_off():
    assert plan(3600, 8, top=0) is None


def test_bad_validation_settings_are_refused():
    from autotune.core.errors import ConfigError

    with pytest.raises(ConfigError, match="validate_rounds must be a whole number >= 2"):
        StudyDefinition(name="t", validate_rounds=1).check("study definition t")
    with pytest.raises(ConfigError, match="validate_top must be a whole number >= 0"):
        StudyDefinition(name="t", validate_top=-1).check("study definition t")


def budget(total_s, top=3, rounds=5):
    return Budget(
        StudyDefinition(name="t", budget_s=total_s, validate_top=top, validate_rounds=rounds)
    )


def test_before_any_trial_there_is_room_and_no_plan():
    b = budget(600)
    assert b.room_for_another(to_revalidate=3) and b.validation_plan() is None


def test_asking_never_changes_the_budget():
    b = budget(600)
    b.trial_done(6.0, rerun_wall_s=6.0)
    answers = [(b.validation_plan(), b.room_for_another(to_revalidate=3)) for _ in range(3)]
    # the plan of the (600, 6) case above is (3, 8); asked with the whole budget left, the
    # end would grow its rounds into the room (up to MAX_ROUNDS)
    assert validation_plan(b.d, 600, RunCost(6.0, 6.0)) == (3, 8)
    assert answers == [((3, MAX_ROUNDS), True)] * 3


def test_room_for_a_trial_keeps_the_revalidation_when_something_beat_the_baseline():
    b = budget(180)
    b.trial_done(6.0, rerun_wall_s=6.0)  # plan (1, 5): 10 runs of 6 s = 60 s to keep
    b.started -= 180 - 60  # 60 s left
    assert b.room_for_another(to_revalidate=0)  # nothing to re-validate: 60 s >= 6 s
    assert not b.room_for_another(to_revalidate=3)  # 60 s < 6 s + 60 s
    b.started -= 60  # spent
    assert not b.room_for_another(to_revalidate=0)


def test_the_room_kept_is_for_the_candidates_there_are_and_the_ablation_of_the_best():
    b = budget(600)
    b.trial_done(6.0, rerun_wall_s=6.0)  # plan (3, 8): each candidate 8 runs of 6 s
    b.started -= 600 - 150  # 150 s left
    # one candidate: (1 + 1) x 8 runs x 6 s = 96 s, plus the next trial's 6 s
    assert b.room_for_another(to_revalidate=1)
    # three candidates would need (3 + 1) x 8 x 6 = 192 s
    assert not b.room_for_another(to_revalidate=3)
    # a best trial changing 2 knobs adds its ablation: (2 + 1) x 8 x 6 = 144 s more
    assert not b.room_for_another(to_revalidate=1, ablate=2)
    assert b.room_for_another(to_revalidate=1, ablate=1)  # one knob: nothing to ablate


def test_a_reserve_that_could_no_longer_buy_a_re_validation_is_not_kept():
    # a 1-minute script run: 7 s trials, one candidate over 2 rounds takes 28 s
    b = budget(60)
    b.limit_runs = 0  # script mode: no limit probe
    b.trial_done(7.0, rerun_wall_s=7.0)
    assert validation_plan(b.d, 60, RunCost(7.0, 7.0)) == (1, 2)  # the budget as a whole plans one
    b.started -= 60 - 30  # 30 s left: the re-validation still fits, the reserve keeps it
    assert b.validation_plan() == (1, 2) and not b.nothing_to_keep()
    assert not b.room_for_another(to_revalidate=1)  # 30 s < 7 s + 28 s: the search stops
    # 22 s left (the trial in flight ran on): no re-validation fits any more, so a reserve
    # would buy nothing
    b.started -= 8
    assert b.validation_plan() is None and b.nothing_to_keep()
    assert b.holds(7.0, 7.0)  # while the trials themselves still fit
    # where the budget as a whole plans none, there was never a reserve to drop
    short = budget(20)
    short.trial_done(7.0, rerun_wall_s=7.0)
    assert validation_plan(short.d, 20, RunCost(7.0, 7.0)) is None and not short.nothing_to_keep()


def test_failed_trials_count_for_the_trial_wall_not_for_the_rerun():
    b = budget(600)
    b.trial_done(50.0)  # a failure: no re-validation run of it
    b.trial_done(6.0, rerun_wall_s=4.0)
    # median trial wall 28 s; the plan is sized by the re-run wall (4 s): 4 x 10 x 4 <= 200
    assert b.validation_plan() == validation_plan(b.d, 600, RunCost(4.0, 4.0)) == (3, 10)


def test_the_budget_counts_from_the_command_s_start_when_it_is_given():
    now = [100.0]
    d = StudyDefinition(name="t", budget_s=60)
    b = Budget(d, clock=lambda: now[0], started=90.0)  # Ray took 10 s before the search
    b.start()
    assert b.elapsed_s() == 10.0 and b.left_s() == 50.0
    plain = Budget(d, clock=lambda: now[0])
    plain.start()
    assert plain.left_s() == 60.0  # without it, from the first trial on


def test_the_reserve_is_what_room_for_another_keeps():
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=600, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    assert b.reserve_s(to_revalidate=3) == 0.0  # no trial yet: nothing known
    b.trial_done(6.0, rerun_wall_s=6.0)  # plan (3, 8)
    assert b.trial_s() == 6.0
    one = b.reserve_s(to_revalidate=1)
    assert one == pytest.approx(2 * 8 * 6 + b.limit_reserve_s(6.0))
    # the ablation of 2 knobs: 3 runs a round over the plan's 8 rounds
    assert b.reserve_s(to_revalidate=1, ablate=2) == pytest.approx(one + 3 * 8 * 6)
    assert b.reserve_s(to_revalidate=0) == pytest.approx(b.limit_reserve_s(6.0))
    now[0] = 600 - (6.0 + one)  # exactly a trial and the reserve left
    assert b.room_for_another(to_revalidate=1)
    now[0] += 1.0
    assert not b.room_for_another(to_revalidate=1)


def test_kept_sessions_make_a_comparisons_later_rounds_cheaper_and_the_reserve_says_so():
    """Where re-measurement runs keep their sessions (``rank.kept``), each arm's first run of
    a comparison builds its session and its later runs cost what the trial says they will:
    the reserve, the plan and the further rounds are sized from both, not from the first."""
    cost = RunCost(6.0, 3.0)
    assert cost.of(2, 1) == 12.0 and cost.of(2, 8) == 2 * (6 + 7 * 3) and cost.of(0, 5) == 0.0
    assert cost.rounds_in(2, 2 * (6 + 7 * 3)) == 8 and cost.rounds_in(2, 11.9) == 0
    d = StudyDefinition(name="t", budget_s=600, validate_top=3, validate_rounds=5)
    now = [0.0]
    kept, flat = Budget(d, clock=lambda: now[0]), Budget(d, clock=lambda: now[0])
    kept.trial_done(6.0, rerun_wall_s=6.0, kept_wall_s=3.0)
    flat.trial_done(6.0, rerun_wall_s=6.0)  # a measurer that keeps none (script mode)
    assert validation_plan(d, 600, cost) == (3, 10) != validation_plan(d, 600, RunCost(6, 6))
    one = kept.reserve_s(to_revalidate=1)
    n = kept.validation_plan()[1]
    assert one == pytest.approx(cost.of(2, 10) + kept.limit_reserve_s(6.0)) and n == 10
    assert one < flat.reserve_s(to_revalidate=1)
    # the limit probes build sessions of their own: kept at a first run's seconds
    assert kept.limit_reserve_s() == flat.limit_reserve_s() == kept.limit_reserve_s(6.0)
    # the runs measured replace the estimates, each kind its own
    kept.rerun_done(7.0)
    kept.rerun_done(2.0, kept=True)
    room = 600 - kept.limit_reserve_s()
    assert kept.rerun_s() == 7.0 and kept.limit_reserve_s() == min(2 * 7.0, 0.05 * 600)
    assert kept.more_rounds(0, most=1000) == RunCost(7.0, 2.0).rounds_in(2, room) == 144


def test_what_the_search_leaves_goes_to_more_rounds_and_what_follows_keeps_its_share():
    """The README's 3-minute run stopped with 84 s left and 224 s kept, re-validated in 54 s
    and returned 24 s: the end now takes the room left, less what follows the re-validation."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=180, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(4.0, rerun_wall_s=3.5)
    assert validation_plan(d, 180, RunCost(3.5, 3.5)) == (2, 5)  # a third of the budget
    now[0] = 180 - 84  # 84 s left
    limit = b.limit_reserve_s(3.5)
    top, rounds = b.validation_plan()
    # the candidates the plan's third left out come back first, then rounds the room holds
    assert (top, rounds) == (3, 5) and (top + 1) * rounds * 3.5 <= 84 - limit
    assert (top + 1) * (rounds + 1) * 3.5 > 84 - limit  # every round the room holds
    # an ablation of 2 knobs to follow, one candidate that could still win: its 3 runs a
    # round over the plan's 5 rounds stay free
    top, rounds = b.validation_plan(ablate=2, contenders=1)
    assert (top + 1) * rounds * 3.5 <= 84 - limit - 3 * 5 * 3.5
    # three that could: beside the ablation only one fits, so the choice takes its share
    assert b.validation_plan(ablate=2, contenders=3) == (3, 5)


def test_room_beyond_the_plan_measures_the_other_candidates_before_more_rounds():
    """A replayed 5-minute run at 300 Mbit: the budget's third held one candidate over 3
    rounds; the search stopped with 163 s of room, and the plan grew to 6 rounds of that one
    against the defaults (a 1.86x gain 3 rounds had told). The same room holds the three
    partners of the lever within the noise of each other over those 3 rounds."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=300, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(18.0, rerun_wall_s=13.5)
    assert validation_plan(d, 300, RunCost(13.5, 13.5)) == (1, 3)
    now[0] = 300 - 163 - b.limit_reserve_s(13.5)
    assert b.validation_plan() == (3, 3)  # 4 x 3 x 13.5 = 162 s
    # a candidate comes back only at the plan's rounds: where two over 3 rounds do not fit
    # (121.5 s), the one gets the rounds the room holds
    now[0] = 300 - 108 - b.limit_reserve_s(13.5)
    assert b.validation_plan() == (1, 4)


def test_candidates_that_could_still_win_are_measured_before_rounds_past_the_precise_ones():
    """A replayed 10-minute run at 300 Mbit: the plan was one candidate over 7 rounds; beside
    the ablation's share the room held 6 rounds of the one that read highest, the hook with
    bucket views (0.953 of the best), against the defaults, while three trials of the hook
    and a partner could each still win. 3 rounds of the three fit the same room; where one
    alone could win, its rounds stay."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=600, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(18.0, rerun_wall_s=13.6)
    assert validation_plan(d, 600, RunCost(13.6, 13.6)) == (1, 7)
    now[0] = 120  # 480 s left
    room = 480 - b.limit_reserve_s(13.6) - Budget._ablation_s(2, 7, RunCost(13.6, 13.6))
    assert b.validation_plan(ablate=2, contenders=1) == (1, 6)  # 2 x 6 x 13.6 <= room
    assert b.validation_plan(ablate=2, contenders=3) == (3, 3)
    assert 4 * 3 * 13.6 <= room < 4 * 4 * 13.6
    assert b.validation_plan(ablate=2, contenders=2) == (2, 4)  # 3 x 4 x 13.6 = 163.2


def test_the_choice_comes_first_when_what_follows_would_leave_it_no_room():
    """A replayed 5-minute lab run screened past its reserve (a prior beyond the noise was
    untried) and stopped with 156 s left: the ablation's share (225 s) left the re-validation
    no room, and the run exported its search's best unchecked, with 156 s unused."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=300, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(15.0, rerun_wall_s=15.0)
    now[0] = 300 - 156
    assert Budget._ablation_s(2, 5, RunCost(15.0, 15.0)) == 225.0  # 3 runs x 5 rounds x 15 s
    plan = b.validation_plan(ablate=2)
    assert plan is not None and plan[0] >= 1 and plan[1] >= 2
    assert (plan[0] + 1) * plan[1] * 15.0 <= 156 - b.limit_reserve_s(15.0)


def test_where_the_plan_has_fewer_than_precise_rounds_the_reserve_keeps_them_not_an_ablation():
    """A 4-minute budget of 20 s runs plans one candidate over 2 rounds: the end never keeps
    an ablation's share beside so short a re-validation, it takes the share for the choice's
    rounds. The reserve kept a 3-knob ablation's 240 s (the whole budget) beside them, and the
    search stopped for it; it keeps what the end will do instead, the third round."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=240, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(20.0, rerun_wall_s=20.0)
    assert validation_plan(d, 240, RunCost(20.0, 20.0)) == (1, 2)
    limit = b.limit_reserve_s(20.0)
    kept = b.reserve_s(to_revalidate=1, ablate=3, rounds=3)
    assert kept == pytest.approx(2 * 3 * 20.0 + limit)  # not 2 x 2 x 20 + 6 x 2 x 20
    assert b.reserve_s(to_revalidate=1, ablate=0, rounds=3) == pytest.approx(2 * 2 * 20 + limit)
    assert not b.reserve_keeps_ablation()  # the stop's line does not say it keeps one
    now[0] = 240 - kept  # the search stopped with exactly the reserve left
    assert b.validation_plan(ablate=3, rounds=3) == (1, 3)  # what the reserve kept it for


def test_the_defaults_trace_is_kept_in_the_reserve_and_the_plan_until_it_is_taken():
    """The first run of the defaults in the re-validation profiles two more steps for their
    Chrome trace: the reserve keeps them beside the candidates' rounds, the plan fits the
    rounds in what is left after them, and once taken they are kept no more. Without a
    re-validation to keep, no trace is kept for (the limit probes' runs hold it)."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=240, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(20.0, rerun_wall_s=20.0)  # plan (1, 2): one candidate over 2 rounds
    untraced = b.reserve_s(to_revalidate=1)
    b.trace_steps, b.defaults_step_s = 2, 2.0  # two steps of the defaults' 2 s
    assert b.trace_s() == 4.0
    assert b.reserve_s(to_revalidate=1) == pytest.approx(untraced + 4.0)
    assert b.reserve_s(to_revalidate=0) == pytest.approx(b.limit_reserve_s(20.0))
    now[0] = 240 - untraced  # stopped where the rounds fit only without the trace
    assert b.validation_plan() is None
    now[0] = 240 - untraced - 4.0
    assert b.validation_plan() == (1, 2)
    b.trace_steps = 0  # taken
    assert b.trace_s() == 0.0 and b.reserve_s(to_revalidate=1) == pytest.approx(untraced)


def test_the_end_keeps_the_ablation_the_share_the_reserve_kept_for_it():
    """The reserve sizes the ablation at the rounds the best candidate's gain needs (3 here),
    not the plan's 8: the end keeps that share, so the re-validation does not take it all."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=600, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(6.0, rerun_wall_s=6.0)  # plan (3, 8)
    kept = b.reserve_s(to_revalidate=1, ablate=3, rounds=3)
    assert b.reserve_keeps_ablation()
    now[0] = 600 - kept  # the search stopped with exactly the reserve left
    top, rounds = b.validation_plan(ablate=3, rounds=3, contenders=1)
    ablation = 6 * 3 * 6.0  # 6 runs a round (3 knobs), 3 rounds, 6 s each
    assert (top + 1) * rounds * 6.0 <= kept - b.limit_reserve_s(6.0) - ablation
    now[0] += (top + 1) * rounds * 6.0
    assert b.ablation_rounds(3) >= 2  # the ablation still runs


def test_the_re_validation_keeps_three_rounds_before_an_ablation_keeps_its_share():
    """A real 4-minute lab run at 500 Mbit re-validated its winner over 2 rounds ("not measured
    precisely enough") to keep the share of an ablation, which then ran 4 rounds past the
    budget. Replayed on the recorded 500 Mbit landscape at 4 minutes, every re-validation has
    3 rounds or more, and every run keeps its budget."""
    from pathlib import Path

    from autotune.record.attrs import ValidationRecord, load
    from autotune.replay.simulate import Landscape, replay
    from autotune.search.budget import PRECISE_ROUNDS

    land = Landscape.load(Path(__file__).parents[2] / "bench/landscapes/lab-500mbit.json")
    rounds = []
    for seed in range(8):
        r = replay(land, seed=seed, n_trials=100000, budget_s=240.0)
        assert r.seconds <= 240.0, (seed, r.seconds)
        checked = load(r.study, ValidationRecord)
        if checked is not None:
            rounds.append(len(checked.measurements["baseline"]))
    assert len(rounds) >= 6 and min(rounds) >= PRECISE_ROUNDS, rounds


def test_once_the_re_validation_ran_what_follows_is_planned_from_its_runs():
    """A real run planned its ablation at the search trials' 8.5 s a run, ran it at 10.3 s and
    ended 22 s past its budget: the re-validation's own runs now set what a run takes."""
    now = [0.0]
    d = StudyDefinition(name="t", budget_s=240, validate_top=3, validate_rounds=5)
    b = Budget(d, clock=lambda: now[0])
    b.trial_done(12.0, rerun_wall_s=8.5)
    now[0] = 140.0  # 100 s left, 12 s of them kept for the limit probes (5 % of the budget)
    assert b.ablation_rounds(2) == 3  # 88 s // (3 runs x 8.5 s)
    for _ in range(4):
        b.rerun_done(10.3)
    assert b.ablation_rounds(2) == 2  # 88 s // (3 x 10.3 s)


def test_a_comparison_whose_runs_outlast_the_plan_stops_at_a_round_the_budget_holds():
    """The plan is made from the search trials' re-run estimate; where the comparison's own
    runs take longer, it ends after the last round the budget left holds (with the limit
    probes after it) instead of running past the budget, and says so."""
    from autotune.core.events import Note
    from autotune.core.results import TrialResult
    from autotune.search.interleaved import measure_interleaved

    rank = _rank_result()

    now = [0.0]
    d = StudyDefinition(name="t", budget_s=100.0, limit=False)
    b = Budget(d, clock=lambda: now[0])
    b.start()

    def run(key):  # each run 7 s where the plan took 5 s
        now[0] += 7.0
        return TrialResult(ranks=[rank], wall_s=7.0)

    said: list = []
    keys = ["baseline", "a"]
    order = [k for _ in range(10) for k in keys]  # 10 rounds of 14 s: 140 s in a 100 s budget
    runs, failed, _ = measure_interleaved(
        keys, order, run, said.append, essential="baseline", budget=b
    )
    assert len(runs["baseline"]) == len(runs["a"]) == 7 and not failed  # 98 s: the 8th is over
    assert now[0] <= 100.0
    (note,) = [e.text for e in said if isinstance(e, Note)]
    assert note.startswith("Stopped after 7 of 10 rounds: the budget left (2 s) holds no")
    # without a budget, every round of the order runs, as the ablation's tests ask
    now[0] = 0.0
    runs, _, _ = measure_interleaved(keys, order, run, said.append, essential="baseline")
    assert len(runs["a"]) == 10


def test_a_failed_run_of_the_reference_keeps_the_whole_rounds_measured_before_it():
    """A real 10-minute run's re-validation was abandoned 27 runs into its 40 when one run of
    the defaults timed out on a loaded machine, and half the budget went back unused. The
    whole rounds before the failed run now stand (the failed round's other runs are left out,
    so every key keeps one run a round); before two whole rounds nothing stands, as before."""
    from autotune.core.errors import FailureReason, TrialFailed
    from autotune.core.events import Note
    from autotune.core.results import TrialResult
    from autotune.search.interleaved import measure_interleaved

    rank = _rank_result()
    keys = ["a", "baseline", "b"]
    order = [k for _ in range(10) for k in keys]

    def failing_at(n):
        calls = [0]

        def run(key):
            calls[0] += 1
            if key == "baseline" and calls[0] > n:
                raise TrialFailed(FailureReason.TIMEOUT, "no result after 30s")
            return TrialResult(ranks=[rank], wall_s=5.0)

        return run

    said: list = []
    # the baseline's run of round 7 fails (the 20th run): 6 whole rounds stand
    runs, failed, _ = measure_interleaved(
        keys, order, failing_at(19), said.append, essential="baseline"
    )
    assert {k: len(v) for k, v in runs.items()} == {"a": 6, "baseline": 6, "b": 6}
    assert not failed
    (note,) = [e.text for e in said if isinstance(e, Note)]
    assert note.startswith("baseline: its run in round 7 failed (timeout")
    assert note.endswith("the 6 rounds measured before it stand")
    # in the second round: one whole round is no comparison
    assert (
        measure_interleaved(keys, order, failing_at(4), said.append, essential="baseline") is None
    )


def _rank_result():
    """A rank's result of three 1-second windows at about 100 samples/s."""
    from autotune.core.rank_io import RankResult

    return RankResult(
        **dict.fromkeys(("rank", "pid", "steps", "samples", "steps_per_window"), 1),
        **dict.fromkeys(("setup_s", "warmup_s", "measure_s", "loss", "peak_memory_mb"), 0.0),
        applied={},
        window_s=3.0,
        windows=[100.0, 101.0, 99.0],
        warmup_steps=0,
        stop="cap",
        loss_curve=[],
    )
