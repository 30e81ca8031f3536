"""No process of a script trial outlives it, however the script forks: the guard
(``autotune.script.guard``) against ``tests/scripts/fork_chain.py``, chains of processes that
fork and exit every 2 ms, one of them calling ``setsid`` at every link, all ignoring SIGTERM -
with a cgroup of the command's own where one can be made, and by subreaper alone
(``AUTOTUNE_GUARD_CGROUP=0``). Each trial runs through ``run_script``, the path every script
trial takes, and ends as a trial ends: no step reported in time, the guard's SIGTERM, the
keeper's kill. The stress tier repeats it 50 times for each mechanism."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.core.config import MeasureSettings
from autotune.core.errors import FailureReason, TrialFailed
from autotune.script import guard
from autotune.script.cgroup import CGROUP_ENV, make_group
from autotune.script.command import run_script
from tests.conftest import REPO
from tests.integration.test_script_mode import config

pytestmark = pytest.mark.integration

CHAIN = REPO / "tests" / "scripts" / "fork_chain.py"


def beats(stop: Path) -> list[tuple[int, bytes] | None]:
    """Each chain's beat file (its time and content; None while it has none)."""
    out: list[tuple[int, bytes] | None] = []
    for k in (0, 1):
        f = Path(f"{stop}.beat-{k}")
        try:
            out.append((f.stat().st_mtime_ns, f.read_bytes()))
        except OSError:
            out.append(None)
    return out


def marked(stop: Path) -> list[int]:
    """The live processes whose command line names ``stop``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if str(stop).encode() in (proc / "cmdline").read_bytes():
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def still_running(stop: Path, settle_s: float = 3.0) -> list[str]:
    """What of the fork chain still runs: a chain whose beat file changes over half a second
    (a link lives 2 ms: a scan of ``/proc`` alone can miss a live chain), and the processes
    whose command line names ``stop``. Empty as soon as nothing does; what runs after
    ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while True:
        before = beats(stop)
        time.sleep(0.5)
        after = beats(stop)
        found = [f"chain {k} still forks" for k in (0, 1) if before[k] != after[k]]
        found += [f"process {pid}" for pid in marked(stop)]
        if not found or time.monotonic() > deadline:
            return found


@pytest.fixture
def stop(tmp_path) -> Iterator[Path]:
    """The fork chain's marker and stop file; at teardown it is created, which ends any link
    the thing tested left running (the safety net for this machine, not the test)."""
    path = tmp_path / f"stop-{uuid.uuid4().hex}"
    yield path
    path.touch()


def cgroup_or_skip() -> None:
    group = make_group()
    if isinstance(group, str):
        pytest.skip(f"no cgroup v2 group can be made here: {group}")
    group.remove(time.monotonic() + 5)


def chain_trial(stop: Path, log_dir: Path, *, cgroup: bool, exits: bool = False) -> str:
    """One script trial of the fork chain, ended by the trial's wait for a first step; the
    script's log."""
    env = {**os.environ, CGROUP_ENV: "1" if cgroup else "0"}
    cmd = [sys.executable, str(CHAIN), str(stop), *(["--exit"] if exits else [])]
    with pytest.raises(TrialFailed) as e:
        run_script(
            cmd,
            config(),
            world_size=2,
            measure=MeasureSettings(),
            timeout_s=60,
            wrap_wait_s=1,
            log_dir=log_dir,
            env=env,
        )
    assert e.value.reason == FailureReason.CRASH and "no step" in e.value.detail
    log = (log_dir / "script.log").read_text()
    assert "fork_chain: two chains started" in log  # the chains did run
    return log


def test_a_fork_chain_ends_with_its_trial_in_a_cgroup(stop, tmp_path):
    """H-S01: processes that fork and exit every 2 ms (one calling setsid each time), all
    ignoring SIGTERM: the cgroup's kill ends every one, and the group is removed."""
    cgroup_or_skip()
    log = chain_trial(stop, tmp_path, cgroup=True)
    said = re.search(r"autotune guard: containing the command in cgroup (\S+)", log)
    assert said, log
    assert still_running(stop) == []
    assert not Path(said[1]).exists()


@pytest.mark.parametrize("exits", [False, True], ids=["script-sleeps", "script-exits"])
def test_a_fork_chain_ends_with_its_trial_by_subreaper(stop, tmp_path, exits):
    """H-S02: the same chains where no cgroup is used (``AUTOTUNE_GUARD_CGROUP=0``, as on a
    host without cgroup v2 or as a user who cannot write there): the subreaper's loop
    kills and reaps until no child is left; with ``script-exits`` the script exits at once
    and leaves the chains behind."""
    log = chain_trial(stop, tmp_path, cgroup=False, exits=exits)
    assert "autotune guard: containing the command by subreaper (AUTOTUNE_GUARD_CGROUP=0)" in log
    assert still_running(stop) == []


def test_a_fork_chain_ends_when_the_guard_front_is_killed_with_minus_9(stop, tmp_path):
    """H-S03: Ray SIGKILLs a dead worker's direct children, i.e. the guard's front: its
    keeper ends the chains alone."""
    log = (tmp_path / "guard.log").open("wb")
    front = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.script.guard",
            str(os.getpid()),
            "--",
            sys.executable,
            str(CHAIN),
            str(stop),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while None in beats(stop):
        assert time.monotonic() < deadline and front.poll() is None
        time.sleep(0.05)
    front.send_signal(signal.SIGKILL)
    front.wait()
    assert still_running(stop, settle_s=guard.GRACE_S + guard.KILL_S + 3) == []


@pytest.mark.stress
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "subreaper"])
def test_fifty_fork_chain_trials_leave_no_process(tmp_path, cgroup):
    """H-S04: the goal case, 50 script trials of the fork chain for each mechanism: no
    process left after any of them."""
    if cgroup:
        cgroup_or_skip()
    for k in range(50):
        stop = tmp_path / f"stop-{uuid.uuid4().hex}"
        try:
            chain_trial(stop, tmp_path / f"trial-{k}", cgroup=cgroup, exits=k % 2 == 1)
            assert still_running(stop) == [], f"trial {k}"
        finally:
            stop.touch()
