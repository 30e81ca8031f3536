"""Fixtures and helpers of the tests that drive TrialRunner directly."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.launch.launcher import TrialRunner
from tests.conftest import autotune_cmd

TARGET = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=32, cpus_per_rank=1, bf16=True
)
QUICK = MeasureSettings(window_s=0.3, min_windows=2, max_windows=3)


@pytest.fixture(scope="module")
def runner(ray_address):
    r = TrialRunner(world_size=2, backend="gloo")
    yield r
    r.close()


def config(**changes) -> TrialConfig:
    """The baseline configuration of the test target with ``changes``."""
    r = SearchSpace.load("default").resolve(TARGET)
    return TrialConfig.from_values({**r.defaults(), **changes}, TARGET)


BUDGET_S = 45
STUDY = "quick-mlp-gloo-2r"


def autotune(env, *args, cwd=None, rc=0, timeout=600):
    """Run the real `autotune` command and check its exit code."""
    p = subprocess.run(
        autotune_cmd(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert p.returncode == rc, p.stdout + p.stderr
    return p


@pytest.fixture(scope="session")
def finished_run(ray_address, tmp_path_factory):
    """One real `autotune run --study quick`, shared by every test that reads what a
    finished run leaves (study, profile, dashboard, report)."""
    home = tmp_path_factory.mktemp("run") / "home"
    env = {**os.environ, "AUTOTUNE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    p = autotune(
        env, "run", "--study", "quick", "--budget", f"{BUDGET_S}s", "--address", ray_address
    )
    url = f"sqlite:///{home / 'autotune.db'}"
    return {"env": env, "home": home, "url": url, "stdout": p.stdout, "address": ray_address}


def runs_of_the_defaults(trials) -> list[int]:
    """The numbers of the trials that ran the defaults: the first baseline, then the
    re-anchoring runs (each marked ``anchor``); asserts that shape."""
    marked = [t.number for t in trials if t.user_attrs.get("baseline")]
    assert marked and not trials[marked[0]].user_attrs.get("anchor"), marked
    assert all(trials[n].user_attrs.get("anchor") for n in marked[1:]), marked
    assert all(trials[n].params == trials[marked[0]].params for n in marked), marked
    return marked


def defaults_before(trials, number: int) -> list[float]:
    """The throughputs of the runs of the defaults that completed, numbered before ``number``
    (a trial's speedup is against one of them: with concurrent trials or several drivers, the
    latest one done when it started)."""
    return [
        s.user_attrs["throughput"]
        for s in trials
        if s.user_attrs.get("baseline") and s.state.name == "COMPLETE" and s.number < number
    ]


def as_stored(speedup: float):
    """``speedup`` as a trial records it: rounded to 4 decimals (``record.trial.Measurement``),
    so equal within 1e-4 however slow the trial. A bf16 step emulated on a CPU without bf16
    units runs at about 0.05x, where 4 decimals are 1e-3 of the figure: a relative tolerance
    alone failed there."""
    return pytest.approx(speedup, rel=1e-3, abs=1e-4)


def reference(trials, t) -> float:
    """The throughput a trial's speedup is taken against when trials run one at a time: the
    latest run of the defaults before it (for a run of the defaults itself, the first
    baseline)."""
    done = defaults_before(trials, t.number)
    return done[0] if t.user_attrs.get("baseline") else done[-1]


def trial_running(
    home: Path | str, study_name: str, number: int = 1, *, started: bool = True
) -> Callable[[], bool]:
    """For ``wait_for``: the study ``study_name`` in the SQLite database of run directory
    ``home`` has a trial numbered ``number`` or later RUNNING (after the baseline: a trial that
    runs its ranks now) and, with ``started``, that trial's ranks (or script) have begun it:
    their log files are in the trial's log directory, which each rank opens as it starts the
    trial. A trial that is only asked for may still run to its end after a Ctrl-C. Without
    ``started``, the driver's objective has taken the trial (it has recorded its driver)."""
    import optuna
    import sqlalchemy
    from optuna.trial import TrialState

    db = Path(home) / "autotune.db"
    logs = Path(home) / "logs" / study_name
    study: list[optuna.Study] = []

    def check() -> bool:
        if not study:
            if not db.exists():  # loading would create it
                return False
            try:
                study.append(optuna.load_study(study_name=study_name, storage=f"sqlite:///{db}"))
            except KeyError:  # not created yet
                return False
            except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError):
                # the run is creating the tables this moment: "table studies already exists",
                # or (seen in CI) both stamped the schema's version, "UNIQUE constraint
                # failed: alembic_version.version_num"; the next poll reads them
                return False
        trials = study[0].get_trials(deepcopy=False)
        if len(trials) <= number or trials[-1].state != TrialState.RUNNING:
            return False
        if not started:  # the driver's objective has it: its first write names the driver
            return bool(trials[-1].user_attrs.get("driver"))
        return any((logs / f"trial-{trials[-1].number}").glob("*.log"))

    return check
