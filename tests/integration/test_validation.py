"""Re-validation before export, through real 2-rank gloo trials: the search's best is measured
again against the baseline, interleaved, and the profile follows those numbers only; then the
user's job as it runs today (no allocator pin) against the pinned defaults, every arm in new
rank processes."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from autotune.core.choice import NO_WINNER_REASON, interleave
from autotune.core.events import Note, ValidationDone, ValidationRun, ValidationStarted
from autotune.core.stats import precise, speedup_text
from autotune.definition.space import SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import RayMeasurer
from autotune.profile.export import export_profile
from autotune.profile.profile import Profile
from autotune.record.attrs import ValidationRecord, load
from autotune.record.study import ATTR
from autotune.search.validation import TODAY, revalidate
from tests.integration.conftest import QUICK, TARGET, config

pytestmark = pytest.mark.integration

WORKLOAD = {
    "trainer": "autotune_test_trainers:tiny",
    "options": {},
    "world_size": 2,
    "backend": "gloo",
    "global_batch": 32,
}
HARDWARE = {
    "device": "cpu",
    "device_name": "cpu",
    "device_count": 2,
    "node_count": 1,
    "torch": "2.13.0",
    "nccl": None,
}


def test_a_search_winner_that_remeasures_slower_is_not_exported_and_the_job_today_is_measured(
    runner, tmp_path
):
    # The search "saw" trial 1 at 10x the baseline (a lucky, noisy measurement, as the best of
    # many trials is); in truth it runs 4 micro-steps per optimizer step and is slower.
    study = _study(trial_1=10_000.0)
    definition = StudyDefinition(
        name="t", trainer="autotune_test_trainers:tiny", measure=QUICK, seed=0
    )
    events, traced = [], {}
    trace = tmp_path / "limit" / "baseline.trace.json"
    record = revalidate(
        study=study,
        definition=definition,
        plan=(1, 2),  # one candidate, two interleaved rounds
        measure=RayMeasurer(study=study, runners=[runner], definition=definition),
        emit=events.append,
        defaults=SearchSpace.load("default").resolve(TARGET).defaults(),
        trace=trace,
        traced=traced,
    )

    assert record is not None
    assert record.order == ["baseline", "trial 1", "trial 1", "baseline"]  # A B B A
    # the defaults' first run wrote their Chrome trace after its windows (rank 0, real DDP
    # steps), or its rank crashed in torch.profiler and it ran again untraced, said
    if traced:
        assert traced == {"baseline": trace}
        names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
        assert "gloo:all_reduce" in names and "autotune.step0" in names
    else:
        assert any(
            "that took the Chrome trace failed (crash: " in getattr(e, "text", "") for e in events
        )
    assert [len(v) for v in record.measurements.values()] == [2, 2]
    assert record.winner == "baseline" and record.beats_baseline is False
    assert record.reason == NO_WINNER_REASON
    assert load(study, ValidationRecord) == record  # stored, and read back the same
    assert isinstance(events[0], ValidationStarted) and events[0].runs == 4
    done = [e for e in events if isinstance(e, ValidationDone)]
    assert len(done) == 1 and done[0].speedup is not None
    assert (done[0].winner, done[0].beats_baseline, done[0].reason) == (
        "baseline",
        False,
        NO_WINNER_REASON,
    )
    sp = done[0].speedup
    assert (sp.low, sp.median, sp.high) == (1.0, 1.0, 1.0)

    # The job as it runs today: measured (two rounds beside the defaults, the winner here),
    # in rank processes that read glibc's allocator back as left dynamic, while the
    # defaults' processes, new ones too, read it back pinned. Had that job kept the pin (the
    # warm pool's processes, or a RankActor that pins regardless), `pinned` would say True.
    today = record.as_is
    assert today is not None and today.reason == "", today
    assert sorted(today.order) == sorted([TODAY, TODAY, "baseline", "baseline"])
    assert [len(today.measurements[k]) for k in (TODAY, "baseline")] == [2, 2]
    assert today.pinned == {TODAY: False, "baseline": True}
    assert today.pin is not None and today.pin.n == 2 and today.changes == ["the allocator pin"]
    assert today.today == today.pin  # the defaults won: the job today is set against them
    line = today.line(None)  # two rounds: a figure only if its interval is within +-25 %
    assert line == (
        f"{speedup_text(today.pin.interval())} your job as it runs today, from the allocator pin"
        if precise(today.pin.interval())
        else f"your job as it runs today: {speedup_text(today.pin.interval())}"
    )
    assert Note(line) in events

    profile = Profile.load(export_profile(study, tmp_path / "p.yaml"))
    assert profile.study["best_trial"] == 0  # the defaults, not the search's 10x trial
    assert profile.batch["micro_batch"] == 16
    assert profile.measured["note"] == NO_WINNER_REASON
    assert profile.measured["speedup"] == 1.0
    res = profile.measured["validation"]["results"]
    assert res["trial 1"]["speedup"][1] < 1.0  # re-measured slower than the defaults
    assert res["trial 1"]["beats_baseline"] is False
    assert profile.measured["as_is"]["line"] == line
    assert profile.measured["as_is"]["pinned"] == {TODAY: False, "baseline": True}


def test_a_failed_run_of_the_defaults_keeps_the_rounds_measured_before_it(runner, tmp_path):
    """The defaults' run in the third of four rounds fails (its ranks raise in a step, on the
    session kept from its last run, in real 2-rank gloo trials): the two whole rounds before
    it stand, said in one line, where a run of the defaults that timed out once abandoned a
    whole re-validation."""
    flag = tmp_path / "fail"
    study = _study(trial_1=1100.0)
    definition = StudyDefinition(
        name="t",
        trainer="autotune_test_trainers:failing_when",
        trainer_options={"flag": str(flag)},
        measure=QUICK,
        seed=0,
    )
    events = []

    def emit(event):
        events.append(event)
        measured = [e for e in events if isinstance(e, ValidationRun) and e.failure is None]
        if len(measured) == 4:  # two whole rounds: every run from now on fails
            flag.touch()

    record = revalidate(
        study=study,
        definition=definition,
        plan=(1, 4),
        measure=RayMeasurer(study=study, runners=[runner], definition=definition),
        emit=emit,
        defaults=SearchSpace.load("default").resolve(TARGET).defaults(),
    )

    assert record is not None  # not abandoned
    assert record.order == interleave(["baseline", "trial 1"], 2)
    assert [len(v) for v in record.measurements.values()] == [2, 2]
    failures = [e.failure for e in events if isinstance(e, ValidationRun) and e.failure]
    assert failures[0].startswith("crash") and "flag file" in failures[0]
    (stood,) = [e.text for e in events if isinstance(e, Note) and "before it stand" in e.text]
    assert stood.startswith("baseline: its run in round 3 failed (crash")
    assert stood.endswith("the 2 rounds measured before it stand")
    assert load(study, ValidationRecord) == record


def _study(trial_1: float) -> optuna.Study:
    """A study of the baseline (micro-batch 16, 1000 samples/s) and trial 1 (micro-batch 4, in
    truth slower: 4 micro-steps a step) read at ``trial_1`` samples/s by the search."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(ATTR, {"workload": WORKLOAD, "hardware": HARDWARE, "left_out": []})
    dist = {"micro_batch": CategoricalDistribution([4, 16])}
    for micro, value, baseline in ((16, 1000.0, True), (4, trial_1, False)):
        study.add_trial(
            create_trial(
                params={"micro_batch": micro},
                distributions=dist,
                value=value,
                user_attrs={"baseline": baseline, "config": config(micro_batch=micro).to_dict()},
            )
        )
    return study
