"""Concurrent trials on a real Ray cluster: each trial in its own placement group, the
baseline first and alone, trials overlapping in time, none left RUNNING; and a number of
concurrent trials the cluster cannot hold is refused before anything is written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import autotune_cmd
from tests.integration.conftest import as_stored, defaults_before, runs_of_the_defaults
from tests.integration.raycluster import ray_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def four_cpus():
    """One Ray node offering 4 CPUs: room for two 2-rank trials of 1 CPU per rank."""
    with ray_cluster([4]) as cluster:
        yield cluster


def test_two_trials_run_at_once_after_the_baseline(four_cpus, run_env):
    env = {**run_env, **four_cpus["env"]}
    p = subprocess.run(
        # a trial count, not a 35-second budget: the baseline alone, then five trials two at
        # a time, however loaded the machine
        autotune_cmd(
            "run",
            "--study",
            "quick",
            "--budget",
            "5m",
            "--n-trials",
            "6",
            "--address",
            four_cpus["address"],
            "--concurrent-trials",
            "2",
            "--validate-top",
            "0",
            "--no-limit",  # trials at once are checked, not the limit probe
            "--quiet",
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Measuring 2 trials at once, each in its own placement group" in out
    home = Path(run_env["AUTOTUNE_HOME"])
    study = optuna.load_study(
        study_name="quick-mlp-gloo-2r", storage=f"sqlite:///{home / 'autotune.db'}"
    )
    trials = study.trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    base = trials[0]
    assert base.user_attrs["baseline"] and base.state == TrialState.COMPLETE
    others = trials[1:]
    assert len(others) >= 3, out
    # The baseline ran alone: every other trial started after it ended.
    assert all(t.datetime_start >= base.datetime_complete for t in others)
    # Two trials were in flight together at least once.
    spans = sorted((t.datetime_start, t.datetime_complete) for t in others)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)), spans
    # Every measured trial's speedup is against a run of the defaults before it: the baseline,
    # or a re-anchoring run (the latest done when the trial started).
    runs_of_the_defaults(trials)
    for t in others:
        if "throughput" in t.user_attrs and not t.user_attrs.get("baseline"):
            ratios = [t.user_attrs["throughput"] / v for v in defaults_before(trials, t.number)]
            assert any(as_stored(r) == t.user_attrs["speedup"] for r in ratios), (t.number, ratios)
    for t in trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs.get("reason"), t.number


def test_more_concurrent_trials_than_the_cluster_holds_is_refused(four_cpus, run_env):
    env = {**run_env, **four_cpus["env"]}
    p = subprocess.run(
        autotune_cmd(
            "run",
            "--study",
            "quick",
            "--budget",
            "30s",
            "--address",
            four_cpus["address"],
            "--concurrent-trials",
            "3",
            "--quiet",
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("autotune: error: --concurrent-trials 3: the Ray cluster holds 2")
    assert not Path(run_env["AUTOTUNE_HOME"]).exists()  # nothing half-written
