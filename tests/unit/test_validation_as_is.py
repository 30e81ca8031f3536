"""The user's job as it runs today, in re-validation: the configuration it runs (no allocator
pin, torchrun's threads), the comparison with the defaults and the winner (every arm in new
processes, only that job unpinned), the budget kept for it, and what the record, the profile,
the ablation table and the run's summary say. The measurer here is a stand-in that returns
set throughputs; tests/integration/test_validation.py runs the same through real Ray ranks."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from autotune.core import allocator
from autotune.core.config import MeasureSettings, TrialConfig, as_it_runs
from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.events import TrialStarted, ValidationRun
from autotune.core.rank_io import RankResult
from autotune.core.results import TrialResult
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.profile.export import study_profile
from autotune.profile.profile import Profile
from autotune.record.attrs import AsIsRecord, IntervalRecord, ValidationRecord, load, load_readable
from autotune.record.study import ATTR
from autotune.search.ablation import PIN, pin_contribution
from autotune.search.budget import AS_IS_ROUNDS, AS_IS_SHARE, FRESH_START_S, Budget
from autotune.search.validation import TODAY, against_today, revalidate

TARGET = Target(backend="gloo", device="cpu", world_size=2, global_batch=32, cpus_per_rank=2)
SPACE = SearchSpace.load("default").resolve(TARGET)
DEFAULTS = SPACE.defaults()
WORKLOAD = {"trainer": "mlp", "options": {}, "world_size": 2, "backend": "gloo", "global_batch": 32}
HARDWARE = {"device": "cpu", "device_name": "cpu", "device_count": 2, "node_count": 1}
RERUN = MeasureSettings().rerun()


def config(**changes) -> TrialConfig:
    return TrialConfig.from_values({**DEFAULTS, **changes}, TARGET)


# -- the configuration of the job as it runs today ---------------------------------------------


def test_the_job_as_it_runs_today_has_no_allocator_pin_and_torchrun_s_threads():
    base = config()
    assert set(allocator.ENV) <= set(base.env)  # every trial of autotune's carries the pin
    today = as_it_runs(base, {}, ranks_per_node=2)
    assert not set(allocator.ENV) & set(today.env)
    assert today.env["OMP_NUM_THREADS"] == "1" and today.threads == 1  # torchrun, 2 ranks
    assert {k: v for k, v in today.to_dict().items() if k not in ("env", "threads")} == {
        k: v for k, v in base.to_dict().items() if k not in ("env", "threads")
    }  # nothing else changes
    today.check()  # a configuration that runs


def test_the_user_s_own_thread_setting_is_kept_and_one_rank_a_node_keeps_every_cpu():
    base = config(threads=2)
    assert as_it_runs(base, {"OMP_NUM_THREADS": "2"}, ranks_per_node=2).threads == 2
    assert as_it_runs(base, {}, ranks_per_node=1).threads == 2  # torchrun sets nothing
    assert as_it_runs(base, {}, ranks_per_node=None).threads == 1  # unknown: several
    for bad in ("0", "x", "-3", ""):  # not a value torch would take: torchrun's rule
        assert as_it_runs(base, {"OMP_NUM_THREADS": bad}, ranks_per_node=2).threads == 1


_PROBE = "from autotune.core import allocator; import sys; {} print(allocator.pinned())"


@pytest.mark.parametrize(
    ("env", "code", "expected"),
    [
        ({}, "", "False"),  # glibc as it starts a process: the job as it runs today
        (dict(allocator.ENV), "", "True"),  # pinned by the variables (autotune launch)
        ({}, "allocator.pin();", "True"),  # pinned by mallopt (the rank processes)
    ],
)
def test_a_new_process_reads_its_allocator_back_as_glibc_runs_it(env, code, expected):
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(code)],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == expected


# -- the comparison, through a stand-in measurer --------------------------------------------


def result(throughput: float, pinned: bool | None) -> TrialResult:
    rank = RankResult(
        rank=0,
        applied={"allocator_pinned": pinned},
        pid=1,
        steps=3,
        samples=96,
        window_s=1.0,
        windows=[throughput] * 3,
        steps_per_window=1,
        warmup_steps=2,
        stop="cap",
        setup_s=0.1,
        warmup_s=0.05,
        measure_s=1.0,
        loss=1.0,
        loss_curve=[],
        peak_memory_mb=1.0,
    )
    return TrialResult(ranks=[rank, replace(rank, rank=1)], wall_s=2.0)


class Stand:
    """A measurer whose runs give set throughputs: the job as it runs today 100 samples/s,
    the pinned defaults 132 (warm) or 130 (new processes), the winner 160 or 159: the
    machine's noise is a small wobble by round. Records every call."""

    def __init__(self, *, reason: str | None = None, fail: str | None = None) -> None:
        self.reason, self.fail = reason, fail
        self.calls: list[tuple[str, int, bool | None]] = []
        self.kept: list[bool] = []  # each warm run's ``keep``
        self.n = 0

    def _value(self, config: TrialConfig, pin: bool) -> float:
        self.n += 1
        wobble = 1 + 0.01 * (self.n % 3)
        if not pin:
            return 100.0 * wobble
        return (160.0 if config.precision == "bf16" else 132.0) * wobble

    def __call__(
        self, number, config, incumbent=None, measure=None, log_dir=None, limit=None, keep=False
    ):
        self.calls.append(("warm", number, None))
        self.kept.append(keep)
        return result(self._value(config, True), True)

    def as_is(self, config: TrialConfig) -> TrialConfig | str:
        return self.reason if self.reason else as_it_runs(config, {}, 2)

    def fresh(self, number, config, *, measure, pin=True):
        self.calls.append(("fresh", number, pin))
        key = TODAY if not pin else ("baseline" if number == 0 else "trial 1")
        if key == self.fail:
            raise TrialFailed(FailureReason.CRASH, "rank 0: boom")
        # the run's own processes say what glibc does: pinned unless told not to
        return result(self._value(config, pin), pin)


def study_with(winner_value: float = 200.0) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(ATTR, {"workload": WORKLOAD, "hardware": HARDWARE, "left_out": []})
    dist = {"precision": CategoricalDistribution(["fp32", "bf16"])}
    for precision, value, baseline in (("fp32", 132.0, True), ("bf16", winner_value, False)):
        study.add_trial(
            create_trial(
                params={"precision": precision},
                distributions=dist,
                value=value,
                user_attrs={"baseline": baseline, "config": config(precision=precision).to_dict()},
            )
        )
    return study


def run_revalidation(measure, study=None, budget=None):
    study = study or study_with()
    events: list = []
    record = revalidate(
        study=study,
        definition=StudyDefinition(name="t", trainer="mlp"),
        plan=(1, 4),
        measure=measure,
        emit=events.append,
        defaults=DEFAULTS,
        budget=budget,
    )
    return study, record, events


def test_the_job_as_it_runs_today_is_measured_unpinned_against_the_defaults_and_the_winner():
    m = Stand()
    study, record, events = run_revalidation(m)
    assert record is not None and record.winner == "trial 1"
    today = record.as_is
    assert today is not None and not today.reason
    assert set(today.order) == {TODAY, "baseline", "trial 1"} and len(today.order) == 12
    fresh = [c for c in m.calls if c[0] == "fresh"]
    assert len(fresh) == 12  # every arm of this comparison in new processes
    assert {pin for _, _, pin in fresh if pin is False} == {False}
    assert sum(pin is False for _, _, pin in fresh) == 4  # only the job as it runs today
    assert today.pinned == {TODAY: False, "baseline": True, "trial 1": True}
    assert today.pin is not None and today.pin.median == pytest.approx(1.32, abs=0.02)
    assert today.today is not None and today.today.median == pytest.approx(1.60, abs=0.02)
    assert today.changes == ["the allocator pin"]  # the defaults' threads are torchrun's
    assert load(study, ValidationRecord) == record  # stored, and read back the same
    line = today.line(record.speedup)
    assert line.startswith(f"{today.today.median:.2f}x [")
    assert "your job as it runs today (of which" in line
    assert "the allocator pin" in line and "from the tuned knobs" in line
    assert any(getattr(e, "text", "") == line for e in events)  # said in the run's log


def test_the_winner_s_choice_is_made_in_the_warm_pool_and_unchanged_by_the_job_today():
    m = Stand()
    _, record, _ = run_revalidation(m)
    warm = [c for c in m.calls if c[0] == "warm"]
    assert len(warm) == 8 and record.measurements.keys() == {"baseline", "trial 1"}
    assert m.kept == [True] * 8  # on the sessions the ranks keep (``rank.kept``)
    assert TODAY not in record.results  # never a candidate


def test_when_the_defaults_win_the_job_today_is_set_against_the_defaults_alone():
    m = Stand()
    study = study_with()  # the winner re-measures below the defaults:
    m._value = lambda config, pin: 100.0 if not pin else 132.0 - 5 * (config.precision == "bf16")
    _, record, _ = run_revalidation(m, study)
    assert record.winner == "baseline"
    today = record.as_is
    assert set(today.order) == {TODAY, "baseline"} and today.today == today.pin
    line = today.line(None)
    assert line.startswith("1.32x [") and "from the tuned knobs" not in line


def test_a_comparison_too_wide_to_be_a_result_is_no_headline():
    from autotune.record.attrs import AsIsRecord, IntervalRecord

    wide = IntervalRecord(median=1.29, low=0.36, high=4.65, n=2)
    today = AsIsRecord(rounds=2, changes=["the allocator pin"], today=wide, pin=wide)
    assert today.line(None) == (
        "your job as it runs today: not measured precisely enough (2 rounds: 0.36-4.65x; "
        "about 5 rounds would settle it)"
    )
    assert "1.29x" not in today.line(None)


@pytest.mark.parametrize(
    ("stand", "budget_rounds", "says"),
    [
        (Stand(reason="not measured on a GPU: why"), None, "not measured on a GPU: why"),
        (Stand(fail=TODAY), None, "not measured: its run failed (crash: rank 0: boom)"),
        (Stand(), 0, "not measured: left out, why"),
    ],
)
def test_where_the_job_today_cannot_be_measured_the_record_says_why(stand, budget_rounds, says):
    budget = None
    if budget_rounds is not None:
        budget = SimpleNamespace(
            as_is_rounds=lambda arms: budget_rounds,
            as_is_left_out=lambda arms: "not measured: left out, why",
            phase=lambda name: contextlib.nullcontext(),
            holds=lambda seconds, run_s=None: True,
            rerun_done=lambda wall_s, kept=False: None,
        )
    _, record, _ = run_revalidation(stand, budget=budget)
    assert record is not None and record.as_is is not None
    assert says in record.as_is.reason and record.as_is.pin is None
    assert record.as_is.line(record.speedup).startswith("your job as it runs today: ")


def test_a_failed_defaults_arm_leaves_no_figure_but_the_choice_stands():
    _, record, _ = run_revalidation(Stand(fail="baseline"))
    assert record.winner == "trial 1" and record.as_is.pin is None
    assert "the defaults' runs failed" in record.as_is.line(record.speedup)


def test_a_measurer_that_cannot_run_the_job_at_all_leaves_no_record():
    class Replay(Stand):
        as_is = None  # the replay's measurer: no such job recorded

    _, record, _ = run_revalidation(Replay())
    assert record is not None and record.as_is is None
    arms = {"baseline": study_with().trials[0]}
    assert against_today(Replay(), print, arms, rounds=3, rerun=RERUN, defaults=DEFAULTS) is None


# -- the budget -------------------------------------------------------------------------------


def budget(total_s: float = 600) -> Budget:
    return Budget(StudyDefinition(name="t", budget_s=total_s, validate_top=3, validate_rounds=5))


def test_the_budget_keeps_room_for_the_job_today_in_new_processes_only_where_it_runs():
    b = budget()
    b.trial_done(6.0, rerun_wall_s=6.0)
    kept = b.reserve_s(to_revalidate=3)
    plan = b.validation_plan()
    assert plan is not None
    assert b.as_is_rounds(3) == 0  # the replay, a GPU: nothing kept, nothing measured
    b.as_is_arms = 3
    assert b.fresh_run_s() == 6.0 + FRESH_START_S  # one trial: the measured start-up default
    need = AS_IS_ROUNDS * 3 * (6.0 + FRESH_START_S)
    assert b.as_is_s() == pytest.approx(need) and need <= AS_IS_SHARE * b.total_s
    assert b.reserve_s(to_revalidate=3) == pytest.approx(kept + need)
    assert b.as_is_rounds(3) == AS_IS_ROUNDS == 3  # two rounds are no result: three or none
    # the re-validation at the end leaves the comparison its share: with the plan's seconds
    # left, fewer candidates (or rounds) than without it
    clock = [0.0]
    b.now, b.started = (lambda: clock[0]), 0.0
    clock[0] = 600 - (plan[0] + 1) * plan[1] * 6.0 - b.limit_reserve_s(6.0)
    assert b.validation_plan() < plan
    b.as_is_arms = 0
    assert b.validation_plan() == plan


def test_a_comparison_with_the_job_today_over_a_quarter_of_the_budget_is_left_out_saying_so():
    b = budget(180)  # 3 minutes: 3 rounds of 3 runs of 10.5 s are 94 s
    b.as_is_arms = 3
    b.trial_done(6.0, rerun_wall_s=6.0)
    kept_without = b.reserve_s(to_revalidate=1)
    assert not b.as_is_planned() and b.as_is_rounds(3) == 0
    assert b.as_is_left_out(3) == (
        "not measured: 3 rounds of its 3 runs in new processes (about 94 s) would take more "
        "than 25% of the budget; a budget of 7m or more holds them"
    )
    b.as_is_arms = 0
    assert b.reserve_s(to_revalidate=1) == kept_without  # nothing kept for it


def test_the_process_start_is_what_the_first_trial_paid_over_the_others():
    b = budget()
    for rerun in (11.0, 5.0, 6.0, 5.5):  # the first trial starts its processes afresh
        b.trial_done(rerun, rerun_wall_s=rerun)
    assert b.fresh_run_s() == pytest.approx(5.75 + (11.0 - 5.75))


def test_the_rounds_shrink_with_the_budget_left():
    b = budget(600)
    b.as_is_arms = 3
    b.trial_done(6.0, rerun_wall_s=6.0)
    clock = [0.0]
    b.now = lambda: clock[0]
    b.started = 0.0
    clock[0] = 600 - 3 * 3 * (6.0 + FRESH_START_S) - b.limit_reserve_s(6.0) + 1
    assert b.as_is_rounds(3) == 0  # less than its three rounds left: revalidate says so
    assert b.as_is_left_out(3).startswith("not measured: the budget left (")
    clock[0] -= 2
    assert b.as_is_rounds(3) == 3


# -- the ablation table and the profile ------------------------------------------------------


def ci(low, median, high) -> IntervalRecord:
    return IntervalRecord(median=median, low=low, high=high, n=4)


def test_the_ablation_table_lists_the_pin_as_a_contribution_that_is_kept():
    _, record, _ = run_revalidation(Stand())
    row = pin_contribution(record)[PIN]
    assert row.kept and row.speedup[1] == pytest.approx(1.32, abs=0.02)
    assert "defaults over your job as it runs today" in row.why
    unmeasured = replace(record, as_is=AsIsRecord(reason="not measured on a GPU: x"))
    assert pin_contribution(unmeasured) == {}


def test_the_profile_carries_both_figures_and_loads_back(tmp_path):
    study, record, _ = run_revalidation(Stand())
    loaded = Profile.load(study_profile(study).save(tmp_path / "p.yaml"))
    as_is = loaded.measured["as_is"]
    assert as_is["line"] == record.as_is.line(record.speedup)
    assert as_is["speedup"][1] == pytest.approx(1.60, abs=0.02)
    assert as_is["pin"][1] == pytest.approx(1.32, abs=0.02)
    assert as_is["knobs"] == record.speedup.triple()
    assert as_is["pinned"][TODAY] is False and as_is["rounds"] == 4


def test_the_profile_says_why_when_the_job_today_was_not_measured():
    study, _, _ = run_revalidation(Stand(reason="not measured on a GPU: x"))
    assert study_profile(study).measured["as_is"] == {"not_measured": "not measured on a GPU: x"}


def test_the_run_s_summary_prints_the_line():
    from rich.console import Console

    from autotune.cli import main

    study, record, _ = run_revalidation(Stand())
    console = Console(record=True, width=300)
    summary = SimpleNamespace(
        trials={},
        study=study,
        study_name="t",
        baseline=None,
        best=None,
        profile_path=None,
        storage_url="sqlite:///x.db",
        budget_s=300.0,
        ledger=[("start-up", 12.0), ("search", 200.0), ("as today", 40.0), ("returned", 48.0)],
    )
    main._print_summary(console, summary)
    text = console.export_text()
    assert f"As today   {record.as_is.line(record.speedup)}" in text
    assert (
        "Budget     5m: start-up 12s, search 3m20s, as today 40s (4m12s in all); 48s returned"
        in text
    )


def test_an_interrupt_while_measuring_the_job_today_keeps_the_revalidation_s_choice():
    """Ctrl-C or SIGTERM during the comparison with the job as it runs today: the
    re-validation's record is already stored (the export reads the validated winner), only
    without the figure it was measuring."""

    class Interrupted(Stand):
        def fresh(self, number, config, *, measure, pin=True):
            raise KeyboardInterrupt

    study = study_with()
    with pytest.raises(KeyboardInterrupt):
        run_revalidation(Interrupted(), study)
    stored = load_readable(study, ValidationRecord)
    assert stored is not None and stored.winner == "trial 1" and stored.as_is is None


def test_the_live_display_closes_each_run_of_the_job_today():
    """Each run's TrialStarted and its ValidationRun name the same key, so the live display
    does not keep a run of the comparison 'running' after it ended."""
    _, _, events = run_revalidation(Stand())
    started = [e.tag for e in events if isinstance(e, TrialStarted)]
    ended = [f"re-validating {e.key}" for e in events if isinstance(e, ValidationRun)]
    assert sorted(started) == sorted(ended) and f"re-validating {TODAY}" in started


def test_a_shell_that_carries_autotunes_pin_is_seen_and_asis_runs_without_it():
    assert allocator.pinned_by_env(dict(allocator.ENV)) and not allocator.pinned_by_env({})
    shell = {"PATH": "/bin", **allocator.ENV, "OMP_NUM_THREADS": "4"}
    assert allocator.without_pin(shell) == {"PATH": "/bin", "OMP_NUM_THREADS": "4"}
    own = {allocator.MMAP_ENV: "65536"}  # the user's own value is theirs: kept
    assert allocator.without_pin(own) == own


def test_the_first_run_of_the_defaults_takes_their_trace_and_only_it(tmp_path):
    """The first measurement takes no Chrome trace (the screening waits for it): the
    re-validation's first run of the defaults writes it after its windows, and the run keeps
    where (``traced``) for the limit probe's record. No other run is traced."""

    class Traced(Stand):
        def __call__(
            self,
            number,
            config,
            incumbent=None,
            measure=None,
            log_dir=None,
            limit=None,
            trace=None,
            keep=False,
        ):
            assert not (keep and trace)  # a traced run is a session of its own
            self.calls.append(("warm", number, trace))
            if trace is not None:
                trace.write_text('{"traceEvents": []}')
            return result(self._value(config, True), True)

    m, traced = Traced(), {}
    path = tmp_path / "limit" / "baseline.trace.json"
    record = revalidate(
        study=study_with(),
        definition=StudyDefinition(name="t", trainer="mlp"),
        plan=(1, 4),
        measure=m,
        emit=lambda e: None,
        defaults=DEFAULTS,
        trace=path,
        traced=traced,
    )
    assert record is not None and record.winner == "trial 1"
    warm = [c for c in m.calls if c[0] == "warm"]
    defaults = [c for c in warm if c[1] == 0]
    assert len(warm) == 8 and len(defaults) == 4 and defaults[0][2] == path
    assert [c for c in warm if c[2] is not None] == [defaults[0]]  # no other run traced
    assert traced == {"baseline": path} and path.exists()
