"""Applying a profile needs only torch and PyYAML: the README's training script runs under
``autotune launch ... -- torchrun`` (2 gloo ranks) in a virtualenv that holds autotune,
installed ``--no-deps`` from a wheel built from this tree, beside torch and PyYAML and nothing
else: Optuna, Ray, SQLAlchemy, rich and the rest of the tuner are not importable there.

torch and PyYAML are not downloaded again: the new environment gets the distributions that
``pip install torch pyyaml`` installs, found from their metadata (each one's requirements,
followed to the end, environment markers evaluated), as links to the files this environment
already holds, each distribution whole (its packages, modules and ``.dist-info``). That is
what an install from the index would put there, with no network and in seconds; torch's own
console scripts are left out (theirs start this environment's interpreter), so torchrun runs
as ``python -m torch.distributed.run``, which is what ``torchrun`` runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import Distribution, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO
from tests.integration.test_use_profile import cpu_profile, readme_example

pytestmark = pytest.mark.integration

#: What applying a profile needs, as a user installs it.
NEEDED = ("torch", "PyYAML")
#: What it must do without.
TUNER = ("optuna", "ray", "sqlalchemy", "rich", "plotly", "scipy", "matplotlib", "numpy")


def closure(names: tuple[str, ...]) -> dict[str, Distribution]:
    """The installed distributions ``names`` need, themselves included, by their requirements
    (no extras; markers evaluated for this interpreter)."""
    found: dict[str, Distribution] = {}
    todo = list(names)
    while todo:
        dist = distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def link_distributions(dists: dict[str, Distribution], site: Path) -> None:
    """Each distribution's top-level files and directories, linked into ``site``."""
    for dist in dists.values():
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in sorted(tops - {"..", "__pycache__"}):
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)


def no_pythonpath() -> dict[str, str]:
    """This process's environment without ``PYTHONPATH``."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def build_wheel(out: Path) -> Path:
    """A wheel of this tree, built from a copy (the tree gets no build/ or egg-info)."""
    tree = out / "tree"
    shutil.copytree(
        REPO,
        tree,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "__pycache__",
            "*.egg-info",
            "build",
            ".pytest_cache",
            ".ruff_cache",
            "tests",
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out / "dist"),
            str(tree),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=no_pythonpath(),
    )
    (wheel,) = (out / "dist").glob("ddp_autotune-*.whl")
    return wheel


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory) -> Path:
    """A virtualenv with autotune (``--no-deps``), torch and PyYAML only."""
    work = tmp_path_factory.mktemp("light")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    link_distributions(closure(NEEDED), Path(purelib))
    # without the session's PYTHONPATH (the shared Ray fixture adds tests/ and an empty entry,
    # the current directory: this repository, whose editable install's metadata made pip say
    # "already installed" and install nothing)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(build_wheel(work)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=no_pythonpath(),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    installed = sorted(x.name for x in Path(purelib).iterdir())
    assert (venv / "bin" / "autotune").exists(), f"pip said: {p.stdout}{p.stderr}; {installed}"
    return venv


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a shell with only ``venv`` activated: nothing of this one's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}


def test_the_venv_holds_torch_and_pyyaml_but_not_the_tuner(light_venv, tmp_path):
    code = (
        "import importlib.util, autotune, torch, yaml; "
        f"print(autotune.__file__); print(*[m for m in {TUNER!r} if importlib.util.find_spec(m)])"
    )
    p = subprocess.run(
        [str(light_venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=clean_env(light_venv),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    where, missing = p.stdout.splitlines()
    assert Path(where).is_relative_to(light_venv) and "site-packages" in where
    assert missing == ""  # none of the tuner's packages is importable
    assert sysconfig.get_paths()["purelib"] not in where


def test_the_readme_script_runs_under_launch_with_only_torch_and_pyyaml(light_venv, tmp_path):
    profile = tmp_path / "best.yaml"
    cpu_profile(
        profile,
        micro_batch=16,
        comm_hook="fp16",
        bucket_cap_mb=5.0,
        precision="bf16",
        num_workers=1,
        prefetch_factor=2,
    )
    (tmp_path / "train.py").write_text(readme_example())
    python = str(light_venv / "bin" / "python")
    p = subprocess.run(
        [
            str(light_venv / "bin" / "autotune"),
            "launch",
            "best.yaml",
            "--",
            python,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "train.py",
            "best.yaml",
        ],
        cwd=tmp_path,
        env=clean_env(light_venv),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "trained 32 micro-steps of 16" in p.stdout
    assert "measured on other hardware" not in p.stderr
    env = subprocess.run(
        [str(light_venv / "bin" / "autotune"), "env", "best.yaml"],
        cwd=tmp_path,
        env=clean_env(light_venv),
        capture_output=True,
        text=True,
    )
    assert env.returncode == 0 and "export MALLOC_MMAP_THRESHOLD_=" in env.stdout, env.stderr
