"""SIGTERM at each phase of ``autotune run`` - Ray's start, a trial, the re-validation, the limit
probe, the export - ends the command with exit status 143 (not killed by the signal, not
SIGABRT), the line ``autotune: terminated (SIGTERM)``, the best profile so far exported once a
trial has completed, and no process of the run left. The installed console script, run from a
temporary directory as the README types it; each phase is found from the run's own output, its
study or its Ray session, not from a sleep.

Before the fix, a SIGTERM while Ray's core worker started exited by SIGABRT in every try: Ray's
failure signal handler (absl) saw the SIGTERM first and armed a 3-second alarm whose handler
aborts the process, and Ray's own SIGTERM handler exited from inside the core worker's
constructor. A SIGTERM as the export began could leave no profile."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.profile.profile import Profile
from tests.conftest import AUTOTUNE, wait_for
from tests.integration.conftest import trial_running
from tests.integration.test_local_ray import marked_with
from tests.integration.test_run_cli import group_of, interrupted_trial_recorded

pytestmark = pytest.mark.integration

TERMINATED = "autotune: terminated (SIGTERM)"
QUICK = "quick-mlp-gloo-2r"
SLOW = "quick-slowdata.workload-gloo-2r"
#: A trainer whose samples take 3 ms each to load, so that DataLoader workers make a trial
#: clearly faster than the baseline and the run always re-validates it.
SLOW_DATA = """\
import time

import torch
from autotune.trainers import mlp


class Slow(torch.utils.data.Dataset):
    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        time.sleep(0.003)
        return self.inner[i]


def workload(**options):
    wl = mlp.workload(width=64, layers=2, global_batch=32)
    wl.dataset = Slow(wl.dataset)
    return wl
"""


class Run:
    """One ``autotune run ARGS`` in a session of its own, its output read as it comes."""

    def __init__(self, env: dict[str, str], cwd: Path, *args: str) -> None:
        self.home = Path(env["AUTOTUNE_HOME"])
        self.p = subprocess.Popen(
            [AUTOTUNE, "run", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(list(self.lines))

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def reach(self, phase: Callable[[], object], what: str, timeout: float = 300) -> None:
        """Wait until ``phase()`` holds; the run must still be going then."""
        wait_for(lambda: phase() or self.p.poll() is not None, timeout, every=0.02)
        assert self.p.poll() is None, f"the run ended before {what}:\n{self.output()}"
        assert phase(), f"{what}: not reached in {timeout:.0f} s:\n{self.output()}"

    def terminate(self, again_after_s: float | None = None) -> int:
        """SIGTERM (and a second one ``again_after_s`` later); the exit status."""
        self.p.send_signal(signal.SIGTERM)
        if again_after_s is not None:
            try:
                self.p.wait(timeout=again_after_s)
            except subprocess.TimeoutExpired:
                self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=240)
        self._reader.join(timeout=30)
        return self.p.returncode

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=60)


def raylet_sessions(pid: int) -> list[Path]:
    """The session directories that the raylets started by ``pid`` name on their command line."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            if text[text.index("(") + 1 : text.rindex(")")] != "raylet" or int(fields[1]) != pid:
                continue
            argv = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        found += [Path(m) for m in re.findall(r"(/[^\0=]*?/session_[^/\0]+)", argv)]
    return found


def core_worker_started(pid: int) -> Callable[[], bool]:
    """For ``Run.reach``: the Ray core worker of driver ``pid`` has started (its log file is in
    the session directory of the local instance), while ``ray.init`` still runs."""

    def check() -> bool:
        return any(
            any(s.glob(f"logs/python-core-driver-*_{pid}.log")) for s in raylet_sessions(pid)
        )

    return check


def study_has(home: Path, attr: str) -> Callable[[], bool]:
    """For ``Run.reach``: the run's SQLite study holds the study attribute ``attr`` (read
    directly: Optuna's load takes longer than the step after it)."""
    db = home / "autotune.db"

    def check() -> bool:
        if not db.exists():
            return False
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05) as c:
                row = c.execute("select 1 from study_user_attributes where key = ?", (attr,))
                return row.fetchone() is not None
        except sqlite3.Error:
            return False

    return check


def assert_terminated(run: Run, rc: int, study: str | None) -> None:
    """Exit 143 with the line, nothing of the run left running; with ``study``, its profile
    exported (the baseline completed) and no trial left RUNNING; else no profile at all."""
    out = run.output()
    assert rc == 143, f"exit status {rc} (-6: SIGABRT, -15: ended by the signal):\n{out}"
    assert TERMINATED in out, out
    pid = run.p.pid
    assert wait_for(lambda: not group_of(pid) and not marked_with(f"{pid}-"), 10), (
        f"left running: {group_of(pid)}\n{out}"
    )
    profiles = run.home / "profiles"
    if study is None:
        assert not profiles.exists(), out
        return
    assert Profile.load(profiles / f"{study}.yaml").study["baseline_trial"] == 0, out
    trials = optuna.load_study(study_name=study, storage=f"sqlite:///{run.home / 'autotune.db'}")
    assert not [t.number for t in trials.trials if t.state == TrialState.RUNNING], out


@dataclass
class Phase:
    """How to start a run that reaches the phase, how to see that it has, and what it leaves."""

    args: tuple[str, ...]
    reached: Callable[[Run], Callable[[], object]]
    study: str | None
    local: bool = False
    """A local Ray instance (no --address): the phase needs one, or the run's trainer module
    lives in the test's directory."""


NO_SEARCH = (
    "--study",
    "quick",
    "--budget",
    "5m",
    "--n-trials",
    "2",
    "--validate-top",
    "0",
    "--no-screening",
)
PHASES = {
    # H-T01: Ray's core worker starting inside ray.init (the local instance's own start)
    "ray-start": Phase(
        ("--study", "quick", "--budget", "2m"),
        lambda r: core_worker_started(r.p.pid),
        study=None,
        local=True,
    ),
    # H-T02: a trial after the baseline running its ranks
    "trial": Phase(
        ("--study", "quick", "--budget", "5m"), lambda r: trial_running(r.home, QUICK), study=QUICK
    ),
    # H-T03: the re-validation of a trial that beat the baseline
    "re-validation": Phase(
        (
            "--study",
            "quick",
            "--trainer",
            "slowdata:workload",
            "--space",
            "space.yaml",
            "--sampler",
            "grid",
            "--n-trials",
            "3",
            "--no-screening",
            "--budget",
            "5m",
        ),
        lambda r: lambda: r.said("Re-validating "),
        study=SLOW,
        local=True,
    ),
    # H-T04: the limit probe (no first measurement: the baseline is probed again)
    "limit": Phase(
        NO_SEARCH, lambda r: lambda: r.said("Measuring how far from the limit"), study=QUICK
    ),
    # H-T05: the export, as it begins (the limit record written)
    "export": Phase(NO_SEARCH, lambda r: study_has(r.home, "limit"), study=QUICK),
}


def sigterm_at(
    name: str,
    tmp_path: Path,
    run_env: dict[str, str],
    request,
    again_after_s: float | None = None,
    after_s: float = 0.0,
) -> Run:
    """Start a run, SIGTERM it at phase ``name`` (``after_s`` later), check how it ended; the
    ended run, for checks of the phase's own."""
    phase = PHASES[name]
    args = list(phase.args)
    env = dict(run_env)
    short_tmp = Path(tempfile.mkdtemp(prefix="at", dir="/tmp"))  # the instance's temp dir
    if phase.local:
        (tmp_path / "slowdata.py").write_text(SLOW_DATA)
        (tmp_path / "space.yaml").write_text(
            "data:\n  num_workers: {type: categorical, choices: [0, 2]}\n"
        )
        env["TMPDIR"] = str(short_tmp)
    else:
        args += ["--address", request.getfixturevalue("ray_address")]
        # what joining the session's instance takes (its ray.init set RAY_AUTH_MODE)
        env.update({k: v for k, v in os.environ.items() if k.startswith("RAY_")})
    run = Run(env, tmp_path, *args)
    try:
        run.reach(phase.reached(run), name)
        if after_s:
            wait_for(lambda: run.p.poll() is not None, after_s)
        rc = run.terminate(again_after_s)
        assert_terminated(run, rc, phase.study)
        left = lambda: list(short_tmp.glob("autotune-ray-*"))  # noqa: E731
        assert wait_for(lambda: not left(), 10), f"the instance's temp dir is left: {left()}"
    finally:
        run.kill()
        shutil.rmtree(short_tmp, ignore_errors=True)
    return run


def test_sigterm_while_ray_starts_exits_143_and_leaves_nothing(tmp_path, run_env, request):
    """H-T01: SIGTERM while Ray's core worker starts (inside ray.init, 3-8 s into a local
    run): exit 143, no process of the instance, no temp dir, no profile. It was SIGABRT in 4 of
    4 tries: Ray's absl failure handler's 3 s alarm, and a core worker left half-built."""
    sigterm_at("ray-start", tmp_path, run_env, request)


def test_sigterm_during_a_trial_exits_143_with_the_profile(tmp_path, run_env, request):
    """H-T02: SIGTERM while a trial runs its ranks: exit 143 with the terminated line, the
    trial recorded interrupted, the best profile so far exported."""
    run = sigterm_at("trial", tmp_path, run_env, request)
    assert "Interrupted (SIGTERM)" in run.output()
    interrupted_trial_recorded(run.home, "SIGTERM")


def test_sigterm_during_the_revalidation_exits_143_with_the_profile(tmp_path, run_env, request):
    """H-T03: SIGTERM during the re-validation: exit 143, the profile exported."""
    sigterm_at("re-validation", tmp_path, run_env, request)


def test_sigterm_twice_during_the_limit_probe_exits_143_with_the_profile(
    tmp_path, run_env, request
):
    """H-T04: SIGTERM during the limit probe, and a second one 0.3 s later while the run
    stops: exit 143, the profile still exported (the second SIGTERM is held, not raised)."""
    sigterm_at("limit", tmp_path, run_env, request, again_after_s=0.3)


def test_sigterm_as_the_export_begins_exits_143_with_the_profile(tmp_path, run_env, request):
    """H-T05: SIGTERM as the export begins: the profile is written whole all the same (the
    SIGTERM is held from the export on), exit 143. It used to cut the export short."""
    sigterm_at("export", tmp_path, run_env, request)


#: 20 tries over the phases: the start swept from the raylet's first moments to the core
#: worker's, then every later phase.
STRESS = (
    [("ray-start", 0.0, i) for i in range(4)]
    + [("ray-start", s, 0) for s in (0.3, 0.8, 1.5, 2.5)]
    + [(p, 0.0, i) for p in ("trial", "re-validation", "limit", "export") for i in range(3)]
)


@pytest.mark.stress
@pytest.mark.parametrize(
    ("name", "after_s", "i"), STRESS, ids=[f"{n}+{s}s-{i}" for n, s, i in STRESS]
)
def test_sigterm_at_every_phase_20_tries(tmp_path, run_env, request, name, after_s, i):
    """H-T06: 20 SIGTERMs over the phases, each try a run of its own: every one exits 143 with
    the terminated line, the profile where a trial completed, nothing left running."""
    sigterm_at(name, tmp_path, run_env, request, after_s=after_s)
