"""Applying a profile imports only torch and PyYAML: ``import autotune``, ``Profile`` and its
methods, ``autotune env`` and ``autotune launch`` leave the tuner's packages (Optuna, Ray,
SQLAlchemy, rich, plotly, SciPy) unimported, each checked in a fresh interpreter. The same
script in a virtualenv that has only torch and PyYAML: tests/integration/test_light_apply.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

#: The tuner's dependencies, which applying a profile must not import.
TUNER = ("optuna", "ray", "sqlalchemy", "rich", "plotly", "scipy", "matplotlib", "cmaes")

#: Prints which of TUNER the interpreter holds, as JSON, at exit.
REPORT = f"""
import atexit, json, sys
def _report():
    print(json.dumps(sorted(m for m in {TUNER!r} if m in sys.modules)), flush=True)
atexit.register(_report)
"""


def loaded(code: str, *args: str) -> list[str]:
    """The tuner's packages imported by ``code`` run in a fresh interpreter."""
    script = REPORT + textwrap.dedent(code)
    p = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_profile(path) -> None:
    from autotune.core.config import TrialConfig
    from autotune.core.target import Target
    from autotune.definition.space import SearchSpace
    from autotune.profile.profile import Profile

    cpu = Target(backend="gloo", device="cpu", world_size=2, global_batch=64, cpus_per_rank=1)
    values = SearchSpace.load("default").resolve(cpu).defaults()
    Profile.from_config(
        TrialConfig.from_values(values, cpu),
        study={"name": "light", "best_trial": 1, "baseline_trial": 0},
        workload={
            "trainer": "mlp",
            "options": {},
            "world_size": 2,
            "backend": "gloo",
            "global_batch": 64,
        },
        hardware={"device": "cpu", "device_count": 0, "node_count": 1},
        measured={"baseline_samples_per_s": 1.0, "best_samples_per_s": 2.0, "speedup": 2.0},
    ).save(path)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("light") / "best.yaml"
    write_profile(path)
    return path


def test_import_autotune_and_profile_import_no_tuner_package():
    assert loaded("import autotune\nfrom autotune import Profile, Workload\n") == []


def test_applying_a_profile_imports_no_tuner_package(profile):
    code = """
        import torch
        import autotune
        p = autotune.Profile.load(sys.argv[1])
        p.apply_env({})
        model = torch.nn.Linear(2, 2)
        with p.autocast("cpu"):
            model(torch.randn(4, 2))
        p.grad_scaler("cpu")
        p.dataloader_kwargs, p.accumulation_steps, p.headline()
    """
    assert loaded(code, str(profile)) == []


def test_search_space_is_still_there_when_asked_for():
    assert loaded("import autotune\nautotune.SearchSpace\n") == ["optuna"]
    with pytest.raises(AttributeError, match="no_such_name"):
        import autotune

        autotune.no_such_name  # noqa: B018


def test_autotune_env_imports_no_tuner_package(profile):
    code = """
        from autotune.cli.main import main
        assert main(["env", sys.argv[1]]) == 0
    """
    assert loaded(code, str(profile)) == []


def test_autotune_launch_imports_no_tuner_package(profile):
    # exec would replace the interpreter that is to report: this one stops just before it
    code = """
        import os
        from autotune.cli.main import main
        def execvpe(file, args, env):
            assert env["AUTOTUNE_PROFILE"] and args == ["true"]
            sys.exit(0)
        os.execvpe = execvpe
        main(["launch", sys.argv[1], "--", "true"])
    """
    assert loaded(code, str(profile)) == []


def test_the_console_entry_and_help_import_no_tuner_package():
    code = """
        from autotune.cli.main import main
        try:
            main(["launch", "--help"])
        except SystemExit as e:
            assert e.code == 0
    """
    assert loaded(code) == []
