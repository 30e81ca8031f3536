"""The record layer (``autotune.record``): every study-level record goes onto a real Optuna
study and comes back equal; a record that is not what autotune writes is refused in one line
naming the attribute and the field; a trial's accessors read a value of the wrong type as
absent; and the records a whole replayed run writes all read back."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from autotune.core.errors import ConfigError
from autotune.core.stats import Interval
from autotune.record import trial as tr
from autotune.record.attrs import (
    ATTRS,
    AblationRecord,
    ArmRecord,
    Contribution,
    FirstMeasurement,
    IntervalRecord,
    JointCheck,
    LimitRecord,
    RunRecord,
    ScreenEffect,
    StopRecord,
    ValidationRecord,
    load,
    load_screening,
    save,
    save_screening,
)
from autotune.record.typed import MAX_TEXT, RecordError, read, write

ONE = IntervalRecord(median=1.0, low=0.9, high=1.1, n=4, rel_half_width=0.1)
OPEN = IntervalRecord(median=2.0, low=None, high=None, n=1)  # one window: unbounded
ARM = ArmRecord(throughput=ONE, speedup=ONE, beats_baseline=False)

RECORDS = [
    RunRecord(
        workload={"trainer": "mlp", "global_batch": 64},
        hardware={"device": "cpu"},
        space={"ddp": {}},
        left_out=["NCCL_ALGO: gloo"],
    ),
    FirstMeasurement(evidence={"step_s": 0.1}, probe={"bounds": {"comm_share": 0.5}}),
    StopRecord(kind="converged", why="converged: ...", at_s=61.234, budget_s=600.0, kept_s=30),
    ValidationRecord(
        winner="trial 3",
        speedup=ONE,
        beats_baseline=True,
        results={"baseline": ARM, "trial 3": dataclasses.replace(ARM, beats_baseline=True)},
        reason="trial 3: 1.1x",
        trials={"baseline": 0, "trial 3": 3},
        order=["baseline", "trial 3", "trial 3", "baseline"],
        measurements={"baseline": [10.0, 10.5], "trial 3": [11.0, 11.5]},
        failed={"trial 7": "crash: rank 1 died"},
        timed_s=12.5,
        after_trial=9,
    ),
    AblationRecord(
        trial=3,
        rounds=2,
        order=["winner", "without precision"],
        measurements={"winner": [11.0], "without precision": [10.0]},
        contributions={
            "precision": Contribution(value="bf16", kept=True, speedup=[1.05, 1.1, 1.15]),
            "num_workers": Contribution(value=2, kept=True, why="cannot be removed alone: x"),
        },
        dropped=[],
        together=False,
        joint=JointCheck(knobs=["a", "b"], kept_back=True, why="no budget left", rounds=1),
        params={"precision": "bf16"},
        config={"precision": "bf16"},
        timed_s=4.0,
    ),
    LimitRecord(baseline={"trial": 0, "bounds": {}}, cost_s=7.5),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_comes_back_from_a_real_study_as_it_went_in(record, tmp_path):
    # a real RDB storage: what comes back went through JSON
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'r.db'}")
    assert load(study, type(record)) is None  # not written yet
    save(study, record)
    again = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{tmp_path / 'r.db'}")
    assert load(again, type(record)) == record
    assert ATTRS[type(record)] in again.user_attrs  # under the attribute earlier releases used


def test_the_screening_record_is_a_mapping_of_effects_and_comes_back():
    study = optuna.create_study()
    effect = ScreenEffect(
        label="bf16",
        trial=2,
        state="COMPLETE",
        speedup=1.2,
        interval=ONE,
        helps=True,
        moves={"precision": "bf16"},
    )
    effects = {"bf16": effect}
    assert load_screening(study) is None  # the screening is still open
    save_screening(study, effects)
    assert load_screening(study) == effects


def test_an_optional_field_left_empty_is_not_stored_and_an_older_record_reads():
    stored = write(LimitRecord(baseline={"trial": 0}))
    assert stored == {"baseline": {"trial": 0}}  # no "tuned": null, as earlier releases wrote
    # a record written before a field existed reads with its default; a newer key is ignored
    old = {"kind": "budget", "why": "x", "at_s": 1, "budget_s": 2, "from_the_future": [1]}
    assert read(StopRecord, old, "stop") == StopRecord(
        kind="budget", why="x", at_s=1.0, budget_s=2.0
    )


@pytest.mark.parametrize(
    "record, raw, says",
    [
        (StopRecord, "not a record", r"^study record stop: expected a mapping, found str"),
        (
            StopRecord,
            {"kind": "budget", "why": 3, "at_s": 1, "budget_s": 2},
            r"^study record stop\.why: expected text",
        ),
        (
            StopRecord,
            {"kind": "budget", "why": "x", "at_s": math.inf, "budget_s": 2},
            r"^study record stop\.at_s: expected a finite number",
        ),
        (
            StopRecord,
            {"kind": "budget", "why": "x", "at_s": True, "budget_s": 2},
            r"^study record stop\.at_s: expected a finite number, found bool",
        ),
        (
            StopRecord,
            {"kind": "rm -rf", "why": "x", "at_s": 1, "budget_s": 2},
            r"^stop record: kind 'rm -rf' is not one of",
        ),
        (
            StopRecord,
            {"kind": "budget", "why": "x" * (MAX_TEXT + 1), "at_s": 1, "budget_s": 2},
            r"^study record stop\.why: expected text of at most",
        ),
        (
            ValidationRecord,
            {**write(RECORDS[3]), "winner": "trial 99"},
            r"^study record validation: 'trial 99' has no result or trial",
        ),
        (
            ValidationRecord,
            {**write(RECORDS[3]), "trials": {"baseline": "0", "trial 3": 3}},
            r"^study record validation\.trials\.baseline: expected a whole number, found str",
        ),
        (
            AblationRecord,
            {**write(RECORDS[4]), "contributions": {"x": {"kept": "yes"}}},
            r"^study record ablation\.contributions\.x: field value is missing",
        ),
        (RunRecord, {"workload": [1, 2]}, r"^study record autotune\.workload: expected a mapping"),
    ],
    ids=lambda x: x if isinstance(x, str) and len(x) < 30 else None,
)
def test_a_record_that_is_not_what_autotune_writes_is_refused_in_one_line(record, raw, says):
    study = optuna.create_study()
    study.set_user_attr(ATTRS[record], raw)
    with pytest.raises(RecordError, match=says) as e:
        load(study, record)
    assert isinstance(e.value, ConfigError) and "\n" not in str(e.value)  # exit 2, one line


def test_a_trials_accessors_read_a_value_of_the_wrong_type_as_absent():
    study = optuna.create_study()
    study.enqueue_trial(
        {},
        user_attrs={
            "baseline": "yes",
            "screen": 3,
            "speedup": True,
            "interval": {"median": "1"},
            "logs": ["x"],
            "fp32_drift": "inf",
            "reason": None,
        },
    )
    t = study.ask()
    assert tr.is_baseline(t) is False and tr.screen_label(t) is None
    assert tr.speedup(t) is None and tr.interval(t) is None and tr.logs(t) == ""
    assert tr.fp32_drift(t) == math.inf  # the one text it stores for a number
    assert tr.reason(t) == "unknown" and tr.rel_noise(t) == 0.0
    with pytest.raises(RecordError, match=r"^study record trial 0: no configuration stored"):
        tr.config(t)


def test_marks_are_checked_when_a_trial_is_queued():
    study = optuna.create_study()
    tr.enqueue(study, {}, baseline=True, anchor="drift")
    t = study.ask()
    assert tr.is_baseline(t) and tr.anchor(t) == "drift"
    with pytest.raises(TypeError, match="trial mark"):
        tr.enqueue(study, {}, basline=True)  # a typo is not a silent new mark


def test_an_interval_record_is_the_interval_it_was_made_from():
    iv = Interval(median=100.0, low=95.0, high=104.0, n=5)
    rec = read(IntervalRecord, iv.to_dict(), "interval")
    assert rec.interval() == iv
    assert OPEN.interval().rel_half_width == math.inf  # unbounded sides come back infinite


def test_every_record_a_replayed_run_writes_reads_back():
    from autotune.replay.simulate import replay
    from tests.unit.test_search_design import TWO_HELP, landscape  # a run that finds something

    r = replay(landscape(TWO_HELP), seed=0, n_trials=15, budget_s=900)
    s = r.study
    assert load(s, RunRecord) is not None and load(s, ValidationRecord) is not None
    assert load(s, StopRecord) is not None and load_screening(s)
    for t in s.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        m = tr.measurement(t)
        assert m is not None and m.throughput == pytest.approx(t.values[0], rel=1e-3)
        assert tr.config(t).to_dict() == tr.config_dict(t)


def test_a_knob_kept_back_with_others_is_not_said_to_gain_2_percent():
    """A real 10-minute run: the joint check of static_graph and compile had no budget left,
    so both went back in; static_graph's line read "0.996x [0.953, 1.042] ... kept: a gain of
    2% or more", a gain its own figure does not show. It now says why it is kept."""
    from autotune.core.events import Note
    from autotune.search.ablation import _say

    record = AblationRecord(
        trial=13,
        rounds=8,
        order=[],
        measurements={},
        contributions={
            "static_graph": Contribution(value=True, kept=True, speedup=[0.953, 0.996, 1.042]),
            "bucket_cap_mb": Contribution(value=2.6, kept=True, speedup=[0.987, 1.025, 1.065]),
            "precision": Contribution(value="bf16", kept=True, speedup=[1.117, 1.177, 1.24]),
        },
        dropped=[],
        together=False,
        joint=JointCheck(
            knobs=["static_graph"], kept_back=True, why="not measured together: kept", rounds=1
        ),
        params={},
        config={},
    )
    said: list[str] = []
    _say(record, lambda e: said.append(e.text) if isinstance(e, Note) else None)
    assert said[0].endswith(
        "0.996x [0.953, 1.042] itself without it - kept with the knobs checked together (below)"
    )
    assert said[1].endswith("kept: a gain of 2% or more, not yet beyond the noise")
    assert said[2].endswith("1.177x [1.117, 1.240] itself without it - kept")
    assert said[3] == "  without static_graph at once: not measured together: kept"
