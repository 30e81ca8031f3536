"""The wall-clock budget of one run: time left, whether another trial fits, and the plan of the
re-validation that must fit in it too.

``Budget`` is told what happened (``start``, ``trial_done``) and asked questions
(``left_s``, ``room_for_another``, ``validation_plan``); a question never changes it. Trials
running in several threads tell it under its lock.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from autotune.definition.durations import format_duration
from autotune.definition.studydef import StudyDefinition

__all__ = [
    "MAX_ROUNDS",
    "Budget",
    "RunCost",
    "budget_line",
    "rounds_to_tell",
    "validation_plan",
]

#: Most interleaved rounds the re-validation grows to when the budget has room for them.
MAX_ROUNDS = 10
#: Re-validation-sized runs kept at the end for the limit probes (the defaults, the winner).
LIMIT_RUNS = 2
#: The most of the budget kept for them.
LIMIT_SHARE = 0.05
#: What starting new rank processes adds to a run when no trial of this invocation says
#: (``bench/pool_overhead.py``: 7.6 s of overhead fresh against 3.2 s pooled, docs/benchmark.md).
FRESH_START_S = 4.5
#: Fewer rounds than this give a re-validation whose interval is seldom a result (t(1) = 12.7):
#: the ablation's share goes to the re-validation instead.
PRECISE_ROUNDS = 3
#: Rounds of the comparison with the job as it runs today. Its runs start new processes
#: (about twice a pooled run's cost), and it is the run's second figure, not the one the
#: search chooses by; but with two rounds a ratio's 95 % interval has t(1) = 12.7 and is no
#: result (a 5-minute run printed 1.29x [0.36, 4.65]): three or none.
AS_IS_ROUNDS = 3
#: The most of the budget that comparison may be planned to take: where its rounds need more,
#: it is left out of the plan from the start, and the run says so and what budget holds it.
AS_IS_SHARE = 0.25


@dataclass(frozen=True)
class RunCost:
    """What the re-measurement runs of one comparison take (re-validation, its further rounds,
    the ablation): each arm's first run builds its session (``first_s``), its later runs
    measure on the session the ranks kept (``kept_s``: ``autotune.rank.kept``). Where the
    measurer keeps none (script mode), both are the same."""

    first_s: float
    kept_s: float

    def of(self, arms: int, rounds: int) -> float:
        """Seconds of ``rounds`` rounds of ``arms`` runs, each arm's first building."""
        if arms <= 0 or rounds <= 0:
            return 0.0
        return arms * (self.first_s + (rounds - 1) * self.kept_s)

    def rounds_in(self, arms: int, room: float) -> int:
        """The most rounds of ``arms`` runs ``of`` fits in ``room`` seconds."""
        if arms <= 0 or room < arms * self.first_s:
            return 0
        return 1 + int((room - arms * self.first_s) // (arms * self.kept_s))


def _shrunk(top: int, rounds: int, cost: RunCost, room: float) -> tuple[int, int]:
    """``top`` candidates over ``rounds`` rounds cut down until they fit in ``room`` seconds:
    fewer candidates first (down to 1), then fewer rounds (down to 2); it may still not fit."""
    while cost.of(top + 1, rounds) > room and (rounds > 2 or top > 1):
        if top > 1:
            top -= 1
        else:
            rounds -= 1
    return top, rounds


def _grown(top: int, rounds: int, most: int, cost: RunCost, room: float) -> tuple[int, int]:
    """``top`` candidates over ``rounds`` rounds grown into ``room`` seconds, where ``most``
    candidates could still win: rounds up to ``PRECISE_ROUNDS``, then candidates up to
    ``most``, then rounds up to ``MAX_ROUNDS``; rounds past ``PRECISE_ROUNDS`` are given up
    for a candidate that could still win. The candidates after the lever are often its
    partners within the noise of each other: each more round of one candidate against the
    defaults tells a gain the first rounds told already, while measuring the others beside it
    decides between them. On the recorded 300 Mbit landscape a plan cut to one candidate grew
    to 6 rounds of the hook with bucket views (0.953 of the best) against the defaults, where
    3 rounds of it, the hook with 5 MB buckets (0.983) and the hook alone fit the same room
    (seeds at 0.98 of the best, 5 and 10 minutes: 82 % -> 100 %)."""
    if top < most:  # rounds past PRECISE_ROUNDS are worth less than a contender measured
        rounds = min(rounds, PRECISE_ROUNDS)
    while rounds < PRECISE_ROUNDS and cost.of(top + 1, rounds + 1) <= room:
        rounds += 1
    while top < most and cost.of(top + 2, rounds) <= room:
        top += 1
    while rounds < MAX_ROUNDS and cost.of(top + 1, rounds + 1) <= room:
        rounds += 1
    return top, rounds


def validation_plan(d: StudyDefinition, budget_s: float, cost: RunCost) -> tuple[int, int] | None:
    """(candidates, rounds) of the re-validation that fit in a third of the budget, given what
    its runs take (``cost``). ``validate_rounds`` is the number of rounds aimed
    for; when they do not fit, fewer candidates first, then fewer rounds (the interval's width
    goes with t(n-1)/sqrt(n): 9.0 at 2 rounds, 2.5 at 3, 1.2 at 5 - rounds are worth more than
    candidates); when there is room left, more rounds, up to ``MAX_ROUNDS``. None when even one
    candidate over two rounds does not fit in half of the budget."""
    top, rounds = d.validate_top, d.validate_rounds
    if top == 0 or d.multi_objective:  # the profile is chosen from the Pareto front instead
        return None
    room = budget_s / 3
    top, rounds = _shrunk(top, rounds, cost, room)
    if cost.of(top + 1, rounds) > budget_s / 2:
        return None
    while rounds < MAX_ROUNDS and cost.of(top + 1, rounds + 1) <= room:
        rounds += 1
    return top, rounds


def rounds_to_tell(margin: float, noise: float, *, least: int = 3, most: int = MAX_ROUNDS) -> int:
    """Paired rounds whose 95 % interval on a ratio is narrower than ``margin`` (relative),
    each run's relative noise being ``noise`` (a ratio of two runs: sqrt(2) x that): the
    smallest n in [least, most] with t(n-1) sqrt(2) noise / sqrt(n) < margin. A 1.8x candidate
    against 2 % noise needs the least; 1.03x needs more."""
    from scipy.stats import t

    for n in range(max(least, 2), most + 1):
        if float(t.ppf(0.975, n - 1)) * math.sqrt(2) * noise / math.sqrt(n) < margin:
            return n
    return most


def _measured(
    built: list[float],
    kept: list[float],
    est: RunCost | None,
    centre: Callable[[list[float]], float],
) -> RunCost:
    """What re-measurement runs take from those measured (``built``: runs that built their
    session, ``kept``: runs on a kept one), each kind's ``centre``; a kind none of whose runs
    ran yet as the other kind's scaled as the estimate ``est`` has them (a measurer that keeps
    none, or none kept yet: the runs that built say how far off the estimates were), else as
    ``est`` has it. ``built`` or ``kept`` or ``est`` is given."""
    ratio = 1.0 if est is None else est.kept_s / est.first_s
    if built:
        first_s = centre(built)
    elif kept:
        first_s = centre(kept) / ratio
    else:
        assert est is not None
        return RunCost(est.first_s, min(est.kept_s, est.first_s))
    kept_s = centre(kept) if kept else first_s * ratio
    return RunCost(first_s, min(kept_s, first_s))


def ablation_runs(knobs: int) -> int:
    """Runs per round of the ablation of a winner changing ``knobs`` knobs: the winner and one
    variant per knob, and when two or more knobs could be dropped while another is kept, the
    winner and the configuration without all of them (``ablation._check_joint``)."""
    return knobs + 1 + (2 if knobs >= 3 else 0)


class Budget:
    """The budget of ``definition`` (``budget_s``), from ``start()`` on, on ``clock`` (seconds;
    the replay benchmark, ``autotune.replay.simulate``, passes a simulated one)."""

    def __init__(
        self,
        definition: StudyDefinition,
        clock: Callable[[], float] = time.monotonic,
        *,
        started: float | None = None,
    ) -> None:
        self.d = definition
        self.total_s = definition.budget_s
        self.now = clock
        #: When the command started (on ``clock``): the budget counts from there, Ray's start
        #: and the placement included, and ``start()`` keeps it. None: from ``start()``.
        self._command_started = started
        self.started = clock() if started is None else started
        self._lock = threading.Lock()
        self._walls: list[float] = []  # wall seconds of each search trial
        # What a re-validation run of each measured trial would take (its overhead and
        # rerun_windows of its windows): re-validation runs are that short. And a later run
        # on its kept session (its discarded step and its windows: ``RunCost``).
        self._rerun_walls: list[float] = []
        self._kept_walls: list[float] = []
        # What the re-measurement runs took (``rerun_done``), those that built their session
        # and those on a kept one: once there are any, what follows (the ablation, the limit
        # probes) is planned from them.
        self._reruns_seen: list[float] = []
        self._kept_seen: list[float] = []
        #: Runs kept for the limit probes at the end (``autotune.limit.probe``): two, each about
        #: as long as a re-validation run, when the study measures the limit (not in script
        #: mode, which measures only its first measurement).
        self.limit_runs = LIMIT_RUNS if definition.limit and not definition.command else 0
        #: DDP steps the re-validation's first run of the defaults profiles after its windows
        #: for their Chrome trace (``search.assembly``: ``PROFILED_STEPS`` where the run takes
        #: one; 0 once taken), at the baseline's step time (``defaults_step_s``, set when it is
        #: measured): the plan counts them (``trace_s``).
        self.trace_steps = 0
        self.defaults_step_s: float | None = None
        #: Arms of the comparison with the user's job as it runs today (``search.validation``:
        #: that job, the defaults and the winner, each run in new processes); 0 where the
        #: measurer cannot run that job (set by ``tuner.run``; the replay keeps 0).
        self.as_is_arms = 0
        #: Whether the plan keeps room for that comparison: not once the search resumed after
        #: it was measured (``search.assembly``); a winner found then gets it where the budget
        #: left holds it (``as_is_rounds``).
        self.keep_as_is = True
        #: Seconds spent in each phase of the run (``phase``), each its own time only, and
        #: before the search started (Ray, the placement, the hardware probe).
        self.spent: dict[str, float] = {}
        self.startup_s = 0.0
        self._phases: list[list[float]] = []  # open phases: [start, seconds of those inside]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time inside as ``name``'s (``ledger``), less that of phases inside it
        (the comparison with the job as it runs today inside the re-validation)."""
        frame = [self.now(), 0.0]
        self.spent.setdefault(name, 0.0)  # listed in the order the phases start
        self._phases.append(frame)
        try:
            yield
        finally:
            self._phases.pop()
            took = self.now() - frame[0]
            if self._phases:
                self._phases[-1][1] += took
            self.spent[name] += took - frame[1]

    def ledger(self) -> list[tuple[str, float]]:
        """Where the budget went so far, adding up to the time elapsed: start-up (from the
        command's start to the search's), each phase (``phase``), the rest (``other``: the
        export, the waits between phases), then what is ``returned`` unspent, if any."""
        elapsed = self.elapsed_s()
        out = [("start-up", self.startup_s), *self.spent.items()]
        out.append(("other", max(elapsed - sum(v for _, v in out), 0.0)))
        if self.total_s > elapsed:
            out.append(("returned", self.total_s - elapsed))
        return out

    def start(self) -> None:
        """The clock starts now (just before the first trial), unless it started with the
        command (the time to here is then the ledger's start-up)."""
        if self._command_started is None:
            self.started = self.now()
        self.startup_s = self.now() - self.started

    def left_s(self) -> float:
        return self.total_s - (self.now() - self.started)

    def elapsed_s(self) -> float:
        return self.now() - self.started

    def trial_done(
        self, wall_s: float, rerun_wall_s: float | None = None, kept_wall_s: float | None = None
    ) -> None:
        """A search trial took ``wall_s``; a re-validation run of it would take
        ``rerun_wall_s`` (None: it failed, nothing to re-run), and a later one on its kept
        session ``kept_wall_s`` (None: the measurer keeps none, each run builds anew)."""
        with self._lock:
            self._walls.append(wall_s)
            if rerun_wall_s is not None:
                self._rerun_walls.append(rerun_wall_s)
                self._kept_walls.append(rerun_wall_s if kept_wall_s is None else kept_wall_s)

    def rerun_done(self, wall_s: float, kept: bool = False) -> None:
        """A re-measurement run took ``wall_s``, on a kept session or one it built."""
        with self._lock:
            (self._kept_seen if kept else self._reruns_seen).append(wall_s)

    def _medians(self) -> tuple[float, RunCost] | None:
        """(a search trial's wall seconds, what re-measurement runs take) as the medians so
        far; None before any trial ended. A run's is what the re-measurement runs took, once
        some ran (a real 4-minute run planned its ablation at 8.5 s a run from the search
        trials, ran it at 10.3 s, and ended 22 s past its budget); before, the search trials'
        estimate (``_measured``). A failed trial has no re-validation run: when none has one,
        a run is taken to be as long as a trial."""
        with self._lock:
            if not self._walls:
                return None
            wall = statistics.median(self._walls)
            first, kept = self._rerun_walls, self._kept_walls
            est = RunCost(*(statistics.median(x) for x in (first, kept))) if first else None
            built, on_kept = list(self._reruns_seen), list(self._kept_seen)
        if est is None and not built and not on_kept:
            return wall, RunCost(wall, wall)
        return wall, _measured(built, on_kept, est, statistics.median)

    def _rerun_mean(self) -> RunCost | None:
        """What the re-measurement runs so far took (``rerun_done``), at their means; None
        before any. Rounds planned ahead add up runs, so their sum is planned at the mean: the
        median of runs whose overhead varies planned a replayed ablation of 27 runs at 4.7 s,
        against 5.4 s measured, and the run ended 13 s past its budget."""
        with self._lock:
            built, kept = list(self._reruns_seen), list(self._kept_seen)
        if not built and not kept:
            return None
        medians = self._medians()
        return _measured(built, kept, None if medians is None else medians[1], statistics.fmean)

    def validation_plan(
        self,
        ablate: int = 0,
        rounds: int | None = None,
        as_is: bool | None = None,
        contenders: int | None = None,
    ) -> tuple[int, int] | None:
        """(candidates, rounds) of the re-validation at the end of the run; None when no
        trial has ended yet or re-validation does not fit (``validation_plan``). Asked once
        the search has stopped, the plan takes the budget left less what follows it: the
        comparison with the job as it runs today where planned (``as_is``: whether, by
        default ``keep_as_is``), the ablation of ``ablate``
        knobs over ``rounds`` rounds at most (as the reserve kept them, ``reserve_s``), and
        the limit probes - the first two only where one candidate over two rounds still fits
        beside them, since the choice comes first, and only where the re-validation keeps
        ``PRECISE_ROUNDS`` beside them (a real 4-minute run re-validated over 2 rounds, "not
        measured precisely enough", to keep an ablation's share; an ablation over 2 rounds
        proves no knob useless, so it keeps them all anyway); the ablation's share only where
        it keeps every candidate that could still win too (``contenders``): where re-measured
        runs cost less than the search trials that planned them (kept sessions), a 4-knob
        ablation's share fitted beside one candidate of three, and the replayed 10-minute
        runs at 300 Mbit exported a point at 0.98 of the best in 93 % of seeds, 99 % when the
        candidates come first. It has
        fewer candidates first, then fewer rounds (at least 2), else None: a budget is kept,
        not overrun. Where that room holds more than planned, it grows (``_grown``): rounds to
        ``PRECISE_ROUNDS``, candidates back to ``validate_top``, then rounds to ``MAX_ROUNDS``:
        what the search left unspent goes to the choice and its precision, not back unused.
        ``contenders``: the candidates that could still win (``stop.reserve_for``), at most
        ``validate_top``; None: ``validate_top``."""
        medians = self._medians()
        if medians is None:
            return None
        cost = medians[1]
        plan = validation_plan(self.d, self.total_s, cost)
        if plan is None:
            return None
        room = self.left_s() - self.limit_reserve_s() - self.trace_s()
        n = plan[1] if rounds is None else min(plan[1], rounds)
        most = self.d.validate_top if contenders is None else min(contenders, self.d.validate_top)
        # what follows keeps its share: the comparison with the job today where planned, and
        # the ablation where the choice keeps every candidate that could still win beside
        # them; else the comparison alone...
        today = self.as_is_s() or 0.0
        if not (self.as_is_planned() and (self.keep_as_is if as_is is None else as_is)):
            today = 0.0
        shares = ((today + self._ablation_s(ablate, n, cost), min(max(most, 1), plan[0])),)
        shares += ((today, 1),)
        for after, least in shares:
            # ...unless the choice itself would not fit beside it, or only over fewer rounds
            # than PRECISE_ROUNDS: the choice then takes that share (see above)
            beside = _shrunk(*plan, cost, room - after)
            fits = cost.of(1 + 1, 2) <= room - after
            if after > 0 and fits and beside[1] >= PRECISE_ROUNDS and beside[0] >= least:
                room -= after
                break
        top, rounds = _shrunk(*plan, cost, room)
        if cost.of(top + 1, rounds) > room:
            return None
        return _grown(top, rounds, max(most, 1), cost, room)

    @staticmethod
    def _keeps_ablation(plan: tuple[int, int]) -> bool:
        """Whether the end can keep an ablation's share beside the re-validation ``plan``
        (``validation_plan``): only where the plan has ``PRECISE_ROUNDS`` rounds or more."""
        return plan[1] >= PRECISE_ROUNDS

    def reserve_keeps_ablation(self) -> bool:
        """Whether the reserve (``reserve_s``) keeps a share for the ablation of the winner."""
        medians = self._medians()
        if medians is None:
            return False
        plan = validation_plan(self.d, self.total_s, medians[1])
        return plan is not None and self._keeps_ablation(plan)

    @staticmethod
    def _ablation_s(knobs: int, rounds: int, cost: RunCost) -> float:
        """Seconds the plan keeps for the ablation of a winner changing ``knobs`` knobs:
        ``ablation_runs`` a round over the re-validation's ``rounds``; none for fewer than two
        knobs (one knob is its own re-validation). Fewer rounds were tried and replayed worse:
        at 3 the ablation dropped knobs that carry the gain (on the default landscape at 5
        minutes, 55 % of seeds exported a point at >= 0.98 of the best against 71 %), at 6 the
        1 Gbit lab landscape at 10 minutes fell to 72 % against 87 %."""
        if knobs < 2:
            return 0.0
        return cost.of(ablation_runs(knobs), rounds)

    def ablation_rounds(self, knobs: int) -> int:
        """Rounds of the ablation of a winner changing ``knobs`` knobs (``ablation_runs`` per
        round) that the budget left holds, at most the re-validation's (``ablation.ablate``
        needs 2), less the limit probes that follow it. ``ablation_rounds(1)``: rounds of two
        runs, as the joint check takes."""
        medians = self._medians()
        if medians is None:
            return 0
        plan = validation_plan(self.d, self.total_s, medians[1])  # the rounds aimed for
        if plan is None:
            return 0
        cost = self._rerun_mean() or medians[1]
        room = self.left_s() - self.limit_reserve_s()
        return min(plan[1], cost.rounds_in(ablation_runs(knobs), room))

    def more_rounds(
        self, done: int, arms: int = 2, most: int = MAX_ROUNDS, keep_runs: int = 0
    ) -> int:
        """Rounds of ``arms`` re-validation runs, after the ``done`` rounds measured, that the
        budget left holds before ``keep_runs`` runs more and the limit probes, at their
        measured mean time (``_rerun_mean``; each arm's first run as one that builds its
        session, where an ablation came between), up to ``most`` in all; 0 before any
        re-validation run."""
        cost = self._rerun_mean()
        if cost is None:
            return 0
        room = self.left_s() - self.limit_reserve_s() - keep_runs * cost.first_s
        return max(0, min(most - done, cost.rounds_in(arms, room)))

    def fresh_run_s(self) -> float | None:
        """A re-validation run's wall seconds in new processes: the typical run plus the
        process start, which the first trial of this invocation paid (every run starts its
        pool afresh) over the median; ``FRESH_START_S`` until a third trial says. None before
        any trial ended."""
        medians = self._medians()
        if medians is None:
            return None
        with self._lock:
            first = self._rerun_walls[0] if len(self._rerun_walls) >= 3 else None
        run = medians[1].first_s
        start = FRESH_START_S if first is None else max(first - run, 0.0)
        return run + start

    def as_is_s(self, arms: int | None = None) -> float | None:
        """Seconds of ``AS_IS_ROUNDS`` rounds of ``arms`` fresh runs (the comparison with the
        job as it runs today; ``as_is_arms`` by default); None before a trial ended or where
        the measurer cannot run that job."""
        run = self.fresh_run_s()
        if not self.as_is_arms or run is None:
            return None
        return AS_IS_ROUNDS * (self.as_is_arms if arms is None else arms) * run

    def as_is_planned(self) -> bool:
        """Whether the comparison with the job as it runs today is in the plan: its rounds fit
        in ``AS_IS_SHARE`` of the budget."""
        need = self.as_is_s()
        return need is not None and need <= AS_IS_SHARE * self.total_s

    def as_is_rounds(self, arms: int) -> int:
        """Rounds of ``arms`` fresh runs (the comparison with the job as it runs today) to
        measure now: ``AS_IS_ROUNDS`` where that comparison is planned and the budget left,
        less the limit probes, holds them; else 0 (``as_is_left_out`` says why)."""
        need, medians = self.as_is_s(arms), self._medians()
        if need is None or medians is None or not self.as_is_planned():
            return 0
        room = self.left_s() - self.limit_reserve_s()
        return AS_IS_ROUNDS if need <= room else 0

    def as_is_left_out(self, arms: int) -> str:
        """Why the comparison with the job as it runs today is not measured (``as_is_rounds``
        gave 0), with the budget that would hold it."""
        planned = self.as_is_planned()
        if not planned:  # as planned: with the winner's arm
            arms = self.as_is_arms
        need = self.as_is_s(arms) or 0.0
        runs = f"{AS_IS_ROUNDS} rounds of its {arms} runs in new processes (about {need:.0f} s)"
        if not planned:
            at_least = format_duration(math.ceil(need / AS_IS_SHARE / 60) * 60)
            return (
                f"not measured: {runs} would take more than {AS_IS_SHARE:.0%} of the budget; "
                f"a budget of {at_least} or more holds them"
            )
        return f"not measured: the budget left ({max(self.left_s(), 0):.0f} s) holds no {runs}"

    def trace_s(self) -> float:
        """Seconds the defaults' trace adds to the re-validation (``trace_steps``): replayed
        3-minute runs on the recorded 300 Mbit landscape ended up to 9 s past their budget
        where the plan did not count the 4 s of two profiled steps."""
        return self.trace_steps * (self.defaults_step_s or 0.0)

    def limit_reserve_s(self, run_wall_s: float | None = None) -> float:
        """Seconds kept for the limit probes: ``limit_runs`` re-validation-sized runs (of
        ``run_wall_s``, by default a run that builds its session: a probe builds its own), at
        most ``LIMIT_SHARE`` of the budget (a probe in pooled processes takes less than a
        run: on the quick study 2.7 s against 5-8 s)."""
        if run_wall_s is None:
            medians = self._medians()
            run_wall_s = 0.0 if medians is None else medians[1].first_s
        return min(self.limit_runs * run_wall_s, LIMIT_SHARE * self.total_s)

    def holds(self, seconds: float, run_wall_s: float | None = None) -> bool:
        """Whether the budget left holds ``seconds`` more and, after them, the limit probes
        (``limit_reserve_s`` at runs of ``run_wall_s``)."""
        return self.left_s() - self.limit_reserve_s(run_wall_s) >= seconds

    def nothing_to_keep(self) -> bool:
        """Whether a reserve would buy nothing: the budget as a whole plans a re-validation
        (``validation_plan``), but the budget left no longer holds even its least (one
        candidate over two rounds, beside the limit probes; ``Budget.validation_plan`` is
        None). Whatever the search kept for it would go back unused: a real 1-minute script
        run stopped its search with 22 s left, kept 28 s for one candidate, re-validated
        nothing and returned 21 s."""
        medians = self._medians()
        if medians is None:
            return False
        planned = validation_plan(self.d, self.total_s, medians[1]) is not None
        return planned and self.validation_plan() is None

    def trial_s(self) -> float | None:
        """A search trial's wall seconds (the median so far); None before any ended."""
        medians = self._medians()
        return None if medians is None else medians[0]

    def rerun_s(self) -> float | None:
        """A re-measurement run's wall seconds in a session of its own (``_medians``); None
        before any trial ended."""
        medians = self._medians()
        return None if medians is None else medians[1].first_s

    def reserve_s(
        self,
        *,
        to_revalidate: int,
        ablate: int = 0,
        rounds: int | None = None,
        as_is: bool | None = None,
    ) -> float:
        """Seconds kept for what follows the search: the re-validation of ``to_revalidate``
        candidates (as many as the plan takes), the comparison with the job as it runs today
        (``as_is_arms`` fresh runs a round; ``as_is``: whether, by default ``keep_as_is``),
        the ablation of a winner changing ``ablate`` knobs, each over the plan's rounds or
        ``rounds`` if fewer (what the candidates' gain needs: ``stats.rounds_to_tell``), and
        the limit probes. The search decides which candidates earn a reserve
        (``search.Search``: those beyond their noise).

        Where the plan has fewer rounds than ``PRECISE_ROUNDS`` (a short budget, slow runs),
        the end never keeps an ablation's share beside the re-validation
        (``validation_plan``): it takes that share for the choice's rounds. The reserve then
        keeps what the end will do with it, the candidates up to ``PRECISE_ROUNDS`` rounds,
        not the ablation: replayed 4-minute runs on the recorded 300 Mbit landscape (14 s
        runs, one candidate over 2 rounds planned) stopped searching for it and used a median
        83 % of their budget, 93 % now."""
        medians = self._medians()
        if medians is None:
            return 0.0
        cost = medians[1]
        plan = validation_plan(self.d, self.total_s, cost)
        runs, after = 0.0, 0.0
        if plan is not None and to_revalidate:
            n = plan[1] if rounds is None else min(plan[1], rounds)
            arms = min(to_revalidate, plan[0]) + 1
            runs = cost.of(arms, n)
            after = self._ablation_s(ablate, n, cost)
            if not self._keeps_ablation(plan):  # the end gives its share to the choice
                after = min(after, arms * max(PRECISE_ROUNDS - n, 0) * cost.kept_s)
            if self.as_is_planned() and (self.keep_as_is if as_is is None else as_is):
                after += self.as_is_s() or 0.0
        trace = self.trace_s() if runs else 0.0  # in the re-validation's first run
        return runs + trace + after + self.limit_reserve_s()

    def search_room(
        self, *, to_revalidate: int, ablate: int = 0, rounds: int | None = None, as_is: bool
    ) -> tuple[int, float, float] | None:
        """(search trials the budget left holds beside the reserve, a trial's seconds, the
        seconds kept: ``reserve_s`` for those arguments); None before any trial ended."""
        wall = self.trial_s()
        if wall is None or wall <= 0:
            return None
        kept = self.reserve_s(
            to_revalidate=to_revalidate, ablate=ablate, rounds=rounds, as_is=as_is
        )
        return max(0, int((self.left_s() - kept) // wall)), wall, kept

    def room_for_another(
        self, *, to_revalidate: int, ablate: int = 0, rounds: int | None = None
    ) -> bool:
        """Whether the budget left holds a typical trial and the reserve (``reserve_s``)."""
        left = self.left_s()
        if left <= 0:
            return False
        wall = self.trial_s()
        if wall is None:
            return True
        reserve = self.reserve_s(to_revalidate=to_revalidate, ablate=ablate, rounds=rounds)
        return left >= wall + reserve


def budget_line(total_s: float, ledger: list[tuple[str, float]]) -> str:
    """Where a budget of ``total_s`` went (``Budget.ledger``), for people: ``5m: start-up
    14s, search 2m10s, re-validation 1m2s, limit 9s, other 3s (3m38s in all); 1m22s
    returned``. Phases under half a second are left out of the list, never of the sum."""
    spent = [(k, v) for k, v in ledger if k != "returned"]
    returned = sum(v for k, v in ledger if k == "returned")
    shown = ", ".join(f"{k} {format_duration(v)}" for k, v in spent if v >= 0.5)
    line = (
        f"{format_duration(total_s)}: {shown} ({format_duration(sum(v for _, v in spent))} in all)"
    )
    return line + (f"; {format_duration(returned)} returned" if returned >= 0.5 else "")
