"""`autotune run --objective throughput,memory` end to end: a real two-objective Optuna study
of real 2-rank trials, its Pareto set in the exported profile, another front member exported
by hand."""

from __future__ import annotations

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.integration.conftest import autotune

pytestmark = pytest.mark.integration


def test_a_throughput_and_memory_study_exports_its_pareto_set(ray_address, run_env, tmp_path):
    # five trials, not a 30-second budget (a multi-objective study re-validates nothing: its
    # profile is chosen from the Pareto front)
    p = autotune(
        run_env,
        "run",
        "--study",
        "quick",
        "--objective",
        "throughput,memory",
        "--budget",
        "5m",
        "--n-trials",
        "5",
        "--no-limit",  # the two objectives and the Pareto set are checked, not the limit probe
        "--address",
        ray_address,
    )
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'autotune.db'}"
    study = optuna.load_study(study_name="quick-mlp-gloo-2r", storage=url)
    assert study.directions == [
        optuna.study.StudyDirection.MAXIMIZE,
        optuna.study.StudyDirection.MINIMIZE,
    ]
    assert study.metric_names == ["samples_per_s", "peak_memory_mb"]
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= 2 and not [t for t in study.trials if t.state == TrialState.PRUNED]
    for t in complete:  # the second objective is the largest peak memory of the two ranks
        assert t.values[1] == max(t.user_attrs["peak_memory_mb"]) > 0
    profile = yaml.safe_load((home / "profiles" / "quick-mlp-gloo-2r.yaml").read_text())
    front = {t.number for t in study.best_trials}
    listed = [e["trial"] for e in profile["measured"]["pareto"]]
    assert set(listed) == front
    chosen = profile["study"]["best_trial"]
    assert chosen in front and "Pareto front" in profile["measured"]["note"]
    base = study.trials[0]
    lean = [t for t in study.best_trials if t.values[1] <= base.values[1]]
    assert chosen == max(lean, key=lambda t: t.values[0]).number  # the stated rule
    assert "Pareto front of" in p.stdout and "peak MiB/rank" in p.stdout
    # another point of the front, by hand
    other = min(study.best_trials, key=lambda t: t.values[1]).number
    out = autotune(run_env, "export", "--study-name", "quick-mlp-gloo-2r", "--trial", str(other))
    assert yaml.safe_load(out.stdout)["study"]["best_trial"] == other
