"""The interleaved comparison every check after the search makes (the re-validation, its
further rounds, the comparison with the job as it runs today, the ablation): each key run
once a round in the order given, a failed key left out, the rounds cut where the budget left
holds no more, and the rounds before a failed run of the comparison's reference kept.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from autotune.core.errors import TrialFailed
from autotune.core.events import Emit, Note, ValidationRun
from autotune.core.results import TrialResult
from autotune.search.budget import Budget

__all__ = ["ESSENTIAL_ROUNDS", "measure_interleaved"]

#: Whole rounds measured before the reference's run fails that still make a comparison
#: (``measure_interleaved``): a paired interval needs two.
ESSENTIAL_ROUNDS = 2


def measure_interleaved(
    keys: list[str],
    order: list[str],
    run: Callable[[str], TrialResult],
    emit: Emit,
    *,
    essential: str,
    budget: Budget | None = None,
) -> tuple[dict[str, list[float]], dict[str, str], float] | None:
    """Measure each of ``keys`` in the ``order`` given with ``run`` (an interleaved design:
    every key once per round), saying each result (``ValidationRun``); a key whose run fails is not
    measured again. Returns each key's throughputs (a failed key's up to its failure), the
    failed keys with their reason, and the seconds inside timed windows. When the
    ``essential`` key's run fails (the comparison's reference), the whole rounds measured
    before it stand where there are ``ESSENTIAL_ROUNDS`` (``_rounds_before``), else None.
    Re-validation and ablation (``autotune.search.ablation``) both measure this way.

    With ``budget``, a round after the second starts only where the budget left holds it (at
    this comparison's own runs' mean wall time, those on kept sessions where there are any:
    ``autotune.rank.kept``) and the limit probes after it: the plan was
    made from the search trials' times, and a run that takes longer than those must not push
    the run past its budget (a replayed 5-minute run at 300 Mbit took 319 s). The rounds
    measured stand, said in one line. Each run's time is told to ``budget``
    (``Budget.rerun_done``), so what follows is planned from it. The re-validation passes it;
    the ablation does not: its rounds are planned from the budget left just before it, and
    cutting its last round changed which knobs it kept (the default landscape at 5 minutes:
    61 % of seeds at 0.98 of the best, against 67 %)."""
    runs: dict[str, list[float]] = {k: [] for k in keys}
    failed: dict[str, str] = {}
    timed_s = 0.0
    walls: list[float] = []
    kept: list[float] = []  # the walls of the runs on kept sessions
    size = len(keys)
    for i, key in enumerate(order):
        if budget is not None and walls and i % size == 0 and i // size >= 2:
            run_s = statistics.mean(kept or walls)
            round_s = run_s * sum(k not in failed for k in keys)
            if not budget.holds(round_s):
                emit(
                    Note(
                        f"Stopped after {i // size} of {len(order) // size} rounds: the budget "
                        f"left ({max(budget.left_s(), 0):.0f} s) holds no further round "
                        f"({round_s:.0f} s) and the limit probe"
                    )
                )
                break
        if key in failed:
            continue
        try:
            result = run(key)
        except TrialFailed as e:
            reason = f"{e.reason}: {e.detail}"
            emit(ValidationRun(key=key, failure=reason))
            if key == essential:
                kept = _rounds_before(runs, i // size, key, reason, emit)
                return None if kept is None else (kept, failed, timed_s)
            failed[key] = reason
            continue
        runs[key].append(result.throughput)
        walls.append(result.wall_s)
        if result.kept:
            kept.append(result.wall_s)
        if budget is not None:
            budget.rerun_done(result.wall_s, result.kept)
        timed_s += result.window_s
        ci = result.interval
        emit(ValidationRun(key=key, throughput=ci.median, rel_half_width=ci.rel_half_width))
    return runs, failed, timed_s


def _rounds_before(
    runs: dict[str, list[float]], done: int, essential: str, reason: str, emit: Emit
) -> dict[str, list[float]] | None:
    """Each key's throughputs ``measure_interleaved`` keeps when the ``essential`` key's run
    failed after ``done`` whole rounds: those rounds, where there are ``ESSENTIAL_ROUNDS`` or
    more (the runs of the round it failed in are left out, so every key keeps one run a
    round), said in one line; else None. One run of the defaults that timed out while the
    machine was loaded abandoned a re-validation 27 runs into its 40 and sent half a
    10-minute budget back."""
    if done < ESSENTIAL_ROUNDS:
        return None
    emit(
        Note(
            f"{essential}: its run in round {done + 1} failed ({reason}); the {done} rounds "
            "measured before it stand"
        )
    )
    return {k: v[:done] for k, v in runs.items()}
