"""--objective throughput,memory: the Pareto front, the rule that picks the profile from it,
exporting another front member by hand, and what is refused (pure logic on in-memory studies)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import create_trial
from rich.console import Console

from autotune.core.errors import ConfigError
from autotune.definition.studydef import StudyDefinition
from autotune.profile.export import PARETO_RULE, pareto_choice, study_profile
from autotune.report.progress import summary_table
from tests.unit.test_report_and_progress import HARDWARE, WORKLOAD, config

DISTS = {
    "bucket_cap_mb": FloatDistribution(1, 200, log=True),
    "static_graph": CategoricalDistribution([False, True]),
}


def study_of(points):
    """points: (params, samples/s, peak MiB); the first is the baseline."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_metric_names(["samples_per_s", "peak_memory_mb"])
    study.set_user_attr("autotune", {"workload": WORKLOAD, "hardware": HARDWARE})
    for i, (params, tput, mem) in enumerate(points):
        attrs = {"config": config(params), "speedup": tput / points[0][1]}
        if i == 0:
            attrs["baseline"] = True
        study.add_trial(
            create_trial(params=params, distributions=DISTS, values=[tput, mem], user_attrs=attrs)
        )
    return study


BASE = ({"bucket_cap_mb": 25.0, "static_graph": False}, 500.0, 300.0)
FAST_BUT_HUNGRY = ({"bucket_cap_mb": 100.0, "static_graph": True}, 650.0, 420.0)
FAST_AND_LEAN = ({"bucket_cap_mb": 5.0, "static_graph": True}, 560.0, 290.0)
DOMINATED = ({"bucket_cap_mb": 50.0, "static_graph": False}, 520.0, 350.0)
LEANEST = ({"bucket_cap_mb": 2.0, "static_graph": False}, 450.0, 200.0)


def test_the_profile_is_the_fastest_front_member_within_the_defaults_memory():
    study = study_of([BASE, FAST_BUT_HUNGRY, FAST_AND_LEAN, DOMINATED, LEANEST])
    p = study_profile(study)
    assert p.study["best_trial"] == 2  # 560 samples/s at 290 MiB; 650 needs 420 > 300
    assert p.ddp["bucket_cap_mb"] == 5.0 and p.ddp["static_graph"] is True
    assert [e["trial"] for e in p.measured["pareto"]] == [4, 2, 1]  # slowest first
    assert p.measured["pareto"][-1] == {
        "trial": 1,
        "samples_per_s": 650.0,
        "peak_memory_mb": 420.0,
        "speedup": 1.3,
    }
    assert p.measured["baseline_peak_memory_mb"] == 300.0
    assert PARETO_RULE in p.measured["note"] and p.measured["validation"] is None
    assert p.measured["speedup"] == pytest.approx(1.12)
    p.to_yaml()  # the strict loader accepts it


def test_the_defaults_stay_when_everything_faster_needs_more_memory():
    # the baseline is on the front then (nothing both faster and leaner dominates it)
    study = study_of([BASE, FAST_BUT_HUNGRY, DOMINATED])
    assert study_profile(study).study["best_trial"] == 0
    # without a baseline to compare with, the fastest of the front
    front = study.best_trials
    assert pareto_choice(front, None).number == 1


def test_any_complete_trial_can_be_exported_by_hand():
    study = study_of([BASE, FAST_BUT_HUNGRY, FAST_AND_LEAN, LEANEST])
    p = study_profile(study, trial=3)
    assert p.study["best_trial"] == 3 and "chosen by hand" in p.measured["note"]
    with pytest.raises(ConfigError, match=r"--trial 9: not a COMPLETE trial .* pick one of 0, 1"):
        study_profile(study, trial=9)


def test_the_summary_shows_the_front_and_the_dominated_baseline():
    study = study_of([BASE, FAST_BUT_HUNGRY, FAST_AND_LEAN, DOMINATED])
    console = Console(record=True, width=140, force_terminal=False)
    console.print(summary_table(study))
    text = console.export_text()
    assert "Pareto front of 4 complete trials" in text and "peak MiB/rank" in text
    assert "0 (baseline, dominated)" in text and "420" in text
    assert "\n│     3 " not in text  # the dominated trial is not on the front


def test_objective_spellings_and_the_samplers_that_cannot_do_it(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("trainer: mlp\nobjective: [throughput, memory]\n")
    d = StudyDefinition.load(str(path))
    assert d.objective == "throughput,memory" and d.multi_objective
    path.write_text("trainer: mlp\nobjective: throughput, memory\nsampler: cmaes\n")
    with pytest.raises(ConfigError, match=r"s.yaml: sampler cmaes optimises one objective"):
        StudyDefinition.load(str(path))
    assert not StudyDefinition(name="t").multi_objective
