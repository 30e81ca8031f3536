"""How much of the budget the final re-validation may take (pure logic)."""

from __future__ import annotations

import pytest

from autotune.studydef import StudyDefinition
from autotune.tuner import _validation_plan


def plan(budget_s, wall_s, top=3, rounds=3):
    d = StudyDefinition(name="t", validate_top=top, validate_rounds=rounds)
    return _validation_plan(d, budget_s, wall_s)


def test_a_long_budget_gets_the_full_plan():
    assert plan(3600, 8) == (3, 3)  # 12 runs x 8 s = 96 s of an hour


@pytest.mark.parametrize(
    ("budget", "wall", "expected"),
    [
        (600, 8, (3, 3)),  # 96 s <= 200 s
        (300, 8, (3, 3)),  # 96 s <= 100 s
        (240, 8, (2, 3)),  # 96 s > 80 s: one candidate fewer (72 s), three rounds kept
        (150, 8, (1, 3)),  # one candidate over three rounds: 48 s <= 50 s
        (120, 8, (1, 2)),  # rounds go only once one candidate is left (32 s <= 40 s)
        (70, 8, (1, 2)),  # 32 s: over a third, within half of the budget
        (60, 8, None),  # 32 s > half of 60 s: no re-validation
    ],
)
def test_the_plan_shrinks_candidates_then_rounds_to_fit_the_budget(budget, wall, expected):
    got = plan(budget, wall)
    assert got == expected
    if got is not None:
        top, rounds = got
        assert (top + 1) * rounds * wall <= budget / 2


def test_validate_top_zero_turns_it_off():
    assert plan(3600, 8, top=0) is None


def test_bad_validation_settings_are_refused():
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError, match="validate_rounds must be a whole number >= 2"):
        StudyDefinition(name="t", validate_rounds=1).check("study definition t")
    with pytest.raises(ConfigError, match="validate_top must be a whole number >= 0"):
        StudyDefinition(name="t", validate_top=-1).check("study definition t")
