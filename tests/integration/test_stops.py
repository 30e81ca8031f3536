"""Whatever stops a run, the best profile so far is exported, the reason is said, and the exit
code tells which (Ctrl-C and SIGTERM: tests/integration/test_run_cli.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.profile.profile import Profile
from autotune.record.storage import SQLITE_BUSY_TIMEOUT_S
from tests.conftest import started_run
from tests.integration.conftest import STUDY

pytestmark = [pytest.mark.integration, pytest.mark.waits]


def study_of(run_env):
    home = Path(run_env["AUTOTUNE_HOME"])
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{home / 'autotune.db'}")


def test_a_storage_that_fails_mid_run_stops_it_with_the_reason_and_the_profile(
    ray_address, run_env
):
    p = started_run(
        run_env, "--study", "quick", "--budget", "5m", "--address", ray_address, after_trials=2
    )
    db = Path(run_env["AUTOTUNE_HOME"]) / "autotune.db"
    try:
        # Another writer holds the database longer than the run's busy timeout: the run's next
        # write fails with "database is locked" (as a stuck NFS lock or a runaway tool would).
        lock = sqlite3.connect(db, timeout=60, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        time.sleep(SQLITE_BUSY_TIMEOUT_S + 8)
        lock.execute("ROLLBACK")
        lock.close()
        out = p.communicate(timeout=180)[0]
    finally:
        p.kill()
    assert p.returncode == 1, out
    assert "Stopped by an error: OperationalError" in out and "database is locked" in out
    profile = Profile.load(Path(run_env["AUTOTUNE_HOME"]) / "profiles" / f"{STUDY}.yaml")
    assert profile.study["baseline_trial"] == 0  # the best so far, exported after the error
    assert study_of(run_env).trials[0].state == TrialState.COMPLETE
