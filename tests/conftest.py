"""Shared fixtures. Integration tests share one real Ray instance per session (``ray_address``);
CLI runs join it with ``--address`` so that no test pays for a second Ray start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
#: PYTHONPATH as the session found it; `autotune` subprocesses get this one, so a test trainer
#: is importable in the driver only when the test runs it from tests/ (cwd), as a user would.
ORIGINAL_PYTHONPATH = os.environ.get("PYTHONPATH")


@pytest.fixture(scope="session")
def ray_address():
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        # Rank processes import the test trainers from tests/: those of this process's jobs
        # through the runtime env, those of `autotune --address` drivers through the raylet's
        # environment, which every worker inherits.
        pythonpath = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
        os.environ["PYTHONPATH"] = pythonpath
        from autotune.core.compat import loopback_node_ip

        with loopback_node_ip():  # like the local instance `autotune run` starts
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="WARNING",
                runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def run_env(tmp_path):
    """Environment for `autotune` subprocesses: run outputs in a fresh temporary directory."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if ORIGINAL_PYTHONPATH is not None:
        env["PYTHONPATH"] = ORIGINAL_PYTHONPATH
    env["AUTOTUNE_HOME"] = str(tmp_path / "home")
    env["PYTHONUNBUFFERED"] = "1"
    return env


#: The installed console script, as a user types `autotune`: unlike ``python -m
#: autotune.cli.main`` it puts nothing (the current directory) on ``sys.path``.
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))


def edited(record: dict, **changes) -> dict:
    """A deep copy of a probe ``record`` with ``changes``: ``section__key=value`` sets one
    key of a section, ``key=value`` a whole entry."""
    import copy

    r = copy.deepcopy(record)
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            r[section][key] = value
        else:
            r[section] = value
    return r


def autotune_cmd(*args: str) -> list[str]:
    return [AUTOTUNE, *args]


def started_run(env, *args: str, cwd=None, after_trials: int = 1):
    """Start ``autotune run ...`` with Ctrl-C deliverable (a background shell would ignore
    it) and return once ``after_trials`` trials have printed their result."""
    import signal
    import subprocess

    p = subprocess.Popen(
        autotune_cmd("run", *args), env=env, cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    seen = 0
    for line in p.stdout:
        seen += "samples/s" in line
        if seen >= after_trials:
            break
    return p
