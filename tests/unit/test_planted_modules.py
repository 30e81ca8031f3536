"""autotune's own processes import nothing planted in the user's directory (docs/security.md,
H-M01 to H-M03): the script guard starts without the directory it runs in on its path, and
the ranks get the directory of a user's trainer module only as a place to import that module
from, last, never on ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys

from autotune.launch.cluster import _init_kwargs
from autotune.rank.workload import TRAINER_DIR_ENV, _with_cwd_on_path
from autotune.script.command import GUARD_BOOT

PLANTED = "import pathlib; pathlib.Path({!r}).write_text('ran')\n"


def test_h_m01_the_guard_imports_no_planted_module_from_the_directory_it_runs_in(tmp_path):
    """H-M01."""
    marker = tmp_path / "planted-ran"
    for name in ("ctypes", "signal", "subprocess", "autotune"):  # what the guard imports
        (tmp_path / f"{name}.py").write_text(PLANTED.format(str(marker)))
    p = subprocess.run(
        [sys.executable, "-c", GUARD_BOOT, str(os.getpid()), "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert not marker.exists()
    # the same start, as `python -m` did it before: the planted module runs
    subprocess.run(
        [sys.executable, "-m", "autotune.script.guard", str(os.getpid()), "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
    )
    assert marker.exists()


def test_h_m02_the_ranks_path_holds_no_user_directory_unless_a_trainer_module_is_imported():
    """H-M02."""
    assert "runtime_env" not in _init_kwargs(None, None)  # built-in trainers, script mode
    env = _init_kwargs(None, "/home/u/proj")["runtime_env"]["env_vars"]
    assert env == {TRAINER_DIR_ENV: "/home/u/proj"}  # a variable, not PYTHONPATH


def test_h_m03_a_trainer_modules_directory_goes_last_on_the_path(monkeypatch, tmp_path):
    """H-M03."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.setenv(TRAINER_DIR_ENV, str(tmp_path))
    _with_cwd_on_path()
    assert sys.path[-1] == str(tmp_path)
    assert sys.path.count(str(tmp_path)) == 1
