"""How much of the budget the final re-validation may take (pure logic)."""

from __future__ import annotations

import pytest

from autotune.studydef import StudyDefinition
from autotune.tuner import _validation_plan


def plan(budget_s, wall_s, top=3, rounds=5):
    d = StudyDefinition(name="t", validate_top=top, validate_rounds=rounds)
    return _validation_plan(d, budget_s, wall_s)


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
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError, match="validate_rounds must be a whole number >= 2"):
        StudyDefinition(name="t", validate_rounds=1).check("study definition t")
    with pytest.raises(ConfigError, match="validate_top must be a whole number >= 0"):
        StudyDefinition(name="t", validate_top=-1).check("study definition t")
