"""Fixtures and helpers of the tests that drive TrialRunner directly."""

from __future__ import annotations

import os
import subprocess

import pytest

from autotune.config import MeasureSettings, TrialConfig
from autotune.knobs import Target
from autotune.launcher import TrialRunner
from autotune.space import SearchSpace
from tests.conftest import autotune_cmd

TARGET = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=32, cpus_per_rank=1, bf16=True
)
QUICK = MeasureSettings(settle_window=2, window_s=0.3, min_windows=2, max_windows=3)


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
