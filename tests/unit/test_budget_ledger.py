"""Where the budget went: phases that add up to the run's time (``Budget.ledger``)."""

from __future__ import annotations

import pytest

from autotune.definition.studydef import StudyDefinition
from autotune.search.budget import Budget, budget_line


def test_the_ledger_adds_up_to_the_time_elapsed_with_nested_phases_counted_once():
    clock = [100.0]
    b = Budget(StudyDefinition(name="t", budget_s=300), lambda: clock[0], started=100.0)
    clock[0] = 112.0  # Ray, the placement, the hardware probe
    b.start()
    with b.phase("search"):
        clock[0] += 150
    with b.phase("re-validation"):
        clock[0] += 40
        with b.phase("as today"):  # inside the re-validation: its own line, not both
            clock[0] += 30
        clock[0] += 5
    with b.phase("limit"):
        clock[0] += 9
    clock[0] += 3  # the export
    ledger = b.ledger()
    assert ledger == [
        ("start-up", 12.0),
        ("search", 150.0),
        ("re-validation", 45.0),
        ("as today", 30.0),
        ("limit", 9.0),
        ("other", 3.0),
        ("returned", 51.0),
    ]
    assert sum(v for k, v in ledger if k != "returned") == pytest.approx(b.elapsed_s())
    assert budget_line(300, ledger) == (
        "5m: start-up 12s, search 2m30s, re-validation 45s, as today 30s, limit 9s, other 3s "
        "(4m9s in all); 51s returned"
    )


def test_a_phase_that_raises_is_counted_all_the_same():
    clock = [0.0]
    b = Budget(StudyDefinition(name="t", budget_s=60), lambda: clock[0])
    b.start()
    with pytest.raises(KeyboardInterrupt), b.phase("search"):
        clock[0] = 20.0
        raise KeyboardInterrupt
    assert dict(b.ledger())["search"] == 20.0
    clock[0] = 70.0  # over the budget: nothing returned
    assert "returned" not in dict(b.ledger())
    assert budget_line(60, b.ledger()) == "1m: search 20s, other 50s (1m10s in all)"
