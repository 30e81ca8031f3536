"""``--log-to``: real Optuna trials recorded the way autotune records them (a COMPLETE baseline
and trial with their throughput intervals, a FAIL trial with its reason, a PRUNED trial), fed
through the event sink as the search feeds it, written by the real tracker libraries (MLflow's
SQLite store, W&B in offline mode, TensorBoard event files) and read back from their files."""

from __future__ import annotations

import glob
import json
import struct
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
import pytest

from autotune.core.errors import ConfigError, FailureReason, TrialFailed
from autotune.core.events import Note, Outcome, TrialFinished
from autotune.definition.studydef import StudyDefinition
from autotune.record import trial as tr
from autotune.record.attrs import IntervalRecord
from autotune.report import trackers
from autotune.report.tracker_clients import TrialRecord
from autotune.report.trackers import Trackers
from tests.unit.test_config_and_profile import make_profile

STUDY = "quick-mlp-gloo-2r"
#: Per trial: params, and (state, throughput, interval low, high, speedup) or a failure.
PLAN = [
    (
        {"bucket_cap_mb": 25, "static_graph": False, "precision": "fp32"},
        ("COMPLETE", 100.0, 98.0, 102.0, 1.0),
    ),
    (
        {"bucket_cap_mb": 50, "static_graph": True, "precision": "bf16"},
        ("COMPLETE", 121.0, 118.0, 124.0, 1.21),
    ),
    (
        {"bucket_cap_mb": 5, "static_graph": True, "precision": "fp16"},
        ("FAIL", "timeout", "no result within 60 s"),
    ),
    (
        {"bucket_cap_mb": 100, "static_graph": False, "precision": "fp32"},
        ("PRUNED", 80.0, 70.0, 85.0, 0.8),
    ),
]


def measurement(value: float, low: float, high: float, speedup: float) -> tr.Measurement:
    return tr.Measurement(
        throughput=value,
        interval=IntervalRecord(
            median=value, low=low, high=high, n=4, rel_half_width=(high - low) / 2 / value
        ),
        windows=[value] * 4,
        stop="converged",
        warmup_steps=3,
        step_time_s=0.01,
        peak_memory_mb=[10.0, 10.0],
        steps=40,
        window_s=1.0,
        wall_s=5.0,
        overhead_s=1.0,
        warmup_s=0.5,
        init_s=0.4,
        loss=0.1,
        speedup=speedup,
    )


def planned() -> optuna.Study:
    """A study with PLAN's trials queued, the first marked the baseline."""
    study = optuna.create_study(study_name=STUDY, direction="maximize")
    for i, (params, _) in enumerate(PLAN):
        tr.enqueue(study, params, **({"baseline": True} if i == 0 else {}))
    return study


def searched(sink: Trackers, study: optuna.Study | None = None) -> optuna.Study:
    """PLAN's trials of ``study``, each trial's end said to ``sink`` before Optuna tells it,
    as the search's objective does."""
    study = study or planned()

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_int("bucket_cap_mb", 1, 100)
        trial.suggest_categorical("static_graph", [False, True])
        trial.suggest_categorical("precision", ["fp32", "bf16", "fp16"])
        state, *figures = PLAN[trial.number][1]
        said = {
            "tag": f"trial {trial.number}",
            "number": trial.number,
            "elapsed_s": 1.0,
            "changes": {},
        }
        if state == "FAIL":
            failure = TrialFailed(FailureReason(figures[0]), figures[1])
            tr.save_failure(trial, failure)
            sink(TrialFinished(**said, outcome=Outcome.FAILED, reason=figures[0]))
            raise failure
        tr.save_measurement(trial, measurement(*figures))
        outcome = Outcome.PRUNED if state == "PRUNED" else Outcome.COMPLETE
        sink(TrialFinished(**said, outcome=outcome, throughput=figures[0]))
        if state == "PRUNED":
            raise optuna.TrialPruned()
        return figures[0]

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(objective, n_trials=len(PLAN), catch=(TrialFailed,))
    return study


@dataclass
class Summary:
    """What ``tuner.RunSummary`` holds that the result is made of."""

    study_name: str
    profile_path: Path | None
    trials: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None
    interrupted: bool = False


def exported(tmp_path: Path) -> Path:
    """A profile as the run exports it: re-validated at 1.21x (95 % 1.15-1.27x), trial 1."""
    p = make_profile()
    p.study.update(name=STUDY, best_trial=1)
    p.measured.update(
        speedup=1.21,
        speedup_interval=[1.15, 1.27],
        best_samples_per_s=121.0,
        validation={"rounds": 3},
    )
    return p.save(tmp_path / "profiles" / f"{STUDY}.yaml")


def tracked(names: list[str], tmp_path: Path, exports: bool = True) -> tuple[list, Path]:
    """Run PLAN through ``--log-to names`` and end the run as the tuner does (``exports``:
    the run gets to its export, which fills the summary); the events the run's own display
    got, and the run directory."""
    seen: list = []
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    study = planned()
    summary = Summary(STUDY, None)
    sink = Trackers(seen.append, names)
    sink.open(study, run_dir, StudyDefinition.load("quick"), summary)
    searched(sink, study)
    assert study.get_trials()[2].state == optuna.trial.TrialState.FAIL
    if exports:
        summary.trials = {"complete": 2, "failed": 1, "pruned": 1, "total": 4}
        summary.profile_path = exported(tmp_path)
    sink.close()
    return seen, run_dir


def notes(seen: list) -> list[str]:
    return [e.text for e in seen if isinstance(e, Note)]


# -- what is checked before anything starts ----------------------------------------------------


def test_check_accepts_each_installed_tracker_repeated_or_comma_separated():
    trackers.check(["mlflow,tensorboard", "wandb", "mlflow"])
    assert trackers.names(["mlflow,tensorboard", " WandB ", "mlflow"]) == [
        "mlflow",
        "tensorboard",
        "wandb",
    ]


@pytest.mark.parametrize(
    ("name", "module", "message"),
    [
        ("mlflow", "mlflow", "--log-to mlflow needs mlflow: pip install mlflow-skinny"),
        ("wandb", "wandb", "--log-to wandb needs wandb: pip install wandb"),
        (
            "tensorboard",
            "tensorboard",
            "--log-to tensorboard needs tensorboard: pip install tensorboard",
        ),
    ],
)
def test_a_tracker_whose_library_is_missing_is_a_one_line_error(monkeypatch, name, module, message):
    monkeypatch.setitem(sys.modules, module, None)  # what the import system says of a missing one
    with pytest.raises(ConfigError) as e:
        trackers.check([name])
    assert str(e.value) == message


def test_an_unknown_tracker_is_a_one_line_error_naming_the_known_ones():
    with pytest.raises(ConfigError) as e:
        trackers.check(["comet"])
    assert str(e.value) == "--log-to comet: not a tracker; choose from mlflow, tensorboard, wandb"


# -- what a trial's record holds ---------------------------------------------------------------


def test_a_trial_record_holds_params_throughput_interval_state_and_reason():
    study = searched(Trackers(lambda e: None))
    base, best, failed, pruned = (TrialRecord.of(t) for t in study.get_trials())
    assert best.params == {"bucket_cap_mb": 50, "static_graph": True, "precision": "bf16"}
    assert best.state == "COMPLETE" and best.reason == "" and not best.baseline
    assert best.metrics["throughput"] == 121.0 and best.metrics["speedup"] == 1.21
    assert (best.metrics["interval_low"], best.metrics["interval_high"]) == (118.0, 124.0)
    assert base.baseline and base.metrics["speedup"] == 1.0
    assert failed.state == "FAIL" and "throughput" not in failed.metrics
    assert (failed.reason, failed.detail) == ("timeout", "no result within 60 s")
    assert failed.line() == "FAIL timeout: no result within 60 s"
    assert pruned.state == "PRUNED" and pruned.metrics["interval_high"] == 85.0


# -- each tracker, read back from its own files ------------------------------------------------


def test_mlflow_holds_a_run_per_trial_under_the_runs_parent_with_its_result(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    seen, run_dir = tracked(["mlflow"], tmp_path)
    assert (run_dir / "mlflow.db").is_file()  # the default store is the run directory's
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags["autotune.kind"] == "run")
    trials = {int(r.data.tags["trial"]): r for r in runs if r.data.tags["autotune.kind"] == "trial"}
    assert sorted(trials) == [0, 1, 2, 3]
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials.values())
    best = trials[1].data
    assert best.params == {"bucket_cap_mb": "50", "static_graph": "True", "precision": "bf16"}
    assert best.metrics["throughput"] == 121.0 and best.metrics["speedup"] == 1.21
    assert (best.metrics["interval_low"], best.metrics["interval_high"]) == (118.0, 124.0)
    assert best.tags["state"] == "COMPLETE" and trials[1].info.status == "FINISHED"
    failed = trials[2]
    assert failed.info.status == "FAILED" and failed.data.tags["state"] == "FAIL"
    assert failed.data.tags["reason"] == "timeout"
    assert failed.data.tags["reason_detail"] == "no result within 60 s"
    assert "throughput" not in failed.data.metrics and failed.data.params["precision"] == "fp16"
    assert trials[3].data.tags["state"] == "PRUNED" and trials[0].data.tags["baseline"] == "true"
    # the run: the definition as params, the result as metrics and tags, the profile attached
    p = parent.data
    assert p.params["budget_s"] == str(StudyDefinition.load("quick").budget_s)
    assert [p.metrics[k] for k in ("speedup", "speedup_low", "speedup_high")] == [1.21, 1.15, 1.27]
    assert p.metrics["trials_failed"] == 1.0 and p.tags["best_trial"] == "1"
    assert p.tags["profile"].endswith(f"{STUDY}.yaml") and "1.21x" in p.tags["result"]
    assert parent.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == [f"{STUDY}.yaml"]
    assert client.get_metric_history(parent.info.run_id, "trial_throughput")[1].step == 1
    assert any(n.startswith("Logging each trial to MLflow: experiment") for n in notes(seen))


def test_mlflow_takes_the_tracking_uri_and_experiment_from_its_environment(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-runs")
    _, run_dir = tracked(["mlflow"], tmp_path, exports=False)
    assert not (run_dir / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("team-runs")
    assert exp.artifact_location == (run_dir / "mlruns").as_uri()  # not the working directory
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 5
    # a run that never got to its export: no result, and its MLflow run is FAILED
    (parent,) = [r for r in runs if r.data.tags["autotune.kind"] == "run"]
    assert parent.info.status == "FAILED" and "speedup" not in parent.data.metrics


def wandb_records(run_dir: Path) -> list:
    """The records of the offline run's ``.wandb`` file: a LevelDB-style log (32 KiB blocks of
    7-byte-headed chunks) of protobuf ``Record`` messages, read with W&B's own definitions."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "*.wandb"))
    data, pos, chunk, out = Path(path).read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            out.append(pb.Record.FromString(chunk))
            chunk = b""
    return out


def test_wandb_offline_holds_a_row_per_trial_a_trials_table_and_the_result(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    seen, run_dir = tracked(["wandb"], tmp_path)
    records = wandb_records(run_dir)  # the run directory holds the offline run
    rows = [
        {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    trials = {row["trial"]: row for row in rows if "trial" in row}
    assert sorted(trials) == [0, 1, 2, 3]
    assert trials[1]["throughput"] == 121.0 and trials[1]["interval_low"] == 118.0
    assert trials[1]["interval_high"] == 124.0 and trials[1]["state"] == "COMPLETE"
    assert trials[1]["params/precision"] == "bf16" and trials[1]["params/bucket_cap_mb"] == 50
    assert trials[2]["state"] == "FAIL" and trials[2]["reason"] == "timeout"
    assert trials[2]["reason_detail"] == "no result within 60 s" and "throughput" not in trials[2]
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for u in r.summary.update:
                summary["/".join(u.nested_key) or u.key] = json.loads(u.value_json)
    assert summary["result/speedup"] == 1.21 and summary["result/speedup_low"] == 1.15
    assert summary["result/profile"].endswith(f"{STUDY}.yaml")
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["budget_s"] == StudyDefinition.load("quick").budget_s
    assert (run.display_name, run.run_group) == (STUDY, STUDY)
    files = run_dir / "wandb" / "offline-run-*" / "files"
    (table,) = glob.glob(str(files / "media" / "table" / "trials_*.table.json"))
    t = json.loads(Path(table).read_text())
    by = {row[0]: dict(zip(t["columns"], row, strict=True)) for row in t["data"]}
    assert (
        sorted(by) == [0, 1, 2, 3] and by[2]["reason"] == "timeout" and by[3]["state"] == "PRUNED"
    )
    assert json.loads(by[1]["params"])["static_graph"] is True
    assert any("offline run in" in n for n in notes(seen))


def test_tensorboard_holds_scalars_a_text_and_hparams_per_trial_and_the_result(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    seen, run_dir = tracked(["tensorboard"], tmp_path)
    logdir = run_dir / "tensorboard" / STUDY
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    scalar = {
        k: {e.step: e.value for e in acc.Scalars(f"trial/{k}")}
        for k in ("throughput", "interval_low", "interval_high")
    }
    assert scalar["throughput"] == {0: 100.0, 1: 121.0, 3: 80.0}  # the FAIL trial has none
    assert (scalar["interval_low"][1], scalar["interval_high"][1]) == (118.0, 124.0)
    texts = {
        e.step: e.tensor_proto.string_val[0].decode()
        for e in acc.Tensors("trial/record/text_summary")
    }
    assert sorted(texts) == [0, 1, 2, 3]
    assert texts[2].startswith("trial 2: FAIL timeout: no result within 60 s")
    assert "precision=fp16" in texts[2] and texts[3].startswith("trial 3: PRUNED 80.0")
    assert acc.Scalars("run/speedup")[0].value == pytest.approx(1.21)
    assert "1.21x" in acc.Tensors("run/result/text_summary")[0].tensor_proto.string_val[0].decode()
    hp = EventAccumulator(str(logdir / "trial-2"))
    hp.Reload()
    content = hp.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["state"].string_value == "FAIL"
    assert start.hparams["reason"].string_value == "timeout"
    assert start.hparams["bucket_cap_mb"].number_value == 5
    shown = f"tensorboard --logdir {logdir.parent} --samples_per_plugin text=0"
    assert any(shown in n for n in notes(seen))


# -- a tracker never stops the run -------------------------------------------------------------


class FullDisk:
    """A tracker client whose writes fail as a full disk's do."""

    where = "a full disk"
    calls = 0

    def trial(self, rec):
        self.calls += 1
        raise OSError(28, "No space left on device")

    def result(self, res):
        self.calls += 1

    def close(self, status):
        self.calls += 1


def test_a_failing_tracker_is_said_once_and_left_out_while_the_others_go_on(tmp_path):
    seen: list = []
    study = planned()
    sink = Trackers(seen.append, ["tensorboard"])
    full = sink.clients["mlflow"] = FullDisk()  # opened first, as --log-to mlflow,tensorboard
    sink.open(study, tmp_path, {})
    searched(sink, study)
    sink.close()
    said = [n for n in notes(seen) if "--log-to mlflow" in n]
    assert said == [
        "--log-to mlflow: MLflow failed (OSError: [Errno 28] No space left on device); nothing "
        "more is logged to it, the run goes on"
    ]
    assert full.calls == 1  # left out after its first failure
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(tmp_path / "tensorboard" / STUDY))
    tb.Reload()
    assert len(tb.Tensors("trial/record/text_summary")) == 4
    # every event still reached the run's own display
    assert sum(isinstance(e, TrialFinished) for e in seen) == 4


def test_a_tracker_that_cannot_be_opened_is_said_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "unknown-scheme://nowhere")
    seen: list = []
    sink = Trackers(seen.append, ["mlflow"]).open(planned(), tmp_path, {})
    assert sink.clients == {}
    (line,) = notes(seen)
    assert (
        line.startswith("--log-to mlflow: MLflow could not be opened (") and "run goes on" in line
    )
    sink(Note("a later event"))  # still passed on, nothing else started
    assert seen[-1] == Note("a later event")
    sink.close()


def test_without_trackers_the_sink_only_passes_events_on(tmp_path):
    seen: list = []
    sink = Trackers(seen.append).open(planned(), tmp_path, {})
    event = replace(
        TrialFinished(tag="t", number=0, outcome=Outcome.FAILED, elapsed_s=0.0, changes={}),
        reason="crash",
    )
    sink(event)
    sink.finish(Summary(STUDY, None, {"complete": 1}))
    sink.close()
    assert seen == [event] and list(tmp_path.iterdir()) == []


# -- the command ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--log-to", "tensorboard,mlflow"],
            "--log-to mlflow needs mlflow: pip install mlflow-skinny",
        ),
        (
            ["--log-to", "comet"],
            "--log-to comet: not a tracker; choose from mlflow, tensorboard, wandb",
        ),
    ],
)
def test_autotune_run_refuses_a_tracker_it_cannot_log_to_before_anything_starts(
    cli, tmp_path, monkeypatch, flags, line
):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not installed
    ran = cli("run", "--study", "quick", *flags)  # Ray's start would fail the test
    assert ran.returncode == 2
    assert ran.stderr.splitlines() == [f"autotune: error: {line}"]
    assert not (tmp_path / "home").exists()
